"""Invariant checks over a pipeline's tables and the ledger; every violation is named, none is fatal here.

- no window appears twice in the aggregate table;
- lineage is linear: each snapshot's parent is the one before it, one snapshot per batch, batch ids rising;
- ledger and table agree: every COMMITTED entry's snapshot is in the table (or expired, at or below the
  query's high-water mark in the table's properties), every Krishiv snapshot has a COMMITTED entry, and row
  counts match.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.table import Table

from krishiv.lineage import lineage
from krishiv_core.tables import WINDOW_START
from outbox.ledger import Ledger
from outbox.relay import high_water_marks


@dataclass
class Verification:
    table: str
    rows: int = 0
    snapshots: int = 0
    violations: list[str] = field(default_factory=list)
    duplicate_windows: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def duplicate_windows(table: Table) -> list[str]:
    starts = table.scan(selected_fields=(WINDOW_START,)).to_arrow().column(WINDOW_START)
    counts = pc.value_counts(starts)
    return [str(c["values"]) for c in counts.to_pylist() if c["counts"] > 1]


def duplicate_window_sources(table: Table, windows: list[str]) -> dict[str, list[int]]:
    """For each duplicated window, the ids of the snapshots that added a data file holding it."""
    if not windows:
        return {}
    wanted = set(windows)
    sources: dict[str, list[int]] = {w: [] for w in windows}
    entries = table.inspect.entries().to_pylist()
    for entry in entries:
        data_file = entry["data_file"]
        if entry["status"] == 2 or data_file["content"] != 0:  # deleted entries and delete files hold no rows
            continue
        with table.io.new_input(data_file["file_path"]).open() as stream:
            starts = pq.read_table(stream, columns=[WINDOW_START]).column(WINDOW_START)
        for value in {str(v) for v in starts.to_pylist()} & wanted:
            sources[value].append(entry["snapshot_id"])
    return {w: sorted(set(ids)) for w, ids in sources.items()}


def check_lineage(table: Table) -> list[str]:
    problems = []
    rows = lineage(table)
    previous = None
    seen_batches: dict[tuple[str, int], int] = {}
    last_batch: dict[str, int] = {}
    for row in rows:
        if previous is not None and row.parent_id != previous.snapshot_id:
            problems.append(f"snapshot {row.snapshot_id} has parent {row.parent_id}, expected {previous.snapshot_id}")
        if previous is None and row.parent_id is not None and table.metadata.snapshot_by_id(row.parent_id):
            problems.append(f"first snapshot {row.snapshot_id} has a parent {row.parent_id}")
        if row.query_id is not None and row.batch_id is not None:
            key = (row.query_id, row.batch_id)
            if key in seen_batches:
                problems.append(
                    f"batch {row.batch_id} of query {row.query_id} is in snapshots "
                    f"{seen_batches[key]} and {row.snapshot_id}"
                )
            seen_batches[key] = row.snapshot_id
            if row.batch_id <= last_batch.get(row.query_id, -1):
                problems.append(
                    f"snapshot {row.snapshot_id} has batch {row.batch_id} after batch "
                    f"{last_batch[row.query_id]} of query {row.query_id}"
                )
            last_batch[row.query_id] = max(row.batch_id, last_batch.get(row.query_id, -1))
        previous = row
    current = table.current_snapshot()
    if rows and current is not None and current.snapshot_id != rows[-1].snapshot_id:
        problems.append(f"current snapshot {current.snapshot_id} is not the newest {rows[-1].snapshot_id}")
    return problems


def check_ledger_agreement(table: Table, table_name: str, ledger: Ledger) -> list[str]:
    problems = []
    rows = lineage(table)
    by_batch = {(r.query_id, r.batch_id): r for r in rows if r.query_id is not None}
    high_water = high_water_marks(table)  # survives expiry and other writers' snapshots
    for r in rows:
        if r.query_id is not None and r.high_water_batch_id is not None:
            high_water[r.query_id] = max(high_water.get(r.query_id, -1), r.high_water_batch_id)
    # Keys and record counts only, read in SQL; batches compacted out of the ledger count through the archive.
    committed = ledger.committed_batches(table_name)
    committed_records = committed.total_records
    for (query_id, batch_id), record_count in committed.records.items():
        if record_count == 0:
            continue
        row = by_batch.get((query_id, batch_id))
        if row is None:
            if high_water.get(query_id, -1) < batch_id:
                problems.append(
                    f"ledger says batch {batch_id} of query {query_id} is COMMITTED but {table_name} "
                    "has no snapshot for it"
                )
        elif row.added_records != record_count:
            problems.append(
                f"batch {batch_id}: snapshot {row.snapshot_id} added {row.added_records} rows, "
                f"the ledger staged {record_count}"
            )
    for (query_id, batch_id), row in by_batch.items():
        if not committed.includes(query_id, batch_id):
            problems.append(
                f"snapshot {row.snapshot_id} holds batch {batch_id} of query {query_id}, which the "
                "ledger does not list as COMMITTED"
            )
    foreign = [r for r in rows if r.query_id is None]
    if not foreign:
        current = table.current_snapshot()
        total = int(current.summary.get("total-records", 0)) if current and current.summary else 0
        if total != committed_records:
            problems.append(f"{table_name} holds {total} rows but the ledger committed {committed_records}")
    return problems


def verify_table(table: Table, table_name: str, ledger: Ledger, *, windows: bool) -> Verification:
    result = Verification(table_name, snapshots=len(table.snapshots()))
    current = table.current_snapshot()
    result.rows = int(current.summary.get("total-records", 0)) if current and current.summary else 0
    if windows:
        result.duplicate_windows = duplicate_windows(table)
        result.violations += [f"window starting {w} appears more than once" for w in result.duplicate_windows]
    result.violations += check_lineage(table)
    result.violations += check_ledger_agreement(table, table_name, ledger)
    return result
