"""Table maintenance in Dagster: one asset per pipeline (``<pipeline>/table_maintenance``), its job and a schedule.

The asset compacts, expires snapshots and removes orphan files in every table of the pipeline, with the spec's
``[maintenance]`` (``krishiv.maintenance.maintain_pipelines``, the same code as ``krishiv maintain``). It
depends on the pipeline's tables, so the UI shows it downstream of them, and reports the counts as its
materialization's metadata. It imports no Spark: a maintenance run starts as fast as a commit run.

It runs in the pipeline's commit pool (``krishiv_commit_<pipeline>``), so Dagster does not start it while a commit
run of the same pipeline is going; beside a continuous ``krishiv run`` (which commits its own batches) it is safe
anyway, the maintenance steps being writers that retry their conflicts (see ``outbox.expiry``,
``outbox.compaction``, ``outbox.orphans``). The schedule (``[maintenance] schedule``, a cron string) starts
RUNNING when ``[maintenance] enabled`` is true, STOPPED otherwise.
"""

from __future__ import annotations

import dagster as dg

from krishiv_assets.assets import PipelineKeys, commit_pool, run_failure
from krishiv_assets.resources import IcebergCatalogResource, LedgerResource
from krishiv_core.errors import KrishivError
from krishiv_core.spec import KrishivSpec, PipelineSpec


def maintenance_key(pipeline: PipelineSpec) -> dg.AssetKey:
    return dg.AssetKey([pipeline.name, "table_maintenance"])


def maintenance_job_name(pipeline: PipelineSpec) -> str:
    return f"{pipeline.name}_maintenance_job"


def maintenance_schedule_name(pipeline: PipelineSpec) -> str:
    return f"{pipeline.name}_maintenance_schedule"


def maintenance_asset(spec: KrishivSpec, pipeline: PipelineSpec) -> dg.AssetsDefinition:
    keys = PipelineKeys.of(spec, pipeline)
    settings = spec.maintenance

    @dg.asset(
        key=maintenance_key(pipeline),
        deps=list(keys.tables.values()),
        group_name=pipeline.name,
        pool=commit_pool(pipeline),
        description=(
            f"Maintenance of {pipeline.name}'s tables: compact small files (target {settings.target_file_size} "
            f"bytes, at least {settings.min_files} per partition), expire snapshots (keep the last "
            f"{settings.keep_last} and those younger than {settings.keep_younger_than_ms // 1000}s), remove "
            f"orphan files older than {settings.orphan_grace_ms // 1000}s."
        ),
    )
    def table_maintenance(
        context,  # unannotated, as in krishiv_assets.assets
        iceberg: IcebergCatalogResource,
        ledger: LedgerResource,
    ) -> dg.MaterializeResult:
        from krishiv.maintenance import maintain_pipelines

        run_id = context.run.run_id
        try:
            results = maintain_pipelines(
                spec,
                [pipeline],
                catalog=iceberg.catalog(),
                ledger=ledger.ledger(),
                run_id=run_id,
                holder=f"dagster run {run_id[:8]}",
            )
        except KrishivError as exc:
            raise run_failure(exc) from exc
        done = [r for r in results if not r.skipped]
        for r in results:
            if r.skipped:
                context.log.info(f"{r.table}: skipped: {r.skipped}")
        return dg.MaterializeResult(
            metadata={
                "tables_maintained": len(done),
                "tables_skipped": len(results) - len(done),
                "files_rewritten": sum(r.compaction.files_rewritten for r in done if r.compaction),
                "files_written": sum(r.compaction.files_written for r in done if r.compaction),
                "bytes_rewritten": sum(r.compaction.bytes_rewritten for r in done if r.compaction),
                "snapshots_expired": sum(len(r.expiry.expired) for r in done if r.expiry),
                "snapshots_kept": sum(r.expiry.kept for r in done if r.expiry),
                "orphan_files_removed": sum(len(r.orphans.removed) for r in done if r.orphans),
                "orphan_bytes_removed": sum(r.orphans.removed_bytes for r in done if r.orphans),
            }
        )

    return table_maintenance


def maintenance_job(pipeline: PipelineSpec) -> dg.UnresolvedAssetJobDefinition:
    return dg.define_asset_job(
        maintenance_job_name(pipeline),
        selection=dg.AssetSelection.assets(maintenance_key(pipeline)),
        tags={"krishiv/pipeline": pipeline.name, "krishiv/step": "maintenance"},
        executor_def=dg.in_process_executor,
        description=f"Maintenance of {pipeline.name}'s tables: compaction, snapshot expiry, orphan-file removal.",
    )


def maintenance_schedule(spec: KrishivSpec, pipeline: PipelineSpec, job: dg.UnresolvedAssetJobDefinition):
    return dg.ScheduleDefinition(
        name=maintenance_schedule_name(pipeline),
        job=job,
        cron_schedule=spec.maintenance.schedule,
        default_status=dg.DefaultScheduleStatus.RUNNING
        if spec.maintenance.enabled
        else dg.DefaultScheduleStatus.STOPPED,
        description=f"[maintenance] schedule of the spec: {spec.maintenance.schedule}",
    )
