"""Invariant checks over a pipeline's tables and the ledger; every violation is named, none is fatal here.

Per table of ``pipeline.all_tables``:

- no two rows share the table's row key (:func:`row_key`): a windowed table's ``(window_start, window_end,
  *group_by)``, an upsert table's ``key``, a raw events table's ``(_kafka_partition, _kafka_offset)`` when it
  has both metadata columns (each Kafka offset at most once per incarnation of the topic: a topic deleted and
  re-created reuses its offsets, and the ledger records which topic id each batch read); a rejects table has none.
  An events pipeline's offsets are also checked across its tables (routes and rejects): an event is in one table
  only;
- lineage is linear: each snapshot's parent is the one before it, one snapshot per batch, batch ids rising; a
  snapshot that says it is Krishiv's maintenance carries no batch and adds exactly the rows it deletes;
- ledger and table agree: every COMMITTED entry's snapshot is in the table (or expired, at or below the
  query's high-water mark in the table's properties), a merge batch that only deletes included, and every
  Krishiv snapshot has a COMMITTED entry; for an append table the row counts match too (a merge replaces rows,
  so its counts are not the staged rows'). An append table with no per-row key (an ``events`` table without
  the Kafka metadata columns, a rejects table) has only the ledger to account for its rows: a snapshot of
  another writer that added rows to it is a violation, named.

Krishiv's own maintenance snapshots (a compaction, ``outbox/compaction.py``) are neither a batch nor another
writer: they keep the totals comparable, and a duplicate found in a file a compaction wrote is traced back
through it to the batches that added the rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFileContent, ManifestEntryStatus
from pyiceberg.table import Table

from krishiv.lineage import lineage, maintenance_of
from krishiv_core.arrow_paths import flat_table, top_level
from krishiv_core.entries import MERGE
from krishiv_core.spec import EVENTS, KAFKA_METADATA_PREFIX, UPSERT, WINDOWED, PipelineSpec
from krishiv_core.tables import WINDOW_END, WINDOW_START, OutputTable, group_columns
from outbox.compaction import SUMMARY_MAINTENANCE
from outbox.ledger import Ledger
from outbox.position_deletes import DeletedPositions, delete_files_by_data_file
from outbox.relay import high_water_marks

#: A raw events table's row key, when it has both metadata columns: each Kafka offset at most once.
OFFSET_KEY = (KAFKA_METADATA_PREFIX + "partition", KAFKA_METADATA_PREFIX + "offset")
#: The same coordinates in a rejects table.
REJECT_OFFSET_COLUMNS = ("partition", "offset")
#: At most this many duplicates of a table are named one by one (the rest are counted).
NAMED_DUPLICATES = 50


@dataclass(frozen=True)
class Duplicate:
    """A row key more than one row holds: its values (in key order), how many rows, and in which tables."""

    values: tuple[Any, ...]
    rows: int
    tables: tuple[tuple[str, int], ...] = ()  # (table, rows) when counted across tables


@dataclass
class Verification:
    table: str
    rows: int = 0
    snapshots: int = 0
    key: tuple[str, ...] = ()  # the row key checked for duplicates; empty when there is no per-row check
    violations: list[str] = field(default_factory=list)
    duplicates: list[Duplicate] = field(default_factory=list)
    #: On a pipeline's first table (whose entries carry each batch's counts): the records its batches read and
    #: rejected, from the ledger, and what is said but is no violation (a reject storm: ``krishiv_core.reject_rate``).
    records_read: int | None = None
    rejects: int | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def row_key(pipeline: PipelineSpec, output: OutputTable) -> tuple[str, ...]:
    """The columns no two rows of ``output`` may share; empty when the table has no per-row check."""
    if output.rejects:
        return ()
    if pipeline.kind == WINDOWED:
        return (WINDOW_START, WINDOW_END, *group_columns(pipeline))
    if pipeline.kind == UPSERT:
        return tuple(pipeline.key)
    if pipeline.kind == EVENTS and set(OFFSET_KEY) <= set(pipeline.metadata_columns):
        return OFFSET_KEY
    return ()


def checks_offsets(pipeline: PipelineSpec) -> bool:
    """Whether the pipeline's tables carry the Kafka coordinates of each event (an events pipeline with both)."""
    return pipeline.kind == EVENTS and set(OFFSET_KEY) <= set(pipeline.metadata_columns)


