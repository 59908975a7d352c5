"""The crash-point matrix: each scenario runs the real pipeline as processes and injects its faults.

Every scenario produces seeded orders (late and malformed ones mixed in), drives ``krishiv run --once``
and ``krishiv commit`` as separate processes with faults armed at named points, or acts on the processes
and files around them (broker and catalog paused, ledger held, checkpoint rewound or restored from an old
copy, snapshots expired), then finishes the pipeline cleanly so the contract can be checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from krishiv.broker import LocalBroker
from krishiv.catalog import load_catalog, qualified
from krishiv.chaos.workspace import Workspace
from krishiv.operations import LEDGER_LOCK_TIMEOUT_ENV
from outbox.ledger import PENDING
from spark_jobs.checkpoint import Checkpoint

KILLED = -signal.SIGKILL
FAILED = 2  # a Krishiv error, reported by the command
ATTEMPTS = 5
STEP_TIMEOUT_S = 600.0
PAUSE_S = 3.0


class ScenarioError(RuntimeError):
    """A step did not behave as the scenario expects (this is a violation too)."""


@dataclass
class Context:
    ws: Workspace
    rng: random.Random
    broker: LocalBroker
    catalog_pause: Callable[[], object] | None = None
    catalog_resume: Callable[[], object] | None = None
    external_faults: list[str] = field(default_factory=list)

    # ----------------------------------------------------------------------------------- steps

    def produce(self, records: int = 3_000) -> None:
        self.ws.produce(records, seed=self.rng.randrange(1 << 30), late=records // 200, malformed=records // 400)

    def stage(self, faults: str | None = None, expect: int | None = 0, env: dict[str, str] | None = None) -> int:
        return self._step(("run", "--once"), faults, expect, env)

    def commit(self, faults: str | None = None, expect: int | None = 0, env: dict[str, str] | None = None) -> int:
        return self._step(("commit",), faults, expect, env)

    def _step(self, args: tuple[str, ...], faults: str | None, expect: int | None, env: dict[str, str] | None) -> int:
        rc = self.ws.run(*args, faults=faults, env=env, timeout_s=STEP_TIMEOUT_S)
        if expect is not None and rc != expect:
            raise ScenarioError(f"`krishiv {' '.join(args)}` with faults {faults!r} exited {rc}, expected {expect}")
        return rc

    def finish(self) -> None:
        """Stage and commit until both succeed (a fault may have left a step to redo)."""
        for step in (self.stage, self.commit):
            for attempt in range(ATTEMPTS):
                if step(expect=None) == 0:
                    break
                if attempt == ATTEMPTS - 1:
                    raise ScenarioError(f"{step.__name__} kept failing after the faults; see commands.log")

    def batches_with_rows(self) -> list[int]:
        """Pending batch ids whose entries publish rows, so the relay's fault points are reached for them."""
        return sorted({e.batch_id for e in self.ws.ledger().entries(status=PENDING) if e.record_count})

    def batch_with_rows(self, *, first: bool = False, last: bool = False) -> int:
        candidates = self.batches_with_rows()
        if not candidates:
            raise ScenarioError("no pending batch has rows")
        return candidates[0] if first else candidates[-1] if last else self.rng.choice(candidates)

    def wait_reached(self, point: str, batch: int, process: subprocess.Popen, timeout_s: float = 300) -> None:
        marker = self.ws.sync_dir / f"{point}@{batch}.reached"
        deadline = time.monotonic() + timeout_s
        while not marker.exists():
            if process.poll() is not None:
                raise ScenarioError(f"the process exited ({process.returncode}) before reaching {point}@{batch}")
            if time.monotonic() > deadline:
                raise ScenarioError(f"{point}@{batch} was not reached within {timeout_s:.0f}s")
            time.sleep(0.05)

    def release(self, point: str, batch: int) -> None:
        (self.ws.sync_dir / f"{point}@{batch}.go").write_text("go")

    def checkpoint(self) -> Path:
        return self.ws.spec.checkpoint_dir(self.ws.spec.pipeline())

    def rewind(self, batches: int) -> None:
        """Forget the last ``batches`` batches' offsets and commits (with their checksum files)."""
        last = Checkpoint(self.checkpoint()).rewind(batches)
        self.external_faults.append(f"checkpoint rewound by {batches} batches from {last}")


