"""Staged Parquet files, one per partition value: what phase 1 writes and phase 2 registers as they are.

:func:`write_staged_files` casts a batch's rows to the table's schema (Arrow with Iceberg field ids), splits them
by the value of each partition field and writes each part as a new zstd Parquet file under
``<folder>/<partition path>/``. It needs no table object and no driver state (a :class:`FileIO`, a schema and a
partition spec, all picklable), so it runs in Spark executor tasks as well as on the driver; a task rebuilds its
FileIO with :func:`load_io` from the table's ``io.properties``.

:func:`partition_keys` computes partition values from rows, with Iceberg's transforms; the relay uses it too, to
register each file with the partition values its rows really hold (``outbox.data_files``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.partitioning import PartitionField, PartitionSpec, partition_record_value
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform, MonthTransform, YearTransform
from pyiceberg.typedef import Record
from pyiceberg.types import DateType, IcebergType, TimestampType, TimestamptzType, TimeType

from krishiv_core.arrow_paths import column_at
from krishiv_core.bloom_filters import writer_options
from krishiv_core.entries import DATA, StagedFile
from krishiv_core.errors import SchemaConflict

_MICROS_PER_HOUR = 3_600_000_000
_MICROS_PER_DAY = 24 * _MICROS_PER_HOUR
_TIMESTAMPS = (TimestampType, TimestamptzType)


def load_io(properties: Mapping[str, str], location: str) -> FileIO:
    """The FileIO of a table, rebuilt from its ``io.properties`` and location (in an executor task, say)."""
    return load_file_io(dict(properties), location)


def to_table_schema(rows: pa.Table, schema: Schema) -> pa.Table:
    """``rows`` as Arrow of ``schema`` with Iceberg field ids at every depth: columns in schema order and types
    (structs, lists and maps cast part by part), extra columns dropped, missing optional columns null; a missing
    required column, or a null in a required part (a column, a present struct's field, a list's element, a map's
    value), is a SchemaConflict naming the part by its Iceberg path (``gps.lat``, ``tags.element``)."""
    target = schema_to_pyarrow(schema, include_field_ids=True)
    columns = []
    for field in target:
        if field.name in rows.column_names:
            column = rows.column(field.name)
            nulls = _required_nulls(column, field, field.name)  # before the cast, which refuses them less clearly
            if nulls:
                path, count = nulls
                raise SchemaConflict(f"staged rows hold {count} nulls in column {path!r}, which the table requires")
            if column.type != field.type:
                column = _cast(column, field.type)
        elif field.nullable:
            column = pa.nulls(rows.num_rows, field.type)
        else:
            raise SchemaConflict(
                f"staged rows have no column {field.name!r}, which the table requires (they have "
                f"{', '.join(rows.column_names) or 'no columns'})"
            )
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=target)


def _cast(column: pa.Array | pa.ChunkedArray, target: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """``column`` as ``target``, a nested type part by part. Arrow's own cast, and Parquet's writer, refuse a null in
    a required part even where it lies under a null struct (an absent optional struct's required field), which is
    no null at all: such a slot gets a placeholder value the struct's null hides (:func:`_filled`)."""
    if isinstance(column, pa.ChunkedArray):
        return pa.chunked_array([_cast(chunk, target) for chunk in column.chunks], target)
    if column.type == target:
        return column
    mask = column.is_null() if column.null_count else None
    if pa.types.is_struct(target) and pa.types.is_struct(column.type):
        children = []
        for part in target:
            index = column.type.get_field_index(part.name)
            child = column.field(index) if index >= 0 else pa.nulls(len(column), part.type)
            child = _cast(child, part.type)
            children.append(child if part.nullable else _filled(child))
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if (pa.types.is_map(target) and pa.types.is_map(column.type)) or (_is_list(target) and _is_list(column.type)):
        # fresh offsets over the present entries: a slice's own offsets take no null mask in from_arrays, and
        # pyiceberg's Arrow schema has large lists (64-bit offsets) where a staged column may have either
        large = pa.types.is_large_list(target)
        if pa.types.is_map(column.type):  # a map is laid out as a list of (key, value) structs
            entries = pa.struct([column.type.key_field, column.type.item_field])
            column = column.view(pa.list_(pa.field("entries", entries, nullable=False)))
        lengths = pc.fill_null(pc.list_value_length(column), 0).cast(pa.int64())
        offsets = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(lengths)])
        offsets = offsets.cast(pa.int64() if large else pa.int32())
        present = column.flatten()
        if pa.types.is_map(target):
            keys = _cast(present.field(0), target.key_type)
            items = _cast(present.field(1), target.item_type)
            items = items if target.item_field.nullable else _filled(items)
            return pa.MapArray.from_arrays(offsets, keys, items, type=target, mask=mask)
        values = _cast(present, target.value_type)
        values = values if target.value_field.nullable else _filled(values)
        array_type = pa.LargeListArray if large else pa.ListArray
        return array_type.from_arrays(offsets, values, type=target, mask=mask)
    return column.cast(target)


