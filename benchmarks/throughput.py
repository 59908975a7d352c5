"""Measurements 2, 3 and 7: Krishiv's exactly-once pipeline and the at-least-once baseline, over one topic each.

Both run on one warm SparkSession with ``Trigger.AvailableNow`` and the same batch size, source and
aggregation. Krishiv runs as ``krishiv run --once`` then ``krishiv commit`` do (phase 1 with its ledger,
then the relay until the ledger is drained); its clock stops when the last snapshot is visible in the
catalog. The baseline is what a user would write instead: ``foreachBatch`` appending each batch's closed
windows with pyiceberg, with no ledger and no outbox, so a crash between the append and Spark's commit log
appends the batch again. It runs with Spark's no-data batches, which is how Spark's append mode writes the
windows the final watermark passed, as Krishiv does in the batch that moves the watermark.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession

from benchmarks.memory import PeakRss, RssSampler
from krishiv_core.spec import EVENTS, UPSERT, KrishivSpec, PipelineSpec
from krishiv_core.tables import WINDOW_START

BASELINE_TABLE = "baseline_windows"
EVENTS_TABLE = "orders_raw"
NESTED_EVENTS_TABLE = "orders_nested_raw"
UPSERTS_TABLE = "orders_latest"


@dataclass
class PipelineRun:
    """One pipeline over one topic: how long, how much, and what it wrote (to compare the two)."""

    name: str
    events: int
    seconds: float
    batches: int
    snapshots: int
    windows: int
    orders_counted: int
    peak_rss: PeakRss
    commit_s: float = 0.0  # of ``seconds``, the relay's share (Krishiv only)

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds


def bench_spec(
    base: KrishivSpec, folder: Path, bootstrap: str, topic: str, batch_records: int, catch_up_records: int = 0
) -> KrishivSpec:
    """The repository's spec on the bench's broker, with its own SQLite catalog, ledger and checkpoints; its
    batch sizes (``catch_up_records``: while behind, as ``catch_up_records_per_batch``; the baseline reads through
    the same source with the same sizes)."""
    from krishiv.demo import embedded_spec

    pipeline = replace(
        base.pipeline(),
        topic=topic,
        max_records_per_batch=batch_records,
        catch_up_records_per_batch=catch_up_records if catch_up_records > batch_records else 0,
    )
    return replace(embedded_spec(base, folder, bootstrap), pipelines=(pipeline,))


def events_spec(spec: KrishivSpec) -> KrishivSpec:
    """``spec`` (from :func:`bench_spec`) with its pipeline as the ``events`` kind: every valid order one row of
    :data:`EVENTS_TABLE`, raw ingestion with the same source, batch size and fields."""
    pipeline = replace(spec.pipeline(), name=EVENTS_TABLE, table=EVENTS_TABLE, kind=EVENTS, aggregations=())
    return replace(spec, pipelines=(pipeline,))


def nested_events_spec(spec: KrishivSpec, topic: str) -> KrishivSpec:
    """``spec`` (from :func:`bench_spec`) with its pipeline as the ``events`` kind over ``topic``'s nested orders
    (:data:`benchmarks.workload.NESTED_FIELDS`, the event time at ``meta.event_time``) into
    :data:`NESTED_EVENTS_TABLE`: the same source and batch sizes as :func:`events_spec`."""
    from benchmarks.workload import NESTED_EVENT_TIME, NESTED_FIELDS

    pipeline = replace(
        spec.pipeline(),
        name=NESTED_EVENTS_TABLE,
        table=NESTED_EVENTS_TABLE,
        topic=topic,
        kind=EVENTS,
        aggregations=(),
        fields=NESTED_FIELDS,
        event_time_field=NESTED_EVENT_TIME,
    )
    return replace(spec, pipelines=(pipeline,))


def upserts_spec(spec: KrishivSpec) -> KrishivSpec:
    """``spec`` (from :func:`bench_spec`) with two ``upsert`` pipelines over its topic into :data:`UPSERTS_TABLE`,
    the latest row per order id (version ``event_time``), merged by the relay: ``orders_latest_fill`` fills the
    table, then ``orders_latest`` (another query over the same records) replaces every row of it. Both are in the
    spec, so each knows the other's batches in the table."""
    upsert = replace(
        spec.pipeline(),
        table=UPSERTS_TABLE,
        kind=UPSERT,
        aggregations=(),
        key=("order_id",),
        version_field="event_time",
    )
    return replace(spec, pipelines=(replace(upsert, name=f"{UPSERTS_TABLE}_fill"), replace(upsert, name=UPSERTS_TABLE)))


