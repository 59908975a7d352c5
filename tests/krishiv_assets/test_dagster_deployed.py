"""Dagster as deployed (docs/deployment.md, "Dagster as deployed"): the code server, the daemon and the webserver,
each a process of its own with its own ``DAGSTER_HOME`` (a copy of ``deploy/dagster.yaml``) and its own working
folder, sharing no disk but the warehouse.

- Dagster's runs, event logs and sensor state: a fresh PostgreSQL database, named to each process by the
  ``DAGSTER_PG_*`` variables ``deploy/dagster.yaml`` reads.
- Krishiv's ledger: a schema of another fresh database (``postgresql+psycopg://…?schema=…``); its catalog: a pyiceberg
  SqlCatalog in the same database; its warehouse: a local folder, the one thing the processes share (it stands for
  the object store). The spec file is configuration: each process reads a copy of its own.
- ``dagster code-server start -m krishiv_assets.definitions``: the code location, built from ``KRISHIV_SPEC``. Runs
  start as its subprocesses. The daemon and the webserver reach it by the host and port of a ``grpc_server``
  workspace. Where the machine lets the test make a pid namespace (root), the daemon runs in one of its own
  (``unshare --pid``): no process of the code server's is visible to it, as on another host.
- The Kafka sensor, RUNNING by default, is stopped through the webserver's GraphQL API before the daemon starts:
  staging is ``krishiv run --once --no-commit``, a process in yet another folder. The outbox sensor, RUNNING by
  default, is left on: the daemon's tick finds the pending batch and launches a commit run through the code server.

Then the table holds every valid event produced exactly once and the rejects table every malformed one (the oracle is
folded from the records read back from the topic, by the rules of docs/spec.md), ``krishiv verify`` exits 0, and the
webserver's GraphQL API reports the sensor's commit run SUCCESS, with the run launcher's note of where its worker ran.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TypeVar

import pytest
import yaml

from krishiv.broker import LocalBroker, free_port
from krishiv.operations import open_ledger
from krishiv.produce import demo_orders, ensure_topic, produce
from krishiv_assets.run_launcher import PLACED_MESSAGE, WORKER_NODE, this_node
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.entries import COMMITTED
from krishiv_core.spec import KrishivSpec, load_spec
from spark_jobs.kafka_source import latest_offsets
from tests.services.dagster_web import DagsterWeb

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PG_ADMIN_DSN = os.environ.get("KRISHIV_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
PIPELINE = "orders_raw"
LOCATION = {"repositoryLocationName": "krishiv", "repositoryName": "__repository__"}
RECORDS, MALFORMED, PARTITIONS = 600, 12, 3
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]
#: The processes that read the spec: the code server (its sensors and runs), the stager, and the test's own checks.
SPEC_READERS = {"code-server", "stager", "checker"}
#: What each process may leave in its folder besides its configuration and log: the stager its Spark checkpoint, the
#: daemon and the webserver Dagster's own files of their DAGSTER_HOME. The runs, subprocesses of the code server, write
#: nothing anywhere but the warehouse, the ledger and Dagster's PostgreSQL database.
OWN_FILES = {"stager": {"checkpoints"}, "daemon": {"logs", ".logs_queue"}, "webserver": {"logs", ".logs_queue"}}
START_TIMEOUT_S = 120.0
STAGE_TIMEOUT_S = 240.0
COMMIT_TIMEOUT_S = 180.0

T = TypeVar("T")

SPEC = """
[kafka]
bootstrap_servers = "{bootstrap}"
partitions = {partitions}

[iceberg]
catalog_uri = "{catalog_uri}"
warehouse = "{warehouse}"
namespace = "krishiv"

[storage]
ledger_path = "{ledger_uri}"
checkpoint_location = "checkpoints"

[spark]
master = "local[2]"
shuffle_partitions = 2

[[pipelines]]
name = "{pipeline}"
kind = "events"
topic = "{topic}"
kafka_metadata = ["partition", "offset"]
event_time_field = "event_time"
trigger_interval = "500ms"
max_records_per_batch = 100000

