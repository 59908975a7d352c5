"""Staged Parquet files: rows cast to the table's schema, one file per partition value, Iceberg's transforms."""

from __future__ import annotations

import multiprocessing
import pickle
import random
import re
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    DecimalType,
    DoubleType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from krishiv_core.entries import DATA, DELETE_KEYS, StagedFile
from krishiv_core.errors import SchemaConflict
from krishiv_core.parquet_files import load_io, partition_keys, write_staged_files
from krishiv_core.partitioning import PartitionField, partition_spec
from outbox.data_files import data_file

SCHEMA = Schema(
    NestedField(1, "ts", TimestamptzType(), required=True),
    NestedField(2, "customer_id", StringType(), required=False),
    NestedField(3, "n", LongType(), required=False),
    NestedField(4, "i", IntegerType(), required=False),
    NestedField(5, "amount", DecimalType(10, 2), required=False),
    NestedField(6, "flag", BooleanType(), required=False),
)
PART = re.compile(r"part-[0-9a-f]{32}\.parquet")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def spec(*fields: PartitionField) -> PartitionSpec:
    return partition_spec(SCHEMA, fields)


def field_ids(path: str) -> dict[str, int]:
    return {f.name: int(f.metadata[b"PARQUET:field_id"]) for f in pq.read_schema(path)}


def test_rows_are_cast_to_the_table_schema_with_field_ids(tmp_path: Path) -> None:
    rows = pa.table(
        {
            "extra": ["dropped", "too"],
            "n": pa.array([1, 2], pa.int32()),  # widened to long
            "ts": pa.array([1_714_557_600_000, 1_714_557_600_001], pa.timestamp("ms")),  # naive ms -> UTC micros
            "amount": [Decimal("1.5"), None],
        }
    )
    (staged,) = write_staged_files(load_io({}, str(tmp_path)), SCHEMA, spec(), rows, str(tmp_path / "b"))
    assert staged.records == 2 and staged.content == DATA
    assert staged.bytes == Path(staged.path).stat().st_size
    assert Path(staged.path).parent == tmp_path / "b" and PART.fullmatch(Path(staged.path).name)
    written = pq.read_table(staged.path)
    assert written.column_names == ["ts", "customer_id", "n", "i", "amount", "flag"]
    assert field_ids(staged.path) == {"ts": 1, "customer_id": 2, "n": 3, "i": 4, "amount": 5, "flag": 6}
    assert written.schema.field("n").type == pa.int64()
    assert written.column("ts").to_pylist() == [utc(2024, 5, 1, 10), utc(2024, 5, 1, 10, 0, 0, 1000)]
    assert written.column("customer_id").to_pylist() == [None, None]
    assert written.column("amount").to_pylist() == [Decimal("1.50"), None]
    assert not written.schema.field("ts").nullable
    metadata = pq.read_metadata(staged.path)
    assert {metadata.row_group(0).column(c).compression for c in range(metadata.num_columns)} == {"ZSTD"}


def test_a_missing_required_column_or_nulls_in_one_are_refused(tmp_path: Path) -> None:
    io = load_io({}, str(tmp_path))
    with pytest.raises(SchemaConflict) as err:
        write_staged_files(io, SCHEMA, spec(), pa.table({"n": [1]}), str(tmp_path))
    assert str(err.value) == "staged rows have no column 'ts', which the table requires (they have n)"
    rows = pa.table({"ts": pa.array([None, utc(2024, 1, 1)], pa.timestamp("us", "UTC"))})
    with pytest.raises(SchemaConflict) as err:
        write_staged_files(io, SCHEMA, spec(), rows, str(tmp_path))
    assert str(err.value) == "staged rows hold 1 nulls in column 'ts', which the table requires"
    assert not list(tmp_path.rglob("*.parquet"))


