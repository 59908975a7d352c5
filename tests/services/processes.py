"""Stopping a service process the tests started: politely, then for sure."""

from __future__ import annotations

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
