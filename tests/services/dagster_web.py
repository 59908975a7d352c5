"""A Dagster webserver as the end-to-end tests talk to it (its GraphQL API, whether it answers), and stopping the
process group that runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from dataclasses import dataclass


@dataclass
class DagsterWeb:
    url: str  # http://host:port

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        """The answer's data; fails the test on any GraphQL error."""
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(f"{self.url}/graphql", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.load(response)
        assert "errors" not in answer, answer["errors"]
        return answer["data"]

    def up(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/server_info", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False


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
