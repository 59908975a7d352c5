"""The memory sampler counts Spark's Python workers however they were started, the worker script included."""

from __future__ import annotations

import subprocess
import sys
import time

from benchmarks.memory import RssSampler
from spark_jobs.session import worker_python

SLEEP = ["-m", "timeit", "-n", "1", "-r", "1", "__import__('time').sleep(30)"]


def test_a_worker_started_through_the_worker_script_counts_as_a_python_worker():
    for python in (worker_python(), sys.executable):
        sampler = RssSampler()
        child = subprocess.Popen([python, *SLEEP])
        deadline = time.monotonic() + 30
        try:  # sampled until the interpreter is up (a loaded machine takes a while to start it)
            sampler.sample()
            while sampler.peak.python_workers_mb <= 1 and time.monotonic() < deadline:
                time.sleep(0.05)
                sampler.sample()
        finally:
            child.kill()
            child.wait()
        assert sampler.peak.python_workers_mb > 1, python
        assert sampler.peak.jvm_mb == 0
