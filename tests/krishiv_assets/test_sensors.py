"""Sensor ticks evaluated against a real ledger file and a real broker (``build_sensor_context``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import dagster as dg
import duckdb
import pytest

from krishiv.operations import open_ledger
from krishiv_assets.assets import PipelineKeys
from krishiv_assets.definitions import build_definitions
from krishiv_assets.resources import IcebergCatalogResource, KafkaResource, LedgerResource
from krishiv_assets.sensors import COMMITTER_GRACE_S, HISTORY_PER_TABLE, RETRY_AFTER_S, SensorCursor
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.entries import OutboxEntry
from krishiv_core.spec import KrishivSpec
from outbox.relay import CommitRelay
from tests.krishiv.test_verify import kinds_spec, produce_kinds
from tests.outbox.test_relay import stage
from tests.spark_jobs.pipeline_helpers import krishiv_cli, produce_orders

QUERY = "0f0e0d0c-0000-4000-8000-000000000001"


def _record(spec: KrishivSpec, batch_id: int, partition_ends: dict[str, int]) -> None:
    """A staged batch of both tables, as the Spark job records it (no files are needed by the sensors)."""
    pipeline = spec.pipeline()
    offsets = {pipeline.topic: {p: [max(0, end - 10), end] for p, end in partition_ends.items()}}
    ledger = open_ledger(spec)
    ledger.record_batch(
        [
            OutboxEntry(QUERY, pipeline.name, qualified(spec, t), batch_id, offsets, (), 1_000 + batch_id, {})
            for t in (pipeline.table, pipeline.rejects_table)
        ]
    )


def commit_events(result: dg.SensorResult | dg.SkipReason) -> list[dg.AssetMaterialization]:
    """The commits an outbox sensor tick reported: its asset events but the staging asset's data version report
    (krishiv_assets/data_versions.py, tested in test_data_versions.py)."""
    events = getattr(result, "asset_events", None) or []
    return [e for e in events if e.asset_key.path[-1] != "staged_batches"]


def _tick(spec: KrishivSpec, name: str, cursor: str | None, instance: dg.DagsterInstance):
    defs = build_definitions(spec)
    sensor = defs.resolve_sensor_def(name)
    resources = {
        "ledger": LedgerResource(spec=spec, path=spec.storage.ledger_path),
        "kafka": KafkaResource(bootstrap_servers=spec.kafka.bootstrap_servers),
        "iceberg": IcebergCatalogResource(spec=spec, uri=spec.iceberg.catalog_uri, warehouse=spec.iceberg.warehouse),
    }
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources, definitions=defs) as context:
        return sensor.evaluate_tick(context)


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def test_outbox_sensor_requests_each_pending_range_once(make_spec, instance):
    spec = make_spec()
    name = "orders_per_minute_outbox_sensor"

    tick = _tick(spec, name, None, instance)
    assert not tick.run_requests and "no pending outbox entries" in tick.skip_message

    for batch in range(3):
        _record(spec, batch, {"0": 10 * (batch + 1)})
    tick = _tick(spec, name, None, instance)
    (request,) = tick.run_requests
    assert request.run_key == f"orders_per_minute:commit:{QUERY[:8]}:0-2"
    assert SensorCursor.parse(tick.cursor).requested == {QUERY: 2}

    # The same range is not requested twice.
    again = _tick(spec, name, tick.cursor, instance)
    assert not again.run_requests and "already requested" in again.skip_message
    assert again.cursor in (None, tick.cursor)

    # A new batch is a new range, and the cursor moves on.
    _record(spec, 3, {"0": 40})
    newer = _tick(spec, name, tick.cursor, instance)
    (request,) = newer.run_requests
    assert request.run_key == f"orders_per_minute:commit:{QUERY[:8]}:3-3"
    assert SensorCursor.parse(newer.cursor).requested == {QUERY: 3}

    # Still pending long after the request, with no commit run in flight (it failed): requested again.
    stale = SensorCursor.parse(newer.cursor)
    stale.requested_at -= RETRY_AFTER_S + 1
    retry = _tick(spec, name, stale.dumps(), instance)
    (request,) = retry.run_requests
    assert request.run_key == f"orders_per_minute:commit:{QUERY[:8]}:0-3:retry-1"


def test_sensors_of_a_fan_out_watch_every_route(tmp_path, broker, topic, instance):
    """The outbox sensor requests a commit for a batch pending in any route's table; the Kafka sensor reads what
    the ledger staged from the first route's entries (a fan-out has no table of the pipeline's name)."""
    spec = kinds_spec(tmp_path, broker.bootstrap, topic)
    pipeline = spec.pipeline("orders_routed")
    outbox, kafka = "orders_routed_outbox_sensor", "orders_routed_kafka_sensor"
    ledger = open_ledger(spec)

    def entry(table: str, batch_id: int, ends: dict[str, int]) -> OutboxEntry:
        offsets = {pipeline.topic: {p: [0, end] for p, end in ends.items()}}
        return OutboxEntry(QUERY, pipeline.name, qualified(spec, table), batch_id, offsets, (), 1_000 + batch_id, {})

    tick = _tick(spec, outbox, None, instance)
    assert not tick.run_requests and tick.skip_message == "no pending outbox entries for orders_routed's 4 tables"

    produce_kinds(spec, 30)
    ends = SensorCursor.parse(_tick(spec, kafka, None, instance).cursor).requested
    assert sum(ends.values()) == 30
    ledger.record_batch([entry(t, 0, ends) for t in pipeline.all_tables])
    for e in ledger.entries():
        if e.table != qualified(spec, "orders_c002"):
            ledger.mark_committed(e, None)
    done = _tick(spec, kafka, None, instance)
    assert not done.run_requests and "nothing beyond the staged offsets" in done.skip_message

    # Only the second route's entry is pending: a commit of the pipeline's tables is requested for it.
    tick = _tick(spec, outbox, None, instance)
    (request,) = tick.run_requests
    assert request.run_key == f"orders_routed:commit:{QUERY[:8]}:0-0"
    job = build_definitions(spec).resolve_job_def("orders_routed_commit_job")
    assert job.asset_layer.selected_asset_keys == {
        dg.AssetKey(["iceberg", "krishiv", t])
        for t in ("orders_c001", "orders_c002", "orders_other", "orders_routed_rejects")
    }


def test_kafka_sensor_requests_staging_for_new_records_only(make_spec, broker, instance):
    spec = make_spec(partitions=2)
    name = "orders_per_minute_kafka_sensor"
    produce_orders(spec, 40)

    tick = _tick(spec, name, None, instance)
    (request,) = tick.run_requests
    assert request.run_key.startswith("orders_per_minute:stage:")
    assert request.tags["krishiv/new-records"] == "40"
    latest = SensorCursor.parse(tick.cursor).requested
    assert sum(latest.values()) == 40

    # Requested a moment ago for the same offsets: no second request.
    assert not _tick(spec, name, tick.cursor, instance).run_requests

    # Once the ledger has staged everything, nothing is requested even with a fresh cursor.
    _record(spec, 0, latest)
    done = _tick(spec, name, None, instance)
    assert not done.run_requests and "nothing beyond the staged offsets" in done.skip_message


def test_kafka_sensor_leaves_a_continuously_staged_pipeline_alone(make_spec, broker, instance):
    spec = make_spec()
    produce_orders(spec, 20)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from outbox.ledger import Ledger;"
            "Ledger(sys.argv[1]).acquire_lease('orders_per_minute', 'krishiv run', 60); print('held', flush=True);"
            "time.sleep(120)",
            str(spec.resolve(spec.storage.ledger_path)),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        tick = _tick(spec, "orders_per_minute_kafka_sensor", None, instance)
        assert not tick.run_requests
        assert f"being staged by krishiv run (pid {holder.pid}" in tick.skip_message
    finally:
        holder.kill()
        holder.wait()
    # The holder is gone: its lease no longer counts, and the new records are requested.
    assert _tick(spec, "orders_per_minute_kafka_sensor", None, instance).run_requests


def test_kafka_sensor_names_an_unreachable_broker(make_spec, instance):
    from krishiv.broker import free_port

    address = f"127.0.0.1:{free_port()}"
    spec = make_spec(bootstrap=address)
    started = time.monotonic()
    tick = _tick(spec, "orders_per_minute_kafka_sensor", None, instance)
    assert not tick.run_requests
    assert address in tick.skip_message
    assert time.monotonic() - started < 60


def test_sensor_cursor_round_trips():
    cursor = SensorCursor({"q": 4}, 12.5, 2)
    assert SensorCursor.parse(cursor.dumps()) == cursor
    assert json.loads(cursor.dumps())["requested"] == {"q": 4}
    assert SensorCursor.parse(None) == SensorCursor()


@pytest.mark.parametrize("name", ["orders_per_minute_outbox_sensor", "orders_per_minute_kafka_sensor"])
def test_sensors_name_a_file_that_is_not_a_ledger(make_spec, instance, name):
    spec = make_spec()
    path = spec.resolve(spec.storage.ledger_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    past = time.time() - 3600
    os.utime(path, (past, past))

    tick = _tick(spec, name, None, instance)
    assert not tick.run_requests
    assert f"ledger {path} is not a DuckDB ledger (empty file)" in tick.skip_message
    assert "locked" not in tick.skip_message.split("(see docs/")[0], "not a busy ledger: its runbook section aside"
    assert path.read_bytes() == b""


def test_kafka_sensor_counts_compacted_batches_as_staged(make_spec, broker, instance):
    spec = make_spec(partitions=2)
    name = "orders_per_minute_kafka_sensor"
    produce_orders(spec, 40)
    latest = SensorCursor.parse(_tick(spec, name, None, instance).cursor).requested

    # Batch 0 staged everything; batch 1 (the newest, which compaction keeps) read nothing.
    _record(spec, 0, latest)
    _record(spec, 1, {})
    ledger = open_ledger(spec)
    for e in ledger.entries():
        ledger.mark_committed(e, None)
    assert ledger.compact(0, now=datetime.now(UTC) + timedelta(seconds=1)).entries_archived == 2

    done = _tick(spec, name, None, instance)
    assert not done.run_requests and "nothing beyond the staged offsets" in done.skip_message


def test_outbox_sensor_reports_each_commit_made_outside_dagster_once(make_spec, instance):
    """``krishiv run``'s committer commits two batches, a Dagster commit run a third: the next tick reports the two
    as materializations of the table's asset (the run materialized its own), and the tick after reports nothing."""
    from dagster._core.test_utils import create_run_for_test

    spec = make_spec()
    pipeline, name = spec.pipeline(), "orders_per_minute_outbox_sensor"
    table, key = qualified(spec, pipeline.table), PipelineKeys.of(spec, pipeline).table
    first = _tick(spec, name, None, instance)  # no ledger yet: reading starts at its first commit
    assert SensorCursor.parse(first.cursor).commit_seq == 0 and not commit_events(first)

    catalog, ledger = load_catalog(spec), open_ledger(spec)
    entries = [stage(catalog, ledger, b, b, pipeline=pipeline, namespace=spec.iceberg.namespace) for b in range(3)]
    assert CommitRelay(ledger, catalog, committed_by="krishiv run").commit_table(table).committed == [0, 1, 2]
    # Batch 2 as if a Dagster commit run had made it: the same relay run, under the label of a run of the commit job.
    run = create_run_for_test(instance, job_name="orders_per_minute_commit_job", status=dg.DagsterRunStatus.SUCCESS)
    with duckdb.connect(ledger.path) as con:
        con.execute(f"UPDATE outbox SET committed_by = 'dagster run {run.run_id}' WHERE batch_id = 2")

    tick = _tick(spec, name, first.cursor, instance)
    (checks,) = tick.run_requests  # the reported materializations get their checks run; no commit run is due
    assert checks.job_name == "orders_per_minute_checks_job"
    assert [e.asset_key for e in commit_events(tick)] == [key, key]
    for event, entry in zip(commit_events(tick), entries[:2], strict=True):
        shown = {k: v.value for k, v in event.metadata.items()}
        assert shown["batch_id"] == str(entry.batch_id) and shown["snapshot_id"] == str(entry.intended_snapshot_id)
        assert shown["rows_committed"] == entry.record_count == 1 and shown["snapshots_committed"] == 1
        assert shown["rows_added"] == 1 and shown["bytes_added"] == entry.files[0].bytes
        assert shown["committed_by"] == "krishiv run" and shown["query_id"] == "q1"
        assert shown["kafka_offsets"] == f"orders 0:[{entry.batch_id},{entry.batch_id + 1})"
        assert shown["commit_latency_ms"] > 0 and shown["staged_to_committed_s"] >= 0
        assert shown["pending_entries"] == 0
    assert SensorCursor.parse(tick.cursor).commit_seq == 3  # past the Dagster run's commit too

    # What the daemon does with a tick's events: they become the asset's materializations, outside any run.
    for event in commit_events(tick):
        instance.report_runless_asset_event(event)
    stored = instance.fetch_materializations(key, limit=10).records
    assert sorted(r.asset_materialization.metadata["batch_id"].value for r in stored) == ["0", "1"]
    assert all(r.run_id == "" for r in stored)

    again = _tick(spec, name, tick.cursor, instance)
    assert not commit_events(again) and not again.run_requests and again.cursor in (None, tick.cursor)


