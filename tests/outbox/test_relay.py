"""The commit relay against a real SQLite catalog, with batches staged directly (no Spark needed)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog

import krishiv_core.faults
from krishiv.verify import check_ledger_agreement, verify_table
from krishiv_core.catalog import ensure_table, load_catalog
from krishiv_core.entries import COMMITTED, PENDING, OutboxEntry, new_snapshot_id
from krishiv_core.errors import CatalogUnavailable
from krishiv_core.faults import FAULTS_ENV, FAULTS_SYNC_ENV
from krishiv_core.runbook import runbook
from krishiv_core.spec import PipelineSpec, load_spec
from krishiv_core.tables import aggregate_table_schema
from outbox.errors import CommittedBatchesMissing, StagedFileMissing
from outbox.ledger import Ledger
from outbox.relay import CommitRelay, TableCommitReport, high_water_marks
from spark_jobs.staging import staging_folder, write_parquet

ROOT = Path(__file__).resolve().parents[2]
TABLE = "krishiv.orders_per_minute"


def stage(
    catalog: Catalog,
    ledger: Ledger,
    batch_id: int,
    minute: int,
    *,
    pipeline: PipelineSpec | None = None,
    namespace: str = "krishiv",
    query_id: str = "q1",
) -> OutboxEntry:
    """One batch of one window row (the repository's pipeline by default), staged beside the table as Spark would,
    and recorded in the ledger."""
    pipeline = pipeline or load_spec(ROOT / "krishiv.toml", env={}).pipeline()
    table = ensure_table(catalog, (namespace, pipeline.table), aggregate_table_schema(pipeline))
    start = datetime(2026, 1, 1, 0, minute, tzinfo=UTC)
    rows = pa.table(
        {
            "window_start": pa.array([start], pa.timestamp("us", tz="UTC")),
            "window_end": pa.array([start.replace(minute=minute + 1)], pa.timestamp("us", tz="UTC")),
            "order_count": pa.array([batch_id + 1], pa.int64()),
            "amount_total": pa.array([Decimal("10.25")], pa.decimal128(22, 2)),
        }
    )
    (staged,) = write_parquet(table, rows, staging_folder(table, query_id, batch_id))
    entry = OutboxEntry(
        query_id,
        pipeline.name,
        f"{namespace}.{pipeline.table}",
        batch_id,
        {"orders": {"0": [batch_id, batch_id + 1]}},
        (staged,),
        new_snapshot_id(),
        {},
    )
    assert ledger.record_batch([entry]) == [True]
    return entry


def test_commits_in_order_one_snapshot_each(catalog: Catalog, ledger: Ledger) -> None:
    entries = [stage(catalog, ledger, b, b) for b in range(3)]
    report = CommitRelay(ledger, catalog).commit_table(TABLE)
    assert report.committed == [0, 1, 2]
    table = catalog.load_table(TABLE)
    ids = [s.snapshot_id for s in table.snapshots()]
    assert ids == [e.intended_snapshot_id for e in entries]
    assert [s.parent_snapshot_id for s in table.snapshots()] == [None, *ids[:-1]]
    assert CommitRelay(ledger, catalog).commit_table(TABLE).committed == [], "a second run commits nothing"


def test_concurrent_writer_conflict_is_rechecked_and_retried(catalog: Catalog, ledger: Ledger, tmp_path) -> None:
    first = stage(catalog, ledger, 0, 0)
    relay = CommitRelay(ledger, catalog)
    relay.commit_table(TABLE)
    entry = stage(catalog, ledger, 1, 1)
    stale = catalog.load_table(TABLE)
    # Another writer commits between the relay's load and its commit.
    other = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=tmp_path.as_uri())
    other.load_table(TABLE).append(stale.scan().to_arrow().slice(0, 0))
    foreign = other.load_table(TABLE).current_snapshot()
    assert foreign is not None and foreign.snapshot_id != first.intended_snapshot_id

    report = TableCommitReport(TABLE)
    relay._commit_batch({TABLE: stale}, [entry], {TABLE: report})
    assert report.committed == [1]
    table = catalog.load_table(TABLE)
    head = table.current_snapshot()
    assert head is not None and head.snapshot_id == entry.intended_snapshot_id
    assert head.parent_snapshot_id == foreign.snapshot_id, "the retry is the child of the winning commit"
    assert ledger.get("q1", TABLE, 1).status == COMMITTED


class DiesBeforeMarking(Ledger):
    """A ledger whose process dies between the catalog commit and the ledger update of one batch."""

    def __init__(self, path: str, victim: int) -> None:
        super().__init__(path)
        self.victim = victim

    def mark_committed(self, entry: OutboxEntry, snapshot_id: int | None, *who: object) -> int | None:
        if entry.batch_id == self.victim:
            raise KeyboardInterrupt(f"killed after committing batch {entry.batch_id}")
        return super().mark_committed(entry, snapshot_id, *who)  # type: ignore[arg-type]


def test_a_commit_whose_snapshot_expired_behind_another_writers_is_found(catalog: Catalog, ledger: Ledger) -> None:
    """The relay dies after the catalog commit of batch 1; another writer appends; expiry removes every snapshot
    of Krishiv's. On restart the batch is recognised from the table's high-water property: nothing twice."""
    for b in range(2):
        stage(catalog, ledger, b, b)
    with pytest.raises(KeyboardInterrupt):
        CommitRelay(DiesBeforeMarking(ledger.path, victim=1), catalog).commit_table(TABLE)
    assert ledger.get("q1", TABLE, 1).status == PENDING
    table = catalog.load_table(TABLE)
    assert high_water_marks(table) == {"q1": 1}, "the mark moves in the same metadata commit as the snapshot"
    table.append(table.scan().to_arrow().slice(0, 1))  # a user's backfill at the head
    table = catalog.load_table(TABLE)
    table.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in table.snapshots()[:-1]]).commit()
    assert [s.summary.get("krishiv.query-id") for s in catalog.load_table(TABLE).snapshots()] == [None]

    report = CommitRelay(ledger, catalog).commit_table(TABLE)
    assert (report.committed, report.recovered) == ([], [1])
    assert ledger.get("q1", TABLE, 1).status == COMMITTED
    assert catalog.load_table(TABLE).scan().to_arrow().num_rows == 3, "two batches and the backfill, once each"
    assert check_ledger_agreement(catalog.load_table(TABLE), TABLE, ledger) == [], "verify reads the mark too"


def test_verify_does_not_report_a_commit_caught_between_catalog_and_ledger(catalog: Catalog, ledger: Ledger) -> None:
    """A committer marks the ledger right after the catalog commit; verify reading in between sees a snapshot whose
    entry is PENDING. It looks again (``settled``) and reports only what stays: a relay that stopped there."""
    stage(catalog, ledger, 0, 0)
    with pytest.raises(KeyboardInterrupt):
        CommitRelay(DiesBeforeMarking(ledger.path, victim=0), catalog).commit_table(TABLE)
    entry = ledger.get("q1", TABLE, 0)
    assert entry is not None and entry.status == PENDING
    marker = threading.Timer(0.2, lambda: ledger.mark_committed(entry, entry.intended_snapshot_id))
    marker.start()  # the committer's mark, landing while verify looks
    try:
        assert verify_table(catalog.load_table(TABLE), TABLE, ledger).violations == []
    finally:
        marker.join()

    stage(catalog, ledger, 1, 1)
    with pytest.raises(KeyboardInterrupt):
        CommitRelay(DiesBeforeMarking(ledger.path, victim=1), catalog).commit_table(TABLE)
    stopped = verify_table(catalog.load_table(TABLE), TABLE, ledger).violations  # nobody marks it: it stays
    assert any("ledger does not list as COMMITTED" in v for v in stopped), stopped


def test_a_table_with_no_trace_of_committed_batches_stops_the_relay(catalog: Catalog, ledger: Ledger) -> None:
    stage(catalog, ledger, 0, 0)
    CommitRelay(ledger, catalog).commit_table(TABLE)
    catalog.drop_table(TABLE)  # dropped and re-created: batch 0 is gone from the table
    entry = stage(catalog, ledger, 1, 1)
    with pytest.raises(CommittedBatchesMissing, match=r"no trace of query q1 .* batches up to 0 as COMMITTED") as info:
        CommitRelay(ledger, catalog).commit_table(TABLE)
    assert str(info.value).endswith("(see docs/operations.md: Recovery runbook > A catalog that is missing)")
    assert ledger.get("q1", TABLE, 1).status == PENDING
    assert catalog.load_table(TABLE).metadata.snapshot_by_id(entry.intended_snapshot_id) is None


def test_missing_staged_file_stops_without_committing(catalog: Catalog, ledger: Ledger) -> None:
    entry = stage(catalog, ledger, 0, 0)
    Path(entry.files[0].path.removeprefix("file://")).unlink()
    with pytest.raises(StagedFileMissing, match="missing") as info:
        CommitRelay(ledger, catalog).commit_table(TABLE)
    assert str(info.value).endswith("`krishiv restage` stages the batch again " + runbook("A staged file that is gone"))
    assert ledger.get("q1", TABLE, 0).status == PENDING
    assert catalog.load_table(TABLE).current_snapshot() is None


def test_unreachable_catalog_names_the_address_and_keeps_work_pending(
    tmp_path: Path, catalog: Catalog, ledger: Ledger
) -> None:
    from krishiv.broker import free_port
    from krishiv_core.spec import parse_spec

    entry = stage(catalog, ledger, 0, 0)
    port = free_port()
    spec = parse_spec(
        {
            "iceberg": {
                "catalog_uri": f"postgresql+psycopg://postgres@127.0.0.1:{port}/nowhere",
                "warehouse": tmp_path.as_uri(),
            },
            "pipelines": [
                {
                    "name": "p",
                    "topic": "orders",
                    "event_time_field": "t",
                    "fields": {"t": "timestamp_ms"},
                    "aggregations": [{"name": "n", "function": "count"}],
                }
            ],
        },
        env={},
    )
    with pytest.raises(CatalogUnavailable, match=f"127.0.0.1:{port}"):
        CommitRelay(ledger, lambda: load_catalog(spec)).commit_table(TABLE)
    assert ledger.get("q1", TABLE, 0).status == PENDING

    # When the catalog is back, the same entry completes.
    assert CommitRelay(ledger, catalog).commit_table(TABLE).committed == [0]
    assert catalog.load_table(TABLE).current_snapshot().snapshot_id == entry.intended_snapshot_id


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_committer_that_loaded_a_fresh_table_before_another_committed_is_not_refused(
    tmp_path: Path, ledger: Ledger, backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two committers on a fresh table: the first loads it (no snapshot yet) and is held there by a fault point; the
    second commits and marks both batches. The first then sees COMMITTED batches in the ledger and a table with no
    trace of them, which is what fail-closed guards against, but its table is only stale: it reloads and finds them."""
    uri = f"sqlite:///{tmp_path}/catalog.db" if backend == "sqlite" else request.getfixturevalue("postgres_uri")

    def open_catalog() -> Catalog:
        return SqlCatalog("t", uri=uri, warehouse=tmp_path.as_uri())

    for b in range(2):
        stage(open_catalog(), ledger, b, b)
    sync = tmp_path / "sync"
    sync.mkdir()
    monkeypatch.setenv(FAULTS_ENV, "relay.table_loaded@0:pause")
    monkeypatch.setenv(FAULTS_SYNC_ENV, str(sync))
    monkeypatch.setattr(krishiv_core.faults, "_fired", set())
    outcome: dict[str, object] = {}

    def first() -> None:
        try:
            relay = CommitRelay(Ledger(ledger.path), open_catalog(), committed_by="first")
            outcome["report"] = relay.commit_table(TABLE)
        except BaseException as exc:  # reported by the test
            outcome["error"] = exc

    racer = threading.Thread(target=first, daemon=True)
    racer.start()
    deadline = time.monotonic() + 30
    while not (sync / "relay.table_loaded@0.reached").exists():
        assert time.monotonic() < deadline and racer.is_alive(), "the first committer never loaded the table"
        time.sleep(0.02)
    assert CommitRelay(ledger, open_catalog(), committed_by="second").commit_table(TABLE).committed == [0, 1]
    (sync / "relay.table_loaded@0.go").touch()
    racer.join(30)
    assert not racer.is_alive() and "error" not in outcome, outcome.get("error")
    report = outcome["report"]
    assert isinstance(report, TableCommitReport) and (report.committed, report.recovered) == ([], [0, 1])
    snapshots = open_catalog().load_table(TABLE).snapshots()
    assert [s.summary["krishiv.batch-id"] for s in snapshots] == ["0", "1"], "each batch once"
    assert [c.committed_by for c in ledger.commits_since(-1, [TABLE])] == ["second", "second"]
