"""Snapshot expiry through a real catalog (SQLite, and PostgreSQL for the relay's recovery) and the real ledger,
with batches staged directly (no Spark): what is kept, and that the relay's check survives it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog

from krishiv.verify import check_ledger_agreement
from krishiv_core.catalog import METADATA_PROPERTIES, ensure_table
from krishiv_core.entries import COMMITTED, PENDING
from krishiv_core.spec import load_spec
from krishiv_core.tables import aggregate_table_schema
from outbox.expiry import expire_snapshots, protected_snapshot_ids, snapshots_to_expire
from outbox.ledger import Ledger
from outbox.relay import CommitRelay, find_committed
from tests.outbox.test_relay import ROOT, TABLE, DiesBeforeMarking, stage

FAR_FUTURE_MS = int(time.time() * 1000) + 86_400_000  # every snapshot is older than any keep_younger_than below


def _committed(catalog: Catalog, ledger: Ledger, batches: range) -> list[int]:
    entries = [stage(catalog, ledger, b, b) for b in batches]
    assert CommitRelay(ledger, catalog).commit_table(TABLE).committed == list(batches)
    return [e.intended_snapshot_id for e in entries]


def test_keeps_the_newest_and_the_young_and_every_ref(catalog: Catalog, ledger: Ledger) -> None:
    ids = _committed(catalog, ledger, range(6))
    table = catalog.load_table(TABLE)
    table.manage_snapshots().create_tag(ids[0], "audit").commit()
    stamps = {s.snapshot_id: s.timestamp_ms for s in table.snapshots()}

    # Nothing is old enough yet: keep_younger_than keeps every snapshot whatever keep_last says.
    assert snapshots_to_expire(table, keep_last=1, keep_younger_than_ms=3_600_000, now_ms=max(stamps.values())) == []
    # Past the age limit: the newest two, the tagged one; the current one is among the newest.
    assert snapshots_to_expire(table, keep_last=2, keep_younger_than_ms=1, now_ms=FAR_FUTURE_MS) == ids[1:4]
    # A cut-off between snapshots keeps the younger ones even beyond keep_last.
    cutoff_ms = FAR_FUTURE_MS - stamps[ids[2]]
    assert set(snapshots_to_expire(table, keep_last=1, keep_younger_than_ms=cutoff_ms, now_ms=FAR_FUTURE_MS)) == {
        i for i in ids[1:5] if stamps[i] < stamps[ids[2]]
    }

    report = expire_snapshots(
        lambda: catalog.load_table(TABLE), keep_last=2, keep_younger_than_ms=1, now_ms=lambda: FAR_FUTURE_MS
    )
    assert (report.expired, report.kept) == (ids[1:4], 3)
    table = catalog.load_table(TABLE)
    assert {s.snapshot_id for s in table.snapshots()} == {ids[0], ids[4], ids[5]}
    assert protected_snapshot_ids(table) == {ids[0], ids[5]}
    assert table.scan().to_arrow().num_rows == 6, "expiry removes snapshots, never the current rows"
    assert CommitRelay(ledger, catalog).commit_table(TABLE).committed == [], "nothing is committed again"
    for entry in ledger.entries(TABLE):
        assert find_committed(table, entry) is not None, f"batch {entry.batch_id} is still found"
    assert check_ledger_agreement(table, TABLE, ledger) == [], "verify's ledger agreement holds across expiry"


def test_dry_run_expires_nothing(catalog: Catalog, ledger: Ledger) -> None:
    ids = _committed(catalog, ledger, range(3))
    report = expire_snapshots(
        lambda: catalog.load_table(TABLE),
        keep_last=1,
        keep_younger_than_ms=1,
        dry_run=True,
        now_ms=lambda: FAR_FUTURE_MS,
    )
    assert (report.expired, report.kept, report.dry_run) == (ids[:2], 1, True)
    assert len(catalog.load_table(TABLE).snapshots()) == 3


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_relay_restarted_after_a_lost_ledger_update_recovers_an_expired_batch_once(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    uri = request.getfixturevalue("postgres_uri") if backend == "postgresql" else f"sqlite:///{tmp_path}/catalog.db"
    catalog = SqlCatalog("t", uri=uri, warehouse=tmp_path.as_uri())
    ledger = Ledger(tmp_path / "ledger.duckdb")
    _committed(catalog, ledger, range(2))
    lost = stage(catalog, ledger, 2, 2)
    with pytest.raises(KeyboardInterrupt):  # the relay dies between the catalog commit and the ledger update
        CommitRelay(DiesBeforeMarking(str(ledger.path), victim=2), catalog).commit_table(TABLE)
    assert ledger.get("q1", TABLE, 2).status == PENDING
    catalog.load_table(TABLE).append(catalog.load_table(TABLE).scan().to_arrow().slice(0, 0))  # another writer

    report = expire_snapshots(
        lambda: catalog.load_table(TABLE), keep_last=1, keep_younger_than_ms=1, now_ms=lambda: FAR_FUTURE_MS
    )
    assert lost.intended_snapshot_id in report.expired and report.kept == 1
    later = stage(catalog, ledger, 3, 3)

    restarted = CommitRelay(ledger, catalog).commit_table(TABLE)
    assert (restarted.recovered, restarted.committed) == ([2], [3]), "found through the high-water mark"
    assert ledger.get("q1", TABLE, 2).status == COMMITTED
    table = catalog.load_table(TABLE)
    assert table.scan().to_arrow().num_rows == 4, "batches 0-3 once each"
    assert table.current_snapshot().snapshot_id == later.intended_snapshot_id
    assert check_ledger_agreement(table, TABLE, ledger) == []


def test_an_expiry_that_loses_a_race_reloads_and_keeps_the_winner(catalog: Catalog, ledger: Ledger) -> None:
    ids = _committed(catalog, ledger, range(4))
    stale = catalog.load_table(TABLE)
    # Another expiry removes two of the snapshots this one is about to expire, then the relay commits a batch.
    expire_snapshots(
        lambda: catalog.load_table(TABLE), keep_last=3, keep_younger_than_ms=1, now_ms=lambda: FAR_FUTURE_MS
    )
    stage(catalog, ledger, 4, 4)
    assert CommitRelay(ledger, catalog).commit_table(TABLE).committed == [4]
    loads = [stale]

    def load():
        return loads.pop() if loads else catalog.load_table(TABLE)

    report = expire_snapshots(load, keep_last=2, keep_younger_than_ms=1, now_ms=lambda: FAR_FUTURE_MS)
    assert report.expired == ids[1:3], "recomputed on the reloaded table: snapshot 0 was already gone"
    table = catalog.load_table(TABLE)
    assert (
        len(table.snapshots()) == 2
        and table.current_snapshot().snapshot_id == ledger.get("q1", TABLE, 4).committed_snapshot_id
    )
    assert table.scan().to_arrow().num_rows == 5


def test_tables_krishiv_ensures_stop_keeping_every_metadata_file(catalog: Catalog, tmp_path: Path) -> None:
    schema = aggregate_table_schema(load_spec(ROOT / "krishiv.toml", env={}).pipeline())
    created = ensure_table(catalog, ("krishiv", "fresh"), schema)
    assert {k: created.properties[k] for k in METADATA_PROPERTIES} == METADATA_PROPERTIES
    # A table made before these properties (or by another tool) gets the missing ones; a user's own value stays.
    catalog.create_table(("krishiv", "older"), schema, properties={"write.metadata.previous-versions-max": "3"})
    table = ensure_table(catalog, ("krishiv", "older"), schema)
    assert table.properties["write.metadata.delete-after-commit.enabled"] == "true"
    assert table.properties["write.metadata.previous-versions-max"] == "3"
    for _ in range(6):
        table.append(table.scan().to_arrow().slice(0, 0))
    table = catalog.load_table(("krishiv", "older"))
    on_disk = sorted(p.name for p in Path(table.location().removeprefix("file://"), "metadata").glob("*.metadata.json"))
    assert len(table.metadata.metadata_log) == 3 and len(on_disk) == 4, "the log and the current file, no more"
    assert {Path(m.metadata_file).name for m in table.metadata.metadata_log} | {
        Path(table.metadata_location).name
    } == set(on_disk)


def test_expiry_beside_a_committing_relay_loses_and_duplicates_nothing(tmp_path: Path, postgres_uri: str) -> None:
    def catalog() -> SqlCatalog:  # one per thread, as two processes would have
        return SqlCatalog("t", uri=postgres_uri, warehouse=tmp_path.as_uri())

    ledger = Ledger(tmp_path / "ledger.duckdb")
    batches = range(8)
    for b in batches:
        stage(catalog(), ledger, b, b)
    done = threading.Event()
    expired: list[int] = []

    def expire_until_done() -> None:
        expiring = catalog()
        while not done.is_set():
            report = expire_snapshots(lambda: expiring.load_table(TABLE), keep_last=2, keep_younger_than_ms=0)
            expired.extend(report.expired)

    expirer = threading.Thread(target=expire_until_done)
    expirer.start()
    try:
        report = CommitRelay(ledger, catalog()).commit_table(TABLE)
    finally:
        done.set()
        expirer.join(timeout=60)
    assert not expirer.is_alive()
    assert sorted(report.committed + report.recovered) == list(batches)
    expire_snapshots(lambda: catalog().load_table(TABLE), keep_last=2, keep_younger_than_ms=0)
    table = catalog().load_table(TABLE)
    assert expired and len(table.snapshots()) == 2, "expiry ran between the commits"
    assert table.scan().to_arrow().num_rows == len(batches), "every batch once"
    assert all(e.status == COMMITTED for e in ledger.entries(TABLE))
    assert check_ledger_agreement(table, TABLE, ledger) == []
