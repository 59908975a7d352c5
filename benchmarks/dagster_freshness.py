"""Freshness under Dagster's sensors alone: an event produced -> visible in the table, with nobody running
``krishiv run``.

A real Dagster instance in a folder of its own (the repository's ``dagster.yaml``, its relative storage folders
made absolute so this process can read the runs back) runs ``dagster-daemon run`` over the code location
``krishiv_assets.definitions`` with a spec written beside it. A producer writes orders at a fixed rate with event
time = now, one in a hundred malformed: a malformed event is a row of the rejects table as soon as its batch is
committed, so each one measures one event's way into a table. A poller reads the rejects table every 250 ms.

The first events pay for everything cold (the Kafka sensor's first tick, a run process, Spark's start); the
figures are for events produced ``warmup_s`` after the first reject is visible (``cold_start_s`` is that first
wait), once the backlog of the cold start has drained. Then
each measured event's way is split into segments, from the Dagster runs (request, start, log lines, end) and
the ledger (when its batch was staged and committed):

- ``sensor_tick``: produced -> the staging run that staged it was requested (when no staging run was running);
- ``run_launch``: that run requested -> its process started;
- ``spark_start``: run started -> its query started (resources, Spark session, query start);
- ``to_staged``: (produced, or the query started if later) -> its batch recorded in the ledger;
- ``commit_request``/``commit_launch``/``commit``: staged -> a commit run requested -> started -> batch committed,
  when a sensor-requested commit run committed it; ``in_run_commit``: staged -> committed when the staging run
  committed it itself;
- ``poll``: committed -> seen by the poller.

``python -m benchmarks.dagster_freshness`` starts its own broker and prints the result as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.freshness import RateProducer

#: The repository root, whose dagster.yaml and workspace.yaml the instance runs.
REPOSITORY = Path(__file__).resolve().parents[1]
PIPELINE = "orders_per_second"
POLL_S = 0.25
#: The staging run's log line when its query has started (krishiv_assets.staging_run); a run without it counts
#: from its start.
QUERY_STARTED = "started; waiting for its first batch"
#: How the staging asset is told how long to linger (krishiv_assets.staging_run.LINGER_ENV).
LINGER_ENV = "KRISHIV_STAGING_LINGER_S"

SPEC_TEMPLATE = """
[kafka]
bootstrap_servers = "{bootstrap}"
partitions = {partitions}

[iceberg]
catalog_uri = "sqlite:///{folder}/catalog.db"
warehouse = "{folder}/warehouse"
namespace = "krishiv"

[storage]
ledger_path = "{folder}/ledger.duckdb"
checkpoint_location = "{folder}/checkpoints"

[spark]
master = "local[2]"
shuffle_partitions = 2

[[pipelines]]
name = "{pipeline}"
topic = "{topic}"
table = "{pipeline}"
event_time_field = "event_time"
watermark_delay = "1s"
window = "1s"
trigger_interval = "1s"
max_records_per_batch = 50000

[pipelines.fields]
order_id = "string"
customer_id = "string"
amount = "decimal(12,2)"
event_time = "timestamp_ms"

