"""The streaming plan: parse Kafka values and route rejects.

The query is stateless: one row per Kafka record with its coordinates, ``reason`` (null for a valid event) and,
for a reject, the raw key and value. What else a row carries depends on the pipeline's kind (:func:`build_output`):

- ``windowed``: the fields the aggregations and the group-by read, and the event time (null for a reject, so a
  reject never moves the watermark). The staging sink aggregates windows and carries the event-time watermark
  itself (``spark_jobs.window_state``), so each batch reads Kafka once and closes every window its own events
  move the watermark past.
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

from krishiv_core.spec import EVENTS, KAFKA_METADATA_PREFIX, REJECTS, UPSERT, Aggregation, FieldType, PipelineSpec
from krishiv_core.tables import WINDOW_END, WINDOW_START, aggregate_type, spark_type

EVENT_TIME = "__event_time"
CORRUPT = "_corrupt_record"
TARGET = "__target"  # the (unqualified) table an events row goes to
DELETE = "__delete"  # an upsert row that deletes its key: a tombstone or a delete_field event
TOMBSTONE = "__tombstone"  # an upsert row that is a tombstone (a null Kafka value): it deletes and forgets the version


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


def _json_token(text: Column, name: str) -> Column:
    """What the JSON gave for field ``name``: ``a JSON string "12"``, ``a JSON number 12.5``, ``a JSON array``…"""
    value = F.try_variant_get(F.try_parse_json(text), f"$.{name}", "variant")  # the spec's names are identifiers
    kind = F.upper(F.schema_of_variant(value))
    scalar = F.substring(F.to_json(value), 1, 40)
    return (
        F.when(kind.startswith("STRING"), F.concat(F.lit("a JSON string "), scalar))
        .when(kind.startswith("BOOLEAN"), F.concat(F.lit("a JSON boolean "), scalar))
        .when(kind.startswith("ARRAY"), F.lit("a JSON array"))
        .when(kind.startswith("OBJECT"), F.lit("a JSON object"))
        .otherwise(F.concat(F.lit("a JSON number "), scalar))
    )


def _mistyped(text: Column, as_map: Column, name: str, t: FieldType) -> Column:
    """``amount (long, got a JSON string "12")`` where the record's ``name`` does not fit ``t``, else null.

    A value can be wrong as text (``12.5`` for a long; a decimal with too many digits) or as a JSON token (a number
    sent as a string, ``"12"``, which the text alone does not show); Spark's JSON reader refuses the latter, and
    this parse of the one field tells which field it was.
    """
    wrong = ~_field_ok(as_map[name], t)
    if not t.is_decimal and t.name != "string":
        alone = StructType([StructField(name, _json_type(t)), StructField(CORRUPT, StringType())])
        token = F.from_json(text, alone, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
        wrong = wrong | token[CORRUPT].isNotNull()
    if t.is_decimal:  # read as text, so every token fits: what the value says is what matters
        return F.when(as_map[name].isNotNull() & wrong, F.lit(f"{name} ({t})"))
    return F.when(
        as_map[name].isNotNull() & wrong, F.concat(F.lit(f"{name} ({t}, got "), _json_token(text, name), F.lit(")"))
    )


def parse_events(raw: DataFrame, pipeline: PipelineSpec) -> DataFrame:
    """Kafka rows -> typed event columns plus ``reason`` (null for a valid event)."""
    json_schema = StructType(
        [StructField(f.name, _json_type(f.type)) for f in pipeline.fields] + [StructField(CORRUPT, StringType())]
    )
    text = F.col("value").cast("string")
    j = F.from_json(text, json_schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
    df = raw.withColumn("__j", j)

    # Only rejected rows reach these branches, so the extra parses cost nothing on the happy path.
    as_map = F.from_json(text, "map<string,string>")
    mistyped = F.concat_ws(", ", *[_mistyped(text, as_map, f.name, f.type) for f in pipeline.fields])
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


def _reject_columns(reason: Column) -> list[Column]:
    is_reject = reason.isNotNull()
    return [
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.when(is_reject, F.col("key")).alias("key"),
        F.when(is_reject, F.col("value")).alias("value"),
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


def _tombstone_key(pipeline: PipelineSpec) -> list[Column]:
    """The key fields of a tombstone (a null value), from the Kafka key: the key itself for a one-field key, else
    a JSON object holding the key fields."""
    text = F.col("key").cast("string")
    if len(pipeline.key) == 1:
        f = pipeline.field(pipeline.key[0])
        value = text if f.type.name == "string" else text.try_cast(_json_type(f.type))
        if f.type.name == "timestamp_ms":
            value = F.timestamp_millis(value)
        elif f.type.is_decimal:
            value = text.try_cast(spark_type(f.type))
        return [value.alias(f.name)]
    schema = StructType([StructField(k, _json_type(pipeline.field(k).type)) for k in pipeline.key])
    parsed = F.from_json(text, schema)
    out = []
    for k in pipeline.key:
        c, t = parsed[k], pipeline.field(k).type
        out.append(
            (
                F.timestamp_millis(c) if t.name == "timestamp_ms" else c.try_cast(spark_type(t)) if t.is_decimal else c
            ).alias(k)
        )
    return out


def build_output(raw: DataFrame, pipeline: PipelineSpec) -> DataFrame:
    """The streaming DataFrame the staging sink receives each micro-batch: one row per Kafka record."""
    events = parse_events(raw, pipeline)
    if pipeline.kind == EVENTS:
        target, reason = _route(events, pipeline)
        return events.select(
            *[F.col(f.name) for f in pipeline.fields],
            *_metadata_columns(pipeline),
            target.alias(TARGET),
            *_reject_columns(reason),
        )
    if pipeline.kind == UPSERT:
        tombstone = F.col("value").isNull()
        tombstone_key = _tombstone_key(pipeline)
        key_missing = F.lit(False)
        for c in tombstone_key:
            key_missing = key_missing | c.isNull()
        reason = F.when(
            tombstone,
            F.when(
                key_missing, F.lit(f"tombstone without a key: expected the Kafka key to hold {', '.join(pipeline.key)}")
            ),
        ).otherwise(F.col("reason"))
        deleting = tombstone | (
            F.coalesce(F.col(pipeline.delete_field), F.lit(False)) if pipeline.delete_field else F.lit(False)
        )
        keys = {c: t for c, t in zip(pipeline.key, tombstone_key, strict=True)}
        columns = [
            F.when(tombstone, keys[f.name]).otherwise(F.col(f.name)).alias(f.name) if f.name in keys else F.col(f.name)
            for f in pipeline.fields
        ]
        return events.select(
            *columns,
            *_metadata_columns(pipeline),
            F.when(reason.isNull(), deleting).alias(DELETE),
            F.when(reason.isNull(), tombstone).alias(TOMBSTONE),
            *_reject_columns(reason),
        )
    is_reject = F.col("reason").isNotNull()
    read = sorted({a.field for a in pipeline.aggregations if a.field} | set(pipeline.group_by))
    return events.select(
        F.when(~is_reject, F.col(pipeline.event_time_field)).alias(EVENT_TIME), *read, *_reject_columns(F.col("reason"))
    )
