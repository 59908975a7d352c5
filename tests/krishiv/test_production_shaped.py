"""Krishiv as a deployment runs it, every part real and in a process of its own, end to end and exactly once.

- Spark: a standalone master and worker (``spark_cluster``); the Kafka source's tasks run in the worker's executor.
- The catalog: the Iceberg REST server ``lakana-server`` (over PostgreSQL), in an environment whose storage is S3
  (moto's server, which checks every request's signature): tables, metadata and staged files are all in the bucket.
- The ledger: a fresh schema of the machine's PostgreSQL (``postgresql://…?schema=…``), dropped afterwards.
- Dagster: ``dagster-daemon run -m krishiv_assets.definitions`` with a copy of ``deploy/dagster.yaml`` (runs, events
  and sensor state in a fresh PostgreSQL database). Both sensors are RUNNING by default (``default_status``); the
  Kafka sensor is stopped first (``dagster sensor stop``), as in a deployment where a continuous ``krishiv run`` is
  the stager: with it running, a dead ``krishiv run``'s stager lease lets the Kafka sensor start a lingering staging
  run, which holds the lease while events keep arriving, and the restarted ``krishiv run`` would refuse to start
  (``StagerBusy``). The outbox sensor stays on: the safety net for what a dead committer left pending.
- The stager: a continuous ``krishiv run`` (it commits its own batches) SIGKILLed, with its Spark driver, twice
  while orders keep arriving (a producer thread writes a wave every second, also while it is down), each time once
  the ledger shows a batch pending. While it is down the daemon's outbox sensor launches a commit run for what it
  left pending; the test waits for that run to commit it before starting ``krishiv run`` again.

At the end every produced offset is staged once, the table equals the oracle folded from the topic's records
(``chaos.checks.check_contract``: windows, rejects, late counts, linear lineage with one snapshot per batch, the
ledger agreeing with the table), ``krishiv verify`` exits 0 and ``krishiv status`` shows nothing pending and no lag.
Each phase's seconds are printed (``-s``); the whole is bounded by the test's timeout (15 minutes), not timed.

Run it with ``.venv/bin/pytest -m heavy tests/krishiv/test_production_shaped.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chaos.checks import check_contract
from chaos.workspace import SPEC_TEMPLATE
from krishiv.produce import OrderEvent, demo_orders, ensure_topic, produce
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.entries import COMMITTED
from krishiv_core.spec import KrishivSpec, load_spec
from outbox.ledger import Ledger
from outbox.ledger.queries import CommitRecord
from spark_jobs.kafka_source import latest_offsets
from tests.services.rest_catalog import NAMESPACE, RestCatalogServer, _request
from tests.services.s3 import S3Endpoint
from tests.services.spark_cluster import SparkCluster
from tests.spark_jobs.pipeline_helpers import ROOT
from tests.spark_jobs.test_cluster import executor_python, on_cluster

pytestmark = [pytest.mark.heavy, pytest.mark.postgres, pytest.mark.timeout(900)]

PG_ADMIN_DSN = os.environ.get("KRISHIV_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
PIPELINE = "orders_per_minute"
PARTITIONS = 3
MAX_RECORDS = 300  # a batch reads at most this many offsets: a backlog after a restart is several batches
WAVE = 60  # orders per wave, one wave a second (a few late and malformed in each)
WAVE_INTERVAL_S = 1.0
KILLS = 2
#: Commits a run's own committer must make before it is killed (so each run is seen to stage and commit).
OWN_COMMITS_BEFORE_KILL = 4
START_TIMEOUT_S = 240.0  # a `krishiv run` on the cluster: Spark's start, the executor's, the first batch
DAGSTER_TIMEOUT_S = 180.0  # the outbox sensor's tick, a commit run's launch and its commit
DRAIN_TIMEOUT_S = 240.0
KILLED = -signal.SIGKILL


# ----------------------------------------------------------------------------------------------------------- helpers


def wait_until(
    condition: Callable[[], object],
    what: str,
    timeout_s: float,
    *,
    alive: Callable[[], None] = lambda: None,
    poll_s: float = 0.2,
):
    """Wait until ``condition()`` is truthy (returning it), checking ``alive()`` (raises if a process died) between
    polls ``poll_s`` apart; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive()
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f}s")
        time.sleep(poll_s)


def tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else f"({path} does not exist)"


@dataclass
class Processes:
    """Every process the test starts, each in a session of its own: stopped (its whole group) however the test ends."""

    started: list[subprocess.Popen] = field(default_factory=list)

    def start(self, args: list[str], *, env: dict[str, str], log: Path, cwd: Path = ROOT) -> subprocess.Popen:
        with log.open("a") as out:
            out.write(f"\n$ {time.strftime('%H:%M:%S')} {' '.join(args)}\n")
            out.flush()
            process = subprocess.Popen(
                args,
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.started.append(process)
        return process

    @staticmethod
    def signal_group(process: subprocess.Popen, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)

    def kill(self, process: subprocess.Popen) -> int:
        """SIGKILL the process and everything in its group (a ``krishiv run``: its Spark driver JVM too), reaped:
        a zombie's pid would still look alive to the stager lease's check."""
        self.signal_group(process, signal.SIGKILL)
        return process.wait(timeout=60)

    def stop(self, process: subprocess.Popen, timeout_s: float = 60.0) -> int:
        """SIGTERM the group's leader, then SIGKILL the group if it has not exited in ``timeout_s``."""
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.signal_group(process, signal.SIGKILL)
                process.wait(timeout=60)
        self.signal_group(process, signal.SIGKILL)  # whatever it left in its group (a JVM, a run worker)
        return process.returncode

    def stop_all(self) -> None:
        for process in reversed(self.started):
            with contextlib.suppress(Exception):
                self.stop(process, timeout_s=20)


class OrderStream(threading.Thread):
    """A wave of seeded orders every second until stopped, each wave after the last in event time (so windows keep
    closing), with late and malformed events in each."""

    def __init__(self, spec: KrishivSpec) -> None:
        super().__init__(name="orders", daemon=True)
        self.spec = spec
        self.topic = spec.pipeline().topic
        self.partitions = ensure_topic(spec.kafka.bootstrap_servers, self.topic, spec.kafka.partitions)
        self.events: list[OrderEvent] = []
        self.waves = 0
        self.next_start_ms: int | None = None
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def wave(self) -> None:
        extra = {"start_ms": self.next_start_ms} if self.next_start_ms is not None else {}
        events = demo_orders(WAVE, seed=1_000 + self.waves, partitions=self.partitions, late=2, malformed=1, **extra)
        produce(self.spec.kafka.bootstrap_servers, self.topic, events)
        self.events += events
        self.waves += 1
        self.next_start_ms = max(e.event_time_ms for e in events if e.event_time_ms is not None) + 20_000

    def run(self) -> None:
        try:
            while not self.stopping.wait(WAVE_INTERVAL_S):
                self.wave()
        except BaseException as exc:  # handed to the test thread by check()
            self.error = exc

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"producing orders failed: {self.error!r}") from self.error

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=120)
        assert not self.is_alive(), "the producer did not stop"
        self.check()


