"""One scenario's world: a spec file in a folder of its own, and the real ``krishiv`` command run against it.

Every step runs as its own process (``python -m krishiv.cli``), so a fault point can SIGKILL it, and the
harness can SIGSTOP the broker or the catalog under it. A workspace starts with the one windowed pipeline of
:data:`SPEC_TEMPLATE`; :meth:`Workspace.write_kinds_spec` replaces it with :data:`KINDS_SPEC_TEMPLATE`, the three
newer kinds reading the one topic (run together by one ``krishiv run``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from krishiv.operations import open_ledger
from krishiv.produce import DEFAULT_SPACING_MS, OrderEvent, demo_orders, ensure_topic, produce
from krishiv_core.faults import FAULTS_ENV, FAULTS_LOG_ENV, FAULTS_SYNC_ENV
from krishiv_core.spec import KrishivSpec, load_spec
from outbox.ledger import Ledger

#: The repository's Dagster instance and workspace files, which the Dagster scenario runs as they are.
REPOSITORY = Path(__file__).resolve().parents[1]

SETTINGS_TEMPLATE = """
[kafka]
bootstrap_servers = "{bootstrap}"
partitions = {partitions}

[iceberg]
catalog_uri = "{catalog_uri}"
warehouse = "{warehouse}"
namespace = "krishiv"

[storage]
ledger_path = "ledger.duckdb"
checkpoint_location = "checkpoints"

[spark]
master = "local[2]"
shuffle_partitions = 2
"""
"""The settings every spec of the harness and the tests shares: a broker, a catalog, a ledger and checkpoints in the
spec's folder, and a small local Spark."""

ORDER_FIELDS = """
[pipelines.fields]
order_id = "string"
customer_id = "string"
amount = "decimal(12,2)"
event_time = "timestamp_ms"
"""
"""The demo orders' fields (``krishiv.produce.demo_orders``)."""

SPEC_TEMPLATE = (
    SETTINGS_TEMPLATE
    + """
[[pipelines]]
name = "orders_per_minute"
topic = "{topic}"
table = "orders_per_minute"
event_time_field = "event_time"
watermark_delay = "5s"
window = "1m"
trigger_interval = "500ms"
max_records_per_batch = {max_records}

[pipelines.fields]
order_id = "string"
customer_id = "string"
amount = "decimal(12,2)"
event_time = "timestamp_ms"

[[pipelines.aggregations]]
name = "order_count"
function = "count"

[[pipelines.aggregations]]
name = "amount_total"
function = "sum"
field = "amount"

[[pipelines.aggregations]]
name = "amount_min"
function = "min"
field = "amount"

[[pipelines.aggregations]]
name = "amount_max"
function = "max"
field = "amount"

[[pipelines.aggregations]]
name = "amount_avg"
function = "avg"
field = "amount"
"""
)


#: The fan-out's routes: the demo's customers c-000 to c-099 to one table, c-100 to c-199 to another.
KINDS_ROUTES = {f"c-{n:03d}": "orders_a" if n < 100 else "orders_b" for n in range(200)}

#: The kinds scenarios' spec, adapted from ``tests/spark_jobs/test_kinds.py``: raw events fanned out by customer
#: to routed tables (the others to a default table), with Kafka metadata so each offset is checked to be in one
#: table once; the latest order per customer (an upsert with tombstones); per-customer hopping windows in update
#: mode. All read the one topic and run in one ``krishiv run``.
EVENTS_SPEC_TEMPLATE = (
    SETTINGS_TEMPLATE
    + """
[[pipelines]]
name = "orders_raw"
kind = "events"
topic = "{topic}"
kafka_metadata = true
trigger_interval = "500ms"
max_records_per_batch = {max_records}
"""
    + ORDER_FIELDS
)
"""Raw orders with their Kafka metadata, one table: what the continuous-run fault tests read."""

KINDS_SPEC_TEMPLATE = (
    SETTINGS_TEMPLATE
    + """
[[pipelines]]
name = "orders_routed"
kind = "events"
topic = "{topic}"
kafka_metadata = true
route_by = "customer_id"
routes = {{ {routes} }}
unrouted = "orders_other"
partition_by = ["bucket(4, customer_id)"]
max_records_per_batch = {max_records}
{fields}
[[pipelines]]
name = "latest_order"
kind = "upsert"
topic = "{topic}"
key = ["customer_id"]
version_field = "event_time"
partition_by = ["bucket(8, customer_id)"]
max_records_per_batch = {max_records}
{fields}
[[pipelines]]
name = "customer_minutes"
topic = "{topic}"
event_time_field = "event_time"
watermark_delay = "5s"
window = "1m"
slide = "30s"
group_by = ["customer_id"]
output_mode = "update"
max_records_per_batch = {max_records}
{fields}
[[pipelines.aggregations]]
name = "orders"
function = "count"

[[pipelines.aggregations]]
name = "amount_total"
function = "sum"
field = "amount"
"""
)


