"""The outbox tests' own catalog and ledger: a SQLite catalog and a DuckDB ledger in the test's folder (a module
that needs another catalog, PostgreSQL or several, defines its own ``catalog`` fixture)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog

from outbox.ledger import Ledger


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=tmp_path.as_uri())


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.duckdb")
