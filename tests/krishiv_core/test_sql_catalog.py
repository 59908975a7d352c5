"""The SQL catalog Krishiv loads (``krishiv_core/sql_catalog.py``) and its copy-free metadata updates
(``krishiv_core/table_metadata.py``), on real SQLite and PostgreSQL catalogs.

The speed-up must not change what a commit does: the updates give pyiceberg's metadata, a cached metadata file
is exactly what the file holds, another writer's commit is seen on the next load, and the catalog's optimistic
check still refuses a commit built on a head that moved.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import Table
from pyiceberg.table.update import update_table_metadata

from krishiv_core.catalog import ensure_table, load_catalog
from krishiv_core.spec import KrishivSpec, load_spec
from krishiv_core.sql_catalog import METADATA_FILES, KrishivSqlCatalog, MetadataFileCache
from krishiv_core.table_metadata import updated_metadata
from krishiv_core.tables import aggregate_table_schema

REPO_SPEC = Path(__file__).resolve().parents[2] / "krishiv.toml"
IDENTIFIER = ("krishiv", "orders_per_minute")


def _spec(tmp_path: Path, catalog_uri: str) -> KrishivSpec:
    env = {"KRISHIV_ICEBERG_CATALOG_URI": catalog_uri, "KRISHIV_ICEBERG_WAREHOUSE": str(tmp_path / "warehouse")}
    return load_spec(REPO_SPEC, env=env)


def _rows(n: int) -> pa.Table:
    start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=n)
    return pa.Table.from_pylist(
        [{"window_start": start, "window_end": start + timedelta(minutes=1), "order_count": n, "amount_total": None}]
    )


def _append(table: Table, n: int) -> None:
    table.append(_rows(n).cast(table.schema().as_arrow()))


def _from_file(table: Table) -> object:
    return FromInputFile.table_metadata(table.io.new_input(table.metadata_location))


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> KrishivSpec:
    if request.param == "sqlite":
        return _spec(tmp_path, f"sqlite:///{tmp_path}/catalog.db")
    return _spec(tmp_path, request.getfixturevalue("postgres_uri"))


def test_updates_give_pyicebergs_metadata_and_share_the_history(tmp_path: Path) -> None:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=tmp_path.as_uri())
    table = ensure_table(catalog, IDENTIFIER, aggregate_table_schema(load_spec(REPO_SPEC, env={}).pipeline()))
    for n in range(3):
        _append(table, n)
    tx = table.transaction()
    tx.set_properties({"krishiv.high-water.q": "7"})
    tx.append(_rows(3).cast(table.schema().as_arrow()))
    updates = tx._updates
    assert len(updates) >= 3, "properties, the snapshot and the branch head"

    ours = updated_metadata(table.metadata, updates, table.metadata_location)
    theirs = update_table_metadata(table.metadata, updates, metadata_location=table.metadata_location)
    assert ours == theirs
    assert ours.metadata_log[-1].metadata_file == table.metadata_location
    assert len(ours.snapshots) == 4 and ours.properties["krishiv.high-water.q"] == "7"
    assert all(a is b for a, b in zip(ours.snapshots[:3], table.metadata.snapshots, strict=True)), "shared, not copied"
    assert all(a is not b for a, b in zip(theirs.snapshots[:3], table.metadata.snapshots, strict=True))


def test_the_catalog_caches_exactly_the_files_content_and_sees_other_writers(spec: KrishivSpec) -> None:
    catalog = load_catalog(spec)
    assert type(catalog) is KrishivSqlCatalog
    table = ensure_table(catalog, IDENTIFIER, aggregate_table_schema(spec.pipeline()))
    for n in range(3):
        _append(table, n)
        assert METADATA_FILES.get(table.metadata_location) is table.metadata, "the metadata this commit wrote"
        assert _from_file(table) == table.metadata, "is what the file holds"
    loaded = catalog.load_table(IDENTIFIER)
    assert loaded.metadata is table.metadata, "loaded from the cache, not parsed again"

    # Another writer (pyiceberg's own catalog, on the same database) moves the head: the next load sees it.
    other = SqlCatalog(spec.iceberg.catalog_name, **catalog.properties)
    theirs = other.load_table(IDENTIFIER)
    _append(theirs, 10)
    reloaded = catalog.load_table(IDENTIFIER)
    assert reloaded.metadata_location == theirs.metadata_location
    assert reloaded.current_snapshot().snapshot_id == theirs.current_snapshot().snapshot_id
    assert reloaded.metadata == theirs.metadata == _from_file(reloaded)

    # A commit built on the old head is refused by the catalog's own check and changes nothing.
    with pytest.raises(CommitFailedException):
        _append(loaded, 11)
    assert other.load_table(IDENTIFIER).metadata_location == theirs.metadata_location
    assert len(catalog.load_table(IDENTIFIER).snapshots()) == 4


def test_the_cache_keeps_the_most_recently_used_files() -> None:
    cache = MetadataFileCache(size=2)
    first, second, third = (object() for _ in range(3))
    cache.put("a", first)  # type: ignore[arg-type]
    cache.put("b", second)  # type: ignore[arg-type]
    assert cache.get("a") is first  # now the most recent
    cache.put("c", third)  # type: ignore[arg-type]
    assert cache.get("b") is None and cache.get("a") is first and cache.get("c") is third and len(cache) == 2
