"""Operational status of a pipeline: outbox backlog, totals, last commit and consumer lag per partition."""

from __future__ import annotations

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
class PipelineStatus:
    pipeline: str
    table: str
    pending: int = 0
    committed: int = 0
    records_read: int = 0
    rejects: int = 0
    late_events: int = 0
    last_commit_at: datetime | None = None
    last_snapshot_id: int | None = None
    partitions: list[PartitionLag] = field(default_factory=list)
    broker_error: str | None = None


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
) -> PipelineStatus:
    """The pipeline's status from one aggregate read of the ledger (compacted entries included)."""
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
    staged, done = summary.staged_offsets, summary.committed_offsets
    for p in sorted(set(staged) | set(latest or {}), key=int):
        status.partitions.append(PartitionLag(p, (latest or {}).get(p), staged.get(p, 0), done.get(p, 0)))
    return status
