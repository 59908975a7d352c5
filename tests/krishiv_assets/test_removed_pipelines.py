"""What was staged is committed to the tables it was staged for, through Dagster too, whatever the spec says now.

A pipeline removed from the spec has no assets any more: ``krishiv/removed_pipelines``, its ``nothing_pending``
check, its job and ``krishiv_removed_pipelines_sensor`` commit its pending batches and show them until then. A route
removed from a pipeline the spec still has is taken by that pipeline's own commit run. Real broker, Spark, ledger and
SQLite catalog; a real ``krishiv commit`` killed between the catalog commit and the ledger mark.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from chaos.oracle import read_topic
from chaos.workspace import ORDER_FIELDS, SETTINGS_TEMPLATE
from krishiv.operations import open_ledger
from krishiv.produce import demo_orders, ensure_topic, produce
from krishiv_assets.assets import PipelineKeys
from krishiv_assets.definitions import build_definitions, build_resources, pipeline_definitions
from krishiv_assets.removed_pipelines import CHECK_NAME, JOB_NAME, REMOVED_KEY, SENSOR_NAME, ranges
from krishiv_assets.resources import KafkaResource, LedgerResource
from krishiv_assets.sensors import COMMITTER_GRACE_S
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.entries import COMMITTED, PENDING
from krishiv_core.spec import KrishivSpec, load_spec
from outbox.relay import high_water_marks
from spark_jobs.kafka_source import latest_offsets
from tests.krishiv.test_commit_paths import QUERY, rows_in, stage_batch, write_spec
from tests.spark_jobs.pipeline_helpers import krishiv_cli

#: Raw orders with their Kafka coordinates (each event's identity in the table), and a pipeline that stays.
TWO_PIPELINES = (
    SETTINGS_TEMPLATE
    + """