# ------------------------------------------------------------------------------------------ naming rows


def _shown(value: Any) -> str:
    if isinstance(value, datetime):
        return str(value)
    if isinstance(value, str | bytes):
        return repr(value)
    return str(value)


def describe_key(key: Sequence[str], values: Sequence[Any]) -> str:
    """A row key as a person reads it: ``window 2026-… to 2026-…, customer_id='c-1'``, ``key id=4``,
    ``Kafka partition 2 offset 17``."""
    by_column = dict(zip(key, values, strict=True))
    if tuple(key[:2]) == (WINDOW_START, WINDOW_END):
        rest = "".join(f", {c}={_shown(by_column[c])}" for c in key[2:])
        return f"window {_shown(by_column[WINDOW_START])} to {_shown(by_column[WINDOW_END])}{rest}"
    if tuple(key) == OFFSET_KEY:
        return f"Kafka partition {by_column[OFFSET_KEY[0]]} offset {by_column[OFFSET_KEY[1]]}"
    return "key " + ", ".join(f"{c}={_shown(by_column[c])}" for c in key)


def _without_nulls(rows: pa.Table, key: Sequence[str]) -> pa.Table:
    """Rows with a null key column are no row Krishiv wrote under that key; they name nothing."""
    mask = None
    for c in key:
        valid = pc.is_valid(rows.column(c))
        mask = valid if mask is None else pc.and_(mask, valid)
    return rows.filter(mask) if mask is not None else rows


def _key_counts(table: Table, key: Sequence[str], columns: Sequence[str] | None = None) -> pa.Table:
    """Each non-null key of ``table`` with how many rows hold it (``columns``: the key's names in this table; a
    key inside structs by its dotted path, ``device.id``)."""
    columns = tuple(columns or key)
    rows = flat_table(table.scan(selected_fields=columns).to_arrow(), list(columns)).rename_columns(list(key))
    return _without_nulls(rows, key).group_by(list(key)).aggregate([([], "count_all")])


def duplicate_rows(table: Table, key: Sequence[str]) -> list[Duplicate]:
    """The keys more than one row of ``table`` holds, sorted by key."""
    if not key:
        return []
    counts = _key_counts(table, key)
    counts = counts.filter(pc.greater(counts.column("count_all"), 1)).sort_by([(c, "ascending") for c in key])
    columns = [counts.column(c).to_pylist() for c in (*key, "count_all")]
    return [Duplicate(tuple(r[:-1]), r[-1]) for r in zip(*columns, strict=True)]


def repeated_offsets(tables: Mapping[str, Table], rejects: str | None = None) -> list[Duplicate]:
    """Kafka offsets more than one row holds across ``tables`` (a table name -> table), with the rows per table.

    ``rejects`` names the rejects table among them, whose coordinates are its ``partition`` and ``offset``.
    """
    parts = []
    for name, table in tables.items():
        counts = _key_counts(table, OFFSET_KEY, REJECT_OFFSET_COLUMNS if name == rejects else None)
        parts.append(counts.append_column("table", pa.array([name] * counts.num_rows, pa.string())))
    if not parts:
        return []
    every = pa.concat_tables(parts, promote_options="permissive")
    per_offset = every.group_by(list(OFFSET_KEY)).aggregate(
        [("count_all", "sum"), ("table", "list"), ("count_all", "list")]
    )
    per_offset = per_offset.filter(pc.greater(per_offset.column("count_all_sum"), 1))
    out = []
    for row in per_offset.sort_by([(c, "ascending") for c in OFFSET_KEY]).to_pylist():
        where = tuple(sorted(zip(row["table_list"], row["count_all_list"], strict=True)))
        out.append(Duplicate((row[OFFSET_KEY[0]], row[OFFSET_KEY[1]]), row["count_all_sum"], where))
    return out


