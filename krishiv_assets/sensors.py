"""The sensors that keep a pipeline's tables current without anyone clicking.

- The **outbox sensor** is the continuous commit loop: when the ledger holds PENDING entries of any of the
  pipeline's tables (``pipeline.all_tables``: a fan-out's routes too) beyond the cursor (the highest batch
  id already requested, per query), it requests a commit run whose run key names the batch range, unless a
  commit run is still waiting to start (the relay commits everything pending when it starts, so that run
  takes them). A range whose run failed is requested again,
  with a new run key, once no commit run is in flight and ``RETRY_AFTER_S`` has passed.
- The **Kafka sensor** requests a staging run when the topic holds records beyond what the ledger has
  staged, unless a staging run is in flight or ``krishiv run`` stages the pipeline continuously (it holds
  the pipeline's stager lease).

Both skip with a reason that names what they saw, including an unreachable broker, a busy ledger or a file
that is not a ledger. Each tick reads only what it needs from the ledger (PENDING keys, or the staged end
offsets per partition), so it stays short however many batches the ledger has recorded.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

import dagster as dg
from dagster import SensorEvaluationContext

from krishiv_assets.resources import KafkaResource, LedgerResource
from krishiv_core.catalog import qualified
from krishiv_core.errors import ConfigError
from krishiv_core.spec import KrishivSpec, PipelineSpec
from outbox.errors import LedgerBusyError, LedgerCorrupt

OUTBOX_SENSOR_INTERVAL_S = 5  # the daemon evaluates sensors at most every 5 s anyway
KAFKA_SENSOR_INTERVAL_S = 5
#: How long a requested range may stay pending, with no run in flight, before it is requested again.
RETRY_AFTER_S = 30.0
#: A sensor tick must stay short: it waits at most this long for the ledger.
SENSOR_LEDGER_TIMEOUT_S = 5.0

WAITING = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING]
IN_FLIGHT = [*WAITING, dg.DagsterRunStatus.STARTED]


@dataclass
class SensorCursor:
    """What a sensor last requested: per query the highest batch (outbox) or the offsets (Kafka), and when."""

    requested: dict[str, int] = field(default_factory=dict)
    requested_at: float = 0.0
    retries: int = 0

    @classmethod
    def parse(cls, text: str | None) -> SensorCursor:
        if not text:
            return cls()
        raw = json.loads(text)
        return cls(dict(raw.get("requested", {})), float(raw.get("requested_at", 0.0)), int(raw.get("retries", 0)))

    def dumps(self) -> str:
        return json.dumps(
            {"requested": self.requested, "requested_at": self.requested_at, "retries": self.retries}, sort_keys=True
        )


def _has_runs(context: SensorEvaluationContext, job_name: str, statuses: list[dg.DagsterRunStatus]) -> bool:
    return bool(context.instance.get_run_records(filters=dg.RunsFilter(job_name=job_name, statuses=statuses), limit=1))


def outbox_sensor(
    spec: KrishivSpec, pipeline: PipelineSpec, job: dg.UnresolvedAssetJobDefinition
) -> dg.SensorDefinition:
    tables = sorted(qualified(spec, t) for t in pipeline.all_tables)  # every route of a fan-out, and the rejects
    what = f"{pipeline.name}'s {len(tables)} tables"

    @dg.sensor(
        name=f"{pipeline.name}_outbox_sensor",
        job=job,
        minimum_interval_seconds=OUTBOX_SENSOR_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Requests a commit run of {what} whenever the outbox holds pending batches.",
    )
    def sensor(context: SensorEvaluationContext, ledger: LedgerResource) -> dg.SensorResult | dg.SkipReason:
        try:
            pending = ledger.ledger(SENSOR_LEDGER_TIMEOUT_S).pending_batches(tables)
        except (LedgerBusyError, LedgerCorrupt) as exc:
            return dg.SkipReason(str(exc))
        if not pending:
            return dg.SkipReason(f"no pending outbox entries for {what}")
        cursor = SensorCursor.parse(context.cursor)
        batches: dict[str, list[int]] = {}
        for e in pending:
            batches.setdefault(e.query_id, []).append(e.batch_id)
        new = {q: sorted(b for b in ids if b > cursor.requested.get(q, -1)) for q, ids in batches.items()}
        new = {q: ids for q, ids in new.items() if ids}
        if new and _has_runs(context, job.name, WAITING):
            # The relay commits every pending entry when it starts, so the waiting run covers these too.
            return dg.SkipReason(f"a commit run of {what} is waiting to start; it will take these")
        if new:
            label = ",".join(f"{q[:8]}:{ids[0]}-{ids[-1]}" for q, ids in new.items())
            cursor.requested.update({q: ids[-1] for q, ids in new.items()})
            cursor.requested_at, cursor.retries = time.time(), 0
            return dg.SensorResult(
                run_requests=[
                    dg.RunRequest(run_key=f"{pipeline.name}:commit:{label}", tags={"krishiv/batches": label})
                ],
                cursor=cursor.dumps(),
            )
        waited = time.time() - cursor.requested_at
        if waited < RETRY_AFTER_S or _has_runs(context, job.name, IN_FLIGHT):
            return dg.SkipReason(f"{len(pending)} pending entries already requested {waited:.0f}s ago")
        label = ",".join(f"{q[:8]}:{min(ids)}-{max(ids)}" for q, ids in batches.items())
        cursor.requested_at, cursor.retries = time.time(), cursor.retries + 1
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    run_key=f"{pipeline.name}:commit:{label}:retry-{cursor.retries}", tags={"krishiv/batches": label}
                )
            ],
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
