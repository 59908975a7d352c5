"""The asset factory: one pipeline spec, of any kind, becomes its topic, staging and table assets.

- ``kafka/<topic>``: the topic, an external asset (Krishiv reads it, never writes it).
- ``<pipeline>/staged_batches``: phase 1. Runs the Spark query over what the topic holds, writing staged Parquet
  files and outbox entries: once (``AvailableNow``), or, when the Kafka sensor started the run, on while records
  keep arriving, committing each batch as it goes (:mod:`krishiv_assets.staging_run`).
- ``iceberg/<namespace>/<table>`` for each table of ``pipeline.all_tables`` (a windowed or upsert pipeline's
  table, an events pipeline's table or each of its routes', then the rejects table): phase 2. The commit relay
  promotes pending entries into snapshots, in batch order, and materializes every one of these tables.

Every materialization reports numeric metadata, so the UI plots it over time; ids are text, which it does not plot
(:mod:`krishiv_assets.commit_reports` names them). Each table asset has a freshness policy
(:mod:`krishiv_assets.freshness`). Pools (``dagster.yaml``) keep one staging run per pipeline (its checkpoint
admits one query) and one commit run per table at a time.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import dagster as dg

from krishiv.cut import consistent_cut
from krishiv.verify import table_rows
from krishiv_assets.commit_reports import (
    added,
    batch_counts,
    batch_metadata,
    dagster_committer,
    identifier,
)
from krishiv_assets.data_versions import input_tag, ledger_offsets, staged_inputs, staged_version
from krishiv_assets.freshness import FreshnessWindows, freshness_windows
from krishiv_assets.resources import (
    IcebergCatalogResource,
    KafkaResource,
    LedgerResource,
    SparkResource,
)
from krishiv_assets.staging_run import (
    SENSOR_TAG,
    STAGING_CONFIG_SCHEMA,
    IdleStop,
    run_spec,
    staging_plan,
    staging_run_waiting,
    unstaged_records,
)
from krishiv_core.catalog import qualified
from krishiv_core.entries import COMMITTED
from krishiv_core.errors import KrishivError
from krishiv_core.runbook import before_pointer
from krishiv_core.spec import UPSERT, WINDOWED, KrishivSpec, PipelineSpec


@dataclass(frozen=True)
class PipelineKeys:
    """The asset keys of one pipeline, shared by the assets, checks, jobs and sensors."""

    topics: tuple[dg.AssetKey, ...]  # every topic the pipeline reads
    staged: dg.AssetKey
    tables: Mapping[str, dg.AssetKey]  # every table of ``pipeline.all_tables``, by unqualified name, in that order

    @classmethod
    def of(cls, spec: KrishivSpec, pipeline: PipelineSpec) -> PipelineKeys:
        return cls(
            topics=tuple(dg.AssetKey(["kafka", t]) for t in pipeline.topics),
            staged=dg.AssetKey([pipeline.name, "staged_batches"]),
            tables={name: table_key(spec, name) for name in pipeline.all_tables},
        )

    @property
    def table(self) -> dg.AssetKey:
        """The pipeline's first table, whose entries carry each batch's counts."""
        return next(iter(self.tables.values()))

    @property
    def rejects(self) -> dg.AssetKey:
        return list(self.tables.values())[-1]


#: A commit run reads the commits it made back from the ledger, at most this many (its metadata's durations).
RUN_COMMITS_READ = 100_000


def table_key(spec: KrishivSpec, table: str) -> dg.AssetKey:
    return dg.AssetKey(["iceberg", spec.iceberg.namespace, table])


def stage_pool(pipeline: PipelineSpec) -> str:
    return f"krishiv_stage_{pipeline.name}"


def commit_pool(pipeline: PipelineSpec) -> str:
    return f"krishiv_commit_{pipeline.name}"


def run_failure(exc: Exception) -> dg.Failure:
    """A Krishiv error as a Dagster failure whose description says what to fix; pending work stays pending."""
    return dg.Failure(description=f"{type(exc).__name__}: {exc}", allow_retries=False)


def _seconds(ms: int) -> str:
    return f"{ms / 1000:g}s"


def _windows(pipeline: PipelineSpec) -> str:
    hop = f" every {_seconds(pipeline.window_slide_ms)}" if pipeline.slide_ms else ""
    by = f" per {', '.join(pipeline.group_by)}" if pipeline.group_by else ""
    return f"{_seconds(pipeline.window_ms)} windows{hop}{by}"


def shape_of(pipeline: PipelineSpec) -> str:
    """What the pipeline's Spark query makes of each batch, in a few words."""
    if pipeline.kind == WINDOWED:
        return f"{_windows(pipeline)}, {_seconds(pipeline.watermark_delay_ms)} watermark, {pipeline.output_mode} mode"
    if pipeline.kind == UPSERT:
        return f"the latest row per {', '.join(pipeline.key)}"
    routes = f", routed by {pipeline.route_by} to {len(pipeline.tables)} tables" if pipeline.routes else ""
    return f"every valid event one row{routes}"