def _age(spec: KrishivSpec, seconds: float) -> None:
    """Make every pending entry ``seconds`` older, as if its batch had been staged that long ago."""
    with duckdb.connect(str(spec.resolve(spec.storage.ledger_path))) as con:
        con.execute(f"UPDATE outbox SET created_at = created_at - INTERVAL {seconds} SECOND WHERE status = 'PENDING'")


def test_outbox_sensor_leaves_fresh_batches_to_a_process_that_commits_its_own(make_spec, instance):
    spec = make_spec()
    name = "orders_per_minute_outbox_sensor"
    ledger = open_ledger(spec)
    lease = ledger.acquire_lease("orders_per_minute", "krishiv run", 60, committing=True)
    _record(spec, 0, {"0": 10})

    fresh = _tick(spec, name, None, instance)
    assert not fresh.run_requests
    assert "2 of 2 pending entries are left to krishiv run (pid" in fresh.skip_message  # both tables' entries
    assert "committing its own batches" in fresh.skip_message

    # Pending past the grace: the committer is down or stuck, and the safety net takes the batch.
    _age(spec, COMMITTER_GRACE_S + 5)
    stale = _tick(spec, name, fresh.cursor, instance)
    (request,) = stale.run_requests
    assert request.run_key == f"orders_per_minute:commit:{QUERY[:8]}:0-0"

    # A fresh batch beside it is still the committer's.
    _record(spec, 1, {"0": 20})
    later = _tick(spec, name, stale.cursor, instance)
    assert not later.run_requests and "already requested" in later.skip_message

    # A stager that does not commit (a Dagster staging run, krishiv run --once): a run for every pending batch.
    ledger.release_lease(lease)
    ledger.acquire_lease("orders_per_minute", "dagster run 1a2b3c4d", 60)
    plain = _tick(spec, name, stale.cursor, instance)
    (request,) = plain.run_requests
    assert request.run_key == f"orders_per_minute:commit:{QUERY[:8]}:1-1"


