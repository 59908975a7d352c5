"""Compaction: rewrite a table's small data files into files of about a target size, as one ``replace`` snapshot.

Every relay commit adds at least one small file (and one manifest), so a continuous pipeline leaves thousands of
them: scans open every file and every commit reads every manifest. :func:`compact_table` rewrites them:

1. Plan on the branch head H: the live data files, grouped by partition spec and partition value; in each group
   the files smaller than ``small_file_ratio`` of the target; a group with at least ``min_files`` of them is
   bin-packed (on their sizes on disk) into outputs of about ``target_file_size``.
2. Read each bin through the table's FileIO in the table's schema (files written under an older schema read as
   that schema's evolution says) and write it with pyiceberg's own writer (file names under the table's data
   location, field ids, the table's Parquet settings, partition records computed from the rows, invariant 14).
   Each bin must give back exactly the rows its files held, in one file of the bin's partition; otherwise
   nothing of it is committed.
3. Commit ONE snapshot with operation ``replace`` (pyiceberg 0.12 cannot summarise one, see
   :class:`outbox.replace_files.ReplaceFiles`) that removes the bins' files and adds their rewrites, with the
   requirement that the branch head is still the snapshot the plan read. Its summary names the maintenance
   (``krishiv.maintenance=compaction``, the files and bytes rewritten, the run id) and never a batch, a query
   or a high-water batch id; no table property is set, so the relay's high-water marks stay as they are.

A compaction never changes what the table holds: added rows equal deleted rows less the rows position deletes
deleted (``krishiv.folded-deletes``), per bin and in the summary. Position deletes (a merge-on-read merge's, see
``outbox/position_deletes.py``, or another engine's) are folded: a partition they apply to is compacted, every file
they apply to is rewritten without the rows they delete, and each delete file left naming no live file is removed
in the same snapshot. On every rebase the bins' files must still have the delete files they were read with; a file
that gained one meanwhile drops its group (its rewrite would bring the newly deleted rows back). A table with
equality delete files (which pyiceberg cannot read) is not compacted: one line in the report's ``skipped`` says so.

Concurrency with the relay (which commits about every second in continuous mode): if the head moved between
plan and commit, the table is reloaded. A bin whose files are all still live is committed on the new head as
it is (a relay append only adds files); a bin one of whose files a concurrent commit removed (a merge's
copy-on-write rewrite) is dropped and its written files deleted. At most :data:`MAX_ATTEMPTS` commits are
tried. Every file written by a compaction that does not commit is deleted by it, except after an unknown
outcome (the catalog may still apply the commit): those, and the files of a killed compaction, are orphans for
orphan-file removal. The relay, for its part, sees a compaction as another writer at the head: its conflict
reloads, re-checks (the intended snapshot id, the high-water property) and retries.

Fault points (``krishiv_core.faults``): ``maintenance.after_rewrite`` (files written, nothing committed),
``maintenance.before_catalog_commit`` and ``maintenance.after_catalog_commit``.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
)
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.typedef import Record

from krishiv_core.faults import fault_point
from krishiv_core.parquet_files import write_staged_files
from outbox.data_files import data_file as staged_data_file
from outbox.errors import OutboxError
from outbox.position_deletes import (
    DeletedPositions,
    delete_files_by_data_file,
    referenced_paths,
)
from outbox.replace_files import AttemptManifests, ManifestReads, ReplaceFiles
from outbox.snapshot_producer import MetadataCachingTransaction

log = logging.getLogger(__name__)

SUMMARY_MAINTENANCE = "krishiv.maintenance"
SUMMARY_REWRITTEN_FILES = "krishiv.rewritten-files"
SUMMARY_REWRITTEN_BYTES = "krishiv.rewritten-bytes"
SUMMARY_MAINTENANCE_RUN = "krishiv.maintenance-run"
#: Rows of the rewritten files that position deletes deleted: a compaction adds exactly the rows it deletes less these.
SUMMARY_FOLDED_DELETES = "krishiv.folded-deletes"
COMPACTION = "compaction"

#: A file below this share of the target size is small (a candidate to rewrite).
SMALL_FILE_RATIO = 0.75
#: Commits tried (the first and its rebases on a moved head) before the compaction gives up, committing nothing.
MAX_ATTEMPTS = 12
#: Where a table's data files go (Iceberg's table property; its default: ``<location>/data``). A bin is written as
#: one file, already sized by the bytes on disk (pyiceberg's writer would split by the rows' size in memory).
_WRITE_DATA_PATH = "write.data.path"


class CompactionError(OutboxError):
    """A compaction refused to commit or gave up; the table is as it was (see the message for written files)."""


class CompactionRowsMismatch(CompactionError):
    """A rewrite did not hold exactly the rows of the files it replaces; nothing was committed."""


class CompactionConflict(CompactionError):
    """Concurrent commits kept moving the head for longer than the retry budget; nothing was committed."""


class CompactionOutcomeUnknown(CompactionError):
    """The catalog call failed without saying whether it applied the commit; the written files are left."""


@dataclass(frozen=True)
class Bin:
    """Files of one partition rewritten into one file, with the position delete files that apply to each (folded
    into the rewrite)."""

    spec_id: int
    partition: Record
    files: tuple[DataFile, ...]
    deletes: tuple[tuple[DataFile, ...], ...] = ()  # per file of ``files``, when any applies

    def deletes_of(self, i: int) -> tuple[DataFile, ...]:
        return self.deletes[i] if self.deletes else ()

    @property
    def bytes(self) -> int:
        return sum(f.file_size_in_bytes for f in self.files)

    @property
    def rows(self) -> int:
        return sum(f.record_count for f in self.files)


@dataclass
class CompactionReport:
    table: str
    groups: int = 0  # partitions with files rewritten (planned, for a dry run)
    files_rewritten: int = 0
    bytes_rewritten: int = 0
    files_written: int = 0
    bytes_written: int = 0
    rows: int = 0  # rows rewritten (added == deleted)
    snapshot_id: int | None = None  # the replace snapshot, None when nothing was committed
    attempts: int = 0  # commits tried (a moved head makes more than one)
    dry_run: bool = False
    skipped: list[str] = field(default_factory=list)  # why files or groups were left as they are


@dataclass
class _Rewrite:
    bin: Bin
    written: list[DataFile]
    folded: int = 0  # rows of the bin's files their position deletes deleted, not rewritten


def compact_table(
    table: Table,
    *,
    target_file_size: int,
    min_files: int,
    dry_run: bool = False,
    run_id: str | None = None,
    small_file_ratio: float = SMALL_FILE_RATIO,
) -> CompactionReport:
    """Rewrite the small data files of ``table`` (a pyiceberg table loaded from its catalog) into files of about
    ``target_file_size`` bytes, in partitions holding at least ``min_files`` small files, as one ``replace``
    snapshot; ``dry_run`` plans and reports without writing. Returns what was (or would be) rewritten."""
    name = ".".join(table.name())
    if target_file_size <= 0:
        raise CompactionError(
            f"compaction of {name}: target_file_size must be a positive number of bytes, not {target_file_size}"
        )
    if min_files < 2:
        raise CompactionError(
            f"compaction of {name}: min_files must be at least 2 (one file is not compacted), not {min_files}"
        )
    if not 0 < small_file_ratio <= 1:
        raise CompactionError(f"compaction of {name}: small_file_ratio must be in (0, 1], not {small_file_ratio}")
    report = CompactionReport(name, dry_run=dry_run)
    reads = ManifestReads(table.io)  # each manifest list and manifest read once, by the plan and every attempt
    bins = plan_bins(table, target_file_size, min_files, small_file_ratio, report.skipped, reads)
    if not bins:
        return report
    if dry_run:
        _count(report, bins, written=[])
        return report

    run_id = run_id or uuid.uuid4().hex
    rewrites = [_rewrite(table, b) for b in bins]
    try:
        fault_point("maintenance.after_rewrite")
        _commit(table, rewrites, run_id, report, reads)
    except CompactionOutcomeUnknown:
        raise  # the files may be referenced by a commit the catalog still applies: left as orphans at worst
    except BaseException:
        if report.snapshot_id is None:
            _remove(table, [f for r in rewrites for f in r.written])
        raise
    return report


# ------------------------------------------------------------------------------------------ planning


def live_data_files(table: Table, reads: ManifestReads | None = None) -> list[DataFile]:
    """The data files of the current snapshot (no delete files), each with its ``spec_id``; manifests read through
    ``reads`` when given."""
    return (reads or ManifestReads(table.io)).live_data_files(table.current_snapshot())


def _equality_deletes(deletes: dict[str, frozenset[DataFile]]) -> bool:
    return any(d.content == DataFileContent.EQUALITY_DELETES for ds in deletes.values() for d in ds)


def plan_bins(
    table: Table,
    target_file_size: int,
    min_files: int,
    small_file_ratio: float,
    skipped: list[str],
    reads: ManifestReads | None = None,
) -> list[Bin]:
    """The bins to rewrite on the current snapshot, by partition; reasons for what is left go to ``skipped``.

    A partition where position deletes apply (a merge-on-read merge's, or another engine's) is compacted whatever
    ``min_files`` says: every file they apply to is rewritten without the rows they delete (with the small files),
    and the delete files, then applying to nothing, are removed in the same snapshot.
    """
    if table.current_snapshot() is None:
        skipped.append("the table has no snapshot")
        return []
    reads = reads or ManifestReads(table.io)
    deletes = delete_files_by_data_file(table, manifests=reads.manifests(table.current_snapshot()))
    if _equality_deletes(deletes):
        # An equality delete applies to every older file of its partition, and pyiceberg cannot read it.
        skipped.append("the table has equality delete files; compaction folds position deletes only")
        return []
    current_spec = table.spec().spec_id
    groups: dict[tuple[int, Record], list[DataFile]] = defaultdict(list)
    older_spec = 0
    for data_file in live_data_files(table, reads):
        if data_file.spec_id != current_spec:
            older_spec += 1
            continue
        groups[(data_file.spec_id, data_file.partition)].append(data_file)
    if older_spec:
        skipped.append(f"{older_spec} files under an older partition spec are left as they are")

    small_limit = target_file_size * small_file_ratio
    bins: list[Bin] = []
    few = 0
    for (spec_id, partition), files in sorted(groups.items(), key=lambda kv: repr(kv[0])):
        deleted = [f for f in files if f.file_path in deletes]
        small = [f for f in files if f.file_size_in_bytes < small_limit or f.file_path in deletes]
        if len(small) < min_files and not deleted:
            few += 1 if small else 0
            continue
        for packed in _pack(small, target_file_size):
            if len(packed) > 1 or packed[0].file_path in deletes:
                folded = tuple(tuple(sorted(deletes.get(f.file_path, ()), key=lambda d: d.file_path)) for f in packed)
                bins.append(Bin(spec_id, partition, tuple(packed), folded if any(folded) else ()))
    if few:
        skipped.append(f"{few} partitions have fewer than {min_files} small files")
    if not bins and not skipped:
        skipped.append("no partition has small files to compact")
    return bins


def _pack(files: Sequence[DataFile], target: int) -> list[list[DataFile]]:
    """Files in bins of at most ``target`` bytes (first fit, largest first), oldest order kept within a bin."""
    order = {f.file_path: i for i, f in enumerate(files)}
    bins: list[tuple[int, list[DataFile]]] = []
    for f in sorted(files, key=lambda f: -f.file_size_in_bytes):
        for i, (size, members) in enumerate(bins):
            if size + f.file_size_in_bytes <= target:
                members.append(f)
                bins[i] = (size + f.file_size_in_bytes, members)
                break
        else:
            bins.append((f.file_size_in_bytes, [f]))
    return [sorted(members, key=lambda f: order[f.file_path]) for _, members in bins]


# ------------------------------------------------------------------------------------------ rewriting


def _rewrite(table: Table, b: Bin) -> _Rewrite:
    """Read the bin's files in the table's schema and write them as one file of the bin's partition."""
    reader = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    tasks = [FileScanTask(f, delete_files=set(b.deletes_of(i))) for i, f in enumerate(b.files)]
    rows: pa.Table = reader.to_table(tasks)
    folded = _folded_rows(table, b)
    written = _write_bin(table, rows) if rows.num_rows else []
    problem = None
    if rows.num_rows != b.rows - folded or sum(f.record_count for f in written) != b.rows - folded:
        problem = (
            f"read {rows.num_rows} and wrote {sum(f.record_count for f in written)} rows of {len(b.files)} files "
            f"holding {b.rows}, {folded} of them deleted by position"
        )
    elif any(f.partition != b.partition for f in written):
        problem = f"rows of partition {b.partition} were written under partitions {[f.partition for f in written]}"
    if problem:
        _remove(table, written)
        raise CompactionRowsMismatch(
            f"compaction of {'.'.join(table.name())}: {problem}; nothing was committed "
            f"(files {', '.join(f.file_path for f in b.files[:3])}{' …' if len(b.files) > 3 else ''})"
        )
    return _Rewrite(b, written, folded)


