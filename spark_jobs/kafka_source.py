"""A PySpark 4 streaming data source over ``confluent-kafka``: ``spark.readStream.format("krishiv-kafka")``.

Offsets are ``{partition: next offset}`` (partition numbers as strings, since offsets are JSON). Each range is
read exactly, ``[start, end)`` of one partition, whatever else the broker returns, so a batch id always means the
same records on replay. Large ranges are split into several tasks; small ones are packed into one task
(:func:`pack_ranges`: a task's start costs more than reading a few thousand records). ``maxRecordsPerBatch`` becomes
Spark's default read limit and is shared between partitions in proportion to their backlog;
``Trigger.AvailableNow`` pins the end to the offsets seen when the query starts. While the backlog is larger than
one batch (a first run over a full topic, a restart after an outage), a batch may span up to
``catchUpRecordsPerBatch`` (:func:`batch_rows`): every batch has a fixed cost, so a pipeline catches up sooner in
fewer, larger batches, and returns to small ones once it has caught up. Only batches Spark plans afresh are sized
so; a batch the ledger already recorded is planned with its recorded ends.

Offsets only move forward, checked when the driver plans a batch (``latestOffset``): a high watermark below the
batch's start (topic re-created, a fail-over to a mirror) raises :class:`OffsetsMovedBackwards`, a start below the
low watermark (retention) :class:`OffsetsDeleted`, a topic or cluster other than the one the checkpoint began on
:class:`SourceChanged`. Each message ends with the ``krishiv skip-offsets`` command that moves past it on purpose:
the skip is recorded in the ledger, and the batch that starts at the stuck offset reads from the operator's
offset instead (the ledger names that batch, so a replay does the same). The source never opens the ledger: the
driver hands it what it must follow (option ``recorded``, :class:`spark_jobs.ports.RecordedBatches`).
A partition that appears later starts at its low watermark: the batch that first sees it records that offset as
its end and reads nothing from it; the next batch reads from there.

Options: ``bootstrap.servers`` and ``topic`` (required), ``startingOffsets`` (JSON of partition -> offset;
partitions it leaves out start at their earliest offset), ``maxRecordsPerBatch``, ``recordsPerSplit``,
``catchUpRecordsPerBatch`` (0, the default: never more than ``maxRecordsPerBatch``), ``readTimeoutSeconds``,
``expectedIdentity`` (JSON of :meth:`KafkaAdmin.identity`, checked at every batch: when the driver plans it and
by each task before and after it reads), ``checkpointPath`` and ``recorded`` (the query's checkpoint, and the
batch ends and skips the ledger holds for it) and ``kafka.<librdkafka setting>`` for anything else the consumer
needs, except the settings in :data:`FORCED_CONSUMER_SETTINGS`, which Krishiv sets itself.

The Kafka clients are made through one seam, :class:`KafkaClients` (confluent-kafka's ``Consumer`` and
``AdminClient`` by default), so tests can replay a recorded fetch sequence through a consumer double. Each is built
quietly (:mod:`spark_jobs.kafka_clients`): librdkafka prints nothing, and a broker that cannot be reached or
refuses the client is one error naming the cause (connection refused, authentication failed, ...).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from krishiv_core.errors import BrokerUnavailable
from krishiv_core.runbook import before_pointer, runbook
from krishiv_core.spec import FORCED_CONSUMER_SETTINGS
from spark_jobs.checkpoint import Checkpoint
from spark_jobs.errors import KafkaSourceError, OffsetsDeleted, OffsetsMovedBackwards, SourceChanged, TopicMissing
from spark_jobs.kafka_clients import KafkaProblems, build, list_topics
from spark_jobs.ports import RecordedBatches, apply_skips
from spark_jobs.record_decoder import KAFKA_COLUMNS, Decoding, RecordDecoder
from spark_jobs.registry_decoder import decoder_for
from spark_jobs.source_lines import say

SOURCE_NAME = "krishiv-kafka"
SCHEMA = "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"
ARROW_SCHEMA = pa.schema(KAFKA_COLUMNS)
METADATA_TIMEOUT_S = 10.0
CONSUME_BATCH = 10_000
POLL_TIMEOUT_S = 0.5
#: Pauses between re-reads of the watermarks before a high watermark below a batch's start is believed (about 2 s
#: in all): Tansu, the dev broker, may report a high watermark a little low for a moment.
WATERMARK_RECHECK_DELAYS_S: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5, 0.9)
#: What a topic id looks like when a broker does not know it (Kafka's zero UUID).
UNKNOWN_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"
SKIP_HINT = 'krishiv skip-offsets --pipeline {pipeline} --partition {partition} --to {offset} --reason "{reason}"'
#: Where docs/operations.md explains these refusals and the ways out.
RUNBOOK_OFFSETS = runbook("Offsets a query cannot read exactly")
RUNBOOK_OUTAGE = runbook("A broker outage")
#: How long the source waits for a broker that does not answer before the query stops (seconds), and the pauses
#: between attempts (doubling up to the last).
DEFAULT_OUTAGE_S = 300.0
OUTAGE_BACKOFF_S: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)

Offsets = dict[str, int]
Identity = dict[str, str | None]


class KafkaConsumer(Protocol):
    """The part of ``confluent_kafka.Consumer`` the source uses; a test double implements the same."""

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any: ...
    def get_watermark_offsets(self, partition: Any, timeout: float = -1, cached: bool = False) -> tuple[int, int]: ...
    def assign(self, partitions: list[Any]) -> None: ...
    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]: ...
    def position(self, partitions: list[Any]) -> list[Any]: ...
    def close(self) -> None: ...


class KafkaAdminClient(Protocol):
    """The part of ``confluent_kafka.admin.AdminClient`` the source uses (topic ids)."""

    def describe_topics(self, topics: Any, **kwargs: Any) -> dict[str, Any]: ...


def _confluent_consumer(config: dict[str, Any]) -> KafkaConsumer:
    from confluent_kafka import Consumer

    return Consumer(config)


def _confluent_admin(config: dict[str, Any]) -> KafkaAdminClient:
    from confluent_kafka.admin import AdminClient

    return AdminClient(config)


@dataclass(frozen=True)
class KafkaClients:
    """How the source makes its Kafka clients: the one seam a test replaces with doubles. Picklable (module-level
    functions), since Spark ships the reader, and with it this, to its Python workers."""

    consumer: Callable[[dict[str, Any]], KafkaConsumer] = _confluent_consumer
    admin: Callable[[dict[str, Any]], KafkaAdminClient] = _confluent_admin


CONFLUENT_CLIENTS = KafkaClients()


#: What a consumer may queue ahead of its reader: librdkafka stops fetching a partition for
#: ``fetch.queue.backoff.ms`` (1 s) once ``queued.min.messages`` (100,000 by default) are queued, which idles the
#: reader of a larger range; so a range's consumer may queue the whole range (:func:`range_consumer_config`), and
#: the bytes stay bounded by ``queued.max.messages.kbytes`` (64 MiB per task) and ``fetch.max.bytes``.
RANGE_QUEUE_KBYTES = 64 * 1024
RANGE_FETCH_MAX_BYTES = 32 * 1024 * 1024
#: A Spark task's start costs about what reading this many records does (50-150 ms on 2 cores: the Python worker
#: receives and unpickles the read function), so a batch's ranges are packed into tasks of up to this many records
#: (``recordsPerSplit`` if smaller): a batch of a few thousand records is one task, not one per partition.
TASK_PACK_RECORDS = 50_000
#: The most records a range's consumer queues (a range is ``recordsPerSplit`` at most, 250,000 by default).
RANGE_QUEUE_MAX_RECORDS = 10_000_000


def range_consumer_config(config: Mapping[str, Any], records: int) -> dict[str, Any]:
    """``config`` for a consumer that reads ``records`` offsets of one partition: unless the user set
    ``queued.min.messages``, it may queue the whole range, so it never pauses while the range is unread."""
    if "queued.min.messages" in config:
        return dict(config)
    return {**config, "queued.min.messages": max(100_000, min(records, RANGE_QUEUE_MAX_RECORDS))}


def consumer_config(bootstrap: str, extra: Mapping[str, str]) -> dict[str, Any]:
    """The consumer's settings: Krishiv's defaults, then ``extra``, then :data:`FORCED_CONSUMER_SETTINGS`, which no
    extra overrides (the spec and the source refuse them anyway; this is the last line)."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": "krishiv-reader",  # required by librdkafka; offsets are never committed to the group
        "enable.partition.eof": False,
        "fetch.max.bytes": RANGE_FETCH_MAX_BYTES,
        "queued.max.messages.kbytes": RANGE_QUEUE_KBYTES,
    }
    config.update(extra)
    for key in FORCED_CONSUMER_SETTINGS:
        config.pop(key, None)
    config.update(FORCED_CONSUMER_SETTINGS)
    return config


