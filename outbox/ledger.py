"""The outbox ledger: one DuckDB file recording every staged batch and whether it reached Iceberg.

DuckDB lets one process at a time hold a file open for writing, and a writer blocks other processes'
read-only opens as well. The Spark driver, the commit relay and the Dagster daemon all use the ledger, so
every operation opens the file, runs one short transaction and closes it again. A lock held by another
process is retried with backoff up to ``lock_timeout_s``; then :class:`LedgerBusyError` names the file
and the holder, and nothing has been written. A file that is not a ledger at all (empty, not a DuckDB
file, or a DuckDB database without the ledger's tables) raises :class:`LedgerCorrupt` at once, and is
never migrated into a ledger; only a file modified in the last few seconds, which another process may be
creating, is given half a second to get its header.

What the hot paths read (sensors, ``krishiv status``, the asset checks) is answered in SQL, never by
loading every entry: each entry's offset ranges are kept one row per partition in ``outbox_offsets`` and
the metrics they sum are columns of ``outbox`` (the JSON stays the record). :meth:`Ledger.compact` folds
COMMITTED entries older than a retention into one archive row per (query, table), keeping the newest entry
of each so the replay checks still find it; every total read includes the archive, and a replay of a
compacted batch is recognised from the offsets the archive covers. :meth:`Ledger.entries` lists only the
entries still in the ledger.

The table ``stager_lease`` fences the stager: a lease names the process (a token drawn once per process
start) and :meth:`Ledger.record_batch` refuses, in its own transaction, to record under a lease that is
no longer this process's. ``offset_skips`` records every operator-approved skip over offsets.
"""

from __future__ import annotations

import functools
import json
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb

from krishiv_core.entries import (
    COMMITTED,
    PENDING,
    CommitOperation,
    OffsetRanges,
    OffsetSkip,
    OutboxEntry,
    StagedFile,
)
from krishiv_core.errors import BatchReplayMismatch, StagerLeaseLost
from krishiv_core.runbook import runbook
from outbox.errors import (
    LedgerBusyError,
    LedgerCorrupt,
    LedgerSchemaError,
    OffsetSkipConflict,
    StagerBusy,
)

DEFAULT_LOCK_TIMEOUT_S = 30.0
_BACKOFF_START_S = 0.005
_BACKOFF_MAX_S = 0.25
#: A file DuckDB calls invalid is retried this long, and only if it was modified in the last
#: ``_FRESH_FILE_S``: another process may have created it and not yet written its header.
_CREATION_GRACE_S = 0.5
_FRESH_FILE_S = 5.0
#: DuckDB's file header: an 8-byte checksum, then the magic bytes.
_DUCKDB_MAGIC = b"DUCK"

#: Committed entries older than this are folded into the archive by :meth:`Ledger.compact`.
DEFAULT_RETENTION_S = 7 * 24 * 3600.0
#: Entries folded per compaction transaction, so no transaction holds the file for long.
COMPACT_CHUNK = 20_000
#: How often the commit path folds old entries (``compact_if_due``): a steady ledger has little to fold.
COMPACT_EVERY_S = 3600.0

#: The metrics kept as columns of ``outbox`` (summed by status and the checks), besides the JSON.
METRIC_COLUMNS = ("records_read", "rejects", "late_events", "windows")


# ------------------------------------------------------------------------------------------ process identity

_TOKEN = uuid.uuid4().hex


def _new_token() -> None:
    global _TOKEN
    _TOKEN = uuid.uuid4().hex


# A forked child is another process: it must not inherit its parent's identity (and its leases).
os.register_at_fork(after_in_child=_new_token)


def process_token() -> str:
    """A random token drawn once per process start (and again in a forked child): names a lease's holder."""
    return _TOKEN


@functools.cache
def node_identity() -> str | None:
    """Where a pid means this process: the boot id and the pid namespace, or None where /proc has neither.

    Containers often share a hostname and start their main process as pid 1, so (host, pid) alone would
    make one container's lease look like another's. Same boot id and same pid-namespace inode: the same
    kernel and the same pid space, where ``kill(pid, 0)`` is about the holder.
    """
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    try:
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        namespace = ""
    return f"{boot}/{namespace}" if boot or namespace else None


# ------------------------------------------------------------------------------------------ values


@dataclass(frozen=True)
class PendingBatch:
    """A PENDING entry's key and age, without its files and offsets."""

    query_id: str
    table: str
    batch_id: int
    created_at: datetime


@dataclass(frozen=True)
class CommitRecord:
    """One commit as the ledger recorded it, for reporting (the Dagster outbox sensor): no files, no metrics.

    ``commit_seq`` orders commits as they reached the ledger; ``committed_snapshot_id`` is None when the batch
    published nothing (or its snapshot had expired when it was found committed); ``commit_ms`` is the catalog
    call's duration when the committing process made it (None when it found the batch already committed).
    """

    commit_seq: int
    table: str
    pipeline: str
    query_id: str
    batch_id: int
    committed_snapshot_id: int | None
    record_count: int
    offsets: OffsetRanges
    created_at: datetime
    committed_at: datetime
    committed_by: str | None
    commit_ms: float | None

    @property
    def staged_to_committed_s(self) -> float:
        """Seconds from the batch's staging (its entry recorded) to its commit."""
        return (self.committed_at - self.created_at).total_seconds()


@dataclass(frozen=True)
class TableSummary:
    """What a table's entries add up to, the archive included (counts are entries, one per batch)."""

    table: str
    pending: int = 0
    committed: int = 0
    archived: int = 0  # of ``committed``, how many were folded into the archive
    records_read: int = 0
    rejects: int = 0
    late_events: int = 0
    committed_records: int = 0  # staged records of the COMMITTED entries: the rows the table received
    last_commit_at: datetime | None = None
    last_snapshot_id: int | None = None
    oldest_pending_at: datetime | None = None
    staged_offsets: dict[str, int] = field(default_factory=dict)  # filled when a topic is given
    committed_offsets: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CommittedBatches:
    """A table's COMMITTED batches: the staged record count of each entry still in the ledger, and the archive's."""

    records: dict[tuple[str, int], int]  # (query id, batch id) -> staged records
    archived_through: dict[str, int]  # query id -> highest batch id folded into the archive
    archived_records: int = 0
    #: The batches committed as a snapshot (a committed snapshot id), rows or not: a merge that only deletes too.
    published: frozenset[tuple[str, int]] = frozenset()

    @property
    def total_records(self) -> int:
        return sum(self.records.values()) + self.archived_records

    def includes(self, query_id: str, batch_id: int) -> bool:
        return (query_id, batch_id) in self.records or batch_id <= self.archived_through.get(query_id, -1)


@dataclass(frozen=True)
class CompactionReport:
    entries_archived: int
    groups: int  # (query, table) pairs that received archived entries
    entries_kept: int  # entries left in the hot table


