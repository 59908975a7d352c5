"""A table's snapshot lineage, oldest first, with the identity Krishiv stamps into each summary.

Three kinds of snapshot appear: a batch's (its query, batch id, high-water batch id and Kafka offsets), Krishiv's
own maintenance (a compaction: operation ``replace``, ``krishiv.maintenance``, no batch, as many rows added as
deleted; see ``outbox/compaction.py``), and anything else, another writer's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot

from outbox.compaction import SUMMARY_FOLDED_DELETES, SUMMARY_MAINTENANCE
from outbox.relay import SUMMARY_BATCH_ID, SUMMARY_HIGH_WATER, SUMMARY_OFFSETS, SUMMARY_QUERY_ID


@dataclass(frozen=True)
class LineageRow:
    snapshot_id: int
    parent_id: int | None
    committed_at: datetime
    operation: str
    query_id: str | None
    batch_id: int | None
    high_water_batch_id: int | None
    added_records: int
    offsets: dict | None
    summary: dict[str, str]
    deleted_records: int = 0
    maintenance: str | None = None  # Krishiv's maintenance (``compaction``) for one of its own maintenance snapshots

    @property
    def writer(self) -> str:
        """Who made the snapshot: ``batch``, ``maintenance`` or ``other``."""
        if self.query_id is not None:
            return "batch"
        return "maintenance" if self.maintenance is not None else "other"


def maintenance_of(snapshot: Snapshot) -> str | None:
    """The maintenance a snapshot is (``compaction``), if it is one of Krishiv's: a ``replace`` that names it,
    carries no batch, and adds exactly the rows it deletes, less those its folded position deletes had deleted.
    Anything else is not trusted as maintenance."""
    summary = snapshot.summary
    if summary is None or summary.operation != Operation.REPLACE:
        return None
    kind = summary.get(SUMMARY_MAINTENANCE)
    if kind is None or summary.get(SUMMARY_QUERY_ID) is not None or summary.get(SUMMARY_BATCH_ID) is not None:
        return None
    folded = int(summary.get(SUMMARY_FOLDED_DELETES) or 0)
    if int(summary.get("added-records") or 0) != int(summary.get("deleted-records") or 0) - folded:
        return None
    return kind


def lineage(table: Table) -> list[LineageRow]:
    """Snapshots in commit order (sequence number), oldest first."""
    rows = []
    for snap in sorted(table.snapshots(), key=lambda s: (s.sequence_number or 0, s.timestamp_ms)):
        summary = dict(snap.summary.additional_properties) if snap.summary else {}
        rows.append(
            LineageRow(
                snapshot_id=snap.snapshot_id,
                parent_id=snap.parent_snapshot_id,
                committed_at=datetime.fromtimestamp(snap.timestamp_ms / 1000, UTC),
                operation=str(snap.summary.operation.value) if snap.summary else "",
                query_id=summary.get(SUMMARY_QUERY_ID),
                batch_id=int(summary[SUMMARY_BATCH_ID]) if SUMMARY_BATCH_ID in summary else None,
                high_water_batch_id=int(summary[SUMMARY_HIGH_WATER]) if SUMMARY_HIGH_WATER in summary else None,
                added_records=int(summary.get("added-records", 0)),
                offsets=json.loads(summary[SUMMARY_OFFSETS]) if SUMMARY_OFFSETS in summary else None,
                summary=summary,
                deleted_records=int(summary.get("deleted-records", 0)),
                maintenance=maintenance_of(snap),
            )
        )
    return rows
