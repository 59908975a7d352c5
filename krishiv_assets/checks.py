"""Asset checks on every table of a pipeline: each result carries the metadata that explains a failure.

On each row table, by the pipeline's kind (blocking: a row counted twice stops what depends on the table):

- ``no_duplicate_windows`` (windowed): no two rows share ``(window_start, window_end, *group_by)``; names the
  windows and the snapshots that added them;
- ``no_duplicate_keys`` (upsert): no two rows share the pipeline's ``key``; names the keys and the snapshots;
- ``offsets_at_most_once`` (events): each Kafka offset of the topic is in at most one row across the
  pipeline's tables (its routes and its rejects), when the tables carry ``_kafka_partition`` and
  ``_kafka_offset``; without them, the table holds exactly the rows the ledger committed to it.

On every table, rejects included:

- ``lineage_linear``: each snapshot's parent is the previous one, one snapshot per batch, in batch order; Krishiv's
  maintenance snapshots (compactions) are counted apart, carry no batch and add exactly the rows they remove.

Every check stays right across maintenance: a compaction moves rows without adding any, so the row counts still
agree with the ledger, and a duplicate found in a compacted file names the snapshots that added its rows.
- ``ledger_agreement``: every COMMITTED entry is in the table (a merge batch that only deletes too), every
  Krishiv snapshot is COMMITTED in the ledger, row counts match (append tables; a merge replaces rows), no entry
  has been PENDING longer than the threshold, and, on a table with no per-row key (events without Kafka
  metadata, rejects), no other writer's snapshot added rows.

And on the pipeline's first table, whose entries carry each batch's counts:

- ``rejects_rate``: malformed events stay under a share of the events read by the pipeline's recent batches, as
  ``krishiv status`` and ``check`` count them (``krishiv_core.reject_rate``), a warning, not an error;
- ``late_events`` (windowed): late events stay under a share of the events read by the last batches, each batch's
  count listed (``late_by_batch``), as ``krishiv status`` shows them; the events are rows of the rejects table
  (reason ``late: …``), a warning, not an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import dagster as dg

from krishiv.status import late_batches
from krishiv_assets.assets import PipelineKeys
from krishiv_assets.resources import IcebergCatalogResource, LedgerResource
from krishiv_core.catalog import qualified
from krishiv_core.entries import MERGE
from krishiv_core.reject_rate import RECENT_BATCHES
from krishiv_core.spec import EVENTS, UPSERT, WINDOWED, KrishivSpec, PipelineSpec
from krishiv_core.tables import OutputTable, output_tables
from outbox.ledger.queries import RECENT_LATE_BATCHES

#: At most this many offending rows are listed in a check's metadata.
LISTED = 100


@dataclass(frozen=True)
class CheckThresholds:
    pending_max_age_s: float = 600.0
    rejects_rate_max: float = 0.01
    late_rate_max: float = 0.01


DEFAULT_THRESHOLDS = CheckThresholds()

#: The row check of each kind: its name and the metadata labels of its count and its offending rows.
ROW_CHECKS = {
    WINDOWED: ("no_duplicate_windows", "duplicate_windows", "offending_windows"),
    UPSERT: ("no_duplicate_keys", "duplicate_keys", "offending_keys"),
    EVENTS: ("offsets_at_most_once", "repeated_offsets", "offending_offsets"),
}


def _current(table) -> dict[str, object]:
    from krishiv.verify import table_rows

    current = table.current_snapshot()
    return {
        "rows": table_rows(table),
        "snapshot_id": dg.MetadataValue.text(str(current.snapshot_id) if current else "none"),
    }


def _duplicates_check(spec: KrishivSpec, pipeline: PipelineSpec, output: OutputTable) -> dg.AssetChecksDefinition:
    """``no_duplicate_windows`` or ``no_duplicate_keys``: no two rows of the table share its row key."""
    name, count_label, rows_label = ROW_CHECKS[pipeline.kind]
    table_name = qualified(spec, output.name)
    what = "window" if pipeline.kind == WINDOWED else "key"

    @dg.asset_check(
        asset=PipelineKeys.of(spec, pipeline).tables[output.name],
        name=name,
        blocking=True,
        description=(
            f"Every {what} appears at most once (by {', '.join(_key(pipeline, output))}): an event counted twice "
            "would show up here."
        ),
    )
    def check(iceberg: IcebergCatalogResource) -> dg.AssetCheckResult:
        from krishiv.verify import describe_key, duplicate_rows, duplicate_sources

        key = _key(pipeline, output)
        table = iceberg.catalog().load_table(table_name)
        duplicates = duplicate_rows(table, key)
        first = f"{describe_key(key, duplicates[0].values)} ({duplicates[0].rows} rows)" if duplicates else ""
        return dg.AssetCheckResult(
            passed=not duplicates,
            description=(
                f"{len(duplicates)} {what}s appear more than once, first {first}"
                if duplicates
                else f"every {what} appears once"
            ),
            metadata={
                count_label: len(duplicates),
                **_current(table),
                rows_label: dg.MetadataValue.json(duplicate_sources(table, key, duplicates[:LISTED])),
            },
        )

    return check


def _key(pipeline: PipelineSpec, output: OutputTable) -> tuple[str, ...]:
    from krishiv.verify import row_key

    return row_key(pipeline, output)


def _offsets_check(spec: KrishivSpec, pipeline: PipelineSpec, output: OutputTable) -> dg.AssetChecksDefinition:
    """``offsets_at_most_once``: each Kafka offset in one row of the pipeline's tables at most; without the
    metadata columns, the table holds exactly the rows the ledger committed to it."""
    name, count_label, rows_label = ROW_CHECKS[EVENTS]
    table_name = qualified(spec, output.name)

    @dg.asset_check(
        asset=PipelineKeys.of(spec, pipeline).tables[output.name],
        name=name,
        blocking=True,
        description=(
            f"Each Kafka offset of {pipeline.topic} is in at most one row of {pipeline.name}'s tables per "
            "incarnation of the topic (by _kafka_partition and _kafka_offset; without them, the table holds the "
            "rows the ledger committed)."
        ),
    )
    def check(iceberg: IcebergCatalogResource, ledger: LedgerResource) -> dg.AssetCheckResult:
        from krishiv.verify import (
            OFFSET_KEY,
            beyond_incarnations,
            checks_offsets,
            describe_key,
            duplicate_sources,
            repeated_offsets,
            table_rows,
        )

        catalog = iceberg.catalog()
        if not checks_offsets(pipeline):

            def counts() -> tuple[object, int, int]:
                fresh = catalog.load_table(table_name)
                return fresh, table_rows(fresh), ledger.ledger().committed_batches(table_name).total_records

            from krishiv.verify import settled

            table, rows, committed = settled(counts, lambda c: c[1] == c[2])
            return dg.AssetCheckResult(
                passed=rows == committed,
                description=(
                    f"{table_name} holds {rows} rows, the ledger committed {committed}"
                    + ("" if rows == committed else ": rows were added or lost outside Krishiv")
                    + " (no _kafka_partition and _kafka_offset columns to check each offset)"
                ),
                metadata={**_current(table), "ledger_committed_rows": committed, "by_offset": False},
            )
        table = catalog.load_table(table_name)
        names = [qualified(spec, t) for t in pipeline.all_tables]
        tables = {n: table if n == table_name else catalog.load_table(n) for n in names}
        repeats = [r for r in repeated_offsets(tables, rejects=names[-1]) if any(t == table_name for t, _ in r.tables)]
        repeats = beyond_incarnations(repeats, ledger.ledger(), pipeline)
        sources = duplicate_sources(table, OFFSET_KEY, repeats[:LISTED])
        offending = {
            describe_key(OFFSET_KEY, r.values): {
                "tables": dict(r.tables),
                "snapshots": sources.get(describe_key(OFFSET_KEY, r.values), []),
            }
            for r in repeats[:LISTED]
        }
        first = ""
        if repeats:
            where = ", ".join(f"{t} {n}" for t, n in repeats[0].tables)
            first = f", first {describe_key(OFFSET_KEY, repeats[0].values)} (rows: {where})"
        return dg.AssetCheckResult(
            passed=not repeats,
            description=(
                f"{len(repeats)} Kafka offsets are in more than one row{first}"
                if repeats
                else f"each Kafka offset is in one row of {len(names)} tables at most"
            ),
            metadata={
                count_label: len(repeats),
                **_current(table),
                "by_offset": True,
                rows_label: dg.MetadataValue.json(offending),
            },
        )

    return check


def _lineage_check(asset: dg.AssetKey, table_name: str) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=asset,
        name="lineage_linear",
        description="Each snapshot's parent is the one before it; one snapshot per batch, batch ids rising.",
    )
    def lineage_linear(iceberg: IcebergCatalogResource) -> dg.AssetCheckResult:
        from krishiv.lineage import lineage
        from krishiv.verify import check_lineage

        table = iceberg.catalog().load_table(table_name)
        problems = check_lineage(table)
        rows = lineage(table)
        return dg.AssetCheckResult(
            passed=not problems,
            description=problems[0] if problems else f"{len(rows)} snapshots in one line",
            metadata={
                "snapshots": len(rows),
                "krishiv_snapshots": sum(1 for r in rows if r.batch_id is not None),
                "maintenance_snapshots": sum(1 for r in rows if r.writer == "maintenance"),
                "other_snapshots": sum(1 for r in rows if r.writer == "other"),
                "problems": dg.MetadataValue.json(problems),
                "lineage": dg.MetadataValue.json(
                    [
                        {"snapshot": r.snapshot_id, "parent": r.parent_id, "batch": r.batch_id, "writer": r.writer}
                        for r in rows[-50:]
                    ]
                ),
            },
        )

    return lineage_linear


def _ledger_check(
    asset: dg.AssetKey, table_name: str, merge: bool, thresholds: CheckThresholds, rows_by_ledger: bool = False
) -> dg.AssetChecksDefinition:
    """``rows_by_ledger``: a table with no per-row key, whose rows only the ledger accounts for (see
    :func:`krishiv.verify.check_ledger_agreement`)."""
    counts = "" if merge else ", row counts match"

    @dg.asset_check(
        asset=asset,
        name="ledger_agreement",
        description=(
            f"Every COMMITTED outbox entry is visible in the table and vice versa{counts}, and no entry stays "
            f"PENDING longer than {thresholds.pending_max_age_s:.0f}s."
        ),
    )
    def ledger_agreement(iceberg: IcebergCatalogResource, ledger: LedgerResource) -> dg.AssetCheckResult:
        from krishiv.verify import check_ledger_agreement

        book = ledger.ledger()

        def agreement() -> list[str]:
            table = iceberg.catalog().load_table(table_name)
            return check_ledger_agreement(table, table_name, book, merge=merge, rows_by_ledger=rows_by_ledger)

        from krishiv.verify import settled

        problems = settled(agreement, lambda found: not found)
        now = datetime.now(UTC)
        summary = book.table_summary(table_name)
        pending = book.pending_batches([table_name])
        ages = [(now - e.created_at).total_seconds() for e in pending]
        stale = [e.batch_id for e, age in zip(pending, ages, strict=True) if age > thresholds.pending_max_age_s]
        if stale:
            problems.append(
                f"batches {stale} have been PENDING for more than {thresholds.pending_max_age_s:.0f}s; "
                "is the outbox sensor running?"
            )
        return dg.AssetCheckResult(
            passed=not problems,
            description=problems[0] if problems else "ledger and table agree",
            metadata={
                "committed_entries": summary.committed,
                "pending_entries": len(pending),
                "oldest_pending_age_s": float(max(ages, default=0.0)),
                "commit_operation": MERGE if merge else "append",
                "problems": dg.MetadataValue.json(problems),
            },
        )

    return ledger_agreement


def _rejects_rate_check(
    asset: dg.AssetKey, table_name: str, pipeline: str, thresholds: CheckThresholds
) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=asset,
        name="rejects_rate",
        description=(
            f"Malformed events stay under {thresholds.rejects_rate_max:.1%} of the events read by the pipeline's "
            f"last {RECENT_BATCHES} batches."
        ),
    )
    def rejects_rate(ledger: LedgerResource) -> dg.AssetCheckResult:
        # The recent batches of krishiv status and check (krishiv_core.reject_rate), against this check's own share.
        recent = ledger.ledger().recent_rejects(table_name, pipeline=pipeline)
        return dg.AssetCheckResult(
            passed=not recent.alarming(thresholds.rejects_rate_max),
            severity=dg.AssetCheckSeverity.WARN,
            description=f"{recent.describe()} in the last {recent.batches} batch{'es' * (recent.batches != 1)}",
            metadata={
                "rejects": recent.rejects,
                "records_read": recent.records_read,
                "batches": recent.batches,
                "rejects_rate": float(recent.rate),
                "threshold": float(thresholds.rejects_rate_max),
            },
        )

    return rejects_rate


def _late_events_check(
    asset: dg.AssetKey, table_name: str, pipeline: str, rejects_table: str, thresholds: CheckThresholds
) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=asset,
        name="late_events",
        description=(
            f"Late events stay under {thresholds.late_rate_max:.1%} of the events read by the pipeline's last "
            f"{RECENT_LATE_BATCHES} batches; each batch's late events are listed (rows of {rejects_table})."
        ),
    )
    def late_events(ledger: LedgerResource) -> dg.AssetCheckResult:
        recent = ledger.ledger().recent_batches(table_name, pipeline=pipeline)
        read, late = sum(b.records_read for b in recent), sum(b.late_events for b in recent)
        rate = late / read if read else 0.0
        by_batch = late_batches(recent)
        shown = ", ".join(f"batch {b}: {n}" for b, n in by_batch[:10])
        return dg.AssetCheckResult(
            passed=rate <= thresholds.late_rate_max,
            severity=dg.AssetCheckSeverity.WARN,
            description=(
                f"{late} of {read} events late in the last {len(recent)} batches"
                + (f" ({shown}), kept in {rejects_table} with reason 'late: …'" if by_batch else "")
            ),
            metadata={
                "late_events": late,
                "records_read": read,
                "batches": len(recent),
                "late_rate": float(rate),
                "threshold": float(thresholds.late_rate_max),
                "late_by_batch": dg.MetadataValue.json({str(b): n for b, n in by_batch}),
            },
        )

    return late_events


def pipeline_checks(
    spec: KrishivSpec, pipeline: PipelineSpec, thresholds: CheckThresholds = DEFAULT_THRESHOLDS
) -> list[dg.AssetChecksDefinition]:
    """The checks of every table of ``pipeline.all_tables``: its kind's row check on each row table, lineage and
    ledger agreement on each table, and the rejects rate on the first."""
    keys = PipelineKeys.of(spec, pipeline)
    checks = []
    for output in output_tables(pipeline):
        asset, table_name = keys.tables[output.name], qualified(spec, output.name)
        if not output.rejects:
            checks.append(
                _offsets_check(spec, pipeline, output)
                if pipeline.kind == EVENTS
                else _duplicates_check(spec, pipeline, output)
            )
        checks.append(_lineage_check(asset, table_name))
        merge = output.operation.kind == MERGE
        unkeyed = not merge and not _key(pipeline, output)  # another writer's rows only show against the ledger
        checks.append(_ledger_check(asset, table_name, merge, thresholds, rows_by_ledger=unkeyed))
    checks.append(_rejects_rate_check(keys.table, qualified(spec, pipeline.tables[0]), pipeline.name, thresholds))
    if pipeline.kind == WINDOWED:
        first, rejects = qualified(spec, pipeline.table), qualified(spec, pipeline.rejects_table)
        checks.append(_late_events_check(keys.table, first, pipeline.name, rejects, thresholds))
    return checks
