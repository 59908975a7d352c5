"""The snapshot a compaction commits: files replaced by their rewrites, as one ``replace`` snapshot, rebased on a
moved head without writing again what it already wrote.

Beside a relay that commits every few tens of milliseconds, the head moves while a compaction commits. An attempt
that read the head's manifest list again, and wrote its manifests again, took several times the gap between two
relay commits at a few hundred manifests (0.33 s against 45 ms, measured at 600), so every rebase lost the race
and the compaction gave up (``CompactionConflict``) while the table grew deep. So, for one compaction:

* :class:`ManifestReads` reads each manifest list and each manifest once (both are immutable files);
* :class:`ReplaceFiles` writes the manifests of its own changes (the rewrites added, the replaced files and the
  removed delete files as DELETED entries) and each rewritten copy of a head manifest once, and reuses them on
  every later attempt while the files it replaces stay the same (the snapshot id is kept across attempts, so the
  entries stay true). Each attempt still checks that every replaced file is live in its parent and writes its own
  manifest list. :class:`AttemptManifests` remembers what was written, so whatever no committed snapshot names is
  deleted (:meth:`AttemptManifests.remove_unused`).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
)
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import UpdateTableMetadata
from pyiceberg.table.update.snapshot import _OverwriteFiles
from pyiceberg.typedef import EMPTY_DICT

from outbox.position_deletes import DeleteManifestWriter

log = logging.getLogger(__name__)


class ManifestReads:
    """Manifest lists and manifests' live entries, each read once (by a compaction's plan and every attempt)."""

    def __init__(self, io: FileIO) -> None:
        self._io = io
        self._lists: dict[str, tuple[ManifestFile, ...]] = {}
        self._entries: dict[str, list[ManifestEntry]] = {}

    def manifests(self, snapshot: Snapshot | None) -> tuple[ManifestFile, ...]:
        if snapshot is None:
            return ()
        if snapshot.manifest_list not in self._lists:
            self._lists[snapshot.manifest_list] = tuple(snapshot.manifests(self._io))
        return self._lists[snapshot.manifest_list]

    def live_entries(self, manifest: ManifestFile) -> list[ManifestEntry]:
        if manifest.manifest_path not in self._entries:
            self._entries[manifest.manifest_path] = manifest.fetch_manifest_entry(self._io, discard_deleted=True)
        return self._entries[manifest.manifest_path]

    def live_data_files(self, snapshot: Snapshot | None) -> list[DataFile]:
        """The data files of ``snapshot`` (no delete files), each with its ``spec_id``."""
        return [
            e.data_file
            for manifest in self.manifests(snapshot)
            if manifest.content == ManifestContent.DATA
            for e in self.live_entries(manifest)
            if e.data_file.content == DataFileContent.DATA
        ]


@dataclass
class AttemptManifests:
    """The manifests one compaction wrote, reused by its later attempts while what it replaces is the same."""

    changes: tuple[frozenset[DataFile], frozenset[DataFile]] | None = None  # (replaced files, removed delete files)
    own: list[ManifestFile] | None = None  # added, DELETED data entries, DELETED delete entries
    rewritten: dict[str, ManifestFile | None] = field(default_factory=dict)  # head manifest -> its copy (None: empty)
    written: set[str] = field(default_factory=set)  # every manifest path written, for the clean-up
    last: set[str] = field(default_factory=set)  # the manifests of the last attempt's snapshot

    def remove_unused(self, io: FileIO, committed: bool) -> None:
        """Delete the manifests no committed snapshot names: all of them when nothing was committed."""
        unused = self.written - (self.last if committed else set())
        for path in unused:
            try:
                io.delete(path)
            except Exception:  # a leftover manifest is an orphan, not an error of the compaction
                log.warning("could not remove %s, written for a compaction attempt", path, exc_info=True)
        self.written -= unused


def _restated(entry: ManifestEntry, status: ManifestEntryStatus, snapshot_id: int | None) -> ManifestEntry:
    """``entry``'s file with its sequence numbers, under a new status (EXISTING in a copy, DELETED when replaced)."""
    return ManifestEntry.from_args(
        status=status,
        snapshot_id=snapshot_id,
        sequence_number=entry.sequence_number,
        file_sequence_number=entry.file_sequence_number,
        data_file=entry.data_file,
    )