[[pipelines]]
name = "orders_raw"
kind = "events"
topic = "{topic}"
kafka_metadata = ["partition", "offset"]
max_records_per_batch = 50
{fields}
[[pipelines]]
name = "refunds"
kind = "events"
topic = "{topic}-refunds"
{fields}
"""
)


def write_two(folder: Path, bootstrap: str, topic: str, *, orders: bool = True) -> Path:
    text = TWO_PIPELINES.format(
        bootstrap=bootstrap,
        partitions=3,
        catalog_uri="sqlite:///catalog.db",
        warehouse="warehouse",
        topic=topic,
        fields=ORDER_FIELDS,
    )
    if not orders:  # the orders pipeline leaves the spec: everything from its [[pipelines]] to the next
        start = text.index("[[pipelines]]")
        text = text[:start] + text[text.index("[[pipelines]]", start + 1) :]
    path = folder / "krishiv.toml"
    path.write_text(text)
    return path


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def tick(spec: KrishivSpec, instance: dg.DagsterInstance, cursor: str | None = None):
    defs = build_definitions(spec)
    resources = {
        "ledger": LedgerResource(spec=spec, path=spec.storage.ledger_path),
        "kafka": KafkaResource(bootstrap_servers=spec.kafka.bootstrap_servers),
    }
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources, definitions=defs) as context:
        return defs.resolve_sensor_def(SENSOR_NAME).evaluate_tick(context)


def run_job(spec: KrishivSpec, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    return build_definitions(spec).resolve_job_def(JOB_NAME).execute_in_process(instance=instance, raise_on_error=False)


def metadata(result: dg.ExecuteInProcessResult, key: dg.AssetKey = REMOVED_KEY) -> dict:
    (event,) = [e for e in result.get_asset_materialization_events() if e.asset_key == key]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def logged(instance: dg.DagsterInstance, result: dg.ExecuteInProcessResult, containing: str) -> list[str]:
    return [e.user_message for e in instance.all_logs(result.run_id) if containing in (e.user_message or "")]


def coordinates(spec: KrishivSpec, table: str, partition: str, offset: str) -> Counter:
    rows = load_catalog(spec).load_table(qualified(spec, table)).scan().to_arrow()
    return Counter(zip(rows[partition].to_pylist(), rows[offset].to_pylist(), strict=True))


def test_a_removed_pipelines_batches_are_committed_by_the_sensors_run_once_each(
    tmp_path, broker, spark, topic, instance
):
    """Stage a pipeline's events through Dagster, remove the pipeline from the spec, let a ``krishiv commit`` die
    between the catalog commit of a batch and its ledger mark: the sensor shows the pipeline and its batches and
    requests the removed-pipelines job, which commits the rest and finds that batch already in the table. Every
    produced event is then in one row exactly once (a malformed one in the rejects table), and running again
    commits nothing."""
    spec_file = write_two(tmp_path, broker.bootstrap, topic)
    spec = load_spec(spec_file, env={})
    pipeline = spec.pipeline("orders_raw")
    partitions = ensure_topic(spec.kafka.bootstrap_servers, topic, spec.kafka.partitions)
    events = demo_orders(300, seed=5, partitions=partitions, malformed=6)
    produce(spec.kafka.bootstrap_servers, topic, events)

    parts, keys = pipeline_definitions(spec, pipeline), PipelineKeys.of(spec, pipeline)
    staged = dg.materialize(parts.assets, resources=build_resources(spec), selection=[keys.staged])
    assert metadata(staged, keys.staged)["records_read"] == 300
    ledger = open_ledger(spec)
    table, rejects = qualified(spec, "orders_raw"), qualified(spec, "orders_raw_rejects")
    batches = sorted({e.batch_id for e in ledger.entries(table)})
    assert len(batches) >= 4 and {e.status for e in ledger.entries()} == {PENDING}
    (query,) = ledger.query_ids("orders_raw")

    # The oracle: what the topic holds, each record a row of the table or of the rejects table.
    ends = {int(p): end for p, end in latest_offsets(spec.kafka.bootstrap_servers, topic).items()}
    records = read_topic(spec.kafka.bootstrap_servers, topic, partitions, ends)
    valid = {e.value for e in events if e.kind == "valid"}
    expected = {at for at, value in records.items() if value in valid}
    malformed = set(records) - expected
    assert len(expected) == 294 and len(malformed) == 6

    # The pipeline leaves the spec; a krishiv commit is killed after batch 1 went into the table, before the ledger
    # marked it.
    write_two(tmp_path, broker.bootstrap, topic, orders=False)
    spec = load_spec(spec_file, env={})
    assert [p.name for p in spec.pipelines] == ["refunds"]
    crashed = krishiv_cli(spec_file, "commit", faults="relay.after_catalog_commit@1:kill")
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert high_water_marks(load_catalog(spec).load_table(table)) == {query: 1}
    assert ledger.get(query, table, 0).status == COMMITTED and ledger.get(query, table, 1).status == PENDING

    # The sensor shows the removed pipeline and its batches, and requests a commit run for them.
    last = batches[-1]
    shown = (
        f"orders_raw (no longer in the spec): {len(batches)} batches (0-{last}) pending for "
        f"krishiv.orders_raw, krishiv.orders_raw_rejects"
    )
    assert batches == list(range(last + 1))
    first = tick(spec, instance)
    (request,) = first.run_requests
    assert request.run_key == f"removed_pipelines:commit:{query[:8]}:0-{last}"
    assert request.tags["krishiv/pipelines"] == "orders_raw"
    (evaluation,) = first.asset_events
    assert evaluation.asset_key == REMOVED_KEY and evaluation.check_name == CHECK_NAME and not evaluation.passed
    assert evaluation.severity == dg.AssetCheckSeverity.WARN
    assert evaluation.description.startswith(shown + "; ")
    assert evaluation.metadata["pending_batches"].value == len(batches)
    instance.report_runless_asset_event(evaluation)  # what the daemon does with it: the UI's check result
    again = tick(spec, instance, first.cursor)
    assert not again.run_requests and not again.asset_events
    assert again.skip_message.startswith(shown + "; ") and "already requested" in again.skip_message

    result = run_job(spec, instance)
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    done = metadata(result)
    assert done["pipelines"] == 1 and done["batches_found_committed"] == 1 and done["pending_entries"] == 0
    assert done["tables_refused"] == 0
    assert done["removed_pipelines"]["orders_raw"]["tables"][table]["found_committed"] == [1]
    before, outcome = logged(instance, result, "orders_raw (no longer in the spec)")  # a line each, nothing else
    assert before == f"{shown}: committing them to the tables they were staged for"
    assert outcome.startswith(f"orders_raw (no longer in the spec): {table}: batches 2-{last} committed (")
    assert "batch 1 found already there" in outcome and outcome.endswith("; nothing of it is pending now")
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.check_name == CHECK_NAME and evaluation.passed

    # Every event once: the oracle's coordinates, none twice; the malformed ones in the rejects table; all committed.
    rows = coordinates(spec, "orders_raw", "_kafka_partition", "_kafka_offset")
    assert set(rows) == expected and set(rows.values()) == {1}
    rejected = coordinates(spec, "orders_raw_rejects", "partition", "offset")
    assert set(rejected) == malformed and set(rejected.values()) == {1}
    assert {e.status for e in ledger.entries(table) + ledger.entries(rejects)} == {COMMITTED}
    head = load_catalog(spec).load_table(table).current_snapshot().snapshot_id

    # Nothing pending: the sensor says so once (the check passes) and requests nothing; a run commits nothing.
    cleared = tick(spec, instance, again.cursor)
    assert not cleared.run_requests
    ((evaluation,),) = [cleared.asset_events]
    assert evaluation.passed and evaluation.description == "no pipeline removed from the spec has pending batches"
    quiet = tick(spec, instance, cleared.cursor)
    assert not quiet.run_requests and not quiet.asset_events
    assert quiet.skip_message == "no pending outbox entries for pipelines removed from the spec"
    rerun = run_job(spec, instance)
    assert rerun.success
    assert metadata(rerun)["snapshots_committed"] == 0 and metadata(rerun)["batches_found_committed"] == 0
    assert load_catalog(spec).load_table(table).current_snapshot().snapshot_id == head
    assert coordinates(spec, "orders_raw", "_kafka_partition", "_kafka_offset") == rows


def test_a_removed_route_is_committed_by_its_pipelines_commit_run(tmp_path: Path, instance) -> None:
    """A route removed from a pipeline the spec still has: the pipeline's Dagster commit run commits the route's
    pending batches to the route's table, once, and the removed-pipelines sensor has nothing to do."""
    spec_file = write_spec(tmp_path)
    spec = load_spec(spec_file, env={})
    catalog, ledger = load_catalog(spec), open_ledger(spec)
    pipeline = spec.pipeline("orders_routed")
    for b in range(2):
        stage_batch(spec, pipeline, catalog, ledger, b)
    route = qualified(spec, "orders_c002")

    write_spec(tmp_path, routes='"c-001" = "orders_c001"')
    spec = load_spec(spec_file, env={})
    pipeline = spec.pipeline("orders_routed")
    assert route not in [qualified(spec, t) for t in pipeline.all_tables]
    assert tick(spec, instance).skip_message == "no pending outbox entries for pipelines removed from the spec"

    parts, keys = pipeline_definitions(spec, pipeline), PipelineKeys.of(spec, pipeline)
    selection = dg.AssetSelection.assets(*keys.tables.values()).without_checks()

    def commit() -> dg.ExecuteInProcessResult:
        return dg.materialize(
            [*parts.assets, *parts.checks], resources=build_resources(spec), selection=selection, instance=instance
        )

    result = commit()
    assert result.success
    assert logged(instance, result, "(no longer in the spec)") == [
        f"{route} (no longer in the spec): committed batches [0, 1], found [] already there"
    ]
    ids = load_catalog(spec).load_table(route).scan().to_arrow()["order_id"].to_pylist()
    assert Counter(ids) == Counter(f"orders_c002-{b}-{n}" for b in range(2) for n in range(2))
    assert {e.status for e in ledger.entries()} == {COMMITTED}
    head = load_catalog(spec).load_table(route).current_snapshot().snapshot_id

    again = commit()
    assert again.success and not logged(instance, again, "(no longer in the spec)")
    assert load_catalog(spec).load_table(route).current_snapshot().snapshot_id == head and rows_in(catalog, route) == 4