@dataclass(frozen=True)
class StagerLease:
    """Who is running a pipeline's Spark query now: a ``krishiv run`` process or a Dagster staging run.

    ``token`` names the holding process uniquely (see :func:`process_token`); ``host``, ``pid`` and ``node``
    say where it runs, for people and for the liveness check.
    """

    pipeline: str
    holder: str
    host: str
    pid: int
    acquired_at: datetime
    expires_at: datetime
    token: str | None = None
    node: str | None = None
    committing: bool | None = False  # the holder commits its own batches as it stages them (NULL: an old lease)

    def alive(self, now: datetime | None = None) -> bool:
        """Unexpired, and, when held in this process's pid space, by a process that still exists."""
        if self.expires_at <= (now or datetime.now(UTC)):
            return False
        if self.host == socket.gethostname() and self.node == node_identity():
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
        return True

    @property
    def mine(self) -> bool:
        """Held by this process (the same process start)."""
        return self.token == process_token()

    def describe(self) -> str:
        until = self.expires_at.isoformat(timespec="seconds")
        commits = ", committing its own batches" if self.committing else ""
        return f"{self.holder} (pid {self.pid} on {self.host}{commits}, lease until {until})"


# ------------------------------------------------------------------------------------------ schema

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
    # 3: what the hot paths read, normalised: one row per entry and partition, and the summed metrics as
    # columns, back-filled from the JSON of the entries already there.
    """
    CREATE TABLE outbox_offsets (
        query_id VARCHAR NOT NULL,
        table_name VARCHAR NOT NULL,
        batch_id BIGINT NOT NULL,
        topic VARCHAR NOT NULL,
        partition VARCHAR NOT NULL,
        start_offset BIGINT NOT NULL,
        end_offset BIGINT NOT NULL
    );
    INSERT INTO outbox_offsets
    SELECT o.query_id, o.table_name, o.batch_id, t.topic.key, p.part.key, p.part.value[1], p.part.value[2]
    FROM outbox o,
        unnest(map_entries(CAST(o.offsets AS JSON)::MAP(VARCHAR, MAP(VARCHAR, BIGINT[])))) AS t(topic),
        unnest(map_entries(t.topic.value)) AS p(part);
    DROP INDEX outbox_status;  -- DuckDB alters no table that an index depends on
    ALTER TABLE outbox ADD COLUMN records_read BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE outbox ADD COLUMN rejects BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE outbox ADD COLUMN late_events BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE outbox ADD COLUMN windows BIGINT NOT NULL DEFAULT 0;
    UPDATE outbox SET
        records_read = COALESCE(CAST(json_extract(metrics, '$.records_read') AS BIGINT), 0),
        rejects = COALESCE(CAST(json_extract(metrics, '$.rejects') AS BIGINT), 0),
        late_events = COALESCE(CAST(json_extract(metrics, '$.late_events') AS BIGINT), 0),
        windows = COALESCE(CAST(json_extract(metrics, '$.windows') AS BIGINT), 0);
    CREATE INDEX outbox_status ON outbox (table_name, status);
    """,
    # 4: the archive that compaction folds old COMMITTED entries into, one row per (query, table).
    """
    CREATE TABLE outbox_archive (
        query_id VARCHAR NOT NULL,
        table_name VARCHAR NOT NULL,
        pipeline VARCHAR NOT NULL,
        entries BIGINT NOT NULL,
        record_count BIGINT NOT NULL,
        records_read BIGINT NOT NULL,
        rejects BIGINT NOT NULL,
        late_events BIGINT NOT NULL,
        windows BIGINT NOT NULL,
        min_batch_id BIGINT NOT NULL,
        max_batch_id BIGINT NOT NULL,
        min_created_at TIMESTAMPTZ NOT NULL,
        max_created_at TIMESTAMPTZ NOT NULL,
        last_committed_at TIMESTAMPTZ,
        last_snapshot_id BIGINT,
        last_snapshot_at TIMESTAMPTZ,
        PRIMARY KEY (query_id, table_name)
    );
    CREATE TABLE outbox_archive_offsets (
        query_id VARCHAR NOT NULL,
        table_name VARCHAR NOT NULL,
        topic VARCHAR NOT NULL,
        partition VARCHAR NOT NULL,
        start_offset BIGINT NOT NULL,
        end_offset BIGINT NOT NULL,
        PRIMARY KEY (query_id, table_name, topic, partition)
    );
    """,
    # 5: a lease names its process uniquely (token) and the pid space its pid belongs to (node).
    """
    ALTER TABLE stager_lease ADD COLUMN token VARCHAR;
    ALTER TABLE stager_lease ADD COLUMN node VARCHAR;
    """,
    # 6: operator-approved skips over offsets that cannot be read (deleted by retention, or gone backwards).
    """
    CREATE TABLE offset_skips (
        pipeline VARCHAR NOT NULL,
        query_id VARCHAR NOT NULL,
        topic VARCHAR NOT NULL,
        partition VARCHAR NOT NULL,
        from_offset BIGINT NOT NULL,
        to_offset BIGINT NOT NULL,
        reason VARCHAR NOT NULL,
        operator VARCHAR NOT NULL,
        created_at TIMESTAMPTZ NOT NULL,
        applied_batch_id BIGINT,
        PRIMARY KEY (query_id, topic, partition, from_offset)
    );
    """,
    # 7: how the relay commits an entry (JSON of ``CommitOperation``; NULL is a plain append).
    """
    ALTER TABLE outbox ADD COLUMN operation VARCHAR;
    """,
    # 8: each commit's place in the order of commits (``commit_seq``, from a sequence: the cursor the Dagster
    # sensor reports commits by), who made it and how long the catalog call took; whether a lease's process
    # commits its own batches. Entries committed before this version keep NULLs and are never reported.
    """
    CREATE SEQUENCE outbox_commit_seq START 1;
    ALTER TABLE outbox ADD COLUMN commit_seq BIGINT;
    ALTER TABLE outbox ADD COLUMN committed_by VARCHAR;
    ALTER TABLE outbox ADD COLUMN commit_ms DOUBLE;
    ALTER TABLE stager_lease ADD COLUMN committing BOOLEAN;
    """,
    # 9: the Iceberg schema id of the table schema an entry's files were staged for (its columns' field ids);
    # NULL for entries staged before this version.
    """
    ALTER TABLE outbox ADD COLUMN schema_id INTEGER;
    """,
    # 10: the Kafka topic id (incarnation) each entry was read from, and the archive's offsets per incarnation, so
    # the same (partition, offset) of a re-created topic is told apart from a duplicate ('' where unknown: entries
    # staged before this version, brokers that report no topic id). The old archive ranges are kept under ''. And
    # the Iceberg schema (JSON) an entry's files were staged for, when it changes the table's.
    """
    ALTER TABLE outbox ADD COLUMN topic_id VARCHAR;
    ALTER TABLE outbox ADD COLUMN schema_change VARCHAR;
    CREATE TABLE outbox_archive_ranges (
        query_id VARCHAR NOT NULL,
        table_name VARCHAR NOT NULL,
        topic VARCHAR NOT NULL,
        topic_id VARCHAR NOT NULL,
        partition VARCHAR NOT NULL,
        start_offset BIGINT NOT NULL,
        end_offset BIGINT NOT NULL,
        PRIMARY KEY (query_id, table_name, topic, topic_id, partition)
    );
    INSERT INTO outbox_archive_ranges
    SELECT query_id, table_name, topic, '', partition, start_offset, end_offset FROM outbox_archive_offsets;
    """,
)
SCHEMA_VERSION = len(_MIGRATIONS)

