"""The open windows Krishiv carries between batches: merging, closing, final values and their files.

The pipeline tests check the whole path against the oracle through Spark; these pin the rules one by one.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from krishiv_core.runbook import runbook
from krishiv_core.spec import Aggregation, load_spec
from spark_jobs.batch_state_files import RETAINED_BATCHES
from spark_jobs.errors import WindowStateMissing
from spark_jobs.window_state import (
    WindowState,
    WindowStateStore,
    advance,
    close,
    final_values,
    merge,
    mode_switch_refused,
)

REPO_SPEC = Path(__file__).resolve().parents[2] / "krishiv.toml"
PIPELINE = replace(
    load_spec(REPO_SPEC).pipeline(),
    aggregations=(
        Aggregation("order_count", "count"),
        Aggregation("amount_total", "sum", "amount"),
        Aggregation("amount_min", "min", "amount"),
        Aggregation("amount_max", "max", "amount"),
        Aggregation("amount_avg", "avg", "amount"),
    ),
)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
MINUTE_MS = 60_000
T0_MS = int(T0.timestamp() * 1000)
SUM = pa.decimal128(22, 2)


def partials(rows: list[tuple[int, int, str | None, str | None, str | None, str | None, int]]) -> pa.Table:
    """(minute, count, sum, min, max, avg sum, avg count) per window, typed as Spark's toArrow gives them."""

    def dec(values: list[str | None]) -> list[Decimal | None]:
        return [None if v is None else Decimal(v) for v in values]

    ts = pa.timestamp("us", tz="UTC")
    return pa.table(
        {
            "window_start": pa.array([T0 + timedelta(minutes=r[0]) for r in rows], ts),
            "window_end": pa.array([T0 + timedelta(minutes=r[0] + 1) for r in rows], ts),
            "order_count": pa.array([r[1] for r in rows], pa.int64()),
            "amount_total": pa.array(dec([r[2] for r in rows]), SUM),
            "amount_min": pa.array(dec([r[3] for r in rows]), pa.decimal128(12, 2)),
            "amount_max": pa.array(dec([r[4] for r in rows]), pa.decimal128(12, 2)),
            "amount_avg__sum": pa.array(dec([r[5] for r in rows]), SUM),
            "amount_avg__count": pa.array([r[6] for r in rows], pa.int64()),
        }
    )


