"""The staging and table assets materialized in-process with real resources: broker, Spark, SQLite catalog."""

from __future__ import annotations

from dataclasses import replace

import dagster as dg
import pyarrow as pa
import pytest

from krishiv.operations import open_ledger
from krishiv_assets.assets import PipelineKeys
from krishiv_assets.definitions import build_definitions, build_resources, pipeline_definitions
from krishiv_core.catalog import ensure_pipeline_tables, load_catalog, qualified
from krishiv_core.spec import WINDOWED
from tests.krishiv.test_verify import append, first_row, kinds_spec, load, produce_kinds
from tests.spark_jobs.pipeline_helpers import assert_exactly_once, produce_orders


def _materialize(spec, selection: dg.AssetSelection | None = None) -> dg.ExecuteInProcessResult:
    parts = pipeline_definitions(spec, spec.pipeline())
    return dg.materialize(
        [*parts.assets, *parts.checks], resources=build_resources(spec), selection=selection, raise_on_error=False
    )


def _metadata(result: dg.ExecuteInProcessResult, key: dg.AssetKey) -> dict:
    """The metadata values of the asset's one materialization in the run."""
    (event,) = [e for e in result.get_asset_materialization_events() if e.asset_key == key]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_materialize_stages_commits_and_checks_pass(make_spec, broker, spark):
    spec = make_spec(max_records=1_000)
    produce_orders(spec, 3_000, late=10, malformed=6)

    result = _materialize(spec)
    assert result.success
    keys = PipelineKeys.of(spec, spec.pipeline())
    staged = _metadata(result, keys.staged)
    assert staged["records_read"] == 3_000
    assert staged["batches_staged"] >= 3
    assert staged["rejects"] == 6
    assert staged["late_events"] > 0
    assert sum(staged["staged_through_offsets"].values()) == 3_000

    table = _metadata(result, keys.table)
    assert table["snapshots_committed"] >= 2
    assert table["pending_entries"] == 0
    iceberg = load_catalog(spec).load_table(qualified(spec, spec.pipeline().table))
    current = iceberg.current_snapshot()
    assert table["current_snapshot_id"] == str(current.snapshot_id)  # an id is text: the UI does not plot it
    assert table["dagster/row_count"] == int(current.summary["total-records"])
    assert table["commit_latency_p50_ms"] > 0
    # What this first commit run added is the whole table: its rows and its files' bytes (no compaction yet).
    assert table["rows_added"] == int(current.summary["total-records"])
    assert table["bytes_added"] == sum(iceberg.inspect.files()["file_size_in_bytes"].to_pylist())
    assert table["rejects"] == staged["rejects"] and table["late_events"] == staged["late_events"]
    assert table["staged_to_committed_s"] >= 0
    assert table["committed_by"] == f"dagster run {result.run_id}"
    rejects = _metadata(result, keys.rejects)
    # The rejects table holds the malformed and the late events; the batch counts go on the first table only.
    assert rejects["rows_added"] == 6 + staged["late_events"] and "rejects" not in rejects

    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(checks) == {"no_duplicate_windows", "lineage_linear", "ledger_agreement", "rejects_rate", "late_events"}
    assert all(e.passed for e in checks.values()), {n: e.description for n, e in checks.items()}
    assert checks["rejects_rate"].metadata["rejects"].value == 6
    late_by_batch = checks["late_events"].metadata["late_by_batch"].value
    assert sum(late_by_batch.values()) == staged["late_events"] == checks["late_events"].metadata["late_events"].value

    assert_exactly_once(spec)

    # Nothing new: a second materialization stages nothing and commits nothing.
    again = _materialize(spec)
    assert again.success
    assert _metadata(again, keys.staged)["batches_staged"] == 0
    assert _metadata(again, keys.table)["snapshots_committed"] == 0
    assert_exactly_once(spec)


