"""A tiny run of ``python -m benchmarks`` (``make bench``) as its own process: all seven measurements, the
ratios, JSON and a PNG.

The figures of a run this small mean nothing (Spark's per-batch cost dominates); the test proves the
harness works end to end on the real broker, Spark and both catalogs, and that Krishiv's table equals the
baseline's. The figures themselves come from `make bench`, never from a timed test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"


@pytest.mark.postgres
@pytest.mark.timeout(1200)
def test_a_tiny_benchmark_prints_all_seven_measurements(tmp_path: Path, postgres_uri: str):
    out = tmp_path / "bench"
    command = [
        *(sys.executable, "-m", "benchmarks", "--spec", str(REPO / "krishiv.toml")),
        *("--events", "6000", "--batch-records", "2000", "--scaling", "1,2", "--warmup-events", "2000"),
        *("--relay-snapshots", "30", "--relay-depths", "5,20", "--postgres-uri", postgres_uri),
        *("--freshness-seconds", "10", "--rate", "200", "--sensor-interval", "2", "--out", str(out)),
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=1100,
        env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)},
        cwd=tmp_path,
    )
    (ARTIFACTS / "bench-tiny.log").parent.mkdir(exist_ok=True)
    (ARTIFACTS / "bench-tiny.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    doc = json.loads((out / "bench.json").read_text())
    assert doc["results_agree"] is True
    assert doc["krishiv"]["orders_counted"] == doc["baseline"]["orders_counted"] > 0
    assert doc["krishiv"]["batches"] == 3 and doc["krishiv"]["snapshots"] >= 2  # batch 0 closes no window yet
    for name in ("limit", "spark_scan_only", "krishiv", "baseline"):
        assert doc[name]["events_per_s"] > 0, name
    assert 0 < doc["krishiv"]["commit_s"] < doc["krishiv"]["seconds"]
    assert doc["limit"]["records"] == 6000 and doc["limit"]["readers"] == 4
    assert set(doc["ratios"]) == {"krishiv_vs_limit", "krishiv_vs_baseline"}
    relay = {r["catalog"]: r for r in doc["relay"]}
    assert set(relay) == {"sqlite", "postgresql"}
    for r in relay.values():
        assert r["error"] is None and r["snapshots"] == 30, r
        assert 0 < r["p50_ms"] <= r["p99_ms"]
        assert all(v is not None and v > 0 for v in r["p50_ms_at_depth"].values()), r
    fresh = doc["freshness"]
    assert fresh["windows"] >= 5 and fresh["rejects"] >= 10 and fresh["unseen"] == 0, fresh
    assert 0 < fresh["reject_p50_s"] <= fresh["reject_p99_s"]
    assert [m["factor"] for m in doc["memory"]] == [1, 2]
    assert all(m["jvm_mb"] > 100 and m["python_workers_mb"] > 10 for m in doc["memory"]), doc["memory"]
    assert [s["events"] for s in doc["scaling"]] == [6000, 12000]
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for row in ("1 limit", "2 Krishiv exactly-once", "3 baseline", "x limit", "x baseline", "4 relay on sqlite"):
        assert row in done.stdout, row
    for row in (
        "profile: Spark source scan alone",
        "4 relay on postgresql",
        "5 freshness",
        "6 peak RSS at 2x",
        "7 scaling 2x",
        "target ",
    ):
        assert row in done.stdout, row
