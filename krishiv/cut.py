"""A consistent cut of a pipeline's tables: each table's snapshot as of one batch, for readers that time-travel.

A reader joining a pipeline's tables (its routes, its rejects) wants them all as of the same batch. On a SQL
catalog every batch is committed to all its tables at once (PROTOCOL invariant 19), so the current snapshots are
one cut already; on any catalog, and for an older batch, :func:`cut_at` names, per table, the snapshot a reader
time-travels to (``snapshot_id`` in Spark, DuckDB, pyiceberg ...) so that every table holds exactly the batches up
to the cut:

* the cut is a batch id of the pipeline's current query; by default the newest one committed to every table (the
  batch before its first pending one);
* a table's snapshot is the query's snapshot of the greatest batch at or below the cut that gave it rows (a batch
  with no rows for a table made no snapshot there);
* a table that had no rows from the query up to the cut has no snapshot in it (``None``: read it as of before the
  query's first snapshot, or empty); one whose snapshot was expired since is said to be (``expired``), and cannot
  be read at that cut any more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyiceberg.table import Table

from outbox.ledger import Ledger
from outbox.relay import SUMMARY_BATCH_ID, SUMMARY_QUERY_ID


@dataclass(frozen=True)
class TableCut:
    table: str
    snapshot_id: int | None  # the snapshot to read the table at; None if it had no rows of the query up to the cut
    batch_id: int | None  # the batch that snapshot committed
    expired: bool = False  # the table had rows up to the cut, but their snapshot has been expired since


@dataclass(frozen=True)
class Cut:
    pipeline: str
    query_id: str | None  # None: the pipeline has committed nothing yet
    batch_id: int | None
    tables: list[TableCut]


def default_cut(ledger: Ledger, pipeline: str, first_table: str) -> tuple[str, int] | None:
    """The pipeline's current query and the newest batch of it committed to every table, None if none is. Every
    batch has an entry for the pipeline's first table (it carries the batch's counts)."""
    queries = ledger.query_ids(pipeline)
    if not queries:
        return None
    query = queries[-1]
    pending = [b.batch_id for b in ledger.pending_batches(pipeline=pipeline) if b.query_id == query]
    last = min(pending) - 1 if pending else ledger.last_batch_id(query, first_table)
    return (query, last) if last >= 0 else None


def cut_at(tables: Mapping[str, Table], ledger: Ledger, query_id: str, batch_id: int) -> list[TableCut]:
    """Each table's snapshot holding exactly the query's batches up to ``batch_id``."""
    cuts = []
    for name, table in tables.items():
        best: tuple[int, int] | None = None  # (batch id, snapshot id)
        for snapshot in table.snapshots():
            summary = snapshot.summary
            if summary is None or summary.get(SUMMARY_QUERY_ID) != query_id:
                continue
            batch = int(summary.get(SUMMARY_BATCH_ID) or -1)
            if batch <= batch_id and (best is None or batch > best[0]):
                best = (batch, snapshot.snapshot_id)
        held = ledger.last_committed_batch(query_id, name, at_most=batch_id)
        if best is not None and (held is None or best[0] >= held):
            cuts.append(TableCut(name, best[1], best[0]))
        else:
            cuts.append(TableCut(name, None, held, expired=held is not None))
    return cuts


def consistent_cut(ledger: Ledger, pipeline: str, first_table: str, tables: Mapping[str, Table]) -> dict[str, object]:
    """The default cut of the pipeline's ``tables``, as Dagster's materializations carry it."""
    current = default_cut(ledger, pipeline, first_table)
    if current is None:
        return {"query_id": None, "batch_id": None, "snapshots": {}}
    cuts = cut_at(tables, ledger, *current)
    return {"query_id": current[0], "batch_id": current[1], "snapshots": {t.table: t.snapshot_id for t in cuts}}