MAINTENANCE_TEMPLATE = """
[maintenance]
keep_last = {keep_last}
keep_younger_than = "{keep_younger_than}"
min_files = {min_files}
orphan_grace = "{orphan_grace}"
"""
"""``krishiv maintain``'s settings in the maintenance scenarios (:meth:`Workspace.write_maintenance`)."""


class HarnessStopping(RuntimeError):
    """The harness is being stopped: no step starts any more."""


_steps: set[subprocess.Popen] = set()
_steps_lock = threading.Lock()
_stopping = threading.Event()


def _started(process: subprocess.Popen) -> subprocess.Popen:
    with _steps_lock:
        if _stopping.is_set():
            process.kill()
            raise HarnessStopping("the harness is stopping; no step starts")
        _steps.difference_update({p for p in _steps if p.poll() is not None})
        _steps.add(process)
    return process


def stop_all_steps() -> None:
    """SIGKILL every step any workspace started that still runs (a Dagster daemon with its whole session), and
    refuse new ones: how the harness stops while scenarios run in several threads."""
    with _steps_lock:
        _stopping.set()
        for process in _steps:
            if process.poll() is None:
                try:
                    if getattr(process, "own_session", False):
                        os.killpg(process.pid, signal.SIGKILL)
                    else:
                        process.kill()
                except ProcessLookupError:
                    pass