def decoding_option(options: Mapping[str, str]) -> Decoding | None:
    """The source's ``decoding`` option: the pipeline's fields, decoded in its tasks (else raw Kafka records)."""
    text = options.get("decoding")
    if text is None:
        return None
    try:
        return Decoding.from_option(text)
    except (ValueError, KeyError, TypeError) as exc:
        raise KafkaSourceError(f"option decoding: expected the JSON of Decoding: {exc}") from None


def skip_hint(partition: int | str, offset: int | str, pipeline: str = "<pipeline>", reason: str = "...") -> str:
    """The operator's command that moves a partition past a gap on purpose (recorded in the ledger)."""
    return SKIP_HINT.format(pipeline=pipeline, partition=partition, offset=offset, reason=reason)


def _close_quietly(client: Any) -> None:
    """Close a Kafka client; one whose broker is gone may raise on the way out, which changes nothing for us."""
    with contextlib.suppress(Exception):
        client.close()


def _transient(exc: BaseException) -> bool:
    """Whether ``exc`` may pass when the broker answers again (unreachable, no answer), as opposed to a verdict
    about the offsets or the source (deleted, moved backwards, another topic) that waiting does not change."""
    from krishiv_core.errors import ConfigError

    return isinstance(exc, KafkaSourceError | BrokerUnavailable) and not isinstance(
        exc, OffsetsDeleted | OffsetsMovedBackwards | SourceChanged | ConfigError
    )


