"""The private pyiceberg hook: snapshots get the id chosen at staging time, on a real SQLite catalog.

These tests break if pyiceberg renames ``_SnapshotProducer._snapshot_id`` or stops using it for the
snapshot it commits; ``outbox/snapshot_producer.py`` is then the one place to fix.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

from krishiv_core.catalog import TABLE_PROPERTIES, ensure_table
from krishiv_core.entries import OutboxEntry, StagedFile, new_snapshot_id
from krishiv_core.spec import load_spec
from krishiv_core.tables import aggregate_table_schema, rejects_table_schema
from outbox.relay import (
    SUMMARY_BATCH_ID,
    SUMMARY_HIGH_WATER,
    SUMMARY_OFFSETS,
    SUMMARY_PIPELINE,
    SUMMARY_QUERY_ID,
    find_committed,
    snapshot_summary,
)
from outbox.snapshot_producer import MetadataCachingTransaction, fast_append
from spark_jobs.staging import staging_folder, staging_root, write_parquet

REPO_SPEC = Path(__file__).resolve().parents[2] / "krishiv.toml"
IDENTIFIER = ("krishiv", "orders_per_minute")
QUERY_ID = "3f2b9c1e-query"
EXPIRED = -1
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    return SqlCatalog("t", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=warehouse.as_uri())


@pytest.fixture
def table(catalog: SqlCatalog) -> Table:
    pipeline = load_spec(REPO_SPEC, env={}).pipeline()
    return ensure_table(catalog, IDENTIFIER, aggregate_table_schema(pipeline))


def _windows(batch_id: int, windows: int = 3) -> pa.Table:
    """Closed one-minute windows of one batch, in the columns of the repository spec's table."""
    starts = [T0 + timedelta(minutes=batch_id * 10 + n) for n in range(windows)]
    return pa.table(
        {
            # Deliberately in another order and other widths than the table: write_parquet casts.
            "amount_total": pa.array(
                [Decimal(f"{batch_id * 100 + n}.25") for n in range(windows)], pa.decimal128(22, 2)
            ),
            "order_count": pa.array([batch_id * 10 + n + 1 for n in range(windows)], pa.int32()),
            "window_end": pa.array([s + timedelta(minutes=1) for s in starts], pa.timestamp("us", tz="UTC")),
            "window_start": pa.array(starts, pa.timestamp("us", tz="UTC")),
        }
    )


def _stage(table: Table, batch_id: int, windows: int = 3) -> tuple[StagedFile, DataFile]:
    (staged,) = write_parquet(table, _windows(batch_id, windows), staging_folder(table, QUERY_ID, batch_id))
    return staged, parquet_file_to_data_file(table.io, table.metadata, staged.path)


def _entry(batch_id: int, staged: StagedFile, intended_snapshot_id: int) -> OutboxEntry:
    return OutboxEntry(
        query_id=QUERY_ID,
        pipeline="orders_per_minute",
        table="orders_per_minute",
        batch_id=batch_id,
        offsets={"orders": {"0": [batch_id * 100, batch_id * 100 + 100]}},
        files=(staged,),
        intended_snapshot_id=intended_snapshot_id,
    )


def _commit(table: Table, batch_id: int) -> tuple[OutboxEntry, int]:
    staged, data_file = _stage(table, batch_id)
    snapshot_id = new_snapshot_id()
    entry = _entry(batch_id, staged, snapshot_id)
    assert fast_append(table, [data_file], snapshot_id=snapshot_id, summary=snapshot_summary(entry)) is table
    return entry, snapshot_id


# ------------------------------------------------------------------------------------------- the hook


def test_producer_still_has_the_private_snapshot_id(table: Table) -> None:
    producer = table.transaction().update_snapshot().fast_append()
    assert isinstance(producer._snapshot_id, int)
    assert producer.snapshot_id == producer._snapshot_id


def test_the_transaction_copies_the_metadata_once_per_state(catalog: SqlCatalog, table: Table) -> None:
    """pyiceberg deep-copies the whole history on every read of ``table_metadata``; ours once per state, and a
    staged update or a commit (new table metadata) gives a fresh one."""
    for batch_id in range(3):
        _commit(table, batch_id)
    tx = MetadataCachingTransaction(table)
    first = tx.table_metadata
    assert first is table.metadata, "nothing staged: the table's own metadata, not a copy"
    assert (
        first.snapshots == table.metadata.snapshots and first.current_snapshot_id == table.metadata.current_snapshot_id
    )
    tx.set_properties(owner="krishiv")
    staged = tx.table_metadata
    assert staged is not first and staged.properties["owner"] == "krishiv"
    assert tx.table_metadata is staged, "one copy per state of the staged updates"
    tx.commit_transaction()
    assert catalog.load_table(IDENTIFIER).properties["owner"] == "krishiv"
    assert len(table.snapshots()) == 3


