"""The database under the ledger, chosen by its location: one short transaction at a time, and the schema.

A location is a path or ``duckdb:///path`` (a DuckDB file, :mod:`outbox.ledger.duckdb_file`, the embedded
default) or a ``postgresql://`` URI (a schema of a PostgreSQL database, :mod:`outbox.ledger.postgres`, for
deployments whose processes share no disk). Both hold the same tables, migrated version by version, and both
admit one writer at a time: a write waits for the one before it up to ``lock_timeout_s``, then
:class:`LedgerBusyError`. The rest of the package reaches the database through :class:`LedgerConnection`:
``_transaction`` to write, ``_read``/``_reads`` to read, each statement written once with ``?`` placeholders
in the SQL both speak, the fragments they spell apart taken from ``self.dialect``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from krishiv_core.runbook import runbook
from krishiv_core.spec_sections import DUCKDB_LEDGER_SCHEME
from outbox.errors import LedgerMoved, LedgerSchemaError
from outbox.ledger.dialect import Dialect
from outbox.ledger.duckdb_file import DuckDBFile
from outbox.ledger.postgres import PostgresLedger, is_postgres_location
from outbox.ledger.schema import SCHEMA_VERSION

DEFAULT_LOCK_TIMEOUT_S = 30.0


class Connection(Protocol):
    """An open connection to the ledger, as the rest of the package uses it."""

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Any: ...


def is_server_location(location: str | Path) -> bool:
    """Whether ``location`` names a ledger on a server (PostgreSQL) rather than a DuckDB file."""
    return is_postgres_location(str(location))


def duckdb_path(location: str | Path) -> str:
    """The file of a DuckDB location: a path, or ``duckdb:///path``."""
    text = str(location)
    return text.removeprefix(DUCKDB_LEDGER_SCHEME)


def open_backend(location: str | Path, lock_timeout_s: float) -> DuckDBFile | PostgresLedger:
    text = str(location)
    if is_postgres_location(text):
        return PostgresLedger(text, lock_timeout_s)
    return DuckDBFile(duckdb_path(text), lock_timeout_s)


def column_rows(columns: dict[str, Any] | list[Any]) -> list[tuple[Any, ...]]:
    """Tuples from a ``columns=True`` read (an empty list if there was no ledger)."""
    if not columns:
        return []
    assert isinstance(columns, dict)
    values = [c.tolist() if hasattr(c, "tolist") else c for c in columns.values()]
    return list(zip(*values, strict=True))


class LedgerConnection:
    """The ledger's database, opened for one short transaction or one batch of reads at a time."""

    def __init__(self, location: str | Path, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> None:
        self._backend = open_backend(location, lock_timeout_s)
        #: How messages name the ledger: the file's path, or the server's URI (password hidden) and schema.
        self.path = self._backend.path
        self.lock_timeout_s = lock_timeout_s
        self.dialect: Dialect = self._backend.dialect
        self._migrated = False

    @property
    def on_server(self) -> bool:
        return isinstance(self._backend, PostgresLedger)

    def exists(self) -> bool:
        """Whether the ledger is there yet (a DuckDB file, or a PostgreSQL schema holding its tables)."""
        return self._backend.exists()

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        self.migrate()
        with self._backend.transaction(create=False) as con:  # made by migrate(): a file gone now was removed
            self._refuse_if_moved(con)
            yield con

    def _refuse_if_moved(self, con: Connection) -> None:
        """Raise :class:`LedgerMoved` if ``krishiv ledger-copy`` moved this ledger elsewhere."""
        row = con.execute("SELECT value FROM ledger_meta WHERE key = 'moved_to'").fetchone()
        if row is not None:
            raise LedgerMoved(self.path, row[0])

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._reads([(sql, params)])[0]

    def _reads(self, queries: Sequence[tuple[str, Sequence[Any]]], columns: bool = False) -> list[Any]:
        """Several reads on one read-only connection (one snapshot), so the ledger is opened once for all of them.

        Results are lists of tuples, or with ``columns`` dicts of columns (NumPy arrays from DuckDB, which leave the
        file several times quicker than tuples; :func:`column_rows` makes them tuples after it is closed).
        """
        if not self._backend.exists():
            return [[] for _ in queries]

        def run(con: Connection) -> list[Any]:
            self._refuse_if_moved(con)
            fetched = []
            for sql, params in queries:
                cursor = con.execute(sql, list(params))
                fetched.append(self._backend.fetch_columns(cursor) if columns else cursor.fetchall())
            return fetched

        if not self._migrated:
            # The first read checks the schema on the same read-only connection; only an old ledger is migrated.
            with self._backend.snapshot() as con:
                if self._backend.version(con) == SCHEMA_VERSION:
                    self._migrated = True
                    return run(con)
            self.migrate()
        with self._backend.snapshot() as con:
            return run(con)

    def migrate(self) -> int:
        """Bring the ledger's schema up to :data:`SCHEMA_VERSION`; returns the version found before.

        A new file or schema, or one with no tables at all, becomes a ledger; one holding other tables and no
        ledger is refused (:class:`LedgerCorrupt`), since it is some other program's.
        """
        if self._migrated:
            return SCHEMA_VERSION
        with self._backend.transaction() as con:
            self._backend.prepare(con)
            found = self._backend.version(con) or 0
            if found > SCHEMA_VERSION:
                raise LedgerSchemaError(
                    f"ledger {self.path} has schema version {found}, newer than this Krishiv's "
                    f"{SCHEMA_VERSION}; upgrade Krishiv {runbook('A ledger that is locked or damaged')}"
                )
            con.execute("CREATE TABLE IF NOT EXISTS ledger_meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
            for version in range(found, SCHEMA_VERSION):
                con.execute(self.dialect.migrations[version])
            self._set_meta(con, "schema_version", str(SCHEMA_VERSION))
        self._migrated = True
        return found

    @staticmethod
    def _set_meta(con: Connection, key: str, value: str) -> None:
        con.execute(
            "INSERT INTO ledger_meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value", [key, value]
        )

    def schema_version(self) -> int:
        """The ledger's schema version, read without writing (0 for a new or empty one)."""
        if not self._backend.exists():
            return 0
        with self._backend.snapshot() as con:
            return self._backend.version(con) or 0
