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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import update_table_metadata

_PRIVATE_SNAPSHOT_ID_ATTRIBUTE = "_snapshot_id"


class MetadataCachingTransaction(Transaction):
    """A transaction whose ``table_metadata`` is computed once per state of the table and staged updates."""

    _cached: tuple[TableMetadata, tuple, TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        if not updates:
            return base  # pyiceberg models are frozen and never changed in place; copying protects nothing
        cached = self._cached
        if cached is None or cached[0] is not base or cached[1] is not updates:
            cached = (base, updates, update_table_metadata(base, updates))
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
        producer = tx.update_snapshot(snapshot_properties=dict(summary)).fast_append()
        if not hasattr(producer, _PRIVATE_SNAPSHOT_ID_ATTRIBUTE):
            raise RuntimeError(
                "pyiceberg's snapshot producer no longer has _snapshot_id; see outbox/snapshot_producer.py"
            )
        setattr(producer, _PRIVATE_SNAPSHOT_ID_ATTRIBUTE, snapshot_id)
        for data_file in data_files:
            producer.append_data_file(data_file)
        producer.commit()
    return table
