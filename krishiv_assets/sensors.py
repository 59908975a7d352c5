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
  Each tick also reports the commits made outside Dagster's runs (by ``krishiv run``'s committer or ``krishiv
  commit``) since the last one reported, read from the ledger by their ``commit_seq``, as materializations of
  the table's asset (a sensor result's asset events): the UI's plots stay current without a run per batch.
  A Dagster commit run materializes what it commits itself, so its commits are not reported again. At most
  ``REPORT_LIMIT`` per tick; the rest on the next one. A cursor without a ``commit_seq`` (a new sensor, or one
  written by an older Krishiv) starts at the ledger's latest commit: history is not replayed into the UI.
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

from krishiv_assets.assets import DAGSTER_COMMITTER, PipelineKeys
from krishiv_assets.resources import KafkaResource, LedgerResource
from krishiv_core.catalog import qualified
from krishiv_core.entries import OffsetRanges
from krishiv_core.errors import ConfigError
from krishiv_core.spec import KrishivSpec, PipelineSpec
from outbox.errors import LedgerBusyError, LedgerCorrupt
from outbox.ledger import CommitRecord, PendingBatch, StagerLease

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
#: Partitions named in a reported commit's offsets before the rest are counted.
SHOWN_PARTITIONS = 8

WAITING = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING]
IN_FLIGHT = [*WAITING, dg.DagsterRunStatus.STARTED]


@dataclass
class SensorCursor:
    """What a sensor last requested: per query the highest batch (outbox) or the offsets (Kafka), and when; and
    (outbox) the ``commit_seq`` of the last commit reported, None until the first tick reads it."""

    requested: dict[str, int] = field(default_factory=dict)
    requested_at: float = 0.0
    retries: int = 0
    commit_seq: int | None = None
    shown: str | None = None  # what a sensor's check evaluation last showed (a digest), None before the first

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
        return json.dumps(raw, sort_keys=True)


def committed_outside_dagster(commit: CommitRecord) -> bool:
    """A commit no Dagster run materialized: made by ``krishiv run``'s committer or ``krishiv commit``."""
    return not (commit.committed_by or "").startswith(DAGSTER_COMMITTER)


def offsets_text(offsets: OffsetRanges) -> str:
    """A batch's offsets in a line: ``orders 0:[10,20) 1:[5,9)``, the first partitions only when there are many."""
    parts = []
    for topic, ranges in sorted(offsets.items()):
        shown = [f"{p}:[{start},{end})" for p, (start, end) in list(ranges.items())[:SHOWN_PARTITIONS]]
        more = len(ranges) - len(shown)
        parts.append(" ".join([topic, *shown] + ([f"(+{more} partitions)"] if more > 0 else [])))
    return "; ".join(parts)


def commit_materialization(commit: CommitRecord, key: dg.AssetKey, pending: int) -> dg.AssetMaterialization:
    """A commit made outside Dagster as a materialization of its table's asset; the keys the commit run's own
    materializations use (``rows_committed``, ``snapshots_committed``, ``pending_entries``) continue its plots."""
    metadata: dict[str, object] = {
        "batch_id": commit.batch_id,
        "snapshot_id": commit.committed_snapshot_id,
        "snapshots_committed": 1,
        "rows_committed": commit.record_count,
        "query_id": commit.query_id,
        "kafka_offsets": offsets_text(commit.offsets),
        "staged_to_committed_s": round(commit.staged_to_committed_s, 3),
        "committed_by": commit.committed_by or "unknown",
        "committed_at": dg.MetadataValue.timestamp(commit.committed_at),
        "pending_entries": pending,
    }
    if commit.commit_ms is not None:
        metadata["commit_latency_ms"] = round(commit.commit_ms, 2)
    return dg.AssetMaterialization(
        asset_key=key,
        description=f"batch {commit.batch_id} committed by {commit.committed_by or 'another process'}",
        metadata=metadata,
    )


def reported_commits(
    commits: Sequence[CommitRecord], keys: Mapping[str, dg.AssetKey], pending: Sequence[PendingBatch]
) -> list[dg.AssetMaterialization]:
    """The materializations for ``commits`` (``keys``: qualified table name -> asset key): those that published a
    snapshot, made outside Dagster's runs."""
    waiting: dict[str, int] = {}
    for e in pending:
        waiting[e.table] = waiting.get(e.table, 0) + 1
    return [
        commit_materialization(c, keys[c.table], waiting.get(c.table, 0))
        for c in commits
        if c.committed_snapshot_id is not None and committed_outside_dagster(c) and c.table in keys
    ]


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
            run_key=f"{run_key_prefix}:commit:{label}", tags={**(tags or {}), "krishiv/batches": label}
        ), ""
    waited = time.time() - cursor.requested_at
    if waited < RETRY_AFTER_S or _has_runs(context, job_name, IN_FLIGHT):
        return None, f"{len(pending)} pending entries already requested {waited:.0f}s ago"
    label = ",".join(f"{q[:8]}:{min(ids)}-{max(ids)}" for q, ids in batches.items())
    cursor.requested_at, cursor.retries = time.time(), cursor.retries + 1
    return (
        dg.RunRequest(
            run_key=f"{run_key_prefix}:commit:{label}:retry-{cursor.retries}",
            tags={**(tags or {}), "krishiv/batches": label},
        ),
        "",
    )


