"""A PySpark 4 streaming data source over ``confluent-kafka``: ``spark.readStream.format("krishiv-kafka")``.

Offsets are ``{partition: next offset}`` (partition numbers as strings, since offsets are JSON). Each Spark
task reads exactly ``[start, end)`` of one partition, whatever else the broker returns, so a batch id always
means the same records on replay. Large ranges are split into several tasks. ``maxRecordsPerBatch`` becomes
Spark's default read limit and is shared between partitions in proportion to their backlog;
``Trigger.AvailableNow`` pins the end to the offsets seen when the query starts. Partitions that appear
later start at offset 0; offsets that retention already deleted fail the query with :class:`OffsetsDeleted`.

Options: ``bootstrap.servers`` and ``topic`` (required), ``startingOffsets`` (JSON of partition -> offset;
partitions it leaves out start at their earliest offset), ``maxRecordsPerBatch``, ``recordsPerSplit``,
``readTimeoutSeconds`` and ``kafka.<librdkafka setting>`` for anything else the consumer needs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spark_jobs.errors import KafkaSourceError, OffsetsDeleted

SOURCE_NAME = "krishiv-kafka"
SCHEMA = "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"
ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
METADATA_TIMEOUT_S = 10.0
CONSUME_BATCH = 10_000
POLL_TIMEOUT_S = 0.5

Offsets = dict[str, int]


def consumer_config(bootstrap: str, extra: Mapping[str, str]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": "krishiv-reader",  # required by librdkafka; offsets are never committed to the group
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "enable.partition.eof": False,
        "fetch.max.bytes": 64 * 1024 * 1024,
        "queued.max.messages.kbytes": 256 * 1024,
    }
    config.update(extra)
    return config


class KafkaAdmin:
    """Watermark queries for one topic, behind one consumer handle."""

    def __init__(self, bootstrap: str, topic: str, extra: Mapping[str, str]) -> None:
        from confluent_kafka import Consumer

        self.bootstrap, self.topic = bootstrap, topic
        self._consumer = Consumer(consumer_config(bootstrap, extra))

    def partitions(self) -> list[int]:
        from confluent_kafka import KafkaException

        try:
            metadata = self._consumer.list_topics(self.topic, timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:
            raise KafkaSourceError(f"Kafka broker at {self.bootstrap} is unreachable: {exc}") from exc
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            reason = topic.error if topic is not None else "no such topic"
            raise KafkaSourceError(f"topic {self.topic!r} is not available on {self.bootstrap}: {reason}")
        return sorted(topic.partitions)

    def watermarks(self, partition: int) -> tuple[int, int]:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, partition), timeout=METADATA_TIMEOUT_S, cached=False
            )
        except KafkaException as exc:
            raise KafkaSourceError(
                f"Kafka broker at {self.bootstrap} did not report offsets of {self.topic}/{partition}: {exc}"
            ) from exc
        return int(low), int(high)

    def latest(self) -> Offsets:
        return {str(p): self.watermarks(p)[1] for p in self.partitions()}

    def earliest(self) -> Offsets:
        return {str(p): self.watermarks(p)[0] for p in self.partitions()}

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> KafkaAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def latest_offsets(bootstrap: str, topic: str, extra: Mapping[str, str] | None = None) -> Offsets:
    """Each partition's high watermark; raises :class:`KafkaSourceError` naming the broker if it does not answer."""
    with KafkaAdmin(bootstrap, topic, extra or {}) as admin:
        return admin.latest()


