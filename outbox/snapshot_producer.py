"""The one place Krishiv reaches into pyiceberg's private API: choosing a snapshot's id up front.

pyiceberg's ``_SnapshotProducer`` draws a random snapshot id when it is built and keeps it across its own
retries. The outbox needs the id chosen at staging time (written to the ledger before any commit), so it
sets ``_snapshot_id`` before the producer writes its manifests. ``tests/outbox/test_snapshot_producer.py``
breaks if pyiceberg renames or stops honouring that attribute.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

_PRIVATE_SNAPSHOT_ID_ATTRIBUTE = "_snapshot_id"


def new_snapshot_id() -> int:
    """A random positive 63-bit id, as Iceberg's Java and Python implementations draw them."""
    return secrets.randbits(63) or 1


def fast_append(table: Table, data_files: Sequence[DataFile], snapshot_id: int, summary: Mapping[str, str]) -> Table:
    """Commit one fast-append snapshot with the given id and summary; returns the table at the new snapshot.

    A transaction commits only when the ``with`` block exits cleanly, so a failure anywhere above the
    catalog call leaves the table untouched.
    """
    with table.transaction() as tx:
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
