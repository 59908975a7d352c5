"""Pipelines removed from the spec while the ledger holds their pending batches: one fixed asset, check, job and
sensor, the same whatever the spec, so the definitions do not change as pipelines come and go.

The code location is built from the spec when Dagster loads it: a pipeline the spec no longer has has no assets,
jobs or sensors any more, yet the batches it staged before it was removed are PENDING in the ledger, each entry
naming the table it was staged for. These definitions commit them there, as ``krishiv commit`` does:

- ``krishiv/removed_pipelines``: materializing it commits the pending batches of every pipeline the spec no
  longer has, to the tables they were staged for (:func:`krishiv.operations.commit_pipelines` with
  ``removed_pipelines``: the commit relay of ``krishiv commit``, which looks for each batch in the table first, so
  none is committed twice whoever committed before). A line per removed pipeline names it and its batches before
  the commit, and one after says what went where; a table that refuses stops only itself, and the run fails after
  the others are committed and the asset materialized. Metadata: per pipeline its tables and batches, the totals,
  what stays pending.
- ``nothing_pending``, a warning check on it: no removed pipeline has pending batches; failing, it names each one
  with its batches and tables. It runs after the asset in each commit run, and the sensor reports it whenever the
  pending batches of removed pipelines change, so the UI shows them before any run.
- ``krishiv_removed_pipelines_commit_job``, requested by ``krishiv_removed_pipelines_sensor`` as a pipeline's
  outbox sensor requests its commit job (:func:`krishiv_assets.sensors.commit_request`): a run key naming the
  batch range, again if it stays pending with no run in flight, and fresh batches left to a live process that
  still stages and commits the removed pipeline (a ``krishiv run`` started before the spec changed).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import dagster as dg
from dagster import SensorEvaluationContext

from krishiv_assets.assets import run_failure
from krishiv_assets.commit_reports import dagster_committer
from krishiv_assets.resources import IcebergCatalogResource, LedgerResource
from krishiv_assets.sensors import (
    OUTBOX_SENSOR_INTERVAL_S,
    SENSOR_LEDGER_TIMEOUT_S,
    SensorCursor,
    commit_request,
    left_to_committer,
)
from krishiv_core.errors import KrishivError
from krishiv_core.spec import KrishivSpec
from outbox.errors import LedgerBusyError, LedgerCorrupt
from outbox.ledger import Ledger
from outbox.ledger.entries import PendingBatch

if TYPE_CHECKING:  # outbox.relay loads pyiceberg: a commit run imports it when it commits
    from outbox.relay import TableCommitReport

REMOVED_KEY = dg.AssetKey(["krishiv", "removed_pipelines"])
REMOVED_GROUP = "krishiv"
CHECK_NAME = "nothing_pending"
JOB_NAME = "krishiv_removed_pipelines_commit_job"
SENSOR_NAME = "krishiv_removed_pipelines_sensor"
#: One commit run of removed pipelines at a time (``dagster.yaml``'s default pool limit).
POOL = "krishiv_commit_removed_pipelines"
#: The run key prefix of the sensor's requests.
RUN_KEY_PREFIX = "removed_pipelines"
WHAT = "pipelines removed from the spec"
NOTHING = "no pipeline removed from the spec has pending batches"


def removed_pending(spec: KrishivSpec, ledger: Ledger) -> dict[str, list[PendingBatch]]:
    """Each pipeline the spec no longer has with the keys of its PENDING entries (every table they name)."""
    from krishiv.operations import removed_pipelines_pending

    found = {name: ledger.pending_batches(pipeline=name) for name in removed_pipelines_pending(spec, ledger)}
    return {name: batches for name, batches in found.items() if batches}  # committed meanwhile by another


def ranges(ids: Sequence[int]) -> str:
    """Batch ids as ranges: ``0-3, 5, 7-8``."""
    spans: list[list[int]] = []
    for i in sorted(set(ids)):
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _batches(ids: Sequence[int]) -> str:
    return f"batch{'' if len(set(ids)) == 1 else 'es'} {ranges(ids)}"


def batches_text(batches: Sequence[PendingBatch]) -> str:
    """The distinct batches among ``batches`` (a batch has an entry per table): ``2 batches (0-1)``; per query when
    there are several."""
    by_query: dict[str, set[int]] = {}
    for b in batches:
        by_query.setdefault(b.query_id, set()).add(b.batch_id)
    count = sum(len(ids) for ids in by_query.values())
    if len(by_query) == 1:
        shown = ranges(list(next(iter(by_query.values()))))
    else:
        shown = "; ".join(f"{ranges(list(ids))} of query {q[:8]}" for q, ids in sorted(by_query.items()))
    return f"{count} batch{'' if count == 1 else 'es'} ({shown})"


def describe(name: str, batches: Sequence[PendingBatch]) -> str:
    """One line naming a removed pipeline, its pending batches and the tables they were staged for."""
    tables = sorted({b.table for b in batches})
    return f"{name} (no longer in the spec): {batches_text(batches)} pending for {', '.join(tables)}"


def _digest(pending: Mapping[str, Sequence[PendingBatch]]) -> str:
    keys = sorted((name, b.query_id, b.table, b.batch_id) for name, batches in pending.items() for b in batches)
    return hashlib.sha256(json.dumps(keys).encode()).hexdigest()[:16]


def _check_outcome(
    pending: Mapping[str, Sequence[PendingBatch]], now: datetime | None = None
) -> tuple[bool, str, dict[str, object]]:
    """``nothing_pending``'s result: passed, its description and its metadata."""
    now = now or datetime.now(UTC)
    ages = [(now - b.created_at).total_seconds() for batches in pending.values() for b in batches]
    metadata: dict[str, object] = {
        "pipelines": len(pending),
        "pending_batches": sum(len({(b.query_id, b.batch_id) for b in bs}) for bs in pending.values()),
        "pending_entries": sum(len(bs) for bs in pending.values()),
        "oldest_pending_age_s": float(max(ages, default=0.0)),
        "removed_pipelines": dg.MetadataValue.json(
            {
                name: {"batches": batches_text(bs), "tables": sorted({b.table for b in bs})}
                for name, bs in pending.items()
            }
        ),
    }
    if not pending:
        return True, NOTHING, metadata
    description = (
        "; ".join(describe(name, bs) for name, bs in pending.items())
        + f"; {SENSOR_NAME} requests a commit run (or run krishiv commit)"
    )
    return False, description, metadata