_COLUMNS = (
    "query_id, pipeline, table_name, batch_id, status, intended_snapshot_id, committed_snapshot_id, "
    "offsets, files, metrics, created_at, committed_at, operation, schema_id, topic_id, schema_change"
)
_LEASE_COLUMNS = "pipeline, holder, host, pid, acquired_at, expires_at, token, node, committing"
_SKIP_COLUMNS = (
    "pipeline, query_id, topic, partition, from_offset, to_offset, reason, operator, created_at, applied_batch_id"
)
#: Order of entries for the relay: by first appearance of their query, then batch id.
_COMMIT_ORDER = "MIN(created_at) OVER (PARTITION BY query_id, table_name), query_id, table_name, batch_id"
_PARTITION_ORDER = "TRY_CAST(partition AS BIGINT), partition"


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
        operation,
        schema_id,
        topic_id,
        schema_change,
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
        operation=CommitOperation.from_json(json.loads(operation) if operation else None),
        schema_id=schema_id,
        topic_id=topic_id,
        schema_change=schema_change,
    )


def _rows(cursor: duckdb.DuckDBPyConnection) -> list[tuple[Any, ...]]:
    return cursor.fetchall()


def _columns(cursor: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """A result as NumPy columns: several times quicker to take off the connection than tuples."""
    return cursor.fetchnumpy()


def _column_rows(columns: dict[str, Any] | list[Any]) -> list[tuple[Any, ...]]:
    """Tuples from :func:`_columns`' result (an empty list if the file was missing)."""
    if not columns:
        return []
    assert isinstance(columns, dict)
    return list(zip(*(values.tolist() for values in columns.values()), strict=True))


def _end_offsets_query(
    table: str, topic: str, status: str | None = None, pipeline: str | None = None
) -> tuple[str, list[Any]]:
    """Per partition, the highest end offset of the table's entries (and archive) for a topic.

    The filters avoid joining every entry: a pipeline is its few query ids, and COMMITTED (nearly every
    entry) is everything but the few entries in another status (an anti-join; DuckDB plans a correlated
    NOT EXISTS as a join over every offset row, several times slower).
    """
    join, params = "", []
    if status is not None:
        kind, op = ("ANTI", "<>") if status == COMMITTED else ("SEMI", "=")
        join = (
            f" {kind} JOIN (SELECT query_id, batch_id FROM outbox WHERE table_name = ? AND status {op} ?) o "
            "USING (query_id, batch_id)"
        )
        params += [table, status]
    where = "f.table_name = ? AND f.topic = ?"
    params += [table, topic]
    if pipeline is not None:
        where += " AND f.query_id IN (SELECT DISTINCT query_id FROM outbox WHERE table_name = ? AND pipeline = ?)"
        params += [table, pipeline]
    parts = [f"SELECT f.partition, f.end_offset FROM outbox_offsets f{join} WHERE {where}"]
    if status in (None, COMMITTED):  # the archive holds COMMITTED entries only
        archive_join = " JOIN outbox_archive s USING (query_id, table_name)" if pipeline else ""
        archive_where = "a.table_name = ? AND a.topic = ?" + (" AND s.pipeline = ?" if pipeline else "")
        parts.append(
            f"SELECT a.partition, a.end_offset FROM outbox_archive_offsets a{archive_join} WHERE {archive_where}"
        )
        params += [table, topic] + ([pipeline] if pipeline else [])
    sql = (
        f"SELECT partition, max(end_offset) FROM ({' UNION ALL '.join(parts)}) "
        f"GROUP BY partition ORDER BY {_PARTITION_ORDER}"
    )
    return sql, params


def _staged_and_committed_query(table: str, topic: str, pipeline: str | None = None) -> tuple[str, list[Any]]:
    """Per partition, the highest end offset of all the table's entries and of its COMMITTED ones, in one pass."""
    where, params = "f.table_name = ? AND f.topic = ?", [table, table, topic]
    if pipeline is not None:
        where += " AND f.query_id IN (SELECT DISTINCT query_id FROM outbox WHERE table_name = ? AND pipeline = ?)"
        params += [table, pipeline]
    archive_join = " JOIN outbox_archive s USING (query_id, table_name)" if pipeline else ""
    archive_where = "a.table_name = ? AND a.topic = ?" + (" AND s.pipeline = ?" if pipeline else "")
    params += [table, topic] + ([pipeline] if pipeline else [])
    sql = (
        "SELECT partition, max(end_offset), max(end_offset) FILTER (WHERE committed) FROM ("
        "SELECT f.partition, f.end_offset, o.batch_id IS NULL AS committed FROM outbox_offsets f "
        f"LEFT JOIN (SELECT query_id, batch_id FROM outbox WHERE table_name = ? AND status <> '{COMMITTED}') o "
        f"USING (query_id, batch_id) WHERE {where} "
        f"UNION ALL SELECT a.partition, a.end_offset, true FROM outbox_archive_offsets a{archive_join} "
        f"WHERE {archive_where}) GROUP BY partition ORDER BY {_PARTITION_ORDER}"
    )
    return sql, params


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


# ------------------------------------------------------------------------------------------ the ledger


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
        invalid_since: float | None = None
        with self._process_lock:
            while True:
                try:
                    con = duckdb.connect(self.path, read_only=read_only)
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

        ``fetch`` takes each result off the connection (tuples by default; :func:`_columns` for large results,
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

    # ------------------------------------------------------------------------------------ writes

    def record_batch(self, entries: Sequence[OutboxEntry], lease: StagerLease | None = None) -> list[bool]:
        """Record one batch's entries (one per table) atomically; returns which were new.

        An entry already present for the same (query, table, batch) is kept as it is, with its
        intended snapshot id, so a replay changes nothing; if the replay covers other offsets the
        checkpoint and the ledger disagree and :class:`BatchReplayMismatch` is raised. A batch that
        compaction folded into the archive counts as present when its offsets lie inside what the archive
        committed, and as a mismatch otherwise (the checkpoint was rewound past the retention).

        With ``lease``, the same transaction first checks that the lease is still this process's and
        unexpired, else raises :class:`StagerLeaseLost` naming the current holder; nothing is written.
        """
        inserted: list[bool] = []
        now = datetime.now(UTC)
        with self._transaction() as con:
            if lease is not None:
                self._check_lease(con, lease, now)
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
                            "checkpoint does not belong to this ledger "
                            + runbook("A checkpoint that does not match its ledger")
                        )
                    inserted.append(False)
                    continue
                if self._archived(con, e):
                    inserted.append(False)
                    continue
                con.execute(
                    f"INSERT INTO outbox ({_COLUMNS}, record_count, {', '.join(METRIC_COLUMNS)}) "
                    "VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, NULL, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                        None if e.operation.to_json() is None else json.dumps(e.operation.to_json()),
                        e.schema_id,
                        e.topic_id,
                        e.schema_change,
                        e.record_count,
                        *(int(e.metrics.get(m, 0)) for m in METRIC_COLUMNS),
                    ],
                )
                ranges = [
                    [e.query_id, e.table, e.batch_id, topic, str(p), int(start), int(end)]
                    for topic, parts in e.offsets.items()
                    for p, (start, end) in parts.items()
                ]
                if ranges:  # one statement: DuckDB's executemany runs one per row
                    con.execute(
                        "INSERT INTO outbox_offsets VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * len(ranges)),
                        [value for r in ranges for value in r],
                    )
                inserted.append(True)
        return inserted

    def _archived(self, con: duckdb.DuckDBPyConnection, e: OutboxEntry) -> bool:
        """Whether ``e`` replays a batch compaction folded into the archive (raising if its offsets disagree)."""
        row = con.execute(
            "SELECT max_batch_id FROM outbox_archive WHERE query_id = ? AND table_name = ?", [e.query_id, e.table]
        ).fetchone()
        if row is None or e.batch_id > row[0]:
            return False
        covered = {
            (topic, p): (start, end)
            for topic, p, start, end in con.execute(
                "SELECT topic, partition, start_offset, end_offset FROM outbox_archive_offsets "
                "WHERE query_id = ? AND table_name = ?",
                [e.query_id, e.table],
            ).fetchall()
        }
        for topic, parts in e.offsets.items():
            for p, (start, end) in parts.items():
                lo, hi = covered.get((topic, str(p)), (0, 0))
                if end > start and (start < lo or end > hi):
                    raise BatchReplayMismatch(
                        f"batch {e.batch_id} of query {e.query_id} for table {e.table} was compacted into the "
                        f"ledger's archive (batches up to {row[0]}, which committed {topic} partition {p} "
                        f"offsets [{lo}, {hi})) but is now replayed with {json.dumps(e.offsets)}; the Spark "
                        "checkpoint was rewound past the ledger's retention "
                        + runbook("A checkpoint that does not match its ledger")
                    )
        return True

    def mark_committed(
        self,
        entry: OutboxEntry,
        snapshot_id: int | None,
        committed_by: str | None = None,
        commit_ms: float | None = None,
    ) -> int | None:
        """Mark a PENDING entry COMMITTED (``snapshot_id`` None: nothing published, or the snapshot expired).

        The same transaction gives the commit the next ``commit_seq``, the order in which commits reached the
        ledger (:meth:`commits_since` reads by it), and records ``committed_by`` (``krishiv run``, ``krishiv
        commit``, ``dagster run <id>``) and ``commit_ms``, the catalog call's duration when this process made
        it. Returns the commit's sequence number, or None if the entry was no longer PENDING (nothing changed).
        """
        with self._transaction() as con:
            rows = con.execute(
                "UPDATE outbox SET status = ?, committed_snapshot_id = ?, committed_at = ?, "
                "commit_seq = nextval('outbox_commit_seq'), committed_by = ?, commit_ms = ? "
                "WHERE query_id = ? AND table_name = ? AND batch_id = ? AND status = ? RETURNING commit_seq",
                [
                    COMMITTED,
                    snapshot_id,
                    datetime.now(UTC),
                    committed_by,
                    commit_ms,
                    entry.query_id,
                    entry.table,
                    entry.batch_id,
                    PENDING,
                ],
            ).fetchall()
        return int(rows[0][0]) if rows else None

    def compact(
        self, retention_s: float = DEFAULT_RETENTION_S, now: datetime | None = None, chunk: int = COMPACT_CHUNK
    ) -> CompactionReport:
        """Fold COMMITTED entries committed more than ``retention_s`` ago into the archive, and delete them.

        The newest entry of each (query, table) always stays, whatever its age, so ``last_batch_id``, a
        replay of the latest batch and the source's lookup of it keep working. The archive row keeps the
        entry count, staged records, metric sums, batch range, creation times, the last commit and its
        snapshot, and per partition the offsets covered. Each ``chunk`` of entries is its own transaction,
        so a first compaction of a large ledger does not hold the file for long.
        """
        if not Path(self.path).exists():
            return CompactionReport(0, 0, 0)  # nothing to compact, and no reason to create a ledger
        cutoff = (now or datetime.now(UTC)) - timedelta(seconds=retention_s)
        archived, groups = 0, set()
        while True:
            with self._transaction() as con:
                con.execute(
                    "CREATE TEMP TABLE compacting AS "
                    "SELECT o.* FROM outbox o JOIN "
                    "(SELECT query_id, table_name, max(batch_id) AS newest FROM outbox "
                    "GROUP BY query_id, table_name) n "
                    "USING (query_id, table_name) "
                    "WHERE o.status = ? AND o.committed_at < ? AND o.batch_id < n.newest "
                    "ORDER BY o.committed_at LIMIT ?",
                    [COMMITTED, cutoff, chunk],
                )
                found = con.execute("SELECT count(*) FROM compacting").fetchone()[0]
                if found:
                    groups.update(con.execute("SELECT DISTINCT query_id, table_name FROM compacting").fetchall())
                    self._fold(con)
                con.execute("DROP TABLE compacting")
            archived += found
            if found < chunk:
                break
        kept = self._read("SELECT count(*) FROM outbox")
        return CompactionReport(archived, len(groups), int(kept[0][0]) if kept else 0)

    def compact_if_due(
        self, retention_s: float = DEFAULT_RETENTION_S, every_s: float = COMPACT_EVERY_S, now: datetime | None = None
    ) -> CompactionReport | None:
        """:meth:`compact`, unless the ledger was compacted less than ``every_s`` ago; None when not due.

        Cheap enough to call after every commit run (one read when not due), so a ledger never grows past
        its retention for want of someone running ``krishiv ledger-compact``.
        """
        now = now or datetime.now(UTC)
        last = self._read("SELECT value FROM ledger_meta WHERE key = 'compacted_at'")
        if last and (now - datetime.fromisoformat(last[0][0])).total_seconds() < every_s:
            return None
        report = self.compact(retention_s, now)
        if Path(self.path).exists():
            with self._transaction() as con:
                con.execute("INSERT OR REPLACE INTO ledger_meta VALUES ('compacted_at', ?)", [now.isoformat()])
        return report

    @staticmethod
    def _fold(con: duckdb.DuckDBPyConnection) -> None:
        """Add the temporary table ``compacting``'s entries to the archive and delete them from the hot tables."""
        con.execute(
            """
            INSERT INTO outbox_archive
            SELECT query_id, table_name, any_value(pipeline), count(*), sum(record_count), sum(records_read),
                sum(rejects), sum(late_events), sum(windows), min(batch_id), max(batch_id), min(created_at),
                max(created_at), max(committed_at),
                arg_max(committed_snapshot_id, committed_at) FILTER (WHERE committed_snapshot_id IS NOT NULL),
                max(committed_at) FILTER (WHERE committed_snapshot_id IS NOT NULL)
            FROM compacting GROUP BY query_id, table_name
            ON CONFLICT (query_id, table_name) DO UPDATE SET
                entries = entries + excluded.entries,
                record_count = record_count + excluded.record_count,
                records_read = records_read + excluded.records_read,
                rejects = rejects + excluded.rejects,
                late_events = late_events + excluded.late_events,
                windows = windows + excluded.windows,
                min_batch_id = least(min_batch_id, excluded.min_batch_id),
                max_batch_id = greatest(max_batch_id, excluded.max_batch_id),
                min_created_at = least(min_created_at, excluded.min_created_at),
                max_created_at = greatest(max_created_at, excluded.max_created_at),
                last_committed_at = greatest(last_committed_at, excluded.last_committed_at),
                last_snapshot_id = CASE
                    WHEN excluded.last_snapshot_at IS NOT NULL
                        AND (last_snapshot_at IS NULL OR excluded.last_snapshot_at >= last_snapshot_at)
                    THEN excluded.last_snapshot_id ELSE last_snapshot_id END,
                last_snapshot_at = greatest(last_snapshot_at, excluded.last_snapshot_at)
            """
        )
        con.execute(
            """
            INSERT INTO outbox_archive_offsets
            SELECT f.query_id, f.table_name, f.topic, f.partition, min(f.start_offset), max(f.end_offset)
            FROM outbox_offsets f JOIN compacting c USING (query_id, table_name, batch_id)
            GROUP BY f.query_id, f.table_name, f.topic, f.partition
            ON CONFLICT (query_id, table_name, topic, partition) DO UPDATE SET
                start_offset = least(start_offset, excluded.start_offset),
                end_offset = greatest(end_offset, excluded.end_offset)
            """
        )
        con.execute(
            """
            INSERT INTO outbox_archive_ranges
            SELECT f.query_id, f.table_name, f.topic, coalesce(c.topic_id, ''), f.partition, min(f.start_offset),
                max(f.end_offset)
            FROM outbox_offsets f JOIN compacting c USING (query_id, table_name, batch_id)
            GROUP BY f.query_id, f.table_name, f.topic, coalesce(c.topic_id, ''), f.partition
            ON CONFLICT (query_id, table_name, topic, topic_id, partition) DO UPDATE SET
                start_offset = least(start_offset, excluded.start_offset),
                end_offset = greatest(end_offset, excluded.end_offset)
            """
        )
        for table in ("outbox_offsets", "outbox"):
            con.execute(
                f"DELETE FROM {table} USING compacting c WHERE {table}.query_id = c.query_id "
                f"AND {table}.table_name = c.table_name AND {table}.batch_id = c.batch_id"
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
        """Entries in commit order: by first appearance of their query, then batch id.

        Every entry still in the ledger, parsed whole: for tools that want them all (the oracle, the
        chaos checks). Hot paths use the aggregate reads below; compacted entries are not listed here.
        """
        where, params = [], []
        if table is not None:
            where.append("table_name = ?")
            params.append(table)
        if status is not None:
            where.append("status = ?")
            params.append(status)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._read(f"SELECT {_COLUMNS} FROM outbox {clause} ORDER BY {_COMMIT_ORDER}", params)
        return [_row_to_entry(r) for r in rows]

    def last_batch_id(self, query_id: str, table: str) -> int:
        """The highest batch id recorded for the query and table, -1 if none."""
        rows = self._read(
            "SELECT greatest(max(batch_id), (SELECT max(max_batch_id) FROM outbox_archive "
            "WHERE query_id = ? AND table_name = ?)) FROM outbox WHERE query_id = ? AND table_name = ?",
            [query_id, table, query_id, table],
        )
        return -1 if not rows or rows[0][0] is None else int(rows[0][0])

    def recorded_ends(self, query_id: str, table: str, topic: str, after_batch_id: int) -> dict[int, dict[str, int]]:
        """End offsets of the batches recorded for the query and table past ``after_batch_id``, by batch id.

        A rewound checkpoint makes Spark plan these batch ids again; the source must give them exactly these ends.
        """
        rows = self._read(
            "SELECT batch_id, partition, end_offset FROM outbox_offsets "
            "WHERE query_id = ? AND table_name = ? AND topic = ? AND batch_id > ?",
            [query_id, table, topic, after_batch_id],
        )
        ends: dict[int, dict[str, int]] = {}
        for batch_id, partition, end in rows:
            ends.setdefault(int(batch_id), {})[str(partition)] = int(end)
        return ends

    def pending(self, table: str) -> list[OutboxEntry]:
        """The table's PENDING entries, whole, in commit order (only PENDING rows are read)."""
        return self.entries(table=table, status=PENDING)

    def pending_batches(self, tables: Sequence[str] | None = None, pipeline: str | None = None) -> list[PendingBatch]:
        """The keys and ages of PENDING entries (of ``tables``, or all), in commit order, without their JSON. With
        ``pipeline``, its batches' entries too, whatever table they name (a route since removed from the spec)."""
        clause, params = "", []
        if tables is not None:
            names = f"table_name IN ({', '.join('?' * len(tables))})" if tables else "FALSE"
            clause = f" AND ({names}{' OR pipeline = ?' if pipeline is not None else ''})"
            params = [*tables, *([pipeline] if pipeline is not None else [])]
            if not tables and pipeline is None:
                return []
        elif pipeline is not None:
            clause, params = " AND pipeline = ?", [pipeline]
        rows = self._read(
            f"SELECT query_id, table_name, batch_id, created_at FROM outbox WHERE status = ?{clause} "
            f"ORDER BY {_COMMIT_ORDER}",
            [PENDING, *params],
        )
        return [PendingBatch(*r) for r in rows]

    def pending_tables(self, pipelines: Sequence[str] | None = None) -> list[str]:
        """The tables with PENDING entries (of ``pipelines``' batches, or of any), in name order: each entry names
        the table it was staged for, whatever the spec says now (a route removed since still has its entries)."""
        clause, params = "", []
        if pipelines is not None:
            if not pipelines:
                return []
            clause = f" AND pipeline IN ({', '.join('?' * len(pipelines))})"
            params = list(pipelines)
        rows = self._read(
            f"SELECT DISTINCT table_name FROM outbox WHERE status = ?{clause} ORDER BY 1", [PENDING, *params]
        )
        return [r[0] for r in rows]

    def pending_pipelines(self) -> list[str]:
        """The pipelines with PENDING entries, in name order."""
        return [r[0] for r in self._read("SELECT DISTINCT pipeline FROM outbox WHERE status = ? ORDER BY 1", [PENDING])]

    def commits_since(
        self, commit_seq: int, tables: Sequence[str] | None = None, limit: int = 50
    ) -> list[CommitRecord]:
        """The commits after ``commit_seq`` (of ``tables``, or all), oldest first, at most ``limit``.

        A cursor over the ledger's commits: pass the last record's ``commit_seq`` to read on. Only entries still
        in the ledger are read: commits that :meth:`compact` folded into the archive before a reader reached them
        are skipped (they are older than the retention), and commits recorded before schema version 8 have no
        sequence number and are never listed.
        """
        clause, params = "", [commit_seq]
        if tables is not None:
            if not tables:
                return []
            clause = f" AND table_name IN ({', '.join('?' * len(tables))})"
            params += list(tables)
        rows = self._read(
            "SELECT commit_seq, table_name, pipeline, query_id, batch_id, committed_snapshot_id, record_count, "
            "offsets, created_at, committed_at, committed_by, commit_ms FROM outbox "
            f"WHERE commit_seq > ?{clause} ORDER BY commit_seq LIMIT ?",
            [*params, limit],
        )
        return [
            CommitRecord(
                int(seq), table, pipeline, query, int(batch), snapshot, int(records), json.loads(offsets), *rest
            )
            for seq, table, pipeline, query, batch, snapshot, records, offsets, *rest in rows
        ]

    def last_commit_seq(self) -> int:
        """The highest ``commit_seq`` given so far, 0 if none (a reader starting now reads on from it).

        From the sequence itself, so a commit compaction already folded away still counts.
        """
        rows = self._read(
            "SELECT greatest((SELECT max(commit_seq) FROM outbox), (SELECT last_value FROM duckdb_sequences() "
            "WHERE sequence_name = 'outbox_commit_seq'))"
        )
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    def end_offsets(
        self, table: str, topic: str, status: str | None = None, pipeline: str | None = None
    ) -> dict[str, int]:
        """Per partition, the end offset of the newest batch of ``table`` covering ``topic`` (archive included).

        With ``status``, only entries in that status count; with ``pipeline``, only that pipeline's.
        """
        sql, params = _end_offsets_query(table, topic, status, pipeline)
        return {p: int(end) for p, end in self._read(sql, params)}

    def table_summary(self, table: str, pipeline: str | None = None, topic: str | None = None) -> TableSummary:
        """Counts by status, metric sums, the last commit and the oldest PENDING entry, archive included.

        With ``topic``, also the staged and committed end offsets per partition; all in one open of the file.
        """
        where, params = "table_name = ?", [table]
        if pipeline is not None:
            where += " AND pipeline = ?"
            params.append(pipeline)
        queries: list[tuple[str, Sequence[Any]]] = [
            (
                "SELECT count(*) FILTER (WHERE status = 'PENDING'), count(*) FILTER (WHERE status = 'COMMITTED'), "
                "sum(records_read), sum(rejects), sum(late_events), "
                "sum(record_count) FILTER (WHERE status = 'COMMITTED'), "
                "max(committed_at) FILTER (WHERE status = 'COMMITTED'), "
                "arg_max(committed_snapshot_id, committed_at) "
                "FILTER (WHERE status = 'COMMITTED' AND committed_snapshot_id IS NOT NULL), "
                "max(committed_at) FILTER (WHERE status = 'COMMITTED' AND committed_snapshot_id IS NOT NULL), "
                f"min(created_at) FILTER (WHERE status = 'PENDING') FROM outbox WHERE {where}",
                params,
            ),
            (
                "SELECT sum(entries), sum(records_read), sum(rejects), sum(late_events), sum(record_count), "
                "max(last_committed_at), arg_max(last_snapshot_id, last_snapshot_at), max(last_snapshot_at) "
                f"FROM outbox_archive WHERE {where}",
                params,
            ),
        ]
        if topic is not None:
            queries.append(_staged_and_committed_query(table, topic, pipeline))
        results = self._reads(queries)
        if not results[0]:
            return TableSummary(table)
        (pending, committed, read, rejects, late, records, last_at, snap, snap_at, oldest) = results[0][0]
        (a_entries, a_read, a_rejects, a_late, a_records, a_last_at, a_snap, a_snap_at) = results[1][0]
        if a_snap_at is not None and (snap_at is None or a_snap_at > snap_at):
            snap = a_snap
        last = [t for t in (last_at, a_last_at) if t is not None]
        return TableSummary(
            table,
            pending=pending,
            committed=committed + int(a_entries or 0),
            archived=int(a_entries or 0),
            records_read=int(read or 0) + int(a_read or 0),
            rejects=int(rejects or 0) + int(a_rejects or 0),
            late_events=int(late or 0) + int(a_late or 0),
            committed_records=int(records or 0) + int(a_records or 0),
            last_commit_at=max(last, default=None),
            last_snapshot_id=snap,
            oldest_pending_at=oldest,
            staged_offsets={p: int(e) for p, e, _ in results[2]} if topic is not None else {},
            committed_offsets={p: int(c) for p, _, c in results[2] if c is not None} if topic is not None else {},
        )

    def incarnations_reading(
        self, pipeline: str, topic: str, offsets: Sequence[tuple[int, int]]
    ) -> dict[tuple[int, int], int]:
        """For each ``(partition, offset)`` of ``offsets`` that a COMMITTED batch of ``pipeline`` read: from how many
        incarnations of ``topic`` (distinct topic ids; an unknown id counts as one), archive included. A topic
        deleted and re-created starts its offsets at 0 again, so each incarnation may put an offset in one row."""
        if not offsets:
            return {}
        rows = self._read(
            """
            WITH wanted AS (SELECT unnest(?::BIGINT[]) AS p, unnest(?::BIGINT[]) AS o),
            ranges AS (
                SELECT f.partition, f.start_offset, f.end_offset, coalesce(e.topic_id, '') AS topic_id
                FROM outbox_offsets f JOIN outbox e USING (query_id, table_name, batch_id)
                WHERE e.pipeline = ? AND e.status = ? AND f.topic = ?
                UNION ALL
                SELECT r.partition, r.start_offset, r.end_offset, r.topic_id
                FROM outbox_archive_ranges r JOIN outbox_archive a USING (query_id, table_name)
                WHERE a.pipeline = ? AND r.topic = ?
            )
            SELECT w.p, w.o, count(DISTINCT r.topic_id) FROM wanted w JOIN ranges r
                ON r.partition = CAST(w.p AS VARCHAR) AND w.o >= r.start_offset AND w.o < r.end_offset
            GROUP BY w.p, w.o
            """,
            [[int(p) for p, _ in offsets], [int(o) for _, o in offsets], pipeline, COMMITTED, topic, pipeline, topic],
        )
        return {(int(p), int(o)): int(n) for p, o, n in rows}

    def committed_batches(self, table: str) -> CommittedBatches:
        """The table's COMMITTED batches with their staged record counts (keys only, no JSON), archive included."""
        hot, archive = self._reads(
            [
                (
                    "SELECT query_id, batch_id, record_count, committed_snapshot_id IS NOT NULL FROM outbox "
                    f"WHERE table_name = ? AND status = ? ORDER BY {_COMMIT_ORDER}",
                    [table, COMMITTED],
                ),
                ("SELECT query_id, max_batch_id, record_count FROM outbox_archive WHERE table_name = ?", [table]),
            ],
            fetch=_columns,
        )
        hot, archive = _column_rows(hot), _column_rows(archive)
        return CommittedBatches(
            records={(q, b): int(n) for q, b, n, _ in hot},
            archived_through={q: int(b) for q, b, _ in archive},
            archived_records=sum(int(n) for _, _, n in archive),
            published=frozenset((q, b) for q, b, _, snapshot in hot if snapshot),
        )

    def last_committed_batch(self, query_id: str, table: str) -> int | None:
        """The highest COMMITTED batch of the query that gave ``table`` rows (archive included), None if none."""
        rows = self._read(
            "SELECT greatest((SELECT max(batch_id) FROM outbox WHERE query_id = ? AND table_name = ? "
            "AND status = ? AND record_count > 0), (SELECT max(max_batch_id) FROM outbox_archive "
            "WHERE query_id = ? AND table_name = ? AND record_count > 0))",
            [query_id, table, COMMITTED, query_id, table],
        )
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    def missing_batches(self, query_id: str, table: str, batch_ids: Sequence[int]) -> list[int]:
        """Those of ``batch_ids`` the ledger holds no entry of for the query and table (archived ones are held)."""
        if not batch_ids:
            return []
        hot, archive = self._reads(
            [
                (
                    "SELECT batch_id FROM outbox WHERE query_id = ? AND table_name = ? AND batch_id BETWEEN ? AND ?",
                    [query_id, table, min(batch_ids), max(batch_ids)],
                ),
                ("SELECT max_batch_id FROM outbox_archive WHERE query_id = ? AND table_name = ?", [query_id, table]),
            ]
        )
        held = {int(b) for (b,) in hot}
        archived_through = int(archive[0][0]) if archive else -1
        return sorted(b for b in set(batch_ids) if b not in held and b > archived_through)

    def staged_paths(self, table: str) -> set[str]:
        """Every staged file the entries of ``table`` still in the ledger refer to (PENDING or COMMITTED)."""
        return {
            f["path"]
            for (files,) in self._read("SELECT files FROM outbox WHERE table_name = ?", [table])
            for f in json.loads(files)
        }

    def replace_files(self, entry: OutboxEntry, files: Sequence[StagedFile]) -> bool:
        """Give a PENDING entry new staged files (its old ones are gone); False if it is no longer PENDING.

        Offsets, intended snapshot id and record count stay: the files hold the same rows again.
        """
        with self._transaction() as con:
            changed = con.execute(
                "UPDATE outbox SET files = ? WHERE query_id = ? AND table_name = ? AND batch_id = ? "
                "AND status = ? AND record_count = ? RETURNING 1",
                [
                    json.dumps([f.to_json() for f in files]),
                    entry.query_id,
                    entry.table,
                    entry.batch_id,
                    PENDING,
                    sum(f.records for f in files),
                ],
            ).fetchall()
        return bool(changed)

    def tables(self) -> list[str]:
        return [
            r[0]
            for r in self._read("SELECT table_name FROM outbox UNION SELECT table_name FROM outbox_archive ORDER BY 1")
        ]

    def query_ids(self, pipeline: str) -> list[str]:
        """The pipeline's query ids, oldest first (the archive remembers when compacted queries began)."""
        return [
            r[0]
            for r in self._read(
                "SELECT query_id FROM (SELECT query_id, created_at FROM outbox WHERE pipeline = ? "
                "UNION ALL SELECT query_id, min_created_at FROM outbox_archive WHERE pipeline = ?) "
                "GROUP BY query_id ORDER BY MIN(created_at), query_id",
                [pipeline, pipeline],
            )
        ]

    # ------------------------------------------------------------------------------------ offset skips

    def record_skip(
        self,
        pipeline: str,
        query_id: str,
        topic: str,
        partition: str | int,
        from_offset: int,
        to_offset: int,
        reason: str,
        operator: str,
    ) -> OffsetSkip:
        """Record an operator's skip of a partition from ``from_offset`` to ``to_offset``; returns it.

        Recording the same skip again returns the first record; a different ``to_offset`` for the same
        (query, topic, partition, from offset) raises :class:`OffsetSkipConflict`.
        """
        if from_offset < 0 or to_offset < 0:
            raise ValueError(f"offsets must not be negative, got {from_offset} -> {to_offset}")
        key = [query_id, topic, str(partition), from_offset]
        with self._transaction() as con:
            row = con.execute(
                f"SELECT {_SKIP_COLUMNS} FROM offset_skips "
                "WHERE query_id = ? AND topic = ? AND partition = ? AND from_offset = ?",
                key,
            ).fetchone()
            if row is not None:
                existing = OffsetSkip(*row)
                if existing.to_offset != to_offset:
                    raise OffsetSkipConflict(
                        f"query {query_id} already has a skip of {topic} partition {partition} from offset "
                        f"{from_offset} to {existing.to_offset} (by {existing.operator}); not recording one to "
                        f"{to_offset}: run the query, which applies it, then skip again from where it stops "
                        + runbook("Offsets a query cannot read exactly")
                    )
                return existing
            skip = OffsetSkip(
                pipeline, query_id, topic, str(partition), from_offset, to_offset, reason, operator, datetime.now(UTC)
            )
            con.execute(
                f"INSERT INTO offset_skips ({_SKIP_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                [
                    skip.pipeline,
                    skip.query_id,
                    skip.topic,
                    skip.partition,
                    skip.from_offset,
                    skip.to_offset,
                    skip.reason,
                    skip.operator,
                    skip.created_at,
                ],
            )
        return skip

    def skips(self, query_id: str, topic: str | None = None) -> list[OffsetSkip]:
        """The query's recorded skips (of one topic, or all), by partition and offset."""
        clause, params = "", [query_id]
        if topic is not None:
            clause = " AND topic = ?"
            params.append(topic)
        rows = self._read(
            f"SELECT {_SKIP_COLUMNS} FROM offset_skips WHERE query_id = ?{clause} "
            f"ORDER BY topic, {_PARTITION_ORDER}, from_offset",
            params,
        )
        return [OffsetSkip(*r) for r in rows]

    def mark_skip_applied(self, skip: OffsetSkip, batch_id: int) -> OffsetSkip:
        """Record the batch that applied ``skip``; applying it again in the same batch (a replay) changes nothing.

        Raises :class:`OffsetSkipConflict` if another batch already applied it, or it was never recorded.
        """
        key = [skip.query_id, skip.topic, skip.partition, skip.from_offset]
        where = "WHERE query_id = ? AND topic = ? AND partition = ? AND from_offset = ?"
        with self._transaction() as con:
            row = con.execute(f"SELECT {_SKIP_COLUMNS} FROM offset_skips {where}", key).fetchone()
            if row is None:
                raise OffsetSkipConflict(
                    f"no skip of {skip.topic} partition {skip.partition} from offset {skip.from_offset} is recorded "
                    f"for query {skip.query_id} {runbook('A checkpoint that does not match its ledger')}"
                )
            current = OffsetSkip(*row)
            if current.applied_batch_id == batch_id:
                return current
            if current.applied_batch_id is not None:
                raise OffsetSkipConflict(
                    f"the skip of {skip.topic} partition {skip.partition} from offset {skip.from_offset} was applied "
                    f"by batch {current.applied_batch_id} of query {skip.query_id}, not {batch_id} "
                    + runbook("A checkpoint that does not match its ledger")
                )
            con.execute(f"UPDATE offset_skips SET applied_batch_id = ? {where}", [batch_id, *key])
        return OffsetSkip(*(*row[:-1], batch_id))

    # ------------------------------------------------------------------------------------ stager lease

    def acquire_lease(self, pipeline: str, holder: str, ttl_s: float, committing: bool = False) -> StagerLease:
        """Take the pipeline's stager lease, or raise :class:`StagerBusy` naming the live holder.

        A lease that expired, or whose process in this pid space is gone (a killed ``krishiv run``), is taken
        over. This process taking its own lease again renews it. ``committing`` tells readers (the Dagster
        outbox sensor) that the holder commits each batch it stages itself.
        """
        now = datetime.now(UTC)
        lease = StagerLease(
            pipeline,
            holder,
            socket.gethostname(),
            os.getpid(),
            now,
            now + timedelta(seconds=ttl_s),
            process_token(),
            node_identity(),
            committing,
        )
        with self._transaction() as con:
            row = con.execute(f"SELECT {_LEASE_COLUMNS} FROM stager_lease WHERE pipeline = ?", [pipeline]).fetchone()
            if row is not None:
                current = StagerLease(*row)
                if current.alive(now) and not current.mine:
                    raise StagerBusy(
                        f"pipeline {pipeline!r} is already being staged by {current.describe()}: wait for it to "
                        f"finish, or stop it, then run again {runbook('Another run holds the pipeline')}"
                    )
            con.execute(
                f"INSERT OR REPLACE INTO stager_lease ({_LEASE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    lease.pipeline,
                    lease.holder,
                    lease.host,
                    lease.pid,
                    lease.acquired_at,
                    lease.expires_at,
                    lease.token,
                    lease.node,
                    lease.committing,
                ],
            )
        return lease

    def renew_lease(self, lease: StagerLease, ttl_s: float) -> bool:
        """Extend a lease this process holds; False if it expired or was taken over (it is lost for good).

        An expired lease is not revived even if nobody took it: :meth:`record_batch` already refuses to
        record under it, so the stager has to stop either way.
        """
        now = datetime.now(UTC)
        with self._transaction() as con:
            changed = con.execute(
                "UPDATE stager_lease SET expires_at = ? "
                "WHERE pipeline = ? AND token = ? AND expires_at > ? RETURNING 1",
                [now + timedelta(seconds=ttl_s), lease.pipeline, lease.token, now],
            ).fetchall()
        return bool(changed)

    def release_lease(self, lease: StagerLease) -> None:
        with self._transaction() as con:
            con.execute("DELETE FROM stager_lease WHERE pipeline = ? AND token = ?", [lease.pipeline, lease.token])

    def lease_held(self, lease: StagerLease) -> bool:
        """Whether ``lease`` is still this process's and unexpired."""
        rows = self._read(
            "SELECT 1 FROM stager_lease WHERE pipeline = ? AND token = ? AND expires_at > ?",
            [lease.pipeline, lease.token, datetime.now(UTC)],
        )
        return bool(rows) and lease.token == process_token()

    def newest_topic_id(self, table: str) -> str | None:
        """The topic id (incarnation) the table's newest entry still in the ledger was read from, if recorded."""
        rows = self._read(
            "SELECT topic_id FROM outbox WHERE table_name = ? AND topic_id IS NOT NULL AND topic_id <> '' "
            "ORDER BY created_at DESC LIMIT 1",
            [table],
        )
        return rows[0][0] if rows else None

    def current_lease(self, pipeline: str) -> StagerLease | None:
        """The pipeline's lease row as it stands, live or not."""
        rows = self._read(f"SELECT {_LEASE_COLUMNS} FROM stager_lease WHERE pipeline = ?", [pipeline])
        return StagerLease(*rows[0]) if rows else None

    def live_lease(self, pipeline: str) -> StagerLease | None:
        lease = self.current_lease(pipeline)
        return lease if lease is not None and lease.alive() else None

    @staticmethod
    def _check_lease(con: duckdb.DuckDBPyConnection, lease: StagerLease, now: datetime) -> None:
        row = con.execute(f"SELECT {_LEASE_COLUMNS} FROM stager_lease WHERE pipeline = ?", [lease.pipeline]).fetchone()
        current = StagerLease(*row) if row is not None else None
        if current is not None and current.token == lease.token and lease.mine and current.expires_at > now:
            return
        if current is None:
            holder = "nobody holds it now"
        elif current.token != lease.token:
            holder = f"now held by {current.describe()}"
        elif not lease.mine:
            holder = f"held by {current.describe()}, another process"
        else:
            holder = f"it expired at {current.expires_at.isoformat(timespec='seconds')} without a renewal"
        raise StagerLeaseLost(lease.pipeline, holder)
