"""Measurement 6: peak resident memory of the Spark driver (the JVM), its Python workers and the driver's Python.

In local mode the JVM is a child of this Python process and the Python workers are children of the JVM, so
one thread sampling the process tree a few times a second sees all three.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import psutil

MB = 1024 * 1024


@dataclass
class PeakRss:
    jvm_mb: float = 0.0
    python_workers_mb: float = 0.0
    driver_python_mb: float = 0.0


class RssSampler:
    """``with RssSampler() as s: ...`` then ``s.peak``."""

    #: Each sample lists the process tree from /proc: at 0.2 s that cost the driver about 5 % of a core.
    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.peak = PeakRss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def sample(self) -> None:
        me = psutil.Process(os.getpid())
        jvm = workers = 0
        for child in me.children(recursive=True):
            try:
                rss = child.memory_info().rss
                # the executable, not the process name: a worker runs as the krishiv-spark-python script
                program = os.path.basename(child.exe())
            except psutil.Error:
                continue
            if program == "java":
                jvm += rss
            elif program.startswith("python"):
                workers += rss
        self.peak.jvm_mb = max(self.peak.jvm_mb, jvm / MB)
        self.peak.python_workers_mb = max(self.peak.python_workers_mb, workers / MB)
        self.peak.driver_python_mb = max(self.peak.driver_python_mb, me.memory_info().rss / MB)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