# --------------------------------------------------------------------------------------- scenarios


STAGE_POINTS = ("stage.begin", "stage.after_compute", "stage.after_files", "stage.after_ledger")


def driver_killed_at_every_step(ctx: Context) -> None:
    """SIGKILL the Spark driver before, during and after staging a batch, and between the ledger write and
    Spark's commit log, one run per step, for two batches; each restart replays the batch. The steps before
    the ledger write come in a random order; the last kill is after it (a recorded batch is not restaged)."""
    ctx.produce()
    *before_ledger, after_ledger = STAGE_POINTS
    for batch in (1, 2):
        for point in [*ctx.rng.sample(before_ledger, len(before_ledger)), after_ledger]:
            ctx.stage(faults=f"{point}@{batch}", expect=KILLED)
    ctx.finish()


def relay_faults_at_every_step(ctx: Context) -> None:
    """In the first commit run: a catalog commit that raises after succeeding, one that times out before
    committing and one after, then SIGKILL before a catalog commit. Then, batch after batch, SIGKILL after
    the catalog commit (before the ledger update) and before the next batch's catalog commit."""
    ctx.produce(10_000)
    ctx.stage()
    batches = ctx.batches_with_rows()
    if len(batches) < 4:
        raise ScenarioError(f"expected at least 4 batches with rows, staged {batches}")
    ctx.commit(
        faults=f"relay.after_catalog_commit@{batches[0]}:raise,relay.before_catalog_commit@{batches[1]}:timeout,"
        f"relay.after_catalog_commit@{batches[2]}:timeout,relay.before_catalog_commit@{batches[3]}",
        expect=KILLED,
    )
    for position, batch in enumerate(batches[3:]):
        if position:
            ctx.commit(faults=f"relay.before_catalog_commit@{batch}", expect=KILLED)
        ctx.commit(faults=f"relay.after_catalog_commit@{batch}", expect=KILLED)
    ctx.finish()


def concurrent_writer(ctx: Context) -> None:
    """Another relay commits the same batches between this relay's check and its commit."""
    ctx.produce()
    ctx.stage()
    batch = ctx.batch_with_rows()
    point = "relay.before_catalog_commit"
    slow = ctx.ws.start("commit", faults=f"{point}@{batch}:pause")
    try:
        ctx.wait_reached(point, batch, slow)
        ctx.commit()  # the concurrent writer: a whole second relay run
        ctx.external_faults.append(f"a second relay committed while the first was between check and commit of {batch}")
    finally:
        ctx.release(point, batch)
    if slow.wait(timeout=STEP_TIMEOUT_S) != 0:
        raise ScenarioError(f"the paused relay exited {slow.returncode} after losing the race")
    ctx.finish()


HOLD_LEDGER = (
    "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); con.execute('BEGIN TRANSACTION');"
    "print('held', flush=True); time.sleep(float(sys.argv[2]))"
)


def ledger_held(ctx: Context) -> None:
    """Another process holds the ledger longer than the retry budget: both steps fail cleanly, then recover."""
    ctx.produce()
    ctx.stage()
    path = ctx.ws.spec.resolve(ctx.ws.spec.storage.ledger_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LEDGER, str(path), "60"], stdout=subprocess.PIPE, text=True)
    try:
        if holder.stdout is None or holder.stdout.readline().strip() != "held":
            raise ScenarioError("the ledger holder did not start")
        short = {LEDGER_LOCK_TIMEOUT_ENV: "1.5"}
        ctx.produce(1_000)
        ctx.stage(expect=FAILED, env=short)
        ctx.commit(expect=FAILED, env=short)
        ctx.external_faults += [
            "ledger held past the budget during staging",
            "ledger held past the budget during commit",
        ]
    finally:
        holder.kill()
        holder.wait()
    ctx.finish()
    log = (ctx.ws.folder / "commands.log").read_text()
    if log.count(f"ledger {path} stayed locked by another process") < 2:
        raise ScenarioError("the busy ledger was not reported, with its path, by both steps")


