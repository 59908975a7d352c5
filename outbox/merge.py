"""The MERGE commit operation: upsert an entry's rows into a table on its key columns, in one snapshot.

For ``CommitOperation(MERGE, key=K, version=V)`` the table after the commit is ``MERGE INTO`` 's result:

* every table row whose key is among the entry's keys (its data rows', its delete-key and its versioned
  delete-key files') is removed, and the entry's data rows are added;
* with a version column, a key whose table row has a higher ``V`` than the entry's row or versioned delete keeps
  its table row, and the entry's row for it is dropped. A null version is lower than every version and ties
  with a null: the table's row survives iff its ``V`` is not null and (the entry's is null or lower). A key of
  a delete-key file (a tombstone) deletes whatever the versions; its data row, if the entry has one, is added.

This is phase 2 of the upsert rule (docs/spec.md) (PROTOCOL.md invariant 13); phase 1 (``spark_jobs.upserts``) stages
at most one data row and one versioned delete per key, and drops what its remembered deletes ignore.

How (by a key anti-join rather than pyiceberg's ``delete(filter)``):

1. Read the key (and version) columns of the entry's staged files; refuse null or repeated keys. A key or version
   inside structs (``device.id``, docs/spec.md "Paths in keys") is taken out of its struct column
   (``pc.struct_field``) into a flat column named by its path, on both sides of every join.
2. Plan the table's files with a coarse filter on the keys (``In`` per key column up to pyiceberg's
   200-value limit of its metrics evaluators, else the column's ``[min, max]``), read their key columns with each
   row's position, less the rows their delete files already delete, and join them with the entry's keys: which
   keys lose to a higher version, which keys the commit deletes, and which table rows hold those.
3. Merge-on-read (the default; ``write.merge.mode``, ``outbox/position_deletes.py``): write one position delete
   file per partition naming those rows; no table file is read whole or rewritten, so a batch costs about the key
   columns of the files it may touch plus its own size. Copy-on-write: read those files whole, drop the deleted
   keys' rows (an anti-join on the key columns, in file order), and write the rest of each as new data files with
   pyiceberg's writer (file by file: files holding no merged key are never read whole nor rewritten).
   A staged data file holding a row that lost is copied beside itself without it; otherwise it is
   registered in place.
4. Commit ONE snapshot with the entry's intended snapshot id, ``summary``, and ``properties`` set in the same
   metadata commit: merge-on-read, an overwrite that adds the staged files and the delete files
   (:func:`outbox.snapshot_producer.row_delta`); copy-on-write, an overwrite (table files out, their rewrites and
   the staged files in); a fast append when no table row changes (new keys only; also an empty append when the
   entry changes nothing).

Why not ``Transaction.delete(filter)`` then an append: that makes one to three snapshots per batch (a delete
for files dropped whole, an overwrite for files rewritten, the append); its filter for composite keys, an
``Or`` of ``And(EqualTo...)``, is evaluated term by term (1.7 s for 1,000 keys on a 10,000-row table, 8 s for
3,000, against tens of milliseconds for this join); and the version rule needs the table's rows read first
anyway. One snapshot keeps the relay's rule: one snapshot per batch, found by its intended id.

Memory: the key (and version) columns of one table file at a time, the matched rows, and (copy-on-write) one
rewritten file at a time. Copy-on-write rewrites every file holding a merged key, so keys spread at random over
a table rewrite all of it each batch; merge-on-read writes only the deletes, and compaction folds them later.

A table file the plan reads may be gone: a compaction replaced it after the relay loaded the table, and orphan
removal then deleted it (or, with the head unchanged, someone removed it by hand). The first is a conflict like
any other writer's (``CommitFailedException``: the relay reloads and re-plans); the second refuses the merge
(:class:`TableFileMissing`), since rows of the table are lost and no merge can give the right result.

The relay owns commit retries (``commit.retry.num-retries=0``): a retry by pyiceberg would commit a plan
made against an older head, so a table with retries on is refused. ``CommitFailedException`` passes through
unchanged after the files written for this attempt are removed (the commit certainly did not land); any
other error leaves them, since its outcome is unknown.
"""

