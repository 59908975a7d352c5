"""The sensors that keep a pipeline's tables current without anyone clicking.

- The **outbox sensor** is the safety net of phase 2 and the UI's view of it. When the ledger holds PENDING
  entries of any of the pipeline's tables (``pipeline.all_tables``: a fan-out's routes too; and of the pipeline's
  batches for a table the spec no longer names, such as a removed route) beyond the cursor
  (the highest batch id already requested, per query), it requests a commit run whose run key names the batch
  range, unless a commit run is still waiting to start (the relay commits everything pending when it starts,
  so that run takes them). A range whose run failed is requested again, with a new run key, once no commit
  run is in flight and ``RETRY_AFTER_S`` has passed. While a live stager lease says its process commits its
  own batches (a continuous ``krishiv run``), fresh entries are left to it: only entries pending longer than
  ``COMMITTER_GRACE_S`` (the committer is down, stuck, or the catalog is out) get a commit run.
  Each tick also reports the commits no commit run materialized (made by ``krishiv run``'s committer, ``krishiv
  commit``, or a lingering staging run's committer) since the last one reported, read from the ledger by their
  ``commit_seq``, as materializations of the table's asset (a sensor result's asset events), an empty batch's too:
  the UI's plots and each table's freshness policy stay current without a run per batch. The metadata
  (:mod:`krishiv_assets.commit_reports`) adds the snapshot's rows and bytes (the catalog, one load per table and
  tick), the batch's rejects and late events (the ledger), and the lag behind the topic's end (the broker, asked
  once per tick). A commit whose ``committed_by`` names a Dagster run that materializes the table (the commit job,
  or a run whose asset selection has it) is not reported again; any other is, a run of the commit job included
  when this instance does not know it. At most ``REPORT_LIMIT`` per tick; the rest on the next one.
  The **first tick** (a new sensor, or a cursor an older Krishiv wrote, which has no ``history`` mark) also shows
  what was committed before Dagster started, e.g. with the CLI: for each table this Dagster instance has never seen
  materialized, its newest ``HISTORY_PER_TABLE`` commits up to the ledger's latest, reported in commit order (the
  newest last: Dagster takes an asset's last stored materialization as its latest, and the checks evaluate that
  one), then reads on from that commit. A table the instance has materializations of gets no history: they would
  land after newer ones, or twice. So a table committed before Dagster started is not "Never materialized".
  A materialization the sensor reports has no check evaluation, so the UI would show the table's checks as "Not
  evaluated" until the next commit run: after reporting commits the sensor also requests a run of the pipeline's
  **checks job** (``<pipeline>_checks_job``: every check of the pipeline's tables, no commit), at most one every
  ``KRISHIV_CHECKS_INTERVAL_S`` (default 60) and none while one or a commit run is in flight; commits reported
  meanwhile get the next one, so the newest materialization is always checked within about the interval plus a
  run's start.
- The **Kafka sensor** requests a staging run when the topic holds records beyond what the ledger has
  staged, unless a staging run is in flight or ``krishiv run`` stages the pipeline continuously (it holds
  the pipeline's stager lease).

A pipeline removed from the spec has neither; ``krishiv_removed_pipelines_sensor`` takes its pending batches
(:mod:`krishiv_assets.removed_pipelines`), with :func:`commit_request` as the outbox sensor does.

Both skip with a reason that names what they saw, including an unreachable broker, a busy ledger or a file
that is not a ledger. Each tick reads only what it needs from the ledger (PENDING keys, or the staged end
offsets per partition), so it stays short however many batches the ledger has recorded.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import dagster as dg
from dagster import SensorEvaluationContext

from krishiv_assets.assets import PipelineKeys
from krishiv_assets.commit_reports import (
    CommitFacts,
    commit_materialization,
    dagster_run_id,
    gather_facts,
    pending_by_table,
)
from krishiv_assets.data_versions import ledger_offsets, staged_report, table_tags, topic_held, topic_report
from krishiv_assets.resources import IcebergCatalogResource, KafkaResource, LedgerResource
from krishiv_assets.staging_run import latest_offsets, staged_offsets
from krishiv_core.catalog import qualified
from krishiv_core.entries import COMMITTED
from krishiv_core.env_settings import seconds_from_env
from krishiv_core.errors import ConfigError
from krishiv_core.spec import KrishivSpec, PipelineSpec
from outbox.errors import LedgerBusyError, LedgerCorrupt
from outbox.ledger import Ledger
from outbox.ledger.entries import PendingBatch
from outbox.ledger.leases import StagerLease
from outbox.ledger.queries import CommitRecord

OUTBOX_SENSOR_INTERVAL_S = 5  # the daemon evaluates sensors at most every 5 s anyway
KAFKA_SENSOR_INTERVAL_S = 5
#: How long a requested range may stay pending, with no run in flight, before it is requested again.
RETRY_AFTER_S = 30.0
#: A sensor tick must stay short: it waits at most this long for the ledger.
SENSOR_LEDGER_TIMEOUT_S = 5.0
#: While a process commits its own batches, how long an entry may stay pending before a commit run takes it.
COMMITTER_GRACE_S = 15.0
#: Commits reported as materializations per tick (the rest on the next tick).
REPORT_LIMIT = 50
#: On the first tick, the newest commits of each table never materialized in this instance that it reports.
HISTORY_PER_TABLE = 10
#: The shortest time between two checks runs a pipeline's outbox sensor requests (seconds; default 60).
CHECKS_INTERVAL_ENV = "KRISHIV_CHECKS_INTERVAL_S"
DEFAULT_CHECKS_INTERVAL_S = 60.0

WAITING = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING]
IN_FLIGHT = [*WAITING, dg.DagsterRunStatus.STARTED]


@dataclass
class SensorCursor:
    """What a sensor last requested: per query the highest batch (outbox) or the offsets (Kafka), and when; and
    (outbox) the ``commit_seq`` of the last commit reported, None until the first tick reads it, whether commits
    were reported since the last checks run was requested (``unchecked``), and when that was; and whether the
    commits before the first tick were looked at (``history``: False in a cursor an older Krishiv wrote)."""

    requested: dict[str, int] = field(default_factory=dict)
    requested_at: float = 0.0
    retries: int = 0
    commit_seq: int | None = None
    shown: str | None = None  # what a sensor's check evaluation last showed (a digest), None before the first
    unchecked: bool = False
    checks_requested_at: float = 0.0
    history: bool = False

    @classmethod
    def parse(cls, text: str | None) -> SensorCursor:
        if not text:
            return cls()
        raw = json.loads(text)
        seq = raw.get("commit_seq")
        return cls(
            dict(raw.get("requested", {})),
            float(raw.get("requested_at", 0.0)),
            int(raw.get("retries", 0)),
            None if seq is None else int(seq),
            raw.get("shown"),
            bool(raw.get("unchecked", False)),
            float(raw.get("checks_requested_at", 0.0)),
            bool(raw.get("history", False)),
        )

    def dumps(self) -> str:
        raw: dict[str, object] = {
            "requested": self.requested,
            "requested_at": self.requested_at,
            "retries": self.retries,
        }
        if self.commit_seq is not None:
            raw["commit_seq"] = self.commit_seq
        if self.shown is not None:
            raw["shown"] = self.shown
        if self.unchecked:
            raw["unchecked"] = True
        if self.checks_requested_at:
            raw["checks_requested_at"] = self.checks_requested_at
        if self.history:
            raw["history"] = True
        return json.dumps(raw, sort_keys=True)


def _topics(pipeline: PipelineSpec) -> str:
    """How a sensor's description names what it watches."""
    return f"topic {pipeline.topic!r}" if not pipeline.members else f"topics {', '.join(pipeline.topics)}"