def broker_paused(ctx: Context) -> None:
    """SIGSTOP the broker while a batch is being staged, SIGCONT it a few seconds later."""
    ctx.produce()
    batch, point = ctx.rng.randint(1, 2), "stage.begin"
    staging = ctx.ws.start("run", "--once", faults=f"{point}@{batch}:pause")
    try:
        ctx.wait_reached(point, batch, staging)
        ctx.broker.process.send_signal(signal.SIGSTOP)
        ctx.release(point, batch)
        time.sleep(PAUSE_S)
    finally:
        ctx.broker.process.send_signal(signal.SIGCONT)
    ctx.external_faults.append(f"broker paused {PAUSE_S:.0f}s during batch {batch}")
    staging.wait(timeout=STEP_TIMEOUT_S)
    ctx.finish()


def catalog_paused(ctx: Context) -> None:
    """SIGSTOP the (private PostgreSQL) catalog between the relay's check and its commit."""
    if ctx.catalog_pause is None or ctx.catalog_resume is None:
        raise ScenarioError("catalog-paused needs the private PostgreSQL catalog")
    ctx.produce()
    ctx.stage()
    batch, point = ctx.batch_with_rows(), "relay.before_catalog_commit"
    relay = ctx.ws.start("commit", faults=f"{point}@{batch}:pause")
    try:
        ctx.wait_reached(point, batch, relay)
        ctx.catalog_pause()
        ctx.release(point, batch)
        time.sleep(PAUSE_S)
    finally:
        ctx.catalog_resume()
    ctx.external_faults.append(f"catalog paused {PAUSE_S:.0f}s during the commit of batch {batch}")
    relay.wait(timeout=STEP_TIMEOUT_S)
    ctx.finish()


DAGSTER_RECOVERY_TIMEOUT_S = 300.0


