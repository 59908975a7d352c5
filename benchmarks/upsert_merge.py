"""The relay's merge cost per upsert batch against the table's size: ``python -m benchmarks.upsert_merge``.

A table of N rows (``id``, its key, ``version``, ``payload``; the even ids 0..2N-2 in files of
:data:`FILE_ROWS` rows each, as compacted upsert tables hold them, written as Krishiv writes data files: with a
Bloom filter on the key) takes batches of ``batch_keys`` keys through the relay's own merge
(:func:`outbox.merge.merge_commit`), each key's row a newer version. Keys are drawn **uniformly** over the table
(every file holds some: the worst case for any file pruning), **clustered** (one run of consecutive ids: the
recent keys a CDC stream mostly updates), or are **new** (odd ids between the table's, as inserts keyed by hashes
or UUIDs land: statistics rule out no file, the Bloom filters nearly all). For each table size and key layout the
median batch's seconds, the bytes of table files rewritten, the delete rows written and the files skipped by their
filters are reported; the figure the issue asks for is the ratio of the 10M-row table's median to the 1M-row
table's, keys uniform.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

FILE_ROWS = 250_000
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("version", pa.int64()),
        pa.field("payload", pa.string()),
    ]
)
LAYOUTS = ("uniform", "clustered", "new")


@dataclass(frozen=True)
class MergeCost:
    table_rows: int
    layout: str  # "uniform" or "clustered"
    batch_keys: int
    batches: int
    median_s: float
    seconds: list[float]
    table_bytes_rewritten: int  # by the median batch
    delete_rows_written: int  # by the median batch
    files_skipped: int  # table files the median batch's plan skipped by their Bloom filters


def _rows(ids: np.ndarray, version: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "version": pa.array(np.full(len(ids), version), pa.int64()),
            "payload": pa.array([f"payload-{i:012d}-{version}" for i in ids.tolist()], pa.string()),
        },
        schema=SCHEMA,
    )


def _table(folder: Path, rows: int):
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    from krishiv_core.catalog import TABLE_PROPERTIES
    from krishiv_core.entries import new_snapshot_id
    from krishiv_core.parquet_files import write_staged_files
    from outbox.data_files import data_file
    from outbox.snapshot_producer import fast_append

    catalog = SqlCatalog("bench", uri=f"sqlite:///{folder}/catalog.db", warehouse=f"file://{folder}/warehouse")
    catalog.create_namespace("bench")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "version", LongType(), required=False),
        NestedField(3, "payload", StringType(), required=False),
        identifier_field_ids=[1],
    )
    table = catalog.create_table("bench.upserts", schema=schema, properties=dict(TABLE_PROPERTIES))
    data = f"file://{folder}/warehouse/bench/upserts/data"
    for start in range(0, rows, FILE_ROWS):
        files = write_staged_files(
            table.io, table.schema(), table.spec(), _rows(np.arange(start, min(rows, start + FILE_ROWS)) * 2, 0), data
        )
        table = fast_append(table, [data_file(table, f.path) for f in files], new_snapshot_id(), {})
    return catalog.load_table("bench.upserts")


def _entry(folder: Path, table, batch_id: int, ids: np.ndarray):
    """A batch staged as phase 1 stages it: one Parquet file with the table's field ids."""
    from krishiv_core.entries import MERGE, CommitOperation, OutboxEntry, new_snapshot_id
    from krishiv_core.parquet_files import write_staged_files

    (staged,) = write_staged_files(
        table.io, table.schema(), table.spec(), _rows(np.sort(ids), batch_id + 1), f"file://{folder}/staged-{batch_id}"
    )
    return OutboxEntry(
        "bench-merge",
        "upserts",
        table.name()[-1],
        batch_id,
        {},
        (staged,),
        new_snapshot_id(),
        operation=CommitOperation(MERGE, key=("id",), version="version"),
    )


def measure(table_rows: int, layout: str, batch_keys: int, batches: int, seed: int = 7) -> MergeCost:
    from outbox.merge import merge_commit, plan_merge

    rng = np.random.default_rng(seed)
    seconds, rewritten, deletes, skipped = [], [], [], []
    added = 0
    odd = rng.choice(table_rows, size=batches * batch_keys, replace=False) * 2 + 1 if layout == "new" else None
    with tempfile.TemporaryDirectory(prefix="krishiv-merge-bench-") as tmp:
        folder = Path(tmp)
        table = _table(folder, table_rows)
        for batch_id in range(batches):
            if layout == "uniform":
                ids = rng.choice(table_rows, size=batch_keys, replace=False) * 2
            elif layout == "new":  # odd: between the table's keys, so no file's [min, max] rules them out
                ids = odd[batch_id * batch_keys : (batch_id + 1) * batch_keys]
                added += len(ids)
            else:
                start = int(rng.integers(0, table_rows - batch_keys))
                ids = np.arange(start, start + batch_keys) * 2
            entry = _entry(folder, table, batch_id, ids)
            skipped.append(plan_merge(table, entry).skipped_files)  # a plan of its own: nothing is committed
            started = time.perf_counter()
            table, _ = merge_commit(table, entry, {"krishiv.batch-id": str(batch_id)}, {})
            seconds.append(time.perf_counter() - started)
            summary = table.current_snapshot().summary
            rewritten.append(int(summary.get("removed-files-size") or 0))
            deletes.append(int(summary.get("added-position-deletes") or 0))
        rows = table.scan(selected_fields=("id",)).to_arrow().num_rows
        if rows != table_rows + added:
            raise RuntimeError(f"the table holds {rows} rows after the merges, not {table_rows + added}")
    middle = sorted(range(batches), key=lambda i: seconds[i])[batches // 2]
    return MergeCost(
        table_rows,
        layout,
        batch_keys,
        batches,
        round(statistics.median(seconds), 3),
        [round(s, 3) for s in seconds],
        rewritten[middle],
        deletes[middle],
        skipped[middle],
    )


def merge_costs(sizes: tuple[int, ...], batch_keys: int, batches: int) -> dict:
    costs = [measure(n, layout, batch_keys, batches) for n in sizes for layout in LAYOUTS]
    by = {(c.table_rows, c.layout): c.median_s for c in costs}
    small, large = min(sizes), max(sizes)
    return {
        "costs": [asdict(c) for c in costs],
        "growth": {
            layout: round(by[(large, layout)] / by[(small, layout)], 2) if by[(small, layout)] else None
            for layout in LAYOUTS
        },
        "sizes": [small, large],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,10000000", help="table sizes in rows (default 1M and 10M)")
    parser.add_argument("--batch-keys", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    doc = merge_costs(sizes, args.batch_keys, args.batches)
    for c in doc["costs"]:
        print(
            f"{c['table_rows']:>11,} rows, keys {c['layout']:<9}: {c['median_s']:.3f} s per {c['batch_keys']:,}-key "
            f"batch (runs {c['seconds']}), {c['table_bytes_rewritten']:,} table bytes rewritten, "
            f"{c['delete_rows_written']:,} position deletes, {c['files_skipped']} files skipped by Bloom filters"
        )
    print(f"growth {doc['sizes'][1]:,} vs {doc['sizes'][0]:,} rows: {doc['growth']}")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
