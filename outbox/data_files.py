"""A staged Parquet file as the Iceberg data file the relay registers, with the partition values its rows hold.

pyiceberg's ``parquet_file_to_data_file`` infers a file's partition from its column statistics (the min and max of
each partition source column). That fails or lies for part of what Krishiv writes:

* ``bucket`` does not preserve order, so pyiceberg refuses it (``Cannot infer partition value … non-linear``);
* a source column whose statistics are not collected (``write.metadata.metrics.default`` or the column's mode set
  to ``counts`` or ``none``) or not written (Parquet drops statistics of values over 4 KiB) gets the partition
  value null, silently, and a scan's partition filter then skips the file's rows.

Identity, year, month, day, hour and truncate do come out right where statistics exist, including a file whose
partition column is all null. Rather than trust statistics for some transforms and not others, :func:`data_file`
reads the partition source columns of the file (only those) and applies Iceberg's transforms to every row
(``krishiv_core.parquet_files.partition_keys``): the partition record is what the rows hold, for every transform,
and a file whose rows span several partitions of the table's current partitioning is refused rather than
registered under a wrong value. The statistics themselves are computed as pyiceberg computes them.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    _check_pyarrow_schema_compatible,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.typedef import Record

from krishiv_core.arrow_paths import column_at, top_level
from krishiv_core.errors import SchemaConflict
from krishiv_core.parquet_files import describe_record, split_by_partition
from krishiv_core.partitioning import describe_spec
from krishiv_core.runbook import runbook
from outbox.errors import StagedFileMissing

_FIELD_ID = b"PARQUET:field_id"


def data_file(table: Table, path: str) -> DataFile:
    """The data file of the staged Parquet file at ``path``, for the table's current schema and partitioning.

    Raises :class:`StagedFileMissing` if the file is gone, and :class:`SchemaConflict` if its rows belong to more
    than one partition of the table's current partition spec (it was staged for another partitioning).
    """
    schema, spec = table.schema(), table.spec()
    input_file = table.io.new_input(path)
    try:
        with input_file.open() as stream:
            parquet = pq.ParquetFile(stream)
            metadata = parquet.metadata
            sources = _partition_sources(parquet, schema, spec)
        size = len(input_file)
    except FileNotFoundError as exc:
        raise StagedFileMissing(path) from exc

    _check_pyarrow_schema_compatible(
        schema, metadata.schema.to_arrow_schema(), format_version=table.metadata.format_version
    )
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=metadata,
        stats_columns=compute_statistics_plan(schema, table.metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    registered = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=_partition(table, spec, schema, sources, path),
        file_size_in_bytes=size,
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )
    registered.spec_id = spec.spec_id  # not a field of the struct: from_args would drop it
    return registered


def _partition_sources(parquet: pq.ParquetFile, schema: Schema, spec: PartitionSpec) -> pa.Table:
    """The file's partition source columns, named and typed as in ``schema`` (matched by field id, else by name;
    a column the file predates is null). A source inside structs (``meta.ts``) is found in the file by its field id
    at any depth (else by its path) and comes out as a column named by its path."""
    source_ids = list(dict.fromkeys(f.source_id for f in spec.fields))
    if not source_ids:
        return pa.table({})
    file_schema = parquet.schema_arrow
    with_ids = any(f.metadata and _FIELD_ID in f.metadata for f in file_schema)
    wanted = {}
    for source_id in source_ids:
        name = schema.find_column_name(source_id)
        in_file = _file_path(file_schema, source_id) if with_ids else _named_path(file_schema, name.split("."))
        wanted[source_id] = (name, in_file)
    read = parquet.read(columns=top_level([".".join(f) for _, f in wanted.values() if f]), use_threads=False)
    columns, names = [], []
    for source_id, (name, in_file) in wanted.items():
        arrow_type = schema_to_pyarrow(schema.find_field(source_id).field_type, include_field_ids=False)
        column = column_at(read, ".".join(in_file)) if in_file else pa.nulls(parquet.metadata.num_rows, arrow_type)
        columns.append(column.cast(arrow_type) if column.type != arrow_type else column)
        names.append(name)
    return pa.table(columns, names=names)


def _file_path(fields: Iterable[pa.Field], field_id: int) -> list[str] | None:
    """The names leading to the field of ``field_id`` through the file's struct columns (None if it has none)."""
    for f in fields:
        if f.metadata and int(f.metadata.get(_FIELD_ID, -1)) == field_id:
            return [f.name]
        if pa.types.is_struct(f.type):
            inner = _file_path(f.type, field_id)
            if inner:
                return [f.name, *inner]
    return None


def _named_path(fields: Iterable[pa.Field], names: list[str]) -> list[str] | None:
    """``names`` if the file's struct columns hold that path (a file written without field ids)."""
    for f in fields:
        if f.name == names[0]:
            if len(names) == 1:
                return names
            return names if pa.types.is_struct(f.type) and _named_path(f.type, names[1:]) else None
    return None


def _partition(table: Table, spec: PartitionSpec, schema: Schema, sources: pa.Table, path: str) -> Record:
    if not spec.fields:
        return Record()
    parts = split_by_partition(spec, schema, sources)
    if not parts:  # a file without rows: no partition value to hold
        return Record(*(None for _ in spec.fields))
    if len(parts) > 1:
        shown = ", ".join(describe_record(spec, schema, record) for record, _ in parts[:5])
        more = f" and {len(parts) - 5} more" if len(parts) > 5 else ""
        raise SchemaConflict(
            f"staged file {path} holds rows of {len(parts)} partitions ({shown}{more}) under table "
            f"{'.'.join(table.name())}'s partitioning {describe_spec(spec, schema)}: it was staged for another "
            "partitioning, and a data file must hold one partition; set partition_by back until the relay has "
            f"committed the batch, then change it {runbook('A spec change the table cannot take')}"
        )
    return parts[0][0]
