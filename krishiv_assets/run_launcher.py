"""The run launcher, with the run-worker health check that Dagster's run monitoring needs.

Dagster's ``DefaultRunLauncher`` cannot tell whether a run's worker is alive, so when the host's Dagster
processes are SIGKILLed mid-run (an OOM kill, a crashed container, ``kill -9`` of ``dagster dev``) the run
stays STARTED forever. A STARTED commit run holds its pipeline's pool (dagster.yaml: one commit run at a
time), so after a restart the outbox sensor's runs would queue behind a dead one and nothing would be
committed again. This launcher answers run monitoring's health check from the worker's pid, which the
worker records itself in the run's "Started process for run" engine event: a worker that is gone (or
whose pid now belongs to a younger process) is reported FAILED and monitoring marks the run failed, which
frees the pool.

A pid only means something in the pid space it was taken in. The worker is a subprocess of the code server
the run was launched through, and the health check runs in the daemon, which may be on another host or in
another container (``deploy/dagster.yaml``; see docs/deployment.md). So when it launches a run, the launcher
records where the worker will run (the engine event "Run worker placed", metadata ``worker_host`` and
``worker_node``): on this node when the code server is a process of this pid space (it listens on the
workspace's port or socket, and the workspace's host is an address of this machine), else on the code
server's host, node unknown. The health check reads the pid only when the worker's node is the checking
process's own; anywhere else it answers RUNNING, saying why it did not look (an UNKNOWN answer would make
run monitoring fail a live run: Dagster 1.13 fails every run whose check is neither RUNNING nor SUCCESS).
There, the code server fails a run whose worker process died (it watches its own subprocesses); a run whose
code server died with its host stays STARTED until someone ends it. A run with no placement recorded (launched
before this launcher recorded one, or executed in process) is checked by its pid, as before.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import psutil
from dagster import DagsterEventType, DagsterInstance, DagsterRun
from dagster._core.events import EngineEventData
from dagster._core.events.log import EventLogEntry
from dagster._core.launcher import CheckRunHealthResult, DefaultRunLauncher, LaunchRunContext, WorkerStatus

from outbox.ledger.leases import node_identity

#: A process created this much after the run worker's pid was recorded is another process with that pid.
PID_REUSE_SLACK_S = 1.0
#: The engine event in which the launcher records where a run's worker runs.
PLACED_MESSAGE = "Run worker placed"
WORKER_HOST = "worker_host"
WORKER_NODE = "worker_node"  # "" when the worker runs in another pid space (another host or container)


def this_node() -> str:
    """The pid space of this process: the boot id and pid namespace (:func:`node_identity`), else the host name."""
    return node_identity() or f"host:{socket.gethostname()}"


@dataclass(frozen=True)
class WorkerPlace:
    """Where a run's worker runs: a host name for people, and the node (:func:`this_node`) where its pid means it,
    None when the worker's pid space is not the launcher's."""

    host: str
    node: str | None

    def metadata(self, code_server: str) -> EngineEventData:
        return EngineEventData(
            metadata={WORKER_HOST: self.host, WORKER_NODE: self.node or "", "code_server": code_server}
        )


def run_worker(instance: DagsterInstance, run_id: str) -> tuple[int, float] | None:
    """The pid the run worker recorded for itself and when, or None if it has not recorded one yet."""
    return _recorded_pid(_engine_events(instance, run_id))


def worker_place(instance: DagsterInstance, run_id: str) -> WorkerPlace | None:
    """Where the launcher placed the run's worker, or None if it recorded nothing (a run it did not launch)."""
    return _recorded_place(_engine_events(instance, run_id))


def _engine_events(instance: DagsterInstance, run_id: str) -> Sequence[EventLogEntry]:
    return instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT)


def _metadata(record: EventLogEntry) -> dict[str, object]:
    event = record.dagster_event
    data = event.engine_event_data if event else None
    return {key: value.value for key, value in data.metadata.items()} if data else {}


def _recorded_pid(records: Sequence[EventLogEntry]) -> tuple[int, float] | None:
    for record in reversed(records):
        pid = _metadata(record).get("pid")
        if pid is not None:
            return int(str(pid)), record.timestamp
    return None


