"""Who made each commit, what its materialization plots, when the checks run, and when a table turns red.

Real components, no Spark: batches staged as Spark would (Parquet files plus ledger entries) on a real broker's
topic, committed by a real Dagster commit run (``execute_in_process`` on an ephemeral instance) and by the real
``krishiv commit`` in its own process; the outbox sensor's ticks evaluated against the same instance; the checks job
executed in process; the table's freshness evaluated by Dagster's own evaluator (the freshness daemon's).
"""

from __future__ import annotations

import asyncio
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest
from dagster._core.definitions.freshness import FreshnessState
from dagster._core.definitions.freshness_evaluator import FRESHNESS_EVALUATORS_BY_POLICY_TYPE
from dagster._core.test_utils import BasicLoadingContext, freeze_time

from krishiv.operations import open_ledger
from krishiv_assets.assets import PipelineKeys
from krishiv_assets.definitions import build_definitions, checks_job_name, commit_job_name
from krishiv_assets.freshness import DEFAULT_FAIL_S, DEFAULT_WARN_S, FAIL_ENV, WARN_ENV, FreshnessWindows
from krishiv_assets.sensors import SensorCursor
from krishiv_core.catalog import ensure_pipeline_tables, load_catalog, qualified
from krishiv_core.entries import OutboxEntry, new_snapshot_id
from krishiv_core.errors import ConfigError
from krishiv_core.spec import KrishivSpec
from outbox.relay import CommitRelay
from spark_jobs.staging import staging_folder, write_parquet
from tests.krishiv_assets.test_sensors import _tick, commit_events
from tests.spark_jobs.pipeline_helpers import krishiv_cli, produce_orders

ROOT = Path(__file__).resolve().parents[2]
QUERY = "5eed0000-0000-4000-8000-00000000c0de"
PRODUCED = 20
#: Each batch's counts as the stager records them on the first table's entry.
COUNTS = {"records_read": 200, "rejects": 1, "late_events": 2}  # 0.5 % rejected: under the rate check's 1 %
SENSOR = "orders_per_minute_outbox_sensor"


def _stage(spec: KrishivSpec, batch_id: int, start: int, end: int) -> OutboxEntry:
    """Batch ``batch_id`` of partition 0's offsets ``[start, end)``: one window row for the table, nothing for the
    rejects table (an empty entry), recorded in the ledger as the Spark job records a batch."""
    pipeline = spec.pipeline()
    table = ensure_pipeline_tables(load_catalog(spec), spec, pipeline)[pipeline.table]
    window = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=batch_id)
    row = {
        "window_start": [window],
        "window_end": [window + timedelta(minutes=1)],
        "order_count": [end - start],
        "amount_total": [None],
        "amount_min": [None],
        "amount_max": [None],
        "amount_avg": [None],
    }
    schema = table.schema().as_arrow()
    files = write_parquet(
        table, pa.table({n: row[n] for n in schema.names}).cast(schema), staging_folder(table, QUERY, batch_id)
    )
    offsets = {pipeline.topic: {"0": [start, end]}}
    first = OutboxEntry(
        QUERY, pipeline.name, qualified(spec, pipeline.table), batch_id, offsets, files, new_snapshot_id(), COUNTS
    )
    rejects = OutboxEntry(
        QUERY, pipeline.name, qualified(spec, pipeline.rejects_table), batch_id, offsets, (), new_snapshot_id(), {}
    )
    assert open_ledger(spec).record_batch([first, rejects]) == [True, True]
    return first


def _values(event: dg.AssetMaterialization) -> dict[str, object]:
    return {k: v.value for k, v in event.metadata.items()}


