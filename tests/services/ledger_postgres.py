"""A private PostgreSQL server for the ledger's fault cases: the tests pause it, kill it and start it again.

The ledger's outage tests need a server they may break: the machine's server on 5432 is shared by every other test,
and the CDC tests' cluster (:mod:`tests.services.private_postgres`) by the CDC tests. So a session that asks for
``ledger_postgres`` gets a cluster of its own, made the same way (``initdb`` as the ``postgres`` OS user, a free
loopback port, trust authentication; see that module), with ``synchronous_commit`` back on, since a commit the
server answered must survive its SIGKILL. A test may leave it broken: the function-scoped ``ledger_server`` puts it
back (resumed, or started again on the same data folder and port) before and after each test, and hands each test
a ledger URI in a schema of its own, dropped afterwards. One server per session keeps a test's cost to its faults:
a restart after a kill is a crash recovery of about a second.

The faults, as the ledger's clients meet them:

* :meth:`LedgerPostgres.pause` (SIGSTOP to the postmaster and every backend): TCP still answers (the kernel accepts
  and acknowledges), the server does not: a new connection waits for its start-up reply, a statement in flight for
  its result. :meth:`LedgerPostgres.resume` (SIGCONT) and everything goes on where it stopped.
* :meth:`LedgerPostgres.kill` (SIGKILL to the postmaster, then every backend): connections are reset, new ones
  refused. :meth:`LedgerPostgres.restart` is ``pg_ctl start`` on the same data folder and port (crash recovery).
* :class:`LedgerFront`: a TCP front on the server that runs an action when a client sends a statement (kill or pause
  the server at exactly that step, or stop the client), and cuts the connection at a transaction's ``COMMIT``:
  before the server sees it, or after the server answered it (committed, and the answer lost). Why a front rather
  than a fault point or ``pg_terminate_backend``: a connection lost *during* COMMIT is a race between the server's
  commit and the client's read of the answer, which nothing on either end can place deterministically; a front
  between them can forward the COMMIT, wait for the server's "COMMIT" answer, and drop it.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import psycopg
import pytest
from psycopg import sql

from tests.services.private_postgres import (
    HOST,
    PG_OS_USER,
    START_TIMEOUT_S,
    _initdb,
    _run,
    _running_as_root,
    _start,
    _stop,
    postgres_bin_dir,
)

DBNAME = "ledger"
#: How long the harness waits for a signal to take effect (every process stopped, or gone).
SIGNAL_TIMEOUT_S = 10.0
#: A ``Q`` (simple query) message of ``COMMIT``: how the ledger's transactions end (psycopg sends a statement
#: without parameters as a simple query).
COMMIT_QUERY = b"Q\x00\x00\x00\x0bCOMMIT\x00"
#: The server's CommandComplete for a ``COMMIT`` that committed (one that rolled back answers ``ROLLBACK``).
COMMITTED_ANSWER = b"C\x00\x00\x00\x0bCOMMIT\x00"


def _make_root_dir() -> Path:
    parent = Path(tempfile.gettempdir())
    if _running_as_root() and not parent.stat().st_mode & stat.S_IXOTH:
        parent = Path("/tmp")
    root = Path(tempfile.mkdtemp(prefix="krishiv-ledger-pg-", dir=parent))
    if _running_as_root():
        shutil.chown(root, user=PG_OS_USER, group=PG_OS_USER)
    return root


def _alive(process: psutil.Process) -> bool:
    """Running or stopped; not gone, and not a zombie its new parent has yet to reap."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until(condition: Callable[[], object], what: str, timeout_s: float, step_s: float = 0.02) -> None:
    """Wait until ``condition()`` holds, else fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s:.0f}s")
        time.sleep(step_s)


@dataclass
class LedgerPostgres:
    """The session's private server, and the faults a test can put it through."""

    bin_dir: Path
    root: Path
    data: Path
    log: Path
    port: int
    host: str = HOST
    user: str = PG_OS_USER
    dbname: str = DBNAME

    # ------------------------------------------------------------------------------------ where

    def dsn(self, dbname: str | None = None) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{dbname or self.dbname}"

    def ledger_uri(self, schema: str, port: int | None = None) -> str:
        """A ledger location in ``schema`` (on ``port``: a :class:`LedgerFront`'s, else the server's own)."""
        return f"postgresql://{self.user}@{self.host}:{port or self.port}/{self.dbname}?schema={schema}"

    def connect(self, dbname: str | None = None) -> psycopg.Connection:
        """A new autocommit connection of the harness's own; close it (``with server.connect() as conn``)."""
        return psycopg.connect(self.dsn(dbname), autocommit=True, connect_timeout=5, application_name="harness")

    # ------------------------------------------------------------------------------------ its processes

    def postmaster(self) -> psutil.Process | None:
        """The running postmaster (from its pid file), or None."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().splitlines()[0])
            process = psutil.Process(pid)
        except (OSError, ValueError, IndexError, psutil.NoSuchProcess):
            return None
        return process if _alive(process) and process.name().startswith("postgres") else None

    def processes(self) -> list[psutil.Process]:
        """The postmaster and every process it started (backends, checkpointer, WAL writer…)."""
        postmaster = self.postmaster()
        if postmaster is None:
            return []
        with contextlib.suppress(psutil.NoSuchProcess):
            return [postmaster, *postmaster.children(recursive=True)]
        return []

    # ------------------------------------------------------------------------------------ faults

    def pause(self) -> None:
        """SIGSTOP the postmaster (first: it starts no backend while stopped), then every process it started."""
        postmaster = self.postmaster()
        assert postmaster is not None, "the server is not running"
        postmaster.send_signal(signal.SIGSTOP)
        stopped = self.processes()
        for process in stopped[1:]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGSTOP)
        wait_until(
            lambda: all(not _alive(p) or p.status() == psutil.STATUS_STOPPED for p in stopped),
            "the server's processes did not all stop",
            SIGNAL_TIMEOUT_S,
        )

    def resume(self) -> None:
        """SIGCONT every process of the server, the postmaster last."""
        processes = self.processes()
        for process in reversed(processes):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the postmaster (first: it restarts nothing), then every process it started; wait until all are
        gone, and remove the lock files a dead postmaster leaves (a zombie not yet reaped would hold them)."""
        processes = self.processes()
        assert processes, "the server is not running"
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        wait_until(lambda: not any(_alive(p) for p in processes), "the server's processes were not gone", 10)
        for lock in (self.data / "postmaster.pid", self.root / f".s.PGSQL.{self.port}.lock"):
            lock.unlink(missing_ok=True)

    def restart(self) -> None:
        """``pg_ctl start`` on the same data folder and port (a crash recovery after :meth:`kill`)."""
        assert self.postmaster() is None, "the server is still running"
        started = _run(
            [
                str(self.bin_dir / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-w",
                "-t",
                str(START_TIMEOUT_S),
                "start",
            ],
            cwd=self.root,
            timeout_s=START_TIMEOUT_S + 10,
        )
        if started.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed:\n{started.stdout}\n{started.stderr}\n{self.log.read_text()}")
        self.wait_accepting()

    def wait_accepting(self) -> None:
        def answers() -> bool:
            try:
                with self.connect("postgres") as conn:
                    conn.execute("SELECT 1")
                return True
            except psycopg.OperationalError:
                return False

        wait_until(answers, f"PostgreSQL on port {self.port} did not accept connections (see {self.log})", 60, 0.1)

    def ensure_up(self) -> None:
        """Back to a running server, whatever the last test left: resumed if paused, started if killed."""
        if self.postmaster() is None:
            self.restart()
            return
        self.resume()
        self.wait_accepting()

    # ------------------------------------------------------------------------------------ what it holds

    def backend_pids(self, application_name: str) -> list[int]:
        with self.connect() as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s ORDER BY pid", (application_name,)
            ).fetchall()
        return [r[0] for r in rows]

    def backend_state(self, pid: int) -> str | None:
        """What server process ``pid`` is doing (``active``, ``idle in transaction``…), None if it is gone."""
        with self.connect() as conn:
            row = conn.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        return None if row is None else str(row[0])

    def create_schema(self) -> str:
        schema = f"ledger_{uuid.uuid4().hex[:12]}"
        with self.connect() as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        return schema

    def drop_schema(self, schema: str) -> None:
        with self.connect() as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@contextlib.contextmanager
