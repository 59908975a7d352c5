"""Output table schemas derived from a pipeline spec, in Iceberg and Spark terms.

The Spark job casts its output to exactly these types, and the relay creates tables with them, so the
two sides agree by construction rather than by inference.
"""

from __future__ import annotations

from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DecimalType,
    DoubleType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

from krishiv_core.spec import Aggregation, FieldType, PipelineSpec

WINDOW_START = "window_start"
WINDOW_END = "window_end"
REJECT_COLUMNS = ("topic", "partition", "offset", "kafka_timestamp", "key", "value", "reason", "batch_id")


def _decimal(precision: int, scale: int) -> FieldType:
    return FieldType("decimal", min(38, precision), min(38, scale))


def aggregate_type(agg: Aggregation, pipeline: PipelineSpec) -> FieldType:
    """The result type Spark gives ``function(field)``, so that staging never widens or narrows silently."""
    if agg.function == "count":
        return FieldType("long")
    assert agg.field is not None
    source = pipeline.field(agg.field).type
    if agg.function in ("min", "max"):
        return source
    if agg.function == "sum":
        if source.is_decimal:
            return _decimal(source.precision + 10, source.scale)
        return FieldType("double") if source.name == "double" else FieldType("long")
    # avg
    if source.is_decimal:
        return _decimal(source.precision + 4, source.scale + 4)
    return FieldType("double")


def iceberg_type(t: FieldType) -> IcebergType:
    return {
        "string": StringType(),
        "long": LongType(),
        "int": IntegerType(),
        "double": DoubleType(),
        "boolean": BooleanType(),
        "timestamp_ms": TimestamptzType(),
        "timestamp": TimestamptzType(),
    }.get(t.name) or DecimalType(t.precision, t.scale)


def spark_type(t: FieldType) -> str:
    """Spark SQL DDL type of an output column (timestamps arrive as Spark timestamps)."""
    if t.is_decimal:
        return f"decimal({t.precision},{t.scale})"
    return {
        "string": "string",
        "long": "bigint",
        "int": "int",
        "double": "double",
        "boolean": "boolean",
        "timestamp_ms": "timestamp",
        "timestamp": "timestamp",
    }[t.name]


def aggregate_table_schema(pipeline: PipelineSpec) -> Schema:
    fields = [
        NestedField(1, WINDOW_START, TimestamptzType(), required=True),
        NestedField(2, WINDOW_END, TimestamptzType(), required=True),
    ]
    for n, agg in enumerate(pipeline.aggregations, start=3):
        fields.append(NestedField(n, agg.name, iceberg_type(aggregate_type(agg, pipeline)), required=False))
    return Schema(*fields, identifier_field_ids=[1])


def rejects_table_schema() -> Schema:
    return Schema(
        NestedField(1, "topic", StringType(), required=True),
        NestedField(2, "partition", IntegerType(), required=True),
        NestedField(3, "offset", LongType(), required=True),
        NestedField(4, "kafka_timestamp", TimestamptzType(), required=False),
        NestedField(5, "key", BinaryType(), required=False),
        NestedField(6, "value", BinaryType(), required=False),
        NestedField(7, "reason", StringType(), required=True),
        NestedField(8, "batch_id", LongType(), required=True),
    )
