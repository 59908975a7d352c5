"""A batch written to several tables is committed to all of them at once on SQL catalogs (SQLite, PostgreSQL):
through the relay, against another writer, killed at every step inside the commit, and watched by a reader that
takes every table's pointer in one catalog read. Also the canary of the pyiceberg internals
``outbox/multi_table_commit.py`` relies on."""

from __future__ import annotations

import inspect
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io import load_file_io
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import Table
from sqlalchemy import select
from sqlalchemy.orm import Session

from krishiv_core.entries import COMMITTED, OutboxEntry
from krishiv_core.faults import FAULTS_ENV
from outbox.ledger import Ledger
from outbox.multi_table_commit import (
    ATOMIC,
    TABLE_BY_TABLE,
    DeferredCommits,
    commit_atomically,
    multi_table_commits,
)
from outbox.relay import (
    SUMMARY_BATCH_ID,
    CommitRelay,
    commit_entry,
    high_water_marks,
    high_water_property,
    snapshot_summary,
)
from tests.outbox.test_relay import TABLE, stage

NAMESPACES = ("krishiv", "rejects", "route")  # one batch's tables: three namespaces, the same pipeline and query
TABLES = [f"{ns}.{TABLE.split('.')[1]}" for ns in NAMESPACES]
INSIDE = (
    "relay.multi_table.metadata_written",
    "relay.multi_table.pointer_swapped",
    "relay.multi_table.before_db_commit",
)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def address(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    uri = request.getfixturevalue("postgres_uri") if request.param == "postgresql" else f"sqlite:///{tmp_path}/c.db"
    return uri, tmp_path.as_uri()


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    """A DuckDB ledger only: what is under test is the catalog's transaction (both catalogs run), not the ledger's."""
    return Ledger(str(tmp_path / "ledger.duckdb"))


def sql_catalog(address: tuple[str, str]) -> SqlCatalog:
    return SqlCatalog("t", uri=address[0], warehouse=address[1])


def stage_batch(catalog: Catalog, ledger: Ledger, batch_id: int) -> list[OutboxEntry]:
    return [stage(catalog, ledger, batch_id, batch_id, namespace=ns) for ns in NAMESPACES]


def pointers(catalog: SqlCatalog) -> dict[str, str | None]:
    """Every table's metadata location, in ONE read of the catalog's database (as a reader's cut would be)."""
    with Session(catalog.engine) as session:
        rows = session.execute(
            select(IcebergTables.table_namespace, IcebergTables.table_name, IcebergTables.metadata_location).where(
                IcebergTables.catalog_name == catalog.name
            )
        ).all()
    return {f"{ns}.{name}": location for ns, name, location in rows}


def batches_in(catalog: Catalog, name: str) -> list[int]:
    table = catalog.load_table(name)
    return sorted(int(s.summary[SUMMARY_BATCH_ID]) for s in table.snapshots() if s.summary is not None)


def metadata_files(catalog: Catalog) -> set[str]:
    return {
        p.name
        for name in TABLES
        for p in (Path(catalog.load_table(name).location().removeprefix("file://")) / "metadata").glob("*.json")
    }


def test_sql_catalogs_commit_atomically_and_rest_table_by_table(address) -> None:
    assert multi_table_commits(sql_catalog(address)) == ATOMIC
    from pyiceberg.catalog.rest import RestCatalog

    assert multi_table_commits(RestCatalog.__new__(RestCatalog)) == TABLE_BY_TABLE


def test_the_relay_commits_a_batch_to_all_its_tables_in_one_transaction(address, ledger: Ledger) -> None:
    catalog = sql_catalog(address)
    staged = [*stage_batch(catalog, ledger, 0), *stage_batch(catalog, ledger, 1)]
    before = pointers(catalog)
    relay = CommitRelay(ledger, catalog)
    report = relay.commit_table(TABLES[0])
    assert report.committed == [0, 1]
    assert sorted((r.table, r.committed) for r in relay.also) == [(TABLES[1], [0, 1]), (TABLES[2], [0, 1])]
    for name in TABLES:
        assert batches_in(catalog, name) == [0, 1]
    assert all(ledger.get(e.query_id, e.table, e.batch_id).status == COMMITTED for e in staged)
    after = pointers(catalog)
    assert all(after[t] != before[t] for t in TABLES)
    assert relay.commit_table(TABLES[1]).committed == [], "nothing is left for the other tables"


def test_another_writer_between_planning_and_committing_moves_no_pointer(address, ledger: Ledger) -> None:
    catalog = sql_catalog(address)
    entries = stage_batch(catalog, ledger, 0)
    tables = {e.table: catalog.load_table(e.table) for e in entries}
    deferred = DeferredCommits(catalog)
    for e in entries:
        commit_entry(deferred.table(tables[e.table]), e, snapshot_summary(e), {})
    assert pointers(catalog) == {t: tables[t].metadata_location for t in TABLES}, "recording commits nothing"
    files = metadata_files(catalog)
    other = sql_catalog(address).load_table(TABLES[2])  # another writer moves the last table's head
    other.transaction().set_properties({"note": "moved"}).commit_transaction()
    before = pointers(catalog)

    with pytest.raises(CommitFailedException):
        commit_atomically(catalog, list(deferred.commits.values()))
    assert pointers(catalog) == before, "no pointer moved"
    assert metadata_files(catalog) == files | {Path(before[TABLES[2]] or "").name}, "no metadata file left"

    report = CommitRelay(ledger, catalog).commit_table(TABLES[0])  # the relay re-plans on the new heads
    assert report.committed == [0] and all(batches_in(catalog, t) == [0] for t in TABLES)


def _commit_killed_at(address: tuple[str, str], ledger_path: str, point: str) -> None:
    os.environ[FAULTS_ENV] = f"{point}@1"
    CommitRelay(Ledger(ledger_path), sql_catalog(address)).commit_table(TABLES[0])


@pytest.mark.parametrize("point", INSIDE)
def test_a_relay_killed_inside_the_commit_leaves_every_pointer_or_none(address, ledger: Ledger, point: str) -> None:
    catalog = sql_catalog(address)
    stage_batch(catalog, ledger, 0)
    CommitRelay(ledger, catalog).commit_table(TABLES[0])
    stage_batch(catalog, ledger, 1)
    before = pointers(catalog)
    child = multiprocessing.get_context("spawn").Process(target=_commit_killed_at, args=(address, ledger.path, point))
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL, f"the relay was to be killed at {point}"
    assert pointers(catalog) == before, f"killed at {point}: no pointer moved"

    relay = CommitRelay(ledger, catalog)
    assert relay.commit_table(TABLES[0]).committed == [1]
    for name in TABLES:
        assert batches_in(catalog, name) == [0, 1], name
        assert high_water_marks(catalog.load_table(name)) == {"q1": 1}


def _commit_batches(address: tuple[str, str], ledger_path: str, batches: int, ready) -> None:  # type: ignore[no-untyped-def]
    catalog, ledger = sql_catalog(address), Ledger(ledger_path)
    ready.wait(60)
    for b in range(1, batches + 1):
        stage_batch(catalog, ledger, b)
        CommitRelay(ledger, catalog).run(TABLES)


def test_a_reader_beside_the_relay_never_sees_a_batch_in_some_tables_only(address, ledger: Ledger) -> None:
    """The reader takes every table's pointer in one catalog read, as a user's query over several tables would,
    and reads each table's high-water mark at that cut: all equal, in every observation."""
    catalog = sql_catalog(address)
    stage_batch(catalog, ledger, 0)
    CommitRelay(ledger, catalog).commit_table(TABLES[0])
    batches = 12
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    relay = ctx.Process(target=_commit_batches, args=(address, ledger.path, batches, ready))
    relay.start()
    marks: dict[str, int] = {}  # metadata location -> the batch it holds
    seen: list[tuple[int, ...]] = []
    ready.set()
    deadline = time.monotonic() + 300
    while True:
        finished = not relay.is_alive()
        cut = pointers(catalog)
        for location in cut.values():
            if location and location not in marks:
                metadata = FromInputFile.table_metadata(load_file_io(location=location).new_input(location))
                marks[location] = int(metadata.properties.get(high_water_property("q1"), -1))
        seen.append(tuple(marks[cut[t] or ""] for t in TABLES))
        if finished or time.monotonic() > deadline:
            break
    relay.join(60)
    assert relay.exitcode == 0 and seen[-1] == (batches,) * len(TABLES)
    half = [s for s in seen if len(set(s)) > 1]
    assert not half, f"{len(half)} of {len(seen)} cuts saw a batch in some tables only: {half[:3]}"
    assert len({s[0] for s in seen}) > 2, "the reader watched the batches go by"


def test_canary_pyiceberg_internals_the_multi_table_commit_relies_on() -> None:
    assert {"catalog_name", "table_namespace", "table_name", "metadata_location", "previous_metadata_location"} <= {
        c.name for c in IcebergTables.__table__.columns
    }
    stage = inspect.signature(SqlCatalog._update_and_stage_table).parameters
    assert list(stage)[1:] == ["current_table", "table_identifier", "requirements", "updates"]
    assert list(inspect.signature(SqlCatalog._write_metadata).parameters)[-3:] == ["metadata", "io", "metadata_path"]
    assert "self.catalog.commit_table(self, requirements, updates)" in inspect.getsource(Table._do_commit)
    assert "_delete_old_metadata" in inspect.getsource(Table._do_commit)
    assert hasattr(SqlCatalog, "engine") or "self.engine" in inspect.getsource(SqlCatalog.__init__)


def test_a_table_left_behind_by_a_table_by_table_commit_takes_its_earlier_batch_first(address, ledger: Ledger) -> None:
    """Batch 0 went into the first table only (committed table by table, then a crash): committing batch 1 of the
    first table commits batch 0 of the others first, then batch 1 to all of them at once."""
    catalog = sql_catalog(address)
    first, *_ = stage_batch(catalog, ledger, 0)
    relay = CommitRelay(ledger, catalog)
    relay._commit_batch({first.table: catalog.load_table(first.table)}, [first], {})
    assert [batches_in(catalog, t) for t in TABLES] == [[0], [], []]
    stage_batch(catalog, ledger, 1)

    assert relay.commit_table(TABLES[0]).committed == [1]
    assert sorted((r.table, r.committed) for r in relay.also) == [(TABLES[1], [0, 1]), (TABLES[2], [0, 1])]
    assert [batches_in(catalog, t) for t in TABLES] == [[0, 1]] * 3


def test_other_engines_read_every_table_committed_at_once(tmp_path: Path, ledger: Ledger, other_engines) -> None:
    """polars, DuckDB and daft read each table of batches committed at once as the batches staged it: one window
    row per batch, its ``order_count`` the batch id + 1 (``tests/outbox/test_relay.py``'s ``stage``)."""
    catalog = sql_catalog((f"sqlite:///{tmp_path}/c.db", tmp_path.as_uri()))
    for b in range(2):
        stage_batch(catalog, ledger, b)
    CommitRelay(ledger, catalog).run(TABLES)
    tables = {t.replace(".", "_"): catalog.load_table(t) for t in TABLES}
    assert all(len(t.snapshots()) == 2 for t in tables.values()), "one snapshot per batch in each table"
    read = other_engines.read({n: t.metadata_location for n, t in tables.items()}, tmp_path / "read")
    for name, by_engine in read.items():
        for engine, rows in by_engine.items():
            assert sorted(rows.column("order_count").to_pylist()) == [1, 2], (name, engine)
