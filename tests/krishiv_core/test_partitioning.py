"""``partition_by`` entries: parsed into fields, refused with one message naming the entry, turned into Iceberg."""

from __future__ import annotations

import pytest
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, DayTransform, IdentityTransform, TruncateTransform
from pyiceberg.types import DecimalType, LongType, NestedField, StringType, TimestamptzType

from krishiv_core.errors import ConfigError
from krishiv_core.partitioning import PartitionField, describe_spec, parse_partition_by, partition_spec

COLUMNS = {
    "ts": "timestamp_ms",
    "at": "timestamp",
    "customer_id": "string",
    "n": "long",
    "i": "int",
    "amount": "decimal(10,2)",
    "d": "decimal",
    "price": "double",
    "flag": "boolean",
}
WHERE = "pipelines[0].partition_by"


def parse(*entries: object) -> tuple[PartitionField, ...]:
    return parse_partition_by(list(entries), WHERE, COLUMNS)


def test_every_transform_parses_and_prints_back_in_the_spec_syntax() -> None:
    entries = [
        "customer_id",
        "day(ts)",
        "hour(at)",
        "bucket(16, customer_id)",
        "truncate(4, n)",
        "truncate(100, amount)",
        "bucket(8, d)",
        "flag",
        "identity(i)",
    ]
    assert parse(*entries) == (
        PartitionField("customer_id", "identity"),
        PartitionField("ts", "day"),
        PartitionField("at", "hour"),
        PartitionField("customer_id", "bucket", 16),
        PartitionField("n", "truncate", 4),
        PartitionField("amount", "truncate", 100),
        PartitionField("d", "bucket", 8),
        PartitionField("flag", "identity"),
        PartitionField("i", "identity"),
    )
    assert [str(f) for f in parse("year(ts)", "month(at)")] == ["year(ts)", "month(at)"]


def test_hour_and_year_of_one_column_are_refused_as_iceberg_does() -> None:
    with pytest.raises(ConfigError) as err:
        parse("hour(at)", "year(at)")
    assert str(err.value) == (
        f"{WHERE}[1]: 'year(at)' and {WHERE}[0] (hour(at)) both partition 'at' by time; "
        "Iceberg allows one of year, month, day and hour per column"
    )


@pytest.mark.parametrize(
    ("entry", "text"),
    [
        ("customer_id", "customer_id"),
        ("  day( ts )", "day(ts)"),
        ("BUCKET(16,customer_id)", "bucket(16, customer_id)"),
        ("truncate( 4 , n )", "truncate(4, n)"),
        ("identity(flag)", "flag"),
    ],
)
def test_spacing_and_case_are_normalised(entry: str, text: str) -> None:
    (field,) = parse(entry)
    assert str(field) == text
    assert parse(str(field)) == (field,)


