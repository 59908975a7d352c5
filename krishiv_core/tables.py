"""Output tables derived from a pipeline spec: names, schemas, partitioning and how each is committed.

:func:`output_tables` is the one place that says which tables a pipeline writes (its row tables, then its rejects
table) and, per table, the Iceberg schema, the partition fields and the commit operation phase 2 uses. The Spark
job casts its output to exactly these types, and tables are created with them, so the two sides agree by
construction rather than by inference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from krishiv_core.entries import APPEND, MERGE, CommitOperation
from krishiv_core.partitioning import PartitionField
from krishiv_core.spec import EVENTS, KAFKA_METADATA_PREFIX, UPSERT, WINDOWED, Aggregation, FieldType, PipelineSpec
from krishiv_core.spec_types import JSON_TEXT, LIST, MAP, STRUCT

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


class _Ids:
    """Field ids for a schema being built (renumbered once it is whole, top-level columns first)."""

    def __init__(self) -> None:
        self.last = 1000

    def __call__(self) -> int:
        self.last += 1
        return self.last


def iceberg_type(t: FieldType, ids: Callable[[], int] | None = None) -> IcebergType:
    """The Iceberg type of a field type; a nested type's parts numbered by ``ids``."""
    ids = ids or _Ids()
    if t.name == STRUCT:
        return StructType(
            *[NestedField(ids(), f.name, iceberg_type(f.type, ids), required=f.required) for f in t.fields]
        )
    if t.name == LIST:
        assert t.element is not None
        return ListType(ids(), iceberg_type(t.element.type, ids), element_required=t.element.required)
    if t.name == MAP:
        assert t.element is not None and t.key is not None
        key_id, value_id = ids(), ids()
        return MapType(
            key_id, iceberg_type(t.key, ids), value_id, iceberg_type(t.element.type, ids), t.element.required
        )
    return {
        "string": StringType(),
        JSON_TEXT: StringType(),
        "binary": BinaryType(),
        "long": LongType(),
        "int": IntegerType(),
        "double": DoubleType(),
        "boolean": BooleanType(),
        "timestamp_ms": TimestamptzType(),
        "timestamp": TimestamptzType(),
        "date": DateType(),
    }.get(t.name) or DecimalType(t.precision, t.scale)


def spark_type(t: FieldType) -> str:
    """Spark SQL DDL type of a column (timestamps arrive as Spark timestamps, ``json`` as its text)."""
    if t.is_decimal:
        return f"decimal({t.precision},{t.scale})"
    if t.name == STRUCT:
        return "struct<" + ", ".join(f"`{f.name}`: {spark_type(f.type)}" for f in t.fields) + ">"
    if t.name == LIST:
        assert t.element is not None
        return f"array<{spark_type(t.element.type)}>"
    if t.name == MAP:
        assert t.element is not None and t.key is not None
        return f"map<{spark_type(t.key)}, {spark_type(t.element.type)}>"
    return {
        "string": "string",
        JSON_TEXT: "string",
        "binary": "binary",
        "long": "bigint",
        "int": "int",
        "double": "double",
        "boolean": "boolean",
        "timestamp_ms": "timestamp",
        "timestamp": "timestamp",
        "date": "date",
    }[t.name]


def _numbered(fields: list[NestedField], identifiers: Sequence[str] = ()) -> Schema:
    """A schema of ``fields`` numbered as Iceberg numbers a new table's (top-level columns 1..N, then their parts),
    keyed by the dotted paths ``identifiers``."""
    built = Schema(*fields)
    ids = [built.find_field(path).field_id for path in identifiers]
    return assign_fresh_schema_ids(Schema(*fields, identifier_field_ids=ids))


def group_columns(pipeline: PipelineSpec) -> tuple[str, ...]:
    """A windowed table's group-by columns: each ``group_by`` path with ``_`` for each dot (``meta.site`` gives
    ``meta_site``; a top-level field keeps its name)."""
    return tuple(pipeline.path(name).column for name in pipeline.group_by)


def aggregate_table_schema(pipeline: PipelineSpec) -> Schema:
    """A windowed pipeline's table: the window, the group-by fields, then one column per aggregation."""
    fields = [
        NestedField(1, WINDOW_START, TimestamptzType(), required=True),
        NestedField(2, WINDOW_END, TimestamptzType(), required=True),
    ]
    for name in pipeline.group_by:  # a path into a struct is a column of its own, named by the path (meta_site)
        path = pipeline.path(name)
        fields.append(NestedField(len(fields) + 1, path.column, iceberg_type(path.type), required=True))
    for agg in pipeline.aggregations:
        fields.append(
            NestedField(len(fields) + 1, agg.name, iceberg_type(aggregate_type(agg, pipeline)), required=False)
        )
    # A window's start and its group identify a row (the end follows from the start and the window's size).
    return Schema(*fields, identifier_field_ids=[1, *range(3, 3 + len(pipeline.group_by))])


#: The Kafka metadata columns' Iceberg types, by the name ``kafka_metadata`` uses.
_METADATA_TYPES: dict[str, IcebergType] = {
    "topic": StringType(),
    "partition": IntegerType(),
    "offset": LongType(),
    "timestamp": TimestamptzType(),
    "key": BinaryType(),
}


def event_table_schema(pipeline: PipelineSpec) -> Schema:
    """An ``events`` or ``upsert`` pipeline's table: the event fields, then the Kafka metadata columns asked for.

    An upsert table's key fields are its identifier fields (required, as the spec insists).
    """
    ids = _Ids()
    fields = [NestedField(ids(), f.name, iceberg_type(f.type, ids), required=f.required) for f in pipeline.fields]
    for name in pipeline.kafka_metadata:
        fields.append(NestedField(ids(), KAFKA_METADATA_PREFIX + name, _METADATA_TYPES[name], required=False))
    return _numbered(fields, pipeline.key)


@dataclass(frozen=True)
class OutputTable:
    """One table a pipeline writes, as the catalog creates it and phase 2 commits to it."""

    name: str  # unqualified; the namespace is the spec's
    schema: Schema
    partition_by: tuple[PartitionField, ...]
    operation: CommitOperation
    rejects: bool = False


def output_tables(pipeline: PipelineSpec) -> tuple[OutputTable, ...]:
    """The pipeline's row tables (its table, or each route's, or each member's), then its rejects table."""
    rejects = OutputTable(pipeline.rejects_table, rejects_table_schema(), (), CommitOperation(), rejects=True)
    if pipeline.members:
        return (*(output_tables(m)[0] for m in pipeline.members), rejects)
    if pipeline.kind == WINDOWED:
        schema = aggregate_table_schema(pipeline)
        operation = CommitOperation()
        if pipeline.output_mode == "update":  # a window's row is replaced as its events arrive
            operation = CommitOperation(MERGE, (WINDOW_START, WINDOW_END, *group_columns(pipeline)))
    elif pipeline.kind == EVENTS:
        schema, operation = event_table_schema(pipeline), CommitOperation(APPEND)
    elif pipeline.kind == UPSERT:
        schema = event_table_schema(pipeline)
        operation = CommitOperation(MERGE, pipeline.key, pipeline.version_field)
    else:  # pragma: no cover - the spec admits no other kind
        raise ValueError(pipeline.kind)
    rows = tuple(OutputTable(name, schema, pipeline.partition_by, operation) for name in pipeline.tables)
    return (*rows, rejects)


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
