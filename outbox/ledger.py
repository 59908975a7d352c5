"""The outbox ledger: one DuckDB file recording every staged batch and whether it reached Iceberg.

DuckDB lets one process at a time hold a file open for writing, and a writer blocks other processes'
read-only opens as well. The Spark driver, the commit relay and the Dagster daemon all use the ledger, so
every operation opens the file, runs one short transaction and closes it again. A lock held by another
process is retried with backoff up to ``lock_timeout_s``; then :class:`LedgerBusyError` names the file
and the holder, and nothing has been written.
"""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb

from outbox.errors import BatchReplayMismatch, LedgerBusyError, LedgerSchemaError, StagerBusy

PENDING = "PENDING"
COMMITTED = "COMMITTED"

DEFAULT_LOCK_TIMEOUT_S = 30.0
_BACKOFF_START_S = 0.005
_BACKOFF_MAX_S = 0.25

#: Offsets of one batch: topic -> partition -> [start, end).
OffsetRanges = dict[str, dict[str, list[int]]]


@dataclass(frozen=True)
class StagedFile:
    path: str
    records: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "records": self.records, "bytes": self.bytes}


@dataclass(frozen=True)
class OutboxEntry:
    """One batch's output for one table, as staged by the Spark job."""

    query_id: str
    pipeline: str
    table: str
    batch_id: int
    offsets: OffsetRanges
    files: tuple[StagedFile, ...]
    intended_snapshot_id: int
    metrics: dict[str, int] = field(default_factory=dict)
    status: str = PENDING
    committed_snapshot_id: int | None = None
    created_at: datetime | None = None
    committed_at: datetime | None = None

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.query_id, self.table, self.batch_id)

    @property
    def record_count(self) -> int:
        return sum(f.records for f in self.files)


@dataclass(frozen=True)
class StagerLease:
    """Who is running a pipeline's Spark query now: a ``krishiv run`` process or a Dagster staging run."""

    pipeline: str
    holder: str
    host: str
    pid: int
    acquired_at: datetime
    expires_at: datetime

    def alive(self, now: datetime | None = None) -> bool:
        """Unexpired, and, when held on this host, by a process that still exists."""
        if self.expires_at <= (now or datetime.now(UTC)):
            return False
        if self.host == socket.gethostname():
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
        return True

    def describe(self) -> str:
        until = self.expires_at.isoformat(timespec="seconds")
        return f"{self.holder} (pid {self.pid} on {self.host}, lease until {until})"


