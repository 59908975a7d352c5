"""The relay's merge cost per upsert batch against the table's size: ``python -m benchmarks.upsert_merge``.

A table of N rows (``id``, ``version``, ``payload``; ids 0..N-1 in files of :data:`FILE_ROWS` rows each, as
compacted upsert tables hold them) takes batches of ``batch_keys`` keys through the relay's own merge
(:func:`outbox.merge.merge_commit`), each key's row a newer version. Keys are drawn **uniformly** over the table
(every file holds some: the worst case for any file pruning) or **clustered** (one run of consecutive ids: the
recent keys a CDC stream mostly updates). For each table size and key layout the median batch's seconds, the bytes
of table files rewritten and the delete rows written are reported; the figure the issue asks for is the ratio of the
10M-row table's median to the 1M-row table's.
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
import pyarrow.parquet as pq

FILE_ROWS = 250_000
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("version", pa.int64()),
        pa.field("payload", pa.string()),
    ]
)


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

    from krishiv_core.catalog import TABLE_PROPERTIES

    catalog = SqlCatalog("bench", uri=f"sqlite:///{folder}/catalog.db", warehouse=f"file://{folder}/warehouse")
    catalog.create_namespace("bench")
    table = catalog.create_table("bench.upserts", schema=SCHEMA, properties=dict(TABLE_PROPERTIES))
    for start in range(0, rows, FILE_ROWS):
        table.append(_rows(np.arange(start, min(rows, start + FILE_ROWS)), 0))
    return catalog.load_table("bench.upserts")


def _entry(folder: Path, table, batch_id: int, ids: np.ndarray):
    """A batch staged as phase 1 stages it: one Parquet file with the table's field ids."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from krishiv_core.entries import MERGE, CommitOperation, OutboxEntry, StagedFile, new_snapshot_id

    path = folder / f"staged-{batch_id}.parquet"
    rows = _rows(np.sort(ids), batch_id + 1)
    pq.write_table(rows.cast(schema_to_pyarrow(table.schema())), path)
    staged = StagedFile(f"file://{path}", rows.num_rows, path.stat().st_size)
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
    from outbox.merge import merge_commit

    rng = np.random.default_rng(seed)
    seconds, rewritten, deletes = [], [], []
    with tempfile.TemporaryDirectory(prefix="krishiv-merge-bench-") as tmp:
        folder = Path(tmp)
        table = _table(folder, table_rows)
        for batch_id in range(batches):
            if layout == "uniform":
                ids = rng.choice(table_rows, size=batch_keys, replace=False)
            else:
                start = int(rng.integers(0, table_rows - batch_keys))
                ids = np.arange(start, start + batch_keys)
            entry = _entry(folder, table, batch_id, ids)
            started = time.perf_counter()
            table, _ = merge_commit(table, entry, {"krishiv.batch-id": str(batch_id)}, {})
            seconds.append(time.perf_counter() - started)
            summary = table.current_snapshot().summary
            rewritten.append(int(summary.get("removed-files-size") or 0))
            deletes.append(int(summary.get("added-position-deletes") or 0))
        rows = table.scan(selected_fields=("id",)).to_arrow().num_rows
        if rows != table_rows:
            raise RuntimeError(f"the table holds {rows} rows after merging updates of existing keys, not {table_rows}")
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
    )


def merge_costs(sizes: tuple[int, ...], batch_keys: int, batches: int) -> dict:
    costs = [measure(n, layout, batch_keys, batches) for n in sizes for layout in ("uniform", "clustered")]
    by = {(c.table_rows, c.layout): c.median_s for c in costs}
    small, large = min(sizes), max(sizes)
    return {
        "costs": [asdict(c) for c in costs],
        "growth": {
            layout: round(by[(large, layout)] / by[(small, layout)], 2) if by[(small, layout)] else None
            for layout in ("uniform", "clustered")
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
            f"{c['delete_rows_written']:,} position deletes"
        )
    print(f"growth {doc['sizes'][1]:,} vs {doc['sizes'][0]:,} rows: {doc['growth']}")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