def _one_window(table) -> pa.Table:
    """One closed window of the aggregate table, in the table's schema."""
    row = {
        "window_start": pa.array([1_767_225_600_000_000], pa.timestamp("us", tz="UTC")),
        "window_end": pa.array([1_767_225_660_000_000], pa.timestamp("us", tz="UTC")),
        "order_count": pa.array([3], pa.int64()),
        "amount_total": pa.array([pa.scalar(10, pa.decimal128(22, 2)).as_py()], pa.decimal128(22, 2)),
        "amount_min": pa.array([pa.scalar(1, pa.decimal128(12, 2)).as_py()], pa.decimal128(12, 2)),
        "amount_max": pa.array([pa.scalar(5, pa.decimal128(12, 2)).as_py()], pa.decimal128(12, 2)),
        "amount_avg": pa.array([3.3], pa.float64()),
    }
    schema = table.schema().as_arrow()
    return pa.table(row).select(schema.names).cast(schema)


def test_duplicate_check_fails_naming_the_windows_and_snapshots(make_spec):
    spec = make_spec()
    pipeline = spec.pipeline()
    table = ensure_pipeline_tables(load_catalog(spec), spec, pipeline)[pipeline.table]
    once = _one_window(table)
    table.append(once)
    table.append(once)  # the same window again, written directly by a second writer
    snapshots = [s.snapshot_id for s in load_catalog(spec).load_table(qualified(spec, pipeline.table)).snapshots()]

    keys = PipelineKeys.of(spec, pipeline)
    result = _materialize(spec, dg.AssetSelection.checks(dg.AssetCheckKey(keys.table, "no_duplicate_windows")))
    (evaluation,) = result.get_asset_check_evaluations()
    assert not evaluation.passed
    assert evaluation.metadata["duplicate_windows"].value == 1
    offending = evaluation.metadata["offending_windows"].value
    assert offending == {"window 2026-01-01 00:00:00+00:00 to 2026-01-01 00:01:00+00:00": sorted(snapshots)}
    assert evaluation.description == (
        "1 windows appear more than once, first window 2026-01-01 00:00:00+00:00 to 2026-01-01 00:01:00+00:00 (2 rows)"
    )


def _checks(result: dg.ExecuteInProcessResult) -> dict[tuple[str, str], dg.AssetCheckEvaluation]:
    """Each check evaluation of the run, by (table, check name)."""
    return {(e.asset_key.path[-1], e.check_name): e for e in result.get_asset_check_evaluations()}


