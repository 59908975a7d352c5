"""Phase 1 of the outbox: each micro-batch's output becomes staged Parquet files plus ledger entries.

For batch N of a query (``foreachBatch``):

1. Read N's offsets from the Spark checkpoint (written before the batch ran).
2. Run the batch once (cached, so Kafka is read once): rejects, the events that are late (their window
   was closed by the watermark the batch before left), the other valid events' partial aggregates per
   window, and the batch's latest event time. Merge the partials into the open windows after N-1, move
   the watermark, close every window it has passed, and save the still-open ones with the watermark as
   the state after N (``spark_jobs.window_state``). This runs even on replay, so the state after N is
   always there for N+1.
3. If the ledger already has N for both tables, stop: a replay changes nothing.
4. Write windows and rejects as Parquet under a per-query, per-batch folder of each table's staging root,
   beside the table's location and outside it (where no standard orphan-file removal looks), with fresh
   file names (a retry never overwrites a file an earlier attempt may have published).
5. Record one entry per table, with the intended snapshot id, in one ledger transaction. If another
   attempt recorded N first, its entry wins and this attempt's files are removed (nothing references them).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import Table
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from krishiv_core.entries import PENDING, OffsetSkip, OutboxEntry, StagedFile, new_snapshot_id
from krishiv_core.errors import BatchReplayMismatch, StagerLeaseLost
from krishiv_core.faults import fault_point
from krishiv_core.spec import PipelineSpec
from krishiv_core.tables import REJECT_COLUMNS, WINDOW_END, WINDOW_START
from spark_jobs.checkpoint import BatchOffsets, Checkpoint
from spark_jobs.ports import StagerLeaseHandle, StagingLedger, apply_skips
from spark_jobs.transform import EVENT_TIME, tumbling_window
from spark_jobs.window_state import (
    WindowState,
    WindowStateStore,
    advance,
    close,
    final_values,
    merge,
    partial_columns,
)

log = logging.getLogger(__name__)

#: Staged files live beside the table's location, never inside it: Iceberg's standard orphan-file removal
#: (``RemoveOrphanFiles``, Spark's ``remove_orphan_files``) lists the table location and deletes what no snapshot
#: references, which is every file of a PENDING entry. The relay registers the files where they are.
STAGING_DIR = "_krishiv_staging"
QUERY_REJECT_COLUMNS = tuple(c for c in REJECT_COLUMNS if c != "batch_id")  # the sink adds the batch id


@dataclass(frozen=True)
class BatchOutput:
    """What one batch computes: the windows it closes, its rejects, and its counts and watermarks."""

    windows: pa.Table
    rejects: pa.Table
    records: int  # Kafka records in the batch (offsets of aborted transactions or compaction hold none)
    late_events: int
    watermark_ms: int  # after this batch: windows ending at or before it are closed
    late_watermark_ms: int  # after the batch before: this batch's events in windows ending at or before it are late

    def staged(self, batch_id: int, recorded: bool) -> StagedBatch:
        return StagedBatch(
            batch_id, self.records, self.windows.num_rows, self.rejects.num_rows, self.late_events, recorded
        )


@dataclass(frozen=True)
class StagedBatch:
    """What one call of the sink did, for progress reports and tests."""

    batch_id: int
    records_read: int
    windows: int
    rejects: int
    late_events: int
    recorded: bool


def staging_root(table: Table) -> str:
    """Where a table's batches are staged: ``<parent of the table location>/_krishiv_staging/<table folder>``."""
    parent, _, name = table.location().rstrip("/").rpartition("/")
    return f"{parent}/{STAGING_DIR}/{name}"


def staging_folder(table: Table, query_id: str, batch_id: int) -> str:
    return f"{staging_root(table)}/query={query_id}/batch={batch_id:012d}"


def write_parquet(table: Table, rows: pa.Table, folder: str) -> StagedFile:
    """Write ``rows`` (cast to the table's schema, with Iceberg field ids) as one new Parquet file."""
    target = schema_to_pyarrow(table.schema(), include_field_ids=True)
    rows = rows.select([f.name for f in target]).cast(target)
    path = f"{folder}/part-{uuid.uuid4().hex}.parquet"
    output = table.io.new_output(path)
    with output.create(overwrite=False) as stream:
        pq.write_table(rows, stream, compression="zstd")
    return StagedFile(path=path, records=rows.num_rows, bytes=len(table.io.new_input(path)))


