"""The ``windowed`` kind: aggregates per event-time window and group-by key, closed by the watermark.

One Spark aggregation over the batch gives, per window (tumbling, or hopping: an event belongs
to every window of ``window`` length starting at a multiple of ``slide`` that holds it) and group-by key, the
partial aggregates, the rows, the latest event time, whether the window was closed by the watermark the batch
before left (its events are late: left out) and whether it is the event's last window (so each event is counted
once, whatever the number of windows it falls in: an event is late when its last window is closed). The same
job carries the batch's rejects and late events: each is a group of its own (keyed by its partition and offset,
which no other group has; a late event's in its last window) holding its rejects-table columns (a late event's
payload too), so Kafka is read once and nothing is cached. A late event becomes a row of the rejects table whose
reason names its last window and the watermark that closed it (``window_state.late_reason``): the watermark comes
from the state of the batch before, in the checkpoint, so a replay keeps the same late events.
:mod:`spark_jobs.window_state` merges the partials into the open windows and moves the watermark.

Output mode ``append`` writes a window once, when the watermark passes it. ``update`` writes, in each batch,
the current row of every window the batch's events touched (open or closing), committed as a merge on the
window and group-by key, so a dashboard sees a window before it closes; its last row equals the append row.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from krishiv_core.spec import PipelineSpec
from krishiv_core.tables import WINDOW_END, WINDOW_START, group_columns
from spark_jobs.checkpoint import BatchOffsets
from spark_jobs.staging import QUERY_REJECT_COLUMNS, BatchResult, Target
from spark_jobs.transform import EVENT_TIME
from spark_jobs.window_state import (
    WindowState,
    WindowStateStore,
    advance,
    close,
    final_values,
    late_reason,
    merge,
    mode_switch_refused,
    partial_columns,
    window_key,
)

_LATE, _LAST, _ROWS, _LATEST = "__late", "__last", "__rows", "__latest"
_REJECT, _REJECT_PARTITION, _REJECT_OFFSET = "__reject", "__reject_partition", "__reject_offset"
_IS_REJECT = "__is_reject"


def event_windows(pipeline: PipelineSpec):
    """The windows of an event, as the struct Spark's ``window`` gives (``start``, ``end``): one when tumbling,
    ``window / slide`` when hopping."""
    size = f"{pipeline.window_ms} milliseconds"
    if pipeline.slide_ms is None:
        return F.window(EVENT_TIME, size)
    return F.window(EVENT_TIME, size, f"{pipeline.slide_ms} milliseconds")


def last_window_end_ms(pipeline: PipelineSpec):
    """The end (epoch ms) of the latest window holding the event: its slide-aligned start plus the window."""
    slide = pipeline.window_slide_ms
    ms = F.unix_millis(F.col(EVENT_TIME))
    return F.floor(ms / F.lit(slide)) * F.lit(slide) + F.lit(pipeline.window_ms)


class WindowedShape:
    stateful = True  # the open windows after each batch are the next batch's start

    def __init__(self, pipeline: PipelineSpec, target: Target, store: WindowStateStore) -> None:
        self.pipeline = pipeline
        self.target = target
        self.store = store

    def compute(self, batch: DataFrame, offsets: BatchOffsets, folder: Callable[[Target], str]) -> BatchResult:
        """One batch's windows to write, its late events and rejects, and the open windows it leaves (saved as its
        state)."""
        before = self.store.load_before(offsets.batch_id)
        refused = mode_switch_refused(self.pipeline, before, str(self.store.folder))
        if refused is not None:  # checked at start too; a batch never writes open windows in the other mode
            raise refused
        windows = event_windows(self.pipeline)
        late = F.lit(False)
        if before.watermark_ms > 0:
            late = F.col("__window.end") <= F.timestamp_millis(F.lit(before.watermark_ms))
        is_last = F.unix_millis(F.col("__window.end")) == last_window_end_ms(self.pipeline)
        is_reject = F.col("reason").isNotNull()
        own = is_reject | (late & is_last)  # a reject, or a late event in its last window: a group of its own
        groups = (
            # Spark's window drops a row without a time: a reject is given the epoch, and its own group.
            batch.withColumn(EVENT_TIME, F.when(is_reject, F.timestamp_millis(F.lit(0))).otherwise(F.col(EVENT_TIME)))
            .withColumn("__window", windows)
            .groupBy(
                F.col("__window.start").alias(WINDOW_START),
                F.col("__window.end").alias(WINDOW_END),
                *[
                    F.col(path).alias(column)
                    for path, column in zip(self.pipeline.group_by, group_columns(self.pipeline), strict=True)
                ],
                late.alias(_LATE),
                is_last.alias(_LAST),
                is_reject.alias(_IS_REJECT),
                F.when(own, F.col("partition")).alias(_REJECT_PARTITION),
                F.when(own, F.col("offset")).alias(_REJECT_OFFSET),
            )
            .agg(
                *partial_columns(self.pipeline),
                F.count(F.lit(1)).alias(_ROWS),
                F.max(F.unix_millis(F.col(EVENT_TIME))).alias(_LATEST),
                F.first(F.when(own, F.struct(*QUERY_REJECT_COLUMNS)), ignorenulls=True).alias(_REJECT),
            )
            .toArrow()
        )
        rejected = groups.column(_IS_REJECT)
        # A reject falls in every window of its (epoch) time when hopping: it is taken from its last one.
        rejects = groups.filter(pc.and_(rejected, groups.column(_LAST))).column(_REJECT)
        groups = groups.filter(pc.invert(rejected))
        late_rows = _late_rows(groups.filter(pc.is_valid(groups.column(_REJECT_PARTITION))), before.watermark_ms)
        groups = groups.drop_columns([_IS_REJECT, _REJECT_PARTITION, _REJECT_OFFSET, _REJECT])
        lasts = groups.filter(groups.column(_LAST))
        valid_events = pc.sum(lasts.column(_ROWS)).as_py() or 0
        latest_ms = pc.max(groups.column(_LATEST)).as_py()
        watermark = advance(before.watermark_ms, latest_ms, self.pipeline.watermark_delay_ms)
        partials = groups.filter(pc.invert(groups.column(_LATE))).drop_columns([_LATE, _LAST, _ROWS, _LATEST])
        merged = merge(before.windows, partials, self.pipeline)
        closed, still_open = close(merged, watermark)
        self.store.save(offsets.batch_id, WindowState(still_open, watermark, self.pipeline.output_mode))
        rows = final_values(
            closed if self.pipeline.output_mode == "append" else _touched(merged, partials, self.pipeline),
            self.pipeline,
        )
        return BatchResult(
            valid_events,
            rows={self.target.output.name: rows},
            rejects=pa.Table.from_struct_array(rejects.combine_chunks()),
            late=late_rows,
            metrics={"watermark_ms": watermark, "late_watermark_ms": before.watermark_ms},
        )


def _late_rows(groups: pa.Table, watermark_ms: int) -> pa.Table:
    """The rejects-table rows (:data:`QUERY_REJECT_COLUMNS`) of the late events, one per group of its own (the
    event's last window), with the reason naming that window and the watermark that closed it."""
    rows = pa.Table.from_struct_array(groups.column(_REJECT).combine_chunks())
    starts = pc.cast(pc.cast(groups.column(WINDOW_START), pa.timestamp("ms", tz="UTC")), pa.int64()).to_pylist()
    ends = pc.cast(pc.cast(groups.column(WINDOW_END), pa.timestamp("ms", tz="UTC")), pa.int64()).to_pylist()
    reasons = [late_reason(start, end, watermark_ms) for start, end in zip(starts, ends, strict=True)]
    return rows.set_column(rows.schema.get_field_index("reason"), "reason", pa.array(reasons, pa.string()))


def _touched(merged: pa.Table, partials: pa.Table, pipeline: PipelineSpec) -> pa.Table:
    """The windows of ``merged`` that this batch's ``partials`` added to (update mode writes them all)."""
    keys = window_key(pipeline)
    touched = partials.select(keys).group_by(keys, use_threads=False).aggregate([])
    return merged.join(touched, keys, join_type="inner").sort_by([(k, "ascending") for k in keys])
