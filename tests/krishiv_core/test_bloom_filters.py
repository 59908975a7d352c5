"""The Bloom filters' probe against DuckDB's own reading of the same filters (the canary of the hand-written part),
and the writer's options on what Krishiv writes."""

from __future__ import annotations

import random
import string
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO

from krishiv_core.bloom_filters import KeyHashes, key_hashes, may_hold, read_filters, writer_options

ROWS = 30_000


def _columns(rng: random.Random) -> pa.Table:
    longs = [rng.getrandbits(62) for _ in range(ROWS)]
    return pa.table(
        {
            "l": pa.array(longs, pa.int64()),
            "i": pa.array([v % 2**31 for v in longs], pa.int32()),
            "s": pa.array(["".join(rng.choices(string.ascii_letters + "é✓", k=rng.randint(0, 30))) for _ in longs]),
            "ls": pa.array([str(v) for v in longs], pa.large_string()),  # pyiceberg's string columns
            "d": pa.array([v % 2_900_000 for v in longs], pa.int32()).cast(pa.date32()),
            "ts": pa.array([v % 2**50 for v in longs], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        }
    )


def test_canary_the_probe_answers_as_duckdb_reads_the_filters_pyarrow_writes(tmp_path: Path) -> None:
    """pyarrow writes the filters, DuckDB reads them with its own implementation of Parquet's split-block filter:
    for values held (never "absent") and values not held, per row group, the two agree on every value."""
    rng = random.Random(7)
    rows = _columns(rng)
    path = tmp_path / "keys.parquet"
    pq.write_table(
        rows, path, bloom_filter_options=writer_options(rows.schema, rows.column_names, ROWS), row_group_size=ROWS // 3
    )
    filters = read_filters(PyArrowFileIO(), str(path), rows.column_names)
    assert filters is not None and len(filters.row_groups) == 3
    others = _columns(random.Random(8))
    con = duckdb.connect()
    for name in rows.column_names:
        probe = pa.concat_arrays([rows.column(name).combine_chunks()[:150], others.column(name).combine_chunks()[:150]])
        physical, bits = filters.row_groups[0][name]
        ours = may_hold(bits, key_hashes(probe, physical)).tolist()
        assert all(ours[:100]), f"{name}: a value of the first row group is absent from its filter"
        theirs = [
            not con.execute(
                "SELECT bloom_filter_excludes FROM parquet_bloom_probe(?, ?, ?) WHERE row_group_id = 0",
                [str(path), name, value],
            ).fetchone()[0]
            for value in probe.to_pylist()
        ]
        assert ours == theirs, name
        assert sum(ours[150:]) < 15, f"{name}: far more false positives than the filter was sized for"


def test_keys_of_another_physical_type_than_the_files_are_not_hashed() -> None:
    assert key_hashes(pa.array([1, 2], pa.int64()), "INT32") is None
    assert key_hashes(pa.array(["a"]), "INT64") is None
    assert KeyHashes(pa.table({"k": pa.array([1], pa.int32())})).of("k", "INT32") is not None
    with pytest.raises(ValueError):
        key_hashes(pa.array([1, None], pa.int64()), "INT64")


def test_only_key_columns_of_hashable_types_get_a_filter() -> None:
    schema = pa.schema([("id", pa.int64()), ("amount", pa.decimal128(10, 2)), ("name", pa.string())])
    assert writer_options(schema, ["id", "amount", "gone"], 10) == {"id": {"ndv": 10, "fpp": 0.0001}}
    assert writer_options(schema, ["amount"], 10) is None
