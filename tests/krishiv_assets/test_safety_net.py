"""The safety net overlapping the committer: a Dagster commit run started for batches a continuous ``krishiv run``
is still committing races it on the same table and ledger. Each batch must still be one snapshot and one commit in
the ledger, and the outbox sensor must report exactly the committer's commits (the run materialized its own)."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import dagster as dg

from krishiv.operations import open_ledger
from krishiv_core.catalog import ensure_pipeline_tables, load_catalog, qualified
from krishiv_core.entries import COMMITTED
from krishiv_core.spec import load_spec
from outbox.ledger import Ledger
from outbox.relay import SUMMARY_BATCH_ID, CommitRelay, TableCommitReport
from tests.krishiv_assets.test_sensors import _tick, commit_events
from tests.outbox.test_relay import stage

BATCHES = 12
RACE_TIMEOUT_S = 240.0


def test_a_safety_net_run_racing_the_committer_commits_each_batch_once(tmp_path: Path, postgres_uri: str) -> None:
    from dagster._core.test_utils import create_run_for_test

    from chaos.workspace import SPEC_TEMPLATE

    path = tmp_path / "krishiv.toml"
    path.write_text(
        SPEC_TEMPLATE.format(
            bootstrap="127.0.0.1:9",  # refused at once: the sensor reports the commits without their lag
            partitions=1,
            catalog_uri=postgres_uri,
            warehouse="warehouse",
            topic="orders",
            max_records=100,
        )
    )
    spec = load_spec(path, env={})
    pipeline = spec.pipeline()
    table = qualified(spec, pipeline.table)
    catalog, ledger = load_catalog(spec), open_ledger(spec)
    ensure_pipeline_tables(catalog, spec, pipeline)
    for b in range(BATCHES):
        stage(catalog, ledger, b, b, pipeline=pipeline, namespace=spec.iceberg.namespace)
    instance = dg.DagsterInstance.ephemeral()
    commit_run = create_run_for_test(
        instance, job_name=f"{pipeline.name}_commit_job", status=dg.DagsterRunStatus.SUCCESS
    )  # a run that has made its commits: a commit run in flight would hold the checks run back
    committers = ("krishiv run", f"dagster run {commit_run.run_id}")

    # Two relays, each with its own catalog client and ledger handle, as in two processes, started together.
    start = threading.Barrier(len(committers))
    reports: dict[str, TableCommitReport] = {}
    failures: list[BaseException] = []

    def commit(by: str) -> None:
        try:
            relay = CommitRelay(Ledger(ledger.path), load_catalog(spec), committed_by=by)
            start.wait(timeout=RACE_TIMEOUT_S)
            reports[by] = relay.commit_table(table)
        except BaseException as exc:  # handed to the test thread
            failures.append(exc)

    threads = [threading.Thread(target=commit, args=(by,), name=by) for by in committers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RACE_TIMEOUT_S)
    assert not failures, failures
    assert not any(thread.is_alive() for thread in threads)

    assert all(e.status == COMMITTED for e in ledger.entries(table))
    iceberg = load_catalog(spec).load_table(table)
    batches = Counter(s.summary.get(SUMMARY_BATCH_ID) for s in iceberg.snapshots() if s.summary is not None)
    assert batches == Counter(str(b) for b in range(BATCHES)), "a batch committed twice or not at all"
    assert iceberg.scan().to_arrow().num_rows == BATCHES
    made = sorted(b for report in reports.values() for b in report.committed)
    assert made == list(range(BATCHES)), {by: r.committed for by, r in reports.items()}

    commits = ledger.commits_since(0, limit=10 * BATCHES)
    assert sorted(c.batch_id for c in commits) == list(range(BATCHES))  # one commit (one commit_seq) per batch
    by_committer = {by: sorted(c.batch_id for c in commits if c.committed_by == by) for by in committers}
    assert sorted(by_committer[committers[0]] + by_committer[committers[1]]) == list(range(BATCHES))

    with instance:
        tick = _tick(spec, f"{pipeline.name}_outbox_sensor", '{"commit_seq": 0}', instance)
    reported = sorted(int(e.metadata["batch_id"].value) for e in commit_events(tick))
    assert reported == by_committer["krishiv run"]
    # No commit run (all is committed); a checks run for the reported commits, if the committer made any.
    assert [r.job_name for r in tick.run_requests] == ([f"{pipeline.name}_checks_job"] if reported else [])
