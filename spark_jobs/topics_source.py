"""One streaming source over several topics: ``spark.readStream.format("krishiv-kafka-topics")``.

A pipeline over several topics (``krishiv_core.spec_topics``) reads every topic in one query, so one batch id
covers a range of each and the batch is committed to all its tables at once. Each topic is read by a
:class:`spark_jobs.kafka_source.KafkaStreamReader` of its own, with all its checks (offsets only forward, the
topic's identity, the operator's skips, recorded ends); this source composes them. Offsets are
``{topic: {partition: next offset}}``. A batch's read limit is shared between every partition of every topic in
proportion to its backlog. A topic the checkpoint has not seen (added to ``topics`` since) starts at its low
watermark: the batch that first sees it records that, and the next reads from there.

Each topic's records are decoded with its own fields (its member pipeline's :class:`Decoding`), so the rows of
one batch have no common columns beyond the Kafka record's: the source hands Spark the record's columns, the
decoding's ``reason``/``__tombstone``/``__cdc_delete``, the transaction columns (:data:`TX_COLUMNS`) and one struct
column per topic (:meth:`TopicsLayout.member_column`) holding that topic's fields, null in every other topic's
rows. Debezium's transaction metadata topic, when there is one, is decoded into the transaction columns
(:func:`transaction_mark`). A pipeline over ``topic_pattern`` stops its query when a new topic matches
(:meth:`TopicsStreamReader._discover`); ``krishiv run`` starts it again with that topic's table.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from krishiv_core.formats import JSON
from krishiv_core.tables import spark_type
from krishiv_core.topic_matches import matching
from spark_jobs.debezium import Unreadable, transaction_of, unwrap_json
from spark_jobs.errors import KafkaSourceError, TopicMissing, TopicsAppeared
from spark_jobs.kafka_source import (
    CONFLUENT_CLIENTS,
    TASK_PACK_RECORDS,
    KafkaClients,
    KafkaRange,
    KafkaSplit,
    KafkaStreamReader,
    Offsets,
    batch_rows,
    cap_offsets,
    pack_ranges,
)
from spark_jobs.record_decoder import CDC_DELETE, KAFKA_COLUMNS, REASON, TOMBSTONE, Decoding, arrow_type

SOURCE_NAME = "krishiv-kafka-topics"
#: A transaction mark's columns: its ``status`` (BEGIN, END), its transaction (the xid) and, for an END, its
#: events per table (``{"public.orders": 2}``, JSON). A change event's transaction is ``__tx_xid`` too.
TX_STATUS, TX_XID, TX_COUNTS = "__tx_status", "__tx_xid", "__tx_counts"
TX_COLUMNS = ((TX_STATUS, pa.string()), (TX_XID, pa.string()), (TX_COUNTS, pa.string()))
#: Every row's columns before the topics' structs.
HEAD_COLUMNS = (*KAFKA_COLUMNS, (REASON, pa.string()), (TOMBSTONE, pa.bool_()), (CDC_DELETE, pa.bool_()), *TX_COLUMNS)
#: Offsets of several topics, as Spark's offset log holds them.
TopicOffsets = dict[str, Offsets]
_SEP = "\0"


@dataclass(frozen=True)
class TopicsLayout:
    """The topics a query reads and how each is decoded (picklable; an option of the source as JSON)."""

    topics: tuple[str, ...]  # the change-event topics, each a member of the pipeline
    decodings: tuple[Decoding, ...]
    transaction_topic: str | None = None
    #: The transaction topic's value format (the converter's: json or avro) and the registry it needs.
    transaction_format: str = JSON
    registry: Mapping[str, str] | None = None
    registry_outage_s: float = 60.0
    #: The pipeline's ``topic_pattern``, whose new matches stop the query (:class:`TopicsAppeared`), and how often
    #: the broker's topics are listed for them.
    topic_pattern: str | None = None
    discovery_interval_s: float = 30.0

    @property
    def all_topics(self) -> tuple[str, ...]:
        return (*self.topics, *((self.transaction_topic,) if self.transaction_topic else ()))

    @staticmethod
    def member_column(i: int) -> str:
        return f"__t{i}"

    def struct_type(self, i: int) -> pa.StructType:
        d = self.decodings[i]
        return pa.struct([pa.field(n, arrow_type(d.field(n).type)) for n in d.output])

    def arrow_schema(self) -> pa.Schema:
        members = [(self.member_column(i), self.struct_type(i)) for i in range(len(self.topics))]
        return pa.schema([*HEAD_COLUMNS, *members])

    def spark_schema(self) -> str:
        head = (
            "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
            f"{REASON} string, {TOMBSTONE} boolean, {CDC_DELETE} boolean, "
            + ", ".join(f"{n} string" for n, _ in TX_COLUMNS)
        )
        members = "".join(
            f", {self.member_column(i)} struct<"
            + ", ".join(f"`{n}`: {spark_type(d.field(n).type)}" for n in d.output)
            + ">"
            for i, d in enumerate(self.decodings)
        )
        return head + members

    def to_option(self) -> str:
        return json.dumps(
            {
                "topics": list(self.topics),
                "decodings": [d.to_option() for d in self.decodings],
                "transaction_topic": self.transaction_topic,
                "transaction_format": self.transaction_format,
                "registry": None if self.registry is None else dict(self.registry),
                "registry_outage_s": self.registry_outage_s,
                "topic_pattern": self.topic_pattern,
                "discovery_interval_s": self.discovery_interval_s,
            }
        )

    @classmethod
    def from_option(cls, text: str) -> TopicsLayout:
        doc = json.loads(text)
        return cls(
            tuple(doc["topics"]),
            tuple(Decoding.from_option(d) for d in doc["decodings"]),
            doc.get("transaction_topic"),
            doc.get("transaction_format", JSON),
            doc.get("registry"),
            float(doc.get("registry_outage_s", 60.0)),
            doc.get("topic_pattern"),
            float(doc.get("discovery_interval_s", 30.0)),
        )

    def union(self, topic: str, batch: pa.RecordBatch) -> pa.RecordBatch:
        """One topic's decoded batch (its decoding's columns, or the raw record for the transaction topic) in the
        layout of every topic."""
        n = batch.num_rows
        if topic == self.transaction_topic:
            return self._marks(batch)
        i = self.topics.index(topic)
        head = [batch.column(name) for name, _ in HEAD_COLUMNS[: len(KAFKA_COLUMNS) + 3]]
        names = batch.schema.names
        xid = batch.column("_cdc_tx") if "_cdc_tx" in names else pa.nulls(n, pa.string())
        tx = [pa.nulls(n, pa.string()), xid, pa.nulls(n, pa.string())]
        fields = self.struct_type(i)
        own = pa.StructArray.from_arrays([batch.column(f.name) for f in fields], fields=list(fields))
        members = [own if j == i else pa.nulls(n, self.struct_type(j)) for j in range(len(self.topics))]
        return pa.RecordBatch.from_arrays([*head, *tx, *members], schema=self.arrow_schema())

    def _marks(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        reader = _MarkReader(self)
        values = batch.column("value").to_pylist()
        status, xid, counts, reasons, kept = [], [], [], [], []
        for value in values:
            try:
                mark = transaction_mark(reader.payload(value))
            except Unreadable as exc:
                mark, reason = (None, None, None), str(exc)
            else:
                reason = None
            status.append(mark[0])
            xid.append(mark[1])
            counts.append(mark[2])
            reasons.append(reason)
            kept.append(value if reason is not None else None)
        head = [
            batch.column("key"),
            pa.array(kept, pa.binary()),
            *[batch.column(name) for name, _ in KAFKA_COLUMNS[2:]],
            pa.array(reasons, pa.string()),
            pa.repeat(pa.scalar(False), n),
            pa.repeat(pa.scalar(False), n),
            pa.array(status, pa.string()),
            pa.array(xid, pa.string()),
            pa.array(counts, pa.string()),
        ]
        members = [pa.nulls(n, self.struct_type(j)) for j in range(len(self.topics))]
        return pa.RecordBatch.from_arrays([*head, *members], schema=self.arrow_schema())


class _MarkReader:
    """A transaction mark's value, decoded as the converter wrote it (JSON, or the registry's Avro)."""

    def __init__(self, layout: TopicsLayout) -> None:
        self.layout = layout
        self._format: Any = None

    def payload(self, value: bytes | None) -> Any:
        if value is None:
            raise Unreadable("null value (a transaction mark has one)")
        if self.layout.transaction_format == JSON:
            return unwrap_json(value, "value").payload
        if self._format is None:
            from spark_jobs.registry_decoder import FormatReader

            decoding = Decoding(
                (), frozenset(), (), None, self.layout.transaction_format, registry=self.layout.registry
            )
            self._format = FormatReader(
                self.layout.transaction_format, decoding, "value", self.layout.registry_outage_s
            )
        try:
            return self._format.read(value, str(self.layout.transaction_topic)).payload
        except Exception as exc:
            if isinstance(exc, KafkaSourceError):
                raise
            raise Unreadable(f"transaction mark not readable: {exc}") from None


def transaction_mark(payload: Any) -> tuple[str, str | None, str | None]:
    """(status, xid, events per table as JSON) of a Debezium transaction mark; :class:`Unreadable` otherwise."""
    if not isinstance(payload, Mapping) or payload.get("status") not in ("BEGIN", "END"):
        raise Unreadable("not a Debezium transaction mark: no status BEGIN or END")
    xid = transaction_of(payload)
    if xid is None:
        raise Unreadable("Debezium transaction mark without an id")
    if payload["status"] == "BEGIN":
        return "BEGIN", xid, None
    counts: dict[str, int] = {}
    for c in payload.get("data_collections") or ():
        if not isinstance(c, Mapping) or not isinstance(c.get("event_count"), int):
            raise Unreadable(f"Debezium END mark of transaction {xid}: data_collections entry {str(c)[:60]}")
        counts[str(c.get("data_collection"))] = counts.get(str(c.get("data_collection")), 0) + c["event_count"]
    return "END", xid, msgspec.json.encode(counts).decode()


def _flat(offsets: TopicOffsets) -> Offsets:
    return {f"{t}{_SEP}{p}": o for t, parts in offsets.items() for p, o in parts.items()}


def _nested(flat: Offsets) -> TopicOffsets:
    out: TopicOffsets = {}
    for key, o in flat.items():
        t, p = key.split(_SEP)
        out.setdefault(t, {})[p] = o
    return out


def _order(key: str) -> tuple[str, int]:
    t, p = key.split(_SEP)
    return t, int(p)


class TopicsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's reader over every topic of the layout: one :class:`KafkaStreamReader` per topic, composed."""

    def __init__(self, options: Mapping[str, str], clients: KafkaClients = CONFLUENT_CLIENTS) -> None:
        try:
            self.layout = TopicsLayout.from_option(options["layout"])
        except KeyError:
            raise KafkaSourceError(f"the {SOURCE_NAME} source needs the option 'layout'") from None
        starting = json.loads(options.get("startingOffsets") or "{}")
        identity = json.loads(options.get("expectedIdentity") or "{}")
        recorded = json.loads(options.get("recorded") or "{}")
        shared = {
            k: v
            for k, v in options.items()
            if k not in ("layout", "startingOffsets", "expectedIdentity", "recorded", "decoding")
        }
        self.readers: dict[str, KafkaStreamReader] = {}
        for i, topic in enumerate(self.layout.all_topics):
            own = {**shared, "topic": topic, "startingOffsets": json.dumps(starting.get(topic, {}))}
            # the way out a refusal names (krishiv skip-offsets --pipeline ...) names the topic too
            own["pipeline"] = f"{options.get('pipeline', '<pipeline>')} --topic {topic}"
            if identity.get(topic) is not None:
                own["expectedIdentity"] = json.dumps(identity[topic])
            if topic in recorded:
                own["recorded"] = recorded[topic]
            if i < len(self.layout.topics):
                own["decoding"] = self.layout.decodings[i].to_option()
            self.readers[topic] = KafkaStreamReader(own, clients)
        self._discovered_at = time.monotonic()
        self._absent: set[str] = set()  # topics without partitions at the last plan: not there yet
        self.max_records = int(options.get("maxRecordsPerBatch", "0"))
        self.catch_up_records = int(options.get("catchUpRecordsPerBatch", "0"))
        self.records_per_split = max(1, int(options.get("recordsPerSplit", "250000")))

    def initialOffset(self) -> dict:
        """Each topic's pinned start; a topic without one (it did not exist when the query began) its low
        watermarks, or no partitions while it does not exist."""
        return {
            t: r.initialOffset() if r.starting else self._unless_missing(r.admin.earliest)
            for t, r in self.readers.items()
        }

    @staticmethod
    def _unless_missing(call: Callable[[], Offsets]) -> Offsets:
        """``call()`` for a topic the query has not read yet, asked once, or no partitions when the topic does not
        exist yet (Debezium makes a table's topic with its first event): it is read once it does."""
        try:
            return call()
        except TopicMissing:
            return {}

    def prepareForTriggerAvailableNow(self) -> None:
        for r in self.readers.values():
            r.prepareForTriggerAvailableNow()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records) if self.max_records > 0 else ReadAllAvailable()

    def _discover(self) -> None:
        """Every ``discovery_interval_s``, the broker's topics: :class:`TopicsAppeared` when the pattern matches one
        the query does not read (before a batch is planned, so nothing of it is staged)."""
        pattern = self.layout.topic_pattern
        if pattern is None or time.monotonic() - self._discovered_at < self.layout.discovery_interval_s:
            return
        first = next(iter(self.readers.values()))
        names = first._retrying(first.admin.topic_names)
        self._discovered_at = time.monotonic()
        exclude = [*self.layout.all_topics]
        new = matching(re.compile(pattern), names, exclude)
        if new:
            raise TopicsAppeared(
                f"topics {', '.join(new)} now match topic_pattern {pattern!r}: the query stops "
                "before its next batch, to start again with their tables"
            )

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """Each topic's end, planned by its own reader (every check made), then one read limit shared by all."""
        self._discover()
        begins: TopicOffsets = {}
        ends: TopicOffsets = {}
        recorded = False
        for topic, r in self.readers.items():
            # a topic the checkpoint has not seen starts empty: each partition at its low watermark
            seen = {str(p): int(o) for p, o in start.get(topic, {}).items()}
            begin = r._with_skips(seen, planning=True)
            if seen:
                end, was_recorded = r._retrying(lambda r=r, begin=begin: r.plan_end(begin))
            else:
                end, was_recorded = self._unless_missing(lambda r=r: r.plan_end({})[0]), False
            begins[topic], ends[topic] = begin, end
            recorded = recorded or was_recorded
        self._absent = {t for t, end in ends.items() if not end}
        if recorded or not isinstance(limit, ReadMaxRows):
            return ends
        flat_begin, flat_end = _flat(begins), _flat(ends)
        backlog = sum(max(0, e - flat_begin[k]) for k, e in flat_end.items() if k in flat_begin)
        rows = batch_rows(backlog, limit.max_rows, self.catch_up_records)
        capped = _nested(cap_offsets(flat_begin, flat_end, rows, _order))
        return {t: capped.get(t, {}) for t in ends}

    def reportLatestOffset(self) -> dict | None:
        """Each topic's latest offsets, for Spark's progress; none for a topic the last plan did not find (one that
        does not exist yet is not waited for, as its reader would wait for a topic it reads)."""
        return {t: {} if t in self._absent else r.reportLatestOffset() for t, r in self.readers.items()}

    def partitions(self, start: dict, end: dict) -> list[KafkaSplit]:
        ranges: list[KafkaRange] = []
        for topic, stop in end.items():
            if not stop:
                continue
            splits = self.readers[topic].partitions(start.get(topic, {}), stop)
            ranges += [r for split in splits for r in split.ranges]
        return pack_ranges(ranges, min(self.records_per_split, TASK_PACK_RECORDS))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Each topic's ranges of the split read by that topic's reader (its identity checked before and after),
        in the layout of every topic."""
        assert isinstance(partition, KafkaSplit)
        by_topic: dict[str, list[KafkaRange]] = {}
        for r in partition.ranges:
            by_topic.setdefault(r.topic, []).append(r)
        for topic, ranges in by_topic.items():
            for batch in self.readers[topic].read(KafkaSplit(ranges)):
                yield self.layout.union(topic, batch)

    def commit(self, end: dict) -> None:
        """Nothing to do: Spark's checkpoint and the outbox ledger own the consumed offsets."""

    def stop(self) -> None:
        for r in self.readers.values():
            r.stop()


class TopicsDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return TopicsLayout.from_option(self.options["layout"]).spark_schema()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TopicsStreamReader(self.options)
