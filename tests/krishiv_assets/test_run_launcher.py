"""The run launcher's worker health check, on a real instance configured as dagster.yaml configures it and
real processes (the whole daemon-kill recovery runs in the chaos matrix: dagster-killed-mid-commit)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import yaml
from dagster._core.events import EngineEventData
from dagster._core.launcher import WorkerStatus

from krishiv_assets.run_launcher import LocalRunLauncher, worker_status

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
