"""The asset factory: one pipeline spec becomes its topic, staging and table assets.

- ``kafka/<topic>``: the topic, an external asset (Krishiv reads it, never writes it).
- ``<pipeline>/staged_batches``: phase 1. Runs the Spark query once (``AvailableNow``) over what the topic
  holds, writing staged Parquet files and outbox entries.
- ``iceberg/<namespace>/<table>`` and its rejects table: phase 2. The commit relay promotes pending entries
  into snapshots, in batch order.

Every materialization reports numeric metadata, so the UI plots it over time. Pools (``dagster.yaml``) keep
one staging run per pipeline (its checkpoint admits one query) and one commit run per table at a time.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass

import dagster as dg

from krishiv_assets.resources import (
    IcebergCatalogResource,
    KafkaResource,
    LedgerResource,
    SparkResource,
    effective_spec,
)
from krishiv_core.catalog import qualified
from krishiv_core.errors import KrishivError
from krishiv_core.spec import KrishivSpec, PipelineSpec


@dataclass(frozen=True)
class PipelineKeys:
    """The asset keys of one pipeline, shared by the assets, checks, jobs and sensors."""

    topic: dg.AssetKey
    staged: dg.AssetKey
    table: dg.AssetKey
    rejects: dg.AssetKey

    @classmethod
    def of(cls, spec: KrishivSpec, pipeline: PipelineSpec) -> PipelineKeys:
        namespace = spec.iceberg.namespace
        return cls(
            topic=dg.AssetKey(["kafka", pipeline.topic]),
            staged=dg.AssetKey([pipeline.name, "staged_batches"]),
            table=dg.AssetKey(["iceberg", namespace, pipeline.table]),
            rejects=dg.AssetKey(["iceberg", namespace, pipeline.rejects_table]),
        )


def stage_pool(pipeline: PipelineSpec) -> str:
    return f"krishiv_stage_{pipeline.name}"


def commit_pool(pipeline: PipelineSpec) -> str:
    return f"krishiv_commit_{pipeline.name}"


def _failure(exc: Exception) -> dg.Failure:
    """A Krishiv error as a Dagster failure whose description says what to fix; pending work stays pending."""
    return dg.Failure(description=f"{type(exc).__name__}: {exc}", allow_retries=False)


def pipeline_assets(spec: KrishivSpec, pipeline: PipelineSpec) -> list[dg.AssetsDefinition | dg.AssetSpec]:
    keys = PipelineKeys.of(spec, pipeline)
    group = pipeline.name
    tables = {keys.table: pipeline.table, keys.rejects: pipeline.rejects_table}

    topic = dg.AssetSpec(
        keys.topic,
        description=f"Kafka topic {pipeline.topic!r}: order events, read by the {pipeline.name} Spark query.",
        group_name=group,
        kinds={"kafka"},
        metadata={"topic": pipeline.topic},
    )

    @dg.asset(
        key=keys.staged,
        deps=[keys.topic],
        group_name=group,
        kinds={"spark", "duckdb"},
        pool=stage_pool(pipeline),
        description=(
            f"Phase 1 of {pipeline.name}: the Spark query stages each micro-batch as Parquet files plus an outbox "
            f"entry in the DuckDB ledger ({pipeline.window_ms // 1000}s windows, "
            f"{pipeline.watermark_delay_ms // 1000}s watermark)."
        ),
    )
    def staged_batches(
        context,  # Dagster rejects a string annotation here (PEP 563), so the context stays unannotated
        kafka: KafkaResource,
        iceberg: IcebergCatalogResource,
        ledger: LedgerResource,
        spark: SparkResource,
    ) -> dg.MaterializeResult:
        from krishiv.operations import run_pipelines

        try:
            catalog, book = iceberg.catalog(), ledger.ledger()  # a catalog that is down fails before Spark starts
            running = run_pipelines(
                effective_spec(spec, kafka=kafka, spark=spark),
                [pipeline],
                once=True,
                spark=spark.session(),
                catalog=catalog,
                ledger=book,
                holder=f"dagster run {context.run.run_id}",
            )
            summary = book.table_summary(qualified(spec, pipeline.table), topic=pipeline.topic)
        except KrishivError as exc:
            raise _failure(exc) from exc
        history = running[0].stager.history
        staged = [b for b in history if b.recorded]
        context.log.info("staged %d of %d batches", len(staged), len(history))
        return dg.MaterializeResult(
            metadata={
                "batches_run": len(history),
                "batches_staged": len(staged),
                "records_read": sum(b.records_read for b in staged),
                "rows_staged": sum(b.rows for b in staged),
                "rejects": sum(b.rejects for b in staged),
                "late_events": sum(b.late_events for b in staged),
                "pending_entries": summary.pending,
                "staged_through_offsets": dg.MetadataValue.json(summary.staged_offsets),
            }
        )

    @dg.multi_asset(
        specs=[
            dg.AssetSpec(
                keys.table,
                deps=[keys.staged],
                group_name=group,
                kinds={"iceberg"},
                description=(
                    f"{pipeline.table}: closed {pipeline.window_ms // 1000}s windows of {pipeline.topic}, "
                    "one Iceberg snapshot per staged batch, each event counted exactly once."
                ),
            ),
            dg.AssetSpec(
                keys.rejects,
                deps=[keys.staged],
                group_name=group,
                kinds={"iceberg"},
                description=f"Malformed events of {pipeline.topic} with their partition, offset and reason.",
            ),
        ],
        name=f"{pipeline.name}_commit_relay",
        pool=commit_pool(pipeline),
        description=f"Phase 2 of {pipeline.name}: the commit relay promotes pending outbox entries, in order.",
    )
    def commit(iceberg: IcebergCatalogResource, ledger: LedgerResource) -> Iterator[dg.MaterializeResult]:
        from krishiv.operations import commit_pipelines

        try:
            catalog, book = iceberg.catalog(), ledger.ledger()
            reports = commit_pipelines(spec, [pipeline], catalog=catalog, ledger=book)
            pending = book.pending_batches([qualified(spec, name) for name in tables.values()])
        except KrishivError as exc:
            raise _failure(exc) from exc
        by_table = {r.table: r for r in reports}
        for key, name in tables.items():
            report = by_table[qualified(spec, name)]
            table = catalog.load_table(report.table)
            current = table.current_snapshot()
            latencies = report.commit_latencies_ms
            yield dg.MaterializeResult(
                asset_key=key,
                metadata={
                    "snapshots_committed": len(report.committed),
                    "batches_found_committed": len(report.recovered),
                    "empty_batches": len(report.empty),
                    "rows_committed": report.records,
                    "current_snapshot_id": current.snapshot_id if current else 0,
                    "snapshots": len(table.snapshots()),
                    "dagster/row_count": int(current.summary.get("total-records", 0)) if current else 0,
                    "commit_latency_p50_ms": float(statistics.median(latencies)) if latencies else 0.0,
                    "commit_latency_max_ms": float(max(latencies)) if latencies else 0.0,
                    "pending_entries": sum(1 for e in pending if e.table == report.table),
                    "committed_batches": dg.MetadataValue.json(report.committed),
                },
            )

    return [topic, staged_batches, commit]