def cap_offsets(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """End offsets reading at most ``max_rows`` records, shared in proportion to each partition's backlog."""
    backlog = {p: max(0, latest[p] - start.get(p, 0)) for p in latest}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    take = {p: (n * max_rows) // total for p, n in backlog.items()}
    spare = max_rows - sum(take.values())
    for p in sorted(backlog, key=lambda q: backlog[q] - take[q], reverse=True):
        if spare == 0:
            break
        if backlog[p] > take[p]:
            take[p] += 1
            spare -= 1
    return {p: start.get(p, 0) + take[p] for p in latest}


class KafkaRange(InputPartition):
    """One Spark task's work: records ``[start, end)`` of one topic partition. Picklable."""

    def __init__(self, topic: str, partition: int, start: int, end: int, config: dict[str, Any], timeout_s: float):
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.config, self.timeout_s = config, timeout_s


def _record_batch(msgs: list[Any], topic: str, partition: int) -> pa.RecordBatch:
    n = len(msgs)
    stamps = pa.array([m.timestamp()[1] for m in msgs], pa.int64())
    return pa.RecordBatch.from_arrays(
        [
            pa.array([m.key() for m in msgs], pa.binary()),
            pa.array([m.value() for m in msgs], pa.binary()),
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
            pa.array([m.offset() for m in msgs], pa.int64()),
            stamps.cast(pa.timestamp("ms")).cast(pa.timestamp("us")).cast(pa.timestamp("us", tz="UTC")),
        ],
        schema=ARROW_SCHEMA,
    )


def read_range(part: KafkaRange) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``[start, end)`` as Arrow batches; records outside the range are dropped."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    bootstrap = part.config.get("bootstrap.servers")
    where = f"{part.topic}/{part.partition} [{part.start}, {part.end})"
    consumer = Consumer(part.config)
    try:
        low, _high = consumer.get_watermark_offsets(
            TopicPartition(part.topic, part.partition), timeout=METADATA_TIMEOUT_S, cached=False
        )
        if part.start < low:
            raise OffsetsDeleted(
                f"offsets [{part.start}, {low}) of {part.topic}/{part.partition} were deleted by retention before "
                f"Spark read them; batch range {where} cannot be read exactly (broker {bootstrap})"
            )
        consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
        next_offset = part.start
        last_progress = time.monotonic()
        while next_offset < part.end:
            msgs = consumer.consume(min(CONSUME_BATCH, part.end - next_offset), timeout=POLL_TIMEOUT_S)
            good = []
            for m in msgs:
                err = m.error()
                if err is None:
                    good.append(m)
                elif err.code() == KafkaError._AUTO_OFFSET_RESET or err.code() == KafkaError.OFFSET_OUT_OF_RANGE:
                    raise OffsetsDeleted(f"{where}: offset out of range on {bootstrap}: {err}")
                elif err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaSourceError(f"reading {where} from {bootstrap} failed: {err}")
            if good:
                if good[-1].offset() >= part.end:
                    good = [m for m in good if m.offset() < part.end]
                if good and good[0].offset() < part.start:
                    good = [m for m in good if m.offset() >= part.start]
            if good:
                next_offset = good[-1].offset() + 1
                last_progress = time.monotonic()
                yield _record_batch(good, part.topic, part.partition)
                continue
            # Nothing new: offsets up to `end` may be transaction markers or compacted away.
            position = consumer.position([TopicPartition(part.topic, part.partition)])[0].offset
            if position >= part.end:
                return
            if time.monotonic() - last_progress > part.timeout_s:
                raise KafkaSourceError(
                    f"no records from {bootstrap} for {part.timeout_s:.0f}s while reading {where} "
                    f"(stuck at offset {next_offset}); is the broker up?"
                )
    finally:
        consumer.close()


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        try:
            self.bootstrap = options["bootstrap.servers"]
            self.topic = options["topic"]
        except KeyError as exc:
            raise KafkaSourceError(f"the {SOURCE_NAME} source needs the option {exc.args[0]!r}") from None
        self.extra = {k[len("kafka.") :]: v for k, v in options.items() if k.startswith("kafka.")}
        self.max_records = int(options.get("maxRecordsPerBatch", "0"))
        self.records_per_split = max(1, int(options.get("recordsPerSplit", "250000")))
        self.timeout_s = float(options.get("readTimeoutSeconds", "120"))
        self.starting: Offsets = {str(k): int(v) for k, v in json.loads(options.get("startingOffsets", "{}")).items()}
        self._admin: KafkaAdmin | None = None
        self._target: Offsets | None = None
        self.ledger_path, self.ledger_table = options.get("ledgerPath"), options.get("ledgerTable")
        self.checkpoint_path = options.get("checkpointPath")
        self._last_recorded: int | None = None
        self._past_recorded = False  # batch ids only grow: once past the ledger, never look again

    @property
    def admin(self) -> KafkaAdmin:
        if self._admin is None:
            self._admin = KafkaAdmin(self.bootstrap, self.topic, self.extra)
        return self._admin

    def initialOffset(self) -> dict:
        earliest = self.admin.earliest()
        return {p: self.starting.get(p, low) for p, low in earliest.items()}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.admin.latest()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records) if self.max_records > 0 else ReadAllAvailable()

    def _recorded_end(self, start: dict) -> dict | None:
        """The end offsets the ledger recorded for the batch Spark is planning, if it was staged before.

        A rewound checkpoint, or an old copy of it, makes Spark plan batch ids that were staged already.
        Planned afresh they would cover other ranges (the backlog has grown), and their output would differ
        from what the ledger holds; so the source returns exactly the recorded end. Spark plans batch N
        when N - 1 is the last batch of its offset log. Past the last recorded batch, no lookup is made.
        """
        if self._past_recorded or not (self.ledger_path and self.ledger_table and self.checkpoint_path):
            return None
        from outbox.ledger import Ledger
        from spark_jobs.checkpoint import Checkpoint

        checkpoint = Checkpoint(self.checkpoint_path)
        batch_id = checkpoint.last_batch_id() + 1
        ledger = Ledger(self.ledger_path)
        query_id = checkpoint.query_id()
        if self._last_recorded is None:
            self._last_recorded = ledger.last_batch_id(query_id, self.ledger_table)
        if batch_id > self._last_recorded:
            self._past_recorded = True
            return None
        entry = ledger.get(query_id, self.ledger_table, batch_id)
        if entry is None:
            return None
        return {**start, **{p: end for p, (_start, end) in entry.offsets.get(self.topic, {}).items()}}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        recorded = self._recorded_end(start)
        if recorded is not None:
            return recorded
        latest = self.admin.latest()
        if self._target is not None:
            latest = {p: min(end, self._target.get(p, start.get(p, 0))) for p, end in latest.items()}
        # Offsets never move backwards, even if a broker reports a lower high watermark for a moment.
        latest = {p: max(end, int(start.get(p, 0))) for p, end in latest.items()}
        if isinstance(limit, ReadMaxRows):
            return cap_offsets({p: int(o) for p, o in start.items()}, latest, limit.max_rows)
        return latest

    def reportLatestOffset(self) -> dict | None:
        return self.admin.latest()

    def partitions(self, start: dict, end: dict) -> list[KafkaRange]:
        config = consumer_config(self.bootstrap, self.extra)
        ranges = []
        for p, stop in sorted(end.items(), key=lambda kv: int(kv[0])):
            first = int(start.get(p, 0))
            for lo in range(first, int(stop), self.records_per_split):
                hi = min(int(stop), lo + self.records_per_split)
                ranges.append(KafkaRange(self.topic, int(p), lo, hi, config, self.timeout_s))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange)
        return read_range(partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: Spark's checkpoint and the outbox ledger own the consumed offsets."""

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(self.options)
