"""The stager lease, table ``stager_lease``: which process runs a pipeline's Spark query now, and the fence on it.

A lease names its process by a token drawn once per process start (:func:`process_token`, drawn again in a
forked child) and says where it runs (host, pid, :func:`node_identity`), so a lease whose process in this pid
space is gone is taken over. :func:`check_lease` is the fence: :meth:`~outbox.ledger.entries.Entries.record_batch`
calls it in the transaction that would record a batch, and so refuses to record under a lease that is no longer
this process's. Holding a lease while a query runs, renewed from a thread, is :mod:`outbox.lease`'s.
"""

from __future__ import annotations

import functools
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from krishiv_core.errors import StagerLeaseLost
from krishiv_core.runbook import runbook
from outbox.errors import StagerBusy
from outbox.ledger.connection import Connection, LedgerConnection

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
    #: The fencing token: one more than the lease's before each time another process took it over.
    epoch: int | None = None

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


#: ``ledger_meta`` key (+ pipeline) of the fencing token a released lease had.
_EPOCH_KEY = "lease_epoch:"
_LEASE_COLUMNS = "pipeline, holder, host, pid, acquired_at, expires_at, token, node, committing, epoch"


def check_lease(con: Connection, lease: StagerLease, now: datetime) -> None:
    """Return if ``lease`` is still this process's and unexpired at ``now``, else raise :class:`StagerLeaseLost`.

    Called inside the write it fences, which holds the ledger's one write lock: the lease cannot change before the
    write commits. The lease must carry the current fencing token (``epoch``) as well as this process's token.
    """
    row = con.execute(f"SELECT {_LEASE_COLUMNS} FROM stager_lease WHERE pipeline = ?", [lease.pipeline]).fetchone()
    current = StagerLease(*row) if row is not None else None
    if (
        current is not None
        and current.token == lease.token
        and current.epoch == lease.epoch
        and lease.mine
        and current.expires_at > now
    ):
        return
    if current is None:
        holder = "nobody holds it now"
    elif current.token != lease.token or current.epoch != lease.epoch:
        holder = f"now held by {current.describe()}"
    elif not lease.mine:
        holder = f"held by {current.describe()}, another process"
    else:
        holder = f"it expired at {current.expires_at.isoformat(timespec='seconds')} without a renewal"
    raise StagerLeaseLost(lease.pipeline, holder)


class Leases(LedgerConnection):
    """Taking, renewing, releasing and reading the pipelines' stager leases."""

    def acquire_lease(self, pipeline: str, holder: str, ttl_s: float, committing: bool = False) -> StagerLease:
        """Take the pipeline's stager lease, or raise :class:`StagerBusy` naming the live holder.

        A lease that expired, or whose process in this pid space is gone (a killed ``krishiv run``), is taken
        over. This process taking its own lease again renews it. ``committing`` tells readers (the Dagster
        outbox sensor) that the holder commits each batch it stages itself.
        """
        now = datetime.now(UTC)
        with self._transaction() as con:
            row = con.execute(f"SELECT {_LEASE_COLUMNS} FROM stager_lease WHERE pipeline = ?", [pipeline]).fetchone()
            current = StagerLease(*row) if row is not None else None
            if current is not None and current.alive(now) and not current.mine:
                raise StagerBusy(
                    f"pipeline {pipeline!r} is already being staged by {current.describe()}: wait for it to "
                    f"finish, or stop it, then run again {runbook('Another run holds the pipeline')}"
                )
            if current is not None and current.epoch is not None:
                previous = current.epoch
            else:  # a released lease left its last fencing token behind: the next one is greater still
                row = con.execute("SELECT value FROM ledger_meta WHERE key = ?", [_EPOCH_KEY + pipeline]).fetchone()
                previous = int(row[0]) if row else 0
            renewal = current is not None and current.mine and current.epoch is not None
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
                previous if renewal else previous + 1,
            )
            con.execute(
                f"INSERT INTO stager_lease ({_LEASE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (pipeline) DO UPDATE SET holder = excluded.holder, host = excluded.host, "
                "pid = excluded.pid, acquired_at = excluded.acquired_at, expires_at = excluded.expires_at, "
                "token = excluded.token, node = excluded.node, committing = excluded.committing, "
                "epoch = excluded.epoch",
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
                    lease.epoch,
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
                "WHERE pipeline = ? AND token = ? AND epoch = ? AND expires_at > ? RETURNING 1",
                [now + timedelta(seconds=ttl_s), lease.pipeline, lease.token, lease.epoch, now],
            ).fetchall()
        return bool(changed)

    def release_lease(self, lease: StagerLease) -> None:
        """Give the lease up (the row goes; its fencing token is kept, so the next holder's is greater)."""
        with self._transaction() as con:
            released = con.execute(
                "DELETE FROM stager_lease WHERE pipeline = ? AND token = ? AND epoch = ? RETURNING epoch",
                [lease.pipeline, lease.token, lease.epoch],
            ).fetchall()
            if released and released[0][0] is not None:
                self._set_meta(con, _EPOCH_KEY + lease.pipeline, str(released[0][0]))

    def lease_held(self, lease: StagerLease) -> bool:
        """Whether ``lease`` is still this process's and unexpired."""
        rows = self._read(
            "SELECT 1 FROM stager_lease WHERE pipeline = ? AND token = ? AND epoch = ? AND expires_at > ?",
            [lease.pipeline, lease.token, lease.epoch, datetime.now(UTC)],
        )
        return bool(rows) and lease.token == process_token()

    def current_lease(self, pipeline: str) -> StagerLease | None:
        """The pipeline's lease row as it stands, live or not."""
        rows = self._read(f"SELECT {_LEASE_COLUMNS} FROM stager_lease WHERE pipeline = ?", [pipeline])
        return StagerLease(*rows[0]) if rows else None

    def leases(self, names: Sequence[str]) -> list[StagerLease]:
        """The lease rows of ``names`` (pipelines, ``maintenance:<table>``) as they stand, live or not, by name."""
        if not names:
            return []
        marks = ", ".join("?" for _ in names)
        rows = self._read(f"SELECT {_LEASE_COLUMNS} FROM stager_lease WHERE pipeline IN ({marks}) ORDER BY 1", names)
        return [StagerLease(*row) for row in rows]

    def live_lease(self, pipeline: str) -> StagerLease | None:
        lease = self.current_lease(pipeline)
        return lease if lease is not None and lease.alive() else None