def beyond_incarnations(duplicates: Sequence[Duplicate], ledger: Ledger, pipeline: PipelineSpec) -> list[Duplicate]:
    """The Kafka offsets of ``duplicates`` held by more rows than the incarnations of the pipeline's topic its
    committed batches read them from (the ledger records each batch's topic id): a topic deleted and re-created
    starts its offsets at 0 again, so each incarnation may put an offset in one row, and only a row beyond that is
    an event twice. An offset no committed batch read stays a duplicate from its second row."""
    if not duplicates:
        return []
    offsets = [(int(d.values[0]), int(d.values[1])) for d in duplicates]
    readers = ledger.incarnations_reading(pipeline.name, pipeline.topic, offsets)
    return [d for d, at in zip(duplicates, offsets, strict=True) if d.rows > max(1, readers.get(at, 0))]


def duplicate_sources(table: Table, key: Sequence[str], duplicates: Sequence[Duplicate]) -> dict[str, list[int]]:
    """For each duplicated key (by :func:`describe_key`), the ids of the snapshots that added a data file
    holding it: which writer put the second row there. A file written by Krishiv's compaction is traced back
    to the snapshots that added the rows it rewrote (while the compaction's parent is not expired; after that
    the compaction is the oldest trace left and is named)."""
    if not duplicates:
        return {}
    wanted = {d.values: describe_key(key, d.values) for d in duplicates}
    sources: dict[str, set[int]] = {label: set() for label in wanted.values()}
    current_deletes = delete_files_by_data_file(table)
    for entry in table.inspect.entries().to_pylist():
        data_file = entry["data_file"]
        if entry["status"] == 2 or data_file["content"] != 0:  # deleted entries and delete files hold no rows
            continue
        for values in _keys_in(table, data_file["file_path"], key, current_deletes) & wanted.keys():
            sources[wanted[values]].update(_adders(table, entry["snapshot_id"], data_file["file_path"], key, values))
    return {label: sorted(ids) for label, ids in sources.items()}


def _keys_in(
    table: Table, path: str, key: Sequence[str], delete_files: Mapping[str, frozenset]
) -> set[tuple[Any, ...]]:
    """The keys of data file ``path``'s rows, less those its position deletes (``delete_files``, by data file, in
    the snapshot looked at) delete: a merge-on-read merge replaced them."""
    with table.io.new_input(path).open() as stream:
        rows = flat_table(pq.read_table(stream, columns=top_level(list(key))), list(key))
    deletes = delete_files.get(path)
    if deletes:
        dead = DeletedPositions(table.io).of(deletes, path).to_numpy()
        keep = np.ones(rows.num_rows, dtype=bool)
        keep[dead[dead < rows.num_rows]] = False
        rows = rows.filter(pa.array(keep))
    return set(zip(*(rows.column(c).to_pylist() for c in key), strict=True))


def _adders(table: Table, snapshot_id: int, path: str, key: Sequence[str], values: tuple[Any, ...]) -> set[int]:
    """The snapshots that added the rows with ``values`` of file ``path``, which ``snapshot_id`` added: itself,
    unless it is Krishiv's compaction, whose rewritten files (in its parent) are followed instead."""
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None or maintenance_of(snapshot) is None or snapshot.parent_snapshot_id is None:
        return {snapshot_id}
    parent = table.metadata.snapshot_by_id(snapshot.parent_snapshot_id)
    if parent is None:  # expired: the compaction is the oldest trace left
        return {snapshot_id}
    removed = {
        e.data_file.file_path
        for m in snapshot.manifests(table.io)
        if m.added_snapshot_id == snapshot_id
        for e in m.fetch_manifest_entry(table.io, discard_deleted=False)
        if e.status == ManifestEntryStatus.DELETED and e.snapshot_id == snapshot_id
    }
    found: set[int] = set()
    parent_deletes = delete_files_by_data_file(table, parent.snapshot_id)
    for m in parent.manifests(table.io):
        for e in m.fetch_manifest_entry(table.io, discard_deleted=True):
            f = e.data_file
            if f.content != DataFileContent.DATA or f.file_path not in removed or e.snapshot_id is None:
                continue
            try:
                holds = values in _keys_in(table, f.file_path, key, parent_deletes)
            except FileNotFoundError:  # removed by hand: say where the trace ends
                found.add(snapshot_id)
                continue
            if holds:
                found |= _adders(table, e.snapshot_id, f.file_path, key, values)
    return found or {snapshot_id}


