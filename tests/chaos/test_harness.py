"""The fault-injection harness: the crash-point matrix at its CI size, three scenarios at a time (``make test`` runs
the scenarios marked ``in_ci``, ``make test-heavy`` the others), with 0 violations and every fault point reached; and
the contract check really catches a broken table (the harness can fail)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from chaos.__main__ import main
from chaos.checks import _coverage, _local, check_contract, live_files
from chaos.oracle import expected_output
from chaos.runner import FAULT_POINTS
from chaos.scenarios import MATRIX, query_failed
from chaos.workspace import SPEC_TEMPLATE, Workspace
from krishiv.operations import open_ledger
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.entries import OutboxEntry
from krishiv_core.spec import load_spec
from outbox.relay import high_water_marks, high_water_property
from spark_jobs.checkpoint import Checkpoint
from spark_jobs.kafka_source import latest_offsets

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def _run_matrix(tmp_path: Path, scenarios: list[str], report_name: str) -> dict:
    """The ``scenarios`` at the CI size, three at a time; their report, once every one ran with 0 violations."""
    report_path = ARTIFACTS / report_name
    args = ["--size", "ci", "--lanes", "3", "--seed", "2026", "--state", str(tmp_path / "chaos")]
    code = main([*args, *(f"--scenario={name}" for name in scenarios), "--report", str(report_path)])
    report = json.loads(report_path.read_text())
    assert report["violation_details"] == [], report["violation_details"]
    assert code == 0
    assert (report["size"], report["lanes"]) == ("ci", 3)
    assert {s["name"] for s in report["scenarios"]} == set(scenarios)
    return report


@pytest.mark.timeout(3600)
def test_the_crash_point_matrix_keeps_exactly_once(tmp_path: Path, capsys):
    report = _run_matrix(tmp_path, [s.name for s in MATRIX if s.in_ci], "chaos-report.json")
    never = [p for p in FAULT_POINTS if report["fault_points_fired"][p] == 0]
    assert not never, f"fault points never reached: {never}"
    assert report["faults_injected"] >= 30
    assert report["events_checked"] >= 15_000
    assert "violations" in capsys.readouterr().out


@pytest.mark.heavy
@pytest.mark.timeout(3600)
def test_the_scenarios_outside_make_test_keep_exactly_once(tmp_path: Path):
    """The matrix's scenarios ``make test`` leaves out (their paths have focused tests there)."""
    _run_matrix(tmp_path, [s.name for s in MATRIX if not s.in_ci], "chaos-report-heavy.json")


def test_the_contract_check_catches_a_duplicate_and_a_deleted_staged_file(tmp_path: Path, broker, topic):
    """The check holds across maintenance (a rewrite at the head, every other snapshot expired, the staged files
    no snapshot reads any more removed) and still names a batch lost above the high-water mark, a duplicate and
    a deleted file a snapshot reads."""
    ws = Workspace(tmp_path / "ws", broker.bootstrap, topic)
    ws.produce(2_000, seed=3, late=5, malformed=4)
    assert ws.run("run", "--once") == 0
    assert "orders_per_minute batch 0: " in (ws.folder / "commands.log").read_text()  # krishiv run's progress
    assert ws.run("commit") == 0
    assert check_contract(ws.spec, latest_offsets(ws.bootstrap, ws.topic)).violations == []

    name = qualified(ws.spec, ws.spec.pipeline().table)
    table = load_catalog(ws.spec).load_table(name)
    rows = table.scan().to_arrow()
    table.overwrite(rows.cast(pa.schema(list(rows.schema))))  # as a compaction would, at the head
    current = table.current_snapshot()
    assert current is not None
    table.maintenance.expire_snapshots().by_ids(
        [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current.snapshot_id]
    ).commit()
    table = load_catalog(ws.spec).load_table(name)
    gone = [f.path for e in ws.ledger().entries(table=name) for f in e.files]
    assert gone and not {_local(p) for p in gone} & live_files(table)
    for path in gone:  # as orphan removal may, once no retained snapshot reads them
        table.io.delete(path)
    assert check_contract(ws.spec, latest_offsets(ws.bootstrap, ws.topic)).violations == []

    (query,) = high_water_marks(table)
    mark = high_water_property(query)
    with table.transaction() as tx:
        tx.set_properties({mark: "-1"})  # the batches' snapshots expired, and the table no longer shows them
    text = "\n".join(check_contract(ws.spec, latest_offsets(ws.bootstrap, ws.topic)).violations)
    assert "have no snapshot and are above their query's high-water mark" in text
    with table.transaction() as tx:
        tx.set_properties({mark: str(max(e.batch_id for e in ws.ledger().entries(table=name)))})
    assert check_contract(ws.spec, latest_offsets(ws.bootstrap, ws.topic)).violations == []

    table = load_catalog(ws.spec).load_table(qualified(ws.spec, ws.spec.pipeline().table))
    first = table.scan().to_arrow().slice(0, 1)
    table.append(first.cast(pa.schema(list(first.schema))))
    text = "\n".join(check_contract(ws.spec, latest_offsets(ws.bootstrap, ws.topic)).violations)
    assert "appears twice" in text
    assert "appears more than once" in text  # krishiv verify says so too

    rejects = qualified(ws.spec, ws.spec.pipeline().rejects_table)
    entry = next(e for e in ws.ledger().entries(table=rejects) if e.files)  # its files are what the table reads
    Path(entry.files[0].path.removeprefix("file://")).unlink()
    text = "\n".join(check_contract(ws.spec, latest_offsets(ws.bootstrap, ws.topic)).violations)
    assert f"staged file {entry.files[0].path} of {entry.table} batch {entry.batch_id} (COMMITTED) was deleted" in text
    assert "could not be read back" in text