def test_no_rows_give_no_file_and_every_write_gets_a_fresh_name(tmp_path: Path) -> None:
    io = load_io({}, str(tmp_path))
    empty = pa.table({"ts": pa.array([], pa.timestamp("us", "UTC"))})
    assert write_staged_files(io, SCHEMA, spec(), empty, str(tmp_path)) == ()
    assert write_staged_files(io, SCHEMA, spec(PartitionField("ts", "day")), empty, str(tmp_path)) == ()
    rows = pa.table({"ts": [utc(2024, 1, 1)]})
    first = write_staged_files(io, SCHEMA, spec(PartitionField("ts", "day")), rows, str(tmp_path))
    again = write_staged_files(io, SCHEMA, spec(PartitionField("ts", "day")), rows, str(tmp_path))
    assert first[0].path != again[0].path
    assert Path(first[0].path).parent == Path(again[0].path).parent == tmp_path / "ts_day=2024-01-01"


def test_rows_are_split_into_one_file_per_partition_value(tmp_path: Path) -> None:
    rows = pa.table(
        {
            "ts": [
                utc(2024, 5, 1, 10),
                utc(1969, 12, 31, 23, 59),
                utc(2024, 5, 1, 23),
                utc(2024, 5, 2),
                utc(2024, 5, 1),
            ],
            "customer_id": ["a", "b", None, "a", None],
            "n": [1, 2, 3, 4, 5],
        }
    )
    files = write_staged_files(
        load_io({}, str(tmp_path)),
        SCHEMA,
        spec(PartitionField("ts", "day"), PartitionField("customer_id", "identity")),
        rows,
        str(tmp_path / "batch=1") + "/",
    )
    by_folder = {str(Path(f.path).parent.relative_to(tmp_path)): f for f in files}
    assert sorted(by_folder) == [
        "batch=1/ts_day=1969-12-31/customer_id=b",
        "batch=1/ts_day=2024-05-01/customer_id=a",
        "batch=1/ts_day=2024-05-01/customer_id=null",
        "batch=1/ts_day=2024-05-02/customer_id=a",
    ]
    assert {k: pq.read_table(f.path).column("n").to_pylist() for k, f in by_folder.items()} == {
        "batch=1/ts_day=1969-12-31/customer_id=b": [2],
        "batch=1/ts_day=2024-05-01/customer_id=a": [1],
        "batch=1/ts_day=2024-05-01/customer_id=null": [3, 5],
        "batch=1/ts_day=2024-05-02/customer_id=a": [4],
    }
    assert {k: f.records for k, f in by_folder.items()} == {k: 2 if k.endswith("null") else 1 for k in by_folder}


def test_time_transforms_agree_with_icebergs_own_definition(tmp_path: Path) -> None:
    """Arrow computes year/month/day/hour in bulk; pyiceberg's scalar transform is the reference, before and
    after the epoch and at every boundary."""
    rng = random.Random(7)
    stamps = [utc(1970, 1, 1) + timedelta(microseconds=rng.randint(-(6 * 10**16), 6 * 10**16)) for _ in range(2_000)]
    stamps += [utc(1970, 1, 1) + timedelta(microseconds=d) for d in (-1, 0, 1, -3_600_000_000, -86_400_000_000)]
    stamps += [utc(1969, 12, 31, 23, 59, 59, 999_999), utc(2000, 2, 29, 23, 59, 59), utc(1900, 3, 1)]
    rows = pa.table({"ts": pa.array(stamps, pa.timestamp("us", "UTC"))})
    micros = [int((s - utc(1970, 1, 1)) / timedelta(microseconds=1)) for s in stamps]
    for transform in ("year", "month", "day", "hour"):
        iceberg_spec = spec(PartitionField("ts", transform))
        apply = iceberg_spec.fields[0].transform.transform(TimestamptzType())
        (keys,) = partition_keys(iceberg_spec, SCHEMA, rows)
        assert keys.to_pylist() == [apply(m) for m in micros], transform


