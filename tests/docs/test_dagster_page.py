"""docs/dagster.md's "Deploying the code location" runs as written: the definitions validate, and the code server
it starts answers Dagster's gRPC health check (on a free port instead of the page's 4000)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from krishiv.broker import free_port
from tests.docs.pages import DOCS, REPO, blocks_under

DAGSTER = str(Path(sys.executable).with_name("dagster"))


def test_the_code_location_validates_and_its_code_server_answers(tmp_path: Path) -> None:
    shell = next(b for b in blocks_under(DOCS / "dagster.md", "Deploying the code location") if b.language == "bash")
    lines = [shlex.split(line) for line in shell.text.splitlines() if line.strip()]
    assert [words[:3] for words in lines] == [
        ["export", "KRISHIV_SPEC=$PWD/krishiv.toml"],
        ["dagster", "definitions", "validate"],
        ["dagster", "code-server", "start"],
    ], "the page's commands are not the ones this test runs"
    env = {**os.environ, "KRISHIV_SPEC": str(REPO / "krishiv.toml"), "DAGSTER_HOME": str(tmp_path)}
    validated = subprocess.run([DAGSTER, *lines[1][1:]], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    said = validated.stdout + validated.stderr
    assert validated.returncode == 0 and "Validation successful" in said, said

    port = str(free_port())
    start = [DAGSTER, *lines[2][1:]]
    start[start.index("--port") + 1], start[start.index("--host") + 1] = port, "127.0.0.1"
    server = subprocess.Popen(start, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, answer = time.monotonic() + 120, None
        while time.monotonic() < deadline and server.poll() is None:
            answer = subprocess.run(
                [DAGSTER, "api", "grpc-health-check", "--port", port],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            if answer.returncode == 0:
                break
            time.sleep(0.5)  # polling the server's health, bounded by the deadline
        assert answer is not None and answer.returncode == 0, (server.poll(), answer and answer.stdout + answer.stderr)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a code server slow to stop on a loaded machine is stopped all the same
            server.kill()
            server.wait(timeout=30)