def _stop_group(process: subprocess.Popen, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _commit_runs(ctx: Context) -> dict[str, str]:
    """The workspace's commit runs by id, with their status, read from its Dagster instance."""
    import dagster as dg

    from krishiv_assets.definitions import commit_job_name

    with contextlib.chdir(ctx.ws.folder), dg.DagsterInstance.from_config(str(ctx.ws.folder)) as instance:
        records = instance.get_run_records(dg.RunsFilter(job_name=commit_job_name(ctx.ws.spec.pipeline())))
        return {r.dagster_run.run_id: r.dagster_run.status.value for r in records}


def dagster_killed_mid_commit(ctx: Context) -> None:
    """SIGKILL the Dagster daemon's whole process group (daemon, code server and the sensor's commit run, paused
    between the relay's check and its catalog commit), as a crashed host would. A restarted daemon must fail
    the dead run (run monitoring asks the run launcher whether its worker lives), which frees the commit pool,
    and the outbox sensor must request the pending batches again and get them committed."""
    ctx.produce()
    ctx.stage()
    batch, point = ctx.batch_with_rows(), "relay.before_catalog_commit"
    daemon = ctx.ws.start_dagster(faults=f"{point}@{batch}:pause")
    try:
        ctx.wait_reached(point, batch, daemon)
    finally:
        _stop_group(daemon, signal.SIGKILL)
    ctx.external_faults.append(f"dagster daemon, code server and commit run SIGKILLed before the commit of {batch}")
    (dead,) = _commit_runs(ctx)
    daemon = ctx.ws.start_dagster()
    try:
        deadline = time.monotonic() + DAGSTER_RECOVERY_TIMEOUT_S
        while ctx.ws.ledger().entries(status=PENDING) or _commit_runs(ctx)[dead] != "FAILURE":
            if daemon.poll() is not None:
                raise ScenarioError(f"the restarted dagster daemon exited ({daemon.returncode}); see dagster.log")
            if time.monotonic() > deadline:
                raise ScenarioError(
                    f"{DAGSTER_RECOVERY_TIMEOUT_S:.0f}s after the restart, commit runs {_commit_runs(ctx)} and"
                    f" {len(ctx.ws.ledger().entries(status=PENDING))} entries still pending; see dagster.log"
                )
            time.sleep(1)
    finally:
        _stop_group(daemon, signal.SIGTERM)
    ctx.finish()


def checkpoint_rewound(ctx: Context) -> None:
    ctx.produce()
    ctx.stage()
    ctx.commit()
    ctx.rewind(ctx.rng.randint(1, 2))
    ctx.produce(1_500)
    ctx.finish()


def old_checkpoint_restored(ctx: Context) -> None:
    """Restart from a copy of the checkpoint taken before more data was staged and committed."""
    ctx.produce()
    ctx.stage()
    copy = ctx.ws.folder / "checkpoint-copy"
    shutil.copytree(ctx.checkpoint(), copy)
    ctx.produce(2_000)
    ctx.stage()
    ctx.commit()
    shutil.rmtree(ctx.checkpoint())
    shutil.copytree(copy, ctx.checkpoint())
    ctx.external_faults.append("restart from an old copy of the checkpoint")
    ctx.produce(1_000)
    ctx.finish()


def snapshots_expired(ctx: Context) -> None:
    """The relay dies after a commit; all snapshots but the current one expire; then everything restarts."""
    ctx.produce()
    ctx.stage()
    ctx.commit(faults=f"relay.after_catalog_commit@{ctx.batch_with_rows(last=True)}", expect=KILLED)
    catalog = load_catalog(ctx.ws.spec)
    pipeline = ctx.ws.spec.pipeline()
    for name in (pipeline.table, pipeline.rejects_table):
        table = catalog.load_table(qualified(ctx.ws.spec, name))
        current = table.current_snapshot()
        old = [s.snapshot_id for s in table.snapshots() if current is None or s.snapshot_id != current.snapshot_id]
        if old:
            table.maintenance.expire_snapshots().by_ids(old).commit()
    ctx.external_faults.append("snapshots expired, keeping the current one")
    ctx.rewind(1)
    ctx.produce(1_500)
    ctx.finish()


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[Context], None]
    points: tuple[str, ...] = ()  # the fault points it must reach
    needs_postgres: bool = False
    weight: int = 1  # how often the soak picks it (fault-dense scenarios more often)


MATRIX: tuple[Scenario, ...] = (
    Scenario("driver-killed-at-every-step", driver_killed_at_every_step, STAGE_POINTS, weight=2),
    Scenario(
        "relay-faults-at-every-step",
        relay_faults_at_every_step,
        ("relay.before_catalog_commit", "relay.after_catalog_commit"),
        weight=4,
    ),
    Scenario("concurrent-writer-between-check-and-commit", concurrent_writer, ("relay.before_catalog_commit",)),
    Scenario("ledger-held-past-the-retry-budget", ledger_held),
    Scenario("broker-paused-mid-batch", broker_paused, ("stage.begin",)),
    Scenario("catalog-paused-mid-commit", catalog_paused, ("relay.before_catalog_commit",), needs_postgres=True),
    Scenario("checkpoint-rewound", checkpoint_rewound),
    Scenario("restart-from-an-old-checkpoint-copy", old_checkpoint_restored),
    Scenario("snapshots-expired-before-a-restart", snapshots_expired, ("relay.after_catalog_commit",)),
    Scenario("dagster-killed-mid-commit", dagster_killed_mid_commit, ("relay.before_catalog_commit",)),
)


def fired(ws: Workspace) -> list[dict]:
    """The fault points that fired in the workspace's processes, from their log."""
    if not ws.faults_log.exists():
        return []
    return [json.loads(line) for line in ws.faults_log.read_text().splitlines() if line.strip()]
