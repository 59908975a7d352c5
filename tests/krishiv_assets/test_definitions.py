"""The code location loads: every asset, check, job and sensor exists for each pipeline of the spec."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from krishiv_assets.definitions import build_definitions, build_resources
from krishiv_core.spec import parse_spec

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
            "late_events",
        }
        assert {k.name for k in graph.get_check_keys_for_assets({rejects_key})} == {
            "lineage_linear",
            "ledger_agreement",
        }
        check = graph.get_check_spec(dg.AssetCheckKey(table_key, "no_duplicate_windows"))
        assert check.blocking
        for sensor_name, jobs in (
            (f"{name}_outbox_sensor", [f"{name}_commit_job", f"{name}_checks_job"]),
            (f"{name}_kafka_sensor", [f"{name}_stage_job"]),
        ):
            sensor = repo.get_sensor_def(sensor_name)
            assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
            assert [t.job_name for t in sensor.targets] == jobs
        assert repo.get_job(f"{name}_stage_job").tags["krishiv/step"] == "stage"
        # The checks job checks every table of the pipeline and materializes nothing (the outbox sensor starts it
        # after reporting commits no commit run materialized).
        checks_job = repo.get_job(f"{name}_checks_job")
        assert not checks_job.asset_layer.selected_asset_keys
        assert checks_job.asset_layer.asset_graph.asset_check_keys == graph.get_check_keys_for_assets(
            {table_key, rejects_key}
        )
    pools = {a.op.pool for a in defs.assets if isinstance(a, dg.AssetsDefinition)}
    assert pools == {
        "krishiv_stage_orders_per_minute",
        "krishiv_commit_orders_per_minute",
        "krishiv_stage_refunds_per_minute",
        "krishiv_commit_refunds_per_minute",
        "krishiv_commit_removed_pipelines",
    }

    # Whatever the spec, one asset, check, job and sensor for the pending batches of pipelines it no longer has.
    removed = dg.AssetKey(["krishiv", "removed_pipelines"])
    assert graph.get(removed).group_name == "krishiv" and not graph.get(removed).parent_keys
    assert {k.name for k in graph.get_check_keys_for_assets({removed})} == {"nothing_pending"}
    assert repo.get_job("krishiv_removed_pipelines_commit_job").asset_layer.selected_asset_keys == {removed}
    assert repo.get_job("krishiv_removed_pipelines_commit_job").tags["krishiv/step"] == "commit"
    sensor = repo.get_sensor_def("krishiv_removed_pipelines_sensor")
    assert sensor.job_name == "krishiv_removed_pipelines_commit_job"
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING


def every_kind():
    """A windowed pipeline in update mode, an upsert, raw events and a fan-out, three of them on one topic."""
    fields = {"order_id": "string", "customer_id": "string", "amount": "decimal(12,2)", "event_time": "timestamp_ms"}
    return parse_spec(
        {
            "pipelines": [
                {
                    "name": "customer_minutes",
                    "topic": "orders",
                    "event_time_field": "event_time",
                    "group_by": ["customer_id"],
                    "output_mode": "update",
                    "fields": fields,
                    "aggregations": [{"name": "n", "function": "count"}],
                },
                {"name": "latest_order", "kind": "upsert", "topic": "orders", "key": ["customer_id"], "fields": fields},
                {"name": "raw", "kind": "events", "topic": "refunds", "fields": fields},
                {
                    "name": "routed",
                    "kind": "events",
                    "topic": "orders",
                    "route_by": "customer_id",
                    "routes": {"c-001": "orders_c001", "c-002": "orders_c002"},
                    "unrouted": "orders_other",
                    "kafka_metadata": True,
                    "fields": fields,
                },
            ]
        },
        env={},
    )


def test_every_kind_gets_its_row_check_and_a_fan_out_its_routes_as_assets():
    defs = build_definitions(every_kind())
    repo = defs.get_repository_def()
    graph = repo.asset_graph

    def key(table: str) -> dg.AssetKey:
        return dg.AssetKey(["iceberg", "krishiv", table])

    def checks(table: str) -> set[str]:
        return {k.name for k in graph.get_check_keys_for_assets({key(table)})}

    common = {"lineage_linear", "ledger_agreement"}
    assert checks("customer_minutes") == {"no_duplicate_windows", "rejects_rate", "late_events", *common}
    assert checks("latest_order") == {"no_duplicate_keys", "rejects_rate", *common}
    assert checks("raw") == {"offsets_at_most_once", "rejects_rate", *common}
    # The fan-out's routes and its default table are assets of the pipeline, each with its checks; the counts of
    # a batch are on the first route's entries, so the rejects rate is checked there.
    staged = dg.AssetKey(["routed", "staged_batches"])
    assert checks("orders_c001") == {"offsets_at_most_once", "rejects_rate", *common}
    for table in ("orders_c002", "orders_other"):
        assert graph.get(key(table)).parent_keys == {staged}
        assert checks(table) == {"offsets_at_most_once", *common}
    assert not graph.has(key("routed")), "a fan-out writes no table of the pipeline's name"
    for table in ("customer_minutes_rejects", "latest_order_rejects", "raw_rejects", "routed_rejects"):
        assert checks(table) == common
    for table, name in (
        ("customer_minutes", "no_duplicate_windows"),
        ("latest_order", "no_duplicate_keys"),
        ("orders_c002", "offsets_at_most_once"),
    ):
        assert graph.get_check_spec(dg.AssetCheckKey(key(table), name)).blocking
    assert (
        "customer_id"
        in graph.get_check_spec(dg.AssetCheckKey(key("customer_minutes"), "no_duplicate_windows")).description
    )

    # One commit run materializes every table the pipeline writes; three pipelines share one topic asset.
    commit = repo.get_job("routed_commit_job")
    assert commit.asset_layer.selected_asset_keys == {
        key(t) for t in ("orders_c001", "orders_c002", "orders_other", "routed_rejects")
    }
    assert graph.get(dg.AssetKey(["kafka", "orders"])).group_name == "kafka"
    assert graph.get(dg.AssetKey(["kafka", "refunds"])).group_name == "raw"
    assert graph.get(dg.AssetKey(["latest_order", "staged_batches"])).parent_keys == {dg.AssetKey(["kafka", "orders"])}


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


# ------------------------------------------------------------------------------------------ secrets

PASSWORD = "Dummy-Pa55word-in-krishiv.toml"


def _with_password(uri: str, where: str) -> str:
    """The test database's URI with :data:`PASSWORD` in its user-info or in its query string.

    The server trusts local connections, so any password works: the catalog is reached only if the run
    uses the real URI, not the redacted one the resources show.
    """
    scheme, rest = uri.split("://", 1)
    userinfo, address = rest.split("@", 1)
    user = userinfo.split(":", 1)[0]
    if where == "userinfo":
        return f"{scheme}://{user}:{PASSWORD}@{address}"
    return f"{scheme}://{user}@{address}?application_name=krishiv&password={PASSWORD}"


def _spec_file(folder: Path, catalog_uri: str) -> Path:
    from chaos.workspace import SPEC_TEMPLATE

    path = folder / "krishiv.toml"
    path.write_text(
        SPEC_TEMPLATE.format(
            bootstrap="127.0.0.1:9",  # never contacted: no sensor is evaluated and the commit job reads no topic
            partitions=1,
            catalog_uri=catalog_uri,
            warehouse="warehouse",
            topic="orders",
            max_records=100,
        )
    )
    return path


def _shown_to_the_ui(defs: dg.Definitions) -> str:
    """Everything the code location sends the webserver: resources' config, jobs' config schemas, assets…"""
    from dagster._core.remote_representation.external_data import RepositorySnap
    from dagster._serdes import serialize_value

    return serialize_value(RepositorySnap.from_def(defs.get_repository_def()))


@pytest.mark.parametrize("where", ["userinfo", "query"])
def test_a_password_in_the_spec_file_never_reaches_resource_config_but_runs_reach_the_catalog(
    tmp_path, postgres_uri, where, monkeypatch
):
    import pyarrow as pa

    import krishiv_core.catalog
    from krishiv_assets.assets import PipelineKeys
    from krishiv_assets.definitions import commit_job_name
    from krishiv_core.catalog import ensure_pipeline_tables, load_catalog, qualified, redact
    from krishiv_core.spec import load_spec

    uri = _with_password(postgres_uri, where)
    spec = load_spec(_spec_file(tmp_path, uri), env={})
    assert spec.iceberg.catalog_uri == uri
    pipeline = spec.pipeline()
    # A snapshot written outside Dagster, with the real URI: the run must find it.
    table = ensure_pipeline_tables(load_catalog(spec), spec, pipeline)[pipeline.table]
    schema = table.schema().as_arrow()
    row = {
        "window_start": [1_767_225_600_000_000],
        "window_end": [1_767_225_660_000_000],
        "order_count": [3],
        "amount_total": [None],
        "amount_min": [None],
        "amount_max": [None],
        "amount_avg": [None],
    }
    table.append(pa.table({name: row[name] for name in schema.names}).cast(schema))
    snapshot_id = table.current_snapshot().snapshot_id

    defs = build_definitions(spec)
    shown = _shown_to_the_ui(defs)
    assert PASSWORD not in shown
    resources = defs.get_repository_def().get_top_level_resources()
    assert PASSWORD not in repr(resources["iceberg"].config_schema.default_value)
    iceberg = build_resources(spec)["iceberg"]
    assert iceberg.uri == redact(uri) and "***" in iceberg.uri
    assert PASSWORD not in str(iceberg.model_dump()) and PASSWORD not in repr(iceberg)
    assert iceberg.uri in shown  # the UI shows the redacted URI, so the user sees which catalog it is

    # The server trusts local connections and would accept the redacted password too, so the run's catalog
    # loads are watched: the one load of the run (the commit and the checks share the resource's client) must
    # be given the spec file's real URI.
    loaded_with: list[str] = []

    def watched(spec):
        loaded_with.append(spec.catalog_uri())
        return load_catalog(spec)

    monkeypatch.setattr(krishiv_core.catalog, "load_catalog", watched)
    result = defs.resolve_job_def(commit_job_name(pipeline)).execute_in_process(raise_on_error=False)
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    assert loaded_with == [uri]
    keys = PipelineKeys.of(spec, pipeline)
    (materialization,) = [e for e in result.get_asset_materialization_events() if e.asset_key == keys.table]
    assert materialization.materialization.metadata["current_snapshot_id"].value == str(snapshot_id)
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert checks["no_duplicate_windows"].passed
    assert load_catalog(spec).load_table(qualified(spec, pipeline.table)).current_snapshot().snapshot_id == snapshot_id


def test_a_password_in_a_postgresql_ledger_uri_is_shown_redacted_and_the_run_reaches_the_ledger(tmp_path):
    """A ledger on PostgreSQL, its password in the spec file: the UI shows the URI redacted, the resource's ledger
    connects with the real one (the server trusts local connections, so the redacted one would connect too: the
    connection string is checked)."""
    import uuid

    import psycopg

    from krishiv_core.spec import load_spec
    from tests.conftest import PG_ADMIN_DSN

    schema = f"secret_{uuid.uuid4().hex[:10]}"
    uri = _with_password(f"{PG_ADMIN_DSN}?schema={schema}", "userinfo")
    path = _spec_file(tmp_path, "sqlite:///catalog.db")
    path.write_text(path.read_text().replace('ledger_path = "ledger.duckdb"', f'ledger_path = "{uri}"'))
    spec = load_spec(path, env={})
    try:
        defs = build_definitions(spec)
        assert PASSWORD not in _shown_to_the_ui(defs)
        ledger_resource = build_resources(spec)["ledger"]
        assert PASSWORD not in ledger_resource.path and "***" in ledger_resource.path
        ledger = ledger_resource.ledger()
        assert PASSWORD not in ledger.path
        assert PASSWORD in ledger._backend._conninfo  # the real URI, resolved from the spec file
        ledger.migrate()
        assert ledger.exists()
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as con:
            con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_a_failing_run_names_the_catalog_without_its_password(tmp_path):
    from krishiv.broker import free_port
    from krishiv_assets.definitions import commit_job_name
    from krishiv_core.spec import load_spec

    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    uri = f"postgresql+psycopg://krishiv:{PASSWORD}@{address}/db?sslpassword={PASSWORD}"
    spec = load_spec(_spec_file(tmp_path, uri), env={})
    defs = build_definitions(spec)
    result = defs.resolve_job_def(commit_job_name(spec.pipeline())).execute_in_process(raise_on_error=False)
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    message = failure.step_failure_data.user_failure_data.description
    assert f"CatalogUnavailable: Iceberg catalog at postgresql+psycopg://krishiv:***@{address}/db" in message
    assert "sslpassword=***" in message
    assert PASSWORD not in str([e.message for e in result.all_events])


def test_a_redacted_uri_that_is_not_the_spec_files_is_refused_by_name(tmp_path, monkeypatch):
    import krishiv_core.catalog
    from krishiv_assets.resources import IcebergCatalogResource
    from krishiv_core.errors import ConfigError

    spec = two_pipelines()
    foreign = IcebergCatalogResource(
        spec=spec, uri="postgresql+psycopg://app:***@elsewhere/db", warehouse=spec.iceberg.warehouse
    )
    with pytest.raises(ConfigError, match=r"^iceberg\.uri: .*KRISHIV_ICEBERG_CATALOG_URI"):
        foreign.catalog()
    # A URI without a secret, or one from the environment with its secret, is used as given.
    given = IcebergCatalogResource(spec=spec, uri=f"sqlite:///{tmp_path}/elsewhere.db", warehouse=str(tmp_path))
    assert given.catalog().properties["uri"] == f"sqlite:///{tmp_path}/elsewhere.db"
    assert given.catalog() is given.catalog()  # loaded once per resource instance
    secret = f"postgresql+psycopg://app:{PASSWORD}@elsewhere/db"
    monkeypatch.setattr(krishiv_core.catalog, "load_catalog", lambda spec: spec.catalog_uri())
    assert IcebergCatalogResource(spec=spec, uri=secret, warehouse="w").catalog() == secret


def test_a_secret_of_spark_conf_is_not_shown_but_reaches_the_runs_session(tmp_path, monkeypatch):
    from krishiv_core.spec import load_spec
    from spark_jobs.session import spark_conf

    monkeypatch.setenv("KRISHIV_TEST_SPARK_SECRET", "spark-secret-4711")
    path = _spec_file(tmp_path, "sqlite:///catalog.db")
    path.write_text(
        path.read_text()
        + '\n[spark.conf]\n"spark.authenticate.secret" = "${KRISHIV_TEST_SPARK_SECRET}"\n'
        + '"spark.executor.memory" = "1g"\n'
    )
    spec = load_spec(path, env=os.environ)
    defs = build_definitions(spec)
    shown = _shown_to_the_ui(defs)
    assert "spark-secret-4711" not in shown
    assert "KRISHIV_TEST_SPARK_SECRET" not in shown  # not even the reference: the key is left out
    resource = build_resources(spec, set())["spark"]
    assert resource.pyspark.spark_config["spark.executor.memory"] == "1g"
    assert "spark.authenticate.secret" not in resource.pyspark.spark_config
    assert spark_conf(spec)["spark.authenticate.secret"] == "spark-secret-4711"  # what session() adds
