"""Orphan-file removal through a real SQLite catalog and the real ledger, batches staged directly (no Spark): what a
retained snapshot, the metadata or a PENDING entry refers to stays, and so does anything younger than the grace."""

from __future__ import annotations

import os
import time
from pathlib import Path

import duckdb
import pytest
from pyiceberg.catalog import Catalog

from krishiv_core.entries import PENDING
from krishiv_core.spec import load_spec
from outbox.expiry import expire_snapshots
from outbox.ledger import Ledger
from outbox.orphans import GraceTooShort, in_flight_files, referenced_files, remove_orphans, staging_root
from outbox.relay import CommitRelay
from spark_jobs import staging
from tests.outbox.test_relay import ROOT, TABLE, stage

DAY_S = 86_400.0


def local(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


def test_the_staging_folder_is_the_stagers(catalog: Catalog, ledger: Ledger) -> None:
    stage(catalog, ledger, 0, 0)
    table = catalog.load_table(TABLE)
    assert staging_root(table) == staging.staging_root(table)


def test_removes_what_nothing_refers_to_after_expiry_and_a_rewrite(catalog: Catalog, ledger: Ledger) -> None:
    committed = [stage(catalog, ledger, b, b) for b in range(3)]
    assert CommitRelay(ledger, catalog).commit_table(TABLE).committed == [0, 1, 2]
    table = catalog.load_table(TABLE)
    rows = table.scan().to_arrow()
    table.overwrite(rows)  # another writer rewrites every row: the staged files of batches 0-2 leave the head
    pending = stage(catalog, ledger, 3, 3)
    expire_snapshots(lambda: catalog.load_table(TABLE), keep_last=1, keep_younger_than_ms=1, now_ms=lambda: 2**62)
    root = local(staging_root(catalog.load_table(TABLE)))
    dead = root / "query=dead" / "batch=000000000009" / "part-0.parquet"
    dead.parent.mkdir(parents=True)
    dead.write_bytes(b"left by a stager killed before its ledger write")
    young = root / "part-young.parquet"
    young.write_bytes(b"a stager may be about to record this")
    now = time.time() + 2 * DAY_S  # everything written so far is past a one-day grace ...
    os.utime(young, (now - 60, now - 60))  # ... but this one

    def run(dry_run: bool):
        return remove_orphans(
            lambda: catalog.load_table(TABLE),
            lambda: [f.path for e in ledger.pending(TABLE) for f in e.files],
            grace_s=DAY_S,
            dry_run=dry_run,
            now_s=now,
        )

    listed_before = sorted(p for p in local(catalog.load_table(TABLE).location()).rglob("*") if p.is_file())
    dry = run(dry_run=True)
    assert sorted(p for p in local(catalog.load_table(TABLE).location()).rglob("*") if p.is_file()) == listed_before
    sizes = {p: local(p).stat().st_size for p in dry.removed}
    report = run(dry_run=False)
    assert sorted(report.removed) == sorted(dry.removed) and not any(Path(local(p)).exists() for p in report.removed)
    removed = {local(p) for p in report.removed}
    assert dead in removed and young not in removed and young.exists() and report.young == 1
    assert {local(f.path) for e in committed for f in e.files} <= removed, "committed, rewritten, expired: orphans"
    assert all(local(f.path).exists() for f in pending.files), "a PENDING entry's files stay, however old"
    table = catalog.load_table(TABLE)
    assert all(local(p).exists() for p in referenced_files(table)), "every file the table refers to stays"
    assert report.removed_bytes == sum(sizes.values()) > 0
    assert report.listed == report.referenced + report.young + len(report.removed)

    assert table.scan().to_arrow().num_rows == 3, "the table still reads"
    result = CommitRelay(ledger, catalog).commit_table(TABLE)
    assert (result.committed, result.recovered) == ([3], []), "only the pending batch is committed"
    assert ledger.get("q1", TABLE, 3).status != PENDING
    assert catalog.load_table(TABLE).scan().to_arrow().num_rows == 4


def test_a_grace_below_the_floor_is_refused_unless_forced(catalog: Catalog, ledger: Ledger) -> None:
    stage(catalog, ledger, 0, 0)
    stray = local(staging_root(catalog.load_table(TABLE))) / "stray.parquet"
    stray.write_bytes(b"x")

    def run(**options):
        return remove_orphans(
            lambda: catalog.load_table(TABLE),
            lambda: [f.path for e in ledger.pending(TABLE) for f in e.files],
            grace_s=0,
            **options,
        )

    with pytest.raises(GraceTooShort, match="grace period 0s is below 10m"):
        run()
    assert stray.exists()
    report = run(force=True)
    assert [local(p) for p in report.removed] == [stray] and not stray.exists(), "batch 0 is PENDING: kept"


def test_a_live_stagers_batch_in_progress_is_kept_however_old(catalog: Catalog, ledger: Ledger) -> None:
    """A stager that took its lease three hours ago writes a batch that has taken two hours so far: its files are
    older than the one-hour grace, yet kept while the lease is live. Its old leftovers still go: a file of a batch
    already committed, and one a stager killed before this one started left behind. Once the lease is released
    (the stager stopped without recording the batch), the batch's files are orphans too."""
    stage(catalog, ledger, 0, 0)
    stage(catalog, ledger, 1, 1)
    assert CommitRelay(ledger, catalog).commit_table(TABLE).committed == [0, 1]
    pipeline = load_spec(ROOT / "krishiv.toml", env={}).pipeline().name
    lease = ledger.acquire_lease(pipeline, "krishiv run", ttl_s=600)
    with duckdb.connect(str(ledger.path)) as con:  # the stager started three hours ago
        con.execute("UPDATE stager_lease SET acquired_at = acquired_at - INTERVAL 3 HOUR")
    root = local(staging_root(catalog.load_table(TABLE)))
    now = time.time()

    def write(relative: str, age_s: float, under: Path = root) -> Path:
        path = under / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"rows")
        os.utime(path, (now - age_s, now - age_s))
        return path

    writing = [write("query=q1/batch=000000000002/part-a.parquet", 2 * 3600)]
    writing.append(write("query=q2/batch=000000000000/day=2026-01-01/part-b.parquet", 2 * 3600))  # a new query
    leftovers = [
        write("query=q1/batch=000000000001/part-replayed.parquet", 2 * 3600),  # batch 1 is committed
        write("query=dead/batch=000000000007/part-c.parquet", 5 * 3600),  # before this stager's lease
        write("data/part-of-a-killed-compaction.parquet", 2 * 3600, local(catalog.load_table(TABLE).location())),
    ]

    def run():
        return remove_orphans(
            lambda: catalog.load_table(TABLE),
            lambda: [f.path for e in ledger.pending(TABLE) for f in e.files],
            grace_s=3600,
            in_flight=lambda: in_flight_files(ledger, pipeline, TABLE),  # the table's location and staging folder
        )

    report = run()
    assert sorted(local(p) for p in report.removed) == sorted(leftovers)
    assert all(p.exists() for p in writing) and report.in_flight == 2
    assert CommitRelay(ledger, catalog).commit_table(TABLE).committed == [], "the committed batches still read"

    ledger.release_lease(lease)
    report = run()
    assert sorted(local(p) for p in report.removed) == sorted(writing) and report.in_flight == 0
    assert catalog.load_table(TABLE).scan().to_arrow().num_rows == 2
