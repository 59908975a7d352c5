"""A private PostgreSQL cluster with ``wal_level = logical``, for change-data-capture tests.

The machine's server on 5432 runs with ``wal_level = replica``, which cannot feed a logical replication slot, and
changing that needs a restart of a server other tests share. So a session that asks for ``logical_postgres`` gets
its own cluster: ``initdb`` into a fresh folder, a free loopback port, trust authentication (including replication
connections), enough replication slots and WAL senders for many concurrent captures. It is stopped and deleted at
the end of the session.

initdb refuses to run as root, so when the tests run as root every server binary runs as the ``postgres`` OS user
(``runuser -u postgres --``), in a folder that user owns directly under the system's temporary folder: pytest's
own ``tmp_path`` lives below ``/tmp/pytest-of-root``, mode 0700, which ``postgres`` cannot traverse.

Isolation between tests: ``cdc_database`` (function scope) creates a fresh database per test and drops it, with its
replication slots, afterwards, so tests may reuse table names and never see each other's rows or publications.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from krishiv.broker import free_port

PG_OS_USER = "postgres"
HOST = "127.0.0.1"
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
_START_ATTEMPTS = 3  # a free port can be taken by someone else between free_port() and the server's bind

#: Appended to the cluster's postgresql.conf. Durability is off: the cluster is thrown away after the session.
_SERVER_SETTINGS = """
# --- krishiv test settings ---
listen_addresses = '{host}'
port = {port}
unix_socket_directories = '{socket_dir}'
wal_level = logical
max_replication_slots = 32
max_wal_senders = 32
fsync = off
synchronous_commit = off
full_page_writes = off
"""

_PG_HBA = """\
# TYPE  DATABASE     USER  ADDRESS         METHOD
local   all          all                   trust
host    all          all   127.0.0.1/32    trust
local   replication  all                   trust
host    replication  all   127.0.0.1/32    trust
"""


@dataclass(frozen=True)
class LogicalPostgres:
    """Where a PostgreSQL server with ``wal_level = logical`` listens, and the database to use on it."""

    host: str
    port: int
    user: str
    dbname: str

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.dbname}"

    def connect(self) -> psycopg.Connection:
        """A new autocommit connection to :attr:`dbname`; close it (``with pg.connect() as conn: ...``)."""
        return psycopg.connect(self.dsn, autocommit=True)

    def with_dbname(self, dbname: str) -> LogicalPostgres:
        """The same server, another database on it."""
        return dataclasses.replace(self, dbname=dbname)


def postgres_bin_dir() -> Path:
    """The ``bin`` folder of the highest PostgreSQL version installed under ``/usr/lib/postgresql``."""
    candidates = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "initdb").is_file()]
    if not candidates:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")

    def version(bin_dir: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", bin_dir.parent.name))

    return max(candidates, key=version)


def _running_as_root() -> bool:
    return os.geteuid() == 0


def _as_pg_user(command: Sequence[str]) -> list[str]:
    """``command`` as the ``postgres`` OS user when we are root (initdb and postgres refuse root)."""
    return ["runuser", "-u", PG_OS_USER, "--", *command] if _running_as_root() else list(command)


def _make_root_dir() -> Path:
    """A fresh folder the server's OS user owns, in a parent that user can traverse."""
    parent = Path(tempfile.gettempdir())
    if _running_as_root() and not parent.stat().st_mode & stat.S_IXOTH:
        parent = Path("/tmp")  # a TMPDIR only root may enter: postgres could not reach its data folder
    root = Path(tempfile.mkdtemp(prefix="krishiv-logical-pg-", dir=parent))
    if _running_as_root():
        shutil.chown(root, user=PG_OS_USER, group=PG_OS_USER)
    return root