def materialized_by_run(
    commit: CommitRecord,
    key: dg.AssetKey,
    context: SensorEvaluationContext,
    commit_job: str,
    runs: dict[str, dg.DagsterRun | None],
) -> bool:
    """Whether the Dagster run that made ``commit`` materializes ``key`` itself (a run of ``commit_job``, or a run
    whose asset selection has it), so the sensor must not report the commit again. A committer that is no Dagster
    run, a run of another job (a lingering staging run), or a run this instance does not know: False. ``runs``
    caches the runs looked up in this tick."""
    run_id = dagster_run_id(commit.committed_by)
    if run_id is None:
        return False
    if run_id not in runs:
        runs[run_id] = context.instance.get_run_by_id(run_id)
    run = runs[run_id]
    if run is None:
        return False  # reported: at worst a commit shows twice, never not at all
    return run.job_name == commit_job or key in (run.asset_selection or ())


def reported_commits(
    commits: Sequence[CommitRecord],
    keys: Mapping[str, dg.AssetKey],
    pending: Sequence[PendingBatch],
    facts: CommitFacts,
    *,
    first_table: str,
    topic: str,
    versions: Mapping[str, Mapping[str, str]] | None = None,
) -> list[dg.AssetMaterialization]:
    """The materializations for ``commits`` (``keys``: qualified table name -> asset key; the caller has left out
    those a run materialized), an empty batch's included. ``versions``: per table, the data version tags of its
    newest reported commit, the one Dagster compares (:func:`krishiv_assets.data_versions.table_tags`)."""
    waiting = pending_by_table(pending)
    newest = {c.table: i for i, c in enumerate(commits)}
    return [
        commit_materialization(
            c,
            keys[c.table],
            waiting.get(c.table, 0),
            facts,
            first_table,
            topic,
            (versions or {}).get(c.table) if newest[c.table] == i else None,
        )
        for i, c in enumerate(commits)
        if c.table in keys
    ]


