"""Canary: pyiceberg 0.12 reads a null list of structs back as an empty list (apache/iceberg-python#3833).

Krishiv's staged file holds the null (Parquet's reader, DuckDB and Spark see it), and docs/formats.md tells
pyiceberg readers so; the nested chaos checks (``chaos/nested_checks.as_pyiceberg_reads``) expect what pyiceberg
shows. When this test fails, pyiceberg reads the null: drop that allowance and this note.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import ListType, LongType, NestedField, StringType, StructType

from krishiv_core.parquet_files import write_staged_files
from outbox.data_files import data_file


def test_a_null_list_of_structs_is_null_in_the_file_and_empty_in_pyicebergs_reading(tmp_path: Path) -> None:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    catalog.create_namespace("ns")
    item = StructType(NestedField(4, "sku", StringType(), required=True))
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "items", ListType(3, item, element_required=True), required=False),
        NestedField(5, "tags", ListType(6, StringType(), element_required=True), required=False),
    )
    table = catalog.create_table(("ns", "t"), schema=schema)
    rows = pa.Table.from_pylist(
        [{"id": 1, "items": None, "tags": None}, {"id": 2, "items": [{"sku": "a"}], "tags": ["x"]}],
        schema=pa.schema(
            [
                ("id", pa.int64()),
                ("items", pa.list_(pa.struct([("sku", pa.string())]))),
                ("tags", pa.list_(pa.string())),
            ]
        ),
    )
    (staged,) = write_staged_files(table.io, table.schema(), table.spec(), rows, str(tmp_path))
    assert pq.read_table(staged.path).column("items").to_pylist() == [None, [{"sku": "a"}]]
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        append.append_data_file(data_file(table, staged.path))
    read = sorted(catalog.load_table(("ns", "t")).scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [r["items"] for r in read] == [[], [{"sku": "a"}]], "pyiceberg reads the null now: see the docstring"
    assert [r["tags"] for r in read] == [None, ["x"]]  # a list of scalars keeps its null
