"""Removal of the files of a table that nothing refers to any more: neither the table's metadata nor a PENDING
ledger entry.

Where orphans come from: snapshot expiry (``outbox.expiry``) and compaction leave data files, manifests and
manifest lists that no retained snapshot refers to; old metadata files fall off the metadata log; a relay
or compaction commit that lost its race leaves the files it wrote; a stager killed between writing its files and
recording them leaves staged files no entry names. Files of COMMITTED entries that no retained snapshot refers to
(their snapshot expired, or compaction rewrote them) are orphans too: the relay finds such a batch by the table's
high-water property, never by its files.

Two places are listed, through the table's own FileIO (so ``s3://`` lists where the files were written): the
table's location, recursively, and Krishiv's staging folder for the table (:func:`staging_root`). The order is
what makes it safe beside a running stager, relay and compaction:

1. list the files (each with its modification time);
2. read the PENDING entries' staged files from the ledger;
3. reload the table and read every reference: the current metadata file, the metadata log, statistics files,
   and for every retained snapshot its manifest list, manifests and their live data and delete files (a file a
   snapshot deleted is live in its parent's manifests, if the parent is retained).

Between 2 and 3, the pipeline's stager lease is read too (:func:`in_flight_files`): while a stager holds it, the
staging files of the batches it may still be writing are kept, however old (a batch can outlast the grace period).

A file listed in 1 that a commit references by 3 is kept. A PENDING entry read in 2 is kept; an entry committed
after 2 was committed to the table before 3 (the relay commits the table before it marks the ledger), so its
files are in 3. A file written but not yet recorded anywhere (a stager between its files and its ledger write, a
relay or compaction between its files and its catalog commit) is only protected by its age: anything younger
than the grace period stays, and the grace period has a floor (``krishiv_core.spec.MIN_ORPHAN_GRACE_MS``) that
only a forced run goes below.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pyiceberg.io import FileIO
from pyiceberg.table import Table

from krishiv_core.errors import KrishivError
from krishiv_core.faults import fault_point
from krishiv_core.runbook import runbook
from krishiv_core.spec import MIN_ORPHAN_GRACE_MS
from krishiv_core.staging_paths import STAGING_DIR, staging_root_of
from outbox.ledger import Ledger

log = logging.getLogger(__name__)

#: A Hadoop-style catalog's pointer to the current metadata file: never listed in the metadata, always kept.
VERSION_HINT = "/metadata/version-hint.text"


class GraceTooShort(KrishivError):
    """A grace period below the floor, not forced: files being written could be removed."""


@dataclass(frozen=True)
class ListedFile:
    path: str  # as the table's FileIO names it
    mtime_s: float
    size: int


@dataclass
class OrphanReport:
    table: str
    listed: int = 0
    referenced: int = 0  # listed files the table or a PENDING entry refers to
    young: int = 0  # unreferenced, but within the grace period
    in_flight: int = 0  # of ``referenced``, the files of batches a live stager may still be writing
    removed: list[str] = field(default_factory=list)  # (dry run: that would be removed)
    removed_bytes: int = 0
    dry_run: bool = False


def staging_root(table: Table) -> str | None:
    """Krishiv's staging folder of ``table`` (``<parent of its location>/_krishiv_staging/<folder>``), or None for a
    table at the root of a bucket, which Krishiv never stages for."""
    return staging_root_of(table.location())


def list_files(io: FileIO, root: str) -> list[ListedFile]:
    """Every file below ``root`` (none if it does not exist), listed through the table's own FileIO (its endpoint,
    region and keys: an ``s3://`` root is listed where the files were written, never at the public AWS host the
    default S3 filesystem would ask)."""
    from pyarrow import fs
    from pyiceberg.io.pyarrow import PyArrowFileIO

    if not isinstance(io, PyArrowFileIO):
        raise KrishivError(
            f"listing {root} needs pyiceberg's PyArrowFileIO, but the table's FileIO is {type(io).__name__}; "
            "remove py-io-impl from [iceberg.properties] to remove orphan files"
        )
    scheme, netloc, base = io.parse_location(root, io.properties)
    filesystem = io.fs_by_scheme(scheme, netloc)
    infos = filesystem.get_file_info(fs.FileSelector(base, recursive=True, allow_not_found=True))
    prefix = root[: len(root) - len(base)] if root.endswith(base) else ""
    return [
        ListedFile(prefix + info.path, info.mtime.timestamp() if info.mtime else 0.0, info.size or 0)
        for info in infos
        if info.type == fs.FileType.File
    ]


def referenced_files(table: Table) -> set[str]:
    """Every file the table's metadata refers to: the current metadata file and its log, statistics files, and for
    every retained snapshot its manifest list, manifests and their live data and delete files."""
    metadata = table.metadata
    paths = {table.metadata_location, *(m.metadata_file for m in metadata.metadata_log)}
    paths.update(s.statistics_path for s in metadata.statistics)
    paths.update(s.statistics_path for s in metadata.partition_statistics)
    seen: set[str] = set()
    for snapshot in table.snapshots():
        paths.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            paths.add(manifest.manifest_path)
            # A deleted entry names a file its snapshot removed: a retained parent holds it live in its own manifests.
            paths.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True))
    return paths


#: How far a file's modification time (the storage's clock) may be before the lease's acquisition (the stager's
#: clock) and still be taken for one the stager wrote: the clocks of two machines differ.
CLOCK_SKEW_S = 600.0

_STAGING_FOLDER = f"/{STAGING_DIR}/"
_BATCH_FOLDER = re.compile(r"/query=([^/]+)/batch=(\d+)/")

#: Whether a listed file belongs to a batch a live stager may still be writing.
InFlight = Callable[[ListedFile], bool]


def _nothing_in_flight(_file: ListedFile) -> bool:
    return False


def in_flight_files(ledger: Ledger, pipeline: str, table_name: str) -> InFlight:
    """Which staged files of ``table_name`` a live stager of ``pipeline`` may still be writing (read from the
    ledger now: call it after listing, as the PENDING entries are read).

    A file is kept as in flight when the pipeline's stager lease is live, the file is in a staging folder (the
    table's own location is never the stager's), it was written after the lease was taken (by its modification
    time, less :data:`CLOCK_SKEW_S`), and its batch folder (``query=<q>/batch=<n>``) is past the last batch of
    query ``q`` committed to the table with rows (every batch of a query if none is), or it is in no batch folder.
    Files older than the lease (a stager killed before this one started) and files of batches already committed
    (rewritten by a compaction, their snapshots expired) are orphans like any other, so a
    long-running stager's old leftovers still go; no lease, nothing is in flight.
    """
    lease = ledger.live_lease(pipeline)
    if lease is None:
        return _nothing_in_flight
    since_s = lease.acquired_at.timestamp() - CLOCK_SKEW_S
    committed: dict[str, int | None] = {}

    def in_flight(f: ListedFile) -> bool:
        if f.mtime_s < since_s or _STAGING_FOLDER not in f.path:  # the table's own files are not the stager's
            return False
        found = _BATCH_FOLDER.search(f.path)
        if found is None:
            return True
        query, batch = found.group(1), int(found.group(2))
        if query not in committed:
            committed[query] = ledger.last_committed_batch(query, table_name)
        last = committed[query]
        return last is None or batch > last

    return in_flight


def _same_file_keys(path: str) -> set[str]:
    """``file:///x`` and ``/x`` name the same local file: compare both spellings."""
    keys = {path}
    if path.startswith("file://"):
        keys.add(path.removeprefix("file://"))
    elif path.startswith("/"):
        keys.add("file://" + path)
    return keys


