"""The Dagster code location: every pipeline of the spec becomes its assets, checks, jobs and sensors; and one
fixed asset, check, job and sensor commit the pending batches of pipelines removed from the spec since.

``workspace.yaml`` loads this module. Importing it reads nothing and connects to nothing: Dagster calls
:func:`defs` when it loads the code location. That reads the spec file (``$KRISHIV_SPEC`` or
``krishiv.toml`` in the working directory); an address the environment overrides (``KRISHIV_KAFKA_BOOTSTRAP``
and the others of :data:`krishiv_core.spec.ENV_OVERRIDES`) is given to its resource as an ``EnvVar``, resolved
when a run starts and never shown in the UI. A secret written in the spec file itself (a password in
``iceberg.catalog_uri``) reaches no resource config either: the resource holds the redacted URI, which the UI
shows, and its client takes the real one from the spec the run process read
(:meth:`krishiv_assets.resources.IcebergCatalogResource.catalog`).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass, field

import dagster as dg

from krishiv_assets.assets import PipelineKeys, pipeline_assets
from krishiv_assets.checks import DEFAULT_THRESHOLDS, CheckThresholds, pipeline_checks
from krishiv_assets.freshness import FreshnessWindows, freshness_windows
from krishiv_assets.maintenance import maintenance_asset, maintenance_job, maintenance_schedule
from krishiv_assets.removed_pipelines import (
    removed_pipelines_asset,
    removed_pipelines_check,
    removed_pipelines_job,
    removed_pipelines_sensor,
)
from krishiv_assets.resources import (
    IcebergCatalogResource,
    KafkaResource,
    LazySparkSession,
    LedgerResource,
    SparkResource,
    displayed,
    shown_spark_conf,
)
from krishiv_assets.sensors import kafka_sensor, outbox_sensor
from krishiv_assets.staging_run import STAGE_STEP, STEP_TAG
from krishiv_core.spec import DEFAULT_SPEC_FILE, SPEC_FILE_ENV, KrishivSpec, PipelineSpec, load_spec


@dataclass(frozen=True)
class PipelineDefinitions:
    assets: list[dg.AssetsDefinition | dg.AssetSpec]
    checks: list[dg.AssetChecksDefinition]
    jobs: list[dg.UnresolvedAssetJobDefinition]
    sensors: list[dg.SensorDefinition]
    schedules: list[dg.ScheduleDefinition] = field(default_factory=list)


def stage_job_name(pipeline: PipelineSpec) -> str:
    return f"{pipeline.name}_stage_job"


def commit_job_name(pipeline: PipelineSpec) -> str:
    return f"{pipeline.name}_commit_job"


def checks_job_name(pipeline: PipelineSpec) -> str:
    return f"{pipeline.name}_checks_job"


def pipeline_definitions(
    spec: KrishivSpec,
    pipeline: PipelineSpec,
    thresholds: CheckThresholds = DEFAULT_THRESHOLDS,
    freshness: FreshnessWindows | None = None,
) -> PipelineDefinitions:
    """Everything one pipeline contributes; adding a pipeline to the spec adds all of it. ``freshness``: the table
    assets' freshness windows, by default from the environment (:func:`krishiv_assets.freshness.freshness_windows`)."""
    keys = PipelineKeys.of(spec, pipeline)
    tags = {"krishiv/pipeline": pipeline.name}
    stage = dg.define_asset_job(
        stage_job_name(pipeline),
        selection=dg.AssetSelection.assets(keys.staged),
        tags={**tags, STEP_TAG: STAGE_STEP},  # dagster.yaml's queue runs one such run at a time
        executor_def=dg.in_process_executor,
        description=f"Phase 1 of {pipeline.name}: stage what the topic holds (the Kafka sensor starts it).",
    )
    commit = dg.define_asset_job(
        commit_job_name(pipeline),
        selection=dg.AssetSelection.assets(*keys.tables.values()),  # every table of the pipeline, routes too
        tags={**tags, "krishiv/step": "commit"},
        executor_def=dg.in_process_executor,
        description=f"Phase 2 of {pipeline.name}: commit pending batches, then check (the outbox sensor starts it).",
    )
    checks = dg.define_asset_job(
        checks_job_name(pipeline),
        selection=dg.AssetSelection.checks_for_assets(*keys.tables.values()),
        tags={**tags, "krishiv/step": "checks"},
        executor_def=dg.in_process_executor,
        description=(
            f"The checks of {pipeline.name}'s tables, no commit: the outbox sensor starts it after reporting commits "
            "made outside a commit run, so their materializations are checked too."
        ),
    )
    maintain = maintenance_job(pipeline)
    windows = freshness if freshness is not None else freshness_windows()
    return PipelineDefinitions(
        assets=[*pipeline_assets(spec, pipeline, windows), maintenance_asset(spec, pipeline)],
        checks=pipeline_checks(spec, pipeline, thresholds),
        jobs=[stage, commit, checks, maintain],
        sensors=[outbox_sensor(spec, pipeline, commit, checks), kafka_sensor(spec, pipeline, stage)],
        schedules=[maintenance_schedule(spec, pipeline, maintain)],
    )


