"""ensure_table on real SQL catalogs: new tables get their partitioning, existing ones evolve as Iceberg allows
(one commit, old rows still readable) or are refused with a message naming table, column and both types."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import GreaterThanOrEqual
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.partitioning import PartitionField as IcebergPartitionField
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform, DayTransform, HourTransform, IdentityTransform
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from krishiv_core.catalog import TABLE_PROPERTIES, ensure_table
from krishiv_core.errors import SchemaConflict
from krishiv_core.evolution import ALLOWED_CHANGES, RELAXED_PROPERTY
from krishiv_core.parquet_files import write_staged_files
from krishiv_core.partitioning import PartitionField
from krishiv_core.runbook import runbook
from outbox.data_files import data_file

ID = ("ns", "orders")
SPEC_CHANGE_RUNBOOK = runbook("A spec change the table cannot take")
V1 = Schema(
    NestedField(1, "ts", TimestamptzType(), required=True),
    NestedField(2, "name", StringType(), required=False),
    NestedField(3, "n", IntegerType(), required=False),
    NestedField(4, "amount", DecimalType(10, 2), required=False),
    NestedField(5, "legacy", StringType(), required=True),
)


def schema(*fields: NestedField) -> Schema:
    """A spec's schema: ids numbered afresh (ensure_table must match columns by name)."""
    return Schema(*(NestedField(100 + i, f.name, f.field_type, required=f.required) for i, f in enumerate(fields)))


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlCatalog]:
    uri = f"sqlite:///{tmp_path}/catalog.db" if request.param == "sqlite" else request.getfixturevalue("postgres_uri")
    catalog = SqlCatalog("krishiv", uri=uri, warehouse=f"file://{tmp_path}/warehouse")
    yield catalog
    catalog.engine.dispose()


def append(table: Table, rows: list[dict[str, Any]], folder: Path) -> list[str]:
    """Stage rows for the table's current schema and spec and register them in one plain fast append
    (pyiceberg's own registration works for the identity and time transforms used here)."""
    arrow = pa.Table.from_pylist(rows)
    files = write_staged_files(table.io, table.schema(), table.spec(), arrow, str(folder))
    with table.transaction() as tx, tx.update_snapshot().fast_append() as fast_append:
        for f in files:
            fast_append.append_data_file(parquet_file_to_data_file(table.io, table.metadata, f.path))
    return [f.path for f in files]


def rows_of(table: Table, **kwargs: Any) -> list[dict[str, Any]]:
    return sorted(table.scan(**kwargs).to_arrow().to_pylist(), key=lambda r: r["ts"])


def test_a_new_table_gets_its_partitioning_and_a_second_call_changes_nothing(catalog: SqlCatalog) -> None:
    partition_by = (PartitionField("ts", "day"), PartitionField("name", "bucket", 8))
    table = ensure_table(catalog, ID, schema(*V1.fields), partition_by=partition_by)
    assert [(f.field_id, f.name, f.transform) for f in table.spec().fields] == [
        (1000, "ts_day", DayTransform()),
        (1001, "name_bucket", BucketTransform(8)),
    ]
    assert [table.schema().find_column_name(f.source_id) for f in table.spec().fields] == ["ts", "name"]
    # pyiceberg takes format-version as the metadata's version, not a property (and pops it from a dict passed
    # to create_table: other tests pass TABLE_PROPERTIES itself)
    wanted = {k: v for k, v in TABLE_PROPERTIES.items() if k != "format-version"}
    assert {k: table.properties[k] for k in wanted} == wanted
    assert table.format_version == 2
    location = table.metadata_location
    again = ensure_table(catalog, ID, schema(*V1.fields), partition_by=partition_by)
    assert again.metadata_location == location