@dataclass
class Workspace:
    folder: Path
    bootstrap: str
    topic: str
    catalog_uri: str = "sqlite:///catalog.db"
    max_records: int = 1_000
    spacing_ms: int = DEFAULT_SPACING_MS  # event-time distance between orders: fewer orders span as many windows
    env: dict[str, str] = field(default_factory=dict)  # set for every process the workspace starts

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.spec_file = self.folder / "krishiv.toml"
        self._write_spec(SPEC_TEMPLATE)
        self.sync_dir = self.folder / "fault-sync"
        self.sync_dir.mkdir(exist_ok=True)
        self.faults_log = self.folder / "faults.jsonl"
        self.next_start_ms: int | None = None

    def _write_spec(self, template: str, **values: object) -> None:
        self.spec_file.write_text(
            template.format(
                bootstrap=self.bootstrap,
                partitions=4,
                catalog_uri=self.catalog_uri,
                warehouse="warehouse",
                topic=self.topic,
                max_records=self.max_records,
                **values,
            )
        )
        self.spec: KrishivSpec = load_spec(self.spec_file, env={})

    def write_kinds_spec(self, max_records: int | None = None, routes: dict[str, str] | None = None) -> None:
        """Replace the spec with :data:`KINDS_SPEC_TEMPLATE` (before anything ran): ``max_records`` per batch of every
        pipeline (default: the workspace's); ``routes`` maps a customer id to its table (default: :data:`KINDS_ROUTES`,
        a tenth of the demo's customers each to two tables, the rest to the default table)."""
        if max_records is not None:
            self.max_records = max_records
        text = ", ".join(f'"{customer}" = "{table}"' for customer, table in (routes or KINDS_ROUTES).items())
        self._write_spec(KINDS_SPEC_TEMPLATE, routes=text, fields=ORDER_FIELDS)

    def write_nested_spec(self, max_records: int) -> None:
        """Replace the spec with the three nested pipelines of :mod:`chaos.nested` on the topic (before anything ran),
        ``max_records`` per batch."""
        from chaos.nested import NESTED_FIELDS, NESTED_PIPELINES_TEMPLATE

        self.max_records = max_records
        self._write_spec(SETTINGS_TEMPLATE + NESTED_PIPELINES_TEMPLATE, fields=NESTED_FIELDS)

    def produce_nested(self, records: int, *, seed: int) -> list:
        """Seeded nested records (:func:`chaos.nested.nested_records`) after everything produced so far."""
        from chaos.nested import nested_records

        partitions = ensure_topic(self.bootstrap, self.topic, self.spec.kafka.partitions)
        extra = {"start_ms": self.next_start_ms} if self.next_start_ms is not None else {}
        events = nested_records(records, seed=seed, partitions=partitions, **extra)
        produce(self.bootstrap, self.topic, events)
        last = max(e.event_time_ms for e in events if e.event_time_ms is not None)
        self.next_start_ms = last + 90_000
        return events

    def write_maintenance(
        self, *, keep_last: int = 1, keep_younger_than: str = "1ms", min_files: int = 2, orphan_grace: str = "10m"
    ) -> None:
        """Add a ``[maintenance]`` section to the spec: by default ``krishiv maintain`` compacts any two small files
        and expires every snapshot but the newest, whatever its age; orphan removal keeps the spec's floor (only
        ``krishiv remove-orphans --force`` goes below it)."""
        section = MAINTENANCE_TEMPLATE.format(
            keep_last=keep_last, keep_younger_than=keep_younger_than, min_files=min_files, orphan_grace=orphan_grace
        )
        self.spec_file.write_text(self.spec_file.read_text() + section)
        self.spec = load_spec(self.spec_file, env={})

    def ledger(self) -> Ledger:
        return open_ledger(self.spec)

    @property
    def ledger_path(self) -> Path:
        return self.spec.resolve(self.spec.storage.ledger_path)

    def _env(self, faults: str | None, extra: dict[str, str] | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KRISHIV_")}
        env[FAULTS_LOG_ENV] = str(self.faults_log)
        env[FAULTS_SYNC_ENV] = str(self.sync_dir)
        env["COLUMNS"] = "1000"  # one message per line in commands.log
        env.update(self.env)
        if faults:
            env[FAULTS_ENV] = faults
        env.update(extra or {})
        return env

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "krishiv.cli", "--spec", str(self.spec_file), *args]

    def start(self, *args: str, faults: str | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
        log = (self.folder / "commands.log").open("a")
        log.write(f"\n$ {time.strftime('%H:%M:%S')} krishiv {' '.join(args)} faults={faults}\n")
        log.flush()
        return _started(
            subprocess.Popen(
                self.command(*args),
                env=self._env(faults, env),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        )

    def start_dagster(self, faults: str | None = None) -> subprocess.Popen:
        """``dagster-daemon run`` on this workspace's spec, with the repository's dagster.yaml and workspace.yaml
        (DAGSTER_HOME is the workspace folder), in a session of its own so its whole process group (daemon,
        code server, run workers) can be killed at once."""
        for name in ("dagster.yaml", "workspace.yaml"):
            if not (REPOSITORY / name).exists():
                raise FileNotFoundError(f"{REPOSITORY / name} is missing: the Dagster scenario runs the repository's")
            shutil.copy(REPOSITORY / name, self.folder / name)
        log = (self.folder / "dagster.log").open("a")
        log.write(f"\n$ {time.strftime('%H:%M:%S')} dagster-daemon run faults={faults}\n")
        log.flush()
        env = self._env(faults, {"DAGSTER_HOME": str(self.folder), "KRISHIV_SPEC": str(self.spec_file)})
        daemon = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", "workspace.yaml"],
            cwd=self.folder,
            env={k: v for k, v in env.items() if not k.startswith("DAGSTER_") or k == "DAGSTER_HOME"},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        daemon.own_session = True  # type: ignore[attr-defined]  # stop_all_steps kills its whole session
        return _started(daemon)

    def run(
        self, *args: str, faults: str | None = None, env: dict[str, str] | None = None, timeout_s: float = 600
    ) -> int:
        process = self.start(*args, faults=faults, env=env)
        started = time.monotonic()
        try:
            rc = process.wait(timeout=timeout_s)
            with (self.folder / "commands.log").open("a") as log:
                log.write(f"= exit {rc} after {time.monotonic() - started:.1f}s\n")
            return rc
        except BaseException:  # a timeout, or the harness itself being stopped: leave no step behind
            process.kill()
            process.wait()
            raise

    def produce(self, records: int, *, seed: int, late: int = 0, malformed: int = 0) -> list[OrderEvent]:
        """Seeded orders after everything produced so far (so earlier windows close), late and malformed mixed in."""
        partitions = ensure_topic(self.bootstrap, self.topic, self.spec.kafka.partitions)
        extra = {"start_ms": self.next_start_ms} if self.next_start_ms is not None else {}
        events = demo_orders(
            records,
            seed=seed,
            partitions=partitions,
            late=late,
            malformed=malformed,
            spacing_ms=self.spacing_ms,
            **extra,
        )
        produce(self.bootstrap, self.topic, events)
        last = max(e.event_time_ms for e in events if e.event_time_ms is not None)
        self.next_start_ms = last + 90_000
        return events

    def produce_tombstones(self, keys: list[bytes]) -> None:
        """A tombstone (null value) per key, spread over the partitions, ONE record per produce request: Tansu's high
        watermark is the last produce batch's base offset + 1, so a batch of several would hide all but its first."""
        from confluent_kafka import Producer

        partitions = ensure_topic(self.bootstrap, self.topic, self.spec.kafka.partitions)
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": False})
        failures: list[str] = []
        for n, key in enumerate(keys):
            producer.produce(
                self.topic,
                key=key,
                value=None,
                partition=n % partitions,
                on_delivery=lambda err, _msg: failures.append(str(err)) if err is not None else None,
            )
            if producer.flush(30) or failures:
                raise RuntimeError(f"tombstone {key!r} was not acknowledged by {self.bootstrap}: {failures}")

    def recreate_topic(self, timeout_s: float = 30.0) -> None:
        """Delete the topic and create it again with as many partitions: a new topic id, offsets from 0 again."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.delete_topics([self.topic], operation_timeout=timeout_s).values():
            future.result(timeout_s)
        deadline = time.monotonic() + timeout_s
        while self.topic in admin.list_topics(timeout=timeout_s).topics:
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {self.topic} was still listed {timeout_s:.0f}s after its deletion")
            time.sleep(0.1)
        topic = NewTopic(self.topic, num_partitions=self.spec.kafka.partitions, replication_factor=1)
        for future in admin.create_topics([topic]).values():
            future.result(timeout_s)