#: The Iceberg specification's hash examples (appendix B): murmur3_x86_32 of each value's single-value
#: serialization; bucket N is (hash & Integer.MAX_VALUE) % N.
SPEC_HASHES = [
    ("i", pa.int32(), 34, 2017239379),
    ("n", pa.int64(), 34, 2017239379),
    ("amount", pa.decimal128(10, 2), Decimal("14.20"), -500754589),
    ("customer_id", pa.string(), "iceberg", 1210000089),
    ("ts", pa.timestamp("us", "UTC"), utc(2017, 11, 16, 22, 31, 8), -2047944441),
]


@pytest.mark.parametrize(("column", "arrow_type", "value", "hash_"), SPEC_HASHES)
def test_bucket_follows_the_iceberg_specification(column: str, arrow_type: pa.DataType, value, hash_: int) -> None:
    rows = pa.table({column: pa.array([value, None], arrow_type)})
    for n in (16, 1000):
        (keys,) = partition_keys(spec(PartitionField(column, "bucket", n)), SCHEMA, rows)
        assert keys.to_pylist() == [(hash_ & 0x7FFFFFFF) % n, None]


@pytest.mark.parametrize(
    ("column", "arrow_type", "width", "values", "truncated"),
    [
        ("i", pa.int32(), 10, [1, -1, 10, -10, 0], [0, -10, 10, -10, 0]),
        ("n", pa.int64(), 10, [1, -1, 999], [0, -10, 990]),
        (
            "amount",
            pa.decimal128(10, 2),
            50,
            [Decimal("10.65"), Decimal("-0.05")],
            [Decimal("10.50"), Decimal("-0.50")],
        ),
        ("customer_id", pa.string(), 3, ["iceberg", "ab", "🧊🧊🧊🧊"], ["ice", "ab", "🧊🧊🧊"]),
    ],
)
def test_truncate_follows_the_iceberg_specification(column, arrow_type, width, values, truncated) -> None:
    rows = pa.table({column: pa.array([*values, None], arrow_type)})
    (keys,) = partition_keys(spec(PartitionField(column, "truncate", width)), SCHEMA, rows)
    assert keys.to_pylist() == [*truncated, None]


def test_delete_keys_are_written_as_they_are_with_the_tables_field_ids(tmp_path: Path) -> None:
    keys = Schema(NestedField(2, "customer_id", StringType(), required=False), NestedField(4, "i", IntegerType()))
    rows = pa.table({"customer_id": ["a", "b"], "i": [1, 2]})
    (staged,) = write_staged_files(
        load_io({}, str(tmp_path)), keys, PartitionSpec(), rows, str(tmp_path), content=DELETE_KEYS
    )
    assert staged.content == DELETE_KEYS and staged.records == 2
    assert field_ids(staged.path) == {"customer_id": 2, "i": 4}
    assert pq.read_table(staged.path).to_pylist() == [{"customer_id": "a", "i": 1}, {"customer_id": "b", "i": 2}]


def _write_in_another_process(payload: bytes) -> tuple[StagedFile, ...]:
    properties, location, schema, iceberg_spec, rows, folder = pickle.loads(payload)
    return write_staged_files(load_io(properties, location), schema, iceberg_spec, rows, folder)


def test_a_task_in_another_process_writes_from_pickled_schema_spec_and_io_properties(tmp_path: Path) -> None:
    """What a Spark executor task gets: the table's io.properties and location, its schema and spec, the rows."""
    rows = pa.table({"ts": [utc(2024, 5, 1), utc(2024, 5, 2)], "n": [1, 2]})
    payload = pickle.dumps(({}, f"file://{tmp_path}", SCHEMA, spec(PartitionField("ts", "day")), rows, str(tmp_path)))
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        files = pool.submit(_write_in_another_process, payload).result(timeout=120)
    assert sorted(Path(f.path).parent.name for f in files) == ["ts_day=2024-05-01", "ts_day=2024-05-02"]
    assert sorted(pq.read_table(f.path).column("n")[0].as_py() for f in files) == [1, 2]