@dataclass
class Phases:
    """Each phase's seconds, printed as they end."""

    started: float = field(default_factory=time.monotonic)
    seconds: dict[str, float] = field(default_factory=dict)
    _mark: float = field(default_factory=time.monotonic)

    def done(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = now - self._mark
        self._mark = now
        print(f"[phase] {name}: {self.seconds[name]:.1f}s (total {now - self.started:.1f}s)", flush=True)

    @property
    def total(self) -> float:
        return time.monotonic() - self.started


# ---------------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def ledger_uri() -> Iterator[str]:
    """The ledger in a fresh schema of the machine's PostgreSQL (made by the first write), dropped afterwards."""
    import psycopg

    schema = f"krishiv_e2e_{uuid.uuid4().hex[:10]}"
    yield f"{PG_ADMIN_DSN}?schema={schema}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=10) as con:
        con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def dagster_db(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A fresh PostgreSQL database for the Dagster instance: the ``DAGSTER_PG_*`` variables deploy/dagster.yaml
    reads (set here too, so the test reads the instance), dropped afterwards."""
    import psycopg

    name = f"krishiv_dagster_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=10) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    variables = {
        "DAGSTER_PG_HOST": "127.0.0.1",
        "DAGSTER_PG_PORT": "5432",
        "DAGSTER_PG_DB": name,
        "DAGSTER_PG_USER": "postgres",
        "DAGSTER_PG_PASSWORD": "",  # trust authentication; the variable must still be set
    }
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    yield variables
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=10) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def processes() -> Iterator[Processes]:
    group = Processes()
    try:
        yield group
    finally:
        group.stop_all()


def s3_environment(rest_catalog: RestCatalogServer, s3: S3Endpoint) -> tuple[str, str]:
    """A Lakana environment whose storage is the bucket: ``(prefix, root)``. Its storage options are pyiceberg's S3
    names, which Lakana hands to pyiceberg's FileIO as they are and translates for fsspec (s3fs)."""
    prefix = f"e2e{uuid.uuid4().hex[:10]}"
    root = f"s3://{s3.bucket}/{prefix}"
    options = {
        "s3.endpoint": s3.endpoint,
        "s3.region": s3.region,
        "s3.access-key-id": s3.access_key_id,
        "s3.secret-access-key": os.environ[s3.secret_env],
    }
    body = {"name": prefix, "storage": {"scheme": "s3", "root": root, "options": options}}
    _request(f"{rest_catalog.uri}/api/v1/environments", os.environ[rest_catalog.token_variable], body)
    return prefix, root


def write_spec(
    folder: Path,
    *,
    bootstrap: str,
    topic: str,
    rest_catalog: RestCatalogServer,
    s3: S3Endpoint,
    ledger_uri: str,
    cluster: SparkCluster,
    app_name: str,
) -> Path:
    """The tests' windowed pipeline on the cluster, with the REST catalog over S3 and the PostgreSQL ledger; secrets
    by reference. The executors' Python notes the folder it starts in (``python-started-in.txt``)."""
    prefix, root = s3_environment(rest_catalog, s3)
    text = SPEC_TEMPLATE.format(
        bootstrap=bootstrap,
        partitions=PARTITIONS,
        catalog_uri=rest_catalog.uri,
        warehouse=root,
        topic=topic,
        max_records=MAX_RECORDS,
    )
    for old, new in (
        ('namespace = "krishiv"', f'namespace = "{NAMESPACE}"'),
        ('ledger_path = "ledger.duckdb"', f'ledger_path = "{ledger_uri}"'),
    ):
        assert old in text
        text = text.replace(old, new)
    path = folder / "krishiv.toml"
    path.write_text(text)
    python, _started_in = executor_python(folder)
    on_cluster(path, cluster, app_name, python)  # [spark.conf]: the master, the application's name and executor
    text = path.read_text() + (
        "\n[iceberg.properties]\n"
        f'token = "${{{rest_catalog.token_variable}}}"\n'
        f'prefix = "{prefix}"\n'
        f'"s3.endpoint" = "{s3.endpoint}"\n'
        f'"s3.region" = "{s3.region}"\n'
        f'"s3.access-key-id" = "{s3.access_key_id}"\n'
        f'"s3.secret-access-key" = "${{{s3.secret_env}}}"\n'
    )
    path.write_text(text)
    return path


# -------------------------------------------------------------------------------------------------------------- test


def test_a_production_shaped_deployment_is_exactly_once_through_kills(
    tmp_path: Path,
    broker,
    topic: str,
    spark_cluster: SparkCluster,
    rest_catalog: RestCatalogServer,
    s3: S3Endpoint,
    ledger_uri: str,
    dagster_db: dict[str, str],
    processes: Processes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dagster as dg

    from krishiv_assets.definitions import commit_job_name

    phases = Phases()
    app_name = f"krishiv-e2e-{uuid.uuid4().hex[:8]}"
    spec_file = write_spec(
        tmp_path,
        bootstrap=broker.bootstrap,
        topic=topic,
        rest_catalog=rest_catalog,
        s3=s3,
        ledger_uri=ledger_uri,
        cluster=spark_cluster,
        app_name=app_name,
    )
    started_in = tmp_path / "python-started-in.txt"
    spec = load_spec(spec_file)  # ${…} from this process's environment, where the fixtures put them
    for secret in (os.environ[rest_catalog.token_variable], os.environ[s3.secret_env]):
        assert secret not in spec_file.read_text(), "the spec names the variables only"
    tables = sorted(qualified(spec, t) for t in spec.pipeline().all_tables)
    main_table = qualified(spec, spec.pipeline().table)
    ledger = Ledger(ledger_uri)

    # What every process gets: no KRISHIV_* of this one but the two secrets the spec names.
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("KRISHIV_", "DAGSTER_"))}
    base_env.update({v: os.environ[v] for v in (rest_catalog.token_variable, s3.secret_env)})
    base_env["COLUMNS"] = "200"

    # ---- Dagster: its own home (deploy/dagster.yaml), the Kafka sensor stopped, the daemon started.
    dagster_home = tmp_path / "dagster-home"
    dagster_home.mkdir()
    shutil.copy(ROOT / "deploy" / "dagster.yaml", dagster_home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))  # the instance this test reads resolves it, as each process
    dagster_env = {**base_env, **dagster_db, "DAGSTER_HOME": str(dagster_home), "KRISHIV_SPEC": str(spec_file)}
    bin_dir = Path(sys.executable).parent
    location = ["-m", "krishiv_assets.definitions", "-d", str(ROOT)]
    stopped = subprocess.run(
        [str(bin_dir / "dagster"), "sensor", "stop", f"{PIPELINE}_kafka_sensor", *location],
        cwd=ROOT,
        env=dagster_env,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert stopped.returncode == 0, stopped.stdout[-3000:] + stopped.stderr[-3000:]
    dagster_log = tmp_path / "dagster.log"
    daemon = processes.start([str(bin_dir / "dagster-daemon"), "run", *location], env=dagster_env, log=dagster_log)

    def daemon_alive() -> None:
        if daemon.poll() is not None:
            raise AssertionError(f"dagster-daemon exited with {daemon.returncode}:\n{tail(dagster_log)}")

    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:

        def sensor_daemon_beats() -> bool:
            return "SENSOR" in instance.get_daemon_heartbeats()

        wait_until(sensor_daemon_beats, "the daemon's sensor daemon did not beat", 120, alive=daemon_alive)
    phases.done("dagster daemon up (Kafka sensor stopped, outbox sensor running)")

    # ---- Orders start flowing and never stop until the end (also while krishiv run is down).
    stream = OrderStream(spec)
    stream.wave()  # the topic holds records before the first run
    stream.start()

    runs: list[tuple[subprocess.Popen, Path]] = []

    def start_run() -> tuple[subprocess.Popen, Path]:
        log = tmp_path / f"krishiv-run-{len(runs) + 1}.log"
        run = processes.start(
            [sys.executable, "-m", "krishiv.cli", "--spec", str(spec_file), "run"], env=base_env, log=log
        )
        runs.append((run, log))
        return run, log

    def alive(run: subprocess.Popen, log: Path) -> Callable[[], None]:
        def check() -> None:
            stream.check()
            daemon_alive()
            if run.poll() is not None:
                raise AssertionError(f"krishiv run exited with {run.returncode}:\n{tail(log)}")

        return check

    def commits(after: int = 0) -> list[CommitRecord]:
        return ledger.commits_since(after, limit=1_000_000)

    def own_commits(after: int) -> list[CommitRecord]:
        return [c for c in commits(after) if c.committed_by == "krishiv run"]

    def pending() -> list:
        return ledger.pending_batches(tables)

    dagster_commits: list[CommitRecord] = []
    left_pending: list[list] = []
    for round_ in range(1, KILLS + 1):
        # ---- krishiv run: up, committing its own batches while the waves arrive.
        seq = ledger.last_commit_seq() if round_ > 1 else 0
        run, log = start_run()
        wait_until(
            lambda seq=seq: len({c.batch_id for c in own_commits(seq)}) >= OWN_COMMITS_BEFORE_KILL,
            f"run {round_}: krishiv run did not commit {OWN_COMMITS_BEFORE_KILL} batches of its own",
            START_TIMEOUT_S,
            alive=alive(run, log),
        )
        phases.done(f"run {round_}: started and committed {OWN_COMMITS_BEFORE_KILL} batches itself")

        # ---- SIGKILL (with its driver JVM) the moment the ledger shows a batch staged and not yet committed.
        # (A batch is pending for a few hundred milliseconds between its ledger write and its committer's commits.)
        wait_until(pending, f"run {round_}: no batch was seen pending", 60, alive=alive(run, log), poll_s=0.02)
        assert processes.kill(run) == KILLED
        left = pending()
        left_pending.append(left)
        seq_at_kill = ledger.last_commit_seq()
        print(f"[run {round_}] SIGKILLed with {len(left)} entries pending: {sorted({p.batch_id for p in left})}")
        phases.done(f"run {round_}: SIGKILLed with a batch pending")

        # ---- Down: the outbox sensor sees no live lease and launches a commit run for what was left.
        if left:
            wait_until(
                lambda: not pending(),
                f"down {round_}: Dagster did not commit what the killed run left",
                DAGSTER_TIMEOUT_S,
                alive=lambda: (stream.check(), daemon_alive()),
            )
            keys = {(p.query_id, p.table, p.batch_id) for p in left}
            made = [c for c in commits(seq_at_kill) if (c.query_id, c.table, c.batch_id) in keys]
            assert {(c.query_id, c.table, c.batch_id) for c in made} == keys
            assert all((c.committed_by or "").startswith("dagster run ") for c in made), made
            dagster_commits += made
        phases.done(f"down {round_}: Dagster committed the {len(left)} entries left pending")

    # ---- The last run: catches up the backlog, then the orders stop and it drains; SIGTERM stops it cleanly.
    seq = ledger.last_commit_seq()
    run, log = start_run()
    wait_until(
        lambda: own_commits(seq), "the last krishiv run committed nothing", START_TIMEOUT_S, alive=alive(run, log)
    )
    phases.done("run 3: started and committing")
    stream.stop()
    latest = latest_offsets(spec.kafka.bootstrap_servers, topic)
    produced = len(stream.events)
    assert sum(latest.values()) == produced, (latest, produced)

    def drained() -> bool:
        return not pending() and all(ledger.end_offsets(t, topic, status=COMMITTED) == latest for t in tables)

    wait_until(
        drained, "the last krishiv run did not stage and commit every order", DRAIN_TIMEOUT_S, alive=alive(run, log)
    )
    assert processes.stop(run) == 0, tail(log)
    phases.done(f"run 3: drained {produced} orders ({stream.waves} waves), stopped by SIGTERM")

    # ---- The end state, checked from outside.
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "krishiv.cli", "--spec", str(spec_file), *args],
            cwd=ROOT,
            env=base_env,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )

    verified = cli("verify")
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
    status = cli("status", "--json")
    assert status.returncode == 0, status.stdout[-3000:] + status.stderr[-3000:]
    (shown,) = json.loads(status.stdout)["pipelines"]
    assert {t["table"]: t["pending"] for t in shown["tables"]} == dict.fromkeys(tables, 0), shown["tables"]
    assert [p["lag"] for p in shown["partitions"]] == [0] * PARTITIONS, shown["partitions"]
    assert shown["events"]["read"] == produced, shown["events"]
    assert not json.loads(status.stdout)["removed_pipelines"]

    # Every offset staged once, the tables equal the oracle folded from the topic, lineage linear, nothing pending.
    contract = check_contract(spec, latest)
    assert not contract.violations, contract.violations
    malformed = sum(e.kind == "malformed" for e in stream.events)
    assert len(contract.expected.rejects) == malformed
    table = load_catalog(spec).load_table(main_table)
    rows = table.scan().to_arrow()
    assert rows.num_rows == len(contract.expected.windows) > 0
    assert sum(rows.column("order_count").to_pylist()) <= sum(e.kind == "valid" for e in stream.events) + sum(
        e.kind == "late" for e in stream.events
    )

    # Who committed what: each run's committer, and Dagster's commit runs for what the kills left pending.
    all_commits = commits()
    assert len(all_commits) == len({(c.query_id, c.table, c.batch_id) for c in all_commits}), "a batch twice"
    by_dagster = [c for c in all_commits if (c.committed_by or "").startswith("dagster run ")]
    assert len(by_dagster) + len(own_commits(0)) == len(all_commits), {c.committed_by for c in all_commits}
    assert dagster_commits, f"no Dagster run committed anything: the kills left {left_pending} pending"
    run_ids = {(c.committed_by or "").removeprefix("dagster run ") for c in by_dagster}
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:

        def finished() -> dict[str, dg.DagsterRun]:
            found = {r.run_id: r for r in instance.get_runs(dg.RunsFilter(run_ids=list(run_ids)))}
            return found if all(r.is_finished for r in found.values()) and found.keys() == run_ids else {}

        for dagster_run in wait_until(finished, "Dagster's commit runs did not finish", 180).values():
            assert dagster_run.job_name == commit_job_name(spec.pipeline())
            assert dagster_run.tags.get("dagster/sensor_name") == f"{PIPELINE}_outbox_sensor", dagster_run.tags
            assert dagster_run.status == dg.DagsterRunStatus.SUCCESS, (dagster_run.run_id, dagster_run.status)
        staging_runs = instance.get_runs(dg.RunsFilter(job_name=f"{PIPELINE}_stage_job"))
        assert not staging_runs, "the Kafka sensor was stopped: krishiv run is the only stager"

    # Everything is on S3: the tables' metadata and the staged files, under the environment's root.
    root = spec.warehouse_uri()
    assert root.startswith(f"s3://{s3.bucket}/")
    assert table.metadata_location.startswith(f"{root}/"), table.metadata_location
    staged = {f.path for e in ledger.entries() for f in e.files}
    assert staged and all(p.startswith(f"{root}/") for p in staged)
    assert staged <= s3.objects(root.removeprefix(f"s3://{s3.bucket}/")).keys(), "a staged file is not in the bucket"

    # Spark: each krishiv run was an application of the standalone master whose tasks ran in the worker's executor.
    apps = spark_cluster.applications(app_name)
    assert len(apps) == KILLS + 1, apps
    folders = started_in.read_text().split()
    for app in apps:
        assert spark_cluster.executors_of(app["id"]), f"the worker ran no executor for {app['id']}"
        assert any(Path(f).is_relative_to(spark_cluster.work_dir / app["id"]) for f in folders), (app, folders)
    phases.done("checked: verify, status, oracle, Dagster runs, S3, Spark applications")

    print(
        f"[total] {phases.total:.1f}s for {produced} orders in {stream.waves} waves, {len(all_commits)} commits "
        f"({len(by_dagster)} by Dagster runs {sorted(run_ids)}); phases: "
        + ", ".join(f"{name} {s:.1f}s" for name, s in phases.seconds.items())
    )
