"""Phase 1 of the outbox: each micro-batch's output becomes staged Parquet files plus ledger entries.

For batch N of a query (``foreachBatch``):

1. Read N's offsets from the Spark checkpoint (written before the batch ran), with the operator's skips.
2. If the ledger already has N (its rejects entry, which every batch records), it is a replay: check it read the
   same offsets, let a stateful shape carry its state through N (the windowed kind's open windows must exist
   after N for N+1), write again the files of PENDING entries that are gone (``krishiv restage``), and stop. A
   table added to the pipeline since N was staged (a new route) gets nothing from N: its rows are elsewhere.
3. Otherwise run the pipeline's shape over the batch: a :class:`BatchResult` with, per table, rows the driver
   stages (window aggregates, rejects: small) or files the Spark tasks already wrote (raw events, upserts:
   ``spark_jobs.task_writer``, so those rows never reach the driver). The shape splits the rejects off in the
   job that computes its rows where it can (windows, raw events: one Spark job, Kafka read once, nothing cached;
   each Spark job over a batch costs about 0.1-0.2 s however small the batch); the upsert kind caches the batch
   and reads its rejects apart (:func:`rejects_apart`). Staged files go under a per-query, per-batch folder of
   each table's staging root, beside the table's location and outside it (where no standard orphan-file removal
   looks), with fresh file names (a retry never overwrites a file an earlier attempt may have published), one
   file per partition value.
4. Record one entry per table, with its commit operation (``krishiv_core.tables.output_tables``: append, or
   merge on key columns) and the intended snapshot id, in one ledger transaction. If another attempt recorded
   N first, its entries win and this attempt's files are removed (nothing references them).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from krishiv_core.entries import PENDING, OffsetSkip, OutboxEntry, StagedFile, new_snapshot_id
from krishiv_core.errors import BatchReplayMismatch, KrishivError, SchemaConflict, StagerLeaseLost
from krishiv_core.evolution import SchemaChange, evolve_schema, holds_schema, holds_schema_of, planned_schema
from krishiv_core.faults import fault_point
from krishiv_core.parquet_files import write_staged_files
from krishiv_core.reject_rate import DEFAULT_REJECT_RATE_WARN, CommonReason, RejectRate, most_common_reason
from krishiv_core.runbook import runbook
from krishiv_core.spec import WINDOWED, PipelineSpec
from krishiv_core.staging_paths import staging_root_of
from krishiv_core.tables import REJECT_COLUMNS, OutputTable
from spark_jobs.checkpoint import BatchOffsets, Checkpoint
from spark_jobs.ports import StagerLeaseHandle, StagingLedger, apply_skips, apply_topic_skips

log = logging.getLogger(__name__)

QUERY_REJECT_COLUMNS = tuple(c for c in REJECT_COLUMNS if c != "batch_id")  # the sink adds the batch id


@dataclass(frozen=True)
class Target:
    """A table the pipeline writes, as phase 1 stages it: its qualified name, layout and loaded table.

    ``planned``: the schema the batches are staged for, when the spec changes the table's schema: the table's
    schema after that change (``krishiv_core.evolution.planned_schema``, with the field ids it assigns), which the
    first batch staged applies to the table (:meth:`BatchStager._apply_schemas`) together with ``properties``.
    """

    name: str  # namespace.table, as the ledger and the relay name it
    output: OutputTable
    table: Table
    planned: Schema | None = None
    properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def schema(self) -> Schema:
        """The schema the batches are staged for."""
        return self.planned if self.planned is not None else self.table.schema()


@dataclass
class BatchResult:
    """What a shape computed from one batch, by (unqualified) table name.

    ``rows`` are small enough for the driver to stage (window aggregates); ``files`` were written by the Spark
    tasks (raw events, upserts, and the raw events' rejects). ``rejects``: the reject rows
    (:data:`QUERY_REJECT_COLUMNS`) the driver stages, unless the tasks wrote them. ``late``: a windowed batch's late
    events, in the same columns, staged into the rejects table beside the rejects (their reason starts ``late:``) and
    counted apart. ``metrics`` go to the entry of the pipeline's first table.
    """

    records: int  # valid events read, late ones included
    rows: dict[str, pa.Table] = field(default_factory=dict)
    rejects: pa.Table | None = None
    files: dict[str, tuple[StagedFile, ...]] = field(default_factory=dict)
    late: pa.Table | None = None
    metrics: dict[str, int] = field(default_factory=dict)

    @property
    def late_events(self) -> int:
        return 0 if self.late is None else self.late.num_rows

    def row_count(self, table: str) -> int:
        if table in self.rows:
            return self.rows[table].num_rows
        return sum(f.records for f in self.files.get(table, ()))


class BatchShape(Protocol):
    """How a pipeline kind turns a batch into table output and rejects (``spark_jobs.windowed``, ``.events``,
    ``.upserts``)."""

    #: Whether the shape carries state from batch to batch, so it must run on a replay too.
    stateful: bool

    def compute(self, batch: DataFrame, offsets: BatchOffsets, folder: Callable[[Target], str]) -> BatchResult:
        """``batch``: the batch's rows, rejects (a ``reason``) included. ``folder``: where a table's files go."""
        ...


def rejects_apart(batch: DataFrame, compute: Callable[[DataFrame], BatchResult]) -> BatchResult:
    """``compute`` over the batch's valid rows, with its rejects read apart: two Spark jobs over the batch cached
    (Kafka is read once), for a shape that cannot split them off in its own job."""
    batch.persist()
    try:
        rejects = batch.where(F.col("reason").isNotNull()).select(*QUERY_REJECT_COLUMNS).toArrow()
        result = compute(batch.where(F.col("reason").isNull()))
    finally:
        batch.unpersist()
    return replace(result, rejects=rejects)


@dataclass(frozen=True)
class StagedBatch:
    """What one call of the sink did, for progress reports and tests."""

    batch_id: int
    records_read: int
    rows: int  # rows staged for the pipeline's tables (windows, events or upserted keys), rejects aside
    rejects: int
    late_events: int
    recorded: bool
    kind: str = WINDOWED
    #: When the batch's rejects are alarming (``krishiv_core.reject_rate``): the reason most of them gave.
    common_reason: CommonReason | None = None


def staging_root(table: Table) -> str:
    """Where a table's batches are staged: ``<parent of the table location>/_krishiv_staging/<table folder>``.

    The location may be a path or a URI (``file://``, ``s3://bucket/…``); a table at the very root of a bucket has
    no folder beside it (outside it) to stage in, and is refused.
    """
    root = staging_root_of(table.location())
    if root is None:
        location = table.location().rstrip("/")
        raise KrishivError(
            f"table {'.'.join(table.name())} is at the root of {location}: staged files go beside a table's "
            "location, outside it, so the table needs a location in a folder (such as "
            "s3://bucket/warehouse/namespace/table)"
        )
    return root


def staging_folder(table: Table, query_id: str, batch_id: int) -> str:
    return f"{staging_root(table)}/query={query_id}/batch={batch_id:012d}"


def write_parquet(table: Table, rows: pa.Table, folder: str, schema: Schema | None = None) -> tuple[StagedFile, ...]:
    """Write ``rows`` (cast to ``schema``, by default the table's, with Iceberg field ids) as new Parquet files, one
    per partition."""
    return write_staged_files(table.io, schema or table.schema(), table.spec(), rows, folder)


class BatchStager:
    """The ``foreachBatch`` function of one pipeline's query."""

    def __init__(
        self,
        pipeline: PipelineSpec,
        ledger: StagingLedger,
        checkpoint: Checkpoint,
        targets: Sequence[Target],
        shape: BatchShape,
        on_batch: Callable[[StagedBatch], None] | None = None,
        lease: StagerLeaseHandle | None = None,
        reject_rate_warn: float = DEFAULT_REJECT_RATE_WARN,
    ) -> None:
        self.pipeline = pipeline
        self.ledger = ledger
        self.checkpoint = checkpoint
        self.targets = list(targets)
        self.rows_targets = [t for t in self.targets if not t.output.rejects]
        self.rejects_target = next(t for t in self.targets if t.output.rejects)
        self.shape = shape
        self.history: list[StagedBatch] = []
        self.on_batch = on_batch
        self.lease = lease
        self.reject_rate_warn = reject_rate_warn
        self._query_id: str | None = None
        self._skips: list[OffsetSkip] | None = None
        self.called = threading.Event()  # set when Spark first hands the sink a batch: its source is up
        #: What the last call raised, as raised (Spark hands the query's owner only its text).
        self.failure: BaseException | None = None
        self._schemas_applied = False
        #: The last batch the ledger held for the query when this stager first looked (-1: none).
        self._last_recorded: int | None = None

    @property
    def query_id(self) -> str:
        if self._query_id is None:
            self._query_id = self.checkpoint.query_id()
        return self._query_id

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.called.set()
        try:
            self._stage_batch(batch, batch_id)
        except BaseException as exc:
            self.failure = exc
            raise

    def _stage_batch(self, batch: DataFrame, batch_id: int) -> None:
        fault_point("stage.begin", batch_id)
        if self.lease is not None:
            self.lease.ensure_held()  # a stager that lost its lease stops before staging another batch
        offsets = self._offsets(batch_id)
        recorded = self._recorded(batch_id)
        # Every batch records a rejects entry, so that entry marks a replay. A table the pipeline did not write when
        # the batch was staged (a route added since) gets nothing from its replay: its rows are in other tables.
        replay = self.rejects_target.name in recorded
        missing = [t for t in self.targets if t.name in recorded and self._files_gone(recorded[t.name], t)]
        if replay:
            self._check_same_offsets(list(recorded.values()), offsets)
            if self.lease is not None:  # no ledger write fences a replay: the run that took over may have recorded it
                self.lease.check_ledger()
            if not (self.shape.stateful or missing):
                self._done(StagedBatch(batch_id, 0, 0, 0, 0, False, self.pipeline.kind))
                return

        result = self.shape.compute(batch, offsets, lambda t: staging_folder(t.table, self.query_id, batch_id))
        rejects_name = self.rejects_target.output.name
        if result.rejects is not None:
            result.rows[rejects_name] = self._reject_rows(result.rejects, batch_id)
        rejects = result.row_count(rejects_name)  # malformed: the late events join their table below
        alarming = RejectRate(result.records + rejects, rejects).alarming(self.reject_rate_warn)
        common = most_common_reason(self._reasons(result)) if alarming else None
        if result.late_events:
            assert result.late is not None and rejects_name not in result.files  # the driver stages a windowed batch
            kept = [result.rows[rejects_name]] if rejects_name in result.rows else []
            result.rows[rejects_name] = pa.concat_tables([*kept, self._reject_rows(result.late, batch_id)])
        fault_point("stage.after_compute", batch_id)
        staged = StagedBatch(
            batch_id,
            result.records + rejects,
            sum(result.row_count(t.output.name) for t in self.rows_targets),
            rejects,
            result.late_events,
            False,
            self.pipeline.kind,
            common,
        )

        if replay:
            self._restage(recorded, missing, result, batch_id)
            self._done(staged)
            return

        files = {t.name: self._stage(t, result, batch_id) for t in self.targets}
        fault_point("stage.after_files", batch_id)
        try:
            changing = self._schemas_to_record(batch_id)
        except BaseException:
            for t in self.targets:  # nothing references them
                for f in files[t.name]:
                    t.table.io.delete(f.path)
            raise
        ranges = offsets.topic_ranges(self.pipeline.topic)
        first = self.rows_targets[0].name
        # the topic id the source checked it read (a source over several topics has one each: none is recorded)
        topic_id = None if offsets.by_topic else (self.checkpoint.source_identity() or {}).get("topic_id")
        entries = [
            OutboxEntry(
                self.query_id,
                self.pipeline.name,
                t.name,
                batch_id,
                ranges,
                files[t.name],
                new_snapshot_id(),
                self._metrics(t, first, staged, result),
                operation=t.output.operation,
                schema_id=t.schema.schema_id,  # the schema the files were staged for
                topic_id=topic_id,
                schema_change=changing.get(t.name),
            )
            for t in self.targets
        ]
        try:
            inserted = self.ledger.record_batch(entries, lease=self.lease.lease if self.lease else None)
        except StagerLeaseLost:
            self._remove_files(entries, [False] * len(entries))  # another stager owns the query now
            raise
        self._last_recorded = max(self._last_recorded or -1, batch_id)  # asked again if Spark runs it again
        self._remove_files(entries, inserted)
        fault_point("stage.after_ledger", batch_id)
        self._apply_schemas(batch_id)  # recorded: the batch needs the schema (the relay applies it if this dies first)
        self._done(replace(staged, recorded=any(inserted)))

    # ------------------------------------------------------------------------------------ steps

    def _recorded(self, batch_id: int) -> dict[str, OutboxEntry]:
        """The batch's entries the ledger holds, by table. A batch past the last one the ledger held for the query
        when this stager started is asked about no more: nobody else records the query's batches while it runs (a
        stager that took its lease over fences its writes, and without a lease a batch recorded by another attempt
        meanwhile still wins when this one records it), so it saves a ledger read per batch."""
        if self._last_recorded is None:
            self._last_recorded = self.ledger.last_batch_id(self.query_id, self.rejects_target.name)
        if batch_id > self._last_recorded:
            return {}
        return self.ledger.batch(self.query_id, batch_id)

    def _schemas_to_record(self, batch_id: int) -> dict[str, str]:
        """Before the first batch of a run is recorded: per table whose schema does not hold the one the batches are
        staged for, the :class:`SchemaChange` (JSON) its entry records, after checking that the plan still stands:
        planned again on the table as it is now, it gives the same columns. Another writer's change since the start
        refuses the batch here, with nothing recorded (its files are removed), and the next run plans again."""
        if self._schemas_applied:
            return {}
        changing = {}
        for target in self.rows_targets:
            table = target.table
            table.refresh()
            if holds_schema(table, target.schema):
                continue
            again = planned_schema(table, target.output.schema, target.name)
            if not holds_schema_of(again, target.schema):
                raise SchemaConflict(
                    f"table {target.name}'s schema was changed by another writer while pipeline "
                    f"{self.pipeline.name!r} staged batch {batch_id}; nothing was recorded: run again, and it "
                    "stages for the table's new schema " + runbook("A spec change the table cannot take")
                )
            changing[target.name] = SchemaChange(target.output.schema, target.schema, target.properties).to_json()
        return changing

    def _apply_schemas(self, batch_id: int) -> None:
        """Bring each table to the schema (and ``krishiv.*`` properties) its batches are staged for, once per run,
        right after the first batch's entries are recorded: a run that fails before that leaves its tables as they
        were, and one that dies after it leaves the schema to the relay, which brings the table to the entry's
        schema before committing the batch (:func:`krishiv_core.evolution.bring_to_staged_schema`).

        The files were written with the planned schema's field ids; if the table's schema came out otherwise (another
        writer changed it in the instant since :meth:`_schemas_to_record` checked), the run stops naming it, and the
        relay refuses the batch until the table's column is back as it was.
        """
        if self._schemas_applied:
            return
        for target in self.rows_targets:
            table = target.table
            for attempt in range(5):
                try:
                    table.refresh()
                    evolve_schema(table, target.output.schema, target.name, target.properties)
                    break
                except CommitFailedException:
                    if attempt == 4:
                        raise
            if not holds_schema(table, target.schema):
                raise SchemaConflict(
                    f"table {target.name}'s schema was changed by another writer while pipeline "
                    f"{self.pipeline.name!r} staged batch {batch_id}: the batch is recorded for the schema it was "
                    "staged for and stays pending until the table's columns are back as they were "
                    + runbook("A spec change the table cannot take")
                )
        self._schemas_applied = True

    def _offsets(self, batch_id: int) -> BatchOffsets:
        """The batch's offsets from the checkpoint, with the operator's skips the source applied to it.

        The source applies a skip to the batch starting at its stuck offset (:func:`spark_jobs.ports.apply_skips`);
        the stager decides the same from the same offsets and records in the ledger which batch applied it, before
        the batch's entries, so a replay reads the same offsets. Skips are recorded only while no query runs, so
        they are re-read only while one is still unapplied.
        """
        offsets = self.checkpoint.batch(batch_id)
        if self._skips is None or any(s.applied_batch_id is None for s in self._skips):
            self._skips = self.ledger.skips(self.query_id, None if self.pipeline.members else self.pipeline.topic)
        if not self._skips:
            return offsets
        start, after = (
            apply_topic_skips(self._skips, offsets.start, batch_id)
            if offsets.by_topic
            else apply_skips(self._skips, offsets.start, batch_id)
        )
        for before, skip in zip(self._skips, after, strict=True):
            if before.applied_batch_id is None and skip.applied_batch_id is not None:
                self.ledger.mark_skip_applied(before, batch_id, lease=self.lease.lease if self.lease else None)
        self._skips = after
        return replace(offsets, start=start) if start != offsets.start else offsets

    def _metrics(self, target: Target, first: str, staged: StagedBatch, result: BatchResult) -> dict[str, int]:
        """The batch's counts go with its first table's entry; every other entry counts its own rows."""
        if target.output.rejects:
            return {"rejects": staged.rejects}
        rows = result.row_count(target.output.name)
        if target.name != first:
            return {"rows": rows}
        metrics = {"records_read": staged.records_read, "rejects": staged.rejects, "late_events": staged.late_events}
        return {**metrics, **result.metrics, ("windows" if self.pipeline.kind == WINDOWED else "rows"): rows}

    def _reasons(self, result: BatchResult) -> list[str | None]:
        """The reasons of the batch's rejects: from the rows the driver stages, or read back from the files the Spark
        tasks wrote (the ``reason`` column only; asked only of a batch whose rejects are alarming)."""
        name, io = self.rejects_target.output.name, self.rejects_target.table.io
        if name in result.rows:
            return result.rows[name].column("reason").to_pylist()
        reasons: list[str | None] = []
        for f in result.files.get(name, ()):
            with io.new_input(f.path).open() as stream:
                reasons += pq.read_table(stream, columns=["reason"]).column("reason").to_pylist()
        return reasons

    def _reject_rows(self, rejects: pa.Table, batch_id: int) -> pa.Table:
        rejects = rejects.append_column("batch_id", pa.array([batch_id] * rejects.num_rows, pa.int64()))
        return rejects.select(list(REJECT_COLUMNS))

    def _stage(self, target: Target, result: BatchResult, batch_id: int) -> tuple[StagedFile, ...]:
        name = target.output.name
        if name in result.files:
            return result.files[name]
        rows = result.rows.get(name)
        if rows is None or rows.num_rows == 0:
            return ()
        return write_parquet(target.table, rows, staging_folder(target.table, self.query_id, batch_id), target.schema)

    @staticmethod
    def _files_gone(entry: OutboxEntry, target: Target) -> bool:
        return entry.status == PENDING and not all(target.table.io.new_input(f.path).exists() for f in entry.files)

    def _restage(
        self, recorded: dict[str, OutboxEntry], missing: list[Target], result: BatchResult, batch_id: int
    ) -> None:
        """Write again the files of a replayed batch's PENDING entries that are gone (``krishiv restage``).

        The replay computes the same rows from the same offsets and state, so the entry keeps its offsets and
        intended snapshot id and only its file list changes; a COMMITTED entry is never touched. Files the tasks
        wrote for the tables whose entries are whole are removed again. The new files are staged with this run's
        schema, so the tables get it first (a later schema only adds, widens or relaxes the entry's columns).
        """
        if missing:
            self._apply_schemas(batch_id)
        for target in self.targets:
            if target not in missing:  # whole, or not the batch's: the files the tasks wrote for it go again
                for f in result.files.get(target.output.name, ()):
                    target.table.io.delete(f.path)
                continue
            entry = recorded[target.name]
            files = self._stage(target, result, batch_id)
            if sum(f.records for f in files) != sum(f.records for f in entry.files):
                raise BatchReplayMismatch(
                    f"batch {batch_id} of query {self.query_id} staged {sum(f.records for f in entry.files)} rows for "
                    f"{target.name}, but its replay computes {sum(f.records for f in files)}; the checkpoint's state "
                    f"does not match {runbook('A checkpoint that does not match its ledger')}"
                )
            if not self.ledger.replace_files(entry, files):
                for f in files:
                    target.table.io.delete(f.path)
            else:
                log.warning(
                    "batch %s: staged %s file(s) again for %s (its files were gone)", batch_id, len(files), target.name
                )

    def _remove_files(self, entries: list[OutboxEntry], inserted: list[bool]) -> None:
        """Delete the files of entries that were not recorded: another attempt's entry, or none, won."""
        tables = {t.name: t.table for t in self.targets}
        for entry, new in zip(entries, inserted, strict=True):
            if not new:
                for f in entry.files:
                    tables[entry.table].io.delete(f.path)

    def _check_same_offsets(self, existing: list[Any], offsets: BatchOffsets) -> None:
        ranges = offsets.topic_ranges(self.pipeline.topic)
        for entry in existing:
            if entry.offsets != ranges:
                raise BatchReplayMismatch(
                    f"batch {offsets.batch_id} of query {self.query_id} was recorded for {entry.table} with offsets "
                    f"{entry.offsets} but Spark replays it with {ranges}; the checkpoint does not match the ledger "
                    + runbook("A checkpoint that does not match its ledger")
                )

    def _done(self, staged: StagedBatch) -> None:
        self.history.append(staged)
        if self.on_batch is not None:
            self.on_batch(staged)
        log.info(
            "batch %s: %s records, %s rows, %s rejects, %s late, %s",
            staged.batch_id,
            staged.records_read,
            staged.rows,
            staged.rejects,
            staged.late_events,
            "staged" if staged.recorded else "replayed",
        )
