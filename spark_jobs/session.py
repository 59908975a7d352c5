"""Building the SparkSession Krishiv runs in, after checking Java is there."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from pyspark.sql import SparkSession

from krishiv_core.errors import EnvironmentProblem
from krishiv_core.spec import KrishivSpec
from spark_jobs.kafka_source import KafkaDataSource

REQUIRED_JAVA = 17


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
    if spec.spark.master.startswith("local"):
        conf.setdefault("spark.driver.bindAddress", "127.0.0.1")
        conf.setdefault("spark.driver.host", "127.0.0.1")
    return conf


def prepare_environment() -> None:
    """Check Java, and make Spark's Python workers run in this interpreter (which has Krishiv installed)."""
    require_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def prepare_session(spark: SparkSession) -> SparkSession:
    """Quiet logs and register Krishiv's Kafka source on a session, however it was built."""
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(KafkaDataSource)
    return spark


def build_session(spec: KrishivSpec, app_name: str = "krishiv") -> SparkSession:
    prepare_environment()
    builder = SparkSession.builder
    for key, value in spark_conf(spec, app_name).items():
        builder = builder.config(key, value)
    return prepare_session(builder.getOrCreate())
