"""The fault-injection harness: the whole crash-point matrix (at its CI size, two scenarios at a time) with
0 violations, every fault point and every scenario kind reached; and the contract check really catches a broken
table (the harness can fail)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from krishiv.catalog import load_catalog, qualified
from krishiv.chaos.checks import check_contract
from krishiv.chaos.runner import FAULT_POINTS
from krishiv.chaos.scenarios import MATRIX
from krishiv.chaos.workspace import Workspace
from krishiv.cli import main
from spark_jobs.kafka_source import latest_offsets

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"


@pytest.mark.timeout(3600)
def test_the_crash_point_matrix_keeps_exactly_once(tmp_path: Path, capsys):
    report_path = ARTIFACTS / "chaos-report.json"
    args = ["chaos", "--size", "ci", "--lanes", "2", "--seed", "2026", "--state", str(tmp_path / "chaos")]
    code = main([*args, "--report", str(report_path)])
    report = json.loads(report_path.read_text())
    assert report["violation_details"] == [], report["violation_details"]
    assert code == 0
    assert (report["size"], report["lanes"]) == ("ci", 2)
    assert {s["name"] for s in report["scenarios"]} == {s.name for s in MATRIX}
    never = [p for p in FAULT_POINTS if report["fault_points_fired"][p] == 0]
    assert not never, f"fault points never reached: {never}"
    assert report["faults_injected"] >= 30
    assert report["events_checked"] >= 15_000
    assert "violations" in capsys.readouterr().out


def test_the_contract_check_catches_a_duplicate_and_a_deleted_staged_file(tmp_path: Path, broker, topic):
    ws = Workspace(tmp_path / "ws", broker.bootstrap, topic)
    ws.produce(2_000, seed=3, late=5, malformed=4)
    assert ws.run("run", "--once") == 0
    assert "orders_per_minute batch 0: " in (ws.folder / "commands.log").read_text()  # krishiv run's progress
    assert ws.run("commit") == 0
    assert check_contract(ws.spec, latest_offsets(ws.bootstrap, ws.topic)).violations == []

    table = load_catalog(ws.spec).load_table(qualified(ws.spec, ws.spec.pipeline().table))
    first = table.scan().to_arrow().slice(0, 1)
    table.append(first.cast(pa.schema(list(first.schema))))
    text = "\n".join(check_contract(ws.spec, latest_offsets(ws.bootstrap, ws.topic)).violations)
    assert "appears twice" in text
    assert "appears more than once" in text  # krishiv verify says so too

    entry = next(e for e in ws.ledger().entries() if e.files)
    Path(entry.files[0].path.removeprefix("file://")).unlink()
    text = "\n".join(check_contract(ws.spec, latest_offsets(ws.bootstrap, ws.topic)).violations)
    assert f"staged file {entry.files[0].path} of {entry.table} batch {entry.batch_id} (COMMITTED) was deleted" in text
    assert "could not be read back" in text