def by_minute(table: pa.Table) -> dict[int, dict]:
    return {
        int((row["window_start"] - T0).total_seconds() // 60): {k: v for k, v in row.items() if k != "window_start"}
        for row in table.to_pylist()
    }


def test_a_batch_merges_into_the_windows_left_open_by_the_batch_before() -> None:
    first = merge(
        None, partials([(0, 2, "3.00", "1.00", "2.00", "3.00", 2), (1, 1, None, None, None, None, 0)]), PIPELINE
    )
    second = merge(
        first,
        partials([(0, 1, "0.50", "0.50", "0.50", "0.50", 1), (2, 1, "4.00", "4.00", "4.00", "4.00", 1)]),
        PIPELINE,
    )

    windows = by_minute(second)
    assert sorted(windows) == [0, 1, 2]
    assert windows[0]["order_count"] == 3 and windows[0]["amount_total"] == Decimal("3.50")
    assert (windows[0]["amount_min"], windows[0]["amount_max"]) == (Decimal("0.50"), Decimal("2.00"))
    assert (windows[0]["amount_avg__sum"], windows[0]["amount_avg__count"]) == (Decimal("3.50"), 3)
    assert windows[1]["order_count"] == 1 and windows[1]["amount_total"] is None, "a sum of only nulls stays null"
    assert windows[2]["order_count"] == 1


def test_windows_close_at_or_behind_the_watermark_and_none_before_the_first() -> None:
    state = merge(None, partials([(m, 1, "1.00", "1.00", "1.00", "1.00", 1) for m in range(3)]), PIPELINE)
    closed, still_open = close(state, 0)
    assert closed.num_rows == 0 and still_open.num_rows == 3

    closed, still_open = close(state, T0_MS + 2 * MINUTE_MS)  # exactly the end of minute 1
    assert sorted(by_minute(closed)) == [0, 1]
    assert sorted(by_minute(still_open)) == [2]


def test_final_values_divide_the_average_half_up_in_the_tables_type() -> None:
    state = merge(
        None,
        partials([(0, 32, "0.01", "0.00", "0.01", "0.01", 32), (1, 3, "2.00", "0.50", "1.00", "2.00", 3)]),
        PIPELINE,
    )
    windows = by_minute(final_values(state, PIPELINE))
    assert windows[0]["amount_avg"] == Decimal("0.000313"), "0.0003125 rounds half up, as Spark's decimal average"
    assert windows[1]["amount_avg"] == Decimal("0.666667")
    assert set(windows[0]) == {"window_end", "order_count", "amount_total", "amount_min", "amount_max", "amount_avg"}


def test_the_watermark_follows_the_latest_event_less_the_delay_and_never_goes_back() -> None:
    assert advance(0, None, 5_000) == 0, "a batch without valid events leaves the watermark where it was"
    assert advance(0, T0_MS + 65_000, 5_000) == T0_MS + 60_000
    assert advance(T0_MS + 60_000, T0_MS + 30_000, 5_000) == T0_MS + 60_000, "an older batch never moves it back"


def test_the_state_store_keeps_each_batchs_windows_and_watermark_and_names_a_missing_one(tmp_path: Path) -> None:
    store = WindowStateStore(tmp_path)
    assert store.load_before(0) == WindowState(None, 0)
    state = merge(None, partials([(0, 1, "1.00", "1.00", "1.00", "1.00", 1)]), PIPELINE)
    store.save(0, WindowState(state, T0_MS + 30_000))
    loaded = store.load_before(1)
    assert loaded.windows.equals(state) and loaded.watermark_ms == T0_MS + 30_000

    with pytest.raises(WindowStateMissing, match=r"after batch 4 .* batch 5") as info:
        store.load_before(5)
    assert str(info.value).endswith(runbook("A checkpoint that does not match its ledger"))

    for batch_id in range(1, RETAINED_BATCHES + 5):
        store.save(batch_id, WindowState(state, T0_MS))
    kept = sorted(int(p.stem) for p in store.folder.glob("*.parquet"))
    assert kept == list(range(5, RETAINED_BATCHES + 5)), "the last 100 batches' states are kept"
    assert not list(store.folder.glob("*.tmp")) and not list(store.folder.glob(".*"))


def test_a_state_file_without_a_watermark_is_refused_by_name(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    store = WindowStateStore(tmp_path)
    store.folder.mkdir(parents=True)
    pq.write_table(merge(None, partials([(0, 1, "1.00", "1.00", "1.00", "1.00", 1)]), PIPELINE), store.path(0))
    with pytest.raises(WindowStateMissing, match=rf"{store.path(0)} has no watermark"):
        store.load_before(1)


def test_the_state_keeps_its_output_mode_and_a_switch_is_refused_only_while_windows_are_open(tmp_path: Path) -> None:
    """Update mode wrote its open windows already (append would write them again when they close); append wrote
    none (update would never write one no later event touches). Closed windows are written either way."""
    store = WindowStateStore(tmp_path)
    open_windows = merge(None, partials([(0, 1, "1.00", "1.00", "1.00", "1.00", 1)]), PIPELINE)
    store.save(0, WindowState(open_windows, T0_MS, "update"))
    store.save(1, WindowState(open_windows.slice(0, 0), T0_MS + MINUTE_MS, "update"))
    with_windows, without = store.load_before(1), store.load_before(2)
    assert (with_windows.output_mode, with_windows.open_windows) == ("update", 1)
    assert (without.output_mode, without.open_windows) == ("update", 0)

    append = replace(PIPELINE, output_mode="append")
    refused = mode_switch_refused(append, with_windows, "the checkpoint")
    assert refused is not None and "from 'update' to 'append' while 1 window(s) are open" in str(refused)
    assert str(refused).endswith("(see docs/operations.md: Recovery runbook > A spec change the table cannot take)")
    assert mode_switch_refused(append, without, "the checkpoint") is None, "no open window: the switch is safe"
    assert mode_switch_refused(replace(PIPELINE, output_mode="update"), with_windows, "the checkpoint") is None
    unknown = WindowState(open_windows, T0_MS)  # saved before the mode was recorded: nothing to compare
    assert mode_switch_refused(append, unknown, "the checkpoint") is None
