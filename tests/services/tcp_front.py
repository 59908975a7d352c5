"""A Tansu broker behind a TCP front that can be cut and put back on the same port: the broker as its clients see
it when it dies and comes back (connections dropped, then refused), with its records kept.

Why not stop and restart Tansu itself: the build this project runs (0.6.0) stores everything in memory (its
``postgres://`` engine is not compiled in), so a restarted Tansu comes back empty: a re-created topic, which the
source must refuse, not an outage it should ride out. Tansu advertises the front's address, so every client
(metadata, fetches) goes through the front.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from krishiv.broker import broker_command, free_port, wait_until_ready
from tests.services.processes import stop


@dataclass
class TcpFront:
    """Forwards ``host:port`` to ``upstream``; :meth:`cut` drops every connection and closes the port."""

    host: str
    port: int
    upstream: tuple[str, int]
    _listener: socket.socket | None = None
    _open: list[socket.socket] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """The broker is gone: open connections are reset, new ones refused."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._open.clear()

    def restore(self) -> None:
        """The broker is back on the same address."""
        self.start()


@pytest.fixture
def fronted_broker(tmp_path: Path) -> Iterator[TcpFront]:
    """A Tansu of its own (this test's outages touch no other test) behind a :class:`TcpFront`."""
    host, inner, outer = "127.0.0.1", free_port(), free_port()
    command = broker_command(host, inner)
    command[command.index("--advertised-listener-url") + 1] = f"tcp://{host}:{outer}"
    with open(tmp_path / "tansu.log", "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    front = TcpFront(host, outer, (host, inner))
    front.start()
    try:
        wait_until_ready(front.bootstrap, process=process)
        yield front
    finally:
        front.cut()
        stop(process)