def start_ledger_postgres() -> Iterator[LedgerPostgres]:
    """A private cluster with a database :data:`DBNAME`, for the ``with`` block; stopped and deleted after."""
    bin_dir = postgres_bin_dir()
    root = _make_root_dir()
    log = root / "postgres.log"
    data = root / "data"
    try:
        data = _initdb(bin_dir, root)
        port = _start(bin_dir, data, root, log)
        server = LedgerPostgres(bin_dir, root, data, log, port)
        server.wait_accepting()
        with server.connect("postgres") as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DBNAME)))
            # The shared settings turn synchronous_commit off; a SIGKILL would then lose commits already answered,
            # which no real server does. fsync stays off: the machine does not crash, its page cache survives.
            conn.execute("ALTER SYSTEM SET synchronous_commit = on")
            conn.execute("SELECT pg_reload_conf()")
        yield server
    finally:
        if data.exists():
            with contextlib.suppress(Exception):
                LedgerPostgres(bin_dir, root, data, log, 0).resume()  # a paused server would not stop
            _stop(bin_dir, data, root)
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class LedgerServer:
    """One test's view of the server: the server itself and a ledger URI in a schema of the test's own."""

    server: LedgerPostgres
    schema: str

    @property
    def uri(self) -> str:
        return self.server.ledger_uri(self.schema)

    def uri_through(self, front: LedgerFront, **settings: str) -> str:
        """The same ledger, reached through ``front`` (and with more libpq ``settings``)."""
        extra = "".join(f"&{k}={v}" for k, v in settings.items())
        return self.server.ledger_uri(self.schema, front.port) + extra


