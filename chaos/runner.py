"""Runs the matrix (then random scenarios until the duration is spent) and writes the report.

The matrix may run in several lanes at once (``lanes``): each scenario has its own topic, catalog, ledger and
processes, so two of them share only the broker and the cores. A scenario marked ``exclusive`` (it pauses the
shared broker, depends on a short lease, or changes the harness's working directory) runs alone, before the
others. The soak after the matrix runs one scenario at a time.
"""

from __future__ import annotations

import json
import random
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path

from chaos.checks import check_contract
from chaos.postgres import PrivatePostgres
from chaos.scenarios import FULL, MATRIX, Context, Scenario, ScenarioError, Size, fired
from chaos.workspace import Workspace, stop_all_steps
from krishiv.broker import start_broker
from spark_jobs.kafka_source import latest_offsets

#: Every named fault point of the product; a run of the whole matrix must reach each of them.
FAULT_POINTS = (
    "stage.begin",
    "stage.after_compute",
    "stage.after_files",
    "stage.after_ledger",
    "relay.before_catalog_commit",
    "relay.after_catalog_commit",
    "relay.multi_table.metadata_written",
    "relay.multi_table.pointer_swapped",
    "relay.multi_table.before_db_commit",
    "maintenance.after_rewrite",
    "maintenance.before_catalog_commit",
    "maintenance.after_catalog_commit",
    "expiry.before_commit",
    "orphans.before_delete",
)


@dataclass
class ScenarioReport:
    name: str
    index: int  # its place in the run (the folder s<index>-<name>)
    seed: int
    seconds: float
    faults_fired: list[dict]
    external_faults: list[str]
    events_checked: int
    violations: list[str]

    @property
    def faults(self) -> int:
        return len(self.faults_fired) + len(self.external_faults)


@dataclass
class ChaosReport:
    seed: int
    duration_s: float
    size: str = FULL.name
    lanes: int = 1
    seconds: float = 0.0
    scenarios: list[ScenarioReport] = field(default_factory=list)

    @property
    def violations(self) -> list[str]:
        return [f"{s.name} (seed {s.seed}): {v}" for s in self.scenarios for v in s.violations]

    def points_fired(self) -> dict[str, int]:
        counts = Counter(f["point"] for s in self.scenarios for f in s.faults_fired)
        return {p: counts.get(p, 0) for p in FAULT_POINTS}

    def summary(self) -> dict:
        return {
            "seed": self.seed,
            "size": self.size,
            "lanes": self.lanes,
            "duration_s": self.duration_s,
            "seconds": round(self.seconds, 1),
            "scenarios_run": len(self.scenarios),
            "scenario_kinds": len({s.name for s in self.scenarios}),
            "faults_injected": sum(s.faults for s in self.scenarios),
            "fault_points_fired": self.points_fired(),
            "events_checked": sum(s.events_checked for s in self.scenarios),
            "violations": len(self.violations),
        }

    def to_json(self) -> str:
        return json.dumps(
            {**self.summary(), "violation_details": self.violations, "scenarios": [asdict(s) for s in self.scenarios]},
            indent=2,
        )


def _postgres_database(pg: PrivatePostgres, name: str) -> str:
    import psycopg

    with psycopg.connect(pg.uri.replace("+psycopg", ""), autocommit=True, connect_timeout=10) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    return pg.uri.rsplit("/", 1)[0] + f"/{name}"


def run_scenario(
    scenario: Scenario,
    seed: int,
    index: int,
    folder: Path,
    broker,
    pg: PrivatePostgres | None,
    size: Size = FULL,
    keep: bool = False,
) -> ScenarioReport:
    started = time.monotonic()
    name = f"s{index:04d}"
    catalog_uri = _postgres_database(pg, name) if scenario.needs_postgres and pg else "sqlite:///catalog.db"
    ws = Workspace(
        folder / f"{name}-{scenario.name}",
        broker.bootstrap,
        f"chaos-{name}-{uuid.uuid4().hex[:8]}",
        catalog_uri,
        max_records=scenario.max_records or size.max_records,
        spacing_ms=size.spacing_ms,
        env=size.env(),
    )
    ctx = Context(ws, random.Random(seed), broker, size)
    if scenario.needs_postgres and pg:
        ctx.catalog_pause, ctx.catalog_resume = pg.pause, pg.resume
    violations: list[str] = []
    events = 0
    try:
        scenario.run(ctx)
    except ScenarioError as exc:
        violations.append(str(exc))
    except Exception as exc:  # the harness must report, not stop, whatever a scenario hits
        violations.append(f"scenario failed: {exc!r}")
    try:
        check = check_contract(ws.spec, latest_offsets(broker.bootstrap, ws.topic), ctx.earlier_topics)
        violations += check.violations
        events = check.events_checked
    except Exception as exc:
        violations.append(f"the contract could not be checked: {exc!r}")
    faults = fired(ws)
    reached = {f["point"] for f in faults}
    violations += [f"fault point {p} was never reached" for p in scenario.reaches(size) if p not in reached]
    if not violations and not keep:
        shutil.rmtree(ws.folder, ignore_errors=True)  # kept only when something is wrong, for the post-mortem
    return ScenarioReport(
        scenario.name,
        index,
        seed,
        round(time.monotonic() - started, 1),
        faults,
        ctx.external_faults,
        events,
        violations,
    )


