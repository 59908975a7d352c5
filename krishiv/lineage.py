"""A table's snapshot lineage, oldest first, with the identity Krishiv stamps into each summary."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from pyiceberg.table import Table

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
            )
        )
    return rows