[pipelines.fields]
order_id = "string"
customer_id = "string"
amount = "decimal(12,2)"
event_time = "timestamp_ms"
"""


# ----------------------------------------------------------------------------------------------------------- helpers


def tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else f"({path} does not exist)"


@dataclass
class Service:
    name: str
    folder: Path
    process: subprocess.Popen
    log: Path

    def check(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.process.returncode}:\n{tail(self.log)}")


@dataclass
class Services:
    """The processes the test starts, each in a session (process group) of its own, stopped however the test ends."""

    started: list[Service] = field(default_factory=list)

    def start(self, name: str, args: list[str], folder: Path, env: dict[str, str]) -> Service:
        log = folder / f"{name}.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                args, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        service = Service(name, folder, process, log)
        self.started.append(service)
        return service

    def check(self) -> None:
        """Fail naming a long-running service that exited."""
        for service in self.started:
            if service.name != "stager":
                service.check()

    def stop_all(self) -> None:
        for service in reversed(self.started):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(service.process.pid, signal.SIGTERM)
        for service in reversed(self.started):
            with contextlib.suppress(subprocess.TimeoutExpired):
                service.process.wait(timeout=30)
            with contextlib.suppress(ProcessLookupError):  # what the group still holds: a run worker, a JVM
                os.killpg(service.process.pid, signal.SIGKILL)
            service.process.wait(timeout=30)


def wait_until(condition: Callable[[], T | None], what: str, timeout_s: float, alive: Callable[[], None]) -> T:
    """Poll ``condition`` until it is truthy (returning it), checking ``alive()`` between polls; fail naming ``what``
    after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive()
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f}s")
        time.sleep(0.25)


def can_unshare() -> bool:
    try:
        return subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class Webserver(DagsterWeb):
    def sensor(self, name: str) -> dict | None:
        """The sensor (its id and status) once the webserver has loaded the code location from the code server."""
        data = self.graphql(
            "query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) {"
            " __typename ... on Sensor { id sensorState { status } } } }",
            {"s": {**LOCATION, "sensorName": name}},
        )
        found = data["sensorOrError"]
        return found if found["__typename"] == "Sensor" else None

    def stop_sensor(self, name: str) -> str:
        sensor = self.sensor(name)
        assert sensor is not None, f"no sensor {name}"
        data = self.graphql(
            "mutation($id: String) { stopSensor(id: $id) { __typename"
            " ... on StopSensorMutationResult { instigationState { status } } ... on PythonError { message } } }",
            {"id": sensor["id"]},
        )
        return data["stopSensor"]["instigationState"]["status"]

    def runs(self, job: str) -> list[dict]:
        data = self.graphql(
            "query($f: RunsFilter) { runsOrError(filter: $f) { ... on Runs { results {"
            " runId jobName status tags { key value } } } } }",
            {"f": {"pipelineName": job}},
        )
        return [{**r, "tags": {t["key"]: t["value"] for t in r["tags"]}} for r in data["runsOrError"]["results"]]

    def engine_events(self, run_id: str) -> list[dict]:
        """The run's engine events: message and text metadata."""
        data = self.graphql(
            "query($r: ID!) { logsForRun(runId: $r) { ... on EventConnection { events { __typename"
            " ... on EngineEvent { message metadataEntries { label ... on TextMetadataEntry { text } } } } } } }",
            {"r": run_id},
        )
        return [
            {"message": e["message"], **{m["label"]: m.get("text") for m in e["metadataEntries"]}}
            for e in data["logsForRun"]["events"]
            if e["__typename"] == "EngineEvent"
        ]


# ------------------------------------------------------------------------------------------------------------ oracle