def _run(command: Sequence[str], cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    # cwd: runuser keeps the working directory, and initdb fails if its user cannot read it (/work/main, say).
    return subprocess.run(
        _as_pg_user(command), cwd=cwd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
    )


def _initdb(bin_dir: Path, root: Path) -> Path:
    data = root / "data"
    done = _run(
        [str(bin_dir / "initdb"), "-D", str(data), "-U", PG_OS_USER, "-A", "trust", "-E", "UTF8", "--locale=C", "-N"],
        cwd=root,
        timeout_s=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"initdb failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    (data / "pg_hba.conf").write_text(_PG_HBA)  # root writing keeps the file's owner (postgres)
    return data


def _configure_port(data: Path, root: Path, port: int) -> None:
    conf = data / "postgresql.conf"
    text = conf.read_text()
    marker = "\n# --- krishiv test settings ---"
    text = text.split(marker)[0]  # a retry on another port replaces the previous attempt's settings
    conf.write_text(text + _SERVER_SETTINGS.format(host=HOST, port=port, socket_dir=root))


def _wait_accepting(pg: LogicalPostgres, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with pg.connect() as conn:
                conn.execute("SELECT 1")
                return
        except psycopg.OperationalError as e:
            last = e
            time.sleep(0.1)
    raise TimeoutError(
        f"PostgreSQL on port {pg.port} did not accept connections in {START_TIMEOUT_S}s: {last}; see {log}"
    )


def _start(bin_dir: Path, data: Path, root: Path, log: Path) -> int:
    """Start the server on a free port (pg_ctl -w waits until it is ready); return the port."""
    failure = ""
    for _ in range(_START_ATTEMPTS):
        port = free_port(HOST)
        _configure_port(data, root, port)
        started = _run(
            [str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", str(START_TIMEOUT_S), "start"],
            cwd=root,
            timeout_s=START_TIMEOUT_S + 10,
        )
        if started.returncode == 0:
            return port
        failure = f"{started.stdout}\n{started.stderr}\n{log.read_text() if log.exists() else ''}"
        if "could not bind" not in failure and "Address already in use" not in failure:
            break
    raise RuntimeError(f"pg_ctl start failed:\n{failure}")


def _stop(bin_dir: Path, data: Path, root: Path) -> None:
    """``pg_ctl stop -m fast``, then SIGKILL to the postmaster if it is still there."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        _run(
            [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", str(STOP_TIMEOUT_S), "stop"],
            cwd=root,
            timeout_s=STOP_TIMEOUT_S + 10,
        )
    pid_file = data / "postmaster.pid"
    if pid_file.exists():
        with contextlib.suppress(ValueError, IndexError, ProcessLookupError, OSError):
            os.kill(int(pid_file.read_text().splitlines()[0]), signal.SIGKILL)


@contextlib.contextmanager
def start_logical_postgres(dbname: str = "cdc") -> Iterator[LogicalPostgres]:
    """Run a private cluster with ``wal_level = logical`` and a database ``dbname`` for the ``with`` block."""
    bin_dir = postgres_bin_dir()
    root = _make_root_dir()
    log = root / "postgres.log"
    data = root / "data"
    try:
        data = _initdb(bin_dir, root)
        port = _start(bin_dir, data, root, log)
        server = LogicalPostgres(host=HOST, port=port, user=PG_OS_USER, dbname="postgres")
        _wait_accepting(server, log)
        with server.connect() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        yield server.with_dbname(dbname)
    finally:
        if data.exists():
            _stop(bin_dir, data, root)
        shutil.rmtree(root, ignore_errors=True)


def drop_database(server: LogicalPostgres, dbname: str) -> None:
    """Drop ``dbname`` with its logical replication slots (which would block DROP DATABASE), even if in use."""
    admin = server.with_dbname("postgres")
    with admin.connect() as conn:
        conn.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = %s AND active",
            (dbname,),
        )
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while True:  # a terminated walsender releases its slot a moment later
            slots = conn.execute("SELECT slot_name, active FROM pg_replication_slots WHERE database = %s", (dbname,))
            rows = slots.fetchall()
            if not rows:
                break
            for slot_name, active in rows:
                if not active:
                    with contextlib.suppress(psycopg.errors.ObjectInUse, psycopg.errors.UndefinedObject):
                        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot_name,))
            if time.monotonic() > deadline:
                raise TimeoutError(f"replication slots of {dbname} still there after {STOP_TIMEOUT_S}s: {rows}")
            time.sleep(0.05)
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


@pytest.fixture(scope="session")
def logical_postgres() -> Iterator[LogicalPostgres]:
    """The session's private cluster (``wal_level = logical``), on its database ``cdc``."""
    with start_logical_postgres("cdc") as pg:
        yield pg


@pytest.fixture
def cdc_database(logical_postgres: LogicalPostgres) -> Iterator[LogicalPostgres]:
    """A fresh, empty database on the private cluster for this test only, dropped (with its slots) afterwards."""
    dbname = f"cdc_{uuid.uuid4().hex[:12]}"
    with logical_postgres.connect() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    try:
        yield logical_postgres.with_dbname(dbname)
    finally:
        drop_database(logical_postgres, dbname)