def table_description(pipeline: PipelineSpec, table: str) -> str:
    """An asset's description: what one of the pipeline's tables holds."""
    if table == pipeline.rejects_table:
        return f"Malformed events of {', '.join(pipeline.topics)} with their partition, offset and reason."
    pipeline = pipeline.writer_of(table)
    if pipeline.kind == WINDOWED:
        how = "replaced as their events arrive" if pipeline.output_mode == "update" else "written once closed"
        what = f"{_windows(pipeline)} of {pipeline.topic}, {how}"
    elif pipeline.kind == UPSERT:
        what = f"the latest row per {', '.join(pipeline.key)} of {pipeline.topic}, deleted by a tombstone"
    else:
        values = [r.value for r in pipeline.routes if r.table == table]
        if values:
            what = f"the events of {pipeline.topic} whose {pipeline.route_by} is {' or '.join(values)}"
        elif pipeline.routes:
            what = f"the events of {pipeline.topic} whose {pipeline.route_by} has no route"
        else:
            what = f"every valid event of {pipeline.topic}"
        if pipeline.kafka_metadata:
            what += f", with {', '.join(pipeline.metadata_columns)}"
    return f"{table}: {what}; one Iceberg snapshot per staged batch, each event counted exactly once."


def topic_asset(spec: KrishivSpec, topic: str) -> dg.AssetSpec:
    """The topic's external asset, the same for every pipeline that reads it (the code location keeps one): in
    the group of its one pipeline, or in ``kafka`` when several read it."""
    readers = [p.name for p in spec.pipelines if topic in p.topics]
    return dg.AssetSpec(
        dg.AssetKey(["kafka", topic]),
        description=f"Kafka topic {topic!r}, read by the Spark queries of {', '.join(readers)}.",
        group_name=readers[0] if len(readers) == 1 else "kafka",
        kinds={"kafka"},
        metadata={"topic": topic},
    )