def test_every_kind_materializes_and_its_checks_pass_then_fail_naming_a_second_writers_rows(
    tmp_path, broker, spark, topic
):
    """Four pipelines of every kind from one topic, staged and committed by Dagster; then a second writer appends
    rows that are already there and each kind's check names them."""
    spec = kinds_spec(tmp_path, broker.bootstrap, topic)
    produce_kinds(spec)
    defs = build_definitions(spec)
    everything = [*defs.assets, *defs.asset_checks]
    result = dg.materialize(everything, resources=build_resources(spec), raise_on_error=False)
    assert result.success, [e.message for e in result.all_events if e.is_failure]

    checks = _checks(result)
    tables = [t for p in spec.pipelines for t in p.all_tables]
    rows = {"customer_minutes": "no_duplicate_windows", "latest_order": "no_duplicate_keys"}
    rows |= {t: "offsets_at_most_once" for t in ("orders_plain", "orders_c001", "orders_c002", "orders_other")}
    expected = {(t, c) for t in tables for c in ("lineage_linear", "ledger_agreement")}
    expected |= set(rows.items())
    expected |= {(p.tables[0], "rejects_rate") for p in spec.pipelines}
    expected |= {(p.table, "late_events") for p in spec.pipelines if p.kind == WINDOWED}
    expected.add(("removed_pipelines", "nothing_pending"))  # the fixed asset of pipelines no longer in the spec
    assert set(checks) == expected
    warnings = ("rejects_rate", "late_events")  # shares of what the stream holds, not faults
    failed = {k: e.description for k, e in checks.items() if not e.passed and k[1] not in warnings}
    assert failed == {}
    for p in spec.pipelines:
        staged = _metadata(result, dg.AssetKey([p.name, "staged_batches"]))
        assert staged["records_read"] == 2_000 and staged["rows_staged"] > 0 and staged["rejects"] == 20
        for t in p.all_tables:  # the commit run materialized every table it committed, routes too
            assert _metadata(result, dg.AssetKey(["iceberg", "krishiv", t]))["pending_entries"] == 0
    assert checks[("orders_other", "offsets_at_most_once")].metadata["by_offset"].value is True
    assert checks[("orders_plain", "offsets_at_most_once")].metadata["by_offset"].value is False

    window = append(spec, "customer_minutes", first_row(spec, "customer_minutes"))
    key = append(spec, "latest_order", first_row(spec, "latest_order"))["customer_id"]
    routed = load(spec, "orders_other").scan().to_arrow()
    event = append(spec, "orders_other", routed.slice(0, 1))
    moved = append(spec, "orders_c001", routed.slice(1, 1))
    plain_rows = load(spec, "orders_plain").scan().to_arrow().num_rows
    append(spec, "orders_plain", first_row(spec, "orders_plain"))

    selection = dg.AssetSelection.checks(
        *(dg.AssetCheckKey(dg.AssetKey(["iceberg", "krishiv", t]), c) for t, c in rows.items())
    )
    checks = _checks(
        dg.materialize(everything, resources=build_resources(spec), selection=selection, raise_on_error=False)
    )
    assert {k for k, e in checks.items() if not e.passed} == {
        (t, rows[t]) for t in ("customer_minutes", "latest_order", "orders_other", "orders_c001", "orders_plain")
    }
    assert checks[("orders_c002", "offsets_at_most_once")].passed

    windows = checks[("customer_minutes", "no_duplicate_windows")]
    label = f"window {window['window_start']} to {window['window_end']}, customer_id='{window['customer_id']}'"
    assert windows.metadata["duplicate_windows"].value == 1
    assert list(windows.metadata["offending_windows"].value) == [label]
    assert windows.description.endswith(f"first {label} (2 rows)")

    keys = checks[("latest_order", "no_duplicate_keys")]
    assert keys.metadata["duplicate_keys"].value == 1
    (snapshots,) = keys.metadata["offending_keys"].value.values()
    assert list(keys.metadata["offending_keys"].value) == [f"key customer_id='{key}'"] and len(snapshots) == 2

    other, c001 = (qualified(spec, t) for t in ("orders_other", "orders_c001"))
    at = f"Kafka partition {event['_kafka_partition']} offset {event['_kafka_offset']}"
    moved_at = f"Kafka partition {moved['_kafka_partition']} offset {moved['_kafka_offset']}"
    offsets = checks[("orders_other", "offsets_at_most_once")].metadata
    assert offsets["repeated_offsets"].value == 2
    named = offsets["offending_offsets"].value
    assert named[at]["tables"] == {other: 2} and len(named[at]["snapshots"]) == 2
    assert named[moved_at]["tables"] == {c001: 1, other: 1}
    offsets = checks[("orders_c001", "offsets_at_most_once")].metadata
    assert list(offsets["offending_offsets"].value) == [moved_at]

    plain = checks[("orders_plain", "offsets_at_most_once")]
    assert plain.description.startswith(
        f"{qualified(spec, 'orders_plain')} holds {plain_rows + 1} rows, the ledger committed {plain_rows}: rows "
        "were added or lost outside Krishiv"
    )


def test_commit_with_the_catalog_down_fails_naming_it_and_leaves_work_pending(make_spec):
    from krishiv.broker import free_port
    from krishiv_assets.resources import IcebergCatalogResource
    from krishiv_core.entries import PENDING, OutboxEntry, StagedFile

    spec = make_spec()
    pipeline = spec.pipeline()
    ledger = open_ledger(spec)
    staged = (StagedFile("file:///nowhere/part-0.parquet", records=5, bytes=100),)
    ledger.record_batch([OutboxEntry("q", pipeline.name, qualified(spec, pipeline.table), 0, {}, staged, 42, {})])
    address = f"127.0.0.1:{free_port()}"
    resources = {
        **build_resources(spec),
        "iceberg": IcebergCatalogResource(
            spec=spec, uri=f"postgresql+psycopg://krishiv@{address}/db", warehouse="warehouse"
        ),
    }
    parts = pipeline_definitions(spec, pipeline)
    keys = PipelineKeys.of(spec, pipeline)
    result = dg.materialize(
        [*parts.assets, *parts.checks],
        resources=resources,
        selection=dg.AssetSelection.assets(keys.table, keys.rejects).without_checks(),
        raise_on_error=False,
    )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    message = failure.step_failure_data.user_failure_data.description
    assert "CatalogUnavailable" in message and address in message
    assert [e.status for e in ledger.entries()] == [PENDING]