from __future__ import annotations

import logging
import posixpath
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    GreaterThanOrEqual,
    In,
    LessThanOrEqual,
)
from pyiceberg.expressions.visitors import bind
from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.table import FileScanTask, Table, TableProperties
from pyiceberg.utils.properties import property_as_int

from krishiv_core.arrow_paths import column_at, top_level
from krishiv_core.bloom_filters import FILTERS, KeyHashes, read_filters, writer_options
from krishiv_core.entries import MERGE, OutboxEntry, StagedFile
from krishiv_core.file_cache import FileCache
from krishiv_core.parquet_files import key_columns
from krishiv_core.runbook import runbook
from outbox.data_files import data_file
from outbox.errors import (
    MergeKeyDuplicate,
    MergeKeyNull,
    MergeRefused,
    MergeRetriesEnabled,
    StagedFileMissing,
)
from outbox.position_deletes import DeletedPositions, merge_on_read, write_position_deletes
from outbox.snapshot_producer import fast_append, overwrite, row_delta, write_data_files

log = logging.getLogger(__name__)

#: pyiceberg's metrics evaluators treat an ``In`` with more values than this as "might match" (no pruning).
IN_PREDICATE_LIMIT = 200
#: Table files' key columns kept by the process (:class:`FileKeys`, :mod:`krishiv_core.file_cache`): about 24 bytes
#: a row with a version column, so a 10M-row table's fit.
FILE_KEYS_BYTES = 512 * 1024 * 1024
_FILE_KEYS: FileCache[FileKeys] = FileCache(FILE_KEYS_BYTES, lambda keys: keys.nbytes)
#: Files the plan asks the Bloom filters of before it stops, when none of them ruled the batch's keys out.
PROBES_WITHOUT_A_SKIP = 8
#: The entry's version of a key, beside the table's version column in a join.
_ENTRY_VERSION = "__krishiv_entry_version"
_ROW = "__krishiv_row"
_FILE = "__krishiv_file"
_POS = "__krishiv_pos"


@dataclass
class MergePlan:
    """What one merge commit changes, planned against the table's current snapshot."""

    conflict_filter: BooleanExpression
    deleted: list[DataFile] = field(default_factory=list)  # the table's files holding a deleted key's row
    rewritten: list[DataFile] = field(default_factory=list)  # their other rows, written anew
    added: list[DataFile] = field(default_factory=list)  # the staged data files, or filtered copies
    delete_files: list[DataFile] = field(default_factory=list)  # merge-on-read: position deletes of table rows
    written: list[str] = field(default_factory=list)  # files written by this plan (removed if the commit fails)
    keys: int = 0  # distinct keys in the entry
    skipped_files: int = 0  # table files the plan did not read: their Bloom filters hold none of the keys
    deleted_keys: int = 0  # keys whose table rows the commit removes (found or not)
    kept_keys: int = 0  # keys whose table row won on version: the entry's row is dropped

    @property
    def rewritten_bytes(self) -> int:
        return sum(f.file_size_in_bytes for f in self.rewritten)

    @property
    def replaced_bytes(self) -> int:
        return sum(f.file_size_in_bytes for f in self.deleted)

    @property
    def position_deletes(self) -> int:
        return sum(f.record_count for f in self.delete_files)