def _entry(batch_id: int, ranges: dict[str, list[int]], topic: str = "orders") -> OutboxEntry:
    return OutboxEntry("q", "orders_per_minute", "krishiv.orders_per_minute", batch_id, {topic: ranges}, (), batch_id)


def test_the_coverage_check_follows_a_recorded_skip_and_still_catches_gaps_and_repeats(tmp_path: Path):
    """A topic re-created after batch 1: the skip batch 2 applied moves partition 0 from 20 back to 0; without the
    skip the same ranges would read as staged twice, and a range that does not start where the skip went is named."""
    spec_file = tmp_path / "krishiv.toml"
    values = {"bootstrap": "127.0.0.1:1", "partitions": 1, "catalog_uri": "sqlite:///catalog.db"}
    spec_file.write_text(SPEC_TEMPLATE.format(**values, warehouse="warehouse", topic="orders", max_records=10))
    spec = load_spec(spec_file, env={})
    Checkpoint(spec.checkpoint_dir(spec.pipeline())).pin_starting_offsets({"0": 0})
    ledger = open_ledger(spec)
    ledger.record_batch([_entry(0, {"0": [0, 10]}), _entry(1, {"0": [10, 20]}), _entry(2, {"0": [0, 5]})])
    assert _coverage(spec, ledger, {"0": 5}) == [
        "partition 0: offsets [0, 20) staged twice",
        "partition 0: staged up to 20, the topic ends at 5",
    ]
    skip = ledger.record_skip("orders_per_minute", "q", "orders", "0", 20, 0, "re-created", "test")
    ledger.mark_skip_applied(skip, 2)
    assert _coverage(spec, ledger, {"0": 5}) == []
    ledger.record_batch([_entry(3, {"0": [6, 9]})])
    assert _coverage(spec, ledger, {"0": 9}) == ["partition 0: offsets [5, 6) never staged"]


def test_the_oracle_reads_each_batch_from_its_topic_generation():
    order = b'{"order_id": "o", "customer_id": "c", "amount": "%s", "event_time": %d}'
    old = {(0, 0): order % (b"1.00", 60_000), (0, 1): b"not json"}
    new = {(0, 0): order % (b"2.00", 200_000)}
    entries = [_entry(0, {"0": [0, 2]}), _entry(1, {"0": [0, 1]})]
    expected = expected_output(new, entries, "orders", earlier=[(1, old)])
    assert expected.rejects == {(0, 0, 1)}
    assert expected.valid_events == 2
    assert expected.windows[60_000]["amount_total"] == Decimal("1.00")  # closed by batch 1's watermark (195 s)
    assert 180_000 not in expected.windows  # batch 1's own window is still open


def test_a_query_the_run_starts_again_is_not_a_failure():
    """Spark fails a query whose Python worker did not connect back within its fixed 10 s (a loaded machine); the
    run starts it again, so the harness must not stop the scenario for it. Any other cause is a failure."""
    failed = "26/11/26 11:18:03 ERROR MicroBatchExecution: Query q [id = 1] terminated with error\n"
    timed_out = failed + "org.apache.spark.SparkException: Python worker failed to connect back.\n\tat x\n"
    other = failed + "org.apache.spark.SparkException: something else\n\tat x\n"
    assert not query_failed("query q started\n")
    assert not query_failed(timed_out)
    assert not query_failed(failed), "the cause is not written yet"
    assert query_failed(other)
    assert query_failed(timed_out + other)