def _recorded_place(records: Sequence[EventLogEntry]) -> WorkerPlace | None:
    for record in reversed(records):
        metadata = _metadata(record)
        if WORKER_NODE in metadata:
            return WorkerPlace(str(metadata.get(WORKER_HOST, "")), str(metadata[WORKER_NODE]) or None)
    return None


def worker_status(pid: int, recorded_at: float) -> CheckRunHealthResult:
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker pid {pid} has exited")
        if process.create_time() > recorded_at + PID_REUSE_SLACK_S:
            return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker pid {pid} is gone (now another process)")
    except psutil.NoSuchProcess:
        return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker pid {pid} is gone")
    return CheckRunHealthResult(WorkerStatus.RUNNING, f"run worker pid {pid} is alive")


def health(
    place: WorkerPlace | None, worker: tuple[int, float] | None, node: str | None = None
) -> CheckRunHealthResult:
    """The health check's answer for a worker placed at ``place`` that recorded ``worker`` (its pid and when),
    asked on ``node`` (default: this one)."""
    if worker is None:  # not recorded yet: nothing says it is dead
        return CheckRunHealthResult(WorkerStatus.RUNNING, "the run worker has not recorded its pid yet")
    pid = worker[0]
    here = node or this_node()
    if place is not None and place.node != here:
        return CheckRunHealthResult(
            WorkerStatus.RUNNING,
            f"run worker pid {pid} runs on {place.host or 'another host'}, not on this one ({socket.gethostname()}): "
            "its pid is not checked here; the code server there fails the run if the process dies",
        )
    return worker_status(*worker)


@functools.cache
def _machine_addresses() -> frozenset[str]:
    return frozenset(
        a.address.split("%")[0]
        for addresses in psutil.net_if_addrs().values()
        for a in addresses
        if a.family in (socket.AF_INET, socket.AF_INET6)
    )


def is_this_machine(host: str) -> bool:
    """Whether ``host`` names this machine: every address it resolves to is a loopback one or one of this machine's
    interfaces. A name that does not resolve is not."""
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return False
    mine = _machine_addresses()
    addresses = {str(a).split("%")[0] for a in found}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback or a in mine for a in addresses)


def listened_here(port: int | None = None, path: str | None = None) -> bool:
    """Whether a process of this pid space (one whose pid this process can see) listens on TCP ``port`` or the Unix
    socket ``path``. A listener of another pid space sharing this network (a sidecar container, a published port)
    shows without a pid."""
    try:
        connections = psutil.net_connections(kind="unix" if path is not None else "tcp")
    except (psutil.AccessDenied, OSError):
        return False
    for c in connections:
        if c.pid is None:
            continue
        if path is not None and c.laddr == path:
            return True
        if path is None and c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
            return True
    return False


def place_of(host: str | None, port: int | None, path: str | None) -> WorkerPlace:
    """Where a worker started by the code server at ``host``:``port`` (or the Unix socket ``path``) runs, as seen
    from this process."""
    if path is not None:
        local = listened_here(path=path)
    else:
        local = host is not None and is_this_machine(host) and listened_here(port=port)
    if local:
        return WorkerPlace(socket.gethostname(), this_node())
    return WorkerPlace(host or socket.gethostname(), None)


class LocalRunLauncher(DefaultRunLauncher):
    """``DefaultRunLauncher`` plus a health check by pid, where the pid can be checked (see the module docstring)."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def launch_run(self, context: LaunchRunContext) -> None:
        from dagster._core.remote_representation.code_location import GrpcServerCodeLocation

        run = context.dagster_run
        origin = run.remote_job_origin
        if context.workspace is not None and origin is not None:
            location = None
            with contextlib.suppress(Exception):  # the parent launches, or fails, with Dagster's own message
                location = context.workspace.get_code_location(
                    origin.repository_origin.code_location_origin.location_name
                )
            if isinstance(location, GrpcServerCodeLocation):
                client = location.client
                place = place_of(client.host, client.port, client.socket)
                where = client.socket or f"{client.host}:{client.port}"
                self._instance.report_engine_event(
                    f"{PLACED_MESSAGE}: the code server at {where} starts it on {place.host}"
                    + ("" if place.node else ", in another pid space than the launcher's (its pid is not checked)"),
                    run,
                    place.metadata(where),
                    cls=self.__class__,
                )
        super().launch_run(context)

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        records = _engine_events(self._instance, run.run_id)
        return health(_recorded_place(records), _recorded_pid(records))
