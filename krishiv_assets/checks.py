"""Asset checks on a pipeline's table: each result carries the metadata that explains a failure.

- ``no_duplicate_windows`` (blocking): each window appears once; names the windows and the snapshots.
- ``lineage_linear``: each snapshot's parent is the previous one, one snapshot per batch, in batch order.
- ``ledger_agreement``: every COMMITTED entry is in the table, every Krishiv snapshot is COMMITTED in the
  ledger, row counts match, and no entry has been PENDING longer than the threshold.
- ``rejects_rate``: malformed events stay under a share of the events read (a warning, not an error).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import dagster as dg

from krishiv_assets.assets import PipelineKeys
from krishiv_assets.resources import IcebergCatalogResource, LedgerResource
from krishiv_core.catalog import qualified
from krishiv_core.spec import KrishivSpec, PipelineSpec


@dataclass(frozen=True)
class CheckThresholds:
    pending_max_age_s: float = 600.0
    rejects_rate_max: float = 0.01


DEFAULT_THRESHOLDS = CheckThresholds()


def pipeline_checks(
    spec: KrishivSpec, pipeline: PipelineSpec, thresholds: CheckThresholds = DEFAULT_THRESHOLDS
) -> list[dg.AssetChecksDefinition]:
    keys = PipelineKeys.of(spec, pipeline)
    table_name = qualified(spec, pipeline.table)

    @dg.asset_check(
        asset=keys.table,
        name="no_duplicate_windows",
        blocking=True,
        description="Every window appears at most once: an event counted twice would show up here.",
    )
    def no_duplicate_windows(iceberg: IcebergCatalogResource) -> dg.AssetCheckResult:
        from krishiv.verify import duplicate_window_sources, duplicate_windows

        table = iceberg.catalog().load_table(table_name)
        duplicates = duplicate_windows(table)
        current = table.current_snapshot()
        return dg.AssetCheckResult(
            passed=not duplicates,
            description=(
                f"{len(duplicates)} windows appear more than once" if duplicates else "every window appears once"
            ),
            metadata={
                "duplicate_windows": len(duplicates),
                "rows": int(current.summary.get("total-records", 0)) if current else 0,
                "snapshot_id": current.snapshot_id if current else 0,
                "offending_windows": dg.MetadataValue.json(duplicate_window_sources(table, duplicates[:100])),
            },
        )

    @dg.asset_check(
        asset=keys.table,
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
                "problems": dg.MetadataValue.json(problems),
                "lineage": dg.MetadataValue.json(
                    [{"snapshot": r.snapshot_id, "parent": r.parent_id, "batch": r.batch_id} for r in rows[-50:]]
                ),
            },
        )

    @dg.asset_check(
        asset=keys.table,
        name="ledger_agreement",
        description=(
            "Every COMMITTED outbox entry is visible in the table and vice versa, and no entry stays PENDING "
            f"longer than {thresholds.pending_max_age_s:.0f}s."
        ),
    )
    def ledger_agreement(iceberg: IcebergCatalogResource, ledger: LedgerResource) -> dg.AssetCheckResult:
        from krishiv.verify import check_ledger_agreement

        table = iceberg.catalog().load_table(table_name)
        book = ledger.ledger()
        problems = check_ledger_agreement(table, table_name, book)
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
                "problems": dg.MetadataValue.json(problems),
            },
        )

    @dg.asset_check(
        asset=keys.table,
        name="rejects_rate",
        description=f"Malformed events stay under {thresholds.rejects_rate_max:.1%} of the events read.",
    )
    def rejects_rate(ledger: LedgerResource) -> dg.AssetCheckResult:
        summary = ledger.ledger().table_summary(table_name)
        read, rejects = summary.records_read, summary.rejects
        rate = rejects / read if read else 0.0
        return dg.AssetCheckResult(
            passed=rate <= thresholds.rejects_rate_max,
            severity=dg.AssetCheckSeverity.WARN,
            description=f"{rejects} of {read} events rejected ({rate:.2%})",
            metadata={
                "rejects": rejects,
                "records_read": read,
                "rejects_rate": float(rate),
                "threshold": float(thresholds.rejects_rate_max),
            },
        )

    return [no_duplicate_windows, lineage_linear, ledger_agreement, rejects_rate]