[[pipelines.aggregations]]
name = "order_count"
function = "count"
"""

SEGMENTS = (
    "sensor_tick",
    "run_launch",
    "spark_start",
    "to_staged",
    "commit_request",
    "commit_launch",
    "commit",
    "in_run_commit",
    "poll",
)


@dataclass
class DagsterFreshnessResult:
    """What one measurement saw; every field is plain JSON."""

    rate: float
    seconds: float
    linger_s: float | None  # the staging asset's linger (None: its default)
    warmup_s: float = 0.0  # after the first reject was visible, before measuring
    cold_start_s: float = 0.0  # the first event produced -> the first reject visible
    latencies_s: list[float] = field(default_factory=list)  # per measured reject: produced -> visible
    unseen: int = 0
    staging_runs: int = 0
    commit_runs: int = 0
    #: Per segment (``SEGMENTS``): its median over the measured events it applies to, and how many those are.
    breakdown_s: dict[str, float] = field(default_factory=dict)
    breakdown_events: dict[str, int] = field(default_factory=dict)
    #: Per sensor-requested commit run: requested -> its step started (the relay starts right after).
    commit_run_start_s: list[float] = field(default_factory=list)
    #: Per staging run: requested -> ended.
    staging_run_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: The machine's 1-minute load average when measuring began and ended (2 cores: above 2 is contention).
    load_average: list[float] = field(default_factory=list)

    @property
    def p50_s(self) -> float:
        return _quantile(self.latencies_s, 0.5)

    @property
    def p99_s(self) -> float:
        return _quantile(self.latencies_s, 0.99)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["latencies_s"] = [round(v, 3) for v in self.latencies_s]
        doc.update(
            events=len(self.latencies_s),
            p50_s=_rounded(self.p50_s),
            p99_s=_rounded(self.p99_s),
            commit_run_start_p50_s=_rounded(_quantile(self.commit_run_start_s, 0.5)),
            target_p50_s=15.0,
        )
        return doc


def _rounded(value: float) -> float | None:
    """``value`` to 10 ms, or None (JSON has no NaN) when there was nothing to measure."""
    return None if value != value else round(value, 2)


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def write_instance(folder: Path, bootstrap: str, topic: str, partitions: int) -> Path:
    """The spec, the repository's workspace.yaml and its dagster.yaml (storage folders under ``folder``) in
    ``folder``; returns the spec file."""
    folder.mkdir(parents=True, exist_ok=True)
    spec_file = folder / "krishiv.toml"
    spec_file.write_text(
        SPEC_TEMPLATE.format(bootstrap=bootstrap, partitions=partitions, folder=folder, pipeline=PIPELINE, topic=topic)
    )
    shutil.copy(REPOSITORY / "workspace.yaml", folder / "workspace.yaml")
    settings = (REPOSITORY / "dagster.yaml").read_text()
    if "base_dir: state/dagster" not in settings:
        raise RuntimeError(f"{REPOSITORY / 'dagster.yaml'} no longer keeps its storage in state/dagster")
    (folder / "dagster.yaml").write_text(
        settings.replace("base_dir: state/dagster", f"base_dir: {folder}/state/dagster")
    )
    return spec_file


@contextmanager
def dagster_daemon(folder: Path, spec_file: Path, extra_env: dict[str, str]) -> Iterator[subprocess.Popen]:
    """``dagster-daemon run`` over the code location, in a session of its own (daemon, code server and run workers
    stop together), its output in ``folder/dagster.log``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KRISHIV_", "DAGSTER_"))}
    env.update(DAGSTER_HOME=str(folder), KRISHIV_SPEC=str(spec_file), **extra_env)
    with (folder / "dagster.log").open("a") as log:
        daemon = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", "workspace.yaml"],
            cwd=folder,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            yield daemon
        finally:
            _stop_group(daemon)


def _stop_group(process: subprocess.Popen, timeout_s: float = 60.0) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def measure_dagster_freshness(
    bootstrap: str,
    folder: Path,
    *,
    rate: float = 200.0,
    seconds: float = 90.0,
    partitions: int = 4,
    linger_s: float | None = None,
    warmup_s: float = 30.0,
    cold_timeout_s: float = 600.0,
    drain_timeout_s: float = 240.0,
    say: Callable[[str], None] = lambda _line: None,
) -> DagsterFreshnessResult:
    """Start the instance in ``folder`` (new or empty) on the broker at ``bootstrap``, produce ``rate`` orders/s,
    measure the rejects produced during ``seconds`` after the first is visible, stop everything, then read the
    runs and the ledger back for the breakdown. ``linger_s`` is given to the staging asset (``LINGER_ENV``)."""
    from krishiv.produce import ensure_topic

    folder = folder.resolve()
    topic = f"orders-live-{int(time.time())}"
    spec_file = write_instance(folder, bootstrap, topic, partitions)
    partitions = ensure_topic(bootstrap, topic, partitions)
    poller = _RejectsPoller(spec_file)  # reads the spec: a wrong one fails before anything starts
    result = DagsterFreshnessResult(rate, seconds, linger_s, warmup_s)
    extra_env = {} if linger_s is None else {LINGER_ENV: f"{linger_s:g}"}
    seen: dict[int, tuple[float, int]] = {}  # seq -> (seen at, batch id)
    measured: dict[int, float] = {}  # seq -> produced at, of the rejects measured
    with dagster_daemon(folder, spec_file, extra_env) as daemon:
        say(f"dagster-daemon started in {folder}; producing {rate:g} orders/s")
        producer = RateProducer(bootstrap, topic, partitions, rate)
        producer.start()
        try:
            deadline = time.time() + cold_timeout_s
            while not seen:
                _check_alive(daemon, producer, deadline, "the first reject to be visible")
                poller.poll(seen)
                time.sleep(POLL_S)
            result.cold_start_s = min(t for t, _ in seen.values()) - producer.started
            say(
                f"first reject visible after {result.cold_start_s:.1f}s; {warmup_s:g}s more, then {seconds:g}s measured"
            )
            measure_from = time.time() + warmup_s  # the backlog of the cold start drains first
            while time.time() < measure_from:
                _check_alive(daemon, producer, measure_from + 1, "the warm-up")
                poller.poll(seen)
                time.sleep(POLL_S)
            result.load_average.append(round(os.getloadavg()[0], 1))
            measure_until = measure_from + seconds
            deadline = measure_until + drain_timeout_s
            while True:
                poller.poll(seen)
                measured = {s: t for s, t in list(producer.rejects.items()) if measure_from <= t < measure_until}
                if time.time() > measure_until and all(s in seen for s in measured):
                    break
                if time.time() > deadline:
                    break
                _check_alive(daemon, producer, deadline + 1, "the measured rejects")
                time.sleep(POLL_S)
        finally:
            result.load_average.append(round(os.getloadavg()[0], 1))
            producer.stop.set()
            producer.join(30)
    for seq, produced in sorted(measured.items()):
        if seq in seen:
            result.latencies_s.append(seen[seq][0] - produced)
        else:
            result.unseen += 1
    _breakdown(result, folder, spec_file, measured, seen)
    say(f"p50 {result.p50_s:.2f}s, p99 {result.p99_s:.2f}s over {len(result.latencies_s)} events")
    return result