def check_grace(grace_s: float, *, force: bool = False) -> None:
    floor_s = MIN_ORPHAN_GRACE_MS / 1000
    if grace_s < floor_s and not force:
        raise GraceTooShort(
            f"grace period {grace_s:g}s is below {floor_s / 60:g}m: a file being staged or committed is not "
            "recorded yet and would be removed; give a longer grace, or force it when nothing writes the table "
            + runbook("Files a command will not delete")
        )


def remove_orphans(
    load: Callable[[], Table],
    pending_paths: Callable[[], Iterable[str]],
    *,
    grace_s: float,
    roots: Iterable[str] | None = None,
    dry_run: bool = False,
    force: bool = False,
    now_s: float | None = None,
    in_flight: Callable[[], InFlight] | None = None,
) -> OrphanReport:
    """Remove the files below ``roots`` (default: the table's location and its staging folder) that neither the
    table nor a PENDING entry (``pending_paths``, read after listing) refers to and that are older than ``grace_s``.

    ``load`` (re)loads the table; it is called once to find the roots and once more after listing. ``in_flight``
    (read after listing, with the PENDING entries; see :func:`in_flight_files`) says which files a live stager may
    still be writing: kept, counted as referenced. ``dry_run`` lists what would go. A grace below the floor raises
    :class:`GraceTooShort` unless ``force``.
    """
    check_grace(grace_s, force=force)
    table = load()
    if roots is None:
        roots = [r for r in (table.location(), staging_root(table)) if r is not None]
    listing = [f for root in dict.fromkeys(r.rstrip("/") for r in roots) for f in list_files(table.io, root)]
    keep = {key for p in pending_paths() for key in _same_file_keys(p)}
    writing = in_flight() if in_flight is not None else _nothing_in_flight
    table = load()  # after the listing and the ledger: a file committed meanwhile is referenced here
    keep |= {key for p in referenced_files(table) for key in _same_file_keys(p)}
    now = time.time() if now_s is None else now_s
    report = OrphanReport(".".join(table.name()), listed=len(listing), dry_run=dry_run)
    for f in listing:
        if _same_file_keys(f.path) & keep or f.path.endswith(VERSION_HINT):
            report.referenced += 1
        elif writing(f):
            report.referenced += 1
            report.in_flight += 1
        elif now - f.mtime_s < grace_s:
            report.young += 1
        else:
            if not dry_run:
                fault_point("orphans.before_delete")
                table.io.delete(f.path)
            report.removed.append(f.path)
            report.removed_bytes += f.size
    if report.removed:
        log.info("%s: %s %d orphan files", report.table, "would remove" if dry_run else "removed", len(report.removed))
    return report
