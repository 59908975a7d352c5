"""The streaming plan: shape the source's decoded rows for the pipeline's kind and route rejects.

The source decodes each record in its tasks (:mod:`spark_jobs.record_decoder`): the fields typed, ``reason`` (null
for a valid event) and, for a reject, the raw value. The query is stateless: one row per Kafka record with its
coordinates, the reason and, for a reject, the raw key and value. What else a row carries depends on the
pipeline's kind (:func:`build_output`):

- ``windowed``: the fields the aggregations and the group-by read, the event time (null for a reject, so a
  reject never moves the watermark), and every record's Kafka key and value (a late event keeps them). The
  staging sink aggregates windows and carries the event-time watermark itself (``spark_jobs.window_state``), so
  each batch reads Kafka once and closes every window its own events move the watermark past.
- ``events``: every field and the Kafka metadata columns asked for, and :data:`TARGET`, the table the row goes to
  (a route's, the default table, or none: an event without a route is a reject when the spec says so).
- ``upsert``: as ``events``, plus :data:`DELETE` (a tombstone: a null value, whose key fields come from the Kafka
  key, or the spec's delete flag set) and :data:`TOMBSTONE` (the tombstones alone: they also forget the version).

``window_aggregates`` is Spark's own stateful aggregation of the same events, which the benchmark's at-least-once
baseline uses.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from krishiv_core.spec import EVENTS, KAFKA_METADATA_PREFIX, REJECTS, UPSERT, Aggregation, PipelineSpec
from krishiv_core.tables import WINDOW_END, WINDOW_START, aggregate_type, spark_type
from spark_jobs.record_decoder import CDC_DELETE, TOMBSTONE

EVENT_TIME = "__event_time"
TARGET = "__target"  # the (unqualified) table an events row goes to
DELETE = "__delete"  # an upsert row that deletes its key: a tombstone or a delete_field event


def aggregate_expression(agg: Aggregation) -> Column:
    """Spark's ``function(field)`` of one aggregation, unnamed; ``count`` without a field counts rows."""
    if agg.function == "count":
        return F.count(F.col(agg.field)) if agg.field else F.count(F.lit(1))
    return getattr(F, agg.function)(F.col(agg.field))


def tumbling_window(pipeline: PipelineSpec) -> Column:
    """The event's tumbling window, as the struct Spark's ``window`` gives (``start``, ``end``)."""
    return F.window(EVENT_TIME, f"{pipeline.window_ms} milliseconds")


def window_aggregates(events: DataFrame, pipeline: PipelineSpec) -> DataFrame:
    """Closed windows of the valid events, by Spark's stateful aggregation under the event-time watermark."""
    valid = events.where(F.col("reason").isNull()).withColumn(EVENT_TIME, F.col(pipeline.event_time_field))
    return (
        valid.withWatermark(EVENT_TIME, f"{pipeline.watermark_delay_ms} milliseconds")
        .groupBy(tumbling_window(pipeline))
        .agg(*[aggregate_expression(a).alias(a.name) for a in pipeline.aggregations])
        .select(
            F.col("window.start").alias(WINDOW_START),
            F.col("window.end").alias(WINDOW_END),
            *[F.col(a.name).cast(spark_type(aggregate_type(a, pipeline))).alias(a.name) for a in pipeline.aggregations],
        )
    )


def _reject_columns(reason: Column, payload_of_all: bool = False) -> list[Column]:
    """A rejects table's columns of the row; the Kafka key and value of a reject only, or of every row when
    ``payload_of_all`` (a windowed pipeline's late events keep theirs)."""

    def payload(name: str) -> Column:
        return (F.col(name) if payload_of_all else F.when(reason.isNotNull(), F.col(name))).alias(name)

    return [
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        payload("key"),
        payload("value"),
        reason.alias("reason"),
    ]


def _metadata_columns(pipeline: PipelineSpec) -> list[Column]:
    """The Kafka metadata columns asked for: the source's own columns (``topic``, ``partition``, …), renamed."""
    return [F.col(m).alias(KAFKA_METADATA_PREFIX + m) for m in pipeline.kafka_metadata]


def _route(events: DataFrame, pipeline: PipelineSpec) -> tuple[Column, Column]:
    """(the table each valid event goes to, the reason updated for events without a route)."""
    reason = F.col("reason")
    if not pipeline.routes:
        return F.when(reason.isNull(), F.lit(pipeline.table)), reason
    value = F.col(pipeline.route_by).cast("string")
    target = F.lit(None).cast("string") if pipeline.unrouted == REJECTS else F.lit(pipeline.unrouted)
    for route in reversed(pipeline.routes):
        target = F.when(value == route.value, F.lit(route.table)).otherwise(target)
    unrouted = F.concat(F.lit(f"no route for {pipeline.route_by}="), F.coalesce(value, F.lit("null")))
    reason = F.when(reason.isNull() & target.isNull(), unrouted).otherwise(reason)
    return F.when(reason.isNull(), target), reason


def build_output(events: DataFrame, pipeline: PipelineSpec) -> DataFrame:
    """The streaming DataFrame the staging sink receives each micro-batch: one row per Kafka record, from the
    source's decoded rows (:mod:`spark_jobs.record_decoder`: the fields typed, ``reason`` set)."""
    if pipeline.kind == EVENTS:
        target, reason = _route(events, pipeline)
        return events.select(
            *[F.col(f.name) for f in pipeline.fields],
            *_metadata_columns(pipeline),
            target.alias(TARGET),
            *_reject_columns(reason),
        )
    if pipeline.kind == UPSERT:
        tombstone = F.col(TOMBSTONE)  # a null Kafka value: the decoder read its key fields from the Kafka key
        reason = F.col("reason")
        if pipeline.record_format.envelope is not None:
            flag = F.coalesce(F.col(CDC_DELETE), F.lit(False))  # Debezium's op = d, decoded by the source
        elif pipeline.delete_field:
            flag = F.coalesce(F.col(pipeline.delete_field), F.lit(False))
        else:
            flag = F.lit(False)
        deleting = tombstone | flag
        columns = [F.col(f.name) for f in pipeline.fields]
        return events.select(
            *columns,
            *_metadata_columns(pipeline),
            F.when(reason.isNull(), deleting).alias(DELETE),
            F.when(reason.isNull(), tombstone).alias(TOMBSTONE),
            *_reject_columns(reason),
        )
    is_reject = F.col("reason").isNotNull()
    # the top-level fields holding what the aggregations and groups read (``meta`` of ``meta.site``): the sink reads
    # a path inside them with ``F.col("meta.site")``
    read = sorted(
        {p.split(".", 1)[0] for p in [*(a.field for a in pipeline.aggregations if a.field), *pipeline.group_by]}
    )
    return events.select(
        F.when(~is_reject, F.col(pipeline.event_time_field)).alias(EVENT_TIME),
        *read,
        *_reject_columns(F.col("reason"), payload_of_all=True),
    )
