"""Stopping a service process the tests started: politely, then for sure."""

from __future__ import annotations

import os
import signal
import subprocess


def stop(process: subprocess.Popen, timeout_s: float = 15.0) -> None:
    """SIGTERM, and SIGKILL if it has not exited within ``timeout_s``; nothing if it already has."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout_s)


def stop_group(process: subprocess.Popen, grace_s: float = 60) -> None:
    """SIGTERM to the process group ``process`` leads (Dagster stops its webserver, daemon, code server and runs),
    then SIGKILL to what is left after ``grace_s``."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