def _check_alive(daemon: subprocess.Popen, producer: RateProducer, deadline: float, what: str) -> None:
    if producer.error is not None:
        raise producer.error
    if daemon.poll() is not None:
        raise RuntimeError(f"dagster-daemon exited ({daemon.returncode}) while waiting for {what}; see dagster.log")
    if time.time() > deadline:
        raise TimeoutError(f"timed out waiting for {what}; see dagster.log")


class _RejectsPoller:
    """Reads the rejects table's new snapshots: each malformed order's sequence number and batch id."""

    def __init__(self, spec_file: Path) -> None:
        from krishiv_core.catalog import load_catalog, qualified
        from krishiv_core.spec import load_spec

        self.spec = load_spec(spec_file, env={})
        self.catalog = load_catalog(self.spec)
        self.name = qualified(self.spec, self.spec.pipeline().rejects_table)
        self.table = None
        self.snapshot_id: int | None = None

    def poll(self, seen: dict[int, tuple[float, int]]) -> None:
        from pyiceberg.exceptions import NoSuchTableError

        if self.table is None:
            try:
                self.table = self.catalog.load_table(self.name)
            except NoSuchTableError:
                return  # the first staging run makes it
        self.table = self.table.refresh()
        current = self.table.current_snapshot()
        if current is None or current.snapshot_id == self.snapshot_id:
            return
        now = time.time()
        self.snapshot_id = current.snapshot_id
        rows = self.table.scan(selected_fields=("value", "batch_id")).to_arrow()
        for value, batch in zip(rows.column("value").to_pylist(), rows.column("batch_id").to_pylist(), strict=True):
            seq = int(json.loads(value)["order_id"].removeprefix("bad-"))
            seen.setdefault(seq, (now, int(batch)))


@dataclass(frozen=True)
class _Run:
    job: str
    requested: float
    started: float | None
    ended: float | None
    step_started: float | None
    query_started: float | None

    def covers(self, moment: float) -> bool:
        return self.started is not None and self.started <= moment <= (self.ended or float("inf"))


def _runs(folder: Path) -> list[_Run]:
    """Every run of the instance, with its step's start and the staging query's start from the event log."""
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(folder))
    try:
        runs = []
        for record in instance.get_run_records():
            run = record.dagster_run
            step_started = query_started = None
            for entry in instance.all_logs(run.run_id):
                if (
                    step_started is None
                    and entry.dagster_event
                    and entry.dagster_event.event_type_value == "STEP_START"
                ):
                    step_started = entry.timestamp
                if query_started is None and QUERY_STARTED in (entry.user_message or ""):
                    query_started = entry.timestamp
            runs.append(
                _Run(
                    run.job_name,
                    record.create_timestamp.timestamp(),
                    record.start_time,
                    record.end_time,
                    step_started,
                    query_started,
                )
            )
        return runs
    finally:
        instance.dispose()


