"""pyiceberg's SQL catalog (SQLite, PostgreSQL) without the work on every commit that grows with history and is
not the commit's.

``SqlCatalog.commit_table`` loads the current table (reads and parses the whole metadata JSON, 0.7 MB at 830
snapshots, with pydantic's validation), applies the updates (ending in a deep copy of every snapshot), writes the
new metadata file and swaps the pointer row if it still names the metadata it loaded. Krishiv's relay commits
batch after batch to the same table, so the metadata it parses is, nearly always, the file it wrote one commit
earlier. :class:`KrishivSqlCatalog` changes two steps and keeps every other one pyiceberg's:

* **Parsed metadata is cached by location.** An Iceberg metadata file is never rewritten: a commit writes a new
  file under a new name (a version and a UUID) and moves the catalog's pointer to it. So the metadata of a
  location, once parsed, or once written by this process, is that file's content for good. The pointer row is
  still read from the database on every load and every commit, and the commit's optimistic check (the row still
  names the metadata it loaded, in the same ``UPDATE ... WHERE``) is pyiceberg's own: a writer elsewhere moves
  the pointer to a location this cache has never seen, which is read from storage.
* **Updates are applied without the deep copy** (:func:`krishiv_core.table_metadata.updated_metadata`), for a
  table that exists; creating one is pyiceberg's path, with its validation.

The cache is per process, bounded (:data:`CACHED_METADATA_FILES`), and shares the metadata objects between the
tables loaded from it, as pyiceberg already does between a table and its transactions: they are frozen models.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.io import FileIO
from pyiceberg.table import StagedTable, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.typedef import Identifier

from krishiv_core.table_metadata import updated_metadata

#: Parsed metadata files kept per process: the newest of each table being committed, and a few older ones.
CACHED_METADATA_FILES = 16


class MetadataFileCache:
    """Parsed table metadata by metadata file location: a small LRU, safe to share between threads."""

    def __init__(self, size: int = CACHED_METADATA_FILES) -> None:
        self._size = size
        self._entries: OrderedDict[str, TableMetadata] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, location: str) -> TableMetadata | None:
        with self._lock:
            metadata = self._entries.get(location)
            if metadata is not None:
                self._entries.move_to_end(location)
            return metadata

    def put(self, location: str, metadata: TableMetadata) -> None:
        with self._lock:
            self._entries[location] = metadata
            self._entries.move_to_end(location)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


#: One cache for every catalog of the process: a location names the same immutable file whichever catalog reads it.
METADATA_FILES = MetadataFileCache()


class KrishivSqlCatalog(SqlCatalog):
    """pyiceberg's ``SqlCatalog`` that parses a metadata file once and applies updates without deep copies."""

    metadata_files: MetadataFileCache = METADATA_FILES

    def _convert_orm_to_iceberg(self, orm_table: IcebergTables) -> Table:
        location = orm_table.metadata_location
        metadata = self.metadata_files.get(location) if location else None
        if metadata is None or not orm_table.table_namespace or not orm_table.table_name:
            table = super()._convert_orm_to_iceberg(orm_table)  # reads and parses the file; its checks and errors
            self.metadata_files.put(table.metadata_location, table.metadata)
            return table
        return Table(
            identifier=(*Catalog.identifier_to_tuple(orm_table.table_namespace), orm_table.table_name),
            metadata=metadata,
            metadata_location=location,
            io=self._load_file_io(metadata.properties, location),
            catalog=self,
        )

    def _update_and_stage_table(
        self,
        current_table: Table | None,
        table_identifier: Identifier,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> StagedTable:
        if current_table is None:  # a new table: pyiceberg's path, which validates the whole metadata
            return super()._update_and_stage_table(current_table, table_identifier, requirements, updates)
        for requirement in requirements:
            requirement.validate(current_table.metadata)
        metadata = updated_metadata(current_table.metadata, updates, current_table.metadata_location)
        version = self._parse_metadata_version(current_table.metadata_location) + 1
        location = load_location_provider(metadata.location, metadata.properties).new_table_metadata_file_location(
            version
        )
        return StagedTable(
            identifier=table_identifier,
            metadata=metadata,
            metadata_location=location,
            io=self._load_file_io(properties=metadata.properties, location=location),
            catalog=self,
        )

    def _write_metadata(self, metadata: TableMetadata, io: FileIO, metadata_path: str) -> None:  # type: ignore[override]
        super()._write_metadata(metadata, io, metadata_path)
        # Written in full: this is the file's content, whether or not the pointer swap that follows succeeds.
        self.metadata_files.put(metadata_path, metadata)


def with_metadata_cache(catalog: Catalog) -> Catalog:
    """``catalog`` as a :class:`KrishivSqlCatalog` if pyiceberg built its plain ``SqlCatalog``; any other catalog as
    it is. pyiceberg builds it from all its configuration (``.pyiceberg.yaml``, ``PYICEBERG_CATALOG__*``, the spec),
    so only the class changes: the subclass adds methods and no state, and the engine and properties stay."""
    if type(catalog) is SqlCatalog:
        catalog.__class__ = KrishivSqlCatalog
    return catalog