def first_tick_history(
    context: SensorEvaluationContext, book: Ledger, keys: Mapping[str, dg.AssetKey], cursor: SensorCursor
) -> list[CommitRecord]:
    """The commits made before the sensor's first tick that it reports (``cursor`` then reads on after them): the
    newest :data:`HISTORY_PER_TABLE` of each table of ``keys`` this instance has never seen materialized, up to the
    cursor's ``commit_seq`` (a cursor an older Krishiv wrote, which reads on from there in the same tick) or else
    the ledger's latest, in commit order."""
    through = book.last_commit_seq() if cursor.commit_seq is None else cursor.commit_seq
    latest = context.instance.get_latest_materialization_events(keys.values())
    never = [table for table, key in keys.items() if latest.get(key) is None]
    history = book.newest_commits(never, HISTORY_PER_TABLE, through)
    cursor.commit_seq, cursor.history = through, True
    return history


def left_to_committer(
    pending: list[PendingBatch], lease: StagerLease | None, now: datetime | None = None
) -> tuple[list[PendingBatch], str | None]:
    """The pending entries a commit run should take, and why the others are left alone (None: none are).

    A live lease whose process commits its own batches takes fresh entries itself; only those pending longer
    than :data:`COMMITTER_GRACE_S` are the safety net's.
    """
    if lease is None or not lease.committing or not pending:
        return pending, None
    now = now or datetime.now(UTC)
    stale = [e for e in pending if (now - e.created_at).total_seconds() > COMMITTER_GRACE_S]
    oldest = max((now - e.created_at).total_seconds() for e in pending)
    return stale, (
        f"{len(pending) - len(stale)} of {len(pending)} pending entries are left to {lease.describe()}: the oldest "
        f"is {oldest:.0f}s old, and a commit run takes what stays pending past {COMMITTER_GRACE_S:.0f}s"
    )


def _has_runs(context: SensorEvaluationContext, job_name: str, statuses: list[dg.DagsterRunStatus]) -> bool:
    return bool(context.instance.get_run_records(filters=dg.RunsFilter(job_name=job_name, statuses=statuses), limit=1))