def test_add_a_column_and_widen_int_and_decimal_then_read_old_and_new_rows(catalog: SqlCatalog, tmp_path: Path) -> None:
    table = ensure_table(catalog, ID, V1)
    old = [
        {"ts": utc(2024, 5, 1), "name": "a", "n": 7, "amount": Decimal("12345678.91"), "legacy": "x"},
        {"ts": utc(2024, 5, 2), "name": None, "n": None, "amount": None, "legacy": "y"},
    ]
    append(table, old, tmp_path / "b0")
    before = table.metadata
    v2 = schema(
        NestedField(0, "ts", TimestamptzType(), required=True),
        NestedField(0, "name", StringType(), required=False),
        NestedField(0, "n", LongType(), required=False),
        NestedField(0, "amount", DecimalType(12, 2), required=False),
        NestedField(0, "legacy", StringType(), required=True),
        NestedField(0, "region", StringType(), required=True),  # required in the spec: added optional
        NestedField(0, "score", DoubleType(), required=False),
    )
    table = ensure_table(catalog, ID, v2)

    assert len(table.metadata.metadata_log) == len(before.metadata_log) + 1  # one commit
    evolved = table.schema()
    assert evolved.schema_id == before.current_schema_id + 1
    assert [(f.field_id, f.name, str(f.field_type), f.required) for f in evolved.fields] == [
        (1, "ts", "timestamptz", True),
        (2, "name", "string", False),
        (3, "n", "long", False),
        (4, "amount", "decimal(12, 2)", False),
        (5, "legacy", "string", True),
        (6, "region", "string", False),
        (7, "score", "double", False),
    ]
    assert table.properties[RELAXED_PROPERTY] == "6"
    location = table.metadata_location
    assert ensure_table(catalog, ID, v2).metadata_location == location  # the relaxed column is no conflict

    new = [
        {
            "ts": utc(2024, 5, 3),
            "name": "b",
            "n": 2**40,
            "amount": Decimal("1234567890.12"),
            "legacy": "z",
            "region": "eu",
            "score": 0.5,
        }
    ]
    append(table, new, tmp_path / "b1")
    assert rows_of(table) == [dict(r, region=None, score=None) for r in old] + new


@pytest.mark.parametrize(
    ("column", "spec_field", "detail"),
    [
        ("name", NestedField(0, "name", LongType(), required=False), "is string in the table and long in the spec"),
        ("n", NestedField(0, "n", DoubleType(), required=False), "is int in the table and double in the spec"),
        (
            "amount",
            NestedField(0, "amount", DecimalType(12, 3), required=False),
            "is decimal(10, 2) in the table and decimal(12, 3) in the spec",
        ),
        (
            "amount",
            NestedField(0, "amount", DecimalType(9, 2), required=False),
            "is decimal(10, 2) in the table and decimal(9, 2) in the spec",
        ),
        (
            "name",
            NestedField(0, "name", StringType(), required=True),
            "is optional in the table and required in the spec (optional -> required)",
        ),
    ],
)
def test_other_changes_are_refused_and_change_nothing(
    catalog: SqlCatalog, column: str, spec_field: NestedField, detail: str
) -> None:
    table = ensure_table(catalog, ID, V1)
    location = table.metadata_location
    wanted = schema(*(spec_field if f.name == column else f for f in V1.fields))
    with pytest.raises(SchemaConflict) as err:
        ensure_table(catalog, ID, wanted)
    assert str(err.value) == (
        f"table ns.orders: column {column!r} {detail}; nothing was changed. {ALLOWED_CHANGES}: set the field back, or "
        f"start over in a new table under a new pipeline name {SPEC_CHANGE_RUNBOOK}"
    )
    assert catalog.load_table(ID).metadata_location == location


