"""Building the SparkSession Krishiv runs in, after checking Java is there."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from pyspark.sql import SparkSession

from krishiv.errors import EnvironmentProblem
from krishiv.spec import KrishivSpec
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


def build_session(spec: KrishivSpec, app_name: str = "krishiv") -> SparkSession:
    require_java()
    # Spark's Python workers must run in this interpreter, which has the project installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .master(spec.spark.master)
        .config("spark.sql.shuffle.partitions", str(spec.spark.shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    if spec.spark.master.startswith("local"):
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(KafkaDataSource)
    return spark