def commit_request(
    context: SensorEvaluationContext,
    job_name: str,
    run_key_prefix: str,
    what: str,
    cursor: SensorCursor,
    pending: list[PendingBatch],
    left: str | None,
    tags: Mapping[str, str] | None = None,
) -> tuple[dg.RunRequest | None, str]:
    """The commit run of ``job_name`` to request for ``pending`` (updating ``cursor``), or None and why not.

    A batch beyond the cursor's highest requested one (per query) is requested, with a run key naming the range,
    unless a run of the job is waiting to start (the relay commits everything pending when it starts, so that run
    takes them); a range still pending :data:`RETRY_AFTER_S` after its request, with no run in flight, is requested
    again under a new run key. ``what`` names the tables in a reason; ``left`` says why other entries were left;
    ``tags`` go on the run beside ``krishiv/batches``.
    """
    if not pending:
        return None, left or f"no pending outbox entries for {what}"
    batches: dict[str, list[int]] = {}
    for e in pending:
        batches.setdefault(e.query_id, []).append(e.batch_id)
    new = {q: sorted(b for b in ids if b > cursor.requested.get(q, -1)) for q, ids in batches.items()}
    new = {q: ids for q, ids in new.items() if ids}
    if new and _has_runs(context, job_name, WAITING):
        # The relay commits every pending entry when it starts, so the waiting run covers these too.
        return None, f"a commit run of {what} is waiting to start; it will take these"
    if new:
        label = ",".join(f"{q[:8]}:{ids[0]}-{ids[-1]}" for q, ids in new.items())
        cursor.requested.update({q: ids[-1] for q, ids in new.items()})
        cursor.requested_at, cursor.retries = time.time(), 0
        return dg.RunRequest(
            run_key=f"{run_key_prefix}:commit:{label}",
            job_name=job_name,
            tags={**(tags or {}), "krishiv/batches": label},
        ), ""
    waited = time.time() - cursor.requested_at
    if waited < RETRY_AFTER_S or _has_runs(context, job_name, IN_FLIGHT):
        return None, f"{len(pending)} pending entries already requested {waited:.0f}s ago"
    label = ",".join(f"{q[:8]}:{min(ids)}-{max(ids)}" for q, ids in batches.items())
    cursor.requested_at, cursor.retries = time.time(), cursor.retries + 1
    return (
        dg.RunRequest(
            run_key=f"{run_key_prefix}:commit:{label}:retry-{cursor.retries}",
            job_name=job_name,
            tags={**(tags or {}), "krishiv/batches": label},
        ),
        "",
    )


def checks_request(
    context: SensorEvaluationContext,
    job_name: str,
    commit_job_name: str,
    run_key_prefix: str,
    cursor: SensorCursor,
    interval_s: float,
) -> dg.RunRequest | None:
    """The checks run of ``job_name`` to request (updating ``cursor``), or None: only once commits were reported
    since the last one was requested (``cursor.unchecked``), ``interval_s`` after it, and with no checks run in
    flight (it may have checked before the newest reports). A commit every second thus starts one checks run per
    interval, and the last commits reported are checked by the next request however long the topic then stays quiet.

    Nor while a run of ``commit_job_name`` is in flight (or requested on this tick): a checks run that starts after
    a commit run but evaluates before that run materializes the table would hold the checks' newest execution while
    targeting the materialization before, and the UI would show the table's checks as not evaluated until some later
    run. The commit run checks what it commits; the next tick after it asks for the checks run."""
    if not cursor.unchecked or time.time() - cursor.checks_requested_at < interval_s:
        return None
    if _has_runs(context, job_name, IN_FLIGHT) or _has_runs(context, commit_job_name, IN_FLIGHT):
        return None
    cursor.unchecked, cursor.checks_requested_at = False, time.time()
    return dg.RunRequest(
        run_key=f"{run_key_prefix}:checks:{cursor.commit_seq}",
        job_name=job_name,
        tags={"krishiv/checked-through-commit": str(cursor.commit_seq)},
    )


def checks_interval_s() -> float:
    """``KRISHIV_CHECKS_INTERVAL_S``, else :data:`DEFAULT_CHECKS_INTERVAL_S` (read when the code location loads)."""
    return seconds_from_env(CHECKS_INTERVAL_ENV, DEFAULT_CHECKS_INTERVAL_S)


