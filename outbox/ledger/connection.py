"""The DuckDB file under the ledger: opening it, one short transaction at a time, and bringing it to the schema.

DuckDB lets one process at a time hold a file open for writing, and a writer blocks other processes'
read-only opens as well. The Spark driver, the commit relay and the Dagster daemon all use the ledger, so
every operation opens the file, runs one short transaction and closes it again. A lock held by another
process is retried with backoff up to ``lock_timeout_s``; then :class:`LedgerBusyError` names the file
and the holder, and nothing has been written. A file that is not a ledger at all (empty, not a DuckDB
file, or a DuckDB database without the ledger's tables) raises :class:`LedgerCorrupt` at once, and is
never migrated into a ledger; only a file modified in the last few seconds, which another process may be
creating, is given half a second to get its header.

This is the one module that calls DuckDB's API (connecting, its errors, its catalog, fetching results): the
rest of the package reaches the file through :class:`LedgerConnection`, ``_transaction`` to write and
``_read``/``_reads`` to read, and runs its statements (written in DuckDB's SQL) on the :data:`Connection` these
hand it.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from krishiv_core.runbook import runbook
from outbox.errors import LedgerBusyError, LedgerCorrupt, LedgerSchemaError
from outbox.ledger.schema import MIGRATIONS, SCHEMA_VERSION

DEFAULT_LOCK_TIMEOUT_S = 30.0
_BACKOFF_START_S = 0.005
_BACKOFF_MAX_S = 0.25
#: A file DuckDB calls invalid is retried this long, and only if it was modified in the last
#: ``_FRESH_FILE_S``: another process may have created it and not yet written its header.
_CREATION_GRACE_S = 0.5
_FRESH_FILE_S = 5.0
#: DuckDB's file header: an 8-byte checksum, then the magic bytes.
_DUCKDB_MAGIC = b"DUCK"

#: An open connection to the ledger file, as the rest of the package names it.
Connection = duckdb.DuckDBPyConnection


def _rows(cursor: duckdb.DuckDBPyConnection) -> list[tuple[Any, ...]]:
    return cursor.fetchall()


def fetch_columns(cursor: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """A result as NumPy columns: several times quicker to take off the connection than tuples."""
    return cursor.fetchnumpy()


def column_rows(columns: dict[str, Any] | list[Any]) -> list[tuple[Any, ...]]:
    """Tuples from :func:`fetch_columns`' result (an empty list if the file was missing)."""
    if not columns:
        return []
    assert isinstance(columns, dict)
    return list(zip(*(values.tolist() for values in columns.values()), strict=True))


#: One connection at a time per ledger file within a process: DuckDB refuses a read-only open of a file that
#: another thread of the same process has open for writing (the stager lease renews from a thread).
_PROCESS_LOCKS: dict[str, threading.RLock] = {}
_PROCESS_LOCKS_GUARD = threading.Lock()


def _process_lock(path: str) -> threading.RLock:
    with _PROCESS_LOCKS_GUARD:
        return _PROCESS_LOCKS.setdefault(os.path.realpath(path), threading.RLock())


def _is_lock_conflict(exc: duckdb.Error) -> bool:
    """Another process holds the file."""
    text = str(exc)
    return "Could not set lock" in text or "Conflicting lock" in text


def _is_invalid_file(exc: duckdb.Error) -> bool:
    """DuckDB found no valid header: an empty or foreign file, or one another process has just created."""
    return "not a valid DuckDB database file" in str(exc)


#: What DuckDB says of a file whose header is there but whose contents are not: truncated or overwritten.
_DAMAGE = ("Corrupt database file", "Could not read enough bytes from file")


def _is_damaged(exc: duckdb.Error) -> bool:
    return any(marker in str(exc) for marker in _DAMAGE)


def _describe_invalid(path: str, exc: duckdb.Error) -> str:
    try:
        with open(path, "rb") as stream:
            head = stream.read(16)
    except OSError as error:
        return f"unreadable: {error.strerror}"
    if not head:
        return "empty file"
    if head[8:12] != _DUCKDB_MAGIC:
        return "not a DuckDB file"
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"a damaged DuckDB file: {detail}"


def _recently_modified(path: str) -> bool:
    try:
        return time.time() - os.path.getmtime(path) < _FRESH_FILE_S
    except OSError:
        return True  # gone again: someone is replacing it; let the next attempt see