def test_string_to_long_is_refused_with_this_exact_message(catalog: SqlCatalog) -> None:
    ensure_table(catalog, ID, V1)
    wanted = schema(*(NestedField(0, "name", LongType()) if f.name == "name" else f for f in V1.fields))
    with pytest.raises(SchemaConflict) as err:
        ensure_table(catalog, ID, wanted)
    assert str(err.value) == (
        "table ns.orders: column 'name' is string in the table and long in the spec; nothing was changed. "
        "Krishiv evolves a table only by adding optional columns, widening int to long, float to double and "
        "decimal(P,S) to a larger precision with the same scale, and making a required column optional; "
        "it never drops a column: set the field back, or start over in a new table under a new pipeline name "
        "(see docs/operations.md: Recovery runbook > A spec change the table cannot take)"
    )


def test_long_to_int_is_refused(catalog: SqlCatalog) -> None:
    ensure_table(catalog, ID, schema(*V1.fields[:2], NestedField(0, "n", LongType())))
    with pytest.raises(SchemaConflict, match=r"column 'n' is long in the table and int in the spec; nothing"):
        ensure_table(catalog, ID, schema(*V1.fields[:2], NestedField(0, "n", IntegerType())))


def test_a_column_the_spec_drops_is_kept_and_may_be_left_out(catalog: SqlCatalog, tmp_path: Path) -> None:
    table = ensure_table(catalog, ID, V1)
    append(table, [{"ts": utc(2024, 5, 1), "name": "a", "legacy": "kept"}], tmp_path / "b0")
    without = schema(*(f for f in V1.fields if f.name not in ("legacy", "amount")))
    table = ensure_table(catalog, ID, without)
    assert [(f.name, f.required) for f in table.schema().fields] == [
        ("ts", True),
        ("name", False),
        ("n", False),
        ("amount", False),
        ("legacy", False),  # required before; new rows leave it out
    ]
    location = table.metadata_location
    assert ensure_table(catalog, ID, without).metadata_location == location
    append(table, [{"ts": utc(2024, 5, 2), "name": "b"}], tmp_path / "b1")
    assert [(r["name"], r["legacy"]) for r in rows_of(table)] == [("a", "kept"), ("b", None)]


def test_a_required_column_the_spec_makes_optional_becomes_optional(catalog: SqlCatalog) -> None:
    ensure_table(catalog, ID, V1)
    relaxed = schema(*(NestedField(0, "legacy", StringType()) if f.name == "legacy" else f for f in V1.fields))
    assert not ensure_table(catalog, ID, relaxed).schema().find_field("legacy").required


