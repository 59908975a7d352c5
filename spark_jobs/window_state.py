"""Open windows carried from batch to batch by Krishiv, so each micro-batch reads Kafka once.

Spark's stateful aggregation can only feed the sink through its own branch of the plan, and the rejects
and late events need a second, per-event branch: their union scanned the source twice per batch, and
Structured Streaming does not reuse exchanges within a micro-batch. So the query is stateless (it still
tracks the event-time watermark in its offset log) and the sink aggregates each batch itself:

1. the batch's valid events whose (last) window ended at or before the watermark the batch before left behind
   are late: left out of the windows (those were written already), counted, and kept as rows of the rejects
   table with the reason :func:`late_reason` gives (``spark_jobs.windowed``);
2. the other valid events become partial aggregates per window and group-by key (``partial_columns``; with
   hopping windows an event belongs to several) and are merged with the open windows left by the batch before
   (``merge``);
3. the watermark moves to ``max(previous, max event time of the batch - delay)`` (``advance``), and every
   window that ends at or before it is closed and written by this batch (``close``); the rest are saved,
   with the watermark, as the state after this batch (``WindowStateStore``).

So a window is written by the batch whose data moves the watermark past its end, not by a later one: a
run over a whole topic writes every window its final watermark passed, and a topic that goes quiet
leaves nothing closable unwritten (Spark's append mode needs a no-data batch for that). Everything is
a function of the batch's records and the state before it, so a replay writes the same rows.

Each batch's state is one Parquet file in the checkpoint, ``krishiv/window-state/<batch>.parquet``, with
the watermark and the output mode in its schema metadata, written through a temporary file of a unique name
and an atomic rename. A replayed batch reads the state of the batch before it, so it computes the same windows again;
a copy of the checkpoint carries its state with it. Like Spark's state store
(``spark.sql.streaming.minBatchesToRetain``), the last 100 batches' states are kept.
"""

from __future__ import annotations

import decimal
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import Column
from pyspark.sql import functions as F

from krishiv_core.runbook import runbook
from krishiv_core.spec import WINDOWED, Aggregation, PipelineSpec
from krishiv_core.table_purpose import SPEC_CHANGE, SpecChangeRefused
from krishiv_core.tables import WINDOW_END, WINDOW_START, aggregate_type, group_columns
from spark_jobs.batch_state_files import save_batch_file
from spark_jobs.checkpoint import Checkpoint
from spark_jobs.errors import WindowStateMissing
from spark_jobs.transform import aggregate_expression

STATE_DIR = "krishiv/window-state"
WATERMARK_KEY = b"krishiv.watermark_ms"
MODE_KEY = b"krishiv.output_mode"  # the output mode the open windows were written in (update: already written)
_SUM, _COUNT = "__sum", "__count"
#: How a late event's reason in the rejects table starts (a malformed record's never does).
LATE_PREFIX = "late: "


@dataclass(frozen=True)
class WindowState:
    """The open windows after a batch, the watermark that batch left behind (epoch ms; 0 before any), and the
    output mode they were written in (None in a state saved before the mode was recorded)."""

    windows: pa.Table | None
    watermark_ms: int
    output_mode: str | None = None

    @property
    def open_windows(self) -> int:
        return 0 if self.windows is None else self.windows.num_rows


def mode_switch_refused(pipeline: PipelineSpec, state: WindowState, where: str) -> SpecChangeRefused | None:
    """The refusal of ``pipeline``'s output mode when ``state`` holds open windows of another mode, else None.

    Update mode has written each open window's current row already (append would write it again when it closes);
    append mode has written none (update would never write a window no later event touches)."""
    old = state.output_mode
    if old is None or old == pipeline.output_mode or not state.open_windows:
        return None
    return SpecChangeRefused(
        f"pipeline {pipeline.name!r}: output_mode changed from {old!r} to {pipeline.output_mode!r} while "
        f"{state.open_windows} window(s) are open in {where} (the newest event's window always is); nothing was "
        f"changed: set output_mode back to {old!r}, or start over in a new table under a new pipeline name "
        f"{SPEC_CHANGE}"
    )