def _write_bin(table: Table, rows: pa.Table) -> list[DataFile]:
    """A bin's rows as one data file of its partition, under the table's data folder, written as Krishiv writes
    staged files: with Bloom filters on the key columns (``krishiv_core.bloom_filters``), which pyiceberg's writer
    cannot write."""
    folder = table.metadata.properties.get(_WRITE_DATA_PATH, f"{table.location().rstrip('/')}/data")
    files = write_staged_files(table.io, table.schema(), table.spec(), rows, folder)
    return [staged_data_file(table, f.path) for f in files]


def _folded_rows(table: Table, b: Bin) -> int:
    """The rows of the bin's files that their position deletes delete (each position once)."""
    folded = 0
    deletes = DeletedPositions(table.io)
    for i, f in enumerate(b.files):
        if b.deletes_of(i):
            positions = pc.unique(deletes.of(b.deletes_of(i), f.file_path))
            folded += int(pc.sum(pc.less(positions, f.record_count)).as_py() or 0)
    return folded


# ------------------------------------------------------------------------------------------ committing


def _commit(
    table: Table, rewrites: list[_Rewrite], run_id: str, report: CompactionReport, reads: ManifestReads
) -> None:
    snapshot_id = table.metadata.new_snapshot_id()
    referenced: dict[str, set[str]] = {}  # a delete file's path -> the data files it names (read once)
    attempt = AttemptManifests()  # the manifests written, reused by every later attempt
    committed = unknown = False
    try:
        for n in range(1, MAX_ATTEMPTS + 1):
            report.attempts = n
            tx = MetadataCachingTransaction(table, autocommit=False)
            summary = _summary(rewrites, run_id)
            producer = ReplaceFiles(Operation.REPLACE, transaction=tx, io=table.io, snapshot_properties=summary)
            producer._snapshot_id = snapshot_id  # kept across attempts: a late landing of one is found by its id
            producer.reads, producer.attempt = reads, attempt
            producer.removed_deletes = _removable_deletes(table, rewrites, reads, referenced)
            for r in rewrites:
                for f in r.bin.files:
                    producer.delete_data_file(f)
                for f in r.written:
                    producer.append_data_file(f)
            producer.commit()  # writes the manifests and stages the snapshot; the catalog is not called yet
            try:
                fault_point("maintenance.before_catalog_commit")
            except BaseException:
                _remove_paths(table, producer._written_manifest_lists)
                raise
            unknown = True  # until the catalog answers, it may apply the commit: its files stay
            try:
                tx.commit_transaction()
            except CommitFailedException as exc:
                unknown = False
                _remove_paths(table, producer._written_manifest_lists)  # its manifests serve the next attempt
                log.info("compaction of %s lost a race to another commit (%s); rebasing", report.table, exc)
                table.refresh()
                rewrites = _still_live(table, rewrites, report, reads)
                if not rewrites:
                    return
                continue
            except Exception as exc:
                if _landed(table, snapshot_id):
                    unknown, committed = False, True
                    break
                raise CompactionOutcomeUnknown(
                    f"compaction of {report.table}: the catalog commit failed ({type(exc).__name__}: {exc}) and the "
                    f"table does not show snapshot {snapshot_id}; it may still apply it. Its written files are left "
                    "for orphan-file removal"
                ) from exc
            unknown, committed = False, True
            break
        else:
            raise CompactionConflict(
                f"compaction of {report.table}: {MAX_ATTEMPTS} commits lost to concurrent writers; "
                "nothing was committed"
            )
    finally:
        if not unknown:
            attempt.remove_unused(table.io, committed)
    report.snapshot_id = snapshot_id
    _count(report, [r.bin for r in rewrites], [f for r in rewrites for f in r.written])
    fault_point("maintenance.after_catalog_commit")
    log.info(
        "compacted %s: %d files (%d bytes) into %d (%d bytes), snapshot %s",
        report.table,
        report.files_rewritten,
        report.bytes_rewritten,
        report.files_written,
        report.bytes_written,
        snapshot_id,
    )