def removed_pipelines_asset(spec: KrishivSpec) -> dg.AssetsDefinition:
    @dg.asset(
        key=REMOVED_KEY,
        group_name=REMOVED_GROUP,
        kinds={"iceberg", "duckdb"},
        pool=POOL,
        description=(
            "The pending batches of pipelines removed from the spec, committed to the tables they were staged for "
            "by the commit relay of krishiv commit (each batch looked for in the table first, none committed "
            f"twice). {SENSOR_NAME} requests a run when the ledger holds some."
        ),
    )
    def removed_pipelines(
        context,  # Dagster rejects a string annotation here (PEP 563), so the context stays unannotated
        iceberg: IcebergCatalogResource,
        ledger: LedgerResource,
    ) -> Iterator[dg.MaterializeResult]:
        from krishiv.operations import TablesRefused, commit_pipelines

        refused: TablesRefused | None = None
        try:
            book = ledger.ledger()
            pending = removed_pending(spec, book)
            if not pending:
                context.log.info(NOTHING)
            for name, batches in pending.items():
                context.log.info(f"{describe(name, batches)}: committing them to the tables they were staged for")
            reports = []
            if pending:
                by = dagster_committer(context.run.run_id)
                try:
                    reports = commit_pipelines(
                        spec, [], catalog=iceberg.catalog(), ledger=book, committed_by=by, removed_pipelines=True
                    )
                except TablesRefused as exc:  # every other table was committed: materialized below, then the run fails
                    refused, reports = exc, exc.reports
            left = removed_pending(spec, book)
        except KrishivError as exc:
            raise run_failure(exc) from exc
        by_table = {r.table: r for r in reports}
        shown: dict[str, dict[str, object]] = {}
        for name, batches in pending.items():
            outcomes, tables = [], {}
            for table in sorted({b.table for b in batches}):
                report = by_table.get(table)
                if report is None:
                    continue
                tables[table] = {
                    "committed": report.committed,
                    "found_committed": report.recovered,
                    "empty": report.empty,
                    "rows_committed": report.records,
                    **({"refused": report.refused} if report.refused else {}),
                }
                outcomes.append(_outcome(report))
            still = f"{batches_text(left[name])} still pending" if name in left else "nothing of it is pending now"
            line = f"{name} (no longer in the spec): {'; '.join(outcomes)}; {still}"
            if name in left:
                context.log.error(line)
            else:
                context.log.info(line)
            shown[name] = {"batches": batches_text(batches), "tables": tables}
        yield dg.MaterializeResult(
            metadata={
                "pipelines": len(pending),
                "snapshots_committed": sum(len(r.committed) for r in reports),
                "batches_found_committed": sum(len(r.recovered) for r in reports),
                "empty_batches": sum(len(r.empty) for r in reports),
                "rows_committed": sum(r.records for r in reports),
                "tables_refused": sum(1 for r in reports if r.refused),
                "pending_entries": sum(len(bs) for bs in left.values()),
                "removed_pipelines": dg.MetadataValue.json(shown),
            }
        )
        if refused is not None:
            raise run_failure(refused)

    return removed_pipelines