def merge_commit(
    table: Table, entry: OutboxEntry, summary: Mapping[str, str], properties: Mapping[str, str]
) -> tuple[Table, list[int]]:
    """Merge ``entry`` into ``table`` in one metadata commit; returns the table after it and the ids of the
    snapshots the commit created, oldest first (always exactly one: ``entry.intended_snapshot_id``)."""
    if entry.operation.kind != MERGE:
        raise ValueError(f"{entry.table} batch {entry.batch_id}: merge_commit needs a merge, not {entry.operation}")
    _refuse_pyiceberg_retries(table, entry)
    plan = plan_merge(table, entry)
    try:
        if plan.delete_files:
            row_delta(table, plan.added, plan.delete_files, entry.intended_snapshot_id, summary, properties)
        elif plan.deleted:
            overwrite(
                table,
                plan.deleted,
                plan.rewritten + plan.added,
                entry.intended_snapshot_id,
                summary,
                properties,
                conflict_filter=plan.conflict_filter,
            )
        else:
            fast_append(table, plan.added, entry.intended_snapshot_id, summary, properties)
    except CommitFailedException:
        _remove(table, plan.written)
        raise
    log.info(
        "merged %s batch %s: %d keys (%d kept the table's newer row), %d table files rewritten (%d bytes -> %d), "
        "%d table rows deleted by position, %d table files skipped by their Bloom filters",
        entry.table,
        entry.batch_id,
        plan.keys,
        plan.kept_keys,
        len(plan.deleted),
        plan.replaced_bytes,
        plan.rewritten_bytes,
        plan.position_deletes,
        plan.skipped_files,
    )
    return table, [entry.intended_snapshot_id]