def test_a_commit_run_writes_to_the_resources_catalog_and_ledger_not_the_specs(make_spec, tmp_path):
    """The assets and checks use the clients of the resources they are given, whatever the spec says."""
    import pyarrow.parquet as pq
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    from krishiv_assets.resources import IcebergCatalogResource, LedgerResource
    from krishiv_core.entries import COMMITTED, OutboxEntry, StagedFile

    spec = make_spec()
    pipeline = spec.pipeline()
    other = tmp_path / "elsewhere"
    elsewhere = replace(
        spec,
        iceberg=replace(spec.iceberg, catalog_uri=f"sqlite:///{other}/catalog.db", warehouse=str(other / "warehouse")),
        storage=replace(spec.storage, ledger_path=str(other / "ledger.duckdb")),
    )
    table = ensure_pipeline_tables(load_catalog(elsewhere), elsewhere, pipeline)[pipeline.table]
    staged = other / "staged" / "part-0.parquet"
    staged.parent.mkdir(parents=True)
    pq.write_table(_one_window(table), staged)
    ledger = open_ledger(elsewhere)
    file = StagedFile(staged.as_uri(), records=1, bytes=staged.stat().st_size)
    ledger.record_batch([OutboxEntry("q", pipeline.name, qualified(spec, pipeline.table), 0, {}, (file,), 42, {})])

    resources = {
        **build_resources(spec),
        "iceberg": IcebergCatalogResource(
            spec=spec, uri=elsewhere.iceberg.catalog_uri, warehouse=elsewhere.iceberg.warehouse
        ),
        "ledger": LedgerResource(spec=spec, path=elsewhere.storage.ledger_path),
    }
    parts = pipeline_definitions(spec, pipeline)
    keys = PipelineKeys.of(spec, pipeline)
    result = dg.materialize(
        [*parts.assets, *parts.checks],
        resources=resources,
        selection=dg.AssetSelection.assets(keys.table, keys.rejects),
        raise_on_error=False,
    )
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    assert _metadata(result, keys.table)["current_snapshot_id"] == "42"
    assert _metadata(result, keys.table)["snapshots_committed"] == 1
    assert load_catalog(elsewhere).load_table(qualified(spec, pipeline.table)).current_snapshot().snapshot_id == 42
    assert [e.status for e in ledger.entries()] == [COMMITTED]
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert checks["ledger_agreement"].passed, checks["ledger_agreement"].description
    # The spec's own catalog and ledger were never touched.
    with pytest.raises((NoSuchNamespaceError, NoSuchTableError)):
        load_catalog(spec).load_table(qualified(spec, pipeline.table))
    assert not spec.resolve(spec.storage.ledger_path).exists()


def _boom(_self):
    raise RuntimeError("[JAVA_GATEWAY_EXITED] Java gateway process exited before sending its port number.\nmore")


@pytest.mark.parametrize("cause", ["no java", "gateway exited"])
def test_spark_that_cannot_start_fails_the_staging_run_in_one_line(make_spec, monkeypatch, cause):
    from krishiv_assets.resources import LazySparkSession

    spec = make_spec()
    if cause == "no java":
        monkeypatch.setenv("JAVA_HOME", str(spec.base_dir / "no-java-here"))
        expected = "EnvironmentProblem: Spark needs Java 17 or newer and none was found on PATH or in JAVA_HOME"
    else:
        monkeypatch.setattr(LazySparkSession, "spark_session", property(_boom))
        expected = "EnvironmentProblem: Spark did not start (master local[2]): [JAVA_GATEWAY_EXITED] Java gateway"
    keys = PipelineKeys.of(spec, spec.pipeline())
    result = _materialize(spec, dg.AssetSelection.assets(keys.staged))
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    message = failure.step_failure_data.user_failure_data.description
    assert message.startswith(expected) and "\n" not in message