def topic_records(bootstrap: str, topic: str) -> dict[tuple[int, int], bytes | None]:
    """Every record of the topic, read back from the broker: (partition, offset) -> value."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    ends = {int(p): end for p, end in latest_offsets(bootstrap, topic).items()}
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"oracle-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    records: dict[tuple[int, int], bytes | None] = {}
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p, end in ends.items() if end])
        deadline = time.monotonic() + 60
        while len(records) < sum(ends.values()):
            assert time.monotonic() < deadline, f"read {len(records)} of {sum(ends.values())} records back"
            message = consumer.poll(1.0)
            if message is None or message.error():
                continue
            records[(message.partition(), message.offset())] = message.value()
    finally:
        consumer.close()
    return records


class Rejected(Exception):
    pass


def _number(token: tuple[str, str] | str, what: str) -> str:
    """A JSON number's token (numbers are parsed as ("number", text)), else the reject."""
    if not isinstance(token, tuple):
        raise Rejected(what)
    return token[1]


def _decimal_12_2(value: object) -> Decimal:
    """docs/spec.md: a JSON number in plain notation or a JSON string holding one; at most 2 fraction digits once the
    trailing zeros are dropped, at most 10 integer digits."""
    text = value[1] if isinstance(value, tuple) else value
    if not isinstance(text, str) or "e" in text.lower():
        raise Rejected("amount")
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise Rejected("amount") from None
    exponent = number.normalize().as_tuple().exponent
    if not isinstance(exponent, int):  # NaN, Infinity
        raise Rejected("amount")
    whole = len(str(abs(int(number)))) if abs(number) >= 1 else 0
    if -exponent > 2 or whole > 10:
        raise Rejected("amount")
    return number.quantize(Decimal("0.01"))


def expected_row(value: bytes | None) -> tuple[str, str, Decimal, int]:
    """The row docs/spec.md makes of an event value of the pipeline's fields, or :class:`Rejected`."""
    if value is None:
        raise Rejected("null value")
    try:
        document = json.loads(value, parse_int=lambda t: ("number", t), parse_float=lambda t: ("number", t))
    except ValueError:
        raise Rejected("malformed JSON") from None
    if not isinstance(document, dict):
        raise Rejected("malformed JSON")
    for name in ("order_id", "customer_id", "amount", "event_time"):
        if document.get(name) is None:
            raise Rejected(f"missing or null field: {name}")
    order_id, customer_id = document["order_id"], document["customer_id"]
    if not isinstance(order_id, str) or not isinstance(customer_id, str):
        raise Rejected("mistyped string")
    event_time = _number(document["event_time"], "event_time")
    if not event_time.lstrip("-").isdigit():  # an integer token: no fraction, no exponent
        raise Rejected("event_time")
    millis = int(event_time)
    if not -62_135_596_800_000 <= millis <= 253_402_300_799_999:  # the years 1 to 9999
        raise Rejected("event_time")
    return order_id, customer_id, _decimal_12_2(document["amount"]), millis


def _millis(value: datetime) -> int:
    """Epoch milliseconds of a timestamp column's value (a naive one is UTC), without a float in between."""
    moment = value if value.tzinfo else value.replace(tzinfo=UTC)
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


# ---------------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def dagster_database() -> Iterator[dict[str, str]]:
    """A fresh PostgreSQL database for Dagster's storage: the ``DAGSTER_PG_*`` variables deploy/dagster.yaml reads."""
    import psycopg

    name = f"krishiv_dagster_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=10) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    yield {
        "DAGSTER_PG_HOST": "127.0.0.1",
        "DAGSTER_PG_PORT": "5432",
        "DAGSTER_PG_DB": name,
        "DAGSTER_PG_USER": "postgres",
        "DAGSTER_PG_PASSWORD": "",  # trust authentication; deploy/dagster.yaml still reads the variable
    }
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=10) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def services() -> Iterator[Services]:
    group = Services()
    try:
        yield group
    finally:
        group.stop_all()


# -------------------------------------------------------------------------------------------------------------- test