@dataclass
class EventsRun:
    """The ``events`` kind over one topic: every valid event a row of its table, staged then committed."""

    events: int
    seconds: float
    rows_written: int  # rows the table holds afterwards (krishiv.verify.table_rows)
    rejects: int
    batches: int
    snapshots: int
    peak_rss: PeakRss
    commit_s: float = 0.0  # of ``seconds``, the relay's share

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds

    @property
    def rows_per_s(self) -> float:
        return self.rows_written / self.seconds


@dataclass
class _StagedAndCommitted:
    """One timed ``krishiv run --once`` then ``krishiv commit`` of a spec's pipeline, until its last snapshot is
    visible."""

    running: list
    reports: list
    table: Table
    seconds: float
    commit_s: float  # of ``seconds``, the relay's share
    peak_rss: PeakRss


def _stage_and_commit(
    spark: SparkSession, spec: KrishivSpec, pipeline: PipelineSpec | None = None
) -> _StagedAndCommitted:
    from krishiv.operations import commit_pipelines, run_pipelines
    from krishiv.query_supervisor import RunClients
    from krishiv_core.catalog import load_catalog, qualified

    pipeline = pipeline or spec.pipeline()
    with RssSampler() as rss:
        started = time.perf_counter()
        running = run_pipelines(spec, [pipeline], once=True, clients=RunClients(spark=spark), holder="krishiv bench")
        staged = time.perf_counter()
        reports = commit_pipelines(spec, [pipeline])
        table = load_catalog(spec).load_table(qualified(spec, pipeline.table))
        last = [sid for r in reports if r.table == qualified(spec, pipeline.table) for sid in r.snapshot_ids]
        if last and table.current_snapshot().snapshot_id != last[-1]:
            raise RuntimeError(f"the relay's last snapshot {last[-1]} is not visible in {pipeline.table}")
        seconds = time.perf_counter() - started
    return _StagedAndCommitted(running, reports, table, seconds, seconds - (staged - started), rss.peak)


def run_events(spark: SparkSession, spec: KrishivSpec, events: int, pipeline: PipelineSpec | None = None) -> EventsRun:
    """Raw ingestion timed like :func:`run_krishiv`. ``spec`` is an :func:`events_spec` (or ``pipeline`` one of its
    pipelines); its topic holds ``events`` records."""
    run = _stage_and_commit(spark, spec, pipeline)
    from krishiv.verify import table_rows

    rows = table_rows(run.table)
    history = run.running[0].stager.history
    return EventsRun(
        events,
        run.seconds,
        rows,
        sum(b.rejects for b in history),
        len(history),
        sum(len(r.committed) for r in run.reports),
        run.peak_rss,
        run.commit_s,
    )


def run_nested_events(spark: SparkSession, spec: KrishivSpec, events: int) -> EventsRun:
    """The ``events`` kind over the nested orders (``spec`` a :func:`nested_events_spec` whose topic holds ``events``
    of them, every one valid), timed like :func:`run_events`; its table must hold one row per record."""
    run = run_events(spark, spec, events)
    if run.rows_written != events or run.rejects:
        raise RuntimeError(
            f"the nested events table holds {run.rows_written:,} rows ({run.rejects:,} rejects) of {events:,} orders"
        )
    return run


