"""The streaming plan: parse Kafka values and route rejects.

The query is stateless: one row per Kafka record with its coordinates, the fields the aggregations read,
its event time (null for a reject, so a reject never moves the watermark) and, for a reject, the raw
key, value and reason. The staging sink aggregates tumbling windows and carries the event-time watermark
itself (``spark_jobs.window_state``), so each batch reads Kafka once and closes every window its own
events move the watermark past.
``window_aggregates`` is Spark's own stateful aggregation of the same events, which the benchmark's
at-least-once baseline uses.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from krishiv_core.spec import Aggregation, FieldType, PipelineSpec
from krishiv_core.tables import WINDOW_END, WINDOW_START, aggregate_type, spark_type

EVENT_TIME = "__event_time"
CORRUPT = "_corrupt_record"


def _json_type(t: FieldType) -> DataType:
    """How a field is read from JSON. Decimals are read as text and validated, so none is silently rounded."""
    return {
        "string": StringType(),
        "long": LongType(),
        "int": IntegerType(),
        "double": DoubleType(),
        "boolean": BooleanType(),
        "timestamp_ms": LongType(),
        "timestamp": TimestampType(),
        "decimal": StringType(),
    }[t.name]


def _decimal_pattern(t: FieldType) -> str:
    whole = t.precision - t.scale
    fraction = rf"(\.[0-9]{{1,{t.scale}}})?" if t.scale else ""
    return rf"^-?[0-9]{{1,{max(whole, 1)}}}{fraction}$"


def _field_ok(raw: Column, t: FieldType) -> Column:
    """True where a non-null raw JSON text is a valid value of type ``t``."""
    if t.is_decimal:
        return raw.rlike(_decimal_pattern(t))
    if t.name == "string":
        return F.lit(True)
    target = {"timestamp_ms": "bigint", "timestamp": "timestamp"}.get(t.name, spark_type(t))
    return raw.try_cast(target).isNotNull()


def parse_events(raw: DataFrame, pipeline: PipelineSpec) -> DataFrame:
    """Kafka rows -> typed event columns plus ``reason`` (null for a valid event)."""
    json_schema = StructType(
        [StructField(f.name, _json_type(f.type)) for f in pipeline.fields] + [StructField(CORRUPT, StringType())]
    )
    text = F.col("value").cast("string")
    j = F.from_json(text, json_schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
    df = raw.withColumn("__j", j)

    # Only rejected rows reach these branches, so the extra parse costs nothing on the happy path.
    as_map = F.from_json(text, "map<string,string>")
    mistyped = F.concat_ws(
        ", ",
        *[
            F.when(as_map[f.name].isNotNull() & ~_field_ok(as_map[f.name], f.type), F.lit(f"{f.name} ({f.type})"))
            for f in pipeline.fields
        ],
    )
    reason = F.when(F.col("value").isNull(), F.lit("null value")).when(
        F.col(f"__j.{CORRUPT}").isNotNull(),
        F.when(as_map.isNull(), F.lit("malformed JSON")).otherwise(
            F.when(mistyped != "", F.concat(F.lit("mistyped field: "), mistyped)).otherwise(F.lit("malformed JSON"))
        ),
    )
    for f in pipeline.fields:
        if f.type.is_decimal:
            reason = reason.when(
                F.col(f"__j.{f.name}").isNotNull() & ~F.col(f"__j.{f.name}").rlike(_decimal_pattern(f.type)),
                F.lit(f"mistyped field: {f.name} ({f.type})"),
            )
    for f in pipeline.fields:
        if f.required or f.name == pipeline.event_time_field:
            reason = reason.when(
                F.col(f"__j.{f.name}").isNull(),
                F.when(F.map_contains_key(as_map, f.name), F.lit(f"null field: {f.name}")).otherwise(
                    F.lit(f"missing field: {f.name}")
                ),
            )

    columns = [
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("timestamp"),
        F.col("key"),
        F.col("value"),
        reason.alias("reason"),
    ]
    for f in pipeline.fields:
        c = F.col(f"__j.{f.name}")
        if f.type.is_decimal:
            c = c.try_cast(spark_type(f.type))
        elif f.type.name == "timestamp_ms":
            c = F.timestamp_millis(c)
        columns.append(c.alias(f.name))
    return df.select(*columns)


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


def build_output(raw: DataFrame, pipeline: PipelineSpec) -> DataFrame:
    """The streaming DataFrame the staging sink receives each micro-batch: one row per Kafka record."""
    events = parse_events(raw, pipeline)
    is_reject = F.col("reason").isNotNull()
    aggregated = sorted({a.field for a in pipeline.aggregations if a.field})
    return events.select(
        F.when(~is_reject, F.col(pipeline.event_time_field)).alias(EVENT_TIME),
        *aggregated,
        "topic",
        "partition",
        "offset",
        F.col("timestamp").alias("kafka_timestamp"),
        F.when(is_reject, F.col("key")).alias("key"),
        F.when(is_reject, F.col("value")).alias("value"),
        "reason",
    )