def test_each_commit_names_its_process_and_reported_commits_are_plotted_and_checked(make_spec, broker):
    """A Dagster commit run commits batch 0, ``krishiv commit`` batch 1: the ledger names each committer; the
    outbox sensor reports only ``krishiv commit``'s (the run materialized its own), with ids as text and the
    numbers a user plots; then it asks for one checks run, whose checks evaluate the newest materialization."""
    spec = make_spec(partitions=1)
    pipeline = spec.pipeline()
    keys = PipelineKeys.of(spec, pipeline)
    table = qualified(spec, pipeline.table)
    tables = [qualified(spec, t) for t in pipeline.all_tables]
    produce_orders(spec, PRODUCED)
    defs = build_definitions(spec)
    with dg.DagsterInstance.ephemeral() as instance:
        start = _tick(spec, SENSOR, None, instance).cursor  # reading starts before either commit

        _stage(spec, 0, 0, 8)
        run = defs.resolve_job_def(commit_job_name(pipeline)).execute_in_process(instance=instance)
        ledger = open_ledger(spec)
        (by_run,) = [c for c in ledger.commits_since(0, [table]) if c.batch_id == 0]
        assert by_run.committed_by == f"dagster run {run.run_id}"
        (materialized,) = [e for e in run.get_asset_materialization_events() if e.asset_key == keys.table]
        assert materialized.materialization.metadata["committed_by"].value == f"dagster run {run.run_id}"

        staged = _stage(spec, 1, 8, 12)
        done = krishiv_cli(spec.base_dir / "krishiv.toml", "commit")
        assert done.returncode == 0, done.stderr
        assert {c.committed_by for c in ledger.commits_since(by_run.commit_seq) if c.batch_id == 1} == {
            "krishiv commit"
        }

        tick = _tick(spec, SENSOR, start, instance)
        events = {e.asset_key: _values(e) for e in commit_events(tick)}
        assert len(commit_events(tick)) == 2 and set(events) == {keys.table, keys.rejects}  # batch 1 only
        shown, empty = events[keys.table], events[keys.rejects]
        for values in (shown, empty):
            assert values["committed_by"] == "krishiv commit" and values["batch_id"] == "1"
            assert values["lag_records"] == PRODUCED - 12  # the topic's records beyond the batch's end offset
            assert values["staged_to_committed_s"] >= 0
        assert shown["snapshot_id"] == str(staged.intended_snapshot_id) and empty["snapshot_id"] == "none"
        assert shown["rows_added"] == 1 and shown["bytes_added"] == staged.files[0].bytes
        assert shown["rejects"] == COUNTS["rejects"] and shown["late_events"] == COUNTS["late_events"]
        assert (empty["rows_added"], empty["bytes_added"], empty["snapshots_committed"]) == (0, 0, 0)
        assert "rejects" not in empty  # a batch's counts go on the pipeline's first table
        # Dagster plots a number; an id must be text.
        event = next(e for e in commit_events(tick) if e.asset_key == keys.table)
        for name in ("batch_id", "snapshot_id", "query_id", "kafka_offsets", "committed_by"):
            assert isinstance(event.metadata[name], dg.TextMetadataValue), name
        for name in ("rows_added", "bytes_added", "rows_committed", "staged_to_committed_s", "lag_records"):
            assert isinstance(event.metadata[name], dg.IntMetadataValue | dg.FloatMetadataValue), name

        (checks,) = tick.run_requests
        assert checks.job_name == checks_job_name(pipeline)
        for event in commit_events(tick):  # what the daemon does with the tick's events
            instance.report_runless_asset_event(event)
        checked = defs.resolve_job_def(checks.job_name).execute_in_process(instance=instance, tags=checks.tags)
        evaluations = checked.get_asset_check_evaluations()
        assert {e.asset_key for e in evaluations} == {keys.table, keys.rejects}
        assert all(e.passed for e in evaluations), {e.check_name: e.description for e in evaluations}
        # The UI's rule ("executionForLatestMaterialization"): each check's last execution targets the table's
        # newest materialization, the one the sensor reported.
        graph = defs.get_repository_def().asset_graph
        for check_key in graph.get_check_keys_for_assets({keys.table, keys.rejects}):
            (record,) = instance.event_log_storage.get_asset_check_execution_history(check_key, limit=1)
            assert asyncio.run(record.targets_latest_materialization(BasicLoadingContext(instance))), check_key

        # A commit a second later: reported, but its checks wait for the interval; then the next tick asks.
        _stage(spec, 2, 12, 16)
        CommitRelay(ledger, load_catalog(spec), committed_by="krishiv commit").run(list(tables))
        soon = _tick(spec, SENSOR, tick.cursor, instance)
        assert len(commit_events(soon)) == 2 and not soon.run_requests
        cursor = SensorCursor.parse(soon.cursor)
        assert cursor.unchecked
        cursor.checks_requested_at -= 3600  # as if the interval had passed, with no commit since
        # A commit run in flight (one the UI launched): a checks run starting after it could evaluate before it
        # materializes, and would then hold the checks' newest execution against the older materialization. The
        # sensor waits for the run to end.
        committing = instance.create_run_for_job(
            defs.resolve_job_def(commit_job_name(pipeline)), status=dg.DagsterRunStatus.STARTED
        )
        held = _tick(spec, SENSOR, cursor.dumps(), instance)
        assert not held.run_requests and SensorCursor.parse(held.cursor).unchecked
        instance.report_run_failed(committing)
        later = _tick(spec, SENSOR, held.cursor, instance)
        assert not commit_events(later) and [r.job_name for r in later.run_requests] == [checks_job_name(pipeline)]
        assert not SensorCursor.parse(later.cursor).unchecked


