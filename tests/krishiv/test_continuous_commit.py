"""A continuous run commits its own batches: the tables fill while it runs, with no ``krishiv commit``, exactly once.

One run through the real broker, Spark and catalog: a first wave of orders is in the topic when it starts, a second
one is produced once the first is visible. The run is stopped (as ``stop_when`` stops it, between batches) only once
the ledger shows every batch of both waves committed; the tables then equal the oracle that reads the topic back,
and nothing is left pending.
"""

from __future__ import annotations

import time

import duckdb

from chaos.checks import compare_with_oracle
from krishiv.operations import open_ledger, run_pipelines
from krishiv.query_supervisor import RunClients
from krishiv_core.catalog import qualified
from krishiv_core.entries import COMMITTED
from krishiv_core.spec import KrishivSpec
from outbox.relay import TableCommitReport
from spark_jobs.kafka_source import latest_offsets
from tests.spark_jobs.pipeline_helpers import produce_orders

WAVE = 1_200
MALFORMED = 6
#: The second wave's event times follow the first's (demo orders are 50 ms apart), so its windows close later ones.
SECOND_WAVE_START_MS = 1_767_225_600_000 + WAVE * 50
TIMEOUT_S = 300.0  # a bound, not a target: a loaded 2-core machine takes seconds per Spark batch


class Waves:
    """``stop_when`` of the run: produce the second wave once the first is committed, stop once both are."""

    def __init__(self, spec: KrishivSpec) -> None:
        self.spec = spec
        self.pipeline = spec.pipeline()
        self.tables = [qualified(spec, t) for t in self.pipeline.all_tables]
        self.ledger = open_ledger(spec)
        self.waves_committed = 0
        self.deadline = time.monotonic() + TIMEOUT_S
        self.timed_out = False

    def all_committed(self) -> bool:
        """Every table's committed batches reach the end of the topic: all that was produced is visible."""
        latest = latest_offsets(self.spec.kafka.bootstrap_servers, self.pipeline.topic)
        return all(
            self.ledger.end_offsets(t, self.pipeline.topic, status=COMMITTED) == latest for t in self.tables
        ) and not self.ledger.pending_batches(self.tables)

    def __call__(self) -> bool:
        if time.monotonic() > self.deadline:
            self.timed_out = True
            return True
        if not self.all_committed():
            return False
        self.waves_committed += 1
        if self.waves_committed == 1:
            produce_orders(self.spec, WAVE, malformed=MALFORMED, seed=8, start_ms=SECOND_WAVE_START_MS)
            return False
        return True


def test_a_continuous_run_commits_each_batch_without_krishiv_commit(make_spec, broker, spark) -> None:
    spec = make_spec()
    produce_orders(spec, WAVE, malformed=MALFORMED)
    waves = Waves(spec)
    reports: list[TableCommitReport] = []
    lines: list[str] = []

    running = run_pipelines(
        spec,
        list(spec.pipelines),
        once=False,
        clients=RunClients(spark=spark),
        on_commit=reports.append,
        progress=lines.append,
        stop_when=waves,
    )

    assert not waves.timed_out, f"not every batch was committed within {TIMEOUT_S:.0f}s; the run said {lines}"
    assert waves.waves_committed == 2
    staged = [b.batch_id for b in running[0].stager.history if b.recorded]
    assert len(staged) >= 2, "a batch per wave at least"
    check = compare_with_oracle(spec)  # no commit_pipelines first: the run committed everything itself
    assert check.violations == []
    assert sum(w["order_count"] for w in check.expected.windows.values()) > 0
    assert len(check.expected.rejects) == 2 * MALFORMED

    ledger = open_ledger(spec)
    assert ledger.pending_batches() == []
    committed = {b for r in reports for b in r.committed}
    rows = {b.batch_id for b in running[0].stager.history if b.recorded and (b.rows or b.rejects)}
    assert committed == rows, "every batch with rows was committed by the run's committer, and reported"
    with duckdb.connect(str(ledger.path), read_only=True) as con:
        by = con.execute("SELECT DISTINCT committed_by FROM outbox WHERE committed_snapshot_id IS NOT NULL").fetchall()
    assert by == [("krishiv run",)], "the ledger names the run as the committer"
    assert not any("commits" in line for line in lines), f"no outage or refusal was said: {lines}"


def test_the_line_per_commit_names_table_batches_rows_snapshot_and_time() -> None:
    from pathlib import Path

    from krishiv.commands.pipeline import _commit_line
    from krishiv_core.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[2] / "krishiv.toml", env={})
    one = TableCommitReport(
        "krishiv.orders_per_minute", [5], snapshot_ids=[6339934183285000154], commit_latencies_ms=[84.2], records=3
    )
    assert _commit_line(spec, one) == "orders_per_minute: committed batch 5 (3 rows) as snapshot 6339934… in 84 ms"
    many = TableCommitReport(
        "krishiv.orders_per_minute_rejects",
        [123_456, 123_457],
        snapshot_ids=[1, 7806912183285000154],
        commit_latencies_ms=[1_234.5, 1_000.0],
        records=999_999,
    )
    assert _commit_line(spec, many) == (
        "orders_per_minute_rejects: committed batches 123456-123457 (999999 rows) up to snapshot 7806912… in 2234 ms"
    )
    found = TableCommitReport("krishiv.orders_per_minute", recovered=[7, 8])
    assert _commit_line(spec, found) == "orders_per_minute: batches 7-8 already in the table"
    assert len(_commit_line(spec, one)) <= 80, "a batch's line fits the terminal"