def check_output_mode(pipeline: PipelineSpec, checkpoint: Checkpoint) -> None:
    """Refuse, before any work, an output mode switch of a windowed pipeline whose next batch starts from open
    windows of the other mode (the state of the checkpoint's last finished batch, or of the one before a batch
    Spark will run again)."""
    if pipeline.kind != WINDOWED:
        return
    last = checkpoint.last_batch_id()
    if last < 0:
        return
    committed = checkpoint.committed_batch_ids()
    start = last if committed and committed[-1] == last else last - 1
    store = WindowStateStore(checkpoint.path)
    if start < 0 or not store.path(start).exists():
        return
    refused = mode_switch_refused(pipeline, store.load_before(start + 1), str(checkpoint.path))
    if refused is not None:
        raise refused


def _instant(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def late_reason(window_start_ms: int, window_end_ms: int, watermark_ms: int) -> str:
    """A late event's reason in the rejects table: its (last) window and the watermark that had closed it, in UTC,
    e.g. ``late: window [2026-01-01T00:01:00.000Z, 2026-01-01T00:02:00.000Z) closed at watermark
    2026-01-01T00:02:05.000Z``."""
    return (
        f"{LATE_PREFIX}window [{_instant(window_start_ms)}, {_instant(window_end_ms)}) closed at watermark "
        f"{_instant(watermark_ms)}"
    )


def advance(watermark_ms: int, max_event_time_ms: int | None, delay_ms: int) -> int:
    """The watermark after a batch: it moves to the batch's latest event time less the delay, never back."""
    if max_event_time_ms is None:
        return watermark_ms
    return max(watermark_ms, max_event_time_ms - delay_ms)


@dataclass(frozen=True)
class _Buffer:
    """One column of a window's partial aggregate and how two partials of it merge."""

    column: str
    merge: str  # a pyarrow hash aggregation: sum, min or max


def _buffers(agg: Aggregation) -> list[_Buffer]:
    if agg.function == "avg":
        return [_Buffer(agg.name + _SUM, "sum"), _Buffer(agg.name + _COUNT, "sum")]
    return [_Buffer(agg.name, "sum" if agg.function == "count" else agg.function)]


def partial_columns(pipeline: PipelineSpec) -> list[Column]:
    """Spark aggregate expressions of one batch's partials, with the buffer types Spark's own aggregation uses
    (a decimal sum widens by 10 digits; an average sums in double unless its field is a decimal)."""
    out = []
    for agg in pipeline.aggregations:
        if agg.function == "avg":
            assert agg.field is not None
            field = F.col(agg.field)
            decimal_field = pipeline.field(agg.field).type.is_decimal
            out.append(F.sum(field if decimal_field else field.cast("double")).alias(agg.name + _SUM))
            out.append(F.count(field).alias(agg.name + _COUNT))
        else:
            out.append(aggregate_expression(agg).alias(agg.name))
    return out


def merge(previous: pa.Table | None, partials: pa.Table, pipeline: PipelineSpec) -> pa.Table:
    """Open windows after adding a batch's ``partials`` (one row per window) to the ``previous`` state."""
    if previous is not None and previous.num_rows:
        partials = pa.concat_tables([previous, partials.select(previous.column_names).cast(previous.schema)])
    buffers = [b for agg in pipeline.aggregations for b in _buffers(agg)]
    keys = window_key(pipeline)
    merged = partials.group_by(keys, use_threads=False).aggregate(
        [(b.column, b.merge, pc.ScalarAggregateOptions(min_count=1)) for b in buffers]
    )
    return merged.rename_columns([*keys, *[b.column for b in buffers]]).sort_by([(k, "ascending") for k in keys])


def window_key(pipeline: PipelineSpec) -> list[str]:
    """The columns naming one row of a windowed table: the window, then the group-by columns (a path's with ``_``
    for each dot: ``meta_site``)."""
    return [WINDOW_START, WINDOW_END, *group_columns(pipeline)]


def close(state: pa.Table, watermark_ms: int) -> tuple[pa.Table, pa.Table]:
    """(windows the watermark has passed, windows still open). Nothing closes before the first watermark."""
    if watermark_ms <= 0:
        return state.slice(0, 0), state
    ends = pc.cast(state.column(WINDOW_END), pa.timestamp("ms", tz="UTC"))
    closed = pc.less_equal(pc.cast(ends, pa.int64()), pa.scalar(watermark_ms, pa.int64()))
    return state.filter(closed), state.filter(pc.invert(closed))


def final_values(closed: pa.Table, pipeline: PipelineSpec) -> pa.Table:
    """Windows' aggregates in the table's types; an average divides as Spark's does (decimal: half up)."""
    columns = {k: closed.column(k) for k in window_key(pipeline)}
    for agg in pipeline.aggregations:
        result = aggregate_type(agg, pipeline)
        if agg.function != "avg":
            columns[agg.name] = closed.column(agg.name)
            continue
        sums, counts = closed.column(agg.name + _SUM).to_pylist(), closed.column(agg.name + _COUNT).to_pylist()
        if result.is_decimal:
            quantum = decimal.Decimal(1).scaleb(-result.scale)
            with decimal.localcontext(prec=80, rounding=decimal.ROUND_HALF_UP):
                values = [
                    (s / c).quantize(quantum) if s is not None and c else None
                    for s, c in zip(sums, counts, strict=True)
                ]
            columns[agg.name] = pa.array(values, pa.decimal128(result.precision, result.scale))
        else:
            columns[agg.name] = pa.array(
                [s / c if s is not None and c else None for s, c in zip(sums, counts, strict=True)], pa.float64()
            )
    return pa.table(columns)


class WindowStateStore:
    """The open windows after each batch, one Parquet file per batch id inside a query's checkpoint."""

    def __init__(self, checkpoint: Path) -> None:
        self.folder = checkpoint / STATE_DIR

    def path(self, batch_id: int) -> Path:
        return self.folder / f"{batch_id:012d}.parquet"

    def load_before(self, batch_id: int) -> WindowState:
        """The state batch ``batch_id`` starts from: empty for batch 0, else the one saved by the batch before."""
        if batch_id == 0:
            return WindowState(None, 0)
        path = self.path(batch_id - 1)
        if not path.exists():
            raise WindowStateMissing(
                f"the open windows after batch {batch_id - 1} are not in {self.folder}, so batch {batch_id} cannot "
                f"be aggregated; restore the checkpoint with its {STATE_DIR} folder "
                + runbook("A checkpoint that does not match its ledger")
            )
        windows = pq.read_table(path)
        metadata = windows.schema.metadata or {}
        if WATERMARK_KEY not in metadata:
            raise WindowStateMissing(
                f"{path} has no watermark: it was written by an older Krishiv, whose windows closed one batch later; "
                "start over in a new table under a new pipeline name "
                + runbook("A checkpoint that does not match its ledger")
            )
        mode = metadata.get(MODE_KEY)
        return WindowState(
            windows.replace_schema_metadata(None),
            int(metadata[WATERMARK_KEY]),
            mode.decode() if mode is not None else None,
        )

    def save(self, batch_id: int, state: WindowState) -> None:
        """Write the state after ``batch_id`` atomically, and drop states older than the retained batches.

        The temporary file's name is unique, so two writers of the same batch (a stager that lost its lease
        and the one that took over) never interleave their bytes: the last rename wins whole.
        """
        if state.windows is None:
            raise ValueError("a saved window state needs its (possibly empty) table of windows")
        metadata = {WATERMARK_KEY: str(state.watermark_ms).encode()}
        if state.output_mode is not None:
            metadata[MODE_KEY] = state.output_mode.encode()
        save_batch_file(self.folder, self.path(batch_id), state.windows.replace_schema_metadata(metadata), batch_id)
