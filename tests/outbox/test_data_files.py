"""Staged files registered with the partition values their rows hold, for every transform, on real SQL catalogs:
create a partitioned table, stage rows, register the files in a fast append, then scan and read the manifests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import (
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    IsNull,
    LessThan,
    StartsWith,
)
from pyiceberg.partitioning import partition_record_value
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    BooleanType,
    DecimalType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

from krishiv_core.catalog import ensure_table
from krishiv_core.errors import SchemaConflict
from krishiv_core.parquet_files import write_staged_files
from krishiv_core.partitioning import parse_partition_by
from krishiv_core.runbook import runbook
from outbox.data_files import data_file
from outbox.errors import StagedFileMissing

SCHEMA = Schema(
    NestedField(1, "ts", TimestamptzType(), required=True),
    NestedField(2, "customer_id", StringType(), required=False),
    NestedField(3, "name", StringType(), required=False),
    NestedField(4, "n", LongType(), required=False),
    NestedField(5, "i", IntegerType(), required=False),
    NestedField(6, "amount", DecimalType(10, 2), required=False),
    NestedField(7, "flag", BooleanType(), required=False),
)
COLUMNS = {
    "ts": "timestamp_ms",
    "customer_id": "string",
    "name": "string",
    "n": "long",
    "i": "int",
    "amount": "decimal(10,2)",
    "flag": "boolean",
}


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


_KEYS = ("ts", "customer_id", "name", "n", "i", "amount", "flag")
ROWS = [
    dict(zip(_KEYS, values, strict=True))
    for values in [
        (utc(2023, 12, 31, 23, 30), "c1", "abcd-1", 1, 1, Decimal("0.50"), True),
        (utc(2024, 5, 1, 10), "c2", "abcd-2", 5, 2, Decimal("1.99"), False),
        (utc(2024, 5, 1, 10, 30), "c1", "wxyz-1", 12, 2, Decimal("2.00"), None),
        (utc(2024, 5, 1, 11), None, "ab", 19, 3, Decimal("-0.01"), True),
        (utc(2024, 5, 2), "c3", None, 20, None, Decimal("3.10"), True),
        (utc(2024, 6, 15, 12), "c4", "abcdef", 25, 1, None, False),
        (utc(1969, 12, 31, 23), "c1", "wx", -3, 2, Decimal("2.50"), None),
        (utc(2024, 5, 1, 10, 15), "c2", "wxyz-9", 100, 3, Decimal("1.00"), True),
    ]
]


def arrow_rows(rows: list[dict[str, Any]]) -> pa.Table:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return pa.Table.from_pylist(rows, schema=schema_to_pyarrow(SCHEMA, include_field_ids=False))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlCatalog]:
    uri = f"sqlite:///{tmp_path}/catalog.db" if request.param == "sqlite" else request.getfixturevalue("postgres_uri")
    catalog = SqlCatalog("krishiv", uri=uri, warehouse=f"file://{tmp_path}/warehouse")
    yield catalog
    catalog.engine.dispose()


def append(table: Table, files: list[Any]) -> None:
    """A plain pyiceberg fast append of the registered files."""
    with table.transaction() as tx, tx.update_snapshot().fast_append() as fast_append:
        for f in files:
            fast_append.append_data_file(f)


def manifest_entries(table: Table) -> dict[str, tuple[tuple[Any, ...], int]]:
    """Each data file of the current snapshot: its partition record and spec id, as the manifests hold them."""
    out = {}
    for manifest in table.current_snapshot().manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io):
            record = entry.data_file.partition
            out[entry.data_file.file_path] = (tuple(record[i] for i in range(len(record))), entry.data_file.spec_id)
    return out


def by_key(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["ts"], r["n"]))


def stage(table: Table, rows: list[dict[str, Any]], folder: Path) -> list[str]:
    return [f.path for f in write_staged_files(table.io, table.schema(), table.spec(), arrow_rows(rows), str(folder))]


#: (partition_by entry, a filter on its source column, the same filter in Python). Each filter lines up with
#: partition boundaries, so exactly the files holding a matching row may be planned.
CASES: list[tuple[str, BooleanExpression, Callable[[dict[str, Any]], bool]]] = [
    ("customer_id", EqualTo("customer_id", "c1"), lambda r: r["customer_id"] == "c1"),
    ("i", EqualTo("i", 2), lambda r: r["i"] == 2),
    ("flag", EqualTo("flag", True), lambda r: r["flag"] is True),
    (
        "day(ts)",
        GreaterThanOrEqual("ts", "2024-05-02T00:00:00+00:00"),
        lambda r: r["ts"] >= utc(2024, 5, 2),
    ),
    (
        "hour(ts)",
        GreaterThanOrEqual("ts", "2024-05-01T11:00:00+00:00"),
        lambda r: r["ts"] >= utc(2024, 5, 1, 11),
    ),
    ("month(ts)", LessThan("ts", "2024-05-01T00:00:00+00:00"), lambda r: r["ts"] < utc(2024, 5, 1)),
    ("year(ts)", LessThan("ts", "2024-01-01T00:00:00+00:00"), lambda r: r["ts"] < utc(2024, 1, 1)),
    ("bucket(16, customer_id)", EqualTo("customer_id", "c1"), lambda r: r["customer_id"] == "c1"),
    ("bucket(4, n)", EqualTo("n", 12), lambda r: r["n"] == 12),
    ("bucket(8, ts)", EqualTo("ts", "2024-05-01T10:30:00+00:00"), lambda r: r["ts"] == utc(2024, 5, 1, 10, 30)),
    ("bucket(4, amount)", EqualTo("amount", Decimal("2.00")), lambda r: r["amount"] == Decimal("2.00")),
    ("truncate(4, name)", StartsWith("name", "abcd"), lambda r: (r["name"] or "").startswith("abcd")),
    ("truncate(10, n)", GreaterThanOrEqual("n", 20), lambda r: r["n"] >= 20),
    (
        "truncate(100, amount)",
        GreaterThanOrEqual("amount", Decimal("2.00")),
        lambda r: r["amount"] is not None and r["amount"] >= Decimal("2.00"),
    ),
]


@pytest.mark.parametrize(("entry", "row_filter", "matches"), CASES, ids=[c[0] for c in CASES])
def test_each_transform_end_to_end(
    catalog: SqlCatalog,
    tmp_path: Path,
    entry: str,
    row_filter: BooleanExpression,
    matches: Callable[[dict[str, Any]], bool],
) -> None:
    partition_by = parse_partition_by([entry], "partition_by", COLUMNS)
    table = ensure_table(catalog, ("ns", "orders"), SCHEMA, partition_by=partition_by)
    paths = stage(table, ROWS, tmp_path / "staging")
    append(table, [data_file(table, p) for p in paths])

    assert by_key(table.scan().to_arrow().to_pylist()) == by_key(ROWS)

    # Each file's partition record is what Iceberg's transform gives every one of its rows.
    (field,) = table.spec().fields
    apply = field.transform.transform(table.schema().find_field(field.source_id).field_type)
    source = table.schema().find_column_name(field.source_id)
    registered = manifest_entries(table)
    assert set(registered) == set(paths)
    distinct = set()
    for path, (record, spec_id) in registered.items():
        values = {
            apply(partition_record_value(field, v, SCHEMA)) for v in pq.read_table(path).column(source).to_pylist()
        }
        assert values == {record[0]}, path
        assert spec_id == table.spec().spec_id
        distinct.add(record[0])
    assert distinct == {apply(partition_record_value(field, r[source], SCHEMA)) for r in ROWS}
    assert len(paths) == len(distinct) > 1
    files = table.inspect.files().to_pylist()
    assert sorted(f["file_path"] for f in files) == sorted(paths)
    assert len({str(f["partition"][field.name]) for f in files}) == len(distinct)

    # A partition filter plans exactly the files holding a matching row, and the scan returns those rows.
    planned = {task.file.file_path for task in table.scan(row_filter=row_filter).plan_files()}
    holding = {p for p in paths if any(matches(r) for r in pq.read_table(p).to_pylist())}
    assert planned == holding
    assert 0 < len(planned) < len(paths)
    assert by_key(table.scan(row_filter=row_filter).to_arrow().to_pylist()) == by_key([r for r in ROWS if matches(r)])


def test_a_file_whose_partition_column_is_all_null(catalog: SqlCatalog, tmp_path: Path) -> None:
    partition_by = parse_partition_by(["bucket(16, customer_id)", "truncate(4, name)"], "partition_by", COLUMNS)
    table = ensure_table(catalog, ("ns", "orders"), SCHEMA, partition_by=partition_by)
    nulls = [dict(r, customer_id=None, name=None) for r in ROWS[:3]]
    (path,) = stage(table, nulls, tmp_path / "staging")
    assert "/customer_id_bucket=null/name_trunc=null/" in path
    others = stage(table, ROWS[5:7], tmp_path / "staging")
    append(table, [data_file(table, p) for p in [path, *others]])

    registered = manifest_entries(table)
    assert registered[path] == ((None, None), 0)
    assert all(None not in record for p, (record, _) in registered.items() if p != path)
    assert {t.file.file_path for t in table.scan(row_filter=IsNull("customer_id")).plan_files()} == {path}
    assert path not in {t.file.file_path for t in table.scan(row_filter=EqualTo("customer_id", "c3")).plan_files()}
    assert by_key(table.scan(row_filter=IsNull("customer_id")).to_arrow().to_pylist()) == by_key(nulls)


def test_partitions_are_right_where_statistics_are_not_collected(catalog: SqlCatalog, tmp_path: Path) -> None:
    """With metrics mode ``counts`` Parquet statistics give no bounds: pyiceberg's inference would register
    every file under a null partition; the rows still say which day each file holds."""
    table = ensure_table(
        catalog, ("ns", "orders"), SCHEMA, partition_by=parse_partition_by(["day(ts)"], "partition_by", COLUMNS)
    )
    with table.transaction() as tx:
        tx.set_properties({"write.metadata.metrics.default": "counts"})
    paths = stage(table, ROWS, tmp_path / "staging")
    append(table, [data_file(table, p) for p in paths])
    days = {p: (pq.read_table(p).column("ts")[0].as_py() - utc(1970, 1, 1)).days for p in paths}
    assert {p: record for p, (record, _) in manifest_entries(table).items()} == {p: (d,) for p, d in days.items()}
    planned = {
        t.file.file_path
        for t in table.scan(row_filter=GreaterThanOrEqual("ts", "2024-05-02T00:00:00+00:00")).plan_files()
    }
    assert planned == {p for p, d in days.items() if d >= (utc(2024, 5, 2) - utc(1970, 1, 1)).days}


def test_a_missing_staged_file_stops_the_relay(catalog: SqlCatalog, tmp_path: Path) -> None:
    table = ensure_table(catalog, ("ns", "orders"), SCHEMA)
    path = f"file://{tmp_path}/staging/part-gone.parquet"
    with pytest.raises(StagedFileMissing) as err:
        data_file(table, path)
    assert str(err.value) == (
        f"staged file {path} of a pending entry is missing; refusing to commit a partial batch: `krishiv restage` "
        "stages the batch again (see docs/operations.md: Recovery runbook > A staged file that is gone)"
    )


def test_files_staged_before_the_partitioning_changed(catalog: SqlCatalog, tmp_path: Path) -> None:
    """A pending file staged for the old spec is registered under the table's current spec when its rows fit
    one partition of it, and refused (not mis-registered) when they span several."""
    table = ensure_table(catalog, ("ns", "orders"), SCHEMA)
    one_day = stage(table, [ROWS[1], ROWS[2], ROWS[7]], tmp_path / "staging")  # all on 2024-05-01
    two_days = stage(table, [ROWS[1], ROWS[4]], tmp_path / "staging")
    table = ensure_table(
        catalog, ("ns", "orders"), SCHEMA, partition_by=parse_partition_by(["day(ts)"], "partition_by", COLUMNS)
    )
    registered = data_file(table, one_day[0])
    assert (registered.partition[0], registered.spec_id) == ((utc(2024, 5, 1) - utc(1970, 1, 1)).days, 1)
    with pytest.raises(SchemaConflict) as err:
        data_file(table, two_days[0])
    assert str(err.value) == (
        f"staged file {two_days[0]} holds rows of 2 partitions (ts_day=2024-05-01, ts_day=2024-05-02) under table "
        "ns.orders's partitioning [day(ts)]: it was staged for another partitioning, and a data file must hold one "
        "partition; set partition_by back until the relay has committed the batch, then change it "
        + runbook("A spec change the table cannot take")
    )
    append(table, [registered])
    assert by_key(table.scan().to_arrow().to_pylist()) == by_key([ROWS[1], ROWS[2], ROWS[7]])


def test_a_file_staged_before_the_schema_evolved(catalog: SqlCatalog, tmp_path: Path) -> None:
    """A pending file written for the old schema (int, decimal(10,2), no region) is registered after the table
    widened its columns, gained a column and a partition field on it, and reads back with the new types."""
    old = Schema(
        NestedField(1, "ts", TimestamptzType(), required=True),
        NestedField(2, "i", IntegerType(), required=False),
        NestedField(3, "amount", DecimalType(10, 2), required=False),
    )
    new = Schema(
        NestedField(1, "ts", TimestamptzType(), required=True),
        NestedField(2, "i", LongType(), required=False),
        NestedField(3, "amount", DecimalType(12, 2), required=False),
        NestedField(4, "region", StringType(), required=False),
    )
    bucket = parse_partition_by(["bucket(4, i)"], "partition_by", {"i": "int"})
    table = ensure_table(catalog, ("ns", "orders"), old, partition_by=bucket)
    rows = [{"ts": utc(2024, 5, 1), "i": 3, "amount": Decimal("1.50")}]
    files = write_staged_files(table.io, table.schema(), table.spec(), pa.Table.from_pylist(rows), str(tmp_path))
    partition_by = parse_partition_by(["bucket(4, i)", "region"], "partition_by", {"i": "long", "region": "string"})
    table = ensure_table(catalog, ("ns", "orders"), new, partition_by=partition_by)
    registered = data_file(table, files[0].path)
    bucket_of_3 = table.spec().fields[0].transform.transform(LongType())(3)
    assert (tuple(registered.partition[i] for i in range(2)), registered.spec_id) == ((bucket_of_3, None), 1)
    append(table, [registered])
    assert table.scan().to_arrow().to_pylist() == [dict(rows[0], region=None)]
    assert table.scan().to_arrow().schema.field("i").type == pa.int64()