def test_the_first_tick_reports_the_commits_made_before_dagster_started(tmp_path, make_spec, instance):
    """Three ``krishiv commit`` runs, one batch each, before the sensor's first tick: that tick reports all three as
    materializations of the table, in commit order, and asks for their checks; the next reports none of them
    again, and a commit after it is reported as usual."""
    spec = make_spec()
    pipeline, name = spec.pipeline(), "orders_per_minute_outbox_sensor"
    key = PipelineKeys.of(spec, pipeline).table
    spec_file = tmp_path / "krishiv.toml"
    catalog, ledger = load_catalog(spec), open_ledger(spec)
    for batch in range(3):
        stage(catalog, ledger, batch, batch, pipeline=pipeline, namespace=spec.iceberg.namespace)
        done = krishiv_cli(spec_file, "commit")
        assert done.returncode == 0, done.stdout + done.stderr

    first = _tick(spec, name, None, instance)
    assert [e.asset_key for e in commit_events(first)] == [key] * 3
    shown = [{k: v.value for k, v in e.metadata.items()} for e in commit_events(first)]
    assert [s["batch_id"] for s in shown] == ["0", "1", "2"]  # the newest last: it is the one Dagster shows
    assert {s["committed_by"] for s in shown} == {"krishiv commit"} and all(s["rows_added"] == 1 for s in shown)
    (checks,) = first.run_requests
    assert checks.job_name == "orders_per_minute_checks_job"
    cursor = SensorCursor.parse(first.cursor)
    assert cursor.history and cursor.commit_seq == ledger.last_commit_seq() == 3

    for event in commit_events(first):
        instance.report_runless_asset_event(event)
    again = _tick(spec, name, first.cursor, instance)
    assert not commit_events(again)

    stage(catalog, ledger, 3, 3, pipeline=pipeline, namespace=spec.iceberg.namespace)
    assert krishiv_cli(spec_file, "commit").returncode == 0
    later = _tick(spec, name, first.cursor, instance)
    assert [e.metadata["batch_id"].value for e in commit_events(later)] == ["3"]

    # A sensor whose cursor was reset (a new sensor name, a wiped cursor) on an instance that shows the table's
    # materializations reports no history: it would land after the newer materializations, or twice.
    assert not _tick(spec, name, None, instance).asset_events