@pytest.fixture(scope="session")
def ledger_postgres() -> Iterator[LedgerPostgres]:
    """The session's private server for the ledger's fault cases (see the module)."""
    with start_ledger_postgres() as server:
        yield server


@pytest.fixture
def ledger_server(ledger_postgres: LedgerPostgres) -> Iterator[LedgerServer]:
    """The private server, running (whatever the test before left), and a fresh schema dropped afterwards."""
    ledger_postgres.ensure_up()
    schema = ledger_postgres.create_schema()
    try:
        yield LedgerServer(ledger_postgres, schema)
    finally:
        ledger_postgres.ensure_up()
        ledger_postgres.drop_schema(schema)


# ------------------------------------------------------------------------------------------------ the front


@dataclass
class _Link:
    """One client connection through the front and its server connection. Each direction ends as TCP ends it (the
    other side is told no more comes, and may still read what came), so a server that ends a session with an error
    is heard as it would be directly; a fault cuts both at once."""

    client: socket.socket
    server: socket.socket
    sent: bytearray = field(default_factory=bytearray)  # everything the client sent, to find statements in
    swallowing: bool = False  # the server's answers are held back, not forwarded
    answers: bytearray = field(default_factory=bytearray)
    ended: int = 0  # directions that ended

    def cut(self) -> None:
        for s in (self.client, self.server):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def end(self, sink: socket.socket, lock: threading.Lock) -> None:
        """One direction ended: tell its receiver; once both have, close both."""
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
        with lock:
            self.ended += 1
            last = self.ended == 2
        if last:
            self.cut()


@dataclass
class _Trigger:
    marker: bytes
    action: Callable[[], None]
    occurrence: int
    after: bytes | None  # counted only on a connection that sent this before
    forward: bool
    seen: int = 0
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _CommitCut:
    marker: bytes
    answered: bool  # forward the COMMIT and drop the server's answer (True), or drop the COMMIT itself


