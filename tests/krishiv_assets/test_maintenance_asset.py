"""The maintenance asset, job and schedule: the job materialized in-process on a real SQLite catalog and ledger
(batches staged directly, no Spark), and the schedule built from the spec's ``[maintenance]``."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import dagster as dg

from krishiv.operations import commit_pipelines, open_ledger
from krishiv_assets.definitions import build_definitions
from krishiv_assets.maintenance import (
    maintenance_job_name,
    maintenance_key,
    maintenance_schedule_name,
)
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.spec import load_spec
from tests.outbox.test_relay import ROOT, stage


def _spec(tmp_path: Path, maintenance: str = ""):
    shutil.copy(ROOT / "krishiv.toml", tmp_path / "krishiv.toml")
    with (tmp_path / "krishiv.toml").open("a") as spec_file:
        spec_file.write(maintenance)
    return load_spec(tmp_path / "krishiv.toml", env={})


def test_the_maintenance_job_compacts_and_reports_its_counts(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    pipeline = spec.pipeline()
    catalog, ledger = load_catalog(spec), open_ledger(spec)
    for b in range(5):
        stage(catalog, ledger, b, b, pipeline=pipeline)
    commit_pipelines(spec, [pipeline], catalog=catalog, ledger=ledger)

    defs = build_definitions(spec)
    result = defs.resolve_job_def(maintenance_job_name(pipeline)).execute_in_process(raise_on_error=False)
    assert result.success
    (event,) = [e for e in result.get_asset_materialization_events() if e.asset_key == maintenance_key(pipeline)]
    metadata = {k: v.value for k, v in event.materialization.metadata.items()}
    assert metadata["files_rewritten"] == 5 and metadata["files_written"] == 1, "min_files 5 by default"
    assert metadata["snapshots_expired"] == 0 and metadata["snapshots_kept"] == 6, "all younger than 15m"
    assert metadata["orphan_files_removed"] == 0, "nothing is past the 24h grace"
    assert (metadata["tables_maintained"], metadata["tables_skipped"]) == (1, 1), "the rejects table is not made"
    table = catalog.load_table(qualified(spec, pipeline.table))
    assert table.scan().to_arrow().num_rows == 5 and len(table.inspect.files()) == 1

    graph = defs.get_repository_def().asset_graph
    assert graph.get(maintenance_key(pipeline)).parent_keys == {dg.AssetKey(["iceberg", "krishiv", pipeline.table])} | {
        dg.AssetKey(["iceberg", "krishiv", pipeline.rejects_table])
    }


def test_the_schedule_follows_the_spec(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    schedule = build_definitions(spec).get_schedule_def(maintenance_schedule_name(spec.pipeline()))
    assert schedule.cron_schedule == "0 * * * *" and schedule.job_name == maintenance_job_name(spec.pipeline())
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING

    spec = _spec(tmp_path, '\n[maintenance]\nenabled = false\nschedule = "*/15 * * * *"\n')
    schedule = build_definitions(spec).get_schedule_def(maintenance_schedule_name(spec.pipeline()))
    assert schedule.cron_schedule == "*/15 * * * *"
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED


def test_the_maintenance_asset_imports_no_spark() -> None:
    """Every import on the asset's path (top level or inside a function), read from the source."""
    modules = ("krishiv_assets/maintenance.py", "krishiv/maintenance.py", "outbox/compaction.py", "outbox/expiry.py")
    for module in (*modules, "outbox/orphans.py"):
        tree = ast.parse((ROOT / module).read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {n for n in names if n.split(".")[0] in ("pyspark", "spark_jobs")}, module
