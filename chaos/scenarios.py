"""The crash-point matrix: each scenario runs the real pipeline as processes and injects its faults.

Every scenario produces seeded orders (late and malformed ones mixed in), drives ``krishiv run --once``
and ``krishiv commit`` (or a continuous ``krishiv run``, which commits its own batches, and the maintenance
commands ``compact``, ``expire-snapshots``, ``remove-orphans`` and ``maintain``) as separate processes with
faults armed at named points, or acts on the processes and files around them (broker and catalog paused, ledger
held, checkpoint rewound or restored from an old copy, snapshots expired, a topic re-created, a ledger restored
from a backup, standard orphan-file removal, a stager paused past its lease), then finishes the pipeline
cleanly so the contract can be checked.

A :class:`Size` says how much each scenario does: ``full`` (the default, for soaks) or ``ci`` (fewer events,
batches and repeated kills, every fault point and every scenario kind still reached; ``make test`` runs it).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.table import Table

from chaos.cut_reader import CutReader, half_committed
from chaos.oracle import Records, read_topic
from chaos.workspace import Workspace
from krishiv.broker import LocalBroker
from krishiv.lineage import LineageRow, lineage
from krishiv.operations import LEDGER_LOCK_TIMEOUT_ENV, STAGER_LEASE_TTL_ENV
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.entries import COMMITTED, PENDING
from krishiv_core.spec import WINDOWED, PipelineSpec, load_spec
from outbox.compaction import COMPACTION
from outbox.errors import LedgerBusyError
from outbox.ledger import Ledger
from outbox.orphans import list_files
from outbox.relay import SUMMARY_SKIPPED
from spark_jobs.checkpoint import Checkpoint
from spark_jobs.job import WORKER_START_TIMEOUT
from spark_jobs.kafka_source import latest_offsets
from spark_jobs.staging import staging_root
from spark_jobs.window_state import WindowStateStore

KILLED = -signal.SIGKILL
FAILED = 2  # a Krishiv error, reported by the command
TABLES_REFUSED = 1  # krishiv commit: a table refused (named), every other table committed
ATTEMPTS = 5
STEP_TIMEOUT_S = 600.0
PAUSE_S = 3.0


class ScenarioError(RuntimeError):
    """A step did not behave as the scenario expects (this is a violation too)."""


STAGE_POINTS = ("stage.begin", "stage.after_compute", "stage.after_files", "stage.after_ledger")


@dataclass(frozen=True)
class Size:
    """How much each scenario does. Every size reaches every fault point and runs every scenario kind."""

    name: str
    scale: float  # a scenario's order counts are multiplied by this
    max_records: int  # records per micro-batch
    spacing_ms: int  # event time between orders: fewer orders still span several one-minute windows
    relay_records: int  # orders of the relay scenario: at least four batches with rows
    driver_batches: tuple[int, ...]  # the batches the driver is killed in
    driver_points: tuple[str, ...]  # the steps it is killed at in each of them
    relay_walk: int | None  # batches after the fourth the relay is killed around (None: every one)
    quick: bool = False  # skip set-up steps that only give a scenario more history (see the scenarios)
    java_options: str = ""  # for each Spark driver's JVM: start-up speed only, never what Spark computes

    def env(self) -> dict[str, str]:
        """Environment for every process of a workspace of this size."""
        if not self.java_options:
            return {}
        return {"PYSPARK_SUBMIT_ARGS": f"--driver-java-options '{self.java_options}' pyspark-shell"}


#: The default, for soaks and the figures of docs/testing.md.
FULL = Size(
    "full",
    scale=1.0,
    max_records=1_000,
    spacing_ms=50,
    relay_records=10_000,
    driver_batches=(1, 2),
    driver_points=STAGE_POINTS,
    relay_walk=None,
)
#: ``make test``'s: two fifths of the events, three batches a scenario, the driver killed in one batch at the two
#: steps the one-shot scenario does not kill at, the relay's kills over the minimum of batches, and a JVM that
#: compiles less (C1 only, one compiler thread, serial GC), since every step is a fresh, short-lived Spark driver
#: (about 3.5 s less of the 24 s a one-shot run takes on 2 cores).
CI = Size(
    "ci",
    scale=0.4,
    max_records=500,
    spacing_ms=150,
    relay_records=2_200,
    driver_batches=(1,),
    driver_points=("stage.begin", "stage.after_files"),
    relay_walk=1,
    quick=True,
    java_options="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1",
)
SIZES = {size.name: size for size in (FULL, CI)}


@dataclass
class Context:
    ws: Workspace
    rng: random.Random
    broker: LocalBroker
    size: Size = FULL
    catalog_pause: Callable[[], object] | None = None
    catalog_resume: Callable[[], object] | None = None
    external_faults: list[str] = field(default_factory=list)
    earlier_topics: list[Records] = field(default_factory=list)  # the topic's records before each re-creation

    # ----------------------------------------------------------------------------------- steps

    def produce(self, records: int = 3_000, *, scaled: bool = True) -> None:
        """``records`` orders (times the size's scale unless ``scaled`` is False), some late and malformed."""
        if scaled:
            records = max(100, round(records * self.size.scale))
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
        """Stage and commit until both succeed (a fault may have left a step to redo). Staging is skipped when it
        has nothing to do (see :meth:`staged_to_the_end`): a Spark start-up saved, nothing left unchecked."""
        for step in (self.stage, self.commit):
            if step == self.stage and self.staged_to_the_end():
                continue
            for attempt in range(ATTEMPTS):
                if step(expect=None) == 0:
                    break
                if attempt == ATTEMPTS - 1:
                    raise ScenarioError(f"{step.__name__} kept failing after the faults; see commands.log")

    def staged_to_the_end(self) -> bool:
        """Whether ``krishiv run --once`` would plan no batch for any pipeline: Spark finished the last batch of each
        query's offset log, that batch ends at the topic's end, and no operator's skip waits to be applied. (The
        contract still checks that every offset was staged once.)"""
        end = latest_offsets(self.ws.bootstrap, self.ws.topic)
        for pipeline in self.ws.spec.pipelines:
            checkpoint = Checkpoint(self.ws.spec.checkpoint_dir(pipeline))
            last = checkpoint.last_batch_id()
            if last < 0 or last not in checkpoint.committed_batch_ids():
                return False
            if any(s.applied_batch_id is None for s in self.ws.ledger().skips(checkpoint.query_id())):
                return False
            if checkpoint.batch(last).end != end:
                return False
        return True

    def batches_with_rows(self, table: str | None = None) -> list[int]:
        """Pending batch ids whose entries (of ``table``, or of any table) publish rows, so the relay's fault
        points are reached for them."""
        name = qualified(self.ws.spec, table) if table else None
        pending = self.ws.ledger().entries(table=name, status=PENDING)
        return sorted({e.batch_id for e in pending if e.record_count})

    def batch_with_rows(self, *, first: bool = False, last: bool = False, table: str | None = None) -> int:
        candidates = self.batches_with_rows(table)
        if not candidates:
            raise ScenarioError(f"no pending batch has rows{f' for {table}' if table else ''}")
        return candidates[0] if first else candidates[-1] if last else self.rng.choice(candidates)

    def output_of_last(self, command: str) -> str:
        """What the last ``krishiv <command>`` step wrote to commands.log (from its ``$ … krishiv <command>`` line)."""
        log = (self.ws.folder / "commands.log").read_text()
        starts = [m.start() for m in re.finditer(rf"^\$ \S+ krishiv {re.escape(command)}\b", log, re.MULTILINE)]
        return log[starts[-1] :] if starts else ""

    def main_table(self) -> Table:
        return load_catalog(self.ws.spec).load_table(qualified(self.ws.spec, self.ws.spec.pipeline().table))

    def wait_reached(self, point: str, batch: int, process: subprocess.Popen, timeout_s: float = 300) -> None:
        marker = self.ws.sync_dir / f"{point}@{batch}.reached"
        deadline = time.monotonic() + timeout_s
        while not marker.exists():
            if process.poll() is not None:
                raise ScenarioError(f"the process exited ({process.returncode}) before reaching {point}@{batch}")
            if time.monotonic() > deadline:
                raise ScenarioError(f"{point}@{batch} was not reached within {timeout_s:.0f}s")
            time.sleep(0.05)

    def wait(self, process: subprocess.Popen, what: str) -> int:
        """Wait for a step started with ``ws.start`` (killing it after :data:`STEP_TIMEOUT_S`); log its exit code."""
        try:
            rc = process.wait(timeout=STEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise ScenarioError(f"{what} did not finish within {STEP_TIMEOUT_S:.0f}s") from None
        with (self.ws.folder / "commands.log").open("a") as log:
            log.write(f"\n= {what} exited {rc}\n")
        return rc

    def release(self, point: str, batch: int) -> None:
        (self.ws.sync_dir / f"{point}@{batch}.go").write_text("go")

    def checkpoint(self) -> Path:
        return self.ws.spec.checkpoint_dir(self.ws.spec.pipeline())

    def rewind(self, batches: int) -> None:
        """Forget the last ``batches`` batches' offsets and commits (with their checksum files)."""
        last = Checkpoint(self.checkpoint()).rewind(batches)
        self.external_faults.append(f"checkpoint rewound by {batches} batches from {last}")


# --------------------------------------------------------------------------------------- scenarios


def driver_killed_at_every_step(ctx: Context) -> None:
    """SIGKILL the Spark driver before, during and after staging a batch, and between the ledger write and
    Spark's commit log, one run per step, for two batches; each restart replays the batch. The steps before
    the ledger write come in a random order; the last kill is after it (a recorded batch is not restaged).
    The CI size kills in one batch, at the two steps the one-shot scenario does not kill at."""
    ctx.produce()
    *before_ledger, after_ledger = STAGE_POINTS
    for batch in ctx.size.driver_batches:
        for point in [*ctx.rng.sample(before_ledger, len(before_ledger)), after_ledger]:
            if point in ctx.size.driver_points:
                ctx.stage(faults=f"{point}@{batch}", expect=KILLED)
    ctx.finish()


def relay_faults_at_every_step(ctx: Context) -> None:
    """In the first commit run: a catalog commit that raises after succeeding, one that times out before
    committing and one after, then SIGKILL before a catalog commit. Then, batch after batch, SIGKILL after
    the catalog commit (before the ledger update) and before the next batch's catalog commit (the CI size: one
    batch, after its catalog commit)."""
    ctx.produce(ctx.size.relay_records, scaled=False)
    ctx.stage()
    batches = ctx.batches_with_rows()
    if len(batches) < 4:
        raise ScenarioError(f"expected at least 4 batches with rows, staged {batches}")
    ctx.commit(
        faults=f"relay.after_catalog_commit@{batches[0]}:raise,relay.before_catalog_commit@{batches[1]}:timeout,"
        f"relay.after_catalog_commit@{batches[2]}:timeout,relay.before_catalog_commit@{batches[3]}",
        expect=KILLED,
    )
    walk = batches[3:] if ctx.size.relay_walk is None else batches[3 : 3 + ctx.size.relay_walk]
    for position, batch in enumerate(walk):
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
    if ctx.wait(slow, "the paused relay") != 0:
        raise ScenarioError(f"the paused relay exited {slow.returncode} after losing the race")
    ctx.finish()


HOLD_LEDGER = (
    "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); con.execute('BEGIN TRANSACTION');"
    "print('held', flush=True); time.sleep(float(sys.argv[2]))"
)


def ledger_held(ctx: Context) -> None:
    """Another process holds the ledger longer than the retry budget: both steps fail cleanly, then recover.
    (The CI size holds a ledger nothing was staged into yet, saving a Spark start-up.)"""
    ctx.produce()
    if ctx.size.quick:
        ctx.ws.ledger().migrate()
    else:
        ctx.stage()
    path = ctx.ws.ledger_path
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
    ctx.wait(staging, "the staging run under the paused broker")
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
    ctx.wait(relay, "the relay under the paused catalog")
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


def _expire_all_but_current(ctx: Context) -> None:
    """Expire every snapshot of the pipeline's two tables except each one's current snapshot."""
    catalog = load_catalog(ctx.ws.spec)
    pipeline = ctx.ws.spec.pipeline()
    for name in (pipeline.table, pipeline.rejects_table):
        table = catalog.load_table(qualified(ctx.ws.spec, name))
        current = table.current_snapshot()
        old = [s.snapshot_id for s in table.snapshots() if current is None or s.snapshot_id != current.snapshot_id]
        if old:
            table.maintenance.expire_snapshots().by_ids(old).commit()


def snapshots_expired(ctx: Context) -> None:
    """The relay dies after a commit; all snapshots but the current one expire; then everything restarts."""
    ctx.produce()
    ctx.stage()
    ctx.commit(faults=f"relay.after_catalog_commit@{ctx.batch_with_rows(last=True)}", expect=KILLED)
    _expire_all_but_current(ctx)
    ctx.external_faults.append("snapshots expired, keeping the current one")
    ctx.rewind(1)
    ctx.produce(1_500)
    ctx.finish()


# ------------------------------------------------------------------ the paths issue 12 closed, one scenario each

#: Records per batch of the one-shot scenario: the whole topic fits in one batch.
ONE_BATCH = 1_000_000


def one_shot_in_one_batch(ctx: Context) -> None:
    """The whole topic read by ``krishiv run --once`` in ONE batch, the driver SIGKILLed after computing it and,
    on the restart, after its ledger write (before Spark's commit log); the next restart replays it. Every window
    the final watermark passed is written, once: that batch closes them (the oracle checks each)."""
    ctx.produce()
    for point in ("stage.after_compute", "stage.after_ledger"):
        ctx.stage(faults=f"{point}@0", expect=KILLED)
    ctx.finish()
    entries = ctx.ws.ledger().entries(table=qualified(ctx.ws.spec, ctx.ws.spec.pipeline().table))
    if [e.batch_id for e in entries] != [0]:
        raise ScenarioError(
            f"expected the whole topic in batch 0; the ledger holds batches {[e.batch_id for e in entries]}"
        )
    if not entries[0].record_count:
        raise ScenarioError("the one batch closed no window, though its watermark passed some")


def foreign_rewrite_after_relay_kill(ctx: Context) -> None:
    """The relay SIGKILLed after the catalog commit of a batch, before the ledger update; another writer rewrites the
    table at its head (a compaction's overwrite with the same rows); every snapshot but that foreign one expires.
    The restarted relay must find the batch in the table's high-water property and never append it again."""
    ctx.produce()
    ctx.stage()
    batch = ctx.batch_with_rows(first=True, table=ctx.ws.spec.pipeline().table)
    ctx.commit(faults=f"relay.after_catalog_commit@{batch}", expect=KILLED)
    table = ctx.main_table()
    rows = table.scan().to_arrow()
    table.overwrite(rows.cast(pa.schema(list(rows.schema))))
    _expire_all_but_current(ctx)
    head = ctx.main_table().current_snapshot()
    if head is None or (head.summary and head.summary.get("krishiv.batch-id") is not None):
        raise ScenarioError(f"the head after the rewrite should be the foreign snapshot, it is {head}")
    ctx.external_faults.append(
        f"relay killed after committing batch {batch}; the table rewritten at the head by another writer "
        f"({rows.num_rows} rows, snapshot {head.snapshot_id}); every other snapshot expired"
    )
    ctx.finish()


def topic_recreated(ctx: Context) -> None:
    """Offsets move backwards: after a batch was staged and committed, the topic is deleted and re-created (a new
    topic id, offsets from 0 again) and written to. ``krishiv run --once`` must stop naming the topic; the operator
    skips every partition to 0 (``krishiv skip-offsets``); the batch that applies it reads the new topic, the
    relay is SIGKILLed after committing the snapshot that publishes the skip, and that snapshot's summary names it.
    The contract checks both generations: batches before the skip against a copy of the old topic's records."""
    ctx.produce()
    ctx.stage()
    ctx.commit()
    ws, pipeline = ctx.ws, ctx.ws.spec.pipeline()
    before = latest_offsets(ws.bootstrap, ws.topic)
    ctx.earlier_topics.append(
        read_topic(ws.bootstrap, ws.topic, ws.spec.kafka.partitions, {int(p): o for p, o in before.items()})
    )
    ws.recreate_topic()
    ctx.external_faults.append(f"topic {ws.topic} deleted and re-created (it ended at {before})")
    ctx.produce(1_500)
    ctx.stage(expect=FAILED)
    failure = ctx.output_of_last("run")
    named = any(f"{ws.topic}/{p}" in failure for p in before) or ("re-created" in failure and ws.topic in failure)
    if not named:
        raise ScenarioError(f"`krishiv run --once` on the re-created topic did not name it: {failure[-600:]!r}")
    for partition in sorted(before, key=int):
        args = ("skip-offsets", "--partition", partition, "--to", "0", "--reason", "topic re-created (chaos)")
        if ws.run(*args, timeout_s=STEP_TIMEOUT_S) != 0:
            raise ScenarioError(f"`krishiv skip-offsets --partition {partition} --to 0` failed; see commands.log")
    ctx.stage()
    applied = {s.applied_batch_id for s in ws.ledger().skips(Checkpoint(ctx.checkpoint()).query_id())}
    if len(applied) != 1 or None in applied:
        raise ScenarioError(f"the skips were applied by batches {applied}, expected one batch")
    (skip_batch,) = applied
    later = [b for b in ctx.batches_with_rows(pipeline.table) if b >= skip_batch]
    if not later:
        raise ScenarioError(f"no batch from {skip_batch} on has rows to publish the skip with")
    ctx.commit(faults=f"relay.after_catalog_commit@{later[0]}", expect=KILLED)
    ctx.finish()
    summaries = [s.summary.get(SUMMARY_SKIPPED) for s in ctx.main_table().snapshots() if s.summary is not None]
    named_skips = [json.loads(text) for text in summaries if text]
    moved = {(x["partition"], x["from"], x["to"]) for skips in named_skips for x in skips}
    if moved != {(p, o, 0) for p, o in before.items()}:
        raise ScenarioError(f"the snapshot summaries name the skips {sorted(moved)}, expected every partition to 0")


def _copy_ledger(source: Path, target: Path) -> None:
    """Copy a DuckDB file with its write-ahead log (or the absence of one)."""
    shutil.copy2(source, target)
    wal, target_wal = source.with_name(source.name + ".wal"), target.with_name(target.name + ".wal")
    if wal.exists():
        shutil.copy2(wal, target_wal)
    else:
        target_wal.unlink(missing_ok=True)


def ledger_behind_checkpoint(ctx: Context) -> None:
    """The ledger restored from a backup taken before the last batches were staged: the checkpoint is ahead of it.
    ``krishiv run --once`` must refuse to start, naming the checkpoint, the ledger and the missing batches; with the
    right ledger back, everything completes."""
    ctx.produce()
    ctx.stage()
    ctx.commit()
    path, table = ctx.ws.ledger_path, qualified(ctx.ws.spec, ctx.ws.spec.pipeline().table)
    backup, current = ctx.ws.folder / "ledger-backup.duckdb", ctx.ws.folder / "ledger-current.duckdb"
    _copy_ledger(path, backup)
    backed_up = {e.batch_id for e in ctx.ws.ledger().entries(table=table)}
    ctx.produce(1_500)
    ctx.stage()
    missing = sorted({e.batch_id for e in ctx.ws.ledger().entries(table=table)} - backed_up)
    _copy_ledger(path, current)
    _copy_ledger(backup, path)
    ctx.external_faults.append(f"ledger restored from a backup without batches {missing}")
    ctx.stage(expect=FAILED)
    failure = ctx.output_of_last("run")
    for what in (str(ctx.checkpoint()), str(path), ", ".join(map(str, missing))):
        if what not in failure:
            raise ScenarioError(f"`krishiv run --once` did not name {what!r}: {failure[-800:]!r}")
    _copy_ledger(current, path)
    ctx.finish()


def _local(path: str) -> str:
    return urlparse(path).path if path.startswith("file:") else path


def remove_orphan_files(table: Table) -> list[str]:
    """Iceberg's standard orphan-file removal (``RemoveOrphanFiles``, grace period 0): every file under the table's
    location that no metadata file, snapshot, manifest list or manifest of the table references is deleted."""
    from pyarrow import fs

    metadata = table.metadata
    keep = {table.metadata_location, f"{table.location()}/metadata/version-hint.text"}
    keep |= {m.metadata_file for m in metadata.metadata_log}
    keep |= {s.statistics_path for s in metadata.statistics}
    for snapshot in table.snapshots():
        keep.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            keep.add(manifest.manifest_path)
            keep |= {e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io, discard_deleted=False)}
    keep = {_local(k) for k in keep}
    filesystem, root = fs.FileSystem.from_uri(table.location())
    listing = filesystem.get_file_info(fs.FileSelector(root, recursive=True, allow_not_found=True))
    removed = [i.path for i in listing if i.type == fs.FileType.File and _local(i.path) not in keep]
    for path in removed:
        filesystem.delete_file(path)
    return removed


def orphan_removal_beside_the_relay(ctx: Context) -> None:
    """Standard orphan-file removal (grace 0) runs over the tables while the relay is paused between its check and
    its catalog commit of the first batch: the planted orphan goes, no staged file of a PENDING entry does, and the
    commit succeeds. The relay is SIGKILLed before committing the last batch, whose staged files are then deleted
    by hand: ``krishiv commit`` stops naming the missing file, ``krishiv restage`` stages the batch again from the
    ledger's offsets, and everything completes."""
    ctx.produce()
    ctx.stage()
    catalog, pipeline = load_catalog(ctx.ws.spec), ctx.ws.spec.pipeline()
    tables = [catalog.load_table(qualified(ctx.ws.spec, name)) for name in (pipeline.table, pipeline.rejects_table)]
    planted = f"{_local(tables[0].location())}/data/orphan-{uuid.uuid4().hex}.parquet"
    Path(planted).parent.mkdir(parents=True, exist_ok=True)
    Path(planted).write_bytes(b"not referenced by any snapshot")
    staged = {_local(f.path) for e in ctx.ws.ledger().entries() for f in e.files}
    batches, point = ctx.batches_with_rows(pipeline.table), "relay.before_catalog_commit"
    if len(batches) < 2:
        raise ScenarioError(f"expected at least 2 batches with rows, staged {batches}")
    batch, victim = batches[0], batches[-1]
    relay = ctx.ws.start("commit", faults=f"{point}@{batch}:pause,{point}@{victim}")
    try:
        ctx.wait_reached(point, batch, relay)
        removed = [_local(path) for table in tables for path in remove_orphan_files(table)]
    finally:
        ctx.release(point, batch)
    if ctx.wait(relay, "the relay paused during the orphan-file removal") != KILLED:
        raise ScenarioError(f"the relay exited {relay.returncode}, expected the kill before batch {victim}")
    ctx.external_faults.append(
        f"orphan-file removal deleted {len(removed)} files under the table locations during the commit of {batch}"
    )
    if planted not in removed:
        raise ScenarioError(f"the orphan-file removal did not remove the planted orphan {planted}: {removed}")
    if staged & set(removed):
        raise ScenarioError(f"the orphan-file removal deleted staged files {sorted(staged & set(removed))}")

    table = ctx.main_table()
    (entry,) = [
        e for e in ctx.ws.ledger().entries(table=qualified(ctx.ws.spec, pipeline.table)) if e.batch_id == victim
    ]
    for f in entry.files:
        table.io.delete(f.path)
    ctx.external_faults.append(f"the staged files of pending batch {victim} deleted by hand")
    ctx.commit(expect=TABLES_REFUSED)
    failure = ctx.output_of_last("commit")
    if not any(f.path in failure for f in entry.files):
        raise ScenarioError(f"`krishiv commit` did not name the missing staged file: {failure[-600:]!r}")
    if ctx.ws.run("restage", timeout_s=STEP_TIMEOUT_S) != 0:
        raise ScenarioError("`krishiv restage` failed; see commands.log")
    ctx.finish()


#: The stager lease of the lease scenario (seconds), and how long past it the harness waits for it to expire.
SHORT_LEASE_TTL_S = 3.0
LEASE_EXPIRY_MARGIN_S = 10.0


def _stop_outside_the_ledger(ctx: Context, process: subprocess.Popen) -> None:
    """SIGSTOP ``process`` at a moment it holds no ledger transaction (its lease renewer may be in one), so the
    stager that takes over is not kept waiting on the file instead of on the lease."""
    for _ in range(ATTEMPTS):
        process.send_signal(signal.SIGSTOP)
        try:
            Ledger(ctx.ws.ledger_path, lock_timeout_s=1.0).current_lease(ctx.ws.spec.pipeline().name)
            return
        except LedgerBusyError:
            process.send_signal(signal.SIGCONT)
            time.sleep(0.1)
    raise ScenarioError("the paused stager kept the ledger locked")


def _wait_lease_expired(ctx: Context, timeout_s: float) -> None:
    pipeline = ctx.ws.spec.pipeline().name
    deadline = time.monotonic() + timeout_s
    while True:
        lease = ctx.ws.ledger().current_lease(pipeline)
        if lease is not None and lease.expires_at < datetime.now(UTC):
            return
        if time.monotonic() > deadline:
            raise ScenarioError(f"the stager lease {lease} did not expire within {timeout_s:.0f}s")
        time.sleep(0.2)


def stager_lost_its_lease(ctx: Context) -> None:
    """A stager paused (SIGSTOP) after writing a batch's files, past its lease: a second ``krishiv run --once`` takes
    the expired lease over and stages everything; resumed, the first must stop with StagerLeaseLost without
    recording its batch (and remove its files); no state file is left half-written or interleaved. Only the first
    stager has the short lease: the second keeps the default, so a busy machine cannot fence it off too."""
    ctx.produce()
    batch, point = 0, "stage.after_files"
    short = {STAGER_LEASE_TTL_ENV: f"{SHORT_LEASE_TTL_S:g}"}
    first = ctx.ws.start("run", "--once", faults=f"{point}@{batch}:pause", env=short)
    try:
        ctx.wait_reached(point, batch, first)
        _stop_outside_the_ledger(ctx, first)
        _wait_lease_expired(ctx, SHORT_LEASE_TTL_S + LEASE_EXPIRY_MARGIN_S)
        ctx.external_faults.append(f"stager SIGSTOPped after writing the files of batch {batch}, past its lease")
        ctx.stage()
    finally:
        first.send_signal(signal.SIGCONT)
        ctx.release(point, batch)
    rc = ctx.wait(first, "the stager that lost its lease")
    if rc != FAILED:
        raise ScenarioError(f"the stager that lost its lease exited {rc}, expected {FAILED} (StagerLeaseLost)")
    if "is no longer held by this process" not in (ctx.ws.folder / "commands.log").read_text():
        raise ScenarioError("the stager that lost its lease did not say so")
    ctx.finish()
    state = WindowStateStore(ctx.checkpoint())
    leftovers = [p.name for p in state.folder.iterdir() if not p.name.endswith(".parquet") or p.name.startswith(".")]
    if leftovers:
        raise ScenarioError(f"window state files left behind: {leftovers}")
    for path in state.folder.glob("*.parquet"):
        pq.read_table(path)  # a torn or interleaved file does not read
    recorded = {_local(f.path) for e in ctx.ws.ledger().entries() for f in e.files}
    folder = Path(_local(staging_root(ctx.main_table())))
    written = {str(p) for p in folder.rglob("*.parquet") if f"batch={batch:012d}" in str(p)}
    if written - recorded:
        raise ScenarioError(f"staged files of batch {batch} that no entry records: {sorted(written - recorded)}")


# ------------------------------------------------------------- the newer kinds: events, upsert, grouped windows

#: Orders of a kinds scenario (times the size's scale), in two parts around the tombstones, and batches they make.
KINDS_ORDERS = 3_000
KINDS_BATCHES = 5
#: Customers whose latest order the tombstones delete, from the first part's; and one no order ever named.
KINDS_TOMBSTONES = 6
NEVER_ORDERED = b"c-nobody"
#: The staging steps the driver is killed at with every kind paused there, and the batches the kinds pause in.
KINDS_STAGE_POINTS = ("stage.after_compute", "stage.after_files", "stage.after_ledger")
KINDS_PAUSE_BATCHES = (1, 2, 3)
KINDS_RELAY_POINTS = ("relay.before_catalog_commit", "relay.after_catalog_commit")
#: Inside a batch's commit to several tables at once (``outbox.multi_table_commit``).
MULTI_TABLE_POINTS = (
    "relay.multi_table.metadata_written",
    "relay.multi_table.pointer_swapped",
    "relay.multi_table.before_db_commit",
)
KINDS_PAUSE_TIMEOUT_S = 240.0  # below the fault point's own pause limit, after which a paused kind would go on
QUERY_FAILED = "terminated with error"  # Spark's log line when a streaming query fails


def query_failed(output: str) -> bool:
    """Whether a query of a run failed for good: Spark's line for a failed query, unless its cause (the next line)
    is a Python worker that did not connect back in time, which the run starts again (``krishiv.operations``); a
    failure whose cause is not written yet is not counted until it is."""
    for rest in output.split(QUERY_FAILED)[1:]:
        lines = rest.split("\n")
        if len(lines) >= 3 and WORKER_START_TIMEOUT not in lines[1]:
            return True
    return False


def produce_kinds(ctx: Context) -> None:
    """The kinds spec (three pipelines on the one topic, :data:`chaos.workspace.KINDS_SPEC_TEMPLATE`) with batches
    of a :data:`KINDS_BATCHES`-th of the topic; orders (late and malformed mixed in), then tombstones (one per
    produce request) for customers of those orders and one never ordered, then more orders: the tombstones land
    in a middle batch, so the kinds are killed and committed around them."""
    orders = max(100, round(KINDS_ORDERS * ctx.size.scale))
    total = orders + KINDS_TOMBSTONES + 1
    ctx.ws.write_kinds_spec(max_records=-(-total // KINDS_BATCHES))
    first = ctx.ws.produce(orders // 2, seed=ctx.rng.randrange(1 << 30), late=orders // 400, malformed=orders // 800)
    customers = sorted({e.key for e in first if e.kind == "valid"})
    ctx.ws.produce_tombstones([*ctx.rng.sample(customers, KINDS_TOMBSTONES), NEVER_ORDERED])
    rest = orders - orders // 2
    ctx.ws.produce(rest, seed=ctx.rng.randrange(1 << 30), late=rest // 400, malformed=rest // 800)


def _log_line(ctx: Context, line: str) -> None:
    with (ctx.ws.folder / "commands.log").open("a") as log:
        log.write(f"= {line}\n")


def _kind(pipeline: PipelineSpec) -> str:
    return f"{pipeline.name} ({pipeline.kind})"


def _in_flight(ctx: Context) -> dict[str, int | None]:
    """Each pipeline's batch in flight: the last of its offset log when Spark's commit log does not have it."""
    out: dict[str, int | None] = {}
    for pipeline in ctx.ws.spec.pipelines:
        checkpoint = Checkpoint(ctx.ws.spec.checkpoint_dir(pipeline))
        last = checkpoint.last_batch_id()
        out[pipeline.name] = last if last >= 0 and last not in checkpoint.committed_batch_ids() else None
    return out


def _wait_paused(ctx: Context, point: str, process: subprocess.Popen, count: int) -> list[dict]:
    """Wait until ``count`` stagers of ``process`` have paused at ``point`` (their firings, from the faults log)."""
    deadline = time.monotonic() + KINDS_PAUSE_TIMEOUT_S
    while True:
        paused = [f for f in fired(ctx.ws) if f["pid"] == process.pid and f["point"] == point]
        if len(paused) >= count:
            return paused
        if process.poll() is not None:
            raise ScenarioError(f"the driver exited ({process.returncode}) with {len(paused)} kinds paused at {point}")
        if query_failed(ctx.output_of_last("run")):  # the driver waits on a paused query: it would never exit
            raise ScenarioError(f"a query failed with {len(paused)} kinds paused at {point}; see commands.log")
        if time.monotonic() > deadline:
            raise ScenarioError(f"{len(paused)} of {count} kinds paused at {point} within {KINDS_PAUSE_TIMEOUT_S:.0f}s")
        time.sleep(0.5)


def _kill_driver(process: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """SIGKILL the driver, as the fault point's own kill would; then wait for its JVM, which exits when the driver's
    end of its pipe closes, so its last words do not land in the next step's part of commands.log."""
    import psutil

    try:
        jvm = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        jvm = []
    process.kill()
    process.wait()
    _gone, alive = psutil.wait_procs(jvm, timeout=timeout_s)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def _kill_driver_with_every_kind_at(ctx: Context, point: str, batches: list[int]) -> dict[str, int]:
    """One ``krishiv run --once`` of every pipeline, each kind's stager paused at ``point`` in a batch of its own
    (one pause per batch of ``batches``: the first kind to reach it stops there, the others go on to the next one),
    then the driver SIGKILLed. Checks each kind's position from the checkpoint and the ledger; returns them."""
    pipelines = ctx.ws.spec.pipelines
    for attempt in range(ATTEMPTS):
        run = ctx.ws.start("run", "--once", faults=",".join(f"{point}@{b}:pause" for b in batches))
        try:
            paused = _wait_paused(ctx, point, run, len(pipelines))
        except ScenarioError:
            _kill_driver(run)
            ctx.wait(run, f"the driver that was to pause every kind at {point}")
            # Spark gives a Python worker 10 s to connect back, too little on a loaded machine. The round runs again
            # if every kind is still in a batch of its own (it stops there again), or none has started a batch.
            at = _in_flight(ctx)
            started = any(Checkpoint(ctx.ws.spec.checkpoint_dir(p)).has_batches() for p in pipelines)
            if None not in at.values() and len(set(at.values())) == len(pipelines):
                batches = sorted(b for b in at.values() if b is not None)
            elif started:
                raise
            if attempt == ATTEMPTS - 1 or WORKER_START_TIMEOUT not in ctx.output_of_last("run"):
                raise
            _log_line(ctx, f"Spark's Python worker did not connect back in time; the round runs again at {batches}")
            continue
        _kill_driver(run)
        if ctx.wait(run, f"the driver with every kind paused at {point}") != KILLED:
            raise ScenarioError(f"the driver exited {run.returncode}, expected the SIGKILL")
        break
    at = _in_flight(ctx)
    positions = sorted(b for b in at.values() if b is not None)
    if len(set(positions)) != len(pipelines) or positions != sorted(f["batch"] for f in paused):
        raise ScenarioError(
            f"kinds in flight at batches {at}, but they paused at {point} in {[f['batch'] for f in paused]}"
        )
    ledger = ctx.ws.ledger()
    for pipeline in pipelines:
        batch = at[pipeline.name] or 0
        recorded = ledger.batch(Checkpoint(ctx.ws.spec.checkpoint_dir(pipeline)).query_id(), batch)
        tables = {qualified(ctx.ws.spec, t) for t in pipeline.all_tables}
        if point == "stage.after_ledger" and set(recorded) != tables:
            raise ScenarioError(f"{_kind(pipeline)} paused at {point}@{batch}, but the ledger holds {sorted(recorded)}")
        if point != "stage.after_ledger" and recorded:
            raise ScenarioError(f"{_kind(pipeline)} paused at {point}@{batch}, but the ledger holds its entries")
    where = ", ".join(f"{_kind(p)} batch {at[p.name]}" for p in pipelines)
    ctx.external_faults.append(f"driver SIGKILLed with every kind paused at {point}: {where}")
    _log_line(ctx, f"every kind killed at {point}: {where}")
    return {name: b for name, b in at.items() if b is not None}


def kinds_driver_killed(ctx: Context) -> None:
    """The three newer kinds from one topic in one ``krishiv run --once``, the driver SIGKILLed while every kind's
    stager is paused at a staging step: after computing a batch, after writing its files, after recording it in
    the ledger (before Spark's commit log), one run each, each kind in a batch of its own (the first run pauses
    them in batches 1, 2 and 3 in the order they get there; each restart redoes that batch and stops at the next
    step); then recovery by running again. So every staging kill point is reached by every kind."""
    produce_kinds(ctx)
    batches = list(KINDS_PAUSE_BATCHES)
    for point in KINDS_STAGE_POINTS:
        batches = sorted(_kill_driver_with_every_kind_at(ctx, point, batches).values())
    ctx.finish()


def kinds_relay_killed(ctx: Context) -> None:
    """The three newer kinds staged from one topic; then, for each kind, ``krishiv commit --pipeline`` SIGKILLed
    before the catalog commit of its first batch with rows, and again after the catalog commit of its second (a
    fan-out's append, an upsert's merge, an update-mode window merge), before the ledger update; then, in later
    batches with rows for several tables (a fan-out's routes, a kind's rejects), at each step inside the commit to
    all of them at once (:data:`MULTI_TABLE_POINTS`), each kill followed by the check that every batch is in all of
    its tables or in none; recovery by committing again. Each kill is checked in the faults log to have fired in
    that kind's commit run."""
    produce_kinds(ctx)
    ctx.stage()
    ledger = ctx.ws.ledger()
    for pipeline in ctx.ws.spec.pipelines:
        tables = {qualified(ctx.ws.spec, t) for t in pipeline.all_tables}
        batches = sorted(
            {e.batch_id for e in ledger.entries(status=PENDING) if e.table in tables and not e.changes_nothing}
        )
        if len(batches) < 2:
            raise ScenarioError(f"{_kind(pipeline)}: expected at least 2 batches with rows, staged {batches}")
        for point, batch in zip(KINDS_RELAY_POINTS, batches, strict=False):
            _kill_commit_at(ctx, pipeline, point, batch)
        # Inside the commit of a batch to several tables at once (the fan-out's routes and rejects): after the
        # kill, every batch is in all its tables or in none.
        (query,) = {e.query_id for e in ledger.entries() if e.table in tables}
        spread = sorted(
            b
            for b in batches[len(KINDS_RELAY_POINTS) :]
            if sum(1 for e in ledger.batch(query, b).values() if not e.changes_nothing) > 1
        )
        for point, batch in zip(MULTI_TABLE_POINTS, spread, strict=False):
            _kill_commit_at(ctx, pipeline, point, batch)
            half = half_committed([CutReader(load_catalog(ctx.ws.spec)).read()], ledger)  # type: ignore[arg-type]
            if half:
                raise ScenarioError(f"half-committed after the kill at {point}@{batch}: {half}")
    ctx.finish()


def _kill_commit_at(ctx: Context, pipeline: PipelineSpec, point: str, batch: int) -> None:
    before = len(fired(ctx.ws))
    ctx._step(("commit", "--pipeline", pipeline.name), f"{point}@{batch}", KILLED, None)
    if not any(f["point"] == point and f["batch"] == batch for f in fired(ctx.ws)[before:]):
        raise ScenarioError(f"{_kind(pipeline)}: the commit run was killed, but not at {point}@{batch}")
    _log_line(ctx, f"{_kind(pipeline)} commit killed at {point}@{batch}")


#: Where ``kinds-read-under-kills`` SIGKILLs its runs: inside the commit of a batch to several tables at once.
READER_KILLS = ("relay.multi_table.pointer_swapped", "relay.multi_table.before_db_commit")
#: Half-committed observations are rare only if there are many observations: at least this many.
READER_MIN_CUTS = 100


def kinds_read_under_kills(ctx: Context) -> None:
    """A user's reader (``chaos.cut_reader``) takes every table's pointer in one catalog read, over and over, while
    a continuous ``krishiv run`` stages and commits the three kinds (a fan-out's routes and rejects among their
    tables), SIGKILLed inside its committer's commit of a batch to several tables (:data:`READER_KILLS`, one run
    each), then run again to the end. Every batch must be, in every observation, in all of its tables or in none;
    the oracle then checks every table as the matrix does."""
    produce_kinds(ctx)
    reader = CutReader(load_catalog(ctx.ws.spec)).start()  # type: ignore[arg-type]
    try:
        for point, batch in zip(READER_KILLS, (1, 3), strict=True):
            before = len(fired(ctx.ws))
            rc = _continuous_run(ctx, f"{point}@{batch}", f"krishiv run, to be killed at {point}@{batch}")
            if rc != KILLED or not any(f["point"] == point for f in fired(ctx.ws)[before:]):
                raise ScenarioError(f"krishiv run exited {rc}, expected the SIGKILL at {point}@{batch}")
            _log_line(ctx, f"run killed at {point}@{batch}")
        if _continuous_run(ctx, None, "krishiv run to the end") != 0:
            raise ScenarioError("the last krishiv run did not stop cleanly on SIGTERM; see commands.log")
        ctx.finish()
    finally:
        reader.stop()
    if len(reader.cuts) < READER_MIN_CUTS:
        raise ScenarioError(f"the reader made {len(reader.cuts)} observations, fewer than {READER_MIN_CUTS}")
    half = half_committed(reader.cuts, ctx.ws.ledger())
    _log_line(ctx, f"reader: {len(reader.cuts)} cuts, {len(half)} half-committed, {len(reader.errors)} failed reads")
    if half:
        raise ScenarioError(f"{len(half)} of {len(reader.cuts)} cuts saw a batch half-committed: {half[:3]}")


#: The field a user adds to every pipeline of the kinds spec in ``kinds-spec-changed``: optional, in no event.
ADDED_FIELD = "coupon"


def kinds_spec_changed(ctx: Context) -> None:
    """A user's spec change between runs, with the driver killed in it. Every kind stages the first half of the
    topic (left pending); then the spec gains an optional field (``coupon``: a new column of the events and upsert
    tables) and the rest arrives; the driver is SIGKILLed after recording the first batch staged for the new schema
    in the ledger, before the stager makes the schema change (the relay must make it before committing that batch);
    then recovery. Every event once, by the oracle; the new column is in those tables and null in every row (no
    event carries it). (A run that dies before recording leaves the table as it was:
    ``tests/spark_jobs/test_schema_evolution.py``.)"""
    orders = max(100, round(KINDS_ORDERS * ctx.size.scale))
    ctx.ws.write_kinds_spec(max_records=-(-orders // KINDS_BATCHES))
    first = orders // 2
    ctx.ws.produce(first, seed=ctx.rng.randrange(1 << 30), late=first // 400, malformed=first // 800)
    ctx.stage()
    text = ctx.ws.spec_file.read_text()
    added = f'{ADDED_FIELD} = {{ type = "string", required = false }}\n'
    ctx.ws.spec_file.write_text(text.replace("[pipelines.fields]\n", "[pipelines.fields]\n" + added))
    ctx.ws.spec = load_spec(ctx.ws.spec_file, env={})
    ctx.external_faults.append(f"spec changed: optional field {ADDED_FIELD!r} added to every pipeline")
    rest = orders - first
    ctx.ws.produce(rest, seed=ctx.rng.randrange(1 << 30), late=rest // 400, malformed=rest // 800)
    ctx.stage(faults="stage.after_ledger", expect=KILLED)
    if not any(f["point"] == "stage.after_ledger" for f in fired(ctx.ws)):
        raise ScenarioError("the driver was killed, but not at stage.after_ledger")
    ctx.finish()
    catalog = load_catalog(ctx.ws.spec)
    for pipeline in ctx.ws.spec.pipelines:
        if pipeline.kind == WINDOWED:
            continue  # its columns are the windows and aggregates, not the fields
        for name in pipeline.tables:
            column = catalog.load_table(qualified(ctx.ws.spec, name)).scan(selected_fields=(ADDED_FIELD,)).to_arrow()
            if column.num_columns != 1 or column.column(0).null_count != column.num_rows:
                raise ScenarioError(f"{name}: column {ADDED_FIELD!r} is missing or holds values no event carried")


# ------------------------------------------------------------ maintenance and the committer beside the query

#: Each maintenance command's options in the scenarios: compact any two small files, expire every snapshot but the
#: newest (whatever its age), remove orphans at once. A grace below the 10-minute floor is forced: the harness knows
#: nothing writes the tables unrecorded then (a paused relay has written nothing before its catalog commit; a
#: stager's files are recorded PENDING before they could be listed as orphans). ``krishiv maintain`` takes the
#: same settings from the spec's ``[maintenance]`` (:meth:`chaos.workspace.Workspace.write_maintenance`), whose
#: orphan grace cannot go below the floor: its orphan removal leaves the files of seconds ago alone.
MAINTENANCE_OPTIONS: dict[str, tuple[str, ...]] = {
    "compact": ("--min-files", "2"),
    "expire-snapshots": ("--keep-last", "1", "--keep-younger-than", "0s"),
    "remove-orphans": ("--grace", "0s", "--force"),
    "maintain": (),
}
#: Orders of the maintenance scenarios (times the size's scale): at least four batches with rows at either size.
MAINTENANCE_ORDERS = 5_000


def maintenance(ctx: Context, command: str, faults: str | None = None, expect: int | None = 0) -> int:
    """``krishiv <command>`` (``compact``, ``expire-snapshots``, ``remove-orphans`` or ``maintain``) with the
    scenarios' options (:data:`MAINTENANCE_OPTIONS`)."""
    return ctx._step((command, *MAINTENANCE_OPTIONS[command]), faults, expect, None)


def start_maintenance(ctx: Context, command: str, faults: str) -> subprocess.Popen:
    return ctx.ws.start(command, *MAINTENANCE_OPTIONS[command], faults=faults)


def _files(table: Table) -> set[str]:
    """Every file under the table's location and its staging folder, as local paths."""
    return {_local(f.path) for root in (table.location(), staging_root(table)) for f in list_files(table.io, root)}


def _all_files(ctx: Context) -> set[str]:
    return set().union(*(_files(t) for t in _tables(ctx)))


def _tables(ctx: Context) -> list[Table]:
    catalog, pipeline = load_catalog(ctx.ws.spec), ctx.ws.spec.pipeline()
    return [catalog.load_table(qualified(ctx.ws.spec, name)) for name in (pipeline.table, pipeline.rejects_table)]


def _staged(ctx: Context, status: str) -> set[str]:
    return {_local(f.path) for e in ctx.ws.ledger().entries(status=status) for f in e.files}


def _compactions(table: Table) -> list[LineageRow]:
    return [r for r in lineage(table) if r.maintenance == COMPACTION]


def maintenance_beside_the_relay(ctx: Context) -> None:
    """``krishiv maintain`` (compaction, expiry of all but the newest snapshot) and orphan removal at once
    (``krishiv remove-orphans --grace 0s --force``) run to the end while the relay is paused between its check and
    its catalog commit of a batch: released, the relay loses its race to the compaction, reloads, re-checks and
    commits; no staged file of a PENDING entry is removed, the committed batches' files the compaction replaced
    are. The relay is SIGKILLed before the last batch's commit; then a compaction paused before its own catalog
    commit while ``krishiv commit`` commits that batch: released, it rebases on the append and commits. Everything
    completes."""
    ctx.ws.write_maintenance()
    ctx.produce(MAINTENANCE_ORDERS)
    ctx.stage()
    main = ctx.ws.spec.pipeline().table
    batches, point = ctx.batches_with_rows(main), "relay.before_catalog_commit"
    if len(batches) < 4:
        raise ScenarioError(f"expected at least 4 batches with rows, staged {batches}")
    paused, last = batches[2], batches[-1]
    relay = ctx.ws.start("commit", faults=f"{point}@{paused}:pause,{point}@{last}")
    try:
        ctx.wait_reached(point, paused, relay)
        pending, committed = _staged(ctx, PENDING), _staged(ctx, COMMITTED)
        maintenance(ctx, "maintain")
        maintenance(ctx, "remove-orphans")
    finally:
        ctx.release(point, paused)
    if ctx.wait(relay, "the relay paused during maintenance") != KILLED:
        raise ScenarioError(f"the relay exited {relay.returncode}, expected the kill before batch {last}")
    ctx.external_faults.append(f"maintain and remove-orphans ran while the relay was paused before committing {paused}")
    left = _all_files(ctx)
    if pending - left:
        raise ScenarioError(f"maintenance removed staged files of PENDING entries: {sorted(pending - left)}")
    if not committed - left:
        raise ScenarioError("orphan removal removed no staged file of a compacted batch (was it compacted?)")
    if not _compactions(ctx.main_table()):
        raise ScenarioError(f"krishiv maintain made no compaction snapshot in {main}")

    point = "maintenance.before_catalog_commit"
    compaction = start_maintenance(ctx, "compact", f"{point}:pause")
    try:
        ctx.wait_reached(point, None, compaction)
        ctx.commit()
        ctx.external_faults.append(f"batch {last} committed while a compaction was paused before its catalog commit")
    finally:
        ctx.release(point, None)
    if ctx.wait(compaction, "the compaction paused during krishiv commit") != 0:
        raise ScenarioError(f"the compaction that lost its race exited {compaction.returncode}, expected 0")
    # Everything is staged and committed now (the contract checks that nothing is left pending).
    rows = lineage(ctx.main_table())
    position = next((i for i, r in enumerate(rows) if r.batch_id == last), None)
    if position is None or not any(r.maintenance == COMPACTION for r in rows[position + 1 :]):
        raise ScenarioError(
            f"no compaction of {main} after the snapshot of batch {last}: it did not rebase on the relay's append "
            f"(lineage {[(r.batch_id, r.maintenance) for r in rows]})"
        )


def maintenance_killed(ctx: Context) -> None:
    """``krishiv compact`` SIGKILLed after writing its files (``maintenance.after_rewrite``), then after its catalog
    commit (``maintenance.after_catalog_commit``), with the relay killed before the last two batches' commits. Then
    ``krishiv expire-snapshots`` paused before its commit while the relay commits one more batch (expiry loses the
    race, reloads and expires); ``krishiv maintain`` runs; and orphan removal at once, paused before its first
    delete while the relay commits the last batch, PENDING when the removal read the ledger: the files the first
    killed compaction wrote are removed, no staged file of the batch is, and everything completes."""
    ctx.ws.write_maintenance()
    ctx.produce(MAINTENANCE_ORDERS)
    ctx.stage()
    main = ctx.ws.spec.pipeline().table
    batches = ctx.batches_with_rows(main)
    if len(batches) < 4:
        raise ScenarioError(f"expected at least 4 batches with rows, staged {batches}")
    before_last, last = batches[-2:]
    relay = "relay.before_catalog_commit"
    ctx.commit(faults=f"{relay}@{before_last}", expect=KILLED)
    before = _all_files(ctx)
    maintenance(ctx, "compact", faults="maintenance.after_rewrite", expect=KILLED)
    written = _all_files(ctx) - before
    if not written:
        raise ScenarioError("the compaction killed after its rewrite wrote no file")
    maintenance(ctx, "compact", faults="maintenance.after_catalog_commit", expect=KILLED)
    if not _compactions(ctx.main_table()):
        raise ScenarioError(f"the compaction killed after its catalog commit left no compaction snapshot in {main}")
    ctx.external_faults.append(f"krishiv compact SIGKILLed after writing {len(written)} files, then after its commit")

    point = "expiry.before_commit"
    expiry = start_maintenance(ctx, "expire-snapshots", f"{point}:pause")
    try:
        ctx.wait_reached(point, None, expiry)
        ctx.commit(faults=f"{relay}@{last}", expect=KILLED)
        ctx.external_faults.append(f"batch {before_last} committed while expiry was paused before its commit")
    finally:
        ctx.release(point, None)
    if ctx.wait(expiry, "the expiry paused during krishiv commit") != 0:
        raise ScenarioError(f"the expiry that lost its race exited {expiry.returncode}, expected 0")
    maintenance(ctx, "maintain")

    point = "orphans.before_delete"
    pending = _staged(ctx, PENDING)
    removal = start_maintenance(ctx, "remove-orphans", f"{point}:pause")
    try:
        ctx.wait_reached(point, None, removal)
        ctx.commit()
        ctx.external_faults.append(f"batch {last} committed while orphan removal was paused before its first delete")
    finally:
        ctx.release(point, None)
    if ctx.wait(removal, "the orphan removal paused during krishiv commit") != 0:
        raise ScenarioError(f"the orphan removal exited {removal.returncode}, expected 0")
    left = _all_files(ctx)
    if written & left:
        raise ScenarioError(f"the killed compaction's files were not removed as orphans: {sorted(written & left)}")
    if pending - left:
        raise ScenarioError(f"orphan removal removed staged files of batch {last}: {sorted(pending - left)}")
    # Everything is staged and committed now (the contract checks that nothing is left pending).


#: How long a continuous ``krishiv run`` may take to stage and commit everything before the harness gives up.
CONTINUOUS_TIMEOUT_S = 300.0


def _everything_committed(ctx: Context) -> bool:
    return ctx.staged_to_the_end() and not ctx.ws.ledger().entries(status=PENDING)


def _continuous_run(ctx: Context, faults: str | None, what: str) -> int:
    """A continuous ``krishiv run`` (its committer beside the query) until it exits (a fault point killed it) or
    everything is staged and committed, then SIGTERM; its exit code. After a kill, its JVM is waited for (it ends
    when the driver's end of its pipe closes), so its last words do not land in the next step's part of the log."""
    import psutil

    run = ctx.ws.start("run", faults=faults)
    deadline = time.monotonic() + CONTINUOUS_TIMEOUT_S
    jvm: list[psutil.Process] = []
    try:
        while run.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                jvm = psutil.Process(run.pid).children(recursive=True) or jvm
            if _everything_committed(ctx):
                run.send_signal(signal.SIGTERM)
                break
            if time.monotonic() > deadline:
                raise ScenarioError(f"{what} neither stopped nor committed everything in {CONTINUOUS_TIMEOUT_S:.0f}s")
            time.sleep(0.5)
    except BaseException:
        _kill_driver(run)
        raise
    with contextlib.suppress(subprocess.TimeoutExpired):
        run.wait(timeout=STEP_TIMEOUT_S)
    _gone, alive = psutil.wait_procs(jvm, timeout=60)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    return ctx.wait(run, what)


def _batch_snapshots(ctx: Context, batch: int) -> list[str]:
    """The tables that still hold a snapshot of ``batch``."""
    return [".".join(t.name()) for t in _tables(ctx) if any(r.batch_id == batch for r in lineage(t))]


def committer_killed_mid_commit(ctx: Context) -> None:
    """A continuous ``krishiv run`` (its committer commits each batch right after staging it) SIGKILLed before the
    catalog commit of an early batch; restarted, SIGKILLed again after the catalog commit of a later one N, before
    the ledger update. Compaction and expiry of all but the newest snapshot then remove N's snapshot; a third
    continuous run (more orders in the meantime) must find N by the table's high-water property, commit nothing
    twice, and stage and commit the rest."""
    ctx.produce(MAINTENANCE_ORDERS)
    point = "relay.before_catalog_commit"
    first = _continuous_run(ctx, ",".join(f"{point}@{b}" for b in (1, 2, 3)), "the continuous run killed mid-commit")
    if first != KILLED:
        raise ScenarioError(f"the continuous run exited {first}, expected the kill before a catalog commit")
    (killed,) = [f["batch"] for f in fired(ctx.ws) if f["point"] == point]
    main = ctx.ws.spec.pipeline().table
    later = [b for b in ctx.batches_with_rows(main) if b > killed]
    if not later:
        ctx.produce(1_500)  # the first run was killed before staging more: the second stages these
        target = f"relay.after_catalog_commit@{killed + 1},relay.after_catalog_commit@{killed + 2}"
    else:
        target = f"relay.after_catalog_commit@{later[-1]}"
    second = _continuous_run(ctx, target, "the continuous run killed after a catalog commit")
    if second != KILLED:
        raise ScenarioError(f"the second continuous run exited {second}, expected the kill after a catalog commit")
    (n,) = [f["batch"] for f in fired(ctx.ws) if f["point"] == "relay.after_catalog_commit"]
    ctx.external_faults.append(
        f"continuous krishiv run SIGKILLed before the commit of {killed}, then after that of {n}"
    )
    maintenance(ctx, "compact")
    maintenance(ctx, "expire-snapshots")
    still = _batch_snapshots(ctx, n)
    if still:
        raise ScenarioError(f"the snapshot of batch {n} survived compaction and expiry in {still}")
    ctx.external_faults.append(f"compaction and expiry removed the snapshot of batch {n}, still pending in the ledger")
    ctx.produce(1_000)
    if _continuous_run(ctx, None, "the continuous run after maintenance") != 0:
        raise ScenarioError("the continuous run after maintenance did not stop cleanly on SIGTERM")
    # It is stopped only once everything is staged and committed: no krishiv commit is needed to finish.


# ------------------------------------------------------------------- nested records (issue 36's "done when")

#: Records of the nested scenario (times the size's scale); the compact one's (make test), unscaled.
NESTED_RECORDS = 5_000
NESTED_COMPACT_RECORDS = 600


def _last_batch(ctx: Context) -> int:
    """The highest batch id any pipeline's offset log holds (-1 before any)."""
    return max(Checkpoint(ctx.ws.spec.checkpoint_dir(p)).last_batch_id() for p in ctx.ws.spec.pipelines)


def nested_killed(ctx: Context) -> None:
    """The nested topic (``chaos.nested``: four levels, lists of structs, maps of decimals, edge decimals at every
    depth, 1% malformed of every nested kind) through ``events``, ``upsert`` keyed by ``device.id`` and ``windowed``
    grouped by ``meta.site`` in one ``krishiv run``, produced in two random cuts with a random batch size:
    ``krishiv run --once`` SIGKILLed after a batch's files and again after a batch is recorded, ``krishiv commit``
    SIGKILLed after a catalog commit, then (the second cut produced) a continuous ``krishiv run`` SIGKILLed before
    a catalog commit; recovery, and ``krishiv verify``. The contract compares every table with
    ``chaos.nested_oracle``."""
    total = max(400, round(NESTED_RECORDS * ctx.size.scale))
    ctx.ws.write_nested_spec(max_records=max(40, total // ctx.rng.randint(6, 10)))
    first = total * ctx.rng.randint(45, 70) // 100
    ctx.ws.produce_nested(first, seed=ctx.rng.randrange(1 << 30))
    ctx.stage(faults="stage.after_files@1", expect=KILLED)
    ctx.stage(faults="stage.after_ledger@2", expect=KILLED)
    ctx.stage()
    ctx.commit(faults=f"relay.after_catalog_commit@{ctx.batch_with_rows()}", expect=KILLED)
    ctx.ws.produce_nested(total - first, seed=ctx.rng.randrange(1 << 30))
    point = f"relay.before_catalog_commit@{_last_batch(ctx) + 1}"
    if _continuous_run(ctx, point, "the continuous run of the nested pipelines") != KILLED:
        raise ScenarioError(f"the continuous run of the nested pipelines was not SIGKILLed at {point}")
    ctx.external_faults.append(f"continuous krishiv run SIGKILLed at {point}")
    ctx.finish()
    ctx._step(("verify",), None, 0, None)


def nested_killed_once(ctx: Context) -> None:
    """``nested_killed`` compact, for ``make test``: :data:`NESTED_COMPACT_RECORDS` nested records in three or four
    batches, ``krishiv run --once`` SIGKILLed once (after batch 1's files), then recovery and ``krishiv verify``."""
    ctx.ws.write_nested_spec(max_records=NESTED_COMPACT_RECORDS // ctx.rng.randint(3, 4) + 1)
    ctx.ws.produce_nested(NESTED_COMPACT_RECORDS, seed=ctx.rng.randrange(1 << 30))
    ctx.stage(faults="stage.after_files@1", expect=KILLED)
    ctx.finish()
    ctx._step(("verify",), None, 0, None)


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[Context], None]
    points: tuple[str, ...] | Callable[[Size], tuple[str, ...]] = ()  # the fault points it must reach
    needs_postgres: bool = False
    weight: int = 1  # how often the soak picks it (fault-dense scenarios more often)
    max_records: int | None = None  # records per batch, if not the size's
    # Runs alone, never beside another scenario: it pauses the broker every scenario shares, relies on a lease of
    # a few seconds, or changes the harness's working directory (Dagster's instance paths are relative).
    exclusive: bool = False
    # Several Spark runs of every kind (minutes at the CI size): started before the others, so the lanes end together.
    long: bool = False
    # Run by ``make test`` (tests/chaos/test_harness.py). The others' paths have focused tests there through the same
    # components (named beside each); they run at the CI size with ``make test-heavy`` and at full size in the matrix.
    in_ci: bool = True

    def reaches(self, size: Size) -> tuple[str, ...]:
        """The fault points a run of this scenario at ``size`` must reach."""
        return self.points(size) if callable(self.points) else self.points


MATRIX: tuple[Scenario, ...] = (
    # make test: tests/spark_jobs/test_crashes.py (the driver killed after writing a batch's files, and after its
    # ledger write); kinds-driver-killed kills every kind at every staging step after the batch is computed
    Scenario(
        "driver-killed-at-every-step",
        driver_killed_at_every_step,
        lambda size: size.driver_points,
        weight=2,
        in_ci=False,
    ),
    Scenario(
        "relay-faults-at-every-step",
        relay_faults_at_every_step,
        ("relay.before_catalog_commit", "relay.after_catalog_commit"),
        weight=4,
    ),
    # make test: tests/outbox/test_multi_table_commit.py::test_another_writer_between_planning_and_committing_moves_…,
    # tests/outbox/test_committer.py::test_krishiv_commit_racing_the_committer_commits_no_batch_twice
    Scenario(
        "concurrent-writer-between-check-and-commit",
        concurrent_writer,
        ("relay.before_catalog_commit",),
        in_ci=False,
    ),
    # make test: tests/outbox/test_ledger.py::test_write_blocked_by_another_process_fails_within_its_budget (and the
    # read, and PostgreSQL's), tests/krishiv/test_ledger_outage.py (a run past the bound stops with one line)
    Scenario("ledger-held-past-the-retry-budget", ledger_held, in_ci=False),
    Scenario("broker-paused-mid-batch", broker_paused, ("stage.begin",), exclusive=True),
    # make test: tests/outbox/test_committer.py::test_a_catalog_outage_pauses_commits_and_they_resume_when_it_is_back
    Scenario(
        "catalog-paused-mid-commit",
        catalog_paused,
        ("relay.before_catalog_commit",),
        needs_postgres=True,
        in_ci=False,
    ),
    # make test: tests/spark_jobs/test_pipeline.py::test_rewound_checkpoint_replays_without_new_rows_or_snapshots
    Scenario("checkpoint-rewound", checkpoint_rewound, in_ci=False),
    # make test: tests/spark_jobs/test_pipeline.py::test_rewound_checkpoint_replays_… (a rewind, as a restored copy)
    Scenario("restart-from-an-old-checkpoint-copy", old_checkpoint_restored, in_ci=False),
    # make test: tests/outbox/test_expiry.py::test_relay_restarted_after_a_lost_ledger_update_recovers_an_expired_…
    Scenario("snapshots-expired-before-a-restart", snapshots_expired, ("relay.after_catalog_commit",), in_ci=False),
    Scenario("dagster-killed-mid-commit", dagster_killed_mid_commit, ("relay.before_catalog_commit",), exclusive=True),
    # make test: kinds-driver-killed (a windowed kind killed after computing a batch and after its ledger write, each
    # restart closing the windows its batch closed against the oracle)
    Scenario(
        "one-shot-run-in-one-batch",
        one_shot_in_one_batch,
        ("stage.after_compute", "stage.after_ledger"),
        max_records=ONE_BATCH,
        in_ci=False,
    ),
    # make test: tests/outbox/test_relay.py::test_a_commit_whose_snapshot_expired_behind_another_writers_is_found,
    # tests/outbox/test_expiry.py::test_relay_restarted_after_a_lost_ledger_update_recovers_an_expired_batch_once
    Scenario(
        "relay-killed-then-foreign-rewrite-and-expiry",
        foreign_rewrite_after_relay_kill,
        ("relay.after_catalog_commit",),
        in_ci=False,
    ),
    # make test: tests/krishiv/test_offsets.py (the topic re-created with a batch in flight, skip, verify)
    Scenario("topic-re-created-offsets-backwards", topic_recreated, ("relay.after_catalog_commit",), in_ci=False),
    # make test: tests/spark_jobs/test_job.py::test_a_checkpoint_ahead_of_its_ledger_refuses_to_start_and_…
    Scenario("ledger-restored-behind-the-checkpoint", ledger_behind_checkpoint, in_ci=False),
    # make test: tests/outbox/test_orphans.py (a live stager's batch kept; what nothing refers to removed)
    Scenario(
        "orphan-file-removal-beside-the-relay",
        orphan_removal_beside_the_relay,
        ("relay.before_catalog_commit",),
        in_ci=False,
    ),
    Scenario("stager-lost-its-lease", stager_lost_its_lease, ("stage.after_files",), exclusive=True),
    Scenario("kinds-driver-killed", kinds_driver_killed, KINDS_STAGE_POINTS, weight=2, long=True),
    Scenario("kinds-relay-killed", kinds_relay_killed, KINDS_RELAY_POINTS + MULTI_TABLE_POINTS, weight=2, long=True),
    # make test: tests/outbox/test_multi_table_commit.py (the reader beside the relay, SQLite and PostgreSQL); these
    # two add a Spark run of every kind each (six minutes at the CI size), past .ci/run's budget on a slow host
    Scenario("kinds-read-under-kills", kinds_read_under_kills, READER_KILLS, long=True, in_ci=False),
    Scenario(
        "kinds-read-under-kills-postgres",
        kinds_read_under_kills,
        READER_KILLS,
        needs_postgres=True,
        long=True,
        in_ci=False,
    ),
    # make test: tests/spark_jobs/test_schema_evolution.py (a run dying before, and right after, its first record)
    Scenario("kinds-spec-changed", kinds_spec_changed, ("stage.after_ledger",), long=True, in_ci=False),
    Scenario(
        "maintenance-beside-the-relay",
        maintenance_beside_the_relay,
        ("relay.before_catalog_commit", "maintenance.before_catalog_commit"),
    ),
    Scenario(
        "maintenance-killed",
        maintenance_killed,
        (
            "relay.before_catalog_commit",
            "maintenance.after_rewrite",
            "maintenance.after_catalog_commit",
            "orphans.before_delete",
        ),
    ),
    # make test: tests/chaos/test_nested.py (the compact one: one SIGKILL, fewer records)
    Scenario(
        "nested-records-killed",
        nested_killed,
        ("stage.after_files", "stage.after_ledger", "relay.after_catalog_commit", "relay.before_catalog_commit"),
        long=True,
        in_ci=False,
    ),
    Scenario(
        "committer-killed-mid-commit",
        committer_killed_mid_commit,
        ("relay.before_catalog_commit", "relay.after_catalog_commit"),
        weight=2,
    ),
)


def fired(ws: Workspace) -> list[dict]:
    """The fault points that fired in the workspace's processes, from their log."""
    if not ws.faults_log.exists():
        return []
    return [json.loads(line) for line in ws.faults_log.read_text().splitlines() if line.strip()]