class LedgerConnection:
    """The ledger file, opened for one short transaction or one batch of reads at a time."""

    def __init__(self, path: str | Path, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> None:
        self.path = str(path)
        self.lock_timeout_s = lock_timeout_s
        self._migrated = False
        self._process_lock = _process_lock(self.path)

    @contextmanager
    def _connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        if not read_only and not self._migrated:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.lock_timeout_s
        delay = _BACKOFF_START_S
        started = time.monotonic()
        invalid_since: float | None = None
        with self._process_lock:
            while True:
                try:
                    con = duckdb.connect(self.path, read_only=read_only)
                    # Times come back in UTC whatever the machine's zone: every reader prints them as UTC.
                    con.execute("SET TimeZone = 'UTC'")
                    break
                except duckdb.Error as exc:
                    now = time.monotonic()
                    if _is_invalid_file(exc) or _is_damaged(exc):
                        invalid_since = now if invalid_since is None else invalid_since
                        if now - invalid_since >= _CREATION_GRACE_S or not _recently_modified(self.path):
                            raise LedgerCorrupt(self.path, _describe_invalid(self.path, exc)) from exc
                    elif not _is_lock_conflict(exc):
                        raise
                    if now >= deadline:
                        raise LedgerBusyError(self.path, now - started, str(exc)) from exc
                    time.sleep(min(delay * random.uniform(0.5, 1.5), max(0.0, deadline - time.monotonic())))
                    delay = min(delay * 2, _BACKOFF_MAX_S)
            try:
                yield con
            except duckdb.Error as exc:
                if _is_damaged(exc):  # a damaged block DuckDB only read now, for a query
                    raise LedgerCorrupt(self.path, _describe_invalid(self.path, exc)) from exc
                raise
            finally:
                con.close()

    @contextmanager
    def _transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        self.migrate()
        with self._connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._reads([(sql, params)])[0]

    def _reads(
        self, queries: Sequence[tuple[str, Sequence[Any]]], fetch: Callable[[duckdb.DuckDBPyConnection], Any] = _rows
    ) -> list[Any]:
        """Several reads on one read-only connection, so the file is opened once for all of them.

        ``fetch`` takes each result off the connection (tuples by default; :func:`fetch_columns` for large results,
        which leave as NumPy arrays and become Python values after the file is closed).
        """
        if not Path(self.path).exists():
            return [[] for _ in queries]
        if not self._migrated:
            # The first read checks the schema on the same read-only connection; only an old file is migrated.
            with self._connect(read_only=True) as con:
                if self._version(con) == SCHEMA_VERSION:
                    return [fetch(con.execute(sql, list(params))) for sql, params in queries]
            self.migrate()
        with self._connect(read_only=True) as con:
            return [fetch(con.execute(sql, list(params))) for sql, params in queries]

    def migrate(self) -> int:
        """Bring the file's schema up to :data:`SCHEMA_VERSION`; returns the version found before.

        A new file, or a DuckDB database with no tables at all, becomes a ledger; a database holding other
        tables and no ledger is refused (:class:`LedgerCorrupt`), since it is some other program's file.
        """
        if self._migrated:
            return SCHEMA_VERSION
        with self._connect() as con:
            # Read before the transaction (see _version); this connection holds the file, so it cannot change.
            found = self._version(con)
            con.execute("BEGIN TRANSACTION")
            try:
                if found > SCHEMA_VERSION:
                    raise LedgerSchemaError(
                        f"ledger {self.path} has schema version {found}, newer than this Krishiv's "
                        f"{SCHEMA_VERSION}; upgrade Krishiv {runbook('A ledger that is locked or damaged')}"
                    )
                con.execute("CREATE TABLE IF NOT EXISTS ledger_meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
                for version in range(found, SCHEMA_VERSION):
                    con.execute(MIGRATIONS[version])
                con.execute("INSERT OR REPLACE INTO ledger_meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        self._migrated = True
        return found

    def schema_version(self) -> int:
        """The file's schema version, read without writing (0 for a new or empty file)."""
        if not Path(self.path).exists():
            return 0
        with self._connect(read_only=True) as con:
            return self._version(con)

    def _version(self, con: duckdb.DuckDBPyConnection) -> int:
        """The schema version recorded in the file; 0 for a database without tables; a foreign one raises.

        Runs outside a transaction: a missing ``ledger_meta`` is an error DuckDB would abort one for.
        """
        try:
            row = con.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'").fetchone()
        except duckdb.CatalogException:
            tables = [
                r[0]
                for r in con.execute(
                    "SELECT table_name FROM duckdb_tables() WHERE NOT temporary AND schema_name = 'main' "
                    "ORDER BY table_name"
                ).fetchall()
            ]
            if tables:
                shown = ", ".join(tables[:5]) + (", …" if len(tables) > 5 else "")
                raise LedgerCorrupt(
                    self.path, f"a DuckDB file without Krishiv's ledger tables; it holds {shown}"
                ) from None
            return 0
        version = int(row[0]) if row else 0
        if version == SCHEMA_VERSION:
            self._migrated = True
        return version