#: A table with nested columns, as tables.event_table_schema numbers one: top-level columns first, then their parts.
NESTED = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(
        2,
        "gps",
        StructType(
            NestedField(6, "lat", DoubleType(), required=True),
            NestedField(7, "alt", LongType(), required=False),
            NestedField(8, "at", StructType(NestedField(9, "ts", TimestamptzType(), required=True)), required=False),
        ),
        required=False,
    ),
    NestedField(3, "tags", ListType(10, StringType(), element_required=True), required=False),
    NestedField(
        4,
        "readings",
        ListType(
            11,
            StructType(
                NestedField(12, "value", DecimalType(38, 10), required=True),
                NestedField(13, "note", StringType(), required=False),
            ),
            element_required=False,
        ),
        required=True,
    ),
    NestedField(5, "attrs", MapType(14, StringType(), 15, DecimalType(20, 6), value_required=False), required=False),
)
#: Spark's Arrow for those columns: its own part names (item, entries), an int inside a struct, ms timestamps.
SPARK_NESTED = pa.schema(
    [
        ("id", pa.int64()),
        (
            "gps",
            pa.struct(
                [("lat", pa.float64()), ("alt", pa.int32()), ("at", pa.struct([("ts", pa.timestamp("ms", "UTC"))]))]
            ),
        ),
        ("tags", pa.list_(pa.string())),
        ("readings", pa.list_(pa.struct([("value", pa.decimal128(38, 10)), ("note", pa.string())]))),
        ("attrs", pa.map_(pa.string(), pa.decimal128(20, 6))),
        ("extra", pa.string()),
    ]
)
BIG = Decimal("9999999999999999999999999999.9999999999")  # decimal(38,10)'s largest
SMALLEST = Decimal("-9999999999999999999999999999.9999999999")  # (-BIG would round to Python's 28 digits)
NESTED_ROWS = [
    {
        "id": 1,
        "gps": {"lat": -90.0, "alt": -(2**31), "at": {"ts": utc(1969, 12, 31, 23, 59, 59, 999_000)}},
        "tags": ["cold", "", "ünï"],
        "readings": [{"value": BIG, "note": None}, None, {"value": SMALLEST, "note": "x"}],
        "attrs": [("speed", Decimal("-0.000001")), ("load", None), ("", Decimal("99999999999999.999999"))],
    },
    {"id": 2, "gps": None, "tags": [], "readings": [], "attrs": []},
    {"id": 3, "gps": {"lat": 0.0, "alt": None, "at": None}, "tags": None, "readings": [None], "attrs": None},
]