def pipeline_assets(
    spec: KrishivSpec, pipeline: PipelineSpec, freshness: FreshnessWindows | None = None
) -> list[dg.AssetsDefinition | dg.AssetSpec]:
    """The topic, staging and table assets; each table's freshness policy from ``freshness`` (by default the
    environment's windows)."""
    keys = PipelineKeys.of(spec, pipeline)
    windows = freshness if freshness is not None else freshness_windows()
    group = pipeline.name
    first = qualified(spec, pipeline.tables[0])  # its entries carry each batch's counts

    topics = [topic_asset(spec, t) for t in pipeline.topics]

    @dg.asset(
        key=keys.staged,
        deps=list(keys.topics),
        group_name=group,
        kinds={"spark", "duckdb"},
        pool=stage_pool(pipeline),
        config_schema=STAGING_CONFIG_SCHEMA,
        description=(
            f"Phase 1 of {pipeline.name} ({pipeline.kind}): the Spark query stages each micro-batch as Parquet "
            f"files plus an outbox entry per table in the DuckDB ledger ({shape_of(pipeline)}). A run the Kafka "
            "sensor starts goes on while records arrive, committing each batch, until the topic is idle."
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
        from krishiv.query_supervisor import RunClients

        try:
            given = context.op_execution_context.op_config or {}
            plan = staging_plan(
                sensor_started=SENSOR_TAG in context.run.tags,
                linger_s=given.get("linger_s"),
                max_run_s=given.get("max_run_s"),
            )
            catalog, book = iceberg.catalog(), ledger.ledger()  # a catalog that is down fails before Spark starts
            stop = IdleStop(
                plan, unstaged_records(spec, pipeline, book, kafka), waiting=staging_run_waiting(context.instance)
            )
            context.log.info(f"staging {pipeline.name} {plan.describe()}")
            this_run = dagster_committer(context.run.run_id)
            running = run_pipelines(
                run_spec(spec, kafka=kafka, spark=spark, iceberg=iceberg),
                [pipeline],
                once=plan.once,
                clients=RunClients(ledger=book, catalog=catalog, spark=spark.session()),
                holder=this_run,
                reporter=lambda _name: stop.on_batch,
                progress=context.log.info,
                stop_when=stop,
            )
            summary = book.table_summary(first, topic=pipeline.topic)
            staged = ledger_offsets(book, first, pipeline)
        except KrishivError as exc:
            raise run_failure(exc) from exc
        history = running[0].stager.history
        recorded = [b for b in history if b.recorded]
        stopped = "caught up" if plan.once else (stop.reason or "stopped")
        context.log.info("staged %d of %d batches; %s", len(recorded), len(history), stopped)
        return dg.MaterializeResult(
            data_version=staged_version(staged),  # krishiv_assets/data_versions.py
            tags=staged_inputs(staged),
            metadata={
                "linger_s": plan.linger_s,
                "stopped_because": stopped,
                "batches_run": len(history),
                "batches_staged": len(recorded),
                "records_read": sum(b.records_read for b in recorded),
                "rows_staged": sum(b.rows for b in recorded),
                "rejects": sum(b.rejects for b in recorded),
                "late_events": sum(b.late_events for b in recorded),
                "pending_entries": summary.pending,
                "staged_through_offsets": dg.MetadataValue.json(summary.staged_offsets),
            },
        )

    @dg.multi_asset(
        specs=[
            dg.AssetSpec(
                key,
                deps=[keys.staged],
                group_name=group,
                kinds={"iceberg"},
                description=table_description(pipeline, name),
                metadata={"table": qualified(spec, name), "freshness": windows.describe()},
                freshness_policy=windows.policy(),
            )
            for name, key in keys.tables.items()
        ],
        name=f"{pipeline.name}_commit_relay",
        pool=commit_pool(pipeline),
        description=f"Phase 2 of {pipeline.name}: the commit relay promotes pending outbox entries, in order.",
    )
    def commit(
        context,  # unannotated, as above
        iceberg: IcebergCatalogResource,
        ledger: LedgerResource,
    ) -> Iterator[dg.MaterializeResult]:
        from krishiv.operations import TablesRefused, commit_pipelines

        names = {key: qualified(spec, name) for name, key in keys.tables.items()}
        refused: TablesRefused | None = None
        by = dagster_committer(context.run.run_id)  # this run materializes what it commits
        try:
            catalog, book = iceberg.catalog(), ledger.ledger()
            since = book.last_commit_seq()
            try:
                reports = commit_pipelines(spec, [pipeline], catalog=catalog, ledger=book, committed_by=by)
            except TablesRefused as exc:  # every other table was committed: materialized below, then the run fails
                refused, reports = exc, exc.reports
            pending = book.pending_batches(list(names.values()), pipeline=pipeline.name)
            made = book.commits_since(since, list(names.values()), RUN_COMMITS_READ)
            made = [c for c in made if c.committed_by == by]  # not a committer's that ran meanwhile
            counts = batch_counts(book, made, first)
            committed = {name: ledger_offsets(book, name, pipeline, COMMITTED) for name in names.values()}
        except KrishivError as exc:
            raise run_failure(exc) from exc
        by_table = {r.table: r for r in reports}
        for report in reports:  # a table the spec no longer names (a removed route): its staged batches still go in
            if report.table not in names.values() and (report.committed or report.recovered):
                context.log.info(
                    f"{report.table} (no longer in the spec): committed batches {report.committed}, found "
                    f"{report.recovered} already there"
                )
        tables = {name: catalog.load_table(name) for name in names.values() if not by_table[name].refused}
        cut = consistent_cut(book, pipeline.name, first, tables)
        for key, name in names.items():
            report = by_table[name]
            if report.refused:
                context.log.error(before_pointer(f"{name}: {report.refused}", "; its batches stay pending"))
                continue
            table = tables[name]
            current = table.current_snapshot()
            latencies = report.commit_latencies_ms
            waits = [c.staged_to_committed_s for c in made if c.table == name]
            snapshots = [table.metadata.snapshot_by_id(s) for s in report.snapshot_ids]
            metadata: dict[str, object] = {
                "snapshots_committed": len(report.committed),
                "batches_found_committed": len(report.recovered),
                "empty_batches": len(report.empty),
                "rows_committed": report.records,
                **added(s.summary.additional_properties if s and s.summary else None for s in snapshots),
                "current_snapshot_id": identifier(current.snapshot_id if current else None),
                "snapshots": len(table.snapshots()),
                "dagster/row_count": table_rows(table),
                "commit_latency_p50_ms": float(statistics.median(latencies)) if latencies else 0.0,
                "commit_latency_max_ms": float(max(latencies)) if latencies else 0.0,
                "pending_entries": sum(1 for e in pending if e.table == name),
                "committed_by": by,
                "committed_batches": dg.MetadataValue.json(report.committed),
                "consistent_cut": dg.MetadataValue.json(cut),
            }
            if waits:
                metadata["staged_to_committed_s"] = round(max(waits), 3)
            if name == first:
                metadata.update(batch_metadata(counts.values()))
            yield dg.MaterializeResult(
                asset_key=key,
                metadata=metadata,
                data_version=staged_version(committed[name]),  # krishiv_assets/data_versions.py
                tags=input_tag(keys.staged, committed[name]),
            )
        if refused is not None:
            raise run_failure(refused)

    return [*topics, staged_batches, commit]
