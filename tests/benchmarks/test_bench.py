"""A tiny run of ``python -m benchmarks`` (``make bench``) as its own process: all seven measurements, the
ratios, JSON and a PNG; and docs/benchmark.md's table rendered from a results JSON (``benchmarks/docs_table.py``).

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

from benchmarks import docs_table
from benchmarks.memory import PeakRss
from benchmarks.nested import merged
from benchmarks.throughput import EventsRun

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"


@pytest.mark.heavy
@pytest.mark.postgres
@pytest.mark.timeout(1200)
def test_a_tiny_benchmark_prints_all_seven_measurements(tmp_path: Path, postgres_uri: str):
    out = tmp_path / "bench"
    command = [
        *(sys.executable, "-m", "benchmarks", "--spec", str(REPO / "krishiv.toml")),
        *("--events", "6000", "--batch-records", "2000", "--catch-up-records", "0"),
        *("--scaling", "1,2", "--warmup-events", "2000"),
        *("--relay-snapshots", "30", "--relay-depths", "5,20", "--postgres-uri", postgres_uri),
        *("--relay-maintained-batches", "30", "--maintenance-every", "0.5", "--maintenance-keep-last", "5"),
        *("--results", str(tmp_path / "results" / "latest.json")),
        *("--freshness-seconds", "10", "--rate", "200", "--dagster-freshness-seconds", "0", "--out", str(out)),
        *("--merge-sizes", "2000,8000", "--merge-batch-keys", "200"),
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
    assert json.loads((tmp_path / "results" / "latest.json").read_text()) == doc
    assert doc["date"].endswith("+00:00") and len(doc["checkout"]["commit"]) == 40
    assert {"cpus", "memory_gib", "pyiceberg", "pyspark", "load_average"} <= set(doc["machine"])
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
    maintained = {r["catalog"]: r for r in doc["relay_maintained"]}
    assert set(maintained) == {"sqlite", "postgresql"}
    for r in maintained.values():
        assert r["error"] is None and r["snapshots"] == 30 and r["last_commits"] == 30, r
        assert r["maintenance"]["keep_last"] == 5 and r["maintenance"]["runs"] >= 1 and r["conflicts"] >= 0
    assert doc["events"]["rows_written"] > 0 and doc["events"]["events_per_s"] > 0
    valid = doc["events"]["rows_written"]
    nested = doc["events_nested"]
    assert nested["rows_written"] == 6000 and nested["rejects"] == 0, "every nested order one row"
    assert nested["vs_flat_events"] > 0 and "measured_apart" not in nested
    assert doc["upsert"]["rows_written"] == valid, "every order's row replaced once: one row per order id"
    assert doc["limit_default_settings"]["records"] == 6000 and doc["limit"]["settings"]["queued.min.messages"] > 0
    costs = {(c["table_rows"], c["layout"]): c for c in doc["merge_cost"]["costs"]}
    assert set(costs) == {(n, layout) for n in (2000, 8000) for layout in ("uniform", "clustered")}
    assert all(c["delete_rows_written"] == 200 and c["table_bytes_rewritten"] == 0 for c in costs.values())
    names = [t["name"] for t in doc["targets"]]
    assert "relay p99 on sqlite with maintenance, last 30 (ms)" in names and "events kind vs limit" in names
    assert "upsert kind vs limit" in names and any(n.startswith("merge cost per batch") for n in names)
    assert all(isinstance(t["met"], bool) for t in doc["targets"])
    assert docs_table.main(["--results", str(out / "bench.json"), "--page", str(_page_copy(tmp_path))]) == 0
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
        "4 relay on sqlite, maintained",
        "2 events kind",
        "2 events kind, nested orders",
        "5 freshness",
        "6 peak RSS at 2x",
        "7 scaling 2x",
        "target ",
    ):
        assert row in done.stdout, row


# ------------------------------------------------------------------------------------- the page's table

RESULTS = {
    "date": "2026-11-22T22:00:00+00:00",
    "checkout": {"commit": "0123456789abcdef0123456789abcdef01234567", "dirty": False},
    "machine": {
        "cpus": 2,
        "memory_gib": 23.5,
        "platform": "Linux-6.18",
        "python": "3.11.7",
        "pyspark": "4.3.0",
        "pyiceberg": "0.12.0",
        "broker": "Tansu (memory storage)",
        "load_average": [1.5, 1.2, 1.0],
    },
    "options": {"events": 1_000_000, "partitions": 4, "batch_records": 200_000},
    "seconds": 901.3,
    "spark_startup_s": 16.1,
    "limit": {"events_per_s": 443_590, "readers": 4},
    "krishiv": {
        "events_per_s": 49_802,
        "seconds": 20.08,
        "commit_s": 0.79,
        "batches": 5,
        "snapshots": 9,
        "windows": 667,
        "orders_counted": 799_122,
    },
    "baseline": {"events_per_s": 58_096, "seconds": 17.21, "batches": 5},
    "spark_scan_only": {"events_per_s": 105_485},
    "events": {"events_per_s": 230_000, "rows_written": 990_000, "seconds": 4.35, "commit_s": 0.5, "vs_limit": 0.518},
    "events_nested": {
        "events_per_s": 120_000,
        "rows_written": 1_000_000,
        "seconds": 8.33,
        "commit_s": 0.6,
        "vs_flat_events": 0.522,
        "shape": "nested orders",
        "measured_apart": {
            "date": "2026-11-28T22:00:00+00:00",
            "commit": "fedcba9876543210fedcba9876543210fedcba98",
            "dirty": False,
            "load_average": [9.5, 8.0, 7.25],
            "repeat": 2,
            "flat_events_per_s": 229_885,
        },
    },
    "ratios": {"krishiv_vs_limit": 0.112, "krishiv_vs_baseline": 0.857},
    "results_agree": True,
    "relay": [
        {
            "catalog": "sqlite",
            "error": None,
            "snapshots": 1010,
            "snapshots_per_s": 21.5,
            "p50_ms": 31.2,
            "p99_ms": 88.4,
            "p50_ms_at_depth": {"100": 22.0, "1000": 61.5},
        }
    ],
    "relay_maintained": [
        {
            "catalog": "postgresql",
            "error": None,
            "snapshots": 2000,
            "p50_ms": 25.0,
            "p99_ms": 70.1,
            "last_commits": 1000,
            "last_p50_ms": 24.1,
            "last_p99_ms": 65.3,
            "conflicts": 7,
            "maintenance": {"keep_last": 100, "every_s": 5.0, "runs": 40, "expired": 1900, "compactions": 38},
        }
    ],
    "freshness": {
        "rate": 1000.0,
        "trigger_interval_s": 1.0,
        "rejects": 58,
        "reject_p50_s": 1.42,
        "reject_p99_s": 3.1,
        "window_p50_s": 1.9,
        "window_p99_s": 3.4,
    },
    "memory": [{"factor": 1, "jvm_mb": 1037.0, "python_workers_mb": 1152.0, "driver_python_mb": 286.0}],
    "scaling": [{"factor": 1, "events": 1_000_000, "seconds": 20.08, "events_per_s": 49_802}],
    "targets": [
        {"name": "relay p99 on sqlite (ms)", "value": 88.4, "target": "<= 250", "met": True},
        {"name": "Krishiv vs baseline", "value": 0.857, "target": ">= 1x", "met": False},
    ],
}


def _page_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "benchmark.md"
    copy.write_text((REPO / "docs" / "benchmark.md").read_text())
    return copy


def test_the_docs_table_is_rendered_from_the_results_and_check_catches_a_hand_edit(tmp_path: Path, capsys):
    results = tmp_path / "latest.json"
    results.write_text(json.dumps(RESULTS))
    page = _page_copy(tmp_path)
    before = page.read_text()
    args = ["--results", str(results), "--page", str(page)]

    assert docs_table.main([*args, "--check"]) == 1, "the page's table is not this JSON's yet"
    assert page.read_text() == before, "--check changes nothing"
    assert docs_table.main(args) == 0
    text = page.read_text()
    table = text[text.index(docs_table.BEGIN) : text.index(docs_table.END)]
    assert "from commit 0123456789ab:" in table and "2 CPUs, 23.5 GiB" in table and "pyiceberg 0.12.0" in table
    assert "| 4 relay on sqlite | p50 31.2 ms, p99 88.4 ms |" in table
    assert "| 4 relay on postgresql, maintained | last 1,000: p50 24.1 ms, p99 65.3 ms |" in table
    assert "| 2 events kind (raw ingestion) | 230,000 ev/s |" in table
    nested_row = next(line for line in table.splitlines() if line.startswith("| 2 events kind, nested orders |"))
    assert "| 120,000 ev/s | 1,000,000 rows in 8.33 s (0.6 s the relay), 0.522 x the flat events kind" in nested_row
    assert "measured apart on 2026-11-28T22:00:00+00:00 from commit fedcba987654, best of 2" in nested_row
    assert "load average 9.5, 8.0, 7.25 at the end, the flat events kind 229,885 ev/s there" in nested_row
    assert "* relay p99 on sqlite (ms): 88.4 (target <= 250): met" in table
    assert "* Krishiv vs baseline: 0.857 (target >= 1x): missed" in table
    outside = before.split(docs_table.BEGIN)[0], before.split(docs_table.END)[1]
    assert text.startswith(outside[0]) and text.endswith(outside[1]), "nothing outside the markers changes"
    assert docs_table.main([*args, "--check"]) == 0

    page.write_text(text.replace("p99 88.4 ms", "p99 80.0 ms"))  # a figure typed in by hand
    capsys.readouterr()
    assert docs_table.main([*args, "--check"]) == 1
    assert "regenerate it with python -m benchmarks.docs_table" in capsys.readouterr().err

    page.write_text("# no markers\n")
    assert docs_table.main(args) == 2
    assert capsys.readouterr().err.count("\n") == 1, "one line, no traceback"


def test_the_committed_docs_table_is_the_committed_results():
    if not docs_table.LATEST.exists():
        pytest.skip("no benchmarks/results/latest.json committed yet")
    assert docs_table.main(["--check"]) == 0, "run python -m benchmarks.docs_table after make bench"


def test_the_nested_figure_measured_apart_replaces_only_events_nested():
    rss = PeakRss(0.0, 0.0, 0.0)
    flat = EventsRun(1_000_000, 4.0, 999_900, 100, 1, 1, rss, 0.3)
    nested = EventsRun(1_000_000, 5.0, 1_000_000, 0, 1, 1, rss, 0.4)
    doc = merged(RESULTS, flat, nested, 3)
    assert {k: v for k, v in doc.items() if k != "events_nested"} == {
        k: v for k, v in RESULTS.items() if k != "events_nested"
    }
    figure = doc["events_nested"]
    assert figure["events_per_s"] == 200_000 and figure["vs_flat_events"] == 0.8 and figure["vs_limit"] is None
    apart = figure["measured_apart"]
    assert apart["flat_events_per_s"] == 250_000 and apart["repeat"] == 3 and apart["date"].endswith("+00:00")
    assert len(apart["load_average"]) == 3 and len(apart["commit"]) == 40