def nested_rows(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([{**r, "extra": "dropped"} for r in rows], schema=SPARK_NESTED)


def test_nested_rows_get_field_ids_at_every_depth_and_read_back_the_same_in_pyiceberg(tmp_path: Path) -> None:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    catalog.create_namespace("ns")
    table = catalog.create_table(("ns", "nested"), schema=NESTED)
    (staged,) = write_staged_files(table.io, table.schema(), table.spec(), nested_rows(NESTED_ROWS), str(tmp_path))

    def ids(field: pa.Field) -> list[tuple[str, int]]:
        found = [(field.name, int(field.metadata[b"PARQUET:field_id"]))] if field.metadata else []
        children = field.type.fields if isinstance(field.type, pa.StructType) else []
        if isinstance(field.type, pa.MapType):
            children = [field.type.key_field, field.type.item_field]
        elif isinstance(field.type, (pa.ListType, pa.LargeListType)):
            children = [field.type.value_field]
        return found + [pair for child in children for pair in ids(child)]

    written = pq.read_schema(staged.path)
    assert [pair for f in written for pair in ids(f)] == [
        ("id", 1),
        ("gps", 2),
        ("lat", 6),
        ("alt", 7),
        ("at", 8),
        ("ts", 9),
        ("tags", 3),
        ("element", 10),
        ("readings", 4),
        ("element", 11),
        ("value", 12),
        ("note", 13),
        ("attrs", 5),
        ("key", 14),
        ("value", 15),
    ]
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        append.append_data_file(data_file(table, staged.path))  # as the relay registers it
    got = sorted(catalog.load_table(("ns", "nested")).scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert got == NESTED_ROWS


@pytest.mark.parametrize(
    ("row", "path"),
    [
        ({"gps": {"lat": None, "at": None}}, "gps.lat"),  # a present struct's required field
        ({"gps": {"lat": 1.0, "at": {"ts": None}}}, "gps.at.ts"),  # two structs down
        ({"tags": ["a", None]}, "tags.element"),
        ({"readings": [{"value": None}]}, "readings.element.value"),  # inside a list's element struct
        ({"readings": None}, "readings"),
    ],
)
def test_a_null_in_a_required_nested_part_is_refused_naming_its_path(tmp_path: Path, row: dict, path: str) -> None:
    base = {"id": 9, "gps": None, "tags": None, "readings": [], "attrs": None}
    rows = nested_rows([NESTED_ROWS[1], {**base, **row}])
    with pytest.raises(SchemaConflict) as err:
        write_staged_files(load_io({}, str(tmp_path)), NESTED, PartitionSpec(), rows, str(tmp_path))
    assert str(err.value) == f"staged rows hold 1 nulls in column {path!r}, which the table requires"
    assert not list(tmp_path.rglob("*.parquet"))


def test_nulls_under_a_null_struct_or_list_are_no_conflict(tmp_path: Path) -> None:
    """A required part of an optional struct (or list) that is null holds no value: that is no null to refuse."""
    rows = nested_rows([{"id": 1, "gps": None, "tags": None, "readings": [None, {"value": 1, "note": None}]}])
    (staged,) = write_staged_files(load_io({}, str(tmp_path)), NESTED, PartitionSpec(), rows, str(tmp_path))
    assert pq.read_table(staged.path).column("readings").to_pylist() == [[None, {"value": 1, "note": None}]]


def test_an_absent_optional_struct_inside_a_required_one_writes_and_reads_back(tmp_path: Path) -> None:
    """meta (required) > origin (optional) > host (required): where origin is null, host has no value, though
    Spark's column holds a null there (Arrow's cast and Parquet's writer refused it, the chaos scenario found)."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(
            2,
            "meta",
            StructType(
                NestedField(3, "seq", LongType(), required=True),
                NestedField(
                    4,
                    "origin",
                    StructType(
                        NestedField(5, "host", StringType(), required=True),
                        NestedField(
                            6, "rack", StructType(NestedField(7, "row", IntegerType(), required=True)), required=True
                        ),
                        NestedField(8, "tags", ListType(9, StringType(), element_required=True), required=True),
                        NestedField(
                            10, "attrs", MapType(11, StringType(), 12, LongType(), value_required=True), required=True
                        ),
                    ),
                    required=False,
                ),
            ),
            required=True,
        ),
    )
    origin = pa.struct(
        [
            ("host", pa.string()),
            ("rack", pa.struct([("row", pa.int32())])),
            ("tags", pa.list_(pa.string())),
            ("attrs", pa.map_(pa.string(), pa.int64())),
        ]
    )
    spark = pa.schema([("id", pa.int64()), ("meta", pa.struct([("seq", pa.int64()), ("origin", origin)]))])
    rows = [
        {"id": 1, "meta": {"seq": 1, "origin": {"host": "h", "rack": {"row": 2}, "tags": ["a"], "attrs": [("k", 3)]}}},
        {"id": 2, "meta": {"seq": 2, "origin": None}},
        {"id": 3, "meta": {"seq": 3, "origin": {"host": "", "rack": {"row": -1}, "tags": [], "attrs": []}}},
    ]
    batch = pa.Table.from_pylist(rows, schema=spark)
    sliced = pa.concat_tables([batch.slice(0, 1), batch.slice(1)])  # Spark hands a task's rows in several chunks
    (staged,) = write_staged_files(load_io({}, str(tmp_path)), schema, PartitionSpec(), sliced, str(tmp_path))
    assert pq.read_table(staged.path).to_pylist() == rows