def test_a_concurrent_change_is_reloaded_and_compared_again(
    catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ensure_table's first load returns a table another process has since evolved: its commit fails, it reloads,
    and adds only what is still missing."""
    ensure_table(catalog, ID, V1)
    stale = catalog.load_table(ID)
    v2 = schema(*V1.fields, NestedField(0, "region", StringType(), required=False))
    ensure_table(catalog, ID, v2)  # the other process
    v3 = schema(*v2.fields, NestedField(0, "score", DoubleType(), required=False))
    loads = []
    load_table = catalog.load_table

    def load_stale_first(identifier: tuple[str, str]) -> Table:
        loads.append(identifier)
        return stale if len(loads) == 1 else load_table(identifier)

    monkeypatch.setattr(catalog, "load_table", load_stale_first)
    table = ensure_table(catalog, ID, v3)
    assert len(loads) >= 2  # a stale first load and no retry would have raised CommitFailedException
    assert [(f.field_id, f.name) for f in table.schema().fields][-3:] == [(5, "legacy"), (6, "region"), (7, "score")]
    assert [s.schema_id for s in table.schemas().values()] == [0, 1, 2]


def test_a_creator_that_loses_the_race_evolves_the_winners_table(
    catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensure_table(catalog, ID, V1)  # the winner
    loads = []
    load_table = catalog.load_table

    def missing_first(identifier: tuple[str, str]) -> Table:
        loads.append(identifier)
        if len(loads) == 1:
            raise NoSuchTableError(identifier)
        return load_table(identifier)

    monkeypatch.setattr(catalog, "load_table", missing_first)
    table = ensure_table(catalog, ID, schema(*V1.fields, NestedField(0, "region", StringType())))
    assert len(loads) >= 2 and table.schema().find_field("region").field_id == 6


def test_partitioning_evolves_and_old_files_keep_their_spec(catalog: SqlCatalog, tmp_path: Path) -> None:
    table = ensure_table(catalog, ID, V1)
    unpartitioned = append(
        table,
        [{"ts": utc(2024, 5, 1, 9), "legacy": "a"}, {"ts": utc(2024, 5, 3, 9), "legacy": "b"}],
        tmp_path / "b0",
    )
    table = ensure_table(catalog, ID, V1, partition_by=(PartitionField("ts", "day"),))
    assert (table.spec().spec_id, [(f.field_id, f.name) for f in table.spec().fields]) == (1, [(1000, "ts_day")])
    daily = append(
        table,
        [{"ts": utc(2024, 5, 1, 10), "legacy": "c"}, {"ts": utc(2024, 5, 3, 10), "legacy": "d"}],
        tmp_path / "b1",
    )
    assert len(daily) == 2
    files = {f["file_path"]: f["spec_id"] for f in table.inspect.files().to_pylist()}
    assert files == {unpartitioned[0]: 0, daily[0]: 1, daily[1]: 1}
    assert [r["legacy"] for r in rows_of(table)] == ["a", "c", "b", "d"]
    since = GreaterThanOrEqual("ts", "2024-05-02T00:00:00+00:00")
    planned = {t.file.file_path for t in table.scan(row_filter=since).plan_files()}
    assert planned == {unpartitioned[0], next(p for p in daily if "ts_day=2024-05-03" in p)}
    assert [r["legacy"] for r in rows_of(table, row_filter=since)] == ["b", "d"]

    location = table.metadata_location
    assert ensure_table(catalog, ID, V1, partition_by=(PartitionField("ts", "day"),)).metadata_location == location

    # day -> hour plus identity of name, in one update
    table = ensure_table(
        catalog, ID, V1, partition_by=(PartitionField("ts", "hour"), PartitionField("name", "identity"))
    )
    assert [(f.field_id, f.name, f.transform) for f in table.spec().fields] == [
        (1001, "ts_hour", HourTransform()),
        (1002, "name", IdentityTransform()),
    ]
    # an order-only difference is no change
    location = table.metadata_location
    reordered = (PartitionField("name", "identity"), PartitionField("ts", "hour"))
    assert ensure_table(catalog, ID, V1, partition_by=reordered).metadata_location == location
    # back to unpartitioned: Iceberg reuses the first spec, the others stay, and every row is still read
    table = ensure_table(catalog, ID, V1)
    assert table.spec().spec_id == 0 and sorted(table.specs()) == [0, 1, 2]
    assert [r["legacy"] for r in rows_of(table)] == ["a", "c", "b", "d"]


def test_a_bucket_count_change_names_the_new_field_as_iceberg_does(catalog: SqlCatalog) -> None:
    ensure_table(catalog, ID, V1, partition_by=(PartitionField("name", "bucket", 16),))
    table = ensure_table(catalog, ID, V1, partition_by=(PartitionField("name", "bucket", 8),))
    assert [(f.field_id, f.name, f.transform) for f in table.spec().fields] == [
        (1001, "name_bucket_8", BucketTransform(8))
    ]
    location = table.metadata_location
    assert ensure_table(catalog, ID, V1, partition_by=(PartitionField("name", "bucket", 8),)).metadata_location == (
        location
    )


def test_a_partitioning_pyiceberg_cannot_evolve_to_is_refused(catalog: SqlCatalog) -> None:
    """Another engine named an identity field of ``name`` ``ts_day``: day(ts) cannot get its name beside it."""
    catalog.create_namespace("ns")
    catalog.create_table(
        ID,
        schema=V1,
        partition_spec=PartitionSpec(
            IcebergPartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="ts_day")
        ),
    )
    location = catalog.load_table(ID).metadata_location
    with pytest.raises(SchemaConflict) as err:
        ensure_table(catalog, ID, V1, partition_by=(PartitionField("name", "identity"), PartitionField("ts", "day")))
    assert str(err.value).startswith(
        "table ns.orders is partitioned by [name] and the spec asks for [name, day(ts)], which pyiceberg "
        "cannot evolve the table to ("
    )
    assert str(err.value).endswith(
        "); nothing was changed: set partition_by back, change it with an engine that can (Spark's ALTER TABLE … "
        f"PARTITION FIELD), or start over in a new table under a new pipeline name {SPEC_CHANGE_RUNBOOK}"
    )
    assert catalog.load_table(ID).metadata_location == location


def nested_v1() -> Schema:
    """A table with nested columns: a struct, a list of structs, a map of structs and a list of ints."""
    return Schema(
        NestedField(1, "ts", TimestamptzType(), required=True),
        NestedField(
            2,
            "gps",
            StructType(
                NestedField(10, "lat", DoubleType(), required=True),
                NestedField(11, "n", IntegerType(), required=False),
                NestedField(12, "legacy", StringType(), required=True),
            ),
            required=True,
        ),
        NestedField(
            3,
            "readings",
            ListType(13, StructType(NestedField(14, "value", DecimalType(10, 2), required=True)), True),
            required=False,
        ),
        NestedField(
            4,
            "attrs",
            MapType(15, StringType(), 16, StructType(NestedField(17, "speed", FloatType(), required=False)), False),
            required=False,
        ),
        NestedField(5, "tags", ListType(18, IntegerType(), element_required=True), required=False),
    )


def nested_v2() -> Schema:
    """nested_v1 as a later spec has it (ids numbered afresh): gps.n widened, gps.alt added (required in the spec),
    gps.legacy removed, a note added to each reading and its decimal widened, each attr's speed widened and a unit
    added, the tags widened and their elements made optional."""
    return Schema(
        NestedField(101, "ts", TimestamptzType(), required=True),
        NestedField(
            102,
            "gps",
            StructType(
                NestedField(110, "lat", DoubleType(), required=True),
                NestedField(111, "n", LongType(), required=False),
                NestedField(112, "alt", DoubleType(), required=True),
            ),
            required=True,
        ),
        NestedField(
            103,
            "readings",
            ListType(
                113,
                StructType(
                    NestedField(114, "value", DecimalType(14, 2), required=True),
                    NestedField(119, "note", StringType(), required=False),
                ),
                True,
            ),
            required=False,
        ),
        NestedField(
            104,
            "attrs",
            MapType(
                115,
                StringType(),
                116,
                StructType(
                    NestedField(117, "speed", DoubleType(), required=False),
                    NestedField(120, "unit", StringType(), required=False),
                ),
                False,
            ),
            required=False,
        ),
        NestedField(105, "tags", ListType(118, LongType(), element_required=False), required=False),
    )


def arrow_rows(rows: list[dict[str, Any]], fields: list[tuple[str, pa.DataType]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=pa.schema(fields))


def nested_arrow_v1(rows: list[dict[str, Any]]) -> pa.Table:
    gps = pa.struct([("lat", pa.float64()), ("n", pa.int32()), ("legacy", pa.string())])
    return arrow_rows(
        rows,
        [
            ("ts", pa.timestamp("us", "UTC")),
            ("gps", gps),
            ("readings", pa.list_(pa.struct([("value", pa.decimal128(10, 2))]))),
            ("attrs", pa.map_(pa.string(), pa.struct([("speed", pa.float32())]))),
            ("tags", pa.list_(pa.int32())),
        ],
    )


def nested_arrow_v2(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows as Spark stages them for nested_v2: gps without its removed legacy field."""
    gps = pa.struct([("lat", pa.float64()), ("n", pa.int64()), ("alt", pa.float64())])
    reading = pa.struct([("value", pa.decimal128(14, 2)), ("note", pa.string())])
    return arrow_rows(
        rows,
        [
            ("ts", pa.timestamp("us", "UTC")),
            ("gps", gps),
            ("readings", pa.list_(reading)),
            ("attrs", pa.map_(pa.string(), pa.struct([("speed", pa.float64()), ("unit", pa.string())]))),
            ("tags", pa.list_(pa.int64())),
        ],
    )


def append_arrow(table: Table, rows: pa.Table, folder: Path) -> None:
    files = write_staged_files(table.io, table.schema(), table.spec(), rows, str(folder))
    with table.transaction() as tx, tx.update_snapshot().fast_append() as fast_append:
        for f in files:
            fast_append.append_data_file(data_file(table, f.path))


def paths(schema: Schema) -> list[tuple[str, str, bool]]:
    """Every column and nested part: (dotted path, type if a primitive, required)."""
    return [
        (schema.find_column_name(i) or "", str(f.field_type) if f.field_type.is_primitive else "", f.required)
        for i, f in sorted(schema._lazy_id_to_field.items())
    ]


def test_nested_fields_are_added_widened_made_optional_and_kept_in_one_commit(
    catalog: SqlCatalog, tmp_path: Path
) -> None:
    table = ensure_table(catalog, ID, nested_v1())
    old = [
        {
            "ts": utc(2024, 5, 1),
            "gps": {"lat": 52.1, "n": -(2**31), "legacy": "x"},
            "readings": [{"value": Decimal("-99999999.99")}, {"value": Decimal("0.01")}],
            "attrs": [("a", {"speed": 1.5}), ("b", None), ("c", {"speed": None})],
            "tags": [2**31 - 1, 0],
        },
        {
            "ts": utc(2024, 5, 2),
            "gps": {"lat": -0.0, "n": None, "legacy": ""},
            "readings": [],
            "attrs": [],
            "tags": None,
        },
    ]
    append_arrow(table, nested_arrow_v1(old), tmp_path / "b0")
    before = table.metadata
    table = ensure_table(catalog, ID, nested_v2())

    assert len(table.metadata.metadata_log) == len(before.metadata_log) + 1  # one commit
    assert paths(table.schema()) == [
        ("ts", "timestamptz", True),
        ("gps", "", True),
        ("readings", "", False),
        ("attrs", "", False),
        ("tags", "", False),
        ("gps.lat", "double", True),
        ("gps.n", "long", False),  # widened
        ("gps.legacy", "string", False),  # removed from the spec: kept, optional
        ("readings.element", "", True),
        ("readings.element.value", "decimal(14, 2)", True),  # widened inside a list's element
        ("attrs.key", "string", True),
        ("attrs.value", "", False),
        ("attrs.value.speed", "double", False),  # widened inside a map's value
        ("tags.element", "long", False),  # a list's element widened and made optional
        ("gps.alt", "double", False),  # added, optional although the spec requires it
        ("readings.element.note", "string", False),  # added inside a list's element struct
        ("attrs.value.unit", "string", False),  # added inside a map's value struct
    ]
    relaxed = {table.schema().find_column_name(int(i)) for i in table.properties[RELAXED_PROPERTY].split(",")}
    assert relaxed == {"gps.alt", "gps.legacy", "tags.element"}
    location = table.metadata_location
    assert ensure_table(catalog, ID, nested_v2()).metadata_location == location  # relaxed parts are no conflict

    new = [
        {
            "ts": utc(2024, 5, 3),
            "gps": {"lat": 90.0, "n": 2**40, "alt": 1.25},
            "readings": [{"value": Decimal("999999999999.99"), "note": "ok"}],
            "attrs": [("a", {"speed": 1e300, "unit": "m/s"})],
            "tags": [2**40, None],
        }
    ]
    append_arrow(table, nested_arrow_v2(new), tmp_path / "b1")
    got = [dict(r, attrs=r["attrs"] and sorted(r["attrs"])) for r in rows_of(catalog.load_table(ID))]
    assert got == [
        {
            "ts": utc(2024, 5, 1),
            "gps": {"lat": 52.1, "n": -(2**31), "legacy": "x", "alt": None},
            "readings": [{"value": Decimal("-99999999.99"), "note": None}, {"value": Decimal("0.01"), "note": None}],
            "attrs": [("a", {"speed": 1.5, "unit": None}), ("b", None), ("c", {"speed": None, "unit": None})],
            "tags": [2**31 - 1, 0],
        },
        {
            "ts": utc(2024, 5, 2),
            "gps": {"lat": -0.0, "n": None, "legacy": "", "alt": None},
            "readings": [],
            "attrs": [],
            "tags": None,
        },
        {**new[0], "gps": {**new[0]["gps"], "legacy": None}},
    ]


def _replaced(schema: Schema, path: str, new: NestedField) -> Schema:
    """``schema`` with the top-level column ``path`` replaced by ``new``."""
    return Schema(*(new if f.name == path else f for f in schema.fields))


GPS = nested_v1().find_field("gps")
READINGS = nested_v1().find_field("readings")


@pytest.mark.parametrize(
    ("column", "replacement", "detail"),
    [
        (
            "tags.element",
            NestedField(5, "tags", ListType(18, StringType(), element_required=True), required=False),
            "is int in the table and string in the spec",
        ),
        (
            "tags.element",
            NestedField(5, "tags", ListType(18, IntegerType(), element_required=True), required=False),
            None,  # no change: the control case
        ),
        (
            "attrs.key",
            NestedField(
                4,
                "attrs",
                MapType(15, LongType(), 16, StructType(NestedField(17, "speed", FloatType(), False)), False),
                required=False,
            ),
            "is string in the table and long in the spec (a map's key cannot change)",
        ),
        (
            "attrs.value",
            NestedField(4, "attrs", MapType(15, StringType(), 16, FloatType(), False), required=False),
            "is struct<speed: float?> in the table and float in the spec",
        ),
        (
            "gps",
            NestedField(2, "gps", StringType(), required=True),
            "is struct<lat: double, n: int?, legacy: string> in the table and string in the spec",
        ),
        (
            "gps.n",
            NestedField(
                2,
                "gps",
                StructType(*(NestedField(f.field_id, f.name, f.field_type, True) for f in GPS.field_type.fields)),
                required=True,
            ),
            "is optional in the table and required in the spec (optional -> required)",
        ),
        (
            "readings.element.value",
            NestedField(
                3, "readings", ListType(13, StructType(NestedField(14, "value", DecimalType(12, 3))), True), False
            ),
            "is decimal(10, 2) in the table and decimal(12, 3) in the spec",
        ),
        (
            "readings",
            NestedField(3, "readings", MapType(13, StringType(), 14, DecimalType(10, 2)), required=False),
            "is list<struct<value: decimal(10, 2)>> in the table and map<string, decimal(10, 2)> in the spec",
        ),
    ],
)
def test_nested_changes_iceberg_cannot_make_are_refused_naming_the_path(
    catalog: SqlCatalog, column: str, replacement: NestedField, detail: str | None
) -> None:
    table = ensure_table(catalog, ID, nested_v1())
    location = table.metadata_location
    wanted = _replaced(nested_v1(), replacement.name, replacement)
    if detail is None:
        assert ensure_table(catalog, ID, wanted).metadata_location == location
        return
    with pytest.raises(SchemaConflict) as err:
        ensure_table(catalog, ID, wanted)
    assert str(err.value) == (
        f"table ns.orders: column {column!r} {detail}; nothing was changed. {ALLOWED_CHANGES}: set the field back, or "
        f"start over in a new table under a new pipeline name {SPEC_CHANGE_RUNBOOK}"
    )
    assert catalog.load_table(ID).metadata_location == location