def outbox_sensor(
    spec: KrishivSpec,
    pipeline: PipelineSpec,
    job: dg.UnresolvedAssetJobDefinition,
    checks_job: dg.UnresolvedAssetJobDefinition,
    interval_s: float | None = None,
) -> dg.SensorDefinition:
    """``job`` commits the pipeline's tables (and checks them); ``checks_job`` only checks them, after commits this
    sensor reported, at most every ``interval_s`` (default :func:`checks_interval_s`)."""
    tables = sorted(qualified(spec, t) for t in pipeline.all_tables)  # every route of a fan-out, and the rejects
    pipeline_keys = PipelineKeys.of(spec, pipeline)
    keys = {qualified(spec, name): key for name, key in pipeline_keys.tables.items()}
    staged_key = pipeline_keys.staged
    first = qualified(spec, pipeline.tables[0])  # its entries carry each batch's counts
    what = f"{pipeline.name}'s {len(tables)} tables"
    interval = checks_interval_s() if interval_s is None else interval_s

    @dg.sensor(
        name=f"{pipeline.name}_outbox_sensor",
        jobs=[job, checks_job],
        minimum_interval_seconds=OUTBOX_SENSOR_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            f"Requests a commit run of {what} for pending batches (only those left pending past "
            f"{COMMITTER_GRACE_S:.0f}s while a krishiv run commits its own), reports the commits no commit run "
            f"materialized as materializations of the tables, and then a run of {checks_job.name} (at most one "
            f"every {interval:g}s) so their checks are evaluated."
        ),
    )
    def sensor(
        context: SensorEvaluationContext, ledger: LedgerResource, iceberg: IcebergCatalogResource, kafka: KafkaResource
    ) -> dg.SensorResult | dg.SkipReason:
        cursor = SensorCursor.parse(context.cursor)
        try:
            book = ledger.ledger(SENSOR_LEDGER_TIMEOUT_S)
            pending = book.pending_batches(tables, pipeline=pipeline.name)  # a removed route's entries too
            lease = book.live_lease(pipeline.name) if pending else None
            history = first_tick_history(context, book, keys, cursor) if not cursor.history else []
            since = cursor.commit_seq or 0
            commits = book.commits_since(since, tables, REPORT_LIMIT)
            last = commits[-1].commit_seq if commits else book.last_commit_seq()
            if commits or last < since:  # read on; or a new ledger, numbered from 0 again
                cursor.commit_seq = last
            commits = history + commits
        except (LedgerBusyError, LedgerCorrupt) as exc:
            return dg.SkipReason(str(exc))
        runs: dict[str, dg.DagsterRun | None] = {}
        unreported = [c for c in commits if not materialized_by_run(c, keys[c.table], context, job.name, runs)]
        facts = gather_facts(
            unreported,
            ledger=book,
            first_table=first,
            load_table=lambda name: iceberg.catalog().load_table(name),
            latest_offsets=lambda: kafka.latest_offsets(pipeline.topic, spec.kafka.consumer_settings()),
            warn=context.log.warning,
        )
        try:  # the data versions (krishiv_assets/data_versions.py): what is staged, and what each table committed
            staged = staged_report(context.instance, staged_key, ledger_offsets(book, first, pipeline))
            versions = {
                t: table_tags(staged_key, ledger_offsets(book, t, pipeline, COMMITTED))
                for t in {c.table for c in unreported}
            }
        except (LedgerBusyError, LedgerCorrupt) as exc:
            return dg.SkipReason(str(exc))
        reports = reported_commits(
            unreported, keys, pending, facts, first_table=first, topic=pipeline.topic, versions=versions
        )
        events = ([staged] if staged is not None else []) + reports
        cursor.unchecked = cursor.unchecked or bool(reports)
        reported = f"; reported {len(reports)} commits no commit run materialized" if reports else ""
        due, left = left_to_committer(pending, lease)
        request, reason = commit_request(context, job.name, pipeline.name, what, cursor, due, left)
        checks = (
            None if request else checks_request(context, checks_job.name, job.name, pipeline.name, cursor, interval)
        )
        requests = [r for r in (request, checks) if r is not None]
        if not requests and not events and cursor.dumps() == SensorCursor.parse(context.cursor).dumps():
            return dg.SkipReason(reason)
        return dg.SensorResult(
            run_requests=requests or None,
            skip_reason=None if requests else (reason or "") + reported,
            asset_events=events,
            cursor=cursor.dumps(),
        )

    return sensor