def outbox_sensor(
    spec: KrishivSpec, pipeline: PipelineSpec, job: dg.UnresolvedAssetJobDefinition
) -> dg.SensorDefinition:
    tables = sorted(qualified(spec, t) for t in pipeline.all_tables)  # every route of a fan-out, and the rejects
    keys = {qualified(spec, name): key for name, key in PipelineKeys.of(spec, pipeline).tables.items()}
    what = f"{pipeline.name}'s {len(tables)} tables"

    @dg.sensor(
        name=f"{pipeline.name}_outbox_sensor",
        job=job,
        minimum_interval_seconds=OUTBOX_SENSOR_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            f"Requests a commit run of {what} for pending batches (only those left pending past "
            f"{COMMITTER_GRACE_S:.0f}s while a krishiv run commits its own), and reports commits made outside "
            "Dagster as materializations of the tables."
        ),
    )
    def sensor(context: SensorEvaluationContext, ledger: LedgerResource) -> dg.SensorResult | dg.SkipReason:
        cursor = SensorCursor.parse(context.cursor)
        try:
            book = ledger.ledger(SENSOR_LEDGER_TIMEOUT_S)
            pending = book.pending_batches(tables, pipeline=pipeline.name)  # a removed route's entries too
            lease = book.live_lease(pipeline.name) if pending else None
            commits = [] if cursor.commit_seq is None else book.commits_since(cursor.commit_seq, tables, REPORT_LIMIT)
            if not commits:
                last = book.last_commit_seq()
                if cursor.commit_seq is None or last < cursor.commit_seq:  # a first tick; or a new ledger
                    cursor.commit_seq = last
        except (LedgerBusyError, LedgerCorrupt) as exc:
            return dg.SkipReason(str(exc))
        events = reported_commits(commits, keys, pending)
        if commits:
            cursor.commit_seq = commits[-1].commit_seq
        reported = f"; reported {len(events)} commits made outside Dagster" if events else ""
        due, left = left_to_committer(pending, lease)
        request, reason = commit_request(context, job.name, pipeline.name, what, cursor, due, left)
        if request is None and not events and cursor.dumps() == SensorCursor.parse(context.cursor).dumps():
            return dg.SkipReason(reason)
        return dg.SensorResult(
            run_requests=[request] if request is not None else None,
            skip_reason=None if request is not None else (reason or "") + reported,
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
        description=f"Requests a staging run of {pipeline.name} when topic {pipeline.topic!r} has new records.",
    )
    def sensor(
        context: SensorEvaluationContext, kafka: KafkaResource, ledger: LedgerResource
    ) -> dg.SensorResult | dg.SkipReason:
        from spark_jobs.errors import KafkaSourceError

        try:
            book = ledger.ledger(SENSOR_LEDGER_TIMEOUT_S)
            lease = book.live_lease(pipeline.name)
            if lease is not None:
                return dg.SkipReason(f"{pipeline.name} is being staged by {lease.describe()}")
            staged = book.end_offsets(table, pipeline.topic)
        except (LedgerBusyError, LedgerCorrupt) as exc:
            return dg.SkipReason(str(exc))
        try:
            latest = kafka.latest_offsets(pipeline.topic, spec.kafka.consumer_settings())
        except (KafkaSourceError, ConfigError) as exc:  # ConfigError: a ${VARIABLE} of [kafka.properties] is unset
            return dg.SkipReason(f"broker {kafka.bootstrap_servers}: {exc}")
        behind = {p: end - staged.get(p, 0) for p, end in latest.items() if end > staged.get(p, 0)}
        if not behind:
            return dg.SkipReason(f"topic {pipeline.topic}: nothing beyond the staged offsets {staged}")
        cursor = SensorCursor.parse(context.cursor)
        if _has_runs(context, job.name, IN_FLIGHT):
            return dg.SkipReason(f"a staging run of {pipeline.name} is in flight")
        if latest == cursor.requested and time.time() - cursor.requested_at < RETRY_AFTER_S:
            return dg.SkipReason(f"staging up to {latest} was requested {time.time() - cursor.requested_at:.0f}s ago")
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
        )

    return sensor
