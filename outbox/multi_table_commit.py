"""One batch into all its tables at once: a multi-table commit on a SQL catalog.

A batch of a pipeline writes several tables (its table, its rejects table, each fan-out route). Committed one
after the other, a reader taking every table's pointer at once sees the batch in some and not in others, and a
crash between two commits leaves them apart until the relay resumes. On pyiceberg's SQL catalog (SQLite,
PostgreSQL) every table's pointer is a row of one database, so the pointer swaps of a batch's tables can be one
database transaction: they all move, or none does.

:class:`DeferredCommits` lets the relay's own commit code (``outbox.relay.commit_entry``: an append, a merge) run
unchanged on each table: the table it is given has a catalog that validates the commit's requirements against the
table as loaded, applies its updates in memory and records them, instead of calling the catalog. Then
:func:`commit_atomically` makes the real commit of them all:

1. per table, in identifier order: load the current pointer and metadata, check the recorded requirements against
   it (a writer that moved the head since is a :class:`~pyiceberg.exceptions.CommitFailedException`, as for one
   table), apply the updates and write the new metadata file;
2. one database transaction: per table, in the same order (PostgreSQL's row locks are taken in one order, so two
   multi-table commits cannot deadlock), ``UPDATE iceberg_tables SET metadata_location = new WHERE ...
   metadata_location = loaded``. A row not updated (another writer got there) rolls every swap back and raises
   ``CommitFailedException``; the metadata files written in step 1 are deleted.

A commit killed anywhere leaves every pointer where it was (the database rolls an open transaction back), or every
one moved (the transaction committed); only metadata files no pointer names can be left, for orphan-file removal.
A failure of the database's own COMMIT has an unknown outcome, as for one table: the relay reloads and checks,
and finds the batch in all of its tables or in none. Fault points: ``relay.multi_table.metadata_written`` (the new
metadata files written, no pointer moved), ``relay.multi_table.pointer_swapped`` (inside the transaction, after
the first table's swap) and ``relay.multi_table.before_db_commit``.

This is written against pyiceberg 0.12's catalog internals (``SqlCatalog.engine``, its ``IcebergTables`` model,
``_update_and_stage_table``, ``_write_metadata``, ``_delete_old_metadata``, ``Table._do_commit`` calling
``catalog.commit_table``); ``tests/outbox/test_multi_table_commit.py`` is their canary.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.typedef import Identifier
from sqlalchemy import update
from sqlalchemy.orm import Session

from krishiv_core.catalog import ATOMIC, TABLE_BY_TABLE
from krishiv_core.faults import fault_point
from krishiv_core.table_metadata import updated_metadata


def multi_table_commits(catalog: Catalog) -> str:
    """How ``catalog`` commits a batch's tables: ``ATOMIC`` on a SQL catalog, else ``TABLE_BY_TABLE``
    (``krishiv_core.catalog.multi_table_commits_at`` says the same from the URI alone)."""
    return ATOMIC if isinstance(catalog, SqlCatalog) else TABLE_BY_TABLE


@dataclass(frozen=True)
class TableCommit:
    """One table's commit, recorded instead of made: the metadata it was planned on, its requirements and updates."""

    identifier: Identifier
    base_location: str
    requirements: tuple[TableRequirement, ...]
    updates: tuple[TableUpdate, ...]


class _RecordingCatalog:
    """The catalog of a deferred table: ``commit_table`` validates and applies in memory and records the commit;
    everything else is the real catalog's."""

    def __init__(self, catalog: Catalog, commits: dict[Identifier, TableCommit]) -> None:
        self._catalog = catalog
        self._commits = commits

    def __getattr__(self, name: str) -> Any:
        return getattr(self._catalog, name)

    def commit_table(
        self, table: Table, requirements: tuple[TableRequirement, ...], updates: tuple[TableUpdate, ...]
    ) -> CommitTableResponse:
        identifier = table.name()
        if identifier in self._commits:
            raise RuntimeError(f"{'.'.join(identifier)}: one commit per table in a multi-table commit")
        for requirement in requirements:
            requirement.validate(table.metadata)
        self._commits[identifier] = TableCommit(identifier, table.metadata_location, requirements, updates)
        metadata = updated_metadata(table.metadata, updates, table.metadata_location)
        return CommitTableResponse(metadata=metadata, metadata_location=table.metadata_location)

    def _delete_old_metadata(self, *args: Any) -> None:
        """Not yet: the commit has not happened."""


class DeferredCommits:
    """Tables whose commits are recorded, to be made together by :func:`commit_atomically`."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.commits: dict[Identifier, TableCommit] = {}

    def table(self, table: Table) -> Table:
        """``table`` (as loaded from the catalog) with its commits recorded here."""
        recording: Any = _RecordingCatalog(self.catalog, self.commits)
        return Table(table.name(), table.metadata, table.metadata_location, table.io, recording)


def commit_atomically(
    catalog: SqlCatalog, commits: list[TableCommit], batch_id: int | None = None
) -> dict[Identifier, Table]:
    """Make ``commits`` as one: every table's pointer moves in one database transaction, or none does (then
    ``CommitFailedException``). Returns the tables as committed."""
    staged = []
    try:
        for commit in sorted(commits, key=lambda c: c.identifier):
            current = catalog.load_table(commit.identifier)
            if current.metadata_location != commit.base_location:
                raise CommitFailedException(
                    f"{'.'.join(commit.identifier)} was committed by another writer since this batch was planned"
                )
            new = catalog._update_and_stage_table(current, commit.identifier, commit.requirements, commit.updates)
            catalog._write_metadata(new.metadata, new.io, new.metadata_location)
            staged.append((current, new))
        fault_point("relay.multi_table.metadata_written", batch_id)
        with Session(catalog.engine) as session:
            for i, (current, new) in enumerate(staged):
                namespace = Catalog.namespace_to_string(Catalog.namespace_from(current.name()))
                swapped = session.execute(
                    update(IcebergTables)
                    .where(
                        IcebergTables.catalog_name == catalog.name,
                        IcebergTables.table_namespace == namespace,
                        IcebergTables.table_name == Catalog.table_name_from(current.name()),
                        IcebergTables.metadata_location == current.metadata_location,
                    )
                    .values(
                        metadata_location=new.metadata_location, previous_metadata_location=current.metadata_location
                    )
                )
                if swapped.rowcount < 1:  # type: ignore[attr-defined]
                    session.rollback()
                    raise CommitFailedException(
                        f"{'.'.join(current.name())} has been updated by another process; no table of the batch "
                        "was committed"
                    )
                if i == 0:
                    fault_point("relay.multi_table.pointer_swapped", batch_id)
            fault_point("relay.multi_table.before_db_commit", batch_id)
            session.commit()
    except CommitFailedException:
        for _, new in staged:
            _delete_quietly(new.io, new.metadata_location)
        raise
    committed = {}
    for current, new in staged:
        with contextlib.suppress(Exception):  # pyiceberg's own commit only warns here too
            catalog._delete_old_metadata(current.io, current.metadata, new.metadata)
        committed[new.name()] = Table(new.name(), new.metadata, new.metadata_location, new.io, catalog)
    return committed


def _delete_quietly(io: Any, path: str) -> None:
    with contextlib.suppress(Exception):  # a metadata file no pointer names is an orphan, not an error of the commit
        io.delete(path)