def _summary(rewrites: list[_Rewrite], run_id: str) -> dict[str, str]:
    return {
        SUMMARY_MAINTENANCE: COMPACTION,
        SUMMARY_REWRITTEN_FILES: str(sum(len(r.bin.files) for r in rewrites)),
        SUMMARY_REWRITTEN_BYTES: str(sum(r.bin.bytes for r in rewrites)),
        SUMMARY_MAINTENANCE_RUN: run_id,
        SUMMARY_FOLDED_DELETES: str(sum(r.folded for r in rewrites)),
    }


def _removable_deletes(
    table: Table, rewrites: list[_Rewrite], reads: ManifestReads, referenced: dict[str, set[str]]
) -> list[ManifestEntry]:
    """The live position delete files of the head that name only files the rewrites replace (or files no longer
    live): after the commit they apply to nothing, so they go with it."""
    manifests = reads.manifests(table.current_snapshot())
    if not any(m.content == ManifestContent.DELETES for m in manifests):
        return []
    replaced = {f.file_path for r in rewrites for f in r.bin.files}
    live = {f.file_path for f in live_data_files(table, reads)} - replaced
    removable = []
    for manifest in manifests:
        if manifest.content != ManifestContent.DELETES:
            continue
        for e in reads.live_entries(manifest):
            if e.data_file.content != DataFileContent.POSITION_DELETES:
                continue
            path = e.data_file.file_path
            if path not in referenced:
                referenced[path] = referenced_paths(table.io, e.data_file)
            if not referenced[path] & live:
                removable.append(e)
    return removable


