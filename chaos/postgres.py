"""A private PostgreSQL server for the catalog-pause scenario: initdb + pg_ctl on a free loopback port.

The harness pauses it with SIGSTOP, so it must never be the machine's shared server. As root, the server
runs as the ``postgres`` user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from krishiv.broker import free_port
from krishiv_core.errors import EnvironmentProblem


def _bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if not found:
        raise EnvironmentProblem(f"PostgreSQL's {name} was not found on PATH or in /usr/lib/postgresql/*/bin")
    return found


class PrivatePostgres:
    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="krishiv-chaos-pg-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.folder, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    @property
    def uri(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)

    def start(self) -> PrivatePostgres:
        self._run(_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync")
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.folder} -c fsync=off"
        )
        self._run(
            _bin("pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.folder / "server.log"), "-w", "start"
        )
        return self

    def pids(self) -> list[int]:
        """The postmaster and every backend: all of them must stop for the server to be paused."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
        return [postmaster, *map(int, children)]

    def pause(self) -> None:
        for pid in self.pids():
            os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in self.pids():
            os.kill(pid, signal.SIGCONT)

    def stop(self) -> None:
        try:
            self.resume()
            self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
        time.sleep(0.1)
        shutil.rmtree(self.folder, ignore_errors=True)