#: One scenario to run: its index in the run, the scenario and its seed.
Job = tuple[int, Scenario, int]


def _run_in_lanes(jobs: list[Job], lanes: int, run: Callable[[Job], ScenarioReport], record) -> None:
    """Run ``jobs``: the exclusive ones alone, first; then the others ``lanes`` at a time, the long ones first (so
    no lane is left with one at the end while the others idle). ``record`` gets each
    report in this (the calling) thread, as the scenarios finish. Interrupted, it stops every running step."""
    alone = [j for j in jobs if j[1].exclusive or lanes <= 1]
    for job in alone:
        record(run(job))
    rest = sorted((j for j in jobs if j not in alone), key=lambda j: not j[1].long)  # stable: the long ones first
    if not rest:
        return
    with ThreadPoolExecutor(lanes, thread_name_prefix="chaos-lane") as pool:
        running: set[Future[ScenarioReport]] = set()
        try:
            while rest or running:
                while rest and len(running) < lanes:
                    running.add(pool.submit(run, rest.pop(0)))
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    record(future.result())
        except BaseException:  # Ctrl-C or SIGTERM: no lane may go on starting steps
            stop_all_steps()
            raise


def run_chaos(
    seed: int,
    duration_s: float,
    folder: Path,
    only: list[str] | None = None,
    on_scenario=None,
    report_path: Path | None = None,
    size: Size = FULL,
    keep: bool = False,
    lanes: int = 1,
) -> ChaosReport:
    """The whole matrix once (or the ``only`` scenarios), ``lanes`` scenarios at a time, then random scenarios one
    at a time until ``duration_s`` is spent, each scenario at ``size``; with ``keep``, every scenario's folder stays
    (else only failed ones).

    With ``report_path``, the report is rewritten after every scenario, so a long soak that is stopped
    still leaves its figures.
    """
    selected = [s for s in MATRIX if not only or s.name in only]
    unknown = set(only or ()) - {s.name for s in MATRIX}
    if unknown:
        raise ValueError(f"unknown scenarios {sorted(unknown)}; have {[s.name for s in MATRIX]}")
    if lanes < 1:
        raise ValueError(f"lanes must be at least 1, got {lanes}")
    rng = random.Random(seed)
    report = ChaosReport(seed, duration_s, size.name, lanes)
    started = time.monotonic()
    # A folder of this run's own: nothing left by an earlier run (or its stray processes) can leak in.
    folder = folder / time.strftime(f"run-%Y%m%d-%H%M%S-seed{seed}-{size.name}")
    folder.mkdir(parents=True)

    def record(result: ScenarioReport) -> None:
        report.scenarios.append(result)
        report.scenarios.sort(key=lambda r: r.index)
        report.seconds = time.monotonic() - started
        if report_path:
            report_path.parent.mkdir(parents=True, exist_ok=True)
            report_path.write_text(report.to_json() + "\n")
        if on_scenario:
            on_scenario(result)

    pg = PrivatePostgres().start() if any(s.needs_postgres for s in selected) else None
    try:
        with start_broker(log_path=folder / "broker.log") as broker:

            def run(job: Job) -> ScenarioReport:
                index, scenario, scenario_seed = job
                return run_scenario(scenario, scenario_seed, index, folder, broker, pg, size, keep)

            matrix = [(index, scenario, rng.randrange(1 << 30)) for index, scenario in enumerate(selected)]
            _run_in_lanes(matrix, lanes, run, record)
            while time.monotonic() - started < duration_s:
                scenario = rng.choices(selected, [s.weight for s in selected])[0]
                record(run((len(report.scenarios), scenario, rng.randrange(1 << 30))))
    finally:
        if pg:
            pg.stop()
    report.seconds = time.monotonic() - started
    if report_path:
        report_path.write_text(report.to_json() + "\n")
    return report