class KafkaAdmin:
    """Metadata and watermark queries for one topic, behind one consumer handle (and an admin client for ids)."""

    def __init__(
        self, bootstrap: str, topic: str, extra: Mapping[str, str], clients: KafkaClients = CONFLUENT_CLIENTS
    ) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self._extra, self._clients = dict(extra), clients
        config = consumer_config(bootstrap, extra)
        self._problems = KafkaProblems(config)
        self._consumer = build(clients.consumer, config, self._problems)
        self._admin: KafkaAdminClient | None = None

    def _metadata(self) -> Any:
        """The topic's metadata; one :class:`KafkaSourceError` line naming the cause as soon as it is known."""
        try:
            return list_topics(self._consumer, self._problems, self.bootstrap, METADATA_TIMEOUT_S, self.topic)
        except BrokerUnavailable as exc:
            raise KafkaSourceError(str(exc)) from None

    def topic_names(self) -> frozenset[str]:
        """The name of every topic on the broker."""
        try:
            metadata = list_topics(self._consumer, self._problems, self.bootstrap, METADATA_TIMEOUT_S)
        except BrokerUnavailable as exc:
            raise KafkaSourceError(str(exc)) from None
        return frozenset(metadata.topics)

    def _why(self, exc: BaseException) -> str:
        """What went wrong, in the client's own words if it said more than ``exc`` (secrets scrubbed)."""
        self._problems.serve(self._consumer)
        return self._problems.scrub(self._problems.cause() or str(exc))

    def partitions(self) -> list[int]:
        from confluent_kafka import KafkaError

        topic = self._metadata().topics.get(self.topic)
        if topic is None or (topic.error is not None and topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            raise TopicMissing(
                f"topic {self.topic!r} does not exist on {self.bootstrap}: create it (krishiv topic create "
                f"{self.topic}, or produce to it), or correct the topic in the spec "
                + runbook("A topic that does not exist")
            )
        if topic.error is not None or not topic.partitions:
            reason = topic.error if topic.error is not None else "no partitions"
            raise KafkaSourceError(f"topic {self.topic!r} is not available on {self.bootstrap}: {reason}")
        return sorted(topic.partitions)

    def identity(self) -> Identity:
        """``{"cluster_id": ..., "topic_id": ...}``: what tells this topic from one of the same name re-created or on
        another cluster. Either is None when the broker does not report it."""
        return {"cluster_id": self._metadata().cluster_id, "topic_id": self.topic_id()}

    def topic_id(self) -> str | None:
        """The topic's id from DescribeTopics, or None if the broker does not support it (or has none)."""
        from concurrent.futures import TimeoutError as FutureTimeout

        from confluent_kafka import KafkaError, KafkaException, TopicCollection

        if self._admin is None:
            config = {**self._extra, "bootstrap.servers": self.bootstrap}
            self._admin = build(self._clients.admin, config, self._problems)
        try:
            futures = self._admin.describe_topics(TopicCollection([self.topic]), request_timeout=METADATA_TIMEOUT_S)
            description = futures[self.topic].result(METADATA_TIMEOUT_S)
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if error is not None and error.code() == KafkaError._UNSUPPORTED_FEATURE:
                return None
            raise KafkaSourceError(
                f"Kafka broker at {self.bootstrap} did not describe topic {self.topic!r}: {self._why(exc)}"
            ) from None
        except FutureTimeout as exc:
            raise KafkaSourceError(
                f"Kafka broker at {self.bootstrap} did not describe topic {self.topic!r} "
                f"within {METADATA_TIMEOUT_S:.0f}s"
            ) from exc
        topic_id = str(description.topic_id) if description.topic_id is not None else None
        return None if topic_id in (None, "", UNKNOWN_TOPIC_ID) else topic_id

    def watermarks(self, partition: int) -> tuple[int, int]:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, partition), timeout=METADATA_TIMEOUT_S, cached=False
            )
        except KafkaException as exc:
            raise KafkaSourceError(
                f"Kafka broker at {self.bootstrap} did not report offsets of {self.topic}/{partition}: {self._why(exc)}"
            ) from None
        return int(low), int(high)

    def latest(self) -> Offsets:
        return {str(p): self.watermarks(p)[1] for p in self.partitions()}

    def earliest(self) -> Offsets:
        return {str(p): self.watermarks(p)[0] for p in self.partitions()}

    def close(self) -> None:
        self._admin = None
        _close_quietly(self._consumer)

    def __enter__(self) -> KafkaAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def latest_offsets(bootstrap: str, topic: str, extra: Mapping[str, str] | None = None) -> Offsets:
    """Each partition's high watermark; raises :class:`KafkaSourceError` naming the broker if it does not answer."""
    with KafkaAdmin(bootstrap, topic, extra or {}) as admin:
        return admin.latest()