def _filled(array: pa.Array) -> pa.Array:
    """``array`` with a placeholder in each null slot (a zero, an empty string or list, a struct of placeholders):
    for a required part under a null struct, where a reader never sees it (a null elsewhere was refused before)."""
    if not array.null_count:
        return array
    t = array.type
    if pa.types.is_struct(t):
        children = [_filled(array.field(i)) if not f.nullable else array.field(i) for i, f in enumerate(t)]
        return pa.StructArray.from_arrays(children, fields=list(t))
    if pa.types.is_map(t) or _is_list(t):
        return pc.if_else(array.is_null(), _empty(t, len(array)), array)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pc.fill_null(array, "")
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pc.fill_null(array, b"")
    if pa.types.is_boolean(t):
        return pc.fill_null(array, False)
    return pc.fill_null(array, pa.scalar(0, pa.int64()).cast(t))


def _empty(t: pa.DataType, n: int) -> pa.Array:
    """``n`` empty lists (or maps) of type ``t``."""
    large = pa.types.is_large_list(t)
    offsets = pa.array([0] * (n + 1), pa.int64() if large else pa.int32())
    if pa.types.is_map(t):
        return pa.MapArray.from_arrays(offsets, pa.array([], t.key_type), pa.array([], t.item_type), type=t)
    return (pa.LargeListArray if large else pa.ListArray).from_arrays(offsets, pa.array([], t.value_type), type=t)


def _required_nulls(column: pa.Array | pa.ChunkedArray, field: pa.Field, path: str) -> tuple[str, int] | None:
    """The first required part of ``field`` (the table's) holding a null in ``column`` (the rows', of the same
    shape, its struct fields found by name) where its parent holds a value, as (Iceberg path, how many), or None.
    A struct's fields are looked at where the struct is present; a list's elements and a map's keys and values
    only inside present lists and maps."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    count = sum(chunk.null_count for chunk in chunks)
    if count and not field.nullable:
        return path, count
    for chunk in chunks:
        found = _required_nulls_inside(chunk, field.type, path)
        if found:
            return found
    return None


def _required_nulls_inside(array: pa.Array, arrow_type: pa.DataType, path: str) -> tuple[str, int] | None:
    parts: list[tuple[pa.Array, pa.Field, str]] = []
    if pa.types.is_struct(arrow_type) and pa.types.is_struct(array.type):
        # flatten() gives each field's values with the struct's own nulls folded in: a null there is a null field
        # of a present struct only where the struct is valid
        valid, children = array.is_valid(), array.flatten()
        for part in arrow_type:
            index = array.type.get_field_index(part.name)
            if index < 0:
                continue  # the cast says so
            child = children[index]
            if not part.nullable:
                count = pc.sum(pc.and_(child.is_null(), valid)).as_py() or 0
                if count:
                    return f"{path}.{part.name}", count
            parts.append((child, part.with_nullable(True), f"{path}.{part.name}"))
    elif pa.types.is_map(arrow_type) and pa.types.is_map(array.type):
        # a map is laid out as a list of (key, value) structs: viewed as one, flatten() gives present maps' entries
        entries_type = pa.struct([array.type.key_field, array.type.item_field])
        entries = array.view(pa.list_(pa.field("entries", entries_type, nullable=False))).flatten()
        parts += [
            (entries.field(0), arrow_type.key_field, f"{path}.key"),
            (entries.field(1), arrow_type.item_field, f"{path}.value"),
        ]
    elif _is_list(arrow_type) and _is_list(array.type):
        parts.append((array.flatten(), arrow_type.value_field, f"{path}.element"))
    for child, part, child_path in parts:
        found = _required_nulls(child, part, child_path)
        if found:
            return found
    return None


def _is_list(arrow_type: pa.DataType) -> bool:
    return pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)


def _internal_type(t: IcebergType) -> pa.DataType:
    """The Arrow type of a partition value in Iceberg's internal form (timestamps as micros, dates as days)."""
    if isinstance(t, (*_TIMESTAMPS, TimeType)):
        return pa.int64()
    if isinstance(t, DateType):
        return pa.int32()
    return schema_to_pyarrow(t, include_field_ids=False)


def _floordiv(values: pa.Array, divisor: int) -> pa.Array:
    quotient = pc.divide(values, divisor)  # integer division truncates towards zero
    return pc.if_else(pc.greater(pc.multiply(quotient, divisor), values), pc.subtract(quotient, 1), quotient)


def _time_transform(field: PartitionField, source: IcebergType, column: pa.Array) -> pa.Array | None:
    """Year, month, day or hour of a timestamp column, computed in Arrow; None where another type needs Python."""
    transform = field.transform
    if not isinstance(source, _TIMESTAMPS) or not isinstance(
        transform, (YearTransform, MonthTransform, DayTransform, HourTransform)
    ):
        return None
    micros = column.cast(pa.timestamp("us", tz=getattr(column.type, "tz", None))).cast(pa.int64())
    if isinstance(transform, HourTransform):
        return _floordiv(micros, _MICROS_PER_HOUR).cast(pa.int32())
    if isinstance(transform, DayTransform):
        return _floordiv(micros, _MICROS_PER_DAY).cast(pa.int32())
    utc = micros.cast(pa.timestamp("us"))
    years = pc.subtract(pc.year(utc), 1970)
    if isinstance(transform, YearTransform):
        return years.cast(pa.int32())
    return pc.add(pc.multiply(years, 12), pc.subtract(pc.month(utc), 1)).cast(pa.int32())


