"""Measurement 4: the commit relay alone, on a given catalog, as the table's history grows.

Stages ``snapshots`` one-window batches (a real Parquet file and a real ledger entry each), then lets the
relay promote them all in one run, as a sensor-started commit run does with a backlog. Latency is the
catalog commit of one entry (manifest, manifest list, metadata and the catalog's pointer swap); commit
``i`` is made with ``i`` snapshots already in the table, which shows how commit time grows with history.
The table is dropped afterwards, so a shared catalog (PostgreSQL) keeps nothing of the bench.
"""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa

from benchmarks import percentile
from krishiv_core.spec import KrishivSpec

DEPTH_WINDOW = 10  # commits on each side of a depth that its figure is the median of


@dataclass
class RelayResult:
    catalog: str
    address: str
    snapshots: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def snapshots_per_s(self) -> float:
        return self.snapshots / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        return percentile(self.latencies_ms, q) if self.latencies_ms else 0.0

    def at_depth(self, depth: int) -> float | None:
        """Median commit latency with about ``depth`` snapshots already in the table."""
        around = self.latencies_ms[max(0, depth - DEPTH_WINDOW) : depth + DEPTH_WINDOW]
        return statistics.median(around) if len(self.latencies_ms) > depth else None


def _window_rows(batch_id: int) -> pa.Table:
    start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=batch_id)
    return pa.table(
        {
            "window_start": [start],
            "window_end": [start + timedelta(minutes=1)],
            "order_count": [1],
            "amount_total": [None],
        }
    )


def bench_relay(spec: KrishivSpec, label: str, snapshots: int, folder: Path) -> RelayResult:
    from krishiv_core.catalog import ensure_table, load_catalog, redact
    from krishiv_core.entries import OutboxEntry, new_snapshot_id
    from krishiv_core.tables import aggregate_table_schema
    from outbox.ledger import Ledger
    from outbox.relay import CommitRelay
    from spark_jobs.staging import staging_folder, write_parquet

    address = redact(spec.catalog_uri())
    result = RelayResult(label, address)
    pipeline = spec.pipeline()
    identifier = (spec.iceberg.namespace, f"relay_bench_{uuid.uuid4().hex[:12]}")
    name = ".".join(identifier)
    try:
        catalog = load_catalog(spec)
        table = ensure_table(catalog, identifier, aggregate_table_schema(pipeline))
    except Exception as exc:  # a catalog that is not there is a result to print, not a crash of the bench
        result.error = f"catalog at {address} is unreachable: {str(exc).splitlines()[0]}"
        return result
    try:
        ledger = Ledger(folder / f"relay-{label}.duckdb")
        query_id = str(uuid.uuid4())
        for batch_id in range(snapshots):
            (staged,) = write_parquet(table, _window_rows(batch_id), staging_folder(table, query_id, batch_id))
            ranges = {pipeline.topic: {"0": [batch_id, batch_id + 1]}}
            entry = OutboxEntry(query_id, pipeline.name, name, batch_id, ranges, (staged,), new_snapshot_id())
            ledger.record_batch([entry])
        started = time.perf_counter()
        report = CommitRelay(ledger, catalog, address).commit_table(name)
        result.seconds = time.perf_counter() - started
        result.snapshots = len(report.committed)
        result.latencies_ms = report.commit_latencies_ms
    finally:
        catalog.drop_table(identifier)  # its files are in the bench folder, removed with it
    return result