def removed_definitions(spec: KrishivSpec) -> PipelineDefinitions:
    """The same whatever the spec: the commit of the pending batches of pipelines the spec no longer has
    (:mod:`krishiv_assets.removed_pipelines`), whose names only the ledger knows."""
    job = removed_pipelines_job()
    return PipelineDefinitions(
        assets=[removed_pipelines_asset(spec)],
        checks=[removed_pipelines_check(spec)],
        jobs=[job],
        sensors=[removed_pipelines_sensor(spec, job)],
    )


def build_resources(spec: KrishivSpec, env_overrides: Collection[str] = ()) -> dict[str, dg.ConfigurableResource]:
    """The resources, from the spec's values, with ``EnvVar`` for each variable named in ``env_overrides``.

    A value from the spec is held with its secrets redacted: resource config is what the UI shows. The
    catalog and ledger resources also get the spec itself, as a nested resource without config.
    """

    def value(variable: str, default: str) -> str:
        return dg.EnvVar(variable) if variable in env_overrides else default

    return {
        "kafka": KafkaResource(bootstrap_servers=value("KRISHIV_KAFKA_BOOTSTRAP", spec.kafka.bootstrap_servers)),
        "iceberg": IcebergCatalogResource(
            spec=spec,
            uri=value("KRISHIV_ICEBERG_CATALOG_URI", displayed(spec.iceberg.catalog_uri)),
            warehouse=value("KRISHIV_ICEBERG_WAREHOUSE", displayed(spec.iceberg.warehouse)),
        ),
        "ledger": LedgerResource(spec=spec, path=value("KRISHIV_LEDGER_PATH", displayed(spec.storage.ledger_path))),
        "spark": SparkResource(
            spec=spec,
            # Resource config is what the UI shows: a secret of [spark.conf] is added by the run (session()).
            pyspark=LazySparkSession(spark_config=shown_spark_conf(spec)),  # imports no Spark until a run stages
            checkpoint_location=value("KRISHIV_CHECKPOINT_LOCATION", spec.storage.checkpoint_location),
        ),
    }


def build_definitions(
    spec: KrishivSpec,
    env_overrides: Collection[str] = (),
    thresholds: CheckThresholds = DEFAULT_THRESHOLDS,
    freshness: FreshnessWindows | None = None,
) -> dg.Definitions:
    windows = freshness if freshness is not None else freshness_windows()
    parts = [*(pipeline_definitions(spec, p, thresholds, windows) for p in spec.pipelines), removed_definitions(spec)]
    assets: dict[object, dg.AssetsDefinition | dg.AssetSpec] = {}
    for a in (a for p in parts for a in p.assets):
        # A topic several pipelines read is one external asset (the same spec from each pipeline).
        assets.setdefault(a.key if isinstance(a, dg.AssetSpec) else a, a)
    return dg.Definitions(
        assets=list(assets.values()),
        asset_checks=[c for p in parts for c in p.checks],
        jobs=[j for p in parts for j in p.jobs],
        sensors=[s for p in parts for s in p.sensors],
        schedules=[s for p in parts for s in p.schedules],
        resources=build_resources(spec, env_overrides),
    )


def spec_definitions(spec_file: str | os.PathLike[str]) -> dg.Definitions:
    """The definitions of the spec file at ``spec_file``, as the code location and the Krishiv component load them.

    The overrides of :data:`krishiv_core.spec.ENV_OVERRIDES` set in the environment reach the resources as EnvVars,
    never as values of the spec; every other variable is the environment's, which the spec's ``${VARIABLE}``
    references (``[iceberg.properties]``, ``[kafka.properties]``…) need.
    """
    from krishiv_core.spec import ENV_OVERRIDES

    environ = {k: v for k, v in os.environ.items() if k not in ENV_OVERRIDES}
    spec = load_spec(spec_file, env=environ)
    return build_definitions(spec, [variable for variable in ENV_OVERRIDES if os.environ.get(variable)])


@dg.definitions
def defs() -> dg.Definitions:
    """Called by Dagster when it loads the code location, never at import."""
    return spec_definitions(os.environ.get(SPEC_FILE_ENV) or DEFAULT_SPEC_FILE)
