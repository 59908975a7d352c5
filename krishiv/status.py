"""Operational status of a pipeline: outbox backlog, totals, last commit and consumer lag per partition."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from outbox.ledger import COMMITTED, PENDING, Ledger, OutboxEntry


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
    entries = [e for e in ledger.entries(table=table) if e.pipeline == pipeline]
    status = PipelineStatus(pipeline, table, broker_error=broker_error)
    committed = [e for e in entries if e.status == COMMITTED]
    status.pending = sum(1 for e in entries if e.status == PENDING)
    status.committed = len(committed)
    for e in entries:
        status.records_read += e.metrics.get("records_read", 0)
        status.rejects += e.metrics.get("rejects", 0)
        status.late_events += e.metrics.get("late_events", 0)
    with_snapshot = [e for e in committed if e.committed_at is not None]
    if with_snapshot:
        last = max(with_snapshot, key=lambda e: e.committed_at)
        status.last_commit_at = last.committed_at
        status.last_snapshot_id = max(
            (e for e in with_snapshot if e.committed_snapshot_id is not None),
            key=lambda e: e.committed_at,
            default=last,
        ).committed_snapshot_id
    staged, done = end_offsets(entries, topic), end_offsets(committed, topic)
    for p in sorted(set(staged) | set(latest or {}), key=int):
        status.partitions.append(PartitionLag(p, (latest or {}).get(p), staged.get(p, 0), done.get(p, 0)))
    return status
