"""The ledger on a PostgreSQL server: for deployments whose stager, relay and Dagster runs share no disk.

A ``postgresql://`` location names the server and database as libpq does (``postgresql+psycopg://`` and
``postgres://`` too), so the catalog's URI can be reused; credentials come from the URI or from libpq's
environment (``PGPASSWORD``, ``PGPASSFILE``, ``PGSSLMODE``…), as the catalog's do. The ledger lives in one schema,
``?schema=`` (default ``krishiv``), made on the first write; a schema holding other tables is refused.

Writes are serialized as DuckDB's file lock serializes them: every write transaction first takes a transaction
advisory lock keyed by the schema, so two processes on two hosts never interleave (a lease check and the batch it
fences are one atomic step). A lock held past ``lock_timeout_s`` is :class:`LedgerBusyError`, naming the holder.
A server that does not answer is retried for the same budget, then :class:`LedgerUnavailable`; so is a statement
it does not answer within the budget (a server paused or stalled while TCP still acknowledges: no keepalive or
TCP timeout notices that). A connection lost during a write is :class:`LedgerUnavailable` as well: before ``COMMIT``
nothing was written (the server rolls the transaction back); during it the outcome is unknown, and the protocol
settles it as for any unknown outcome (a batch recorded again is a replay; an entry marked again is found
committed). A client stopped inside a transaction loses its session after ``idle_in_transaction_session_timeout``
(:data:`IDLE_IN_TRANSACTION_TIMEOUT_S`), releasing the lock; when it wakes, its write is refused as not written.

This is the one module that calls psycopg.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg

from krishiv_core.catalog import redact
from krishiv_core.postgres_location import libpq_uri_problem
from krishiv_core.spec_sections import SERVER_LEDGER_SCHEMES
from outbox.errors import LedgerBusyError, LedgerCorrupt, LedgerLocationWrong, LedgerUnavailable
from outbox.ledger.dialect import Dialect, postgres_dialect
from outbox.ledger.schema import POSTGRES_MIGRATIONS

DEFAULT_SCHEMA = "krishiv"
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
#: First key of the advisory lock every write takes ("KRSV"); the second is the schema's hash.
_LOCK_CLASS = 0x4B525356 & 0x7FFFFFFF
_BACKOFF_START_S = 0.005
_BACKOFF_MAX_S = 0.25
#: libpq settings Krishiv gives a connection unless the URI sets them: a server that stops answering is noticed
#: (connection, keepalives, unacknowledged data) instead of waited on for ever.
_CONNECTION_DEFAULTS = {
    "connect_timeout": "10",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}
_SESSION_OPTIONS = "-c TimeZone=UTC"
#: How long the server keeps a session idle inside a transaction before ending it, and the advisory lock with it: a
#: client stopped inside a write (paused, its host lost) holds the ledger no longer than this.
IDLE_IN_TRANSACTION_TIMEOUT_S = 60.0
#: libpq's shortest connect_timeout (a smaller one is taken as 2 s); the shortest wait for a statement's answer too,
#: so a tiny budget does not cut a healthy server's slower statements (a migration).
_MIN_CONNECT_TIMEOUT_S = 2
#: The errors that say the session is gone, and the transaction with it (never committed): the connection was lost
#: or timed out, or the server ended a session left idle in its transaction (which it reports as an error).
_SESSION_LOST: tuple[type[Exception], ...] = (
    psycopg.OperationalError,
    psycopg.errors.IdleInTransactionSessionTimeout,
)
DIALECT = postgres_dialect(POSTGRES_MIGRATIONS)
#: How psycopg says libpq refused a connection before trying it; followed by ``invalid``, a setting's value was
#: wrong (``invalid sslmode value: "requir"``), which no retry makes right.
_BAD_CONNECTION = "connection is bad: "
_SETTING_REFUSED = _BAD_CONNECTION + "invalid "


def is_postgres_location(location: str) -> bool:
    return location.startswith(SERVER_LEDGER_SCHEMES)


@lru_cache(maxsize=512)
def _placeholders(sql: str) -> str:
    """The ledger's ``?`` placeholders as psycopg's ``%s`` (and a literal ``%`` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


class _Connection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait for the server is bounded by :attr:`answer_within_s`: a server that
    stops answering while TCP still acknowledges (paused, stalled) is an :class:`~psycopg.OperationalError` then."""

    answer_within_s: float | None = None

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        if self.answer_within_s is None or "timeout" in kwargs:
            return super().wait(gen, *args, **kwargs)
        try:
            return super().wait(gen, *args, timeout=self.answer_within_s, **kwargs)
        except psycopg.OperationalError as exc:
            if type(exc).__name__ != "_WaitTimeout":
                raise
            raise psycopg.OperationalError(f"for {self.answer_within_s:.1f}s, with a statement in flight") from None


class _Session:
    """A psycopg connection that takes the ledger's statements as they are written (``?`` placeholders)."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.connection = connection

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> psycopg.Cursor[Any]:
        if not params:  # no parameters: sent as is (several statements allowed, as migrations have)
            return self.connection.execute(sql.encode())
        return self.connection.execute(_placeholders(sql).encode(), list(params))


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _refusal(exc: psycopg.OperationalError) -> str | None:
    """What the server said when it refused the connection itself (authentication, a missing database, a bad
    setting), or None if it did not answer (down, starting up, shutting down: worth waiting for)."""
    text = str(exc)
    if "FATAL:" not in text or "the database system is" in text:
        return None
    return " ".join(text.split("FATAL:", 1)[1].split())


def _roll_back(session: _Session) -> None:
    with contextlib.suppress(psycopg.OperationalError):  # the connection is gone, and its transaction with it
        session.execute("ROLLBACK")


class PostgresLedger:
    """A ledger in one schema of a PostgreSQL database."""

    dialect: Dialect = DIALECT

    def __init__(self, uri: str, lock_timeout_s: float) -> None:
        if problem := libpq_uri_problem(uri, own=("schema",)):
            raise LedgerLocationWrong(redact(uri), problem)
        parts = urlsplit(uri)
        query = parse_qsl(parts.query, keep_blank_values=True)
        schemas = [value for key, value in query if key == "schema"]
        self.schema = schemas[-1] if schemas else DEFAULT_SCHEMA
        if not _SCHEMA_NAME.match(self.schema):
            raise LedgerCorrupt(
                redact(uri),
                f"schema={self.schema!r} is not a plain PostgreSQL name (lower-case letters, digits, _)",
                "PostgreSQL",
            )
        settings = dict(_CONNECTION_DEFAULTS)
        settings.update((key, value) for key, value in query if key != "schema")
        idle_ms = round(IDLE_IN_TRANSACTION_TIMEOUT_S * 1000)
        settings["options"] = (
            f"{settings.get('options', '')} -c search_path={self.schema} {_SESSION_OPTIONS} "
            f"-c idle_in_transaction_session_timeout={idle_ms}"
        ).strip()
        settings.setdefault("application_name", "krishiv")
        scheme = "postgresql"
        self._conninfo = urlunsplit((scheme, parts.netloc, parts.path, urlencode(settings, quote_via=quote), ""))
        #: How the ledger is named in messages: the URI with its password hidden, and the schema.
        shown = [(k, v) for k, v in query if k != "schema"] + [("schema", self.schema)]
        self.path = redact(urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(shown, quote_via=quote), "")))
        self.lock_timeout_s = lock_timeout_s
        try:
            configured = float(settings.get("connect_timeout") or 0)
        except ValueError:
            configured = 0.0
        self._connect_timeout_s = configured if configured > 0 else math.inf  # libpq: 0 or none is no timeout
        self._seen = False  # the ledger's tables were found once: they are not looked for again

    def _open(self) -> _Session:
        """A connection, retried with backoff while the server does not answer, up to ``lock_timeout_s``."""
        started = time.monotonic()
        delay = _BACKOFF_START_S
        while True:
            # An attempt waits no longer than the budget left (a paused server takes the connection, never answers).
            left = self.lock_timeout_s - (time.monotonic() - started)
            timeout = min(self._connect_timeout_s, max(_MIN_CONNECT_TIMEOUT_S, math.ceil(left)))
            try:
                connection = _Connection.connect(self._conninfo, autocommit=True, connect_timeout=int(timeout))
                connection.answer_within_s = max(self.lock_timeout_s, _MIN_CONNECT_TIMEOUT_S)
                return _Session(connection)
            except psycopg.OperationalError as exc:
                waited = time.monotonic() - started
                if str(exc).startswith(_SETTING_REFUSED):  # libpq's word on a value, before any server: the location
                    raise LedgerLocationWrong(self.path, _reason(exc).removeprefix(_BAD_CONNECTION)) from None
                if refusal := _refusal(exc):  # the server answered: no waiting makes a wrong password or database right
                    raise LedgerUnavailable(self.path, refusal, written=False, refused=True) from None
                if waited >= self.lock_timeout_s:
                    raise LedgerUnavailable(self.path, f"for {waited:.1f}s: {_reason(exc)}", written=False) from None
                time.sleep(min(delay * random.uniform(0.5, 1.5), max(0.0, self.lock_timeout_s - waited)))
                delay = min(delay * 2, _BACKOFF_MAX_S)

    @contextmanager
    def connect(self, read_only: bool = False) -> Iterator[_Session]:
        """A connection for one transaction or one snapshot (``read_only`` is the transaction's to say)."""
        session = self._open()
        try:
            yield session
        finally:
            session.connection.close()

    def exists(self) -> bool:
        """Whether the schema holds the ledger's tables. A schema holding other tables raises :class:`LedgerCorrupt`
        (as reading a DuckDB file of other tables does): reads must not take some other program's schema for a
        ledger not made yet."""
        if not self._seen:
            with self.connect() as session:
                try:
                    self._seen = self.version(session) is not None
                except psycopg.OperationalError as exc:
                    raise LedgerUnavailable(self.path, _reason(exc), written=False) from None
        return self._seen

    @contextmanager
    def transaction(self, create: bool = True) -> Iterator[_Session]:
        """One write transaction, holding the ledger's advisory lock: the only writer while it runs. (``create`` is
        the DuckDB file's: a schema is made by the migrations' ``CREATE … IF NOT EXISTS``.)"""
        with self.connect() as session:
            try:
                self._lock(session)
            except psycopg.OperationalError as exc:
                raise LedgerUnavailable(self.path, _reason(exc), written=False) from None
            try:
                yield session
            except _SESSION_LOST as exc:  # the server rolls back a transaction whose session is gone
                raise LedgerUnavailable(self.path, _reason(exc), written=False) from None
            except BaseException:
                _roll_back(session)
                raise
            try:
                session.execute("COMMIT")
            except psycopg.errors.IdleInTransactionSessionTimeout as exc:  # ended before the COMMIT reached it
                raise LedgerUnavailable(self.path, _reason(exc), written=False) from None
            except psycopg.OperationalError as exc:
                raise LedgerUnavailable(self.path, _reason(exc), written=None) from None

    def _lock(self, session: _Session) -> None:
        started = time.monotonic()
        delay = _BACKOFF_START_S
        while True:
            session.execute("BEGIN")
            got = session.execute("SELECT pg_try_advisory_xact_lock(?, hashtext(?))", [_LOCK_CLASS, self.schema])
            if got.fetchone()[0]:
                return
            session.execute("ROLLBACK")
            waited = time.monotonic() - started
            if waited >= self.lock_timeout_s:
                raise LedgerBusyError(self.path, waited, self._holder(session))
            time.sleep(min(delay * random.uniform(0.5, 1.5), max(0.0, self.lock_timeout_s - waited)))
            delay = min(delay * 2, _BACKOFF_MAX_S)

    def _holder(self, session: _Session) -> str:
        row = session.execute(
            "SELECT a.pid, a.application_name, coalesce(host(a.client_addr), 'local'), a.state "
            "FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = ? AND l.objid = hashtext(?)::oid",
            [_LOCK_CLASS, self.schema],
        ).fetchone()
        if row is None:
            return "The holder has gone since."
        pid, application, client, state = row
        return f"Held by server process {pid} ({application or 'no application name'} from {client}, {state})."

    @contextmanager
    def snapshot(self) -> Iterator[_Session]:
        """One read-only transaction on one snapshot, for several reads."""
        with self.connect() as session:
            try:
                session.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                yield session
                session.execute("COMMIT")
            except _SESSION_LOST as exc:
                raise LedgerUnavailable(self.path, _reason(exc), written=False) from None

    @staticmethod
    def fetch_columns(cursor: psycopg.Cursor[Any]) -> dict[str, list[Any]]:
        names = [column.name for column in cursor.description or ()]
        rows = cursor.fetchall()
        return {name: [row[i] for row in rows] for i, name in enumerate(names)}

    @staticmethod
    def insert_rows(session: _Session, table: str, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        """Rows into ``table`` with PostgreSQL's COPY: one round trip for any number."""
        with session.connection.cursor().copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN".encode()) as copy:
            for row in rows:
                copy.write_row(row)

    def prepare(self, session: _Session) -> None:
        """Make the ledger's schema (inside the migration's transaction, under its lock)."""
        session.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')

    def version(self, session: _Session) -> int | None:
        """The schema version recorded; None for a schema without tables; a schema of other tables raises.

        The schema's tables are read in one statement (one snapshot): a migration another process commits between
        two looks must not make its half-seen tables read as some other program's.
        """
        tables = [
            r[0]
            for r in session.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = ? ORDER BY 1", [self.schema]
            ).fetchall()
        ]
        if "ledger_meta" not in tables:
            if tables:
                shown = ", ".join(tables[:5]) + (", …" if len(tables) > 5 else "")
                raise LedgerCorrupt(
                    self.path, f"schema {self.schema} holds other tables, not Krishiv's ledger: {shown}", "PostgreSQL"
                )
            return None
        self._seen = True
        row = session.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else 0