def test_daemon_webserver_and_code_server_commit_exactly_once_sharing_only_the_warehouse(
    tmp_path: Path, broker: LocalBroker, postgres_uri: str, dagster_database: dict[str, str], services: Services
) -> None:
    started = time.monotonic()
    topic = f"orders-{uuid.uuid4().hex[:10]}"
    warehouse = tmp_path / "warehouse"  # the object store
    warehouse.mkdir()
    spec_text = SPEC.format(
        bootstrap=broker.bootstrap,
        partitions=PARTITIONS,
        catalog_uri=postgres_uri,
        warehouse=warehouse,
        ledger_uri=f"{postgres_uri}?schema=krishiv_ledger",
        pipeline=PIPELINE,
        topic=topic,
    )
    folders = {name: tmp_path / name for name in ("code-server", "daemon", "webserver", "stager", "checker")}
    for name, folder in folders.items():
        folder.mkdir()
        if name in SPEC_READERS:
            (folder / "krishiv.toml").write_text(spec_text)
    code_port, web_port = free_port(), free_port()
    # The webserver's and the daemon's workspace: the code server by host and port, as docs/deployment.md shows it.
    workspace = yaml.safe_dump(
        {"load_from": [{"grpc_server": {"host": "127.0.0.1", "port": code_port, "location_name": "krishiv"}}]}
    )
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("KRISHIV_", "DAGSTER_"))}

    def dagster_env(name: str) -> dict[str, str]:
        shutil.copy(ROOT / "deploy" / "dagster.yaml", folders[name] / "dagster.yaml")
        (folders[name] / "workspace.yaml").write_text(workspace)
        return {**base_env, **dagster_database, "DAGSTER_HOME": str(folders[name])}

    spec: KrishivSpec = load_spec(folders["checker"] / "krishiv.toml", env={})
    tables = [qualified(spec, t) for t in spec.pipeline().all_tables]

    # ---- The code server (runs start as its subprocesses) and the webserver; the stager, as soon as there are events.
    code_server = services.start(
        "code-server",
        [str(BIN / "dagster"), "code-server", "start", "-m", "krishiv_assets.definitions",
         "--host", "127.0.0.1", "--port", str(code_port)],
        folders["code-server"],
        {**dagster_env("code-server"), "KRISHIV_SPEC": str(folders["code-server"] / "krishiv.toml")},
    )  # fmt: skip
    web = Webserver(f"http://127.0.0.1:{web_port}")
    services.start(
        "webserver",
        [str(BIN / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(web_port)],
        folders["webserver"],
        dagster_env("webserver"),
    )
    ensure_topic(broker.bootstrap, topic, PARTITIONS)
    produce(broker.bootstrap, topic, demo_orders(RECORDS, seed=23, partitions=PARTITIONS, malformed=MALFORMED))
    stager = services.start(
        "stager",
        [sys.executable, "-m", "krishiv.cli", "--spec", "krishiv.toml", "run", "--once", "--no-commit"],
        folders["stager"],
        base_env,
    )

    # ---- The Kafka sensor stopped through the webserver before the daemon ticks it; the outbox sensor left on.
    wait_until(web.up, "the webserver to answer", START_TIMEOUT_S, services.check)
    outbox = wait_until(
        lambda: web.sensor(f"{PIPELINE}_outbox_sensor"), "the webserver to load the code server's location",
        START_TIMEOUT_S, services.check,
    )  # fmt: skip
    assert outbox["sensorState"]["status"] == "RUNNING", outbox  # on by default, nobody turned it on
    assert web.stop_sensor(f"{PIPELINE}_kafka_sensor") == "STOPPED"
    apart = can_unshare()  # the daemon in a pid namespace of its own: the code server's processes are not visible
    services.start(
        "daemon",
        [*(UNSHARE if apart else []), str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"],
        folders["daemon"],
        dagster_env("daemon"),
    )
    up_s = time.monotonic() - started

    # ---- Staged by krishiv run --once --no-commit; committed by a run the daemon's outbox sensor launched.
    def staged() -> bool:
        if stager.process.poll() not in (None, 0):
            stager.check()
        return stager.process.poll() == 0

    wait_until(staged, "krishiv run --once --no-commit to stage and exit", STAGE_TIMEOUT_S, services.check)
    staged_s = time.monotonic() - started
    latest = latest_offsets(broker.bootstrap, topic)
    assert sum(latest.values()) == RECORDS
    ledger = open_ledger(spec)

    def committed() -> bool:
        return not ledger.pending_batches(tables) and all(
            ledger.end_offsets(t, topic, status=COMMITTED) == latest for t in tables
        )

    wait_until(committed, "every batch committed", COMMIT_TIMEOUT_S, services.check)

    def commit_runs_finished() -> list[dict] | None:
        """The commit runs, once every one has ended and one succeeded (a batch staged after the first commit run
        started gets a run of its own)."""
        runs = web.runs(f"{PIPELINE}_commit_job")
        ended = all(r["status"] in ("SUCCESS", "FAILURE", "CANCELED") for r in runs)
        return runs if ended and any(r["status"] == "SUCCESS" for r in runs) else None

    runs = wait_until(commit_runs_finished, "a commit run to show SUCCESS", COMMIT_TIMEOUT_S, services.check)
    committed_s = time.monotonic() - started
    for run in runs:
        assert run["status"] == "SUCCESS", run
        assert run["tags"]["dagster/sensor_name"] == f"{PIPELINE}_outbox_sensor", run
        # The daemon's launcher recorded where the worker runs: on this node, or (from its own pid namespace)
        # elsewhere, where the health check leaves the pid alone.
        engine_events = web.engine_events(run["runId"])
        placed = [e for e in engine_events if PLACED_MESSAGE in e["message"]]
        assert len(placed) == 1, engine_events
        assert placed[0][WORKER_NODE] == ("" if apart else this_node()), placed
    assert web.runs(f"{PIPELINE}_stage_job") == [], "the Kafka sensor was stopped: krishiv run is the only stager"
    commits = ledger.commits_since(0, tables, limit=1_000)
    assert commits and {c.committed_by for c in commits} <= {f"dagster run {r['runId']}" for r in runs}, commits

    # ---- Every valid event exactly once, every malformed one a reject: the oracle folded from the topic's records.
    records = topic_records(broker.bootstrap, topic)
    assert len(records) == RECORDS
    expected, rejected = {}, set()
    for coordinates, value in records.items():
        try:
            expected[coordinates] = expected_row(value)
        except Rejected:
            rejected.add(coordinates)
    assert len(rejected) == MALFORMED

    catalog = load_catalog(spec)
    rows = catalog.load_table(qualified(spec, spec.pipeline().table)).scan().to_arrow().to_pylist()
    found = {
        (r["_kafka_partition"], r["_kafka_offset"]): (
            r["order_id"], r["customer_id"], r["amount"], _millis(r["event_time"])
        )
        for r in rows
    }  # fmt: skip
    assert len(rows) == len(found), "an event is in the table twice"
    assert found == expected
    rejects = catalog.load_table(qualified(spec, spec.pipeline().rejects_table)).scan().to_arrow().to_pylist()
    assert sorted((r["partition"], r["offset"]) for r in rejects) == sorted(rejected)

    verified = subprocess.run(
        [sys.executable, "-m", "krishiv.cli", "--spec", "krishiv.toml", "verify"],
        cwd=folders["checker"], env=base_env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]

    # ---- Nothing but the warehouse was shared: no process wrote into another's folder.
    code_server.check()
    for name, folder in folders.items():
        held = {p.name for p in folder.iterdir()} - {"krishiv.toml", "dagster.yaml", "workspace.yaml", f"{name}.log"}
        assert held <= OWN_FILES.get(name, set()), f"{name}'s folder holds {sorted(held)}"
    print(
        f"[deployed] up {up_s:.1f}s, staged {staged_s:.1f}s, committed {committed_s:.1f}s, "
        f"total {time.monotonic() - started:.1f}s; daemon in its own pid namespace: {apart}"
    )
