"""What the gauges show, read from the ledger and the broker by a thread every few seconds, handed to collections.

A collection (a Prometheus scrape, an OTLP export) calls every gauge; all of them read the last :class:`Readings`,
which a thread of its own takes every ``refresh_s``, so a scrape never waits on the ledger's lock or a broker that
does not answer. A reading is, per pipeline, one aggregate read of each table's summary (the first table's with
its offsets per partition) and one watermark query per topic. The reads go through the process's own
:class:`~outbox.ledger.Ledger`, whose per-file lock serialises them with the stager's writes; each is one short
read-only transaction, as every ledger read is. A ledger or broker that fails a reading keeps the last values (or,
for the lag, none) and is logged once, until it answers again.

Freshness is ``now`` minus the newest event time the table received in its newest committed batch with rows:
for a windowed table the watermark that batch moved to plus the delay (the latest event time the batch had
seen: the watermark is the latest event time less the delay), for an events or upsert table the maximum of its
event-time column in that batch's staged Parquet files (their footer statistics; nothing else is read). A
table's value is kept in memory, so a file is read once per committed batch. A rejects table has no event time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from krishiv_core.entries import DATA
from krishiv_core.errors import KrishivError
from krishiv_core.spec import WINDOWED, KrishivSpec, PipelineSpec
from outbox.ledger import Ledger

log = logging.getLogger(__name__)

#: Per partition, the topic's high watermark: ``latest(topic)``; raises a KrishivError if the broker does not answer.
LatestOffsets = Callable[[str], Mapping[str, int]]
#: The newest value of a timestamp column in staged Parquet files: ``newest(paths, column)``.
NewestInFiles = Callable[[Sequence[str], str], datetime | None]


@dataclass(frozen=True)
class PartitionReading:
    pipeline: str
    topic: str
    partition: str
    latest: int  # the broker's high watermark
    staged: int  # end offset of the newest staged batch
    committed: int  # end offset of the newest committed batch

    @property
    def consumer_lag(self) -> int:
        return max(0, self.latest - self.staged)

    @property
    def commit_lag(self) -> int:
        return max(0, self.latest - self.committed)


@dataclass(frozen=True)
class TableReading:
    pipeline: str
    table: str  # qualified, as the ledger names it
    pending: int
    committed: int
    newest_event: datetime | None  # the newest event time the table received (None: unknown, or a rejects table)


@dataclass(frozen=True)
class Readings:
    partitions: list[PartitionReading] = field(default_factory=list)
    tables: list[TableReading] = field(default_factory=list)


def _event_time_column(pipeline: PipelineSpec) -> str | None:
    """The column of an events or upsert table that holds the event time (None if the pipeline has none)."""
    return None if pipeline.kind == WINDOWED else pipeline.event_time_field


class LedgerReader:
    """Takes :class:`Readings` of the pipelines every ``refresh_s`` in a thread of its own, so that a collection
    (a scrape, an export) only hands out the last one and never waits on the ledger's lock or the broker."""

    def __init__(
        self,
        spec: KrishivSpec,
        pipelines: Sequence[PipelineSpec],
        ledger: Ledger,
        latest: LatestOffsets,
        newest_in_files: NewestInFiles,
        refresh_s: float,
    ) -> None:
        from krishiv_core.catalog import qualified

        self.spec, self.pipelines, self.ledger = spec, list(pipelines), ledger
        self._latest, self._newest_in_files, self.refresh_s = latest, newest_in_files, refresh_s
        self._tables = {p.name: [qualified(spec, t) for t in p.all_tables] for p in self.pipelines}
        self._lock = threading.Lock()  # one reading at a time
        self._readings: Readings | None = None
        self._newest: dict[tuple[str, str], tuple[tuple[str, int], datetime | None]] = {}
        self._failing: set[str] = set()  # what failed at the last reading, so a lasting outage is logged once
        self._failing_now: set[str] = set()
        self._broken: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def readings(self) -> Readings:
        """The last readings (the first call takes one)."""
        readings = self._readings
        return readings if readings is not None else self.refresh()

    def refresh(self) -> Readings:
        """Read the ledger and the broker now."""
        with self._lock:
            self._readings = self._take()
            return self._readings

    def start(self) -> None:
        """Refresh every ``refresh_s`` until :meth:`stop`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="krishiv-metrics", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
                self._broken = None
            except Exception as exc:  # the pipeline runs on without new readings; said once until one works
                if self._broken != type(exc).__name__:
                    log.warning("metrics: reading the ledger and the broker failed: %s", exc)
                self._broken = type(exc).__name__
            self._stop.wait(self.refresh_s)

    # ------------------------------------------------------------------------------------ one reading

    def _take(self) -> Readings:
        partitions: list[PartitionReading] = []
        tables: list[TableReading] = []
        latest_by_topic: dict[str, Mapping[str, int] | None] = {}
        self._failing_now = set()
        for p in self.pipelines:
            names = self._tables[p.name]
            try:
                summaries = [self.ledger.table_summary(names[0], pipeline=p.name, topic=p.topic)]
                summaries += [self.ledger.table_summary(t, pipeline=p.name) for t in names[1:]]
            except KrishivError as exc:  # a ledger held past its lock timeout: keep the last values of these
                self._warn(f"ledger:{p.name}", f"metrics of {p.name}: ledger not read ({exc})")
                last = self._readings or Readings()
                partitions += [r for r in last.partitions if r.pipeline == p.name]
                tables += [r for r in last.tables if r.pipeline == p.name]
                continue
            for s in summaries:
                tables.append(TableReading(p.name, s.table, s.pending, s.committed, self._newest_event(p, s.table)))
            for topic in p.topics:
                if topic not in latest_by_topic:
                    try:
                        latest_by_topic[topic] = self._latest(topic)
                    except KrishivError as exc:  # no lag without the broker; the ledger's values still go out
                        self._warn(f"broker:{topic}", f"metrics: consumer lag of {topic} not read ({exc})")
                        latest_by_topic[topic] = None
                latest = latest_by_topic[topic]
                if latest is None:
                    continue
                # the first table's entries carry every topic's offsets (a pipeline over several: one read each)
                of_topic = summaries[0] if topic == p.topic else self.ledger.table_summary(names[0], topic=topic)
                staged, committed = of_topic.staged_offsets, of_topic.committed_offsets
                for part in sorted(latest, key=int):  # a partition the ledger has not read yet lags by all it holds
                    end, done = staged.get(part, 0), committed.get(part, 0)
                    partitions.append(PartitionReading(p.name, topic, part, latest[part], end, done))
        self._failing = self._failing_now
        return Readings(partitions, tables)

    def _warn(self, key: str, message: str) -> None:
        self._failing_now.add(key)
        if key not in self._failing:
            log.warning("%s", message)

    def _newest_event(self, pipeline: PipelineSpec, table: str) -> datetime | None:
        """The newest event time ``table`` received, from its newest committed batch with rows (kept per batch)."""
        column = _event_time_column(pipeline)
        if table == self._tables[pipeline.name][-1] or (pipeline.kind != WINDOWED and column is None):
            return None  # the rejects table; an events or upsert pipeline without an event time field
        key = (pipeline.name, table)
        newest: tuple[str, int] | None = None
        for query_id in reversed(self.ledger.query_ids(pipeline.name)):  # the newest query first
            batch = self.ledger.last_committed_batch(query_id, table)
            if batch is not None:
                newest = (query_id, batch)
                break
        if newest is None:
            return None
        known = self._newest.get(key)
        if known is not None and known[0] == newest:
            return known[1]
        entry = self.ledger.get(newest[0], table, newest[1])
        value = known[1] if known is not None else None
        if entry is not None:
            if pipeline.kind == WINDOWED:
                watermark_ms = int(entry.metrics.get("watermark_ms") or 0)
                if watermark_ms > 0:
                    value = datetime.fromtimestamp(0, UTC) + timedelta(
                        milliseconds=watermark_ms + pipeline.watermark_delay_ms
                    )
            else:
                assert column is not None
                paths = [f.path for f in entry.files if f.content == DATA and f.records]
                try:
                    found = self._newest_in_files(paths, column) if paths else None
                except Exception as exc:  # storage unreachable: keep the value known, say so once
                    self._warn(f"files:{table}", f"metrics: freshness of {table} not read ({exc})")
                    found = None
                value = found if found is not None else value
        self._newest[key] = (newest, value)
        return value


def newest_in_parquet(io: Any) -> NewestInFiles:
    """Reads the maximum of a timestamp column from the footers of Parquet files through a pyiceberg FileIO."""
    import pyarrow.parquet as pq

    def newest(paths: Sequence[str], column: str) -> datetime | None:
        best: datetime | None = None
        for path in paths:
            with io.new_input(path).open() as stream:
                metadata = pq.ParquetFile(stream).metadata
            names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
            if column not in names:
                continue
            index = names.index(column)
            for rg in range(metadata.num_row_groups):
                stats = metadata.row_group(rg).column(index).statistics
                if stats is None or not stats.has_min_max or not isinstance(stats.max, datetime):
                    continue
                value = stats.max if stats.max.tzinfo else stats.max.replace(tzinfo=UTC)
                best = value if best is None or value > best else best
        return best

    return newest
