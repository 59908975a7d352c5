"""The run launcher's worker health check, on a real instance configured as dagster.yaml configures it and
real processes (the whole daemon-kill recovery runs in the chaos matrix: dagster-killed-mid-commit)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.events import EngineEventData
from dagster._core.launcher import WorkerStatus

from krishiv.broker import free_port
from krishiv_assets.run_launcher import (
    PLACED_MESSAGE,
    LocalRunLauncher,
    WorkerPlace,
    place_of,
    this_node,
    worker_place,
    worker_status,
)

ROOT = Path(__file__).resolve().parents[2]


@dg.op
def noop() -> None:
    pass


@dg.job
def a_job() -> None:
    noop()


def _instance_as_configured() -> dg.DagsterInstance:
    config = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    return dg.instance_for_test(
        overrides={"run_launcher": config["run_launcher"], "run_monitoring": config["run_monitoring"]}
    )


def test_dagster_yaml_runs_monitoring_with_the_health_checking_launcher():
    with _instance_as_configured() as instance:
        assert isinstance(instance.run_launcher, LocalRunLauncher)
        assert instance.run_launcher.supports_check_run_worker_health
        assert instance.run_monitoring_enabled
        assert instance.run_monitoring_max_resume_run_attempts == 0  # the launcher cannot resume runs


def test_a_run_whose_worker_was_killed_is_reported_failed():
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with _instance_as_configured() as instance:
            run = instance.create_run_for_job(a_job)
            launcher = instance.run_launcher
            unknown = launcher.check_run_worker_health(run)
            assert unknown.status == WorkerStatus.RUNNING, unknown  # no pid recorded: nothing says it is dead

            instance.report_engine_event("Started process for run", run, EngineEventData.in_process(worker.pid))
            alive = launcher.check_run_worker_health(run)
            assert alive.status == WorkerStatus.RUNNING, alive

            worker.kill()
            worker.wait()
            dead = launcher.check_run_worker_health(run)
            assert dead.status == WorkerStatus.FAILED, dead
            assert str(worker.pid) in (dead.msg or "")
    finally:
        worker.kill()
        worker.wait()


def test_a_pid_taken_by_a_younger_process_is_not_the_worker():
    younger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        recorded_long_before = time.time() - 3_600
        result = worker_status(younger.pid, recorded_long_before)
        assert result.status == WorkerStatus.FAILED, result
        assert "another process" in (result.msg or "")
        assert worker_status(younger.pid, time.time()).status == WorkerStatus.RUNNING
    finally:
        younger.kill()
        younger.wait()


# ---------------------------------------------------------------------------------------------- where the worker runs


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def test_a_worker_on_another_node_is_not_declared_dead_by_its_pid():
    """The daemon on another host (deploy/dagster.yaml): the worker's pid means nothing here, so a pid that does not
    exist here is no sign of death. On this node the pid is checked as before."""
    dead = _dead_pid()
    with _instance_as_configured() as instance:
        launcher = instance.run_launcher
        for place in (WorkerPlace("code-server.internal", None), WorkerPlace("code-server.internal", "boot/4026531")):
            run = instance.create_run_for_job(a_job)
            instance.report_engine_event(PLACED_MESSAGE, run, place.metadata("code-server.internal:4000"))
            instance.report_engine_event("Started process for run", run, EngineEventData.in_process(dead))
            assert worker_place(instance, run.run_id) == place
            result = launcher.check_run_worker_health(run)
            # RUNNING, not UNKNOWN: run monitoring fails a run whose check answers anything but RUNNING or SUCCESS.
            assert result.status == WorkerStatus.RUNNING, result
            assert "code-server.internal" in (result.msg or "") and "not checked" in (result.msg or "")

        here = instance.create_run_for_job(a_job)
        instance.report_engine_event(PLACED_MESSAGE, here, WorkerPlace("this", this_node()).metadata("127.0.0.1:4000"))
        instance.report_engine_event("Started process for run", here, EngineEventData.in_process(dead))
        assert launcher.check_run_worker_health(here).status == WorkerStatus.FAILED


def test_the_launcher_places_a_worker_by_where_its_code_server_listens(tmp_path: Path):
    """A code server of this pid space (it listens here, at an address of this machine): the worker's node is this
    one. A loopback port no process of this pid space listens on (a sidecar container's, a published port), an
    address of another machine, a name that does not resolve: somewhere else."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert place_of("127.0.0.1", port, None) == WorkerPlace(socket.gethostname(), this_node())
        assert place_of("localhost", port, None).node == this_node()
    with socket.socket(socket.AF_UNIX) as unix:
        path = str(tmp_path / "grpc.sock")
        unix.bind(path)
        unix.listen()
        assert place_of(None, None, path).node == this_node()
    assert place_of(None, None, str(tmp_path / "nobody.sock")).node is None
    assert place_of("127.0.0.1", free_port(), None).node is None
    assert place_of("192.0.2.10", 4000, None) == WorkerPlace("192.0.2.10", None)  # TEST-NET-1: not this machine
    assert place_of("code-server.invalid", 4000, None).node is None


UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]


def _can_unshare() -> bool:
    try:
        return subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _can_unshare(), reason="needs unshare(1) and the right to make a pid namespace (root)")
def test_a_daemon_in_another_pid_space_places_and_keeps_a_live_worker():
    """A real other pid space (as a daemon in another container or on another host sees this one): the code server
    listens here, the worker runs here. From there the listener has no visible pid, so the worker is placed elsewhere
    and the health check answers RUNNING; the bare pid check, which this launcher used to make there, says FAILED."""
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with socket.create_server(("127.0.0.1", 0)) as server:
            script = (
                "import json, sys, time\n"
                "from krishiv_assets.run_launcher import health, place_of, worker_status\n"
                "place = place_of('127.0.0.1', int(sys.argv[1]), None)\n"
                "worker = (int(sys.argv[2]), time.time())\n"
                "print(json.dumps({'node': place.node, 'health': health(place, worker).status.value,"
                " 'pid_check': worker_status(*worker).status.value}))\n"
            )
            there = subprocess.run(
                [*UNSHARE, sys.executable, "-c", script, str(server.getsockname()[1]), str(worker.pid)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
        assert there.returncode == 0, there.stderr
        assert json.loads(there.stdout) == {"node": None, "health": "RUNNING", "pid_check": "FAILED"}
        assert worker.poll() is None
    finally:
        worker.kill()
        worker.wait()
