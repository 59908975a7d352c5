"""Operational status of a pipeline: outbox backlog per table, totals, last commit and consumer lag per partition.

A batch's counts (records read, rejects, late events) are on the entry of the pipeline's first table
(``pipeline.tables[0]``); each other table's entries count its own rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from krishiv_core.entries import OutboxEntry
from outbox.ledger import Ledger


@dataclass
class PartitionLag:
    partition: str
    latest: int | None  # the broker's high watermark, None if the broker did not answer
    staged: int  # end offset of the newest staged batch
    committed: int  # end offset of the newest committed batch

    @property
    def lag(self) -> int | None:
        return None if self.latest is None else max(0, self.latest - self.committed)


@dataclass
class TableStatus:
    """One table's outbox: entries by status, the rows its committed entries staged, its last commit."""

    table: str
    pending: int = 0
    committed: int = 0
    rows_staged: int = 0  # an append table received these rows; a merge table had rows of these keys replaced
    last_commit_at: datetime | None = None
    last_snapshot_id: int | None = None


@dataclass
class PipelineStatus:
    pipeline: str
    table: str  # the first table: the batch's counts and the offsets come from its entries
    pending: int = 0
    committed: int = 0
    records_read: int = 0
    rejects: int = 0
    late_events: int = 0
    last_commit_at: datetime | None = None
    last_snapshot_id: int | None = None
    partitions: list[PartitionLag] = field(default_factory=list)
    broker_error: str | None = None
    tables: list[TableStatus] = field(default_factory=list)  # the first table, then ``other_tables``


def end_offsets(entries: list[OutboxEntry], topic: str) -> dict[str, int]:
    """Per partition, the highest end offset among ``entries`` (see :meth:`Ledger.end_offsets` for the ledger's)."""
    ends: dict[str, int] = {}
    for e in entries:
        for p, (_start, end) in e.offsets.get(topic, {}).items():
            ends[p] = max(ends.get(p, 0), end)
    return ends


def pipeline_status(
    ledger: Ledger,
    pipeline: str,
    table: str,
    topic: str,
    latest: dict[str, int] | None,
    broker_error: str | None = None,
    other_tables: Sequence[str] = (),
) -> PipelineStatus:
    """The pipeline's status from aggregate reads of the ledger (compacted entries included): the batch counts
    and offsets from ``table``, the first table's entries, and the outbox of it and each of ``other_tables``."""
    summary = ledger.table_summary(table, pipeline=pipeline, topic=topic)
    status = PipelineStatus(
        pipeline,
        table,
        pending=summary.pending,
        committed=summary.committed,
        records_read=summary.records_read,
        rejects=summary.rejects,
        late_events=summary.late_events,
        last_commit_at=summary.last_commit_at,
        last_snapshot_id=summary.last_snapshot_id,
        broker_error=broker_error,
    )
    for name in (table, *other_tables):
        t = summary if name == table else ledger.table_summary(name, pipeline=pipeline)
        status.tables.append(
            TableStatus(name, t.pending, t.committed, t.committed_records, t.last_commit_at, t.last_snapshot_id)
        )
    staged, done = summary.staged_offsets, summary.committed_offsets
    for p in sorted(set(staged) | set(latest or {}), key=int):
        status.partitions.append(PartitionLag(p, (latest or {}).get(p), staged.get(p, 0), done.get(p, 0)))
    return status