def _landed(table: Table, snapshot_id: int) -> bool:
    try:
        table.refresh()
    except Exception:  # the catalog is still away: unknown
        return False
    return table.metadata.snapshot_by_id(snapshot_id) is not None


def _still_live(
    table: Table, rewrites: list[_Rewrite], report: CompactionReport, reads: ManifestReads
) -> list[_Rewrite]:
    """The rewrites whose files are all live at the new head, with the delete files they were read with; the others'
    written files are deleted. None if the new head has equality delete files."""
    if table.spec().spec_id != rewrites[0].bin.spec_id:
        report.skipped.append("the partition spec changed during the compaction; nothing was committed")
        _remove(table, [f for r in rewrites for f in r.written])
        return []
    deletes = delete_files_by_data_file(table, manifests=reads.manifests(table.current_snapshot()))
    if _equality_deletes(deletes):
        report.skipped.append(
            "another writer added equality delete files while the compaction ran; nothing was committed"
        )
        _remove(table, [f for r in rewrites for f in r.written])
        return []
    # A file whose position deletes changed meanwhile (a merge-on-read merge named more of its rows) was rewritten
    # without them: committing it would bring those rows back, so its group is dropped.
    changed = [
        r
        for r in rewrites
        if any(deletes.get(f.file_path, frozenset()) != set(r.bin.deletes_of(i)) for i, f in enumerate(r.bin.files))
    ]
    if changed:
        report.skipped.append(
            f"position deletes of {sum(len(r.bin.files) for r in changed)} files changed during the compaction; "
            f"{len(changed)} of their groups were left"
        )
        _remove(table, [f for r in changed for f in r.written])
        rewrites = [r for r in rewrites if r not in changed]
        if not rewrites:
            return []
    live = {f.file_path for f in live_data_files(table, reads)}
    kept, dropped = [], []
    for r in rewrites:
        (kept if all(f.file_path in live for f in r.bin.files) else dropped).append(r)
    if dropped:
        report.skipped.append(
            f"{sum(len(r.bin.files) for r in dropped)} files were rewritten by a concurrent commit; "
            f"{len(dropped)} of their groups were left"
        )
        _remove(table, [f for r in dropped for f in r.written])
    return kept


def _count(report: CompactionReport, bins: Iterable[Bin], written: Sequence[DataFile]) -> None:
    bins = list(bins)
    report.groups = len({(b.spec_id, b.partition) for b in bins})
    report.files_rewritten = sum(len(b.files) for b in bins)
    report.bytes_rewritten = sum(b.bytes for b in bins)
    report.rows = sum(b.rows for b in bins)
    report.files_written = len(written)
    report.bytes_written = sum(f.file_size_in_bytes for f in written)


def _remove(table: Table, files: Sequence[DataFile]) -> None:
    _remove_paths(table, [f.file_path for f in files])


def _remove_paths(table: Table, paths: Iterable[str]) -> None:
    for path in paths:
        try:
            table.io.delete(path)
        except Exception:  # a leftover file is an orphan, not an error of the compaction
            log.warning("could not remove %s, written for a compaction that did not commit", path, exc_info=True)