def _transform_column(field: PartitionField, schema: Schema, column: pa.Array) -> pa.Array:
    source = schema.find_field(field.source_id).field_type
    fast = _time_transform(field, source, column)
    if fast is not None:
        return fast
    result_type = _internal_type(field.transform.result_type(source))
    if isinstance(field.transform, IdentityTransform) and isinstance(source, (*_TIMESTAMPS, DateType)):
        return column.cast(result_type)
    # Python, once per distinct value: Iceberg's own bucket (murmur3) and truncate definitions.
    encoded = pc.dictionary_encode(column)
    apply = field.transform.transform(source)
    values = [apply(partition_record_value(field, v, schema)) for v in encoded.dictionary.to_pylist()]
    return pc.take(pa.array(values, type=result_type), encoded.indices)


def partition_keys(spec: PartitionSpec, schema: Schema, rows: pa.Table) -> list[pa.Array]:
    """Per partition field of ``spec``, each row's partition value (Iceberg's internal form).

    ``rows`` holds the partition source columns under their names in ``schema`` (other columns are ignored); a
    source inside structs (``meta.ts``) is read from its struct column, or from a column named by its path.
    """
    out = []
    for field in spec.fields:
        name = schema.find_column_name(field.source_id)
        column = column_at(rows, name)
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        out.append(_transform_column(field, schema, column))
    return out


def split_by_partition(spec: PartitionSpec, schema: Schema, rows: pa.Table) -> list[tuple[Record, pa.Table]]:
    """``rows`` split by partition value: each distinct partition record with its rows, in first-seen order."""
    if not spec.fields:
        return [(Record(), rows)] if rows.num_rows else []
    keys = partition_keys(spec, schema, rows)
    names = [f"k{i}" for i in range(len(keys))]
    index = pa.table([*keys, pa.array(range(rows.num_rows), pa.int64())], names=[*names, "row"])
    groups = index.group_by(names, use_threads=False).aggregate([("row", "list")]).to_pylist()
    groups.sort(key=lambda g: g["row_list"][0])
    return [(Record(*(g[n] for n in names)), rows.take(g["row_list"])) for g in groups]


def write_staged_files(
    io: FileIO, schema: Schema, spec: PartitionSpec, rows: pa.Table, folder: str, content: str = DATA
) -> tuple[StagedFile, ...]:
    """Write ``rows`` as one new Parquet file per partition value under ``folder/<partition path>/``.

    The rows are cast to ``schema`` (extra columns dropped, missing optional columns null); an unpartitioned
    ``spec`` gives one file, no rows give no file. Each file has a fresh name (``part-<uuid>.parquet``) and is
    created with ``overwrite=False``, so a retry never replaces a file an earlier attempt may have published.
    For ``content=DELETE_KEYS`` pass the key columns and a schema of just those columns (with the table's
    field ids); ``spec`` may then only use key columns.
    """
    missing = [f.name for f in spec.fields if schema.find_column_name(f.source_id) is None]
    if missing:
        raise ValueError(f"partition fields {', '.join(missing)} have no source column in the schema of the rows")
    rows = to_table_schema(rows, schema)
    keys = key_columns(schema)
    base = folder.rstrip("/")
    staged = []
    for record, part in split_by_partition(spec, schema, rows):
        subfolder = f"{base}/{spec.partition_to_path(record, schema)}" if spec.fields else base
        staged.append(_write(io, part, f"{subfolder}/part-{uuid.uuid4().hex}.parquet", content, keys))
    return tuple(staged)


def key_columns(schema: Schema) -> list[str]:
    """The table's top-level identifier (key) columns: a data file gets a Bloom filter on each
    (``krishiv_core.bloom_filters``)."""
    top = {f.field_id: f.name for f in schema.fields}
    return [top[i] for i in schema.identifier_field_ids if i in top]


def _write(io: FileIO, rows: pa.Table, path: str, content: str, keys: list[str]) -> StagedFile:
    blooms = writer_options(rows.schema, keys, rows.num_rows) if content == DATA else None
    with io.new_output(path).create(overwrite=False) as stream:
        pq.write_table(rows, stream, compression="zstd", store_decimal_as_integer=True, bloom_filter_options=blooms)
    return StagedFile(path=path, records=rows.num_rows, bytes=len(io.new_input(path)), content=content)


def describe_record(spec: PartitionSpec, schema: Schema, record: Any) -> str:
    """A partition record as its path: ``ts_day=2024-05-01/id_bucket=3``."""
    return spec.partition_to_path(record, schema) if spec.fields else "(unpartitioned)"