def _outcome(report: TableCommitReport) -> str:
    """What a commit run did to one table, in a few words."""
    parts = []
    if report.committed:
        parts.append(f"{_batches(report.committed)} committed ({report.records} rows)")
    if report.recovered:
        parts.append(f"{_batches(report.recovered)} found already there")
    if report.empty:
        parts.append(f"{_batches(report.empty)} with nothing to publish")
    if report.refused:
        parts.append(f"refused: {report.refused}")
    return f"{report.table}: {', '.join(parts) or 'nothing left to commit (committed meanwhile by another)'}"


def removed_pipelines_check(spec: KrishivSpec) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=REMOVED_KEY,
        name=CHECK_NAME,
        description=(
            "No pipeline removed from the spec has pending batches; failing, it names each one with its batches and "
            f"tables. {SENSOR_NAME} reports it whenever they change."
        ),
    )
    def nothing_pending(ledger: LedgerResource) -> dg.AssetCheckResult:
        passed, description, metadata = _check_outcome(removed_pending(spec, ledger.ledger()))
        return dg.AssetCheckResult(
            passed=passed, severity=dg.AssetCheckSeverity.WARN, description=description, metadata=metadata
        )

    return nothing_pending


def removed_pipelines_job() -> dg.UnresolvedAssetJobDefinition:
    return dg.define_asset_job(
        JOB_NAME,
        selection=dg.AssetSelection.assets(REMOVED_KEY),  # and its check, after it
        tags={"krishiv/step": "commit"},
        executor_def=dg.in_process_executor,
        description=(
            "Commit the pending batches of pipelines removed from the spec to the tables they were staged for "
            f"({SENSOR_NAME} starts it)."
        ),
    )


def removed_pipelines_sensor(spec: KrishivSpec, job: dg.UnresolvedAssetJobDefinition) -> dg.SensorDefinition:
    @dg.sensor(
        name=SENSOR_NAME,
        job=job,
        minimum_interval_seconds=OUTBOX_SENSOR_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Requests a commit run when the ledger holds pending batches of pipelines the spec no longer has, and "
            f"reports the {CHECK_NAME} check of {REMOVED_KEY.to_user_string()} whenever they change."
        ),
    )
    def sensor(context: SensorEvaluationContext, ledger: LedgerResource) -> dg.SensorResult | dg.SkipReason:
        cursor = SensorCursor.parse(context.cursor)
        try:
            book = ledger.ledger(SENSOR_LEDGER_TIMEOUT_S)
            pending = removed_pending(spec, book)
            leases = {name: book.live_lease(name) for name in pending}
        except (LedgerBusyError, LedgerCorrupt) as exc:
            return dg.SkipReason(str(exc))
        events: list[dg.AssetCheckEvaluation] = []
        digest = _digest(pending)
        if digest != cursor.shown:
            passed, description, metadata = _check_outcome(pending)
            events.append(
                dg.AssetCheckEvaluation(
                    asset_key=REMOVED_KEY,
                    check_name=CHECK_NAME,
                    passed=passed,
                    severity=dg.AssetCheckSeverity.WARN,
                    description=description,
                    metadata=metadata,
                )
            )
            cursor.shown = digest
        due: list[PendingBatch] = []
        left: list[str] = []
        for name, batches in pending.items():
            taken, why = left_to_committer(batches, leases[name])
            due += taken
            if why:
                left.append(f"{name}: {why}")
        tags = {"krishiv/pipelines": ",".join(pending)} if pending else None
        request, reason = commit_request(
            context, job.name, RUN_KEY_PREFIX, WHAT, cursor, due, "; ".join(left) or None, tags
        )
        if pending:
            what = "; ".join(describe(name, batches) for name, batches in pending.items())
            reason = f"{what}; {reason}" if reason else what
            for name, batches in pending.items():
                if request is not None:
                    context.log.info(f"{describe(name, batches)}: requesting a commit run ({request.run_key})")
        if request is None and not events and cursor.dumps() == SensorCursor.parse(context.cursor).dumps():
            return dg.SkipReason(reason)
        return dg.SensorResult(
            run_requests=[request] if request is not None else None,
            skip_reason=None if request is not None else reason,
            asset_events=events,
            cursor=cursor.dumps(),
        )

    return sensor