class BatchStager:
    """The ``foreachBatch`` function of one pipeline's query."""

    def __init__(
        self,
        pipeline: PipelineSpec,
        ledger: StagingLedger,
        checkpoint: Checkpoint,
        table: Table,
        rejects_table: Table,
        table_name: str,
        rejects_table_name: str,
        on_batch: Callable[[StagedBatch], None] | None = None,
        lease: StagerLeaseHandle | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.ledger = ledger
        self.checkpoint = checkpoint
        self.table, self.rejects_table = table, rejects_table
        self.table_name, self.rejects_table_name = table_name, rejects_table_name
        self.history: list[StagedBatch] = []
        self.on_batch = on_batch
        self.window_state = WindowStateStore(checkpoint.path)
        self.lease = lease
        self._query_id: str | None = None
        self._skips: list[OffsetSkip] | None = None

    @property
    def query_id(self) -> str:
        if self._query_id is None:
            self._query_id = self.checkpoint.query_id()
        return self._query_id

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        fault_point("stage.begin", batch_id)
        if self.lease is not None:
            self.lease.ensure_held()  # a stager that lost its lease stops before staging another batch
        offsets = self._offsets(batch_id)
        out = self._compute(batch, offsets)
        fault_point("stage.after_compute", batch_id)
        rejects = out.rejects

        recorded = self.ledger.batch(self.query_id, batch_id)
        if self.table_name in recorded and self.rejects_table_name in recorded:
            self._check_same_offsets(list(recorded.values()), offsets)
            self._restage_missing(recorded, out, batch_id)
            self._done(out.staged(batch_id, False))
            return

        ranges = {self.pipeline.topic: offsets.ranges()}
        metrics = {
            "records_read": out.records,
            "windows": out.windows.num_rows,
            "rejects": rejects.num_rows,
            "late_events": out.late_events,
            "watermark_ms": out.watermark_ms,
            "late_watermark_ms": out.late_watermark_ms,
        }
        window_files = self._stage(self.table, out.windows, batch_id)
        reject_files = self._stage(self.rejects_table, self._reject_rows(rejects, batch_id), batch_id)
        fault_point("stage.after_files", batch_id)

        entries = [
            OutboxEntry(
                self.query_id,
                self.pipeline.name,
                self.table_name,
                batch_id,
                ranges,
                window_files,
                new_snapshot_id(),
                metrics,
            ),
            OutboxEntry(
                self.query_id,
                self.pipeline.name,
                self.rejects_table_name,
                batch_id,
                ranges,
                reject_files,
                new_snapshot_id(),
                {"rejects": rejects.num_rows},
            ),
        ]
        try:
            inserted = self.ledger.record_batch(entries, lease=self.lease.lease if self.lease else None)
        except StagerLeaseLost:
            inserted = [False] * len(entries)  # another stager owns the query now: nothing refers to these files
            self._remove_files(entries, inserted)
            raise
        self._remove_files(entries, inserted)
        fault_point("stage.after_ledger", batch_id)
        self._done(out.staged(batch_id, any(inserted)))

    # ------------------------------------------------------------------------------------ steps

    def _offsets(self, batch_id: int) -> BatchOffsets:
        """The batch's offsets from the checkpoint, with the operator's skips the source applied to it.

        The source applies a skip to the batch starting at its stuck offset (:func:`spark_jobs.ports.apply_skips`);
        the stager decides the same from the same offsets and records in the ledger which batch applied it, before
        the batch's entries, so a replay reads the same offsets. Skips are recorded only while no query runs, so
        they are re-read only while one is still unapplied.
        """
        offsets = self.checkpoint.batch(batch_id)
        if self._skips is None or any(s.applied_batch_id is None for s in self._skips):
            self._skips = self.ledger.skips(self.query_id, self.pipeline.topic)
        if not self._skips:
            return offsets
        start, after = apply_skips(self._skips, offsets.start, batch_id)
        for before, skip in zip(self._skips, after, strict=True):
            if before.applied_batch_id is None and skip.applied_batch_id is not None:
                self.ledger.mark_skip_applied(before, batch_id)
        self._skips = after
        return replace(offsets, start=start) if start != offsets.start else offsets

    def _reject_rows(self, rejects: pa.Table, batch_id: int) -> pa.Table:
        rejects = rejects.append_column("batch_id", pa.array([batch_id] * rejects.num_rows, pa.int64()))
        return rejects.select(list(REJECT_COLUMNS))

    def _restage_missing(self, recorded: dict[str, OutboxEntry], out: BatchOutput, batch_id: int) -> None:
        """Write again the files of a replayed batch's PENDING entries that are gone (``krishiv restage``).

        The replay computes the same rows from the same offsets and state, so the entry keeps its offsets and
        intended snapshot id and only its file list changes; a COMMITTED entry is never touched.
        """
        for name, entry in recorded.items():
            table = self.table if name == self.table_name else self.rejects_table
            if entry.status != PENDING or all(table.io.new_input(f.path).exists() for f in entry.files):
                continue
            rows = out.windows if name == self.table_name else self._reject_rows(out.rejects, batch_id)
            files = self._stage(table, rows, batch_id)
            if sum(f.records for f in files) != entry.record_count:
                raise BatchReplayMismatch(
                    f"batch {batch_id} of query {self.query_id} staged {entry.record_count} rows for {name}, but its "
                    f"replay computes {sum(f.records for f in files)}; the checkpoint's window state does not match"
                )
            if not self.ledger.replace_files(entry, files):
                for f in files:
                    table.io.delete(f.path)
            else:
                log.warning("batch %s: staged %s again for %s (its files were gone)", batch_id, len(files), name)

    def _remove_files(self, entries: list[OutboxEntry], inserted: list[bool]) -> None:
        """Delete the files of entries that were not recorded: another attempt's entry, or none, won."""
        for entry, new in zip(entries, inserted, strict=True):
            if not new:
                table = self.table if entry.table == self.table_name else self.rejects_table
                for f in entry.files:
                    table.io.delete(f.path)

    def _compute(self, batch: DataFrame, offsets: BatchOffsets) -> BatchOutput:
        """One batch's closed windows, rejects and late events, saving the windows it leaves open."""
        late_rows, window_rows, latest = "__late", "__rows", "__latest"
        before = self.window_state.load_before(offsets.batch_id)
        window = tumbling_window(self.pipeline)
        late = F.lit(False)
        if before.watermark_ms > 0:
            late = F.col("__window.end") <= F.timestamp_millis(F.lit(before.watermark_ms))
        batch.persist()
        try:
            rejects = batch.where(F.col("reason").isNotNull()).select(*QUERY_REJECT_COLUMNS).toArrow()
            groups = (
                batch.where(F.col("reason").isNull())
                .withColumn("__window", window)
                .groupBy(
                    F.col("__window.start").alias(WINDOW_START),
                    F.col("__window.end").alias(WINDOW_END),
                    late.alias(late_rows),
                )
                .agg(
                    *partial_columns(self.pipeline),
                    F.count(F.lit(1)).alias(window_rows),
                    F.max(F.unix_millis(F.col(EVENT_TIME))).alias(latest),
                )
                .toArrow()
            )
        finally:
            batch.unpersist()
        is_late = groups.column(late_rows)
        late_events = pc.sum(groups.filter(is_late).column(window_rows)).as_py() or 0
        valid_events = pc.sum(groups.column(window_rows)).as_py() or 0
        latest_ms = pc.max(groups.column(latest)).as_py()
        watermark = advance(before.watermark_ms, latest_ms, self.pipeline.watermark_delay_ms)
        partials = groups.filter(pc.invert(is_late)).drop_columns([late_rows, window_rows, latest])
        closed, still_open = close(merge(before.windows, partials, self.pipeline), watermark)
        self.window_state.save(offsets.batch_id, WindowState(still_open, watermark))
        return BatchOutput(
            final_values(closed, self.pipeline),
            rejects,
            records=rejects.num_rows + valid_events,
            late_events=late_events,
            watermark_ms=watermark,
            late_watermark_ms=before.watermark_ms,
        )

    def _stage(self, table: Table, rows: pa.Table, batch_id: int) -> tuple[StagedFile, ...]:
        if rows.num_rows == 0:
            return ()
        return (write_parquet(table, rows, staging_folder(table, self.query_id, batch_id)),)

    def _check_same_offsets(self, existing: list[Any], offsets: BatchOffsets) -> None:
        ranges = {self.pipeline.topic: offsets.ranges()}
        for entry in existing:
            if entry.offsets != ranges:
                raise BatchReplayMismatch(
                    f"batch {offsets.batch_id} of query {self.query_id} was recorded for {entry.table} with offsets "
                    f"{entry.offsets} but Spark replays it with {ranges}; the checkpoint does not match the ledger"
                )

    def _done(self, staged: StagedBatch) -> None:
        self.history.append(staged)
        if self.on_batch is not None:
            self.on_batch(staged)
        log.info(
            "batch %s: %s records, %s windows, %s rejects, %s late, %s",
            staged.batch_id,
            staged.records_read,
            staged.windows,
            staged.rejects,
            staged.late_events,
            "staged" if staged.recorded else "replayed",
        )
