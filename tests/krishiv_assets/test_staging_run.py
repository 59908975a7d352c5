"""A staging run that lingers: it stages and commits what arrives while it runs, then stops once the topic is idle.

The plan's settings are checked on their own; the run itself is the real staging asset executed in process on the
shared broker and SparkSession, with a producer thread that sends a second wave only once the first is committed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import dagster as dg
import pytest
import yaml
from dagster._core.events import DagsterEventType
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.test_utils import instance_for_test
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon
from dagster._daemon.sensor import execute_sensor_iteration

from krishiv.operations import open_ledger
from krishiv.produce import DEFAULT_SPACING_MS, DEFAULT_START_MS
from krishiv.status import end_offsets
from krishiv_assets.assets import PipelineKeys
from krishiv_assets.definitions import build_resources, pipeline_definitions
from krishiv_assets.sensors import REPORT_LIMIT
from krishiv_assets.staging_run import (
    DEFAULT_LINGER_S,
    DEFAULT_MAX_RUN_S,
    LINGER_ENV,
    MAX_RUN_ENV,
    STAGE_STEP,
    STEP_TAG,
    IdleStop,
    StagingPlan,
    staging_plan,
    staging_run_waiting,
)
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.entries import COMMITTED
from krishiv_core.errors import ConfigError
from krishiv_core.spec import SPEC_FILE_ENV
from spark_jobs.kafka_source import latest_offsets
from spark_jobs.staging import StagedBatch
from tests.krishiv.test_verify import kinds_spec, produce_kinds
from tests.krishiv_assets.test_sensors import _tick, commit_events
from tests.spark_jobs.pipeline_helpers import ROOT, assert_exactly_once, produce_orders

WAVE_TIMEOUT_S = 180.0  # a bound for a loaded machine, not a speed target


def test_a_sensor_started_run_lingers_and_a_manual_one_stages_once():
    assert staging_plan(sensor_started=True, environ={}) == StagingPlan(DEFAULT_LINGER_S, DEFAULT_MAX_RUN_S)
    assert staging_plan(sensor_started=False, environ={LINGER_ENV: "30"}).once
    assert staging_plan(sensor_started=True, environ={LINGER_ENV: "0"}).once
    assert staging_plan(sensor_started=True, environ={LINGER_ENV: "30", MAX_RUN_ENV: "600"}) == StagingPlan(30, 600)
    assert staging_plan(sensor_started=False, linger_s=5, max_run_s=20, environ={LINGER_ENV: "30"}) == StagingPlan(
        5, 20
    )


@pytest.mark.parametrize(
    ("environ", "config", "named"),
    [
        ({LINGER_ENV: "a minute"}, {}, LINGER_ENV),
        ({LINGER_ENV: "-1"}, {}, LINGER_ENV),
        ({MAX_RUN_ENV: "0"}, {}, MAX_RUN_ENV),
        ({}, {"linger_s": float("inf")}, "linger_s"),
    ],
)
def test_a_wrong_setting_is_one_error_naming_it(environ, config, named):
    with pytest.raises(ConfigError, match=named):
        staging_plan(sensor_started=True, environ=environ, **config)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _batch(records: int) -> StagedBatch:
    return StagedBatch(batch_id=0, records_read=records, rows=records, rejects=0, late_events=0, recorded=True)


def test_idle_stop_counts_from_the_last_batch_with_records_and_caps_the_run():
    clock = _Clock()
    unstaged = [True]  # what the topic holds beyond the staged offsets, when asked
    stop = IdleStop(StagingPlan(10, 60), lambda: unstaged[0], clock)
    clock.now += 30  # Spark's start: not idleness
    assert not stop()
    clock.now += 9
    stop.on_batch(_batch(5))
    clock.now += 9
    stop.on_batch(_batch(0))  # a batch that read nothing does not count
    assert not stop()
    clock.now += 1
    assert not stop()  # quiet for 10 s, but the topic holds records not staged yet (a slow batch): on
    clock.now += 9
    assert not stop()
    unstaged[0] = False
    clock.now += 1
    assert stop() and stop.reason == "no new records for 10s"

    capped = IdleStop(StagingPlan(10, 60), clock=clock)
    for _ in range(12):
        clock.now += 5
        capped.on_batch(_batch(1))
        if capped():
            break
    assert capped.reason == "ran for its maximum of 60s"


def test_a_lingering_run_gives_way_to_a_waiting_one_once_it_has_run_for_its_linger():
    clock = _Clock()
    waiting = [True]  # a staging run waits in the queue from the start
    stop = IdleStop(StagingPlan(10, 60), clock=clock, waiting=lambda: waiting[0])
    for _ in range(3):  # records all along: busy, but it has not yet run for its linger
        clock.now += 3
        stop.on_batch(_batch(1))
        assert not stop()
    clock.now += 1
    assert stop() and stop.reason == "gave way after 10s to a staging run waiting in the queue"

    alone = IdleStop(StagingPlan(10, 60), clock=clock, waiting=lambda: False)
    clock.now += 30
    alone.on_batch(_batch(1))
    assert not alone()  # nobody waits: it lingers on while records arrive


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAVE_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {WAVE_TIMEOUT_S:.0f}s waiting for {what}")
        time.sleep(0.2)


def test_a_lingering_run_commits_what_arrives_while_it_runs_then_stops_when_idle(make_spec, broker, spark):
    spec = make_spec(max_records=1_000)
    pipeline = spec.pipeline()
    table = qualified(spec, pipeline.table)

    def committed_through_the_topic() -> bool:
        ends = latest_offsets(spec.kafka.bootstrap_servers, pipeline.topic)
        entries = open_ledger(spec).entries(table=table)
        done = end_offsets([e for e in entries if e.status == COMMITTED], pipeline.topic)
        return all(done.get(p, 0) >= end for p, end in ends.items())

    produce_orders(spec, 1_500, late=5, malformed=4)
    waves: list[str] = []
    problems: list[BaseException] = []

    def second_wave() -> None:
        try:
            _wait_until(committed_through_the_topic, "the first wave to be committed by the running staging run")
            waves.append("first committed while running")
            # Later events, so the first wave's windows close too.
            start = DEFAULT_START_MS + 1_500 * DEFAULT_SPACING_MS + 120_000
            produce_orders(spec, 1_000, malformed=3, seed=11, start_ms=start)
            _wait_until(committed_through_the_topic, "the second wave to be committed by the running staging run")
            waves.append("second committed while running")
        except BaseException as exc:  # the run then stops when idle, and the test names what did not happen
            problems.append(exc)

    producer = threading.Thread(target=second_wave, name="second-wave", daemon=True)
    producer.start()
    parts = pipeline_definitions(spec, pipeline)
    keys = PipelineKeys.of(spec, pipeline)
    op = f"{pipeline.name}__staged_batches"
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(
        parts.assets,
        resources=build_resources(spec),
        selection=dg.AssetSelection.assets(keys.staged),
        run_config={"ops": {op: {"config": {"linger_s": 10.0}}}},
        raise_on_error=False,
        instance=instance,
    )
    producer.join(WAVE_TIMEOUT_S)
    assert result.success
    assert not problems, problems
    assert waves == ["first committed while running", "second committed while running"]

    (event,) = [e for e in result.get_asset_materialization_events() if e.asset_key == keys.staged]
    metadata = {k: v.value for k, v in event.materialization.metadata.items()}
    assert metadata["stopped_because"] == "no new records for 10s"
    assert metadata["records_read"] == 2_500
    assert metadata["pending_entries"] == 0
    assert open_ledger(spec).live_lease(pipeline.name) is None  # released: the Kafka sensor may start the next run

    assert not open_ledger(spec).pending_batches(), "the run left batches pending"
    assert committed_through_the_topic()
    assert_exactly_once(spec)  # the tables equal the topic's oracle, one snapshot per batch, a linear lineage

    # Every commit was made by this run's committer, and the ledger says so (not `krishiv run`).
    commits = open_ledger(spec).commits_since(0, limit=1_000)
    assert {c.committed_by for c in commits} == {f"dagster run {result.run_id}"}
    # The staging run materializes no table: the outbox sensor reports each of its commits, then asks for the checks.
    with instance:
        tick = _tick(spec, f"{pipeline.name}_outbox_sensor", '{"commit_seq": 0}', instance)
    assert len(commit_events(tick)) == len(commits) < REPORT_LIMIT
    shown = [{k: v.value for k, v in e.metadata.items()} for e in commit_events(tick)]
    assert {m["committed_by"] for m in shown} == {f"dagster run {result.run_id}"}
    first = [m for e, m in zip(commit_events(tick), shown, strict=True) if e.asset_key == keys.table]
    rows = load_catalog(spec).load_table(table).scan().to_arrow().num_rows
    assert sum(m["rows_added"] for m in first) == rows  # appended windows, each once
    assert sum(m["rejects"] for m in first) == 7 and first[-1]["lag_records"] == 0  # all of the topic is in
    assert [r.job_name for r in tick.run_requests] == [f"{pipeline.name}_checks_job"]


def _finish(instance: dg.DagsterInstance, run: dg.DagsterRun) -> None:
    """The run ends as a staging run does, successfully."""
    event = dg.DagsterEvent(DagsterEventType.RUN_SUCCESS.value, job_name=run.job_name, message="staged")
    instance.report_dagster_event(event, run_id=run.run_id)


def test_one_burst_for_four_pipelines_runs_one_staging_run_at_a_time(tmp_path, broker, topic, monkeypatch):
    """Four pipelines read one topic and one burst of events arrives: Dagster's sensor daemon (in process, on the
    code location of workspace.yaml) requests one staging run per pipeline and no more while they wait, and the run
    queue as the repository's dagster.yaml sets it up starts one of them, the next only once it has ended. A
    lingering run asks the same queue whether another waits."""
    spec = kinds_spec(tmp_path, broker.bootstrap, topic)
    produce_kinds(spec, 300)
    monkeypatch.setenv(SPEC_FILE_ENV, str(tmp_path / "krishiv.toml"))
    shipped = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    overrides = {
        "concurrency": shipped["concurrency"],
        "run_coordinator": shipped["run_coordinator"],
        # What the queue starts is under test, not a launch: Dagster's launcher that records the runs it is handed.
        "run_launcher": {"module": "dagster._core.test_utils", "class": "MockedRunLauncher"},
    }
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name="krishiv_assets.definitions", working_directory=str(ROOT)),
        location_name="krishiv",
    )
    with (
        instance_for_test(overrides=overrides) as instance,
        WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin)) as workspace,
    ):
        list(execute_sensor_iteration(workspace, logging.getLogger("sensor-daemon"), None, None))
        staging = instance.get_runs(filters=dg.RunsFilter(tags={STEP_TAG: STAGE_STEP}))
        assert sorted(r.tags["krishiv/pipeline"] for r in staging) == sorted(p.name for p in spec.pipelines)
        for p in spec.pipelines:  # the same burst asks for nothing more while they wait
            tick = _tick(spec, f"{p.name}_kafka_sensor", None, instance)
            assert not tick.run_requests and "in flight" in tick.skip_message
        assert staging_run_waiting(instance)()

        queue = QueuedRunCoordinatorDaemon(interval_seconds=1)
        started: list[str] = []
        for _ in spec.pipelines:
            list(queue.run_iteration(workspace))
            list(queue.run_iteration(workspace))  # a second look starts nothing more while one is in progress
            launched = sorted({r.run_id for r in instance.run_launcher.queue()} - set(started))
            assert len(launched) == 1, f"{len(launched)} staging runs started at once"
            started += launched
            _finish(instance, instance.get_run_by_id(launched[0]))
        assert sorted(started) == sorted(r.run_id for r in staging)
        assert not staging_run_waiting(instance)()
