"""The code location loads: every asset, check, job and sensor exists for each pipeline of the spec."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from krishiv.spec import parse_spec
from krishiv_assets.definitions import build_definitions, build_resources

ROOT = Path(__file__).resolve().parents[2]

PIPELINE = {
    "event_time_field": "t",
    "fields": {"t": "timestamp_ms", "amount": "decimal(12,2)"},
    "aggregations": [{"name": "n", "function": "count"}, {"name": "total", "function": "sum", "field": "amount"}],
}


def two_pipelines():
    return parse_spec(
        {
            "pipelines": [
                {"name": "orders_per_minute", "topic": "orders", **PIPELINE},
                {"name": "refunds_per_minute", "topic": "refunds", "table": "refunds", **PIPELINE},
            ]
        },
        env={},
    )


def test_every_pipeline_gets_its_assets_checks_jobs_and_sensors():
    defs = build_definitions(two_pipelines())
    repo = defs.get_repository_def()
    graph = repo.asset_graph
    for name, topic, table in (
        ("orders_per_minute", "orders", "orders_per_minute"),
        ("refunds_per_minute", "refunds", "refunds"),
    ):
        staged = dg.AssetKey([name, "staged_batches"])
        table_key = dg.AssetKey(["iceberg", "krishiv", table])
        rejects_key = dg.AssetKey(["iceberg", "krishiv", f"{table}_rejects"])
        assert graph.has(dg.AssetKey(["kafka", topic]))
        assert graph.get(staged).parent_keys == {dg.AssetKey(["kafka", topic])}
        assert graph.get(table_key).parent_keys == {staged}
        assert graph.get(rejects_key).parent_keys == {staged}
        assert {k.name for k in graph.get_check_keys_for_assets({table_key})} == {
            "no_duplicate_windows",
            "lineage_linear",
            "ledger_agreement",
            "rejects_rate",
        }
        check = graph.get_check_spec(dg.AssetCheckKey(table_key, "no_duplicate_windows"))
        assert check.blocking
        for sensor_name, job in (
            (f"{name}_outbox_sensor", f"{name}_commit_job"),
            (f"{name}_kafka_sensor", f"{name}_stage_job"),
        ):
            sensor = repo.get_sensor_def(sensor_name)
            assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
            assert sensor.job_name == job
        assert repo.get_job(f"{name}_stage_job").tags["krishiv/step"] == "stage"
    pools = {a.op.pool for a in defs.assets if isinstance(a, dg.AssetsDefinition)}
    assert pools == {
        "krishiv_stage_orders_per_minute",
        "krishiv_commit_orders_per_minute",
        "krishiv_stage_refunds_per_minute",
        "krishiv_commit_refunds_per_minute",
    }


def test_addresses_from_the_environment_are_env_vars_not_values():
    spec = two_pipelines()
    resources = build_resources(spec, env_overrides=["KRISHIV_ICEBERG_CATALOG_URI", "KRISHIV_KAFKA_BOOTSTRAP"])
    assert isinstance(resources["iceberg"].uri, dg.EnvVar)
    assert resources["iceberg"].uri.env_var_name == "KRISHIV_ICEBERG_CATALOG_URI"
    assert isinstance(resources["kafka"].bootstrap_servers, dg.EnvVar)
    assert resources["ledger"].path == spec.storage.ledger_path and not isinstance(resources["ledger"].path, dg.EnvVar)


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KRISHIV_")}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=120
    )


def test_import_reads_nothing_and_loading_names_a_missing_spec(tmp_path):
    missing = tmp_path / "nowhere.toml"
    imported = _python("import krishiv_assets.definitions", KRISHIV_SPEC=str(missing))
    assert imported.returncode == 0, imported.stderr
    loaded = _python("import krishiv_assets.definitions as d; d.defs()", KRISHIV_SPEC=str(missing))
    assert loaded.returncode != 0
    assert f"no spec file at {missing}" in loaded.stderr


@pytest.mark.timeout(180)
def test_the_repository_workspace_validates():
    """``workspace.yaml`` + ``krishiv.toml`` of the repository, loaded the way ``dagster dev`` loads them."""
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith(("KRISHIV_", "DAGSTER_HOME"))},
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All code locations passed validation" in result.stdout + result.stderr
