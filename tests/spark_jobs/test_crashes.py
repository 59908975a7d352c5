"""Crashes of real processes at named fault points: the Spark driver mid-batch, the relay mid-commit."""

from __future__ import annotations

import signal

import pytest

from krishiv.operations import commit_pipelines, open_ledger, run_pipelines
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.entries import PENDING
from tests.spark_jobs.pipeline_helpers import assert_exactly_once, krishiv_cli, produce_orders

KILLED = -signal.SIGKILL


@pytest.mark.heavy
def test_driver_killed_during_batches_keeps_exactly_once(make_spec, spec_file, broker):
    spec = make_spec(max_records=1_000)
    produce_orders(spec, 4_000, late=10, malformed=8)
    # Die after staging files (orphans), and after the ledger write but before Spark's commit log. The matrix
    # (tests/krishiv/chaos) kills the driver at every staging point; these two are the ones a replay must undo.
    for fault in ("stage.after_files@1", "stage.after_ledger@2"):
        crashed = krishiv_cli(spec_file, "run", "--once", faults=fault)
        assert crashed.returncode == KILLED, (fault, crashed.stdout[-2000:], crashed.stderr[-4000:])
    finished = krishiv_cli(spec_file, "run", "--once")
    assert finished.returncode == 0, finished.stderr[-4000:]

    entries = open_ledger(spec).entries()
    keys = [(e.table, e.batch_id) for e in entries]
    assert len(keys) == len(set(keys)), "a batch has two ledger entries"
    assert_exactly_once(spec)


def test_relay_killed_after_catalog_commit_commits_nothing_twice(make_spec, spec_file, broker, spark):
    spec = make_spec(max_records=1_000)
    produce_orders(spec, 4_000, malformed=4)
    run_pipelines(spec, list(spec.pipelines), once=True)
    table_name = qualified(spec, spec.pipeline().table)
    with_rows = [e.batch_id for e in open_ledger(spec).pending(table_name) if e.record_count]
    assert len(with_rows) >= 2
    victim = with_rows[1]

    crashed = krishiv_cli(spec_file, "commit", faults=f"relay.after_catalog_commit@{victim}")
    assert crashed.returncode == KILLED, crashed.stderr[-4000:]
    entry = open_ledger(spec).get(open_ledger(spec).entries(table=table_name)[0].query_id, table_name, victim)
    assert entry is not None and entry.status == PENDING
    table = load_catalog(spec).load_table(table_name)
    assert table.metadata.snapshot_by_id(entry.intended_snapshot_id) is not None, "the commit itself happened"

    rerun = krishiv_cli(spec_file, "commit")
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    assert_exactly_once(spec)
    table = load_catalog(spec).load_table(table_name)
    assert len(table.snapshots()) == len(with_rows)


def test_commit_that_raises_after_succeeding_is_recognised(make_spec, broker, spark, monkeypatch):
    spec = make_spec(max_records=1_500)
    produce_orders(spec, 3_000, malformed=3)
    run_pipelines(spec, list(spec.pipelines), once=True)
    monkeypatch.setenv("KRISHIV_FAULTS", "relay.after_catalog_commit:raise")
    reports = commit_pipelines(spec, list(spec.pipelines))
    monkeypatch.delenv("KRISHIV_FAULTS")
    # The armed item fires once per batch id, so the first table's commits raise after succeeding; each
    # is recognised by reloading the table, never committed again.
    recovered = [(r.table, b) for r in reports for b in r.recovered]
    assert recovered, "the ambiguous commits were found by reloading the table"
    assert not {(r.table, b) for r in reports for b in r.committed} & set(recovered)
    assert_exactly_once(spec)