def test_new_snapshot_ids_are_positive_63_bit() -> None:
    ids = {new_snapshot_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(0 < i < 2**63 for i in ids)


def test_fast_append_commits_the_chosen_id(catalog: SqlCatalog, table: Table) -> None:
    assert table.properties["commit.retry.num-retries"] == TABLE_PROPERTIES["commit.retry.num-retries"]
    assert table.current_snapshot() is None

    staged, data_file = _stage(table, 0)
    assert staged.records == 3 and staged.bytes > 0
    assert not staged.path.startswith(table.location() + "/"), (
        "staged beside the table, where orphan removal never looks"
    )
    assert staged.path.startswith(staging_root(table) + "/")
    snapshot_id = new_snapshot_id()
    entry = _entry(0, staged, snapshot_id)
    summary = snapshot_summary(entry)

    fast_append(table, [data_file], snapshot_id=snapshot_id, summary=summary)

    for view in (table, catalog.load_table(IDENTIFIER)):
        current = view.current_snapshot()
        assert current is not None
        assert current.snapshot_id == snapshot_id
        assert current.parent_snapshot_id is None  # the table had no head before
        assert current.summary is not None
        for key, value in summary.items():
            assert current.summary[key] == value
        assert current.summary.operation == Operation.APPEND
        assert current.summary["added-records"] == "3"
        assert current.summary["added-data-files"] == "1"
        assert [s.snapshot_id for s in view.snapshots()] == [snapshot_id]

    rows = catalog.load_table(IDENTIFIER).scan().to_arrow().sort_by("window_start")
    assert rows.num_rows == 3
    assert rows.column("order_count").to_pylist() == [1, 2, 3]
    assert rows.column("amount_total").to_pylist() == [Decimal("0.25"), Decimal("1.25"), Decimal("2.25")]
    assert rows.column("window_start").to_pylist() == [T0 + timedelta(minutes=n) for n in range(3)]

    # The data file registered is the staged file, in place.
    files = [t.file.file_path for t in catalog.load_table(IDENTIFIER).scan().plan_files()]
    assert files == [staged.path]


def test_second_fast_append_gets_its_own_id_with_the_first_as_parent(catalog: SqlCatalog, table: Table) -> None:
    first_entry, first_id = _commit(table, 0)
    second_entry, second_id = _commit(table, 1)
    assert first_id != second_id

    reloaded = catalog.load_table(IDENTIFIER)
    head = reloaded.current_snapshot()
    assert head is not None
    assert head.snapshot_id == second_id
    assert head.parent_snapshot_id == first_id
    first = reloaded.snapshot_by_id(first_id)
    assert first is not None and first.parent_snapshot_id is None
    assert first.summary is not None and first.summary[SUMMARY_BATCH_ID] == "0"
    assert head.summary is not None
    assert head.summary[SUMMARY_BATCH_ID] == "1"
    assert head.summary[SUMMARY_HIGH_WATER] == "1"
    assert head.summary[SUMMARY_QUERY_ID] == QUERY_ID
    assert head.summary[SUMMARY_PIPELINE] == "orders_per_minute"
    assert head.summary[SUMMARY_OFFSETS] == '{"orders":{"0":[100,200]}}'
    assert head.summary["total-records"] == "6"
    assert reloaded.scan().to_arrow().num_rows == 6
    assert reloaded.scan(snapshot_id=first_id).to_arrow().num_rows == 3
    assert first_entry.batch_id == 0 and second_entry.batch_id == 1


def test_fast_append_after_an_ordinary_append_chains_to_it(catalog: SqlCatalog, table: Table) -> None:
    table.append(
        _windows(7)
        .select(["window_start", "window_end", "order_count", "amount_total"])
        .cast(table.schema().as_arrow())
    )
    previous = table.current_snapshot()
    assert previous is not None

    _, snapshot_id = _commit(table, 8)

    head = catalog.load_table(IDENTIFIER).current_snapshot()
    assert head is not None
    assert head.snapshot_id == snapshot_id
    assert head.parent_snapshot_id == previous.snapshot_id


def test_fast_append_with_a_used_id_leaves_the_table_as_it_was(catalog: SqlCatalog, table: Table) -> None:
    _, first_id = _commit(table, 0)
    _, data_file = _stage(table, 1)

    with pytest.raises(ValueError, match=str(first_id)):
        fast_append(table, [data_file], snapshot_id=first_id, summary={"krishiv.batch-id": "1"})

    reloaded = catalog.load_table(IDENTIFIER)
    assert [s.snapshot_id for s in reloaded.snapshots()] == [first_id]
    assert reloaded.scan().to_arrow().num_rows == 3


def test_fast_append_on_the_rejects_table(catalog: SqlCatalog) -> None:
    rejects = ensure_table(catalog, ("krishiv", "orders_per_minute_rejects"), rejects_table_schema())
    rows = pa.table(
        {
            "topic": ["orders", "orders"],
            "partition": pa.array([0, 3], pa.int32()),
            "offset": pa.array([17, 42], pa.int64()),
            "kafka_timestamp": pa.array([T0, None], pa.timestamp("us", tz="UTC")),
            "key": pa.array([b"k1", None], pa.binary()),
            "value": pa.array([b"{not json", b'{"amount": "x"}'], pa.binary()),
            "reason": ["malformed JSON", "amount is not a decimal"],
            "batch_id": pa.array([0, 0], pa.int64()),
        }
    )
    (staged,) = write_parquet(rejects, rows, staging_folder(rejects, QUERY_ID, 0))
    data_file = parquet_file_to_data_file(rejects.io, rejects.metadata, staged.path)
    snapshot_id = new_snapshot_id()

    fast_append(rejects, [data_file], snapshot_id=snapshot_id, summary={SUMMARY_QUERY_ID: QUERY_ID})

    reloaded = catalog.load_table(("krishiv", "orders_per_minute_rejects"))
    assert reloaded.current_snapshot().snapshot_id == snapshot_id  # type: ignore[union-attr]
    got = reloaded.scan().to_arrow().sort_by("offset")
    assert got.column("reason").to_pylist() == ["malformed JSON", "amount is not a decimal"]
    assert got.column("key").to_pylist() == [b"k1", None]


# ------------------------------------------------------------------------------------------- find_committed


def test_find_committed_by_intended_snapshot_id(table: Table) -> None:
    e0, s0 = _commit(table, 0)
    e1, s1 = _commit(table, 1)
    staged, _ = _stage(table, 2)
    e2 = _entry(2, staged, new_snapshot_id())

    assert find_committed(table, e0) == s0
    assert find_committed(table, e1) == s1
    assert find_committed(table, e2) is None


def test_find_committed_by_high_water_mark_after_expiry(catalog: SqlCatalog, table: Table) -> None:
    e0, s0 = _commit(table, 0)
    e1, s1 = _commit(table, 1)
    staged, _ = _stage(table, 2)
    e2 = _entry(2, staged, new_snapshot_id())

    table.maintenance.expire_snapshots().by_id(s0).commit()

    reloaded = catalog.load_table(IDENTIFIER)
    assert reloaded.snapshot_by_id(s0) is None
    head = reloaded.current_snapshot()
    assert head is not None and head.snapshot_id == s1  # the current snapshot was kept
    assert reloaded.scan().to_arrow().num_rows == 6  # and with it every row

    # Batch 0's snapshot is gone, but batch 1 of the same query is at a high-water mark past it.
    assert find_committed(reloaded, e0) == EXPIRED
    assert find_committed(reloaded, e1) == s1
    assert find_committed(reloaded, e2) is None


def test_find_committed_walks_back_to_an_older_snapshot_of_the_batch(catalog: SqlCatalog, table: Table) -> None:
    e0, s0 = _commit(table, 0)
    _, s1 = _commit(table, 1)
    # The relay found batch 0's snapshot under another id (say a retry that chose a new one):
    moved = _entry(0, e0.files[0], new_snapshot_id())
    assert find_committed(catalog.load_table(IDENTIFIER), moved) == s0
    assert s1 != s0


def test_find_committed_ignores_other_queries(table: Table) -> None:
    _commit(table, 0)
    staged, _ = _stage(table, 0)
    other = OutboxEntry(
        query_id="another-query",
        pipeline="orders_per_minute",
        table="orders_per_minute",
        batch_id=0,
        offsets={"orders": {"0": [0, 100]}},
        files=(staged,),
        intended_snapshot_id=new_snapshot_id(),
    )
    assert find_committed(table, other) is None