def test_the_first_tick_reports_at_most_the_newest_commits_of_each_table(make_spec, instance):
    """More commits than the bound before the first tick: the newest HISTORY_PER_TABLE of each table, and a cursor
    an older Krishiv wrote (no history mark) counts as a first tick, reading on from its own commit number."""
    spec = make_spec()
    pipeline, name = spec.pipeline(), "orders_per_minute_outbox_sensor"
    _record_and_commit(spec, range(HISTORY_PER_TABLE + 3))
    ledger = open_ledger(spec)
    last = ledger.last_commit_seq()

    old = json.dumps({"requested": {QUERY: 0}, "requested_at": time.time(), "retries": 0})
    tick = _tick(spec, name, old, instance)
    batches = [(e.asset_key.path[-1], int(e.metadata["batch_id"].value)) for e in commit_events(tick)]
    newest = range(3, HISTORY_PER_TABLE + 3)  # folded: each table's last HISTORY_PER_TABLE batches
    assert sorted(batches) == sorted((t, b) for b in newest for t in (pipeline.table, pipeline.rejects_table))
    assert [b for _, b in batches] == sorted(b for _, b in batches)  # in commit order, the batches' order here
    cursor = SensorCursor.parse(tick.cursor)
    assert (cursor.requested, cursor.commit_seq, cursor.history) == ({QUERY: 0}, last, True)

    # A cursor of the Krishiv that reported commits without history, which had read to commit 4: the history is
    # what came before (the tables were never materialized here), then it reads on from 4 as before.
    older = _tick(spec, name, json.dumps({"requested": {}, "commit_seq": 4}), instance)
    reported = [int(e.metadata["batch_id"].value) for e in commit_events(older)]
    assert reported == sorted([*range(HISTORY_PER_TABLE + 3)] * 2)
    assert SensorCursor.parse(older.cursor).commit_seq == last


def _record_and_commit(spec: KrishivSpec, batches: range) -> None:
    """Record ``batches`` of both tables and mark each committed by ``krishiv run``, batch by batch."""
    ledger = open_ledger(spec)
    for batch in batches:
        _record(spec, batch, {"0": 10 * (batch + 1)})
        for e in ledger.entries(status="PENDING"):
            ledger.mark_committed(e, None, "krishiv run")
