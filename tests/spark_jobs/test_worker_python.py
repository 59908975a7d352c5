"""Spark's Python workers run through ``krishiv-spark-python``: PySpark imported as installed, not from the zip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyspark

from spark_jobs.session import WORKER_PYTHON, worker_python
from spark_jobs.worker_python import PYSPARK_ZIP

INSTALLED = str(Path(pyspark.__file__).parent)


def test_spark_workers_import_the_installed_pyspark(spark):
    def where(_rows):
        import pyspark as worker_pyspark

        yield (os.path.dirname(worker_pyspark.__file__), any(p.endswith(PYSPARK_ZIP) for p in sys.path))

    assert os.environ["PYSPARK_PYTHON"] == worker_python()
    assert Path(worker_python()).name == WORKER_PYTHON
    seen = set(spark.sparkContext.parallelize(range(4), 2).mapPartitions(where).collect())
    assert seen == {(INSTALLED, False)}


def test_the_worker_python_runs_a_module_as_dash_m_would_and_hands_anything_else_on(tmp_path):
    zip_path = os.path.join(INSTALLED, PYSPARK_ZIP)
    env = {**os.environ, "PYTHONPATH": zip_path}
    probe = "import os, sys, pyspark; print(pyspark.__file__); print(sys.path[0] == os.getcwd()); print(sys.argv[1:])"
    (tmp_path / "probe_module.py").write_text(probe)
    out = subprocess.run(
        [worker_python(), "-m", "probe_module", "a", "b"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [os.path.join(INSTALLED, "__init__.py"), "True", "['a', 'b']"]
    version = subprocess.run([worker_python(), "-c", "import sys; print(sys.version)"], capture_output=True, text=True)
    assert version.stdout.strip() == sys.version
