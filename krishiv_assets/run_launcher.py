"""The local run launcher, with the run-worker health check that Dagster's run monitoring needs.

Dagster's ``DefaultRunLauncher`` cannot tell whether a run's worker is alive, so when the host's Dagster
processes are SIGKILLed mid-run (an OOM kill, a crashed container, ``kill -9`` of ``dagster dev``) the run
stays STARTED forever. A STARTED commit run holds its pipeline's pool (dagster.yaml: one commit run at a
time), so after a restart the outbox sensor's runs would queue behind a dead one and nothing would be
committed again. This launcher answers run monitoring's health check from the worker's pid, which the
worker records itself in the run's "Started process for run" engine event: a worker that is gone (or
whose pid now belongs to a younger process) is reported FAILED and monitoring marks the run failed, which
frees the pool. The pid is only meaningful on the host that launched the run, which for this launcher (a
code server's subprocess) is the host the daemon runs on.
"""

from __future__ import annotations

import psutil
from dagster import DagsterEventType, DagsterInstance, DagsterRun
from dagster._core.launcher import CheckRunHealthResult, DefaultRunLauncher, WorkerStatus

#: A process created this much after the run worker's pid was recorded is another process with that pid.
PID_REUSE_SLACK_S = 1.0


def run_worker(instance: DagsterInstance, run_id: str) -> tuple[int, float] | None:
    """The pid the run worker recorded for itself and when, or None if it has not recorded one yet."""
    for record in reversed(instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT)):
        event = record.dagster_event
        pid = event.engine_event_data.metadata.get("pid") if event and event.engine_event_data else None
        if pid is not None:
            return int(str(pid.value)), record.timestamp
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


class LocalRunLauncher(DefaultRunLauncher):
    """``DefaultRunLauncher`` plus a health check by pid (see the module docstring)."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        worker = run_worker(self._instance, run.run_id)
        if worker is None:  # not recorded yet: nothing says it is dead
            return CheckRunHealthResult(WorkerStatus.RUNNING, "the run worker has not recorded its pid yet")
        return worker_status(*worker)