def plan_merge(table: Table, entry: OutboxEntry) -> MergePlan:
    """Read the entry's keys and the table's rows with them, and write the files the commit adds (nothing is
    committed)."""
    key = list(entry.operation.key)
    version = entry.operation.version
    schema = table.schema()
    for column in [*key, *([version] if version else [])]:
        try:  # a column, or a field inside struct columns by its dotted path (``device.id``)
            schema.find_field(column, case_sensitive=True)
        except ValueError:
            columns = ", ".join(sorted(f.name for f in schema.fields))
            raise MergeRefused(
                f"{entry.table} batch {entry.batch_id}: merge column {column!r} is not in the table's schema "
                f"({columns}); nothing was committed: another engine dropped or renamed it; "
                f"put it back {runbook('A merge the relay refuses')}"
            ) from None
    key_types = _arrow_types(table, key)
    entry_columns = [*key, *([version] if version else [])]
    entry_types = _arrow_types(table, entry_columns)

    data = [(f, _read_columns(table, entry, f, entry_columns, key, entry_types)) for f in entry.data_files]
    # Without a version column a versioned delete has nothing to lose to: it deletes like a tombstone.
    unconditional = [*entry.delete_key_files, *([] if version else entry.versioned_delete_files)]
    tombstones = _distinct(
        _concat([_read_columns(table, entry, f, key, key, key_types) for f in unconditional], key_types), key
    )
    data_keys = _concat([rows for _, rows in data], entry_types)
    versioned = _concat(
        [_read_columns(table, entry, f, entry_columns, key, entry_types) for f in entry.versioned_delete_files]
        if version
        else [],
        entry_types,
    )
    if version:
        data_keys = data_keys.rename_columns([*key, _ENTRY_VERSION])
        versioned = versioned.rename_columns([*key, _ENTRY_VERSION])
    _refuse_duplicates(entry, _concat([data_keys, versioned], data_keys.schema), key)

    all_keys = _distinct(_concat([data_keys.select(key), versioned.select(key), tombstones], key_types), key)
    plan = MergePlan(conflict_filter=_key_filter(table, all_keys, key), keys=all_keys.num_rows)

    # Which of the table's files hold a row of an entry's key, and those rows' keys (and versions) and positions.
    tasks: list[FileScanTask] = []
    matched: list[pa.Table] = []
    if all_keys.num_rows and table.current_snapshot() is not None:
        projection = schema.select(*entry_columns, case_sensitive=True)
        reader = ArrowScan(table.metadata, table.io, projection, AlwaysTrue())
        deletes = DeletedPositions(table.io)
        filtered = key_columns(schema)
        hashes = KeyHashes(all_keys.select([k for k in key if k in filtered]))
        probed = 0
        for task in table.scan(row_filter=plan.conflict_filter).plan_files():
            # A batch whose keys are in every file (updates spread over the table) gains nothing from the filters:
            # once PROBES_WITHOUT_A_SKIP files in a row may hold its keys, the plan stops asking them.
            if plan.skipped_files or probed < PROBES_WITHOUT_A_SKIP:
                probed += 1
                if not _may_hold(table, entry, task, hashes):
                    plan.skipped_files += 1
                    continue
            rows = _live_rows_with_keys(table, entry, reader, task, entry_types, all_keys, deletes)
            if rows.num_rows:
                tasks.append(task)
                matched.append(rows.append_column(_FILE, pa.array([len(tasks) - 1] * rows.num_rows, pa.int64())))
    matched_fields = [*entry_types, pa.field(_POS, pa.int64()), pa.field(_FILE, pa.int64())]

    # Keys whose table row is newer than the entry's row or versioned delete keep it (nulls lowest, a tie goes to
    # the entry); a delete key (a tombstone) deletes whatever the versions.
    losing = _empty(key_types)
    if version and matched:
        challengers = _concat([data_keys, versioned], data_keys.schema)
        joined = _concat(matched, matched_fields).join(challengers, key, join_type="inner")
        newer = joined.filter(table_row_wins(joined[version], joined[_ENTRY_VERSION]))
        losing = _distinct(newer.select(key), key).join(tombstones, key, join_type="left anti")
    plan.kept_keys = losing.num_rows
    replaced = _concat([data_keys.select(key), versioned.select(key)], key_types).join(
        losing, key, join_type="left anti"
    )
    deleted_keys = _distinct(_concat([replaced, tombstones], key_types), key)
    plan.deleted_keys = deleted_keys.num_rows

    try:
        if matched and deleted_keys.num_rows:
            hits = _concat(matched, matched_fields).join(deleted_keys, key, join_type="left semi")
            if merge_on_read(table):
                # Merge-on-read: the deleted keys' table rows are named by position; no table file is rewritten.
                paths = pa.array([t.file.file_path for t in tasks], pa.string())
                named = pa.DictionaryArray.from_arrays(hits[_FILE].combine_chunks().cast(pa.int32()), paths)
                deletes = pa.table({"file_path": named, "pos": hits[_POS]})
                plan.delete_files = write_position_deletes(table, deletes, {t.file.file_path: t.file for t in tasks})
                plan.written += [f.file_path for f in plan.delete_files]
            else:
                # Copy-on-write: each table file that holds a deleted key's row is rewritten without those rows, on
                # its own: files holding no merged key stay as they are.
                reader = ArrowScan(table.metadata, table.io, schema, AlwaysTrue())
                for task in (tasks[i] for i in sorted(set(hits[_FILE].to_pylist()))):
                    rows = _read_table_file(table, entry, reader, task)
                    kept = rows.take(_surviving(_cast(rows, key_types), deleted_keys, key))
                    plan.deleted.append(task.file)
                    rewritten = write_data_files(table, kept)
                    plan.rewritten += rewritten
                    plan.written += [f.file_path for f in rewritten]

        # Register the staged data files, without the rows that lost to a newer table row.
        for staged, keys in data:
            if losing.num_rows == 0 or keys.num_rows == 0:
                plan.added.append(data_file(table, staged.path))
                continue
            survivors = _surviving(keys.select(key), losing, key)
            if len(survivors) == keys.num_rows:
                plan.added.append(data_file(table, staged.path))
            elif len(survivors):
                path = _write_beside(table, entry, staged, survivors)
                plan.written.append(path)
                plan.added.append(data_file(table, path))
    except Exception:
        _remove(table, plan.written)  # never referenced: the plan failed before any commit
        raise
    return plan