def run_upserts(spark: SparkSession, spec: KrishivSpec, events: int) -> EventsRun:
    """The ``upsert`` kind updating every row of a full table: the first pipeline of :func:`upserts_spec` fills the
    table (one row per order, untimed), then the second reads the same ``events`` orders again, timed like
    :func:`run_events`: every valid event replaces its key's row."""
    both = upserts_spec(spec)
    fill, timed = both.pipelines
    _stage_and_commit(spark, both, fill)
    return run_events(spark, both, events, timed)


def _table_totals(table: Table) -> tuple[int, int]:
    rows = table.scan(selected_fields=(WINDOW_START, "order_count")).to_arrow()
    return rows.num_rows, sum(v for v in rows.column("order_count").to_pylist() if v is not None)


def run_krishiv(spark: SparkSession, spec: KrishivSpec, events: int) -> PipelineRun:
    run = _stage_and_commit(spark, spec)
    windows, counted = _table_totals(run.table)
    return PipelineRun(
        "krishiv",
        events,
        run.seconds,
        len(run.running[0].stager.history),
        sum(len(r.committed) for r in run.reports),
        windows,
        counted,
        run.peak_rss,
        run.commit_s,
    )


def run_scan_only(spark: SparkSession, spec: KrishivSpec, events: int) -> float:
    """Seconds for Spark to read the topic through Krishiv's source, its records decoded as the pipeline's, and count
    it: the ceiling of any Spark job."""
    from spark_jobs.job import kafka_stream

    counted = []
    started = time.perf_counter()
    query = (
        kafka_stream(spark, spec, spec.pipeline())
        .writeStream.queryName("scan_only")
        .foreachBatch(lambda batch, _id: counted.append(batch.count()))
        .option("checkpointLocation", str(spec.resolve(spec.storage.checkpoint_location) / "scan_only"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    if sum(counted) != events:
        raise RuntimeError(f"the scan-only query read {sum(counted)} records of {events}")
    return seconds


class AppendSink:
    """The baseline's ``foreachBatch``: append the batch's windows to the table with pyiceberg."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.schema = schema_to_pyarrow(table.schema(), include_field_ids=False)
        self.batches = self.snapshots = 0

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        rows = batch.toArrow()
        self.batches += 1
        if rows.num_rows:
            self.table.append(rows.select(self.schema.names).cast(self.schema))
            self.snapshots += 1


def run_baseline(spark: SparkSession, spec: KrishivSpec, events: int) -> PipelineRun:
    from krishiv_core.catalog import ensure_table, load_catalog, table_identifier
    from krishiv_core.tables import aggregate_table_schema
    from spark_jobs.job import kafka_stream
    from spark_jobs.transform import window_aggregates

    pipeline = spec.pipeline()
    catalog = load_catalog(spec)
    table = ensure_table(catalog, table_identifier(spec, BASELINE_TABLE), aggregate_table_schema(pipeline))
    sink = AppendSink(table)
    with RssSampler() as rss:
        started = time.perf_counter()
        windows = window_aggregates(kafka_stream(spark, spec, pipeline), pipeline)
        no_data_batches = "spark.sql.streaming.noDataMicroBatches.enabled"
        krishiv_setting = spark.conf.get(no_data_batches)
        spark.conf.set(no_data_batches, "true")  # a query keeps the settings it started with
        try:
            query = (
                windows.writeStream.queryName("baseline")
                .foreachBatch(sink)
                .option("checkpointLocation", str(spec.resolve(spec.storage.checkpoint_location) / BASELINE_TABLE))
                .trigger(availableNow=True)
                .start()
            )
        finally:
            spark.conf.set(no_data_batches, krishiv_setting)
        query.awaitTermination()
        seconds = time.perf_counter() - started
    count, counted = _table_totals(catalog.load_table(table_identifier(spec, BASELINE_TABLE)))
    return PipelineRun("baseline", events, seconds, sink.batches, sink.snapshots, count, counted, rss.peak)