def _breakdown(
    result: DagsterFreshnessResult,
    folder: Path,
    spec_file: Path,
    measured: dict[int, float],
    seen: dict[int, tuple[float, int]],
) -> None:
    from krishiv.operations import open_ledger
    from krishiv_core.catalog import qualified
    from krishiv_core.spec import load_spec

    spec = load_spec(spec_file, env={})
    entries = {e.batch_id: e for e in open_ledger(spec).entries(table=qualified(spec, spec.pipeline().rejects_table))}
    runs = _runs(folder)
    stage = sorted((r for r in runs if r.job.endswith("_stage_job")), key=lambda r: r.requested)
    commit = sorted((r for r in runs if r.job.endswith("_commit_job")), key=lambda r: r.requested)
    result.staging_runs, result.commit_runs = len(stage), len(commit)
    result.staging_run_s = [round(r.ended - r.requested, 2) for r in stage if r.ended]
    result.commit_run_start_s = [round(r.step_started - r.requested, 2) for r in commit if r.step_started]
    segments: dict[str, list[float]] = {name: [] for name in SEGMENTS}
    for seq, produced in measured.items():
        if seq not in seen:
            continue
        visible, batch = seen[seq]
        entry = entries.get(batch)
        if entry is None or entry.committed_at is None:
            result.errors.append(f"reject {seq}: batch {batch} has no committed entry in the ledger")
            continue
        staged, committed = _seconds(entry.created_at), _seconds(entry.committed_at)
        stager = next((r for r in stage if r.covers(staged)), None)
        from_ = produced
        if stager is not None and stager.requested > produced:  # no staging run was running: it was requested
            segments["sensor_tick"].append(stager.requested - produced)
            segments["run_launch"].append((stager.started or stager.requested) - stager.requested)
            ready = stager.query_started or stager.started or stager.requested
            segments["spark_start"].append(ready - (stager.started or stager.requested))
            from_ = ready
        segments["to_staged"].append(max(0.0, staged - from_))
        committer = next((r for r in commit if r.covers(committed) and r.requested >= staged - 1.0), None)
        if committer is not None:
            segments["commit_request"].append(max(0.0, committer.requested - staged))
            segments["commit_launch"].append((committer.started or committer.requested) - committer.requested)
            segments["commit"].append(committed - max(committer.started or committer.requested, staged))
        elif stager is not None and stager.covers(committed):
            segments["in_run_commit"].append(committed - staged)
        segments["poll"].append(max(0.0, visible - committed))
    result.breakdown_s = {k: round(statistics.median(v), 2) for k, v in segments.items() if v}
    result.breakdown_events = {k: len(v) for k, v in segments.items() if v}


def _seconds(moment: datetime) -> float:
    return moment.timestamp()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dagster_freshness", description=__doc__)
    parser.add_argument("--rate", type=float, default=200.0, help="orders/s (one in 100 malformed)")
    parser.add_argument("--seconds", type=float, default=90.0, help="how long events are measured")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds after the first reject is visible")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--linger", type=float, default=None, help=f"seconds, given as {LINGER_ENV} (default: unset)")
    parser.add_argument("--out", default="state/bench-dagster", help="work folder (emptied first) and result.json")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the daemon's process group and the broker are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    from krishiv.broker import start_broker
    from krishiv.state_folder import BENCH_MARKER, reset_folder
    from krishiv_core.errors import KrishivError

    out = Path(args.out).resolve()
    try:  # emptied first, and only if it is new, empty or an earlier bench's folder
        reset_folder(out, BENCH_MARKER, command="python -m benchmarks.dagster_freshness", label=f"--out {args.out}")
    except KrishivError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    with start_broker(log_path=out / "broker.log") as broker:
        result = measure_dagster_freshness(
            broker.bootstrap,
            out / "work",
            rate=args.rate,
            seconds=args.seconds,
            partitions=args.partitions,
            linger_s=args.linger,
            warmup_s=args.warmup,
            say=lambda line: print(f"{time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True),
        )
    doc = result.to_json()
    (out / "result.json").write_text(json.dumps(doc, indent=2) + "\n")
    shown = {k: v for k, v in doc.items() if k != "latencies_s"}
    print(json.dumps(shown, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