def table_row_wins(table_version: pa.ChunkedArray | pa.Array, entry_version: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Where a table row survives an entry's row or versioned delete of its key: its version is higher, a null
    version being lower than every version (and a tie going to the entry, the later event)."""
    higher = pc.or_kleene(pc.is_null(entry_version), pc.greater(table_version, entry_version))
    return pc.and_kleene(pc.is_valid(table_version), higher).fill_null(False)


# ------------------------------------------------------------------------------------------ helpers


def _may_hold(table: Table, entry: OutboxEntry, task: FileScanTask, hashes: KeyHashes) -> bool:
    """Whether a table file may hold one of the keys, by its Bloom filters on the key columns (a file without
    filters may hold any). A file that is gone is left to the read, which says why."""
    if not hashes.keys.num_columns:
        return True
    try:
        columns = hashes.keys.column_names
        path = task.file.file_path
        filters = FILTERS.get((path, tuple(columns)), lambda: read_filters(table.io, path, columns))
    except FileNotFoundError:
        return True
    return filters is None or filters.may_hold_any(hashes)


@dataclass(frozen=True)
class FileKeys:
    """A table file's key (and version) columns with each row's position, as the merge matches them with a batch's
    keys. A single integer key is also kept sorted, so matching is a binary search rather than a join."""

    rows: pa.Table
    order: np.ndarray | None = None  # positions sorting the key, for a single integer key
    sorted_keys: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        extra = 0 if self.order is None or self.sorted_keys is None else self.order.nbytes + self.sorted_keys.nbytes
        return self.rows.nbytes + extra

    def having(self, keys: pa.Table) -> pa.Table:
        """The rows whose key is one of ``keys`` (distinct, no nulls), in file order."""
        if self.sorted_keys is None or self.order is None or keys.num_columns != 1:
            return self.rows.join(keys, keys.column_names, join_type="left semi")
        wanted = keys.column(0).to_numpy()
        at = np.searchsorted(self.sorted_keys, wanted)
        inside = at < len(self.sorted_keys)
        found = at[inside][self.sorted_keys[at[inside]] == wanted[inside]]
        # every row holding a found key: a key may be in a file more than once (rows deleted by position since)
        ends = np.searchsorted(self.sorted_keys, self.sorted_keys[found], side="right")
        hits = np.concatenate([self.order[a:b] for a, b in zip(found, ends, strict=True)]) if len(found) else []
        return self.rows.take(pa.array(np.sort(np.asarray(hits, dtype=np.int64))))


def _file_keys(rows: pa.Table, key_columns: int) -> FileKeys:
    """``rows`` (the key columns first, then the version's, if any) with their positions."""
    rows = rows.append_column(_POS, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    first = rows.column(0)
    if key_columns == 1 and pa.types.is_integer(first.type) and first.null_count == 0:
        values = first.to_numpy()
        order = np.argsort(values, kind="stable")
        return FileKeys(rows, order, values[order])
    return FileKeys(rows)


class TableFileMissing(MergeRefused):
    """A data file of the table's current snapshot is gone while no commit moved the head: rows were lost."""


def _live_rows_with_keys(
    table: Table,
    entry: OutboxEntry,
    reader: ArrowScan,
    task: FileScanTask,
    fields: Sequence[pa.Field],
    keys: pa.Table,
    deletes: DeletedPositions,
) -> pa.Table:
    """The rows of a table file with one of ``keys`` (``fields``, then each row's position in the file), without
    the rows its delete files delete. Read whole and in file order (pyiceberg's scan of one task keeps it, as its
    own position deletes rely on), matched, then the deleted positions dropped."""
    rows = _FILE_KEYS.get(
        (task.file.file_path, tuple((f.name, str(f.type)) for f in fields), keys.num_columns),
        lambda: _file_keys(
            _cast(_read_table_file(table, entry, reader, FileScanTask(task.file)), fields), keys.num_columns
        ),
        still_there=table.io.new_input(task.file.file_path).exists,
    ).having(keys)
    if task.delete_files and rows.num_rows:
        dead = deletes.of(task.delete_files, task.file.file_path)
        if len(dead):
            rows = rows.filter(pc.invert(pc.is_in(rows[_POS], dead)))
    return rows


def _read_table_file(table: Table, entry: OutboxEntry, reader: ArrowScan, task: FileScanTask) -> pa.Table:
    """One of the table's files as the plan reads it; a file that is gone is a conflict if the head moved."""
    try:
        return reader.to_table([task])
    except FileNotFoundError as exc:
        path = task.file.file_path
        try:
            head = table.catalog.load_table(table.name()).metadata.current_snapshot_id
        except Exception:  # the catalog is away: the relay's reload decides, as after any unknown outcome
            raise exc from None
        if head != table.metadata.current_snapshot_id:
            raise CommitFailedException(
                f"{entry.table} batch {entry.batch_id}: table file {path} of snapshot "
                f"{table.metadata.current_snapshot_id} is gone and the head moved to {head} (a compaction replaced "
                "it, and orphan removal deleted it); re-planning on the new head"
            ) from exc
        raise TableFileMissing(
            f"{entry.table} batch {entry.batch_id}: data file {path} of the table's current snapshot {head} is "
            "missing (removed outside Iceberg); merging would lose its rows, so nothing was committed. Restore "
            f"the file or the table {runbook('A merge the relay refuses')}"
        ) from exc


def _refuse_pyiceberg_retries(table: Table, entry: OutboxEntry) -> None:
    retries = property_as_int(
        table.properties, TableProperties.COMMIT_NUM_RETRIES, TableProperties.COMMIT_NUM_RETRIES_DEFAULT
    )
    if retries:
        raise MergeRetriesEnabled(
            f"{entry.table} batch {entry.batch_id}: the table's {TableProperties.COMMIT_NUM_RETRIES} is {retries}; "
            "pyiceberg would retry a merge against a newer head with a plan made for the older one. Set it to 0 "
            "(Krishiv's tables are created so): the relay re-checks and re-plans before each retry "
            + runbook("A merge the relay refuses")
        )


def _arrow_types(table: Table, columns: Sequence[str]) -> list[pa.Field]:
    """The columns' Arrow fields as pyiceberg reads them, without metadata (both sides of a join must agree), each
    named by its path: a key inside structs (``device.id``) is a flat column of the join."""
    schema = table.schema()
    return [
        pa.field(c, schema_to_pyarrow(schema.find_type(c, case_sensitive=True), include_field_ids=False))
        for c in columns
    ]


def _cast(rows: pa.Table, fields: Sequence[pa.Field]) -> pa.Table:
    """The values at each of ``fields``' paths in ``rows`` (a column, or a field of its structs), as a flat table."""
    return pa.table([column_at(rows, f.name).cast(f.type) for f in fields], schema=pa.schema(fields))


def _empty(fields: Sequence[pa.Field]) -> pa.Table:
    return pa.schema(fields).empty_table()


def _concat(tables: Sequence[pa.Table], fields: Sequence[pa.Field]) -> pa.Table:
    return pa.concat_tables(tables) if tables else _empty(fields)


def _distinct(rows: pa.Table, key: Sequence[str]) -> pa.Table:
    return rows.group_by(list(key), use_threads=False).aggregate([]) if rows.num_rows else rows


def _surviving(keys: pa.Table, drop: pa.Table, key: Sequence[str]) -> pa.Array:
    """Positions of ``keys``' rows whose key is not in ``drop``, in order."""
    indexed = keys.append_column(_ROW, pa.array(range(keys.num_rows), pa.int64()))
    return indexed.join(drop, list(key), join_type="left anti").sort_by(_ROW)[_ROW].combine_chunks()


def _read_columns(
    table: Table,
    entry: OutboxEntry,
    staged: StagedFile,
    columns: Sequence[str],
    key: Sequence[str],
    fields: Sequence[pa.Field],
) -> pa.Table:
    """``columns`` of a staged file (fields inside structs by their paths), as a flat table in the table's Arrow
    types; a null key (or a null struct holding it) refused."""
    try:
        rows = _cast(_read_staged(table, staged, columns=top_level(columns)), fields)
    except (pa.ArrowInvalid, KeyError) as exc:  # a column, or a field of a struct, missing from the file
        raise MergeRefused(
            f"{entry.table} batch {entry.batch_id}: staged file {staged.path}: {exc}; remove the batch's staged files "
            f"and run krishiv restage {runbook('A merge the relay refuses')}"
        ) from exc
    for column in key:
        if rows[column].null_count:
            raise MergeKeyNull(entry.table, entry.batch_id, column, staged.path)
    return rows


def _read_staged(table: Table, staged: StagedFile, columns: list[str] | None = None) -> pa.Table:
    try:
        with table.io.new_input(staged.path).open() as stream:
            return pq.read_table(stream, columns=columns)
    except FileNotFoundError as exc:
        raise StagedFileMissing(staged.path) from exc


def _refuse_duplicates(entry: OutboxEntry, data_keys: pa.Table, key: Sequence[str]) -> None:
    if not data_keys.num_rows:
        return
    counts = data_keys.select(list(key)).group_by(list(key), use_threads=False).aggregate([([], "count_all")])
    repeated = counts.filter(pc.greater(counts["count_all"], 1))
    if repeated.num_rows:
        sample = {c: repeated[c][0].as_py() for c in key}
        raise MergeKeyDuplicate(
            f"{entry.table} batch {entry.batch_id}: {repeated.num_rows} keys have more than one row in the staged "
            f"data and versioned delete-key files (e.g. {sample}); a merge takes one row per key, so nothing was "
            "committed. Phase 1 keeps the latest row per key: remove the batch's staged files and run krishiv restage "
            + runbook("A merge the relay refuses")
        )


def _key_filter(table: Table, keys: pa.Table, key: Sequence[str]) -> BooleanExpression:
    """A filter every table row with one of ``keys`` passes (others may too): ``In`` per key column while
    pyiceberg's metrics can use it, else the column's ``[min, max]``; a value pyiceberg cannot express as a
    literal gives up pruning on that column."""
    if not keys.num_rows:
        return AlwaysTrue()
    schema = table.schema()
    parts: list[BooleanExpression] = []
    for column in key:
        values = pc.unique(keys[column])
        try:
            if len(values) <= IN_PREDICATE_LIMIT:
                expr: BooleanExpression = In(column, values.to_pylist())
            else:
                bounds = pc.min_max(values)
                expr = And(
                    GreaterThanOrEqual(column, bounds["min"].as_py()),
                    LessThanOrEqual(column, bounds["max"].as_py()),
                )
            bind(schema, expr, case_sensitive=True)
        except (TypeError, ValueError) as exc:
            log.debug("no pruning on %s.%s: %s", table.name(), column, exc)
            expr = AlwaysTrue()
        parts.append(expr)
    return And(*parts) if len(parts) > 1 else parts[0]


def _write_beside(table: Table, entry: OutboxEntry, staged: StagedFile, survivors: pa.Array) -> str:
    """A copy of a staged data file with only the ``survivors`` rows, beside it under a fresh name."""
    rows = _read_staged(table, staged).take(survivors)
    folder, name = posixpath.split(staged.path)
    stem = name[: -len(".parquet")] if name.endswith(".parquet") else name
    path = posixpath.join(folder, f"{stem}-merge-{entry.intended_snapshot_id}-{uuid.uuid4().hex[:8]}.parquet")
    codec = table.properties.get(TableProperties.PARQUET_COMPRESSION, TableProperties.PARQUET_COMPRESSION_DEFAULT)
    blooms = writer_options(rows.schema, key_columns(table.schema()), rows.num_rows)  # as the staged file had
    with table.io.new_output(path).create() as stream:
        pq.write_table(rows, stream, compression=codec, bloom_filter_options=blooms)
    return path


def _remove(table: Table, paths: Sequence[str]) -> None:
    for path in paths:
        try:
            table.io.delete(path)
        except Exception:  # a leftover file is an orphan, not an error of the commit
            log.warning("could not remove %s, written for a merge that did not commit", path, exc_info=True)
