"""The pipeline on a Spark standalone cluster: the source's tasks run in the worker's executor, exactly once.

``krishiv run`` is a subprocess with ``spark.master = "spark://…"`` (the pytest process already holds a local
session), its driver SIGKILLed once mid-run and started again; ``krishiv commit`` then publishes the batches.
"""

from __future__ import annotations

import signal
import sys
import uuid
from pathlib import Path

import pytest

from krishiv.broker import free_port
from krishiv.produce import ensure_topic
from krishiv_core.errors import ConfigError, EnvironmentProblem
from krishiv_core.spec import KrishivSpec, load_spec, parse_spec
from spark_jobs.session import on_loopback, require_master, spark_conf
from tests.services.spark_cluster import SparkCluster
from tests.spark_jobs.pipeline_helpers import assert_exactly_once, krishiv_cli, produce_orders

KILLED = -signal.SIGKILL
LOCAL_MASTER = 'master = "local[2]"'


def executor_python(folder: Path) -> tuple[Path, Path]:
    """A Python for the executors that notes the folder it was started in, then is this venv's Python."""
    marker = folder / "python-started-in.txt"
    script = folder / "executor-python"
    script.write_text(f'#!/bin/sh\necho "$PWD" >> "{marker}"\nexec "{sys.executable}" "$@"\n')
    script.chmod(0o755)
    return script, marker


def on_cluster(spec_file: Path, cluster: SparkCluster, app_name: str, python: Path) -> KrishivSpec:
    """Point the spec file at the cluster; its ``[spark.conf]`` names the application, its executor's size
    and Python."""
    text = spec_file.read_text()
    assert LOCAL_MASTER in text
    text = text.replace(LOCAL_MASTER, f'master = "{cluster.master_url}"')
    text += f"""
[spark.conf]
"spark.app.name" = "{app_name}"
"spark.cores.max" = "2"
"spark.executor.cores" = "2"
"spark.executor.memory" = "1g"
"spark.pyspark.python" = "{python}"
"""
    spec_file.write_text(text)
    return load_spec(spec_file, env={})


@pytest.mark.heavy
def test_pipeline_on_a_standalone_cluster_runs_its_tasks_on_the_worker_exactly_once(
    make_spec, spec_file, broker, spark_cluster, tmp_path
):
    make_spec(max_records=1_500)  # two batches: the driver dies after the second's ledger write
    app_name = f"krishiv-cluster-{uuid.uuid4().hex[:8]}"
    python, started_in = executor_python(tmp_path)
    spec = on_cluster(spec_file, spark_cluster, app_name, python)
    produce_orders(spec, 3_000, late=6, malformed=4)

    crashed = krishiv_cli(spec_file, "run", "--once", faults="stage.after_ledger@1")
    assert crashed.returncode == KILLED, (crashed.stdout[-2000:], crashed.stderr[-4000:])
    finished = krishiv_cli(spec_file, "run", "--once")
    assert finished.returncode == 0, (finished.stdout[-2000:], finished.stderr[-4000:])
    committed = krishiv_cli(spec_file, "commit")
    assert committed.returncode == 0, (committed.stdout[-2000:], committed.stderr[-4000:])
    assert_exactly_once(spec)

    # Both drivers registered an application with the master, and each ran its tasks in an executor the
    # worker launched: the executor's log in the worker's work folder names the tasks it ran, and the Python
    # of [spark.conf] was started in that executor's folder (the source reads Kafka in those processes).
    apps = spark_cluster.applications(app_name)
    assert len(apps) == 2, apps
    folders = started_in.read_text().split()
    for app in apps:
        executors = spark_cluster.executors_of(app["id"])
        assert executors, f"the worker ran no executor for {app['id']}"
        app_dir = spark_cluster.work_dir / app["id"]
        logs = [app_dir / str(e["id"]) / "stderr" for e in executors]
        text = "".join(p.read_text(errors="replace") for p in logs if p.exists())
        assert "Running task" in text, logs
        assert any(Path(f).is_relative_to(app_dir) for f in folders), (app_dir, folders)


def settings(master: str, conf: dict[str, str] | None = None) -> KrishivSpec:
    pipeline = {
        "name": "x",
        "topic": "x",
        "event_time_field": "t",
        "fields": {"t": "timestamp_ms"},
        "aggregations": [{"name": "n", "function": "count"}],
    }
    return parse_spec({"spark": {"master": master, "conf": conf or {}}, "pipelines": [pipeline]}, env={})


@pytest.mark.parametrize(
    ("master", "loopback"),
    [
        ("local[2]", True),
        ("spark://127.0.0.1:7077", True),
        ("spark://localhost:7077,127.0.0.1:7078", True),
        ("spark://10.0.0.5:7077", False),
        ("spark://127.0.0.1:7077,spark-master-2:7077", False),
        ("yarn", False),
        ("k8s://https://kubernetes.default.svc:443", False),
    ],
)
def test_the_driver_listens_on_loopback_only_when_every_executor_is_on_this_machine(master, loopback):
    assert on_loopback(master) is loopback
    conf = spark_conf(settings(master))
    assert (conf.get("spark.driver.host") == "127.0.0.1") is loopback
    assert (conf.get("spark.driver.bindAddress") == "127.0.0.1") is loopback


def test_a_driver_address_of_the_spec_wins_over_loopback():
    conf = spark_conf(settings("spark://127.0.0.1:7077", {"spark.driver.host": "10.1.2.3"}))
    assert conf["spark.driver.host"] == "10.1.2.3"
    assert "spark.driver.bindAddress" not in conf, "bound to loopback, the driver could not be reached at its host"


def test_a_master_that_does_not_answer_is_named_before_spark_starts(make_spec, spec_file, tmp_path):
    spec = make_spec()
    ensure_topic(spec.kafka.bootstrap_servers, spec.pipeline().topic, spec.kafka.partitions)  # checked first
    nobody = f"spark://127.0.0.1:{free_port()}"
    spec_file.write_text(spec_file.read_text().replace(LOCAL_MASTER, f'master = "{nobody}"'))
    refused = krishiv_cli(spec_file, "run", "--once", timeout=120)
    assert refused.returncode != 0
    lines = refused.stderr.strip().splitlines()
    assert f"the Spark master {nobody} is not reachable" in lines[-1], refused.stderr[-3000:]
    flood = ("Traceback", "Exception", " WARN ", " ERROR ")
    assert not [line for line in lines if any(word in line for word in flood)], refused.stderr[-3000:]


def test_a_highly_available_master_needs_one_that_answers(spark_cluster):
    down = f"127.0.0.1:{free_port()}"
    require_master(f"spark://{down},{spark_cluster.master_url.removeprefix('spark://')}")
    with pytest.raises(EnvironmentProblem, match=rf"{down}: Connection refused"):
        require_master(f"spark://{down}")
    with pytest.raises(ConfigError, match=r"expected spark://HOST:PORT"):
        require_master("spark://127.0.0.1")
