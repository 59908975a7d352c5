"""The one place Krishiv reaches into pyiceberg's private API: choosing a snapshot's id up front, and a
transaction that does not copy the table's whole history on every read of its metadata.

pyiceberg's ``_SnapshotProducer`` draws a random snapshot id when it is built and keeps it across its own
retries. The outbox needs the id chosen at staging time (written to the ledger before any commit), so it
sets ``_snapshot_id`` before the producer writes its manifests. ``tests/outbox/test_snapshot_producer.py``
breaks if pyiceberg renames or stops honouring that attribute.

pyiceberg 0.12's ``Transaction.table_metadata`` replays the staged updates and deep-copies the metadata
(every snapshot) on each read, and one append reads it about 14 times, so a commit costs O(history) many
times over: 700 ms at 1,000 snapshots in ``krishiv bench``, most of it ``copy.deepcopy``. The cache below
is keyed on the identity of the table's metadata and of the (immutable) tuple of staged updates, so any
staged update or refresh invalidates it; it is the change proposed upstream in apache/iceberg-python#3302
and #3784. With nothing staged yet it returns the table's own metadata, uncopied: profiling 700 commits
showed a third of the remaining copies were of an unchanged table.

Each state is computed by :func:`krishiv_core.table_metadata.updated_metadata`: pyiceberg's update handlers
without the deep copy of the whole history ``update_table_metadata`` ends with (most of a commit's time at 1,000
snapshots, and it protects nothing: the models are frozen and the handlers build new lists).

A merge (``outbox/merge.py``) commits one overwrite snapshot: it drops the table's files that hold merged keys
and adds their rewritten copies with the staged files. :func:`overwrite` gives that snapshot the chosen id the
same way, and :func:`write_data_files` writes the rewritten copies with pyiceberg's own writer (file names,
partitioning, target size and the table's Parquet settings), ``pyiceberg.io.pyarrow._dataframe_to_data_files``,
the function pyiceberg's copy-on-write delete uses.

A merge-on-read merge commits its position delete files (``outbox/position_deletes.py``) with :func:`row_delta`:
pyiceberg's fast append with the delete files in manifests of their own (``_process_manifests``, the hook pyiceberg
gives for changing a snapshot's manifests) and counted in its summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.manifest import DataFile, ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.typedef import EMPTY_DICT

from krishiv_core.table_metadata import updated_metadata

_PRIVATE_SNAPSHOT_ID_ATTRIBUTE = "_snapshot_id"


class MetadataCachingTransaction(Transaction):
    """A transaction whose ``table_metadata`` is computed once per state of the table and staged updates, and
    without a deep copy of the history (``updated_metadata``)."""

    _cached: tuple[TableMetadata, tuple, TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        if not updates:
            return base  # pyiceberg models are frozen and never changed in place; copying protects nothing
        cached = self._cached
        if cached is None or cached[0] is not base or cached[1] is not updates:
            cached = (base, updates, updated_metadata(base, updates))
            self._cached = cached
        return cached[2]


def fast_append(
    table: Table,
    data_files: Sequence[DataFile],
    snapshot_id: int,
    summary: Mapping[str, str],
    properties: Mapping[str, str] | None = None,
) -> Table:
    """Commit one fast-append snapshot with the given id and summary, and set ``properties`` on the table in the
    same metadata commit; returns the table at the new snapshot.

    A transaction commits only when the ``with`` block exits cleanly, so a failure anywhere above the
    catalog call leaves the table untouched.
    """
    with MetadataCachingTransaction(table) as tx:
        if properties:
            tx.set_properties(dict(properties))
        producer = _with_snapshot_id(tx.update_snapshot(snapshot_properties=dict(summary)).fast_append(), snapshot_id)
        for data_file in data_files:
            producer.append_data_file(data_file)
        producer.commit()
    return table


def overwrite(
    table: Table,
    deleted: Sequence[DataFile],
    added: Sequence[DataFile],
    snapshot_id: int,
    summary: Mapping[str, str],
    properties: Mapping[str, str] | None = None,
    conflict_filter: BooleanExpression | None = None,
) -> Table:
    """Commit one overwrite snapshot with the given id and summary that removes ``deleted`` (data files of the
    current snapshot) and adds ``added``, and set ``properties`` in the same metadata commit; returns the table
    at the new snapshot.

    ``conflict_filter`` names the rows the caller read to decide (its manifests are pruned with it, and it is
    what pyiceberg validates concurrent commits against); without it every manifest is read.
    """
    with MetadataCachingTransaction(table) as tx:
        if properties:
            tx.set_properties(dict(properties))
        producer = _with_snapshot_id(tx.update_snapshot(snapshot_properties=dict(summary)).overwrite(), snapshot_id)
        # An unpartitioned table's manifests are pruned by this predicate alone (the deleted files' partitions
        # select nothing there), so it must cover every file deleted.
        producer.delete_by_predicate(conflict_filter if conflict_filter is not None else AlwaysTrue())
        for data_file in deleted:
            producer.delete_data_file(data_file)
        for data_file in added:
            producer.append_data_file(data_file)
        producer.commit()
    return table


def row_delta(
    table: Table,
    data_files: Sequence[DataFile],
    delete_files: Sequence[DataFile],
    snapshot_id: int,
    summary: Mapping[str, str],
    properties: Mapping[str, str] | None = None,
) -> Table:
    """Commit one ``overwrite`` snapshot with the given id and summary that adds ``data_files`` and the position
    delete files ``delete_files`` (``outbox.position_deletes``) and removes nothing, and set ``properties`` in the
    same metadata commit; returns the table at the new snapshot. The catalog commit requires the branch head to be
    the one the caller planned on (as every pyiceberg commit does), so deletes planned on an older head never land.
    """
    with MetadataCachingTransaction(table) as tx:
        if properties:
            tx.set_properties(dict(properties))
        producer = _RowDelta(
            operation=Operation.OVERWRITE,
            transaction=tx,
            io=table.io,
            snapshot_properties=dict(summary),
            delete_files=delete_files,
        )
        _with_snapshot_id(producer, snapshot_id)
        for data_file in data_files:
            producer.append_data_file(data_file)
        producer.commit()
    return table


class _RowDelta(_FastAppendFiles):
    """A fast append that also adds position delete files, in manifests of content ``DELETES`` (one per partition
    spec), and counts them in the snapshot's summary (``added-position-delete-files``, ``added-position-deletes``)."""

    def __init__(self, *args: Any, delete_files: Sequence[DataFile], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._delete_files = list(delete_files)

    def _process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        from outbox.position_deletes import DeleteManifestWriter

        by_spec: dict[int, list[DataFile]] = {}
        for f in self._delete_files:
            by_spec.setdefault(f.spec_id, []).append(f)
        added = []
        for spec_id, files in by_spec.items():
            writer = DeleteManifestWriter(
                spec=self.spec(spec_id),
                schema=self.schema(),
                output_file=self.new_manifest_output(),
                snapshot_id=self._snapshot_id,
                avro_compression=self._compression,
            )
            with writer:
                for f in files:
                    writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, data_file=f))
            added.append(writer.to_manifest_file())
        return super()._process_manifests(added + manifests)

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        # pyiceberg's summary collector counts delete files by their content; the data manifest is written already
        # (_commit writes manifests first), so the delete files are listed beside the data files for the count only.
        data_files = self._added_data_files
        self._added_data_files = [*data_files, *self._delete_files]
        try:
            return super()._summary(snapshot_properties)
        finally:
            self._added_data_files = data_files


def write_data_files(table: Table, rows: pa.Table) -> list[DataFile]:
    """Write ``rows`` (in the table's current schema) as new data files under the table's data location, split
    by partition and target file size as pyiceberg's own writes are; nothing is committed."""
    if rows.num_rows == 0:
        return []
    return list(_dataframe_to_data_files(table_metadata=table.metadata, df=rows, io=table.io))


def _with_snapshot_id(producer: Any, snapshot_id: int) -> Any:
    if not hasattr(producer, _PRIVATE_SNAPSHOT_ID_ATTRIBUTE):
        raise RuntimeError("pyiceberg's snapshot producer no longer has _snapshot_id; see outbox/snapshot_producer.py")
    setattr(producer, _PRIVATE_SNAPSHOT_ID_ATTRIBUTE, snapshot_id)
    return producer