class ReplaceFiles(_OverwriteFiles):
    """An overwrite producer whose snapshot is labelled ``replace``: the same data, rearranged.

    pyiceberg 0.12 builds a snapshot summary for append, overwrite and delete only (``update_snapshot_summaries``
    raises "Operation not implemented" for replace), so the summary is computed as an overwrite's (added and
    deleted files, records and sizes, the totals) and then labelled replace. It is not registered for
    pyiceberg's own commit retries: a retry would rebase it without the check that its files are still live;
    ``outbox.compaction`` rebases itself, handing every attempt the same :class:`ManifestReads` and
    :class:`AttemptManifests`.
    """

    reads: ManifestReads
    attempt: AttemptManifests
    #: The live entries of the position delete files this snapshot removes: they apply to no file left once the
    #: replaced files are gone.
    removed_deletes: list[ManifestEntry]

    def _manifests(self) -> list[ManifestFile]:
        """pyiceberg's (added, deleted, then the head's manifests), with what an earlier attempt wrote reused."""
        deleted = self._deleted_entries()  # checks every replaced file is live in the parent, on every attempt
        attempt = self.attempt
        changes = (frozenset(self._deleted_data_files), frozenset(e.data_file for e in self.removed_deletes))
        if attempt.changes != changes:
            attempt.changes, attempt.own, attempt.rewritten = changes, None, {}
        try:
            if attempt.own is None:
                attempt.own = (
                    self._added_manifests() + self._deleted_manifests(deleted) + self._removed_delete_manifests()
                )
            manifests = attempt.own + self._existing_manifests()
        finally:  # whatever was written, for the clean-up
            attempt.written.update(self._written_manifests)
        attempt.last = {m.manifest_path for m in manifests}
        return manifests

    def _added_manifests(self) -> list[ManifestFile]:
        if not self._added_data_files:
            return []
        with self.new_manifest_writer(self._transaction.table_metadata.spec()) as writer:
            for f in self._added_data_files:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=self._snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=f,
                    )
                )
        return [writer.to_manifest_file()]

    def _deleted_manifests(self, deleted: list[ManifestEntry]) -> list[ManifestFile]:
        by_spec: dict[int, list[ManifestEntry]] = defaultdict(list)
        for e in deleted:
            by_spec[e.data_file.spec_id].append(e)
        manifests = []
        for spec_id, entries in by_spec.items():
            with self.new_manifest_writer(self.spec(spec_id)) as writer:
                for e in entries:
                    writer.add_entry(e)
            manifests.append(writer.to_manifest_file())
        return manifests

    def _removed_delete_manifests(self) -> list[ManifestFile]:
        """The removed delete files' DELETED entries, in delete manifests of their own (pyiceberg writes a data
        manifest for the deleted entries it knows, which are data files only)."""
        by_spec: dict[int, list[ManifestEntry]] = defaultdict(list)
        for e in self.removed_deletes:
            by_spec[e.data_file.spec_id].append(e)
        manifests = []
        for spec_id, removed in by_spec.items():
            writer = DeleteManifestWriter(
                self.spec(spec_id), self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression
            )
            with writer:
                for e in removed:
                    writer.delete(e)
            manifests.append(writer.to_manifest_file())
        return manifests

    def _manifest_writer(self, manifest: ManifestFile) -> ManifestWriter:
        """A writer for a rewritten copy of ``manifest``: of delete files for a delete manifest."""
        if manifest.content != ManifestContent.DELETES:
            return self.new_manifest_writer(self.spec(manifest.partition_spec_id))
        return DeleteManifestWriter(
            self.spec(manifest.partition_spec_id),
            self.schema(),
            self.new_manifest_output(),
            self._snapshot_id,
            self._compression,
        )

    def _existing_manifests(self) -> list[ManifestFile]:
        """The head's manifests kept as they are, and those that hold a replaced file rewritten without it (once
        per compaction: a later attempt's head still holds the manifests the first one rewrote)."""
        kept: list[ManifestFile] = []
        snapshot = self._transaction.table_metadata.snapshot_by_name(name=self._target_branch)
        gone = self._deleted_data_files | {e.data_file for e in self.removed_deletes}
        rewritten = self.attempt.rewritten
        for manifest in self.reads.manifests(snapshot):
            path = manifest.manifest_path
            if path not in rewritten:
                entries = self.reads.live_entries(manifest)
                remaining = [e for e in entries if e.data_file not in gone]
                if len(remaining) == len(entries):
                    kept.append(manifest)
                    continue
                rewritten[path] = self._copy(manifest, remaining) if remaining else None
            if (copy := rewritten[path]) is not None:
                kept.append(copy)
        return kept

    def _copy(self, manifest: ManifestFile, entries: list[ManifestEntry]) -> ManifestFile:
        with self._manifest_writer(manifest) as writer:
            for e in entries:
                writer.add_entry(_restated(e, ManifestEntryStatus.EXISTING, e.snapshot_id))
        return writer.to_manifest_file()

    def _deleted_entries(self) -> list[ManifestEntry]:
        """pyiceberg's, reading entries through :class:`ManifestReads`: a DELETED entry per replaced file, each
        required to be live in the parent."""
        parent = self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id or -1)
        deleted = [
            _restated(e, ManifestEntryStatus.DELETED, self._snapshot_id)
            for manifest in self.reads.manifests(parent)
            for e in self.reads.live_entries(manifest)
            if e.data_file.content == DataFileContent.DATA and e.data_file in self._deleted_data_files
        ]
        self._validate_required_deletes(deleted)
        return deleted

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        self._operation = Operation.OVERWRITE
        deleted = self._deleted_data_files
        self._deleted_data_files = deleted | {e.data_file for e in self.removed_deletes}  # counted by content
        try:
            summary = super()._summary(snapshot_properties)
        finally:
            self._operation = Operation.REPLACE
            self._deleted_data_files = deleted
        return Summary(operation=Operation.REPLACE, **summary.additional_properties)

    def commit(self) -> None:
        UpdateTableMetadata.commit(self)
