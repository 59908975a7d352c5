"""A Spark standalone cluster on loopback: one master and one worker, started from the pyspark wheel.

Started once per session, and only when a test asks for ``spark_cluster``. The worker's work folder is kept
under the session's temporary folder, so a test can read what the executors of its application left there
(``<work>/<app-id>/<executor-id>/stderr``).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark
import pytest

from krishiv.broker import free_port
from tests.services.processes import stop

SPARK_HOME = Path(pyspark.__file__).parent
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class SparkCluster:
    """A running standalone master with one registered worker."""

    master_url: str
    master_ui: str
    worker_ui: str
    work_dir: Path
    log_dir: Path

    def master_state(self) -> dict[str, Any]:
        return _get_json(f"{self.master_ui}/json/")

    def worker_state(self) -> dict[str, Any]:
        return _get_json(f"{self.worker_ui}/json/")

    def applications(self, name: str) -> list[dict[str, Any]]:
        """The master's applications (running or finished) of that name."""
        state = self.master_state()
        return [a for a in state["activeapps"] + state["completedapps"] if a["name"] == name]

    def executors_of(self, app_id: str) -> list[dict[str, Any]]:
        """The executors this worker ran (or runs) for an application."""
        state = self.worker_state()
        return [e for e in state["executors"] + state["finishedexecutors"] if e["appid"] == app_id]


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def _spark_class(main: str, args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    # spark-class execs the JVM, so the Popen's pid is the JVM's own.
    return subprocess.Popen(
        [str(SPARK_HOME / "bin" / "spark-class"), main, *args],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def _wait_for_worker(cluster: SparkCluster, processes: list[tuple[str, subprocess.Popen]]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    last: object = None
    while time.monotonic() < deadline:
        for name, process in processes:
            if process.poll() is not None:
                raise RuntimeError(f"the Spark {name} exited with {process.returncode}; see {cluster.log_dir}")
        try:
            workers = cluster.master_state()["workers"]
            if any(w["state"] == "ALIVE" for w in workers):
                return
            last = workers
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError) as e:  # ValueError: not JSON yet
            last = e
        time.sleep(0.25)
    raise TimeoutError(f"no worker registered with {cluster.master_url} in {START_TIMEOUT_S:.0f}s: {last}")


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    root = tmp_path_factory.mktemp("spark-cluster")
    port, master_web, worker_web = free_port(), free_port(), free_port()
    cluster = SparkCluster(
        master_url=f"spark://127.0.0.1:{port}",
        master_ui=f"http://127.0.0.1:{master_web}",
        worker_ui=f"http://127.0.0.1:{worker_web}",
        work_dir=root / "work",
        log_dir=root,
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("KRISHIV_", "PYSPARK_"))},
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(root),
        "SPARK_WORKER_DIR": str(cluster.work_dir),
    }
    with ExitStack() as stack:
        master = _spark_class(
            "org.apache.spark.deploy.master.Master",
            ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(master_web)],
            root / "master.log",
            env,
        )
        stack.callback(stop, master, STOP_TIMEOUT_S)
        worker = _spark_class(
            "org.apache.spark.deploy.worker.Worker",
            [
                cluster.master_url,
                "--host",
                "127.0.0.1",
                "--cores",
                "2",
                "--memory",
                "2g",
                "--webui-port",
                str(worker_web),
                "--work-dir",
                str(cluster.work_dir),
            ],
            root / "worker.log",
            env,
        )
        stack.callback(
            stop, worker, STOP_TIMEOUT_S
        )  # stopped first: the worker ends its executors, then the master stops
        _wait_for_worker(cluster, [("master", master), ("worker", worker)])
        yield cluster
