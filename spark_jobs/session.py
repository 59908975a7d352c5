"""Building the SparkSession Krishiv runs in, after checking Java is there.

PySpark is imported only by the functions that build or prepare a session: :func:`spark_conf` and the checks are
read by processes that never start Spark (the Dagster code location shows the configuration; a commit run must
start in a second, not load Spark).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from krishiv_core.errors import ConfigError, EnvironmentProblem
from krishiv_core.spec import KrishivSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REQUIRED_JAVA = 17
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
#: The Python executors run Krishiv's tasks with. spark-submit turns this setting into ``PYSPARK_PYTHON``; a
#: session built from Python, as Krishiv's is, reads only the variable, so :func:`prepare_environment` does it.
EXECUTOR_PYTHON = "spark.pyspark.python"
MASTER_CONNECT_TIMEOUT_S = 5.0
STANDALONE = "spark://"


def java_version() -> int | None:
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2)) if major == 1 and m.group(2) else major


def require_java() -> None:
    version = java_version()
    if version is None:
        raise EnvironmentProblem(
            f"Spark needs Java {REQUIRED_JAVA} or newer and none was found on PATH or in JAVA_HOME; "
            "install it (Debian: apt-get install openjdk-17-jre-headless) and try again"
        )
    if version < REQUIRED_JAVA:
        raise EnvironmentProblem(f"Spark needs Java {REQUIRED_JAVA} or newer; found Java {version}")


DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
#: Spark's driver log: errors only (see the file), unless ``[spark.conf]`` names a log4j2 configuration itself.
DRIVER_LOG_CONFIG = Path(__file__).with_name("log4j2.properties")


def spark_conf(spec: KrishivSpec, app_name: str = "krishiv") -> dict[str, str]:
    """The Spark configuration Krishiv runs with: the spec's ``[spark.conf]``, then what Krishiv sets itself."""
    conf = {
        "spark.app.name": app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        **spec.spark.resolved_conf(),
        "spark.master": spec.spark.master,
        "spark.sql.shuffle.partitions": str(spec.spark.shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        # Every batch reads records: a batch id then always names the same, non-empty Kafka range, which a
        # replay from a rewound or old checkpoint can reproduce from the ledger. (A no-data batch cannot be
        # replayed: after a restart Spark no longer knows it wanted one.) None is needed: the batch whose
        # events move the watermark past a window's end writes that window (spark_jobs/window_state.py).
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
    }
    if on_loopback(spec.spark.master) and not {"spark.driver.host", "spark.driver.bindAddress"} & conf.keys():
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        conf["spark.driver.host"] = "127.0.0.1"
    options = conf.get(DRIVER_JAVA_OPTIONS, "")
    if "log4j2.configurationFile" not in options:
        conf[DRIVER_JAVA_OPTIONS] = f"{options} -Dlog4j2.configurationFile={DRIVER_LOG_CONFIG.as_uri()}".strip()
    return conf


def standalone_masters(master: str) -> list[tuple[str, int]]:
    """The (host, port) of each master of a ``spark://`` URL (several for a highly available cluster)."""
    if not master.startswith(STANDALONE):
        return []
    found = []
    for hostport in master.removeprefix(STANDALONE).split(","):
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError("spark.master", f"expected spark://HOST:PORT[,HOST:PORT...], got {master!r}")
        found.append((host.strip("[]"), int(port)))
    return found


def require_master(master: str, timeout_s: float = MASTER_CONNECT_TIMEOUT_S) -> None:
    """Refuse to start Spark when no master of a ``spark://`` URL accepts a connection.

    Spark itself retries for about a minute and a half, logging a stack trace each time, then fails with
    ``Cannot call methods on a stopped SparkContext``; this says which address did not answer, at once.
    """
    masters = standalone_masters(master)
    if not masters:
        return
    reasons = []
    for host, port in masters:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return
        except OSError as e:
            reasons.append(f"{host}:{port}: {e.strerror or type(e).__name__}")
    raise EnvironmentProblem(
        f"the Spark master {master} is not reachable ({'; '.join(reasons)}); start it, or set [spark] master "
        "in the spec to a running one"
    )


def on_loopback(master: str) -> bool:
    """Whether every executor runs on this machine's loopback, so the driver should listen there only.

    True for ``local[...]`` and for a standalone master (or HA list of masters) on a loopback address. On
    any other cluster the executors connect back to the driver over the network: Spark's default (the
    address of the machine's hostname) applies, or ``spark.driver.host`` from ``[spark.conf]``.
    """
    if master.startswith("local"):
        return True
    if not master.startswith(STANDALONE):
        return False
    return all(host in LOOPBACK_HOSTS for host, _ in standalone_masters(master))


#: This environment's Python for Spark's workers, importing PySpark as installed (:mod:`spark_jobs.worker_python`).
WORKER_PYTHON = "krishiv-spark-python"


def worker_python() -> str:
    """:data:`WORKER_PYTHON` beside this interpreter where it is installed (a console script of this package), else
    this interpreter."""
    script = Path(sysconfig.get_path("scripts")) / WORKER_PYTHON
    return str(script) if os.access(script, os.X_OK) else sys.executable


def prepare_environment(conf: Mapping[str, str] | None = None) -> None:
    """Check Java, and choose the Python that Spark's Python workers run in, on the driver and on executors.

    ``spark.pyspark.python`` of the configuration (a path that exists on the executors, e.g. one inside a
    packed environment of ``spark.archives``, or in a container image) wins over ``PYSPARK_PYTHON``; without
    either, this interpreter, which has Krishiv installed, through :data:`WORKER_PYTHON` where it is installed.
    """
    require_java()
    python = (conf or {}).get(EXECUTOR_PYTHON)
    if python:
        os.environ["PYSPARK_PYTHON"] = python
    os.environ.setdefault("PYSPARK_PYTHON", worker_python())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def prepare_session(spark: SparkSession) -> SparkSession:
    """Quiet logs and register Krishiv's Kafka sources (of one topic, of several) on a session, however it was
    built."""
    from spark_jobs.kafka_source import KafkaDataSource
    from spark_jobs.topics_source import TopicsDataSource

    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(KafkaDataSource)
    spark.dataSource.register(TopicsDataSource)
    return spark


def launch_detached_gateway(conf: Mapping[str, str]) -> None:
    """Start Spark's JVM in a process session of its own, unless this process has one already.

    A terminal's Ctrl-C reaches its whole foreground process group. PySpark's JVM ignores it, but the Python
    workers it forks (``pyspark.daemon``) restore Python's ``KeyboardInterrupt``: a Ctrl-C would kill the tasks in
    flight, fail the batch and print their tracebacks, instead of letting ``krishiv run`` stop between batches.
    In a session of its own the JVM and its workers get only what Krishiv sends them; they still end with this
    process, since the JVM exits when its standard input (a pipe from this process) closes.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return
    submit_conf = SparkConf(loadDefaults=False)
    for key, value in conf.items():
        submit_conf.set(key, value)
    SparkContext._ensure_initialized(gateway=launch_gateway(submit_conf, popen_kwargs={"start_new_session": True}))


def build_session(spec: KrishivSpec, app_name: str = "krishiv") -> SparkSession:
    from pyspark.sql import SparkSession

    conf = spark_conf(spec, app_name)
    prepare_environment(conf)
    require_master(spec.spark.master)
    launch_detached_gateway(conf)
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    return prepare_session(builder.getOrCreate())