def test_a_removed_pipelines_refused_table_stops_only_itself(tmp_path: Path, instance) -> None:
    """A staged file of a removed pipeline is gone: the run commits the batch before it to both tables, materializes,
    then fails naming the table, the file and the way out; the batch stays pending in both tables (it is committed
    to all of its tables or to none), and the check and the sensor go on showing it pending."""
    spec_file = write_spec(tmp_path, second=True)
    spec = load_spec(spec_file, env={})
    catalog, ledger = load_catalog(spec), open_ledger(spec)
    for b in range(2):
        stage_batch(spec, spec.pipeline("payments"), catalog, ledger, b)
    payments, rejects = qualified(spec, "payments"), qualified(spec, "payments_rejects")
    (gone,) = ledger.get(QUERY + "payments", payments, 1).files
    Path(gone.path.removeprefix("file://")).unlink()
    write_spec(tmp_path)
    spec = load_spec(spec_file, env={})

    result = run_job(spec, instance)
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    message = failure.step_failure_data.user_failure_data.description
    assert "TablesRefused" in message and payments in message and gone.path in message and "krishiv commit" in message
    done = metadata(result)
    assert done["tables_refused"] == 2 and done["snapshots_committed"] == 2 and done["pending_entries"] == 2
    (line,) = logged(instance, result, "still pending")
    assert line.startswith(f"payments (no longer in the spec): {payments}: batch 0 committed (2 rows), refused: ")
    assert gone.path in line
    assert f"; {rejects}: batch 0 committed (1 rows), refused: staged file {gone.path} " in line
    assert line.endswith("; 1 batch (1) still pending")
    assert [e.status for e in sorted(ledger.entries(payments), key=lambda e: e.batch_id)] == [COMMITTED, PENDING]
    assert [e.status for e in sorted(ledger.entries(rejects), key=lambda e: e.batch_id)] == [COMMITTED, PENDING]
    assert rows_in(catalog, payments) == 2 and rows_in(catalog, rejects) == 1

    shown = tick(spec, instance)
    (evaluation,) = shown.asset_events
    assert not evaluation.passed
    assert evaluation.description.startswith(
        f"payments (no longer in the spec): 1 batch (1) pending for {payments}, {rejects};"
    )


