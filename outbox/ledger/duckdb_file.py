"""The ledger in a DuckDB file (the embedded default): opening it with its lock retried, and what is in it.

DuckDB lets one process at a time hold a file open for writing, and a writer blocks other processes'
read-only opens as well. The Spark driver, the commit relay and the Dagster daemon all use the ledger, so
every operation opens the file, runs one short transaction and closes it again. A lock held by another
process is retried with backoff up to ``lock_timeout_s``; then :class:`LedgerBusyError` names the file
and the holder, and nothing has been written.

Opening is attaching: each process keeps one in-memory DuckDB database and ``ATTACH``es the file to it for an
operation, ``DETACH``ing it after. The file's lock is the same as a connection's (taken by the attach, released
by the detach, refused with the same error while another process holds it), but an attach costs about 2 ms for
a read and 5 ms for a write where a new connection costs about 20 ms: a connection is a whole database, which
loads DuckDB's built-in extensions every time. A continuous batch opens the ledger several times (the stager
records it, the committer reads and marks each table's entry), so this was about a second of every million
events (issue 37). A file that is not a ledger at all (empty, not a DuckDB
file, or a DuckDB database without the ledger's tables) raises :class:`LedgerCorrupt` at once, and is
never migrated into a ledger; only a file modified in the last few seconds, which another process may be
creating, is given half a second to get its header.

This is the one module that calls DuckDB's API (connecting, its errors, its catalog, fetching results).
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import duckdb

from outbox.errors import LedgerBusyError, LedgerCorrupt, LedgerGone
from outbox.ledger.dialect import Dialect, duckdb_dialect
from outbox.ledger.schema import MIGRATIONS

_BACKOFF_START_S = 0.005
_BACKOFF_MAX_S = 0.25
#: A file DuckDB calls invalid is retried this long, and only if it was modified in the last
#: ``_FRESH_FILE_S``: another process may have created it and not yet written its header.
_CREATION_GRACE_S = 0.5
_FRESH_FILE_S = 5.0
#: DuckDB's file header: an 8-byte checksum, then the magic bytes.
_DUCKDB_MAGIC = b"DUCK"
DIALECT = duckdb_dialect(MIGRATIONS)

#: One connection at a time per ledger file within a process: DuckDB refuses a read-only open of a file that
#: another thread of the same process has open for writing (the stager lease renews from a thread).
_PROCESS_LOCKS: dict[str, threading.RLock] = {}
_PROCESS_LOCKS_GUARD = threading.Lock()


def _process_lock(path: str) -> threading.RLock:
    with _PROCESS_LOCKS_GUARD:
        return _PROCESS_LOCKS.setdefault(os.path.realpath(path), threading.RLock())


#: The process's in-memory database the ledger files are attached to, with the process id it was made in (a
#: forked child makes its own: a DuckDB database is not to be shared across a fork).
_HOST: tuple[int, duckdb.DuckDBPyConnection] | None = None


def _host() -> duckdb.DuckDBPyConnection:
    global _HOST
    with _PROCESS_LOCKS_GUARD:
        if _HOST is None or _HOST[0] != os.getpid():
            host = duckdb.connect()
            host.execute("SET GLOBAL TimeZone = 'UTC'")  # times come back in UTC whatever the machine's zone
            _HOST = (os.getpid(), host)
        return _HOST[1]


def _alias(path: str) -> str:
    """The name a file is attached under: one per file, so threads of a process may hold different ledgers."""
    return "ledger_" + hashlib.sha1(os.path.realpath(path).encode()).hexdigest()[:16]


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


class _OpenedElsewhere(Exception):
    """The file is open in this process as a database of its own, so it cannot be attached."""


def _open(path: str, quoted: str, alias: str, read_only: bool) -> duckdb.DuckDBPyConnection:
    """A cursor of the process's database with the file attached as its current database."""
    con = _host().cursor()
    try:
        con.execute(f"ATTACH '{quoted}' AS {alias}" + (" (READ_ONLY)" if read_only else ""))
    except BaseException as exc:
        con.close()
        if isinstance(exc, duckdb.Error) and "already attached by database" in str(exc):
            raise _OpenedElsewhere(path) from exc
        raise
    try:
        con.execute(f"USE {alias}")
    except BaseException:
        _detach(con, alias)  # never left attached: the file's lock would stay with this process
        raise
    return con


def _detach(con: duckdb.DuckDBPyConnection, alias: str) -> None:
    """Release the file (its lock, and a write's checkpoint as a connection's close makes it)."""
    try:
        con.execute("USE memory")
        con.execute(f"DETACH {alias}")
    except duckdb.Error:
        _drop_host()  # closing the process's database releases every file attached to it
    finally:
        con.close()