def _freshness(defs: dg.Definitions, key: dg.AssetKey, instance: dg.DagsterInstance) -> FreshnessState:
    """The table's freshness as Dagster's freshness daemon evaluates it."""
    node = defs.get_repository_def().asset_graph.get(key)
    evaluator = FRESHNESS_EVALUATORS_BY_POLICY_TYPE[type(node.freshness_policy_or_from_metadata)]()
    return asyncio.run(evaluator.evaluate_freshness(context=BasicLoadingContext(instance), node=node))


def test_a_table_turns_red_when_commits_stop_and_green_after_a_commit(make_spec, broker):
    spec = make_spec(partitions=1)
    pipeline = spec.pipeline()
    keys = PipelineKeys.of(spec, pipeline)
    tables = [qualified(spec, t) for t in pipeline.all_tables]
    defs = build_definitions(spec)
    for key in keys.tables.values():  # every table asset has the default policy
        policy = defs.get_repository_def().asset_graph.get(key).freshness_policy
        assert policy == FreshnessWindows(DEFAULT_WARN_S, DEFAULT_FAIL_S).policy()
    ledger, catalog = open_ledger(spec), load_catalog(spec)
    with dg.DagsterInstance.ephemeral() as instance:
        cursor = _tick(spec, SENSOR, None, instance).cursor
        assert _freshness(defs, keys.table, instance) == FreshnessState.UNKNOWN  # never committed: not red yet

        def commit_and_report(batch_id: int) -> None:
            nonlocal cursor
            _stage(spec, batch_id, batch_id, batch_id + 1)
            CommitRelay(ledger, catalog, committed_by="krishiv run").run(tables)
            tick = _tick(spec, SENSOR, cursor, instance)
            assert {e.asset_key for e in commit_events(tick)} == {keys.table, keys.rejects}
            for event in commit_events(tick):
                instance.report_runless_asset_event(event)
            cursor = tick.cursor

        commit_and_report(0)
        now = datetime.now(UTC)
        assert _freshness(defs, keys.table, instance) == FreshnessState.PASS
        with freeze_time(now + timedelta(seconds=DEFAULT_WARN_S + 60)):
            assert _freshness(defs, keys.table, instance) == FreshnessState.WARN
        stopped = now + timedelta(seconds=DEFAULT_FAIL_S + 60)  # an hour without a commit
        with freeze_time(stopped):
            assert _freshness(defs, keys.table, instance) == FreshnessState.FAIL
            assert _freshness(defs, keys.rejects, instance) == FreshnessState.FAIL
            commit_and_report(1)  # commits resume: an empty batch of the rejects table counts too
            assert _freshness(defs, keys.table, instance) == FreshnessState.PASS
            assert _freshness(defs, keys.rejects, instance) == FreshnessState.PASS


def test_the_windows_come_from_the_environment_and_the_daemon_that_evaluates_them_runs(tmp_path, monkeypatch):
    from krishiv_assets.freshness import freshness_windows

    monkeypatch.setenv(WARN_ENV, "120")
    monkeypatch.setenv(FAIL_ENV, "600")
    assert freshness_windows() == FreshnessWindows(120, 600)
    monkeypatch.setenv(WARN_ENV, "600")
    with pytest.raises(ConfigError, match=WARN_ENV):
        freshness_windows()
    monkeypatch.setenv(FAIL_ENV, "30")
    with pytest.raises(ConfigError, match=FAIL_ENV):
        freshness_windows()

    # The repository's instance (dagster.yaml) runs Dagster's freshness daemon under `dagster dev`.
    shutil.copy(ROOT / "dagster.yaml", tmp_path)
    monkeypatch.chdir(tmp_path)  # its storage paths are relative to where dagster dev starts
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert instance.freshness_enabled
        assert "FRESHNESS_DAEMON" in instance.get_required_daemon_types()
