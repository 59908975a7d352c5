"""The outbox tests' own catalog and ledger: a SQLite catalog in the test's folder (a module that needs another
catalog, PostgreSQL or several, defines its own ``catalog`` fixture) and a ledger on each of its backends, a DuckDB
file and a PostgreSQL schema (``ledger_location``), so every test that uses it runs once on each.

A few tests keep a DuckDB ledger only (:data:`DUCKDB_LEDGER_ONLY`): one that edits the DuckDB file itself, and one
whose subject is not the ledger and whose second run would cost much.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog

from outbox.ledger import Ledger

#: Tests whose ``ledger`` is a DuckDB file only, by module.
DUCKDB_LEDGER_ONLY: dict[str, frozenset[str]] = {
    # It ages the lease by editing the DuckDB file with DuckDB's own API.
    "test_orphans": frozenset({"test_a_live_stagers_batch_in_progress_is_kept_however_old"}),
    # It waits ~20 s on a catalog that does not answer; the ledger only holds the batch meanwhile.
    "test_relay": frozenset({"test_unreachable_catalog_names_the_address_and_keeps_work_pending"}),
}


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Give the tests of :data:`DUCKDB_LEDGER_ONLY` a DuckDB ledger only."""
    module = metafunc.module.__name__.rpartition(".")[2]
    if metafunc.function.__name__ in DUCKDB_LEDGER_ONLY.get(module, ()) and "ledger_location" in metafunc.fixturenames:
        # A parametrize mark, not a call: the fixture's own parameters give way to a mark naming it.
        metafunc.definition.add_marker(pytest.mark.parametrize("ledger_location", ["duckdb"], indirect=True))


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=tmp_path.as_uri())


@pytest.fixture
def ledger(ledger_location: str) -> Ledger:
    return Ledger(ledger_location)