def _drop_host() -> None:
    global _HOST
    with _PROCESS_LOCKS_GUARD:
        if _HOST is not None and _HOST[0] == os.getpid():
            with suppress(duckdb.Error):
                _HOST[1].close()
        _HOST = None


class DuckDBFile:
    """A ledger in one DuckDB file, opened for one short transaction or one batch of reads at a time."""

    dialect: Dialect = DIALECT

    def __init__(self, path: str | Path, lock_timeout_s: float) -> None:
        self.path = str(path)
        self.lock_timeout_s = lock_timeout_s
        self._process_lock = _process_lock(self.path)

    def exists(self) -> bool:
        return Path(self.path).exists()

    def _corrupt(self, found: str) -> LedgerCorrupt:
        return LedgerCorrupt(self.path, found, self.dialect.name)

    @contextmanager
    def connect(self, read_only: bool = False, create: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection; for writes, the file (and its folder) made unless ``create`` is False (the ledger was made
        already, so a missing file was removed: :class:`LedgerGone`)."""
        if not read_only:
            if not create and not Path(self.path).exists():
                raise LedgerGone(self.path)
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.lock_timeout_s
        delay = _BACKOFF_START_S
        started = time.monotonic()
        invalid_since: float | None = None
        alias = _alias(self.path)
        quoted = self.path.replace("'", "''")
        with self._process_lock:
            while True:
                try:
                    con, attached = _open(self.path, quoted, alias, read_only), True
                except _OpenedElsewhere:
                    # this process also holds the file as a database of its own (a script's duckdb.connect): a
                    # connection shares that database, as DuckDB hands one process's connections to a file
                    con, attached = duckdb.connect(self.path, read_only=read_only), False
                    con.execute("SET TimeZone = 'UTC'")
                    break
                except duckdb.Error as exc:
                    now = time.monotonic()
                    if _is_invalid_file(exc) or _is_damaged(exc):
                        invalid_since = now if invalid_since is None else invalid_since
                        if now - invalid_since >= _CREATION_GRACE_S or not _recently_modified(self.path):
                            raise self._corrupt(_describe_invalid(self.path, exc)) from exc
                    elif not _is_lock_conflict(exc):
                        raise
                    if now >= deadline:
                        raise LedgerBusyError(self.path, now - started, f"DuckDB said: {exc}") from exc
                    time.sleep(min(delay * random.uniform(0.5, 1.5), max(0.0, deadline - time.monotonic())))
                    delay = min(delay * 2, _BACKOFF_MAX_S)
                else:
                    break
            try:
                yield con
            except duckdb.Error as exc:
                if _is_damaged(exc):  # a damaged block DuckDB only read now, for a query
                    raise self._corrupt(_describe_invalid(self.path, exc)) from exc
                raise
            finally:
                if attached:
                    _detach(con, alias)
                else:
                    con.close()

    @contextmanager
    def transaction(self, create: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
        """One write transaction; the file's lock makes it the only writer while it runs. ``create``: see
        :meth:`connect`."""
        with self.connect(create=create) as con:
            con.execute("BEGIN TRANSACTION")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    @contextmanager
    def snapshot(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only open of the file for several reads (no writer can hold it meanwhile)."""
        with self.connect(read_only=True) as con:
            yield con

    @staticmethod
    def fetch_columns(cursor: duckdb.DuckDBPyConnection) -> dict[str, Any]:
        """A result as NumPy columns: several times quicker to take off the connection than tuples."""
        return cursor.fetchnumpy()

    @staticmethod
    def insert_rows(
        con: duckdb.DuckDBPyConnection, table: str, columns: list[str], rows: list[tuple[Any, ...]]
    ) -> None:
        if rows:
            names = ", ".join(columns)
            con.executemany(f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(columns))})", rows)

    def prepare(self, con: duckdb.DuckDBPyConnection) -> None:
        """Nothing to make before the first migration: the file is the database."""

    def version(self, con: duckdb.DuckDBPyConnection) -> int | None:
        """The schema version recorded in the file; None for a database without tables; a foreign one raises."""
        tables = [
            r[0]
            for r in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE NOT temporary AND schema_name = 'main' "
                "AND database_name = current_database() "
                "ORDER BY table_name"
            ).fetchall()
        ]
        if "ledger_meta" not in tables:
            if tables:
                shown = ", ".join(tables[:5]) + (", …" if len(tables) > 5 else "")
                raise self._corrupt(f"a DuckDB file without Krishiv's ledger tables; it holds {shown}")
            return None
        row = con.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else 0
