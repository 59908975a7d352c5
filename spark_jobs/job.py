"""Starting a pipeline's streaming query: Kafka source -> transform -> staging sink, with its checkpoint."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from krishiv_core.catalog import ensure_pipeline_tables, qualified
from krishiv_core.env_settings import seconds_from_env
from krishiv_core.evolution import planned_schema
from krishiv_core.reject_rate import DEFAULT_REJECT_RATE_WARN
from krishiv_core.runbook import runbook
from krishiv_core.spec import EVENTS, WINDOWED, KrishivSpec, PipelineSpec
from krishiv_core.table_purpose import purpose_properties
from krishiv_core.tables import OutputTable, output_tables
from spark_jobs.checkpoint import Checkpoint
from spark_jobs.delete_memory import DeleteMemoryStore
from spark_jobs.errors import CheckpointMismatch, NewWriterSchema, TopicMissing, TopicsAppeared
from spark_jobs.events import EventsShape
from spark_jobs.kafka_source import SOURCE_NAME, KafkaAdmin
from spark_jobs.ports import RecordedBatches, StagerLeaseHandle, StagingLedger
from spark_jobs.record_decoder import Decoding
from spark_jobs.staging import BatchShape, BatchStager, StagedBatch, Target
from spark_jobs.topics_shape import TopicsShape
from spark_jobs.topics_source import SOURCE_NAME as TOPICS_SOURCE
from spark_jobs.topics_source import TopicsLayout
from spark_jobs.transform import build_output
from spark_jobs.upserts import UpsertShape
from spark_jobs.window_state import WindowStateStore, check_output_mode
from spark_jobs.windowed import WindowedShape


@dataclass
class RunningPipeline:
    query: StreamingQuery
    stager: BatchStager


def _guard_checkpoint(checkpoint: Checkpoint, ledger: StagingLedger, pipeline: PipelineSpec, table: str) -> None:
    """Refuse to start a query whose checkpoint and ledger describe different histories.

    - A fresh checkpoint over a ledger that already holds this pipeline's batches restarts batch ids and loses
      the open windows, so its output would repeat or miss rows already committed: restore the checkpoint
      (or start over under a new pipeline name and table).
    - A checkpoint whose finished batches are not all in the ledger (a ledger restored from an older backup,
      deleted, or a process given another ``KRISHIV_LEDGER_PATH``): those batches would never be committed,
      and Spark would not run them again. Point every process at the ledger the checkpoint was staged into.
      If the ledger holds the query's batches, only for other tables, the spec renamed the pipeline's table.
    """
    if checkpoint.has_batches():
        finished = checkpoint.committed_batch_ids()
        missing = ledger.missing_batches(checkpoint.query_id(), table, finished) if finished else []
        if missing and len(missing) == len(finished) and checkpoint.query_id() in ledger.query_ids(pipeline.name):
            raise CheckpointMismatch(
                f"checkpoint {checkpoint.path} staged the batches of pipeline {pipeline.name!r} into other tables than "
                f"the spec's {table} (ledger {ledger.path}): the pipeline's table changed, and its checkpoint belongs "
                "to the old one; set table back, or start over in a new table under a new pipeline name "
                + runbook("A spec change the table cannot take")
            )
        if missing:
            shown = ", ".join(map(str, missing[:20])) + (f" and {len(missing) - 20} more" if len(missing) > 20 else "")
            raise CheckpointMismatch(
                f"checkpoint {checkpoint.path} has finished batches {shown} of pipeline {pipeline.name!r} that ledger "
                f"{ledger.path} does not hold; they would never be committed. Point storage.ledger_path (or "
                "KRISHIV_LEDGER_PATH) at the ledger this checkpoint staged into, for every process "
                + runbook("A checkpoint that does not match its ledger")
            )
        return
    known = ledger.query_ids(pipeline.name)
    if not known:
        return
    if (checkpoint.path / "metadata").exists() and checkpoint.query_id() in known:
        return
    raise CheckpointMismatch(
        f"checkpoint {checkpoint.path} is empty, but ledger {ledger.path} already holds batches of pipeline "
        f"{pipeline.name!r} from query {known[-1]}; restore that checkpoint, or start over in a new table under a new "
        f"pipeline name {runbook('A checkpoint that does not match its ledger')}"
    )


def _pin_source(checkpoint: Checkpoint, spec: KrishivSpec, pipeline: PipelineSpec) -> tuple[dict[str, int], dict]:
    """Batch 0's start offsets and the Kafka cluster and topic the query began on, pinned in the checkpoint the
    first time (a checkpoint from before identities were pinned gets today's: the past cannot be checked)."""
    starting, identity = checkpoint.starting_offsets(), checkpoint.source_identity()
    if starting is None or identity is None:
        with KafkaAdmin(spec.kafka.bootstrap_servers, pipeline.topic, spec.kafka.consumer_settings()) as admin:
            if starting is None:
                starting = admin.earliest()
                checkpoint.pin_starting_offsets(starting)
            if identity is None:
                identity = admin.identity()
                checkpoint.pin_source_identity(identity)
    return starting, identity


def _pin_topics(checkpoint: Checkpoint, spec: KrishivSpec, pipeline: PipelineSpec) -> tuple[dict, dict]:
    """:func:`_pin_source` for a pipeline over several topics: each topic's start and identity, pinned the first
    time the query starts while the topic exists (a topic that does not exist yet, as Debezium makes a table's
    topic with its first event, is pinned by the first run that finds it; the query reads it from its low
    watermark). Its batch 0 starts at every topic's pinned offsets."""
    starting = checkpoint.starting_offsets()
    identity = checkpoint.source_identity() or {}
    first = starting is None
    starting = dict(starting or {})
    for topic in pipeline.topics:
        if topic in identity and (topic in starting or not first):
            continue
        with KafkaAdmin(spec.kafka.bootstrap_servers, topic, spec.kafka.consumer_settings()) as admin:
            try:
                earliest, found = admin.earliest(), admin.identity()
            except TopicMissing:
                continue
        if first:
            starting[topic] = earliest
        identity[topic] = found
    if first:
        checkpoint.pin_starting_offsets(starting)
    checkpoint.pin_source_identity(identity)
    return starting, identity


def topics_layout(spec: KrishivSpec, pipeline: PipelineSpec) -> TopicsLayout:
    """The topics a pipeline over several reads, each decoded with its member's fields."""
    decodings = tuple(decoding_of(spec, m) for m in pipeline.members)
    registry = spec.schema_registry.client_config(os.environ) if spec.schema_registry else None
    return TopicsLayout(
        tuple(m.topic for m in pipeline.members),
        decodings,
        pipeline.transaction_topic,
        pipeline.record_format.value,
        registry,
        decodings[0].registry_outage_s,
        pipeline.topic_pattern,
        pipeline.topic_discovery_interval_ms / 1000,
    )


def topics_stream(
    spark: SparkSession, spec: KrishivSpec, pipeline: PipelineSpec, layout: TopicsLayout, **options: str
) -> DataFrame:
    """Every topic of a pipeline over several as one streaming DataFrame (:mod:`spark_jobs.topics_source`)."""
    reader = (
        spark.readStream.format(TOPICS_SOURCE)
        .option("bootstrap.servers", spec.kafka.bootstrap_servers)
        .option("pipeline", pipeline.name)
        .option("brokerOutageSeconds", str(broker_outage_s()))
        .option("maxRecordsPerBatch", str(pipeline.max_records_per_batch))
        .option("catchUpRecordsPerBatch", str(pipeline.catch_up_records_per_batch))
        .option("recordsPerSplit", str(spec.spark.records_per_split))
        .option("layout", layout.to_option())
    )
    for key, value in {**{f"kafka.{k}": v for k, v in spec.kafka.consumer_settings().items()}, **options}.items():
        reader = reader.option(key, value)
    return reader.load()


def _recorded(checkpoint: Checkpoint, ledger: StagingLedger, table: str, topic: str) -> RecordedBatches:
    """What the source must follow from the ledger: nothing for a query that has not begun."""
    if not (checkpoint.path / "metadata").exists():
        return RecordedBatches()
    return RecordedBatches.read(ledger, checkpoint.query_id(), table, topic, checkpoint.last_batch_id())


#: How many times a query is started when Spark's Python worker for the Kafka source does not connect back in time.
#: Spark 4.3 waits a fixed 10 s for it (``PythonWorkerFactory.createSimpleWorker``, which the Python streaming
#: source's driver-side runner always uses; no setting changes it): on a loaded machine importing PySpark in a new
#: interpreter can take longer, and the query fails before it has read anything.
WORKER_START_ATTEMPTS = 5
WORKER_START_TIMEOUT = "Python worker failed to connect back"  # Spark's message


def worker_start_timed_out(failure: BaseException) -> bool:
    """Whether a query failed only because Spark's Python worker did not connect back within Spark's limit."""
    return WORKER_START_TIMEOUT in str(failure)


#: How many times a query is started when the Python process behind its Kafka source died under it.
SOURCE_RESTART_ATTEMPTS = 3


#: What Spark says when the JVM's socket to the source's Python process broke under a read or a write: the query
#: fails with the socket's own message, alone or after ``[STREAM_FAILED] … terminated with exception:``.
_SOCKET_LOST = re.compile(r"(?:^|terminated with exception: )(Connection reset(?: by peer)?|Broken pipe)(?: |$)")


def source_process_loss(failure: BaseException) -> str | None:
    """What Spark said, when a query failed because the driver-side Python process of its Kafka source died (Spark's
    ``python_streaming_source_runner``; killed, or aborted in librdkafka: ``rd_kafka_broker_destroy_final:
    Assertion `thrd_is_current(rkb->rkb_thread)' failed``, confluentinc/librdkafka#3608); else None.

    Spark reads the end of the process's pipe and fails the query with an exception that has no message
    (``[STREAM_FAILED] … terminated with exception:  SQLSTATE: XXKST (no cause message)``, over a Python streaming
    source), or, when the process died with a request of the JVM unread, with the socket's ``Connection reset``.
    Every Krishiv query reads through its Python source, and its tasks' Python workers fail their task instead, so
    either message is the source's process. Starting the query again is safe whatever the cause: it replays from its
    checkpoint."""
    text = str(failure)
    first = text.splitlines()[0].strip() if text else ""
    if "[STREAM_FAILED]" in first and first.endswith("(no cause message)") and "PythonMicroBatchStream" in text:
        return "no cause message"
    lost = _SOCKET_LOST.search(first)
    return lost.group(1) if lost else None


def new_writer_schema(failure: BaseException) -> bool:
    """Whether a query failed because a batch holds records of a newer schema version with fields the query does not
    read (:class:`spark_jobs.errors.NewWriterSchema`, raised in a source task): nothing of the batch was staged."""
    return f"{NewWriterSchema.__module__}.{NewWriterSchema.__name__}: " in str(failure)


def topics_appeared(failure: BaseException) -> bool:
    """Whether a query failed because new topics match its pipeline's ``topic_pattern``
    (:class:`spark_jobs.errors.TopicsAppeared`, raised before a batch is planned): nothing was staged."""
    return f"{TopicsAppeared.__module__}.{TopicsAppeared.__name__}: " in str(failure)


def stop_between_batches(query: StreamingQuery, timeout_s: float = 30.0) -> None:
    """Stop ``query`` once its running trigger (if any) has finished, waiting at most ``timeout_s``.

    Stopping mid-batch is safe (the batch is replayed from the checkpoint and the ledger), but it interrupts
    Spark's threads and fills the log with their stack traces.
    """
    deadline = time.monotonic() + timeout_s
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()


#: How long a running query waits for a Kafka broker that stopped answering before it stops (seconds).
BROKER_OUTAGE_ENV = "KRISHIV_BROKER_OUTAGE_S"


def broker_outage_s() -> float:
    """``KRISHIV_BROKER_OUTAGE_S``, else the source's default (:data:`spark_jobs.kafka_source.DEFAULT_OUTAGE_S`)."""
    from spark_jobs.kafka_source import DEFAULT_OUTAGE_S

    return seconds_from_env(BROKER_OUTAGE_ENV, DEFAULT_OUTAGE_S)


#: How long a running query's tasks wait for a Schema Registry that stopped answering before they fail (seconds).
REGISTRY_OUTAGE_ENV = "KRISHIV_REGISTRY_OUTAGE_S"


def decoding_of(spec: KrishivSpec, pipeline: PipelineSpec) -> Decoding:
    """What the source's tasks decode for ``pipeline``, the registry's settings resolved here as Kafka's are."""
    registry = spec.schema_registry.client_config(os.environ) if spec.schema_registry else None
    return Decoding.of(pipeline, registry, seconds_from_env(REGISTRY_OUTAGE_ENV, 60.0))


def kafka_stream(spark: SparkSession, spec: KrishivSpec, pipeline: PipelineSpec, **options: str) -> DataFrame:
    """The pipeline's topic as a streaming DataFrame of Krishiv's Kafka source, its records decoded into the
    pipeline's fields in the source's tasks, with extra source ``options``."""
    reader = (
        spark.readStream.format(SOURCE_NAME)
        .option("bootstrap.servers", spec.kafka.bootstrap_servers)
        .option("topic", pipeline.topic)
        .option("pipeline", pipeline.name)
        .option("brokerOutageSeconds", str(broker_outage_s()))
        .option("maxRecordsPerBatch", str(pipeline.max_records_per_batch))
        .option("catchUpRecordsPerBatch", str(pipeline.catch_up_records_per_batch))
        .option("recordsPerSplit", str(spec.spark.records_per_split))
        .option("decoding", decoding_of(spec, pipeline).to_option())
    )
    for key, value in {**{f"kafka.{k}": v for k, v in spec.kafka.consumer_settings().items()}, **options}.items():
        reader = reader.option(key, value)
    return reader.load()


def check_checkpoint(spec: KrishivSpec, pipeline: PipelineSpec, ledger: StagingLedger) -> Checkpoint:
    """The pipeline's checkpoint, once it and the ledger tell one history (:func:`_guard_checkpoint`, anchored on
    the rejects table: every kind records a rejects entry for every batch). Run before any table is created, so a
    refusal leaves nothing behind."""
    checkpoint = Checkpoint(spec.checkpoint_dir(pipeline))
    _guard_checkpoint(checkpoint, ledger, pipeline, qualified(spec, pipeline.rejects_table))
    return checkpoint


def start_pipeline(
    spark: SparkSession,
    spec: KrishivSpec,
    pipeline: PipelineSpec,
    catalog: Catalog,
    ledger: StagingLedger,
    *,
    once: bool,
    on_batch: Callable[[StagedBatch], None] | None = None,
    lease: StagerLeaseHandle | None = None,
    reject_rate_warn: float = DEFAULT_REJECT_RATE_WARN,
) -> RunningPipeline:
    checkpoint = check_checkpoint(spec, pipeline, ledger)
    check_output_mode(pipeline, checkpoint)
    tables = ensure_pipeline_tables(
        catalog, spec, pipeline, pending=lambda t: len(ledger.pending_batches([t])), defer_schema=True
    )
    targets = [_target(spec, pipeline, t, tables[t.name]) for t in output_tables(pipeline)]
    rejects = qualified(spec, pipeline.rejects_table)
    shape: BatchShape
    # what the source follows: where batch 0 starts, the topics it must find, the ledger's recorded batches
    if pipeline.members:
        starting, identity = _pin_topics(checkpoint, spec, pipeline)
        recorded = json.dumps({t: _recorded(checkpoint, ledger, rejects, t).to_option() for t in pipeline.topics})
    else:
        starting, identity = _pin_source(checkpoint, spec, pipeline)
        recorded = _recorded(checkpoint, ledger, rejects, pipeline.topic).to_option()
    follows = {
        "startingOffsets": json.dumps(starting),
        "expectedIdentity": json.dumps(identity),
        "checkpointPath": str(checkpoint.path),
        "recorded": recorded,
    }
    if pipeline.members:
        layout = topics_layout(spec, pipeline)
        output = topics_stream(spark, spec, pipeline, layout, **follows)
        shape = TopicsShape(pipeline, layout, targets, checkpoint.path)
    else:
        output = build_output(kafka_stream(spark, spec, pipeline, **follows), pipeline)
        shape = shape_of(pipeline, targets, checkpoint)
    stager = BatchStager(pipeline, ledger, checkpoint, targets, shape, on_batch, lease, reject_rate_warn)
    writer = (
        output.writeStream.queryName(pipeline.name)
        .foreachBatch(stager)
        .option("checkpointLocation", str(checkpoint.path))
    )
    writer = (
        writer.trigger(availableNow=True)
        if once
        else writer.trigger(processingTime=f"{pipeline.trigger_interval_ms} milliseconds")
    )
    return RunningPipeline(writer.start(), stager)


def _target(spec: KrishivSpec, pipeline: PipelineSpec, output: OutputTable, table: Table) -> Target:
    """A table as the stager stages it: a row table for the schema the spec gives it (applied with the first batch
    staged) and with the ``krishiv.*`` properties of what it is written for."""
    name = qualified(spec, output.name)
    if output.rejects:
        return Target(name, output, table)
    properties = purpose_properties(pipeline.writer_of(output.name))
    return Target(name, output, table, planned_schema(table, output.schema, name), properties)


def shape_of(pipeline: PipelineSpec, targets: list[Target], checkpoint: Checkpoint) -> BatchShape:
    """The shape of the pipeline's kind, over its row tables (the rejects table is the stager's)."""
    rows = [t for t in targets if not t.output.rejects]
    if pipeline.kind == WINDOWED:
        return WindowedShape(pipeline, rows[0], WindowStateStore(checkpoint.path))
    if pipeline.kind == EVENTS:
        return EventsShape(rows, next(t for t in targets if t.output.rejects))
    return UpsertShape(pipeline, rows[0], DeleteMemoryStore(checkpoint.path))
