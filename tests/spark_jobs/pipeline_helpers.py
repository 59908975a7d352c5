"""Helpers for the end-to-end tests: run the real pipeline and compare the tables with the oracle."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

from krishiv.broker import LocalBroker
from krishiv.catalog import load_catalog, qualified
from krishiv.chaos.oracle import Expected, expected_output, read_topic
from krishiv.lineage import lineage
from krishiv.operations import commit_pipelines, open_ledger, verify_pipelines
from krishiv.produce import demo_orders, ensure_topic, produce
from krishiv.spec import KrishivSpec

ROOT = Path(__file__).resolve().parents[2]


def produce_orders(
    spec: KrishivSpec, records: int, *, late: int = 0, malformed: int = 0, seed: int = 7, start_ms: int | None = None
) -> None:
    pipeline = spec.pipeline()
    partitions = ensure_topic(spec.kafka.bootstrap_servers, pipeline.topic, spec.kafka.partitions)
    extra = {"start_ms": start_ms} if start_ms is not None else {}
    produce(
        spec.kafka.bootstrap_servers,
        pipeline.topic,
        demo_orders(records, seed=seed, partitions=partitions, late=late, malformed=malformed, **extra),
    )


def krishiv_cli(
    spec_file: Path, *args: str, faults: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run the real ``krishiv`` command in its own process (so it can be killed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KRISHIV_")}
    if faults:
        env["KRISHIV_FAULTS"] = faults
    return subprocess.run(
        [sys.executable, "-m", "krishiv.cli", "--spec", str(spec_file), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def expected_for(spec: KrishivSpec, broker: LocalBroker) -> Expected:
    pipeline = spec.pipeline()
    entries = [e for e in open_ledger(spec).entries(table=qualified(spec, pipeline.table))]
    ends: dict[int, int] = {}
    for e in entries:
        for p, (_s, end) in e.offsets[pipeline.topic].items():
            ends[int(p)] = max(ends.get(int(p), 0), end)
    records = read_topic(broker.bootstrap, pipeline.topic, spec.kafka.partitions, ends)
    return expected_output(records, entries, pipeline.topic, pipeline.window_ms, pipeline.watermark_delay_ms)


def table_windows(spec: KrishivSpec) -> dict[int, dict[str, object]]:
    table = load_catalog(spec).load_table(qualified(spec, spec.pipeline().table))
    rows = table.scan().to_arrow().to_pylist()
    out: dict[int, dict[str, object]] = {}
    for r in rows:
        start = int(r.pop("window_start").timestamp() * 1000)
        assert start not in out, f"window {start} appears twice"
        r.pop("window_end")
        out[start] = r
    return out


def assert_exactly_once(spec: KrishivSpec, broker: LocalBroker) -> Expected:
    """The tables equal the oracle, lineage is linear, the ledger agrees: the whole contract."""
    commit_pipelines(spec, list(spec.pipelines))
    expected = expected_for(spec, broker)
    actual = table_windows(spec)
    assert set(actual) == set(expected.windows), sorted(set(actual) ^ set(expected.windows))
    for start, aggs in expected.windows.items():
        got = {k: (Decimal(v) if isinstance(v, Decimal) else v) for k, v in actual[start].items()}
        assert got == aggs, f"window {start}: table {got} != expected {aggs}"
    pipeline = spec.pipeline()
    rejects = load_catalog(spec).load_table(qualified(spec, pipeline.rejects_table)).scan().to_arrow()
    coords = list(zip(rejects.column("partition").to_pylist(), rejects.column("offset").to_pylist(), strict=True))
    assert len(coords) == len(set(coords)), "a reject is in the rejects table twice"
    assert set(coords) == expected.rejects
    late = {
        e.batch_id: e.metrics["late_events"] for e in open_ledger(spec).entries(table=qualified(spec, pipeline.table))
    }
    assert late == expected.late_by_batch
    for result in verify_pipelines(spec, list(spec.pipelines)):
        assert result.ok, result.violations
    for name in (pipeline.table, pipeline.rejects_table):
        rows = lineage(load_catalog(spec).load_table(qualified(spec, name)))
        batches = [r.batch_id for r in rows]
        assert batches == sorted(set(batches)), f"{name}: batches {batches} are not one snapshot each, in order"
        for before, after in itertools.pairwise(rows):
            assert after.parent_id == before.snapshot_id
    return expected
