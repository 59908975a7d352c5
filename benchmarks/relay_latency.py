"""Measurement 4: the commit relay alone, on a given catalog, as the table's history grows.

Stages ``snapshots`` one-window batches (a real Parquet file and a real ledger entry each), then lets the
relay promote them all in one run, as a sensor-started commit run does with a backlog. Latency is the
catalog commit of one entry (manifest, manifest list, metadata and the catalog's pointer swap); commit
``i`` is made with ``i`` snapshots already in the table, which shows how commit time grows with history.
The table is dropped afterwards, so a shared catalog (PostgreSQL) keeps nothing of the bench.

With ``maintenance`` the table is maintained while the relay commits, as a schedule would: a second process
(its own catalog connection, like a Dagster maintenance run) expires snapshots beyond the newest ``keep_last``
(``outbox.expiry``) and compacts small files (``outbox.compaction``) every ``every_s`` seconds. Every
maintenance commit moves the head under the relay, so some relay commits conflict, reload, re-check and retry;
they are counted (the relay's own log line), and a retried commit's latency is that of the attempt that landed.
"""

from __future__ import annotations

import logging
import multiprocessing
import statistics
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks import percentile
from krishiv_core.spec import KrishivSpec

DEPTH_WINDOW = 10  # commits on each side of a depth that its figure is the median of
LAST_COMMITS = 1_000  # the "after N batches" figures are over this many last commits


@dataclass(frozen=True)
class Maintenance:
    """Maintenance beside the relay: expiry keeping the newest ``keep_last`` and compaction, every ``every_s``."""

    every_s: float = 5.0
    keep_last: int = 100
    compact_min_files: int = 50
    target_file_size: int = 128 * 2**20


@dataclass
class MaintenanceRuns:
    runs: int = 0
    expired: int = 0
    compactions: int = 0
    files_compacted: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class RelayResult:
    catalog: str
    address: str
    snapshots: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    error: str | None = None
    maintenance: Maintenance | None = None
    maintained: MaintenanceRuns | None = None
    conflicts: int = 0  # relay commits that lost to a concurrent (maintenance) commit and were retried

    @property
    def snapshots_per_s(self) -> float:
        return self.snapshots / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        return percentile(self.latencies_ms, q) if self.latencies_ms else 0.0

    def last_percentile(self, q: float, last: int = LAST_COMMITS) -> float:
        """The ``q`` quantile of the last ``last`` commits (all of them if there are fewer)."""
        return percentile(self.latencies_ms[-last:], q) if self.latencies_ms else 0.0

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


class _ConflictCounter(logging.Handler):
    """Counts the relay's "conflicted; re-checking" INFO lines (one per lost commit) while the relay's logger is
    switched to INFO and kept from the root; its warnings and errors still reach the root's handlers."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            logging.getLogger().handle(record)
        elif "conflicted" in record.getMessage():
            self.count += 1


def _maintain(spec: KrishivSpec, name: str, maintenance: Maintenance, ready: Any, stop: Any, out: Any) -> None:
    """The maintenance process: says it is ready, then expiry and compaction at once and every ``every_s`` until
    ``stop`` is set (so even a short relay run has one maintenance run beside it)."""
    from krishiv_core.catalog import load_catalog
    from outbox.compaction import compact_table
    from outbox.expiry import expire_snapshots

    done = MaintenanceRuns()
    logging.getLogger("pyiceberg.catalog").setLevel(logging.ERROR)  # old metadata files another writer deleted
    catalog = load_catalog(spec)
    ready.set()
    while True:
        try:
            expired = expire_snapshots(
                lambda: catalog.load_table(name), keep_last=maintenance.keep_last, keep_younger_than_ms=0
            )
            compacted = compact_table(
                catalog.load_table(name),
                target_file_size=maintenance.target_file_size,
                min_files=maintenance.compact_min_files,
            )
        except Exception as exc:  # a lost race beyond the retries is a figure of the run, not its end
            done.errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        else:
            done.runs += 1
            done.expired += len(expired.expired)
            done.compactions += compacted.snapshot_id is not None
            done.files_compacted += compacted.files_rewritten
        if stop.wait(maintenance.every_s):
            break
    out.put(done)


def bench_relay(
    spec: KrishivSpec, label: str, snapshots: int, folder: Path, maintenance: Maintenance | None = None
) -> RelayResult:
    from krishiv_core.catalog import ensure_table, load_catalog, redact
    from krishiv_core.entries import OutboxEntry, new_snapshot_id
    from krishiv_core.tables import aggregate_table_schema
    from outbox.ledger import Ledger
    from outbox.relay import CommitRelay
    from spark_jobs.staging import staging_folder, write_parquet

    address = redact(spec.catalog_uri())
    result = RelayResult(label, address, maintenance=maintenance)
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
        ledger = Ledger(folder / f"relay-{label}{'-maintained' if maintenance else ''}.duckdb")
        query_id = str(uuid.uuid4())
        for batch_id in range(snapshots):
            (staged,) = write_parquet(table, _window_rows(batch_id), staging_folder(table, query_id, batch_id))
            ranges = {pipeline.topic: {"0": [batch_id, batch_id + 1]}}
            entry = OutboxEntry(query_id, pipeline.name, name, batch_id, ranges, (staged,), new_snapshot_id())
            ledger.record_batch([entry])
        conflicts = _ConflictCounter()
        relay_log = logging.getLogger("outbox.relay")
        relay_log.addHandler(conflicts)
        level, relay_log.propagate = relay_log.level, False
        relay_log.setLevel(logging.INFO)
        if maintenance is not None:
            logging.getLogger("pyiceberg.catalog").setLevel(logging.ERROR)  # old metadata the other side deleted
        context = multiprocessing.get_context("spawn")
        ready, stop, out = context.Event(), context.Event(), context.Queue()
        maintainer = None
        if maintenance is not None:
            maintainer = context.Process(
                target=_maintain, args=(spec, name, maintenance, ready, stop, out), daemon=True
            )
            maintainer.start()
            if not ready.wait(timeout=300):
                raise RuntimeError("the maintenance process did not start within 300 s")
        try:
            started = time.perf_counter()
            report = CommitRelay(ledger, catalog, address).commit_table(name)
            result.seconds = time.perf_counter() - started
        finally:
            relay_log.removeHandler(conflicts)
            relay_log.setLevel(level)
            relay_log.propagate = True
            if maintainer is not None:
                stop.set()
                result.maintained = out.get(timeout=600)
                maintainer.join(timeout=60)
        result.snapshots = len(report.committed)
        result.latencies_ms = report.commit_latencies_ms
        result.conflicts = conflicts.count
    finally:
        catalog.drop_table(identifier)  # its files are in the bench folder, removed with it
    return result
