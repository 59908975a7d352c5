"""The merge skips table files whose Bloom filters hold none of a batch's keys, and the table stays the rule's.

Files are written as Krishiv writes them: staged by phase 1's writer (``write_staged_files``, registered in place
by the merge) and rewritten by compaction, each with a Bloom filter on the table's key columns. The oracle is a
dict of the latest row per key (docs/spec.md's upsert rule without versions: the batch's row replaces the key's
row). Keys are random 60-bit numbers and short strings, so column statistics prune nothing and only the filters
can.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import DoubleType, IntegerType, LongType, NestedField, StringType

from krishiv_core.bloom_filters import read_filters
from krishiv_core.catalog import TABLE_PROPERTIES
from krishiv_core.entries import MERGE, CommitOperation, OutboxEntry, new_snapshot_id
from krishiv_core.parquet_files import write_staged_files
from outbox.compaction import compact_table
from outbox.merge import merge_commit, plan_merge
from outbox.relay import high_water_property, snapshot_summary

IDENTIFIER = ("krishiv", "keyed")
KEY = CommitOperation(MERGE, key=("id", "region"))
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=True),
    NestedField(3, "value", DoubleType(), required=False),
    identifier_field_ids=[1, 2],
)


@pytest.fixture
def table(tmp_path: Path) -> Table:
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=warehouse.as_uri())
    catalog.create_namespace(IDENTIFIER[0])
    return catalog.create_table(IDENTIFIER, SCHEMA, properties=dict(TABLE_PROPERTIES))


class Batches:
    def __init__(self, table: Table, folder: Path) -> None:
        self.table, self.folder, self.batch_id = table, folder, 0

    def entry(self, rows: list[dict[str, Any]], operation: CommitOperation = KEY) -> OutboxEntry:
        batch_id, self.batch_id = self.batch_id, self.batch_id + 1
        self.table.refresh()
        schema = self.table.schema()
        files = write_staged_files(
            self.table.io,
            schema,
            self.table.spec(),
            pa.Table.from_pylist(rows),
            (self.folder / f"batch={batch_id}").as_uri(),
        )
        return OutboxEntry(
            "q",
            "p",
            ".".join(IDENTIFIER),
            batch_id,
            {"t": {"0": [batch_id, batch_id + 1]}},
            files,
            new_snapshot_id(),
            operation=operation,
        )

    def merge(self, rows: list[dict[str, Any]], operation: CommitOperation = KEY) -> int:
        """Merge a batch; the table files its plan skipped by their filters."""
        entry = self.entry(rows, operation)
        skipped = plan_merge(self.table, entry).skipped_files
        merge_commit(self.table, entry, snapshot_summary(entry), {high_water_property("q"): str(entry.batch_id)})
        return skipped


def _rows(rng: random.Random, keys: list[tuple[int, str]]) -> list[dict[str, Any]]:
    return [{"id": k, "region": r, "value": rng.random()} for k, r in keys]


def _key(rng: random.Random) -> tuple[int, str]:
    return rng.getrandbits(60), rng.choice(["eu", "us", "ap"]) + str(rng.randint(0, 9))


def _files_without(table: Table, keys: set[tuple[int, str]]) -> int:
    """The table's data files none of whose rows (deleted ones too: a file's filter holds every row) has one of
    ``keys``, read from the files themselves."""
    if table.current_snapshot() is None:
        return 0
    count = 0
    for path in table.inspect.data_files().column("file_path").to_pylist():
        with table.io.new_input(path).open() as stream:
            held = pq.read_table(stream, columns=["id", "region"]).to_pylist()
        count += not any((r["id"], r["region"]) in keys for r in held)
    return count


def _table_rows(table: Table) -> dict[tuple[int, str], float]:
    table.refresh()
    return {(r["id"], r["region"]): r["value"] for r in table.scan().to_arrow().to_pylist()}


def test_files_without_a_batchs_keys_are_skipped_and_the_table_is_the_latest_row_per_key(table, tmp_path) -> None:
    rng = random.Random(37)
    batches = Batches(table, tmp_path / "_krishiv_staging")
    oracle: dict[tuple[int, str], float] = {}
    per_batch: list[list[tuple[int, str]]] = []
    skips = could = 0
    for b in range(12):
        new = [_key(rng) for _ in range(40)]
        # every third batch also updates keys of one earlier batch
        old = rng.sample(per_batch[rng.randrange(len(per_batch))], 5) if b % 3 == 2 else []
        rows = _rows(rng, new + old)
        without = _files_without(table, set(new + old))
        skipped = batches.merge(rows)
        per_batch.append(new)
        oracle.update({(r["id"], r["region"]): r["value"] for r in rows})
        assert _table_rows(table) == oracle, f"after batch {b}"
        assert skipped <= without, f"batch {b}: a file holding one of its keys was skipped"
        skips, could = skips + skipped, could + without
    # A filter may say "maybe" of a key it does not hold (1% of keys, by design): nearly every file is skipped.
    assert could > 40 and skips >= 0.9 * could, (skips, could)

    # Compaction's output has filters too: a batch of new keys skips it, an update finds its rows in it.
    report = compact_table(table, target_file_size=64 * 1024 * 1024, min_files=2)
    assert report.snapshot_id is not None
    table.refresh()
    files = table.inspect.data_files().column("file_path").to_pylist()
    filters = [read_filters(table.io, path, ["id", "region"]) for path in files]
    assert all(f is not None and set(f.row_groups[0]) == {"id", "region"} for f in filters), "both key columns"
    assert batches.merge(_rows(rng, [_key(rng) for _ in range(30)])) == len(files), "1 file, 30 new keys"
    updated = _rows(rng, rng.sample(sorted(oracle), 20))
    assert batches.merge(updated) < len(table.inspect.data_files())
    oracle.update({(r["id"], r["region"]): r["value"] for r in updated})
    table.refresh()
    now = _table_rows(table)
    assert len(now) == len(oracle) + 30 and {k: now[k] for k in oracle} == oracle


def test_a_key_column_widened_since_a_file_was_written_reads_that_file(table, tmp_path) -> None:
    """A file written while ``id`` was an int holds INT32 values whose hashes are not those of the same numbers as
    longs: the merge reads it rather than trust its filter."""
    warehouse = tmp_path / "w2"
    warehouse.mkdir()
    catalog = SqlCatalog("t2", uri=f"sqlite:///{tmp_path}/cat2.db", warehouse=warehouse.as_uri())
    catalog.create_namespace("krishiv")
    narrow = Schema(
        NestedField(1, "id", IntegerType(), required=True),
        NestedField(2, "value", DoubleType(), required=False),
        identifier_field_ids=[1],
    )
    t = catalog.create_table(("krishiv", "widened"), narrow, properties=dict(TABLE_PROPERTIES))
    batches = Batches(t, tmp_path / "_krishiv_staging_2")
    by_id = CommitOperation(MERGE, key=("id",))
    batches.merge([{"id": i, "value": 1.0} for i in range(10)], by_id)
    with t.update_schema() as update:
        update.update_column("id", LongType())
    skipped = batches.merge([{"id": 3, "value": 2.0}], by_id)
    assert skipped == 0
    t.refresh()
    got = {r["id"]: r["value"] for r in t.scan().to_arrow().to_pylist()}
    assert got == {**{i: 1.0 for i in range(10)}, 3: 2.0}