def batch_rows(backlog: int, max_rows: int, catch_up_rows: int) -> int:
    """The most offsets the next batch spans: ``max_rows``, or ``catch_up_rows`` (when larger) while the ``backlog``
    is more than ``max_rows``.

    Each batch pays a fixed cost whatever its size (planning, a Python worker per task, the sink's Spark jobs, a
    ledger transaction, a snapshot): about a second on two cores, against about two seconds of work per 200,000
    records. A pipeline behind by many batches catches up in fewer, larger ones; a pipeline that keeps up reads
    at most ``max_rows`` per batch, as before.
    """
    if catch_up_rows <= max_rows or backlog <= max_rows:
        return max_rows
    return catch_up_rows


def cap_offsets(start: Offsets, latest: Offsets, max_rows: int, order: Callable[[str], Any] = int) -> Offsets:
    """End offsets spanning at most ``max_rows`` offsets, shared in proportion to each partition's backlog.

    ``order`` sorts partitions' keys (partition numbers; a source over several topics has its own keys). A
    partition missing from ``start`` is new: it has no backlog and ends at ``latest`` (where the caller puts its
    low watermark), so the batch records where it starts and reads nothing from it. Offsets are an upper bound on
    records (transaction markers and compacted-away offsets hold none), so a batch may read fewer than ``max_rows``.
    """
    begin = {p: start.get(p, latest[p]) for p in latest}
    backlog = {p: max(0, latest[p] - begin[p]) for p in latest}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    # Largest remainders: each partition gets its exact share rounded down, and the offsets left over go one each
    # to the partitions with the largest fractions (ties by partition), so every share is rounded down or up.
    take = {p: (n * max_rows) // total for p, n in backlog.items()}
    spare = max_rows - sum(take.values())
    by_fraction = sorted(backlog, key=lambda q: (-((backlog[q] * max_rows) % total), order(q)))
    for p in by_fraction[:spare]:
        take[p] += 1
    return {p: begin[p] + take[p] for p in latest}


class KafkaRange(InputPartition):
    """One Spark task's work: records ``[start, end)`` of one topic partition. Picklable."""

    def __init__(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        config: dict[str, Any],
        timeout_s: float,
        pipeline: str = "<pipeline>",
        decoding: Decoding | None = None,
    ):
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.config, self.timeout_s, self.pipeline = range_consumer_config(config, end - start), timeout_s, pipeline
        self.decoding = decoding


class KafkaSplit(InputPartition):
    """One Spark task's work: one or more ranges (:class:`KafkaRange`), read one after the other. Picklable."""

    def __init__(self, ranges: list[KafkaRange]):
        super().__init__(tuple((r.topic, r.partition, r.start, r.end) for r in ranges))
        self.ranges = tuple(ranges)


def pack_ranges(ranges: list[KafkaRange], records: int) -> list[KafkaSplit]:
    """``ranges`` in order, packed into splits of up to ``records`` records (a longer range is a split alone)."""
    splits: list[KafkaSplit] = []
    current: list[KafkaRange] = []
    size = 0
    for r in ranges:
        if current and size + (r.end - r.start) > records:
            splits.append(KafkaSplit(current))
            current, size = [], 0
        current.append(r)
        size += r.end - r.start
    if current:
        splits.append(KafkaSplit(current))
    return splits


def _record_batch(msgs: list[Any], topic: str, partition: int, decoder: RecordDecoder | None) -> pa.RecordBatch:
    if decoder is not None:
        return decoder.decode(
            [m.key() for m in msgs],
            [m.value() for m in msgs],
            topic,
            partition,
            [m.offset() for m in msgs],
            [m.timestamp()[1] for m in msgs],
        )
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


#: Consumer errors that say the broker is out of reach for now: librdkafka reconnects by itself, so reading goes
#: on, bounded by the range's read timeout.
def _transient_codes() -> frozenset[int]:
    from confluent_kafka import KafkaError

    return frozenset(
        {
            KafkaError._TRANSPORT,
            KafkaError._ALL_BROKERS_DOWN,
            KafkaError._TIMED_OUT,
            KafkaError.REQUEST_TIMED_OUT,
            KafkaError.NETWORK_EXCEPTION,
            KafkaError.LEADER_NOT_AVAILABLE,
            KafkaError.NOT_LEADER_FOR_PARTITION,
        }
    )


#: How long a range's reader waits without progress before it asks the broker whether its end still exists.
BEHIND_CHECK_AFTER_S = 1.0


def _range_watermarks(consumer: Any, part: KafkaRange, deadline: float) -> tuple[int, int] | None:
    """The partition's watermarks, retried while the broker does not answer until ``deadline`` (then None)."""
    from confluent_kafka import KafkaException, TopicPartition

    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(part.topic, part.partition), timeout=METADATA_TIMEOUT_S, cached=False
            )
            return int(low), int(high)
        except KafkaException:
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def read_range(part: KafkaRange, clients: KafkaClients = CONFLUENT_CLIENTS) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``[start, end)`` as Arrow batches; records outside the range are dropped.

    Offsets may have gaps (transaction markers, aborted or compacted-away records): the range ends when the
    consumer's position reaches ``end``, whether or not a record sits at ``end - 1``. A broker out of reach is
    waited for (librdkafka reconnects) up to the range's read timeout; a partition whose high watermark stays below
    ``end`` (the topic re-created or emptied) cannot be read as recorded and fails at once with the command that
    moves past it.
    """
    from confluent_kafka import KafkaError

    bootstrap = part.config.get("bootstrap.servers")
    where = f"{part.topic}/{part.partition} [{part.start}, {part.end})"
    problems = KafkaProblems(part.config)
    consumer = build(clients.consumer, part.config, problems)
    transient = _transient_codes()
    decoder = decoder_for(part.decoding) if part.decoding is not None else None

    def skip(offset: int | str) -> str:
        return skip_hint(part.partition, offset, part.pipeline, f"{part.topic} re-created or emptied")

    try:
        marks = _range_watermarks(consumer, part, time.monotonic() + part.timeout_s)
        if marks is None:
            raise KafkaSourceError(
                problems.scrub(
                    f"Kafka broker at {bootstrap} did not answer for {part.timeout_s:g}s while reading {where}; "
                    f"what was staged is kept: start again once the broker is back {RUNBOOK_OUTAGE}"
                )
            )
        low, _high = marks
        if part.start < low:
            raise OffsetsDeleted(
                f"offsets [{part.start}, {low}) of {part.topic}/{part.partition} were deleted by retention before "
                f"Spark read them; batch range {where} cannot be read exactly (broker {bootstrap}); "
                f"to move on: {skip_hint(part.partition, low, part.pipeline, 'deleted by retention')} "
                f"{RUNBOOK_OFFSETS}"
            )
        consumer.assign([_topic_partition(part.topic, part.partition, part.start)])
        next_offset = part.start
        last_progress = time.monotonic()
        behind_since: float | None = None
        while next_offset < part.end:
            msgs = consumer.consume(min(CONSUME_BATCH, part.end - next_offset), timeout=POLL_TIMEOUT_S)
            good = [m for m in msgs if m.error() is None]  # one C call per record; errors are looked at apart
            for m in msgs if len(good) != len(msgs) else ():
                err = m.error()
                if err is None:
                    continue
                if err.code() == KafkaError._AUTO_OFFSET_RESET or err.code() == KafkaError.OFFSET_OUT_OF_RANGE:
                    now = _range_watermarks(consumer, part, time.monotonic())
                    if now is not None and now[1] < part.end:
                        raise _moved_back(part, where, bootstrap, now, skip)
                    raise OffsetsDeleted(
                        f"{where}: offset {m.offset()} is out of range on {bootstrap}: {err}; "
                        f"to move on: {skip(now[0] if now is not None else '<offset>')} {RUNBOOK_OFFSETS}"
                    )
                elif err.code() not in transient and err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaSourceError(problems.scrub(f"reading {where} from {bootstrap} failed: {err}"))
            if good:
                if good[-1].offset() >= part.end:
                    good = [m for m in good if m.offset() < part.end]
                if good and good[0].offset() < part.start:
                    good = [m for m in good if m.offset() >= part.start]
            if good:
                next_offset = good[-1].offset() + 1
                last_progress = time.monotonic()
                behind_since = None
                yield _record_batch(good, part.topic, part.partition, decoder)
                continue
            # Nothing new: offsets up to `end` may be transaction markers or compacted away.
            position = consumer.position([_topic_partition(part.topic, part.partition)])[0].offset
            if position >= part.end:
                return
            now_s = time.monotonic()
            if now_s - last_progress > BEHIND_CHECK_AFTER_S:
                # Is `end` still there? A high watermark below it (read again for ~2 s: Tansu may report one a
                # little low for a moment) means the records the batch recorded are gone: waiting will not help.
                now = _range_watermarks(consumer, part, now_s)
                if now is not None and now[1] < part.end:
                    behind_since = behind_since if behind_since is not None else now_s
                    if now_s - behind_since >= sum(WATERMARK_RECHECK_DELAYS_S):
                        raise _moved_back(part, where, bootstrap, now, skip)
                else:
                    behind_since = None
            if now_s - last_progress > part.timeout_s:
                cause = problems.cause()
                raise KafkaSourceError(
                    problems.scrub(
                        f"no records from {bootstrap} for {part.timeout_s:g}s while reading {where} "
                        f"(stuck at offset {next_offset}); "
                        + (f"the client says: {cause}" if cause else "is the broker up?")
                        + f"; what was staged is kept {RUNBOOK_OUTAGE}"
                    )
                )
    finally:
        _close_quietly(consumer)


def _topic_partition(topic: str, partition: int, offset: int | None = None) -> Any:
    from confluent_kafka import TopicPartition

    return TopicPartition(topic, partition) if offset is None else TopicPartition(topic, partition, offset)


def _moved_back(
    part: KafkaRange, where: str, bootstrap: Any, marks: tuple[int, int], skip: Callable[[int], str]
) -> OffsetsMovedBackwards:
    low, high = marks
    return OffsetsMovedBackwards(
        f"{where} on {bootstrap}: the high watermark {high} is below the batch's end offset {part.end}, so the "
        f"records the batch recorded are gone (topic re-created or emptied?); nothing is skipped silently; "
        f"to move on: {skip(low)} {RUNBOOK_OFFSETS}"
    )


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    #: Pauses between watermark re-reads before offsets are believed to have moved backwards (tests shorten them).
    recheck_delays_s: tuple[float, ...] = WATERMARK_RECHECK_DELAYS_S

    def __init__(self, options: Mapping[str, str], clients: KafkaClients = CONFLUENT_CLIENTS) -> None:
        try:
            self.bootstrap = options["bootstrap.servers"]
            self.topic = options["topic"]
        except KeyError as exc:
            raise KafkaSourceError(f"the {SOURCE_NAME} source needs the option {exc.args[0]!r}") from None
        self.extra = {k[len("kafka.") :]: v for k, v in options.items() if k.startswith("kafka.")}
        for key in self.extra:
            if key in FORCED_CONSUMER_SETTINGS:
                forced = FORCED_CONSUMER_SETTINGS[key]
                shown = str(forced).lower() if isinstance(forced, bool) else forced
                raise KafkaSourceError(
                    f"option kafka.{key}: Krishiv sets this itself ({shown}) for exactly-once; remove it"
                )
        self.clients = clients
        self.expected_identity = self._identity_option(options.get("expectedIdentity"))
        self.max_records = int(options.get("maxRecordsPerBatch", "0"))
        self.catch_up_records = int(options.get("catchUpRecordsPerBatch", "0"))
        self.records_per_split = max(1, int(options.get("recordsPerSplit", "250000")))
        self.timeout_s = float(options.get("readTimeoutSeconds", "120"))
        self.pipeline = options.get("pipeline", "<pipeline>")
        self.outage_s = float(options.get("brokerOutageSeconds", str(DEFAULT_OUTAGE_S)))
        self._down_since: float | None = None
        self._topic_missing = False  # whether the outage is a broker that answers without the topic
        self.starting: Offsets = {str(k): int(v) for k, v in json.loads(options.get("startingOffsets", "{}")).items()}
        self._admin: KafkaAdmin | None = None
        self._target: Offsets | None = None
        checkpoint_path = options.get("checkpointPath")
        self.checkpoint = Checkpoint(checkpoint_path) if checkpoint_path else None
        try:
            self.recorded = RecordedBatches.from_option(options.get("recorded"))
        except (ValueError, KeyError, TypeError) as exc:
            raise KafkaSourceError(f"option recorded: expected the JSON of RecordedBatches: {exc}") from None
        self._skips = list(self.recorded.skips)
        self.decoding = decoding_option(options)

    @staticmethod
    def _identity_option(text: str | None) -> Identity | None:
        if text is None:
            return None
        try:
            identity = json.loads(text)
        except json.JSONDecodeError as exc:
            raise KafkaSourceError(f"option expectedIdentity: expected JSON, got {text!r}: {exc}") from None
        if not isinstance(identity, dict) or not set(identity) <= {"cluster_id", "topic_id"}:
            raise KafkaSourceError(
                f"option expectedIdentity: expected {{'cluster_id': …, 'topic_id': …}}, got {text!r}"
            )
        return {key: None if identity.get(key) is None else str(identity[key]) for key in ("cluster_id", "topic_id")}

    @property
    def admin(self) -> KafkaAdmin:
        if self._admin is None:
            self._admin = KafkaAdmin(self.bootstrap, self.topic, self.extra, self.clients)
        return self._admin

    def _retrying(self, call: Callable[[], Any]) -> Any:
        """``call()``, retried with back-off while the broker does not answer, for up to :attr:`outage_s` from the
        first failure (a failure in one call and one in the next are one outage). One line when the broker is found
        unreachable and one when it is back; after the bound, one :class:`KafkaSourceError` line."""
        attempt = 0
        while True:
            try:
                result = call()
            except Exception as exc:
                if not _transient(exc):
                    raise
                now = time.monotonic()
                missing = isinstance(exc, TopicMissing)  # the broker answers, without the topic
                starting = self._down_since is None
                if starting:
                    self._down_since = now
                if starting or missing != self._topic_missing:  # a new outage, or its cause changed
                    self._topic_missing = missing
                    say(before_pointer(str(exc), f"; retrying for up to {self.outage_s:g}s"))
                waited = now - self._down_since
                if waited >= self.outage_s and missing:
                    raise KafkaSourceError(
                        before_pointer(
                            str(exc), f"; waited {waited:.0f}s for it: the query stopped, what was staged is kept"
                        )
                    ) from None
                if waited >= self.outage_s:
                    cause = str(exc).removeprefix(f"Kafka broker at {self.bootstrap} is unreachable: ")
                    raise KafkaSourceError(
                        f"Kafka broker at {self.bootstrap} did not answer for {waited:.0f}s ({cause}); the query "
                        f"stopped and what was staged is kept: start it again once the broker is back "
                        f"{RUNBOOK_OUTAGE}"
                    ) from None
                time.sleep(min(OUTAGE_BACKOFF_S[min(attempt, len(OUTAGE_BACKOFF_S) - 1)], self.outage_s - waited))
                attempt += 1
                continue
            if self._down_since is not None:
                back = f"topic {self.topic!r} is" if self._topic_missing else f"Kafka broker at {self.bootstrap} is"
                say(f"{back} back after {time.monotonic() - self._down_since:.0f}s")
                self._down_since, self._topic_missing = None, False
            return result

    def initialOffset(self) -> dict:
        earliest = self._retrying(self.admin.earliest)
        return {p: self.starting.get(p, low) for p, low in earliest.items()}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._retrying(self.admin.latest)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records) if self.max_records > 0 else ReadAllAvailable()

    def _recorded_end(self, start: Offsets) -> Offsets | None:
        """The end offsets the ledger recorded for the batch Spark is planning, if it was staged before.

        A rewound checkpoint, or an old copy of it, makes Spark plan batch ids that were staged already.
        Planned afresh they would cover other ranges (the backlog has grown), and their output would differ
        from what the ledger holds; so the source returns exactly the recorded end. Spark plans batch N
        when N - 1 is the last batch of its offset log.
        """
        if not self.recorded.ends or self.checkpoint is None:
            return None
        recorded = self.recorded.ends.get(self.checkpoint.last_batch_id() + 1)
        return None if recorded is None else {**start, **recorded}

    def _with_skips(self, start: Offsets, *, planning: bool) -> Offsets:
        """``start`` with the operator's recorded skips (``krishiv skip-offsets``) for this batch applied
        (:func:`spark_jobs.ports.apply_skips`). The batch is the one Spark plans next (``planning``, in
        ``latestOffset``) or the last of its offset log (Spark logs a batch's end offsets before it asks for its
        partitions); the stager records in the ledger which batch applied a skip.
        """
        if not self._skips or self.checkpoint is None:
            return start
        batch_id = self.checkpoint.last_batch_id() + (1 if planning else 0)
        moved, self._skips = apply_skips(self._skips, start, batch_id)
        return moved

    def _skip(self, partition: int | str, offset: int | str, why: str) -> str:
        return skip_hint(partition, offset, self.pipeline, why)

    def _check_identity(self, start: Offsets | None = None, admin: KafkaAdmin | None = None) -> None:
        """The topic and cluster are the ones the checkpoint began on (a None id is not compared), else
        :class:`SourceChanged` with the skips that move on. Checked at every batch: before the driver plans it,
        before its tasks are handed out (a batch replayed from the offset log after a restart is never planned
        again), and by each task before and after it reads (:meth:`read`), so no batch is ever read from an
        incarnation of the topic other than the one its ledger entry records, even when the broker came back empty
        between two batches and nobody saw it go. A metadata request and a DescribeTopics: milliseconds a batch."""
        if self.expected_identity is None:
            return
        admin = admin if admin is not None else self.admin
        actual = admin.identity()
        for key in ("cluster_id", "topic_id"):
            old, new = self.expected_identity.get(key), actual.get(key)
            if old is not None and new is not None and old != new:
                was, now = json.dumps(self.expected_identity, sort_keys=True), json.dumps(actual, sort_keys=True)
                # The skips name only partitions the query reads (a partition of the new topic it has no start in
                # begins at its low watermark anyway): those whose start is not that low watermark, else all of them.
                lows = admin.earliest()
                read = [p for p in sorted(lows, key=int) if start is None or p in start] or sorted(lows, key=int)
                moved = [p for p in read if start is None or start.get(p) != lows[p]] or read
                why = f"topic {self.topic} re-created" if key == "topic_id" else f"{self.topic} on another cluster"
                commands = "; ".join(self._skip(p, lows[p], why) for p in moved)
                raise SourceChanged(
                    f"topic {self.topic!r} on {self.bootstrap} is not the one this query began on: it was {was}, "
                    f"it is now {now} (deleted and re-created, or another cluster); nothing is read from it "
                    f"silently; to move on from its first offsets: {commands} {RUNBOOK_OFFSETS}"
                )

    def watermarks_moving_forward(self, start: Offsets, end: Offsets | None = None) -> dict[str, tuple[int, int]]:
        """Each partition's ``(low, high)`` watermarks, once no high watermark is below its start in ``start`` (or
        below its end in ``end``, the recorded end of a batch planned again: its records must all be there).

        A high watermark below a start is re-read after each of :attr:`recheck_delays_s` before it is believed, then
        raises :class:`OffsetsMovedBackwards`; a partition of ``start`` that the topic no longer has raises
        :class:`SourceChanged`; a start below the low watermark raises :class:`OffsetsDeleted`.
        """
        need = {**start, **(end or {})}
        for delay in (*self.recheck_delays_s, None):
            marks = {str(p): self.admin.watermarks(p) for p in self.admin.partitions()}
            missing = sorted((p for p in start if p not in marks), key=int)
            behind = sorted((p for p in need if p in marks and marks[p][1] < need[p]), key=int)
            if not missing and not behind:
                break
            if delay is None:
                if missing:
                    p = missing[0]
                    raise SourceChanged(
                        f"topic {self.topic!r} on {self.bootstrap} has no partition {p} now (partitions "
                        f"{sorted(marks, key=int)}), but the query reads it from offset {start[p]} "
                        f"{RUNBOOK_OFFSETS}"
                    )
                p = behind[0]
                low, high = marks[p]
                which = "start" if need[p] == start.get(p) else "recorded end"
                why = f"topic {self.topic} re-created or emptied"
                commands = "; ".join(self._skip(q, marks[q][0], why) for q in behind)
                raise OffsetsMovedBackwards(
                    f"{self.topic}/{p} on {self.bootstrap}: the high watermark {high} is below the batch's {which} "
                    f"offset {need[p]} (topic re-created, or a fail-over to another cluster?); nothing is skipped "
                    f"silently; to move on: {commands} {RUNBOOK_OFFSETS}"
                )
            time.sleep(delay)
        for p, begin in sorted(start.items(), key=lambda kv: int(kv[0])):
            low = marks[p][0]
            if begin < low:
                raise OffsetsDeleted(
                    f"{self.topic}/{p} on {self.bootstrap}: the batch's start offset {begin} is below the low "
                    f"watermark {low} (offsets [{begin}, {low}) were deleted by retention before they were read); "
                    f"to move on: {self._skip(p, low, 'deleted by retention')} {RUNBOOK_OFFSETS}"
                )
        return marks

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end offsets of the batch Spark plans next, after checking that offsets only move forward; a broker
        that does not answer is waited for (:meth:`_retrying`)."""
        begin = self._with_skips({str(p): int(o) for p, o in start.items()}, planning=True)
        return self._retrying(lambda: self._plan(begin, limit))

    def _plan(self, begin: Offsets, limit: ReadLimit) -> Offsets:
        latest, recorded = self.plan_end(begin)
        if not recorded and isinstance(limit, ReadMaxRows):
            backlog = sum(max(0, end - begin[p]) for p, end in latest.items() if p in begin)
            return cap_offsets(begin, latest, batch_rows(backlog, limit.max_rows, self.catch_up_records))
        return latest

    def plan_end(self, begin: Offsets) -> tuple[Offsets, bool]:
        """The end of the batch Spark plans next before any read limit, and whether the ledger recorded it (then it
        is the batch's end as it stands): every check of :meth:`latestOffset` made."""
        self._check_identity(begin)
        recorded = self._recorded_end(begin)
        marks = self.watermarks_moving_forward(begin, recorded)
        if recorded is not None:
            return recorded, True
        latest = {p: high for p, (_low, high) in marks.items()}
        if self._target is not None:
            # Trigger.AvailableNow: our own pinned target may lie below the start (it is not the broker going
            # backwards, which was checked above); the start wins.
            latest = {
                p: max(begin[p], min(end, self._target.get(p, begin[p]))) for p, end in latest.items() if p in begin
            }
        # A partition the start does not know is new: it starts at its low watermark, and nothing of it is read now.
        return {p: latest[p] if p in begin else marks[p][0] for p in marks}, False

    def reportLatestOffset(self) -> dict | None:
        return self._retrying(self.admin.latest)

    def partitions(self, start: dict, end: dict) -> list[KafkaSplit]:
        start = self._with_skips({str(p): int(o) for p, o in start.items()}, planning=False)
        self._retrying(lambda: self._check_identity(start))
        config = consumer_config(self.bootstrap, self.extra)
        ranges = []
        for p, stop in sorted(end.items(), key=lambda kv: int(kv[0])):
            first = int(start.get(p, stop))  # a partition new in this batch is read from the next one on
            for lo in range(first, int(stop), self.records_per_split):
                hi = min(int(stop), lo + self.records_per_split)
                ranges.append(
                    KafkaRange(
                        self.topic,
                        int(p),
                        lo,
                        hi,
                        config,
                        max(self.timeout_s, self.outage_s),
                        self.pipeline,
                        self.decoding,
                    )
                )
        return pack_ranges(ranges, min(self.records_per_split, TASK_PACK_RECORDS))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The split's records, read between two checks of the topic's identity: a topic re-created (or a
        fail-over to another cluster) before the task reads, or while it reads, fails the task, and so the batch,
        before anything of it is staged."""
        assert isinstance(partition, KafkaSplit)
        start: Offsets = {}
        for part in partition.ranges:
            start.setdefault(str(part.partition), part.start)
        with self._task_admin() as admin:
            self._retrying(lambda: self._check_identity(start, admin))
            for part in partition.ranges:
                yield from read_range(part, self.clients)
            self._retrying(lambda: self._check_identity(start, admin))

    def _task_admin(self) -> contextlib.AbstractContextManager[KafkaAdmin | None]:
        """A metadata client for a task's identity checks, or none when there is no identity to check."""
        if self.expected_identity is None:
            return contextlib.nullcontext()
        return KafkaAdmin(self.bootstrap, self.topic, self.extra, self.clients)

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
        decoding = decoding_option(self.options)
        return SCHEMA if decoding is None else decoding.spark_schema()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(self.options)