def kafka_sensor(
    spec: KrishivSpec, pipeline: PipelineSpec, job: dg.UnresolvedAssetJobDefinition
) -> dg.SensorDefinition:
    table = qualified(spec, pipeline.tables[0])  # every table has an entry per batch; the first carries its counts

    @dg.sensor(
        name=f"{pipeline.name}_kafka_sensor",
        job=job,
        minimum_interval_seconds=KAFKA_SENSOR_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Requests a staging run of {pipeline.name} when {_topics(pipeline)} has new records.",
    )
    def sensor(
        context: SensorEvaluationContext, kafka: KafkaResource, ledger: LedgerResource
    ) -> dg.SensorResult | dg.SkipReason:
        from spark_jobs.errors import KafkaSourceError

        try:
            book = ledger.ledger(SENSOR_LEDGER_TIMEOUT_S)
            lease = book.live_lease(pipeline.name)
            staged = staged_offsets(book, table, pipeline)
        except (LedgerBusyError, LedgerCorrupt) as exc:
            return dg.SkipReason(str(exc))
        try:
            latest = latest_offsets(spec, pipeline, kafka)
        except (KafkaSourceError, ConfigError) as exc:  # ConfigError: a ${VARIABLE} of [kafka.properties] is unset
            return dg.SkipReason(f"broker {kafka.bootstrap_servers}: {exc}")
        reported = topic_reports(context.instance, pipeline, latest, staged)

        def skip(reason: str) -> dg.SensorResult | dg.SkipReason:
            return dg.SensorResult(skip_reason=reason, asset_events=reported) if reported else dg.SkipReason(reason)

        if lease is not None:
            return skip(f"{pipeline.name} is being staged by {lease.describe()}")

        behind = {p: end - staged.get(p, 0) for p, end in latest.items() if end > staged.get(p, 0)}
        if not behind:
            return skip(f"topic {', '.join(pipeline.topics)}: nothing beyond the staged offsets {staged}")
        cursor = SensorCursor.parse(context.cursor)
        if _has_runs(context, job.name, IN_FLIGHT):
            return skip(f"a staging run of {pipeline.name} is in flight")
        if latest == cursor.requested and time.time() - cursor.requested_at < RETRY_AFTER_S:
            return skip(f"staging up to {latest} was requested {time.time() - cursor.requested_at:.0f}s ago")
        retries = cursor.retries + 1 if latest == cursor.requested else 0
        digest = hashlib.sha256(json.dumps(latest, sort_keys=True).encode()).hexdigest()[:12]
        records = sum(behind.values())
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    run_key=f"{pipeline.name}:stage:{digest}" + (f":retry-{retries}" if retries else ""),
                    tags={"krishiv/new-records": str(records)},
                )
            ],
            cursor=SensorCursor(latest, time.time(), retries).dumps(),
            asset_events=reported,
        )

    return sensor


def topic_reports(
    instance: dg.DagsterInstance, pipeline: PipelineSpec, latest: Mapping[str, int], staged: Mapping[str, int]
) -> list[dg.AssetMaterialization]:
    """A report of each topic of the pipeline whose offsets changed since its last one (``latest`` and
    ``staged`` with :func:`latest_offsets`'s labels): the topic's data version (krishiv_assets/data_versions.py)."""
    reports = []
    for topic in pipeline.topics:
        prefix = f"{topic}/" if pipeline.members else ""

        def of(offsets: Mapping[str, int], prefix: str = prefix) -> dict[str, int]:
            return {k.removeprefix(prefix): o for k, o in offsets.items() if k.startswith(prefix)}

        held = topic_held(of(latest), of(staged))
        if held and (event := topic_report(instance, dg.AssetKey(["kafka", topic]), held)) is not None:
            reports.append(event)
    return reports