def test_a_removed_pipeline_still_run_by_a_committing_process_is_left_to_it(tmp_path: Path, instance) -> None:
    """A ``krishiv run`` started before the spec changed still stages and commits the pipeline: its fresh batches
    are its own, and only those pending past the grace get a commit run."""
    spec_file = write_spec(tmp_path, second=True)
    spec = load_spec(spec_file, env={})
    catalog, ledger = load_catalog(spec), open_ledger(spec)
    ledger.acquire_lease("payments", "krishiv run", 60, committing=True)
    stage_batch(spec, spec.pipeline("payments"), catalog, ledger, 0)
    write_spec(tmp_path)
    spec = load_spec(spec_file, env={})

    fresh = tick(spec, instance)
    assert not fresh.run_requests
    assert "payments: 2 of 2 pending entries are left to krishiv run (pid" in fresh.skip_message
    (evaluation,) = fresh.asset_events
    assert not evaluation.passed, "pending all the same: the UI shows it"

    with duckdb.connect(str(spec.resolve(spec.storage.ledger_path))) as con:
        con.execute(f"UPDATE outbox SET created_at = created_at - INTERVAL {COMMITTER_GRACE_S + 5} SECOND")
    (request,) = tick(spec, instance, fresh.cursor).run_requests
    assert request.run_key == f"removed_pipelines:commit:{(QUERY + 'payments')[:8]}:0-0"


def test_batch_ranges_read_as_ranges() -> None:
    assert ranges([7, 0, 1, 2, 3, 5, 8]) == "0-3, 5, 7-8"
    assert ranges([4]) == "4" and ranges([]) == ""
