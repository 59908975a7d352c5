"""Staged files written inside the Spark tasks: each row to its target's table and partition, names back only."""

from __future__ import annotations

import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from krishiv_core.catalog import ensure_table
from krishiv_core.entries import DATA, DELETE_KEYS
from krishiv_core.partitioning import PartitionField
from spark_jobs.task_writer import WriteTarget, write_in_tasks

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=False),
    identifier_field_ids=[1],
)


def _catalog(tmp_path):
    return SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=(tmp_path / "warehouse").as_uri())


def test_rows_go_to_their_target_and_partition_and_only_file_names_come_back(tmp_path, spark):
    catalog = _catalog(tmp_path)
    by_region = ensure_table(catalog, ("ns", "by_region"), SCHEMA, partition_by=(PartitionField("region", "identity"),))
    other = ensure_table(catalog, ("ns", "other"), SCHEMA)
    rows = spark.createDataFrame(
        [(i, ["eu", "us", None][i % 3], "a" if i % 4 else "b") for i in range(1_000)],
        "id long, region string, __target string",
    ).repartition(3)
    targets = [
        WriteTarget.of("a", by_region, f"{tmp_path}/staged/a"),
        WriteTarget.of("b", other, f"{tmp_path}/staged/b"),
    ]
    files = write_in_tasks(rows, targets, "__target")

    assert sum(f.records for f in files["a"]) == 750 and sum(f.records for f in files["b"]) == 250
    assert all(f.content == DATA and f.bytes > 0 for found in files.values() for f in found)
    # Each task writes one file per partition value it holds: three regions (null included) over three tasks.
    for f in files["a"]:
        table = pq.read_table(f.path.removeprefix("file://"))
        assert table.column_names == ["id", "region"]  # the target column is not written
        assert len(set(table.column("region").to_pylist())) == 1
    assert {pq.read_table(f.path.removeprefix("file://")).column("region")[0].as_py() for f in files["a"]} == {
        "eu",
        "us",
        None,
    }
    ids = sorted(
        i for f in files["a"] + files["b"] for i in pq.read_table(f.path.removeprefix("file://"))["id"].to_pylist()
    )
    assert ids == list(range(1_000))


def test_delete_keys_are_written_with_the_key_columns_only(tmp_path, spark):
    table = ensure_table(_catalog(tmp_path), ("ns", "keys"), SCHEMA)
    rows = spark.createDataFrame([(i, "eu", "k") for i in range(10)], "id long, region string, __target string")
    target = WriteTarget.of("k", table, f"{tmp_path}/staged", content=DELETE_KEYS, schema=table.schema().select("id"))
    (written,) = write_in_tasks(rows.coalesce(1), [target], "__target")["k"]
    assert written.content == DELETE_KEYS and written.records == 10
    assert pq.read_table(written.path.removeprefix("file://")).column_names == ["id"]