class LedgerFront:
    """A TCP front on the server (``127.0.0.1:port``), forwarding both ways, with two faults to arm.

    :meth:`when_sent` runs an action (kill or pause the server, stop the client) in the front's thread when a client
    sends a message holding ``marker`` (a statement's text), before the message goes on (or instead: the message is
    dropped, as if the client had stopped just before sending it). :meth:`cut_commit` cuts
    the connection of the first transaction that sent ``marker``, at its ``COMMIT``: before the server sees it
    (nothing written), or once the server answered it (written, and the client never hears so). Each fires once.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((HOST, 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._links: list[_Link] = []
        self._lock = threading.Lock()
        self._triggers: list[_Trigger] = []
        self._cut: _CommitCut | None = None
        #: Set once an armed COMMIT cut happened: ``"before"`` (the server never saw it) or ``"after"`` (answered).
        self.cut_at: str | None = None
        self.cut_done = threading.Event()
        threading.Thread(target=self._accept, name="ledger-front", daemon=True).start()

    def when_sent(
        self,
        marker: bytes,
        action: Callable[[], None],
        occurrence: int = 1,
        *,
        after: bytes | None = None,
        forward: bool = True,
    ) -> threading.Event:
        """Run ``action`` when a client sends ``marker`` for the ``occurrence``-th time (counting only connections
        that sent ``after`` before, if given), then forward the message, or drop it (``forward=False``). The event
        returned is set once the action has run (the client may hear of it before: wait for both)."""
        trigger = _Trigger(marker, action, occurrence, after, forward)
        with self._lock:
            self._triggers.append(trigger)
        return trigger.done

    def cut_commit(self, marker: bytes, answered: bool) -> None:
        """Cut the connection at the COMMIT of the first transaction that sends ``marker`` (see the class)."""
        with self._lock:
            self._cut = _CommitCut(marker, answered)
            self.cut_at = None
            self.cut_done.clear()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for link in self._links:
                link.cut()
            self._links.clear()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            link = _Link(client, server)
            with self._lock:
                self._links.append(link)
            threading.Thread(target=self._from_client, args=(link,), daemon=True).start()
            threading.Thread(target=self._from_server, args=(link,), daemon=True).start()

    def _from_client(self, link: _Link) -> None:
        with contextlib.suppress(OSError):
            while data := link.client.recv(65536):
                earlier = bytes(link.sent)
                link.sent += data  # a marker may straddle two reads: it is looked for in the whole
                due = self._fired(link, earlier)
                for trigger in due:
                    try:
                        trigger.action()
                    finally:
                        trigger.done.set()
                if any(not t.forward for t in due):
                    continue
                cut = self._cut
                if cut is not None and COMMIT_QUERY in data and cut.marker in link.sent:
                    with self._lock:
                        if self._cut is not cut:
                            cut = None
                        else:
                            self._cut = None
                    if cut is not None and not cut.answered:
                        self._finish(link, "before")
                        return
                    if cut is not None:
                        link.swallowing = True
                link.server.sendall(data)
        link.end(link.server, self._lock)

    def _fired(self, link: _Link, earlier: bytes) -> list[_Trigger]:
        """The triggers whose occurrence the client's latest message reached (counted across connections)."""
        due = []
        with self._lock:
            for trigger in self._triggers:
                # Each occurrence is counted once, with the read that brought its last byte (an armed trigger never
                # counts what went by before it was armed).
                found = link.sent.count(trigger.marker, max(0, len(earlier) - len(trigger.marker) + 1))
                if trigger.after is not None and trigger.after not in earlier:
                    continue
                if found and trigger.seen < trigger.occurrence <= trigger.seen + found:
                    due.append(trigger)
                trigger.seen += found
            self._triggers = [t for t in self._triggers if t.seen < t.occurrence]
        return due

    def _from_server(self, link: _Link) -> None:
        with contextlib.suppress(OSError):
            while data := link.server.recv(65536):
                if link.swallowing:
                    link.answers += data
                    if COMMITTED_ANSWER in link.answers:
                        self._finish(link, "after")
                        return
                    continue
                link.client.sendall(data)
        link.end(link.client, self._lock)

    def _finish(self, link: _Link, at: str) -> None:
        self.cut_at = at  # before the cut: the client may look as soon as it hears of it
        link.cut()
        self.cut_done.set()


@pytest.fixture
def ledger_front(ledger_server: LedgerServer) -> Iterator[LedgerFront]:
    """A :class:`LedgerFront` on the test's server, closed afterwards."""
    front = LedgerFront((ledger_server.server.host, ledger_server.server.port))
    try:
        yield front
    finally:
        front.close()