def _duplicate_violations(table: Table, key: Sequence[str], duplicates: Sequence[Duplicate]) -> list[str]:
    named = duplicates[:NAMED_DUPLICATES]
    sources = duplicate_sources(table, key, named)
    problems = []
    for d in named:
        label = describe_key(key, d.values)
        snapshots = sources.get(label)
        added = f", added by snapshots {snapshots}" if snapshots else ""
        problems.append(f"{label} appears more than once ({d.rows} rows{added})")
    if len(duplicates) > len(named):
        problems.append(f"... and {len(duplicates) - len(named)} more keys appear more than once")
    return problems


def offset_violations(repeats: Sequence[Duplicate], table_name: str) -> list[str]:
    """The offsets of ``repeats`` that ``table_name`` shares with another table, one line each."""
    problems = []
    shared = [r for r in repeats if len(r.tables) > 1 and any(t == table_name for t, _ in r.tables)]
    for r in shared[:NAMED_DUPLICATES]:
        where = ", ".join(f"{t} ({n} {'row' if n == 1 else 'rows'})" for t, n in r.tables)
        problems.append(f"{describe_key(OFFSET_KEY, r.values)} is in more than one table: {where}")
    if len(shared) > NAMED_DUPLICATES:
        problems.append(f"... and {len(shared) - NAMED_DUPLICATES} more offsets in more than one table")
    return problems


# ------------------------------------------------------------------------------------------ lineage and ledger


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
        if row.maintenance is None and SUMMARY_MAINTENANCE in row.summary:
            problems.append(
                f"snapshot {row.snapshot_id} says it is Krishiv's {row.summary[SUMMARY_MAINTENANCE]} but is a "
                f"{row.operation} adding {row.added_records} rows and deleting {row.deleted_records}"
                + (f", with batch {row.batch_id}" if row.batch_id is not None else "")
                + ": maintenance never carries a batch and adds exactly the rows it removes"
            )
    current = table.current_snapshot()
    if rows and current is not None and current.snapshot_id != rows[-1].snapshot_id:
        problems.append(f"current snapshot {current.snapshot_id} is not the newest {rows[-1].snapshot_id}")
    return problems


def table_rows(table: Table) -> int:
    """The rows of the table's current snapshot, from its summary: the data files' records less the rows position
    deletes delete (a merge-on-read merge's, each naming one row)."""
    current = table.current_snapshot()
    if current is None or current.summary is None:
        return 0
    summary = current.summary
    return int(summary.get("total-records") or 0) - int(summary.get("total-position-deletes") or 0)


#: A comparison of a table with the ledger reads one, then the other, while a committer (``krishiv run``, a lingering
#: staging run) may be between its catalog commit and its ledger mark: a disagreement is looked at again, from a
#: fresh table and ledger read, this many times in all, this far apart, and only one that stays is reported.
SETTLE_ATTEMPTS = 3
SETTLE_PAUSE_S = 0.5

Outcome = TypeVar("Outcome")


def settled(evaluate: Callable[[], Outcome], agrees: Callable[[Outcome], bool]) -> Outcome:
    """``evaluate()`` until ``agrees`` says its outcome shows no disagreement, :data:`SETTLE_ATTEMPTS` times at most;
    the last outcome. A real disagreement costs a second more; a commit caught half-way is not reported."""
    outcome = evaluate()
    for _ in range(SETTLE_ATTEMPTS - 1):
        if agrees(outcome):
            break
        time.sleep(SETTLE_PAUSE_S)
        outcome = evaluate()
    return outcome