def test_no_partition_by_is_unpartitioned() -> None:
    assert parse_partition_by([], WHERE, COLUMNS) == ()
    assert parse_partition_by(None, WHERE, COLUMNS) == ()


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (["nope"], f"{WHERE}[0]: unknown column 'nope' in 'nope'; the table's columns are {', '.join(COLUMNS)}"),
        (
            ["day(nope)"],
            f"{WHERE}[0]: unknown column 'nope' in 'day(nope)'; the table's columns are {', '.join(COLUMNS)}",
        ),
        (
            ["week(ts)"],
            f"{WHERE}[0]: unknown transform 'week' in 'week(ts)'; "
            "expected one of identity, year, month, day, hour, bucket, truncate",
        ),
        (
            ["day(customer_id)"],
            f"{WHERE}[0]: 'day(customer_id)': column 'customer_id' is string, and day applies only to "
            "timestamp_ms or timestamp columns",
        ),
        (
            ["hour(n)"],
            f"{WHERE}[0]: 'hour(n)': column 'n' is long, and hour applies only to timestamp_ms or timestamp columns",
        ),
        (
            ["bucket(4, price)"],
            f"{WHERE}[0]: 'bucket(4, price)': column 'price' is double, and bucket applies only to "
            "string or long or int or decimal or timestamp_ms or timestamp columns",
        ),
        (
            ["bucket(4, flag)"],
            f"{WHERE}[0]: 'bucket(4, flag)': column 'flag' is boolean, and bucket applies only to "
            "string or long or int or decimal or timestamp_ms or timestamp columns",
        ),
        (
            ["truncate(4, ts)"],
            f"{WHERE}[0]: 'truncate(4, ts)': column 'ts' is timestamp_ms, and truncate applies only to "
            "string or long or int or decimal columns",
        ),
        (
            ["price"],
            f"{WHERE}[0]: 'price': column 'price' is double, and identity applies only to "
            "string or long or int or decimal or boolean or timestamp_ms or timestamp columns",
        ),
        (
            ["truncate(0, customer_id)"],
            f"{WHERE}[0]: the width of truncate must be a positive integer, got 'truncate(0, customer_id)'",
        ),
        (
            ["truncate(-3, customer_id)"],
            f"{WHERE}[0]: the width of truncate must be a positive integer, got 'truncate(-3, customer_id)'",
        ),
        (
            ["bucket(x, customer_id)"],
            f"{WHERE}[0]: the number of buckets of bucket must be a positive integer, got 'bucket(x, customer_id)'",
        ),
        (
            ["bucket(customer_id)"],
            f"{WHERE}[0]: bucket needs a number of buckets: bucket(N, column), got 'bucket(customer_id)'",
        ),
        (["day(4, ts)"], f"{WHERE}[0]: day takes only a column: day(column), got 'day(4, ts)'"),
        (
            ["ts", "day(ts)", "day( ts )"],
            f"{WHERE}[2]: 'day( ts )' repeats {WHERE}[1] (day(ts)): one day per column",
        ),
        (
            ["bucket(16, n)", "bucket(8, n)"],
            f"{WHERE}[1]: 'bucket(8, n)' repeats {WHERE}[0] (bucket(16, n)): one bucket per column",
        ),
        (
            ["day(ts"],
            f'{WHERE}[0]: expected a column or transform(column), such as "customer_id", "day(ts)", '
            '"bucket(16, customer_id)" or "truncate(4, name)"; got \'day(ts\'',
        ),
        (
            [7],
            f'{WHERE}[0]: expected a string such as "customer_id", "day(ts)", "bucket(16, customer_id)" '
            'or "truncate(4, name)", got 7',
        ),
        (["day(a-b)"], f"{WHERE}[0]: expected a column name in 'day(a-b)', got 'a-b'"),
    ],
)
def test_a_wrong_entry_is_one_config_error_naming_it(entries: list[object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_partition_by(entries, WHERE, COLUMNS)
    assert str(err.value) == message
    assert err.value.field == message.split(":", 1)[0]


def test_a_list_is_required() -> None:
    with pytest.raises(ConfigError) as err:
        parse_partition_by("day(ts)", WHERE, COLUMNS)
    assert str(err.value).startswith(f"{WHERE}: expected a list of strings such as [")


def test_a_partition_name_that_is_also_a_column_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        parse_partition_by(["day(ts)"], WHERE, {"ts": "timestamp", "ts_day": "string"})
    assert str(err.value) == (
        f"{WHERE}[0]: 'day(ts)' would be named 'ts_day', which is also an output column; rename that column"
    )


def test_partition_spec_uses_icebergs_default_names_and_ids_from_1000() -> None:
    schema = Schema(
        NestedField(1, "ts", TimestamptzType(), required=True),
        NestedField(2, "customer_id", StringType(), required=False),
        NestedField(3, "name", StringType(), required=False),
        NestedField(4, "n", LongType(), required=False),
        NestedField(5, "amount", DecimalType(10, 2), required=False),
    )
    fields = parse_partition_by(
        ["day(ts)", "bucket(16, customer_id)", "truncate(4, name)", "n"],
        WHERE,
        {"ts": "timestamp_ms", "customer_id": "string", "name": "string", "n": "long", "amount": "decimal(10,2)"},
    )
    spec = partition_spec(schema, fields)
    assert [(f.field_id, f.source_id, f.name, f.transform) for f in spec.fields] == [
        (1000, 1, "ts_day", DayTransform()),
        (1001, 2, "customer_id_bucket", BucketTransform(16)),
        (1002, 3, "name_trunc", TruncateTransform(4)),
        (1003, 4, "n", IdentityTransform()),
    ]
    assert describe_spec(spec, schema) == "[day(ts), bucket(16, customer_id), truncate(4, name), n]"
    assert partition_spec(schema, ()).is_unpartitioned()
    assert describe_spec(partition_spec(schema, ()), schema) == "unpartitioned"