# Each migration moves the schema from version i to i + 1. Never edit one that has shipped: add another.
_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE outbox (
        query_id VARCHAR NOT NULL,
        pipeline VARCHAR NOT NULL,
        table_name VARCHAR NOT NULL,
        batch_id BIGINT NOT NULL,
        status VARCHAR NOT NULL,
        intended_snapshot_id BIGINT NOT NULL,
        committed_snapshot_id BIGINT,
        offsets VARCHAR NOT NULL,
        files VARCHAR NOT NULL,
        record_count BIGINT NOT NULL,
        metrics VARCHAR NOT NULL,
        created_at TIMESTAMPTZ NOT NULL,
        committed_at TIMESTAMPTZ,
        PRIMARY KEY (query_id, table_name, batch_id)
    );
    CREATE INDEX outbox_status ON outbox (table_name, status);
    """,
    """
    CREATE TABLE stager_lease (
        pipeline VARCHAR PRIMARY KEY,
        holder VARCHAR NOT NULL,
        host VARCHAR NOT NULL,
        pid BIGINT NOT NULL,
        acquired_at TIMESTAMPTZ NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL
    );
    """,
)
SCHEMA_VERSION = len(_MIGRATIONS)

_COLUMNS = (
    "query_id, pipeline, table_name, batch_id, status, intended_snapshot_id, committed_snapshot_id, "
    "offsets, files, metrics, created_at, committed_at"
)


_LEASE_COLUMNS = "pipeline, holder, host, pid, acquired_at, expires_at"


def _row_to_entry(row: Sequence[Any]) -> OutboxEntry:
    (
        query_id,
        pipeline,
        table,
        batch_id,
        status,
        intended,
        committed,
        offsets,
        files,
        metrics,
        created_at,
        committed_at,
    ) = row
    return OutboxEntry(
        query_id=query_id,
        pipeline=pipeline,
        table=table,
        batch_id=batch_id,
        status=status,
        intended_snapshot_id=intended,
        committed_snapshot_id=committed,
        offsets=json.loads(offsets),
        files=tuple(StagedFile(**f) for f in json.loads(files)),
        metrics=json.loads(metrics),
        created_at=created_at,
        committed_at=committed_at,
    )


#: One connection at a time per ledger file within a process: DuckDB refuses a read-only open of a file that
#: another thread of the same process has open for writing (the stager lease renews from a thread).
_PROCESS_LOCKS: dict[str, threading.RLock] = {}
_PROCESS_LOCKS_GUARD = threading.Lock()


def _process_lock(path: str) -> threading.RLock:
    with _PROCESS_LOCKS_GUARD:
        return _PROCESS_LOCKS.setdefault(os.path.realpath(path), threading.RLock())


def _is_lock_conflict(exc: duckdb.Error) -> bool:
    """Another process holds the file, or is creating it and has not written its header yet."""
    text = str(exc)
    return "Could not set lock" in text or "Conflicting lock" in text or "not a valid DuckDB database file" in text


class Ledger:
    """Narrow interface over the ledger file; every method is one short transaction."""

    def __init__(self, path: str | Path, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> None:
        self.path = str(path)
        self.lock_timeout_s = lock_timeout_s
        self._migrated = False
        self._process_lock = _process_lock(self.path)

    # ------------------------------------------------------------------------------------ plumbing

    @contextmanager
    def _connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        if not read_only and not self._migrated:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.lock_timeout_s
        delay = _BACKOFF_START_S
        started = time.monotonic()
        with self._process_lock:
            while True:
                try:
                    con = duckdb.connect(self.path, read_only=read_only)
                    break
                except duckdb.Error as exc:
                    if not _is_lock_conflict(exc):
                        raise
                    if time.monotonic() >= deadline:
                        raise LedgerBusyError(self.path, time.monotonic() - started, str(exc)) from exc
                    time.sleep(min(delay * random.uniform(0.5, 1.5), max(0.0, deadline - time.monotonic())))
                    delay = min(delay * 2, _BACKOFF_MAX_S)
            try:
                yield con
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
        if not Path(self.path).exists():
            return []
        if not self._migrated:
            # The first read checks the schema on the same read-only connection; only an old file is migrated.
            with self._connect(read_only=True) as con:
                if self._version(con) == SCHEMA_VERSION:
                    return con.execute(sql, list(params)).fetchall()
            self.migrate()
        with self._connect(read_only=True) as con:
            return con.execute(sql, list(params)).fetchall()

    def migrate(self) -> int:
        """Bring the file's schema up to :data:`SCHEMA_VERSION`; returns the version found before."""
        if self._migrated:
            return SCHEMA_VERSION
        with self._connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute("CREATE TABLE IF NOT EXISTS ledger_meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
                row = con.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'").fetchone()
                found = int(row[0]) if row else 0
                if found > SCHEMA_VERSION:
                    raise LedgerSchemaError(
                        f"ledger {self.path} has schema version {found}, newer than this Krishiv's "
                        f"{SCHEMA_VERSION}; upgrade Krishiv"
                    )
                for version in range(found, SCHEMA_VERSION):
                    con.execute(_MIGRATIONS[version])
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
        try:
            row = con.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'").fetchone()
        except duckdb.CatalogException:
            return 0
        version = int(row[0]) if row else 0
        if version == SCHEMA_VERSION:
            self._migrated = True
        return version

    # ------------------------------------------------------------------------------------ writes

    def record_batch(self, entries: Sequence[OutboxEntry]) -> list[bool]:
        """Record one batch's entries (one per table) atomically; returns which were new.

        An entry already present for the same (query, table, batch) is kept as it is, with its
        intended snapshot id, so a replay changes nothing; if the replay covers other offsets the
        checkpoint and the ledger disagree and :class:`BatchReplayMismatch` is raised.
        """
        inserted: list[bool] = []
        now = datetime.now(UTC)
        with self._transaction() as con:
            for e in entries:
                row = con.execute(
                    "SELECT offsets FROM outbox WHERE query_id = ? AND table_name = ? AND batch_id = ?",
                    [e.query_id, e.table, e.batch_id],
                ).fetchone()
                if row is not None:
                    if json.loads(row[0]) != e.offsets:
                        raise BatchReplayMismatch(
                            f"batch {e.batch_id} of query {e.query_id} for table {e.table} was recorded with "
                            f"offsets {row[0]} but is now replayed with {json.dumps(e.offsets)}; the Spark "
                            "checkpoint does not belong to this ledger"
                        )
                    inserted.append(False)
                    continue
                con.execute(
                    f"INSERT INTO outbox ({_COLUMNS}, record_count) "
                    "VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, NULL, ?)",
                    [
                        e.query_id,
                        e.pipeline,
                        e.table,
                        e.batch_id,
                        PENDING,
                        e.intended_snapshot_id,
                        json.dumps(e.offsets, sort_keys=True),
                        json.dumps([f.to_json() for f in e.files]),
                        json.dumps(e.metrics, sort_keys=True),
                        now,
                        e.record_count,
                    ],
                )
                inserted.append(True)
        return inserted

    def mark_committed(self, entry: OutboxEntry, snapshot_id: int | None) -> None:
        with self._transaction() as con:
            con.execute(
                "UPDATE outbox SET status = ?, committed_snapshot_id = ?, committed_at = ? "
                "WHERE query_id = ? AND table_name = ? AND batch_id = ? AND status = ?",
                [COMMITTED, snapshot_id, datetime.now(UTC), entry.query_id, entry.table, entry.batch_id, PENDING],
            )

    # ------------------------------------------------------------------------------------ reads

    def get(self, query_id: str, table: str, batch_id: int) -> OutboxEntry | None:
        rows = self._read(
            f"SELECT {_COLUMNS} FROM outbox WHERE query_id = ? AND table_name = ? AND batch_id = ?",
            [query_id, table, batch_id],
        )
        return _row_to_entry(rows[0]) if rows else None

    def batch(self, query_id: str, batch_id: int) -> dict[str, OutboxEntry]:
        """The entries recorded for one batch of a query, by table, in one read."""
        rows = self._read(f"SELECT {_COLUMNS} FROM outbox WHERE query_id = ? AND batch_id = ?", [query_id, batch_id])
        return {e.table: e for e in map(_row_to_entry, rows)}

    def entries(self, table: str | None = None, status: str | None = None) -> list[OutboxEntry]:
        """Entries in commit order: by first appearance of their query, then batch id."""
        where, params = [], []
        if table is not None:
            where.append("table_name = ?")
            params.append(table)
        if status is not None:
            where.append("status = ?")
            params.append(status)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._read(
            f"SELECT {_COLUMNS} FROM outbox {clause} "
            "ORDER BY MIN(created_at) OVER (PARTITION BY query_id, table_name), query_id, table_name, batch_id",
            params,
        )
        return [_row_to_entry(r) for r in rows]

    def last_batch_id(self, query_id: str, table: str) -> int:
        """The highest batch id recorded for the query and table, -1 if none."""
        rows = self._read("SELECT max(batch_id) FROM outbox WHERE query_id = ? AND table_name = ?", [query_id, table])
        return -1 if not rows or rows[0][0] is None else int(rows[0][0])

    def pending(self, table: str) -> list[OutboxEntry]:
        return self.entries(table=table, status=PENDING)

    def tables(self) -> list[str]:
        return [r[0] for r in self._read("SELECT DISTINCT table_name FROM outbox ORDER BY 1")]

    def query_ids(self, pipeline: str) -> list[str]:
        return [
            r[0]
            for r in self._read(
                "SELECT query_id FROM outbox WHERE pipeline = ? GROUP BY query_id ORDER BY MIN(created_at)", [pipeline]
            )
        ]

    # ------------------------------------------------------------------------------------ stager lease

    def acquire_lease(self, pipeline: str, holder: str, ttl_s: float) -> StagerLease:
        """Take the pipeline's stager lease, or raise :class:`StagerBusy` naming the live holder.

        A lease that expired, or whose process on this host is gone (a killed ``krishiv run``), is taken over.
        """
        now = datetime.now(UTC)
        lease = StagerLease(pipeline, holder, socket.gethostname(), os.getpid(), now, now + timedelta(seconds=ttl_s))
        with self._transaction() as con:
            row = con.execute(f"SELECT {_LEASE_COLUMNS} FROM stager_lease WHERE pipeline = ?", [pipeline]).fetchone()
            if row is not None:
                current = StagerLease(*row)
                if current.alive(now) and (current.host, current.pid) != (lease.host, lease.pid):
                    raise StagerBusy(f"pipeline {pipeline!r} is already being staged by {current.describe()}")
            con.execute(
                f"INSERT OR REPLACE INTO stager_lease ({_LEASE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                [lease.pipeline, lease.holder, lease.host, lease.pid, lease.acquired_at, lease.expires_at],
            )
        return lease

    def renew_lease(self, lease: StagerLease, ttl_s: float) -> bool:
        """Extend a lease this process holds; False if it was lost to another holder."""
        with self._transaction() as con:
            changed = con.execute(
                "UPDATE stager_lease SET expires_at = ? WHERE pipeline = ? AND host = ? AND pid = ? RETURNING 1",
                [datetime.now(UTC) + timedelta(seconds=ttl_s), lease.pipeline, lease.host, lease.pid],
            ).fetchall()
        return bool(changed)

    def release_lease(self, lease: StagerLease) -> None:
        with self._transaction() as con:
            con.execute(
                "DELETE FROM stager_lease WHERE pipeline = ? AND host = ? AND pid = ?",
                [lease.pipeline, lease.host, lease.pid],
            )

    def live_lease(self, pipeline: str) -> StagerLease | None:
        rows = self._read(f"SELECT {_LEASE_COLUMNS} FROM stager_lease WHERE pipeline = ?", [pipeline])
        lease = StagerLease(*rows[0]) if rows else None
        return lease if lease is not None and lease.alive() else None
