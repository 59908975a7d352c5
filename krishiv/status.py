"""Operational status of a pipeline: outbox backlog per table, totals, last commit and consumer lag per partition.

A batch's counts (records read, rejects, late events) are on the entry of the pipeline's first table
(``pipeline.tables[0]``); each other table's entries count its own rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from krishiv.maintenance import maintenance_lease_name
from krishiv_core.entries import OutboxEntry
from krishiv_core.spec import KrishivSpec
from outbox.ledger import Ledger
from outbox.ledger.entries import PendingBatch
from outbox.ledger.leases import StagerLease
from outbox.ledger.queries import BatchCounts

#: ``krishiv status`` warns of batches pending longer than this many seconds (``KRISHIV_STATUS_PENDING_S``).
PENDING_AGE_ENV = "KRISHIV_STATUS_PENDING_S"
DEFAULT_PENDING_AGE_S = 600.0


@dataclass
class PartitionLag:
    partition: str
    latest: int | None  # the broker's high watermark, None if the broker did not answer
    staged: int  # end offset of the newest staged batch
    committed: int  # end offset of the newest committed batch
    topic: str | None = None  # a pipeline over several topics: whose partition

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
    #: (batch id, late events) of the recent batches that had late events, newest first (:func:`late_batches`);
    #: the events are rows of the pipeline's rejects table.
    late_batches: list[tuple[int, int]] = field(default_factory=list)
    last_commit_at: datetime | None = None
    last_snapshot_id: int | None = None
    partitions: list[PartitionLag] = field(default_factory=list)
    broker_error: str | None = None
    tables: list[TableStatus] = field(default_factory=list)  # the first table, then ``other_tables``
    #: The leases held on it, live or expired: its stager lease, then each table's maintenance lease.
    leases: list[StagerLease] = field(default_factory=list)


def end_offsets(entries: list[OutboxEntry], topic: str) -> dict[str, int]:
    """Per partition, the highest end offset among ``entries`` (see :meth:`Ledger.end_offsets` for the ledger's)."""
    ends: dict[str, int] = {}
    for e in entries:
        for p, (_start, end) in e.offsets.get(topic, {}).items():
            ends[p] = max(ends.get(p, 0), end)
    return ends


def late_batches(recent: Sequence[BatchCounts]) -> list[tuple[int, int]]:
    """(batch id, late events) of the ``recent`` batches that had late events, in their order."""
    return [(b.batch_id, b.late_events) for b in recent if b.late_events]


def pipeline_status(
    ledger: Ledger,
    pipeline: str,
    table: str,
    topic: str,
    latest: dict[str, int] | None,
    broker_error: str | None = None,
    other_tables: Sequence[str] = (),
    topics: Mapping[str, dict[str, int] | None] | None = None,
) -> PipelineStatus:
    """The pipeline's status from aggregate reads of the ledger (compacted entries included): the batch counts
    and offsets from ``table``, the first table's entries, and the outbox of it and each of ``other_tables``.
    ``topics``: a pipeline over several topics, each topic's high watermarks (None if unread), whose partitions
    are shown each with its topic."""
    summary = ledger.table_summary(table, pipeline=pipeline, topic=topic)
    status = PipelineStatus(
        pipeline,
        table,
        pending=summary.pending,
        committed=summary.committed,
        records_read=summary.records_read,
        rejects=summary.rejects,
        late_events=summary.late_events,
        late_batches=late_batches(ledger.recent_batches(table, pipeline=pipeline)) if summary.late_events else [],
        last_commit_at=summary.last_commit_at,
        last_snapshot_id=summary.last_snapshot_id,
        broker_error=broker_error,
    )
    status_tables = (table, *other_tables)
    for name in status_tables:
        t = summary if name == table else ledger.table_summary(name, pipeline=pipeline)
        status.tables.append(
            TableStatus(name, t.pending, t.committed, t.committed_records, t.last_commit_at, t.last_snapshot_id)
        )
    names = [pipeline, *map(maintenance_lease_name, status_tables)]
    held = {lease.pipeline: lease for lease in ledger.leases(names)}
    status.leases = [held[name] for name in names if name in held]  # the stager's first
    if topics is None:
        status.partitions = _lags(summary.staged_offsets, summary.committed_offsets, latest, None)
        return status
    for t, marks in topics.items():
        of_topic = ledger.table_summary(table, pipeline=pipeline, topic=t)
        status.partitions += _lags(of_topic.staged_offsets, of_topic.committed_offsets, marks, t)
    return status


def _lags(
    staged: Mapping[str, int], done: Mapping[str, int], latest: Mapping[str, int] | None, topic: str | None
) -> list[PartitionLag]:
    parts = sorted(set(staged) | set(latest or {}), key=int)
    return [PartitionLag(p, (latest or {}).get(p), staged.get(p, 0), done.get(p, 0), topic) for p in parts]


@dataclass(frozen=True)
class BrokerSide:
    """What the broker says of the pipeline's topic now (None where it did not answer)."""

    earliest: Mapping[str, int] | None = None
    topic_id: str | None = None


def read_broker_side(spec: KrishivSpec, topic: str) -> tuple[dict[str, int], BrokerSide]:
    """The topic's high watermarks and what ``status`` and ``check`` compare with the ledger, through one client.
    Raises :class:`~spark_jobs.errors.KafkaSourceError` (the topic missing, say)."""
    from spark_jobs.kafka_source import KafkaAdmin

    with KafkaAdmin(spec.kafka.bootstrap_servers, topic, spec.kafka.consumer_settings()) as admin:
        return admin.latest(), BrokerSide(admin.earliest(), admin.topic_id())


def status_warnings(
    s: PipelineStatus,
    broker: BrokerSide,
    recorded_topic_id: str | None,
    pending: Sequence[PendingBatch],
    lease: StagerLease | None,
    now: datetime,
    pending_age_s: float = DEFAULT_PENDING_AGE_S,
) -> list[str]:
    """What ``status`` must not let pass silently, each a line with the way out: the topic is another incarnation
    than the batches were read from, offsets the query has not read are gone from the broker, batches wait to be
    committed, the stager's lease expired with no one running the pipeline."""
    warnings = []
    if broker.topic_id and recorded_topic_id and broker.topic_id != recorded_topic_id:
        warnings.append(
            f"topic re-created: its id is {broker.topic_id}, the last batch was read from {recorded_topic_id}; the "
            "next run stops and names the krishiv skip-offsets command to move on from the new topic's first offsets"
        )
    elif broker.earliest:
        for p in s.partitions:
            first = broker.earliest.get(p.partition)
            if first is not None and p.staged < first:
                warnings.append(
                    f"partition {p.partition}: offsets {p.staged} to {first - 1} were deleted by the broker's "
                    "retention before the query read them; the next run stops there: krishiv skip-offsets --pipeline "
                    f'{s.pipeline} --partition {p.partition} --to {first} --reason "…" moves on, recorded'
                )
    oldest = min((b.created_at for b in pending), default=None)
    if oldest is not None and now - oldest > timedelta(seconds=pending_age_s):
        minutes = (now - oldest).total_seconds() / 60
        warnings.append(
            f"{len(pending)} pending entries, the oldest staged {minutes:.0f} min ago: nothing is committing them; "
            "run krishiv commit (or krishiv run, or turn on Dagster's sensors)"
        )
    if lease is not None and not lease.alive(now):
        warnings.append(
            f"the stager lease of {lease.describe()} has expired: that run stopped without releasing it; the "
            "next krishiv run (or Dagster staging run) takes it over"
        )
    return warnings