def check_ledger_agreement(
    table: Table, table_name: str, ledger: Ledger, *, merge: bool = False, rows_by_ledger: bool = False
) -> list[str]:
    """Every COMMITTED batch that published something is in ``table`` (a snapshot, or at or below the query's
    high-water mark): a batch with rows, and a merge that only deletes (its entry has no rows but a committed
    snapshot); and every Krishiv snapshot is COMMITTED in the ledger. For an append table (``merge`` false) each
    snapshot added the rows its batch staged and, without foreign snapshots, the table holds the rows the ledger
    committed (Krishiv's compactions move rows, they add none); a merge replaces the rows of its keys, so its
    counts are not compared.

    ``rows_by_ledger``: an append table with no per-row key (an ``events`` table without the Kafka metadata
    columns, a rejects table), whose rows nothing but the ledger accounts for: another writer's snapshot that
    added rows is named (its rows are not from Krishiv, and could be any event a second time), and the totals are
    compared whoever wrote."""
    problems = []
    rows = lineage(table)
    by_batch = {(r.query_id, r.batch_id): r for r in rows if r.query_id is not None}
    high_water = high_water_marks(table)  # survives expiry and other writers' snapshots
    for r in rows:
        if r.query_id is not None and r.high_water_batch_id is not None:
            high_water[r.query_id] = max(high_water.get(r.query_id, -1), r.high_water_batch_id)
    # Keys and record counts only, read in SQL; batches compacted out of the ledger count through the archive.
    committed = ledger.committed_batches(table_name)
    for (query_id, batch_id), record_count in committed.records.items():
        if record_count == 0 and (query_id, batch_id) not in committed.published:
            continue  # an empty batch makes no snapshot (a delete-only merge does: it is published)
        row = by_batch.get((query_id, batch_id))
        if row is None:
            if high_water.get(query_id, -1) < batch_id:
                problems.append(
                    f"ledger says batch {batch_id} of query {query_id} is COMMITTED but {table_name} "
                    "has no snapshot for it"
                )
        elif not merge and row.added_records != record_count:
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
    foreign = [r for r in rows if r.writer == "other"]
    if not merge and rows_by_ledger:
        for r in foreign:
            if r.added_records:
                problems.append(
                    f"snapshot {r.snapshot_id} ({r.operation} by another writer, not a Krishiv batch) added "
                    f"{r.added_records} rows to {table_name}, which has no per-row key to tell them from Krishiv's"
                )
    if not merge and (rows_by_ledger or not foreign):
        total = table_rows(table)
        if total != committed.total_records:
            problems.append(f"{table_name} holds {total} rows but the ledger committed {committed.total_records}")
    return problems


def verify_table(
    table: Table,
    table_name: str,
    ledger: Ledger,
    *,
    key: Sequence[str] = (),
    merge: bool = False,
    pipeline: PipelineSpec | None = None,
) -> Verification:
    """Duplicates by ``key`` (none checked if empty; by Kafka offset, per incarnation of ``pipeline``'s topic when
    given), lineage, and agreement with the ledger (``merge``: the table is committed by merges, whose row counts
    are not the staged rows')."""
    result = Verification(table_name, rows=table_rows(table), snapshots=len(table.snapshots()), key=tuple(key))
    if key:
        result.duplicates = duplicate_rows(table, key)
        if tuple(key) == OFFSET_KEY and pipeline is not None:
            result.duplicates = beyond_incarnations(result.duplicates, ledger, pipeline)
        result.violations += _duplicate_violations(table, key, result.duplicates)
    result.violations += check_lineage(table)
    reads = iter([table])  # the table as given, then fresh from its catalog

    def agreement() -> list[str]:
        current = next(reads, None) or table.refresh()
        return check_ledger_agreement(current, table_name, ledger, merge=merge, rows_by_ledger=not key)

    result.violations += settled(agreement, lambda problems: not problems)
    return result


def verify_output(table: Table, table_name: str, ledger: Ledger, pipeline: PipelineSpec, output: OutputTable):
    """:func:`verify_table` with the row key and commit operation of one of the pipeline's tables."""
    merge = output.operation.kind == MERGE
    return verify_table(table, table_name, ledger, key=row_key(pipeline, output), merge=merge, pipeline=pipeline)
