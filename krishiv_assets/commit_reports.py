"""What a table asset's materialization says about the commits it stands for, and who made them.

A table is materialized by a commit run's step (every commit the run made) and by the outbox sensor for each commit
made elsewhere (:func:`commit_materialization`). Dagster plots every numeric metadata value of an asset's
materializations against their time, so what a user watches over time is a number and what merely names something
is text (or JSON), which the UI shows without plotting.

Plotted (numbers), on every table's materialization:

- ``rows_added``, ``bytes_added``: what the commits' snapshots added (the snapshot summaries' ``added-records`` and
  ``added-files-size``), 0 for a batch with nothing to publish;
- ``rows_committed``: the rows the ledger staged for those batches; ``snapshots_committed``;
- ``staged_to_committed_s``: freshness, seconds from a batch's staging (its ledger entry) to its commit (a commit
  run: the longest of its batches);
- ``commit_latency_ms`` (a reported commit) or ``commit_latency_p50_ms``/``commit_latency_max_ms`` (a run): the
  catalog call;
- ``lag_records`` (a reported commit): records of the topic beyond the batch, when the sensor reported it (the
  broker asked once per tick; a commit run does not ask it, which would load the Kafka client and Spark with it);
- ``pending_entries``; ``dagster/row_count`` (the table's rows after the commit);

and on the pipeline's first table, whose entries carry each batch's counts: ``rejects`` and ``late_events`` of the
committed batches (the rejects table's ``rows_added`` are the same rejects as rows).

Text: ``batch_id``, ``snapshot_id`` (``none`` for a batch that published nothing), ``current_snapshot_id``,
``query_id``, ``kafka_offsets``, ``committed_by``; ``committed_at`` is a timestamp, ``committed_batches`` JSON.

``committed_by`` names the process that made the commit, as the ledger recorded it: ``krishiv run`` (its committer),
``krishiv commit``, or ``dagster run <run id>`` (a commit run, or a lingering staging run's committer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import dagster as dg

from krishiv_core.entries import OffsetRanges
from outbox.ledger import Ledger
from outbox.ledger.entries import PendingBatch
from outbox.ledger.queries import CommitRecord

if TYPE_CHECKING:
    from pyiceberg.table import Table

#: A batch's counts as its first table's entry records them (``records_read``, ``rejects``, ``late_events``, …).
Counts = Mapping[str, int]

#: How a Dagster run names itself in the ledger (``committed_by``), followed by its run id.
DAGSTER_COMMITTER = "dagster run"
#: Partitions named in a reported commit's offsets before the rest are counted.
SHOWN_PARTITIONS = 8
#: The snapshot summary's counts of what a snapshot added.
ADDED_RECORDS, ADDED_BYTES, TOTAL_RECORDS = "added-records", "added-files-size", "total-records"


def dagster_committer(run_id: str) -> str:
    """``committed_by`` of the commits a Dagster run makes: ``dagster run <run id>``."""
    return f"{DAGSTER_COMMITTER} {run_id}"


def dagster_run_id(committed_by: str | None) -> str | None:
    """The run id in a ``dagster run <run id>`` committer, None for any other committer."""
    prefix = f"{DAGSTER_COMMITTER} "
    if committed_by is None or not committed_by.startswith(prefix):
        return None
    return committed_by[len(prefix) :].strip() or None


def identifier(value: int | str | None) -> dg.MetadataValue:
    """An id as text: shown on the asset's page, never plotted."""
    return dg.MetadataValue.text("none" if value is None else str(value))


def offsets_text(offsets: OffsetRanges) -> str:
    """A batch's offsets in a line: ``orders 0:[10,20) 1:[5,9)``, the first partitions only when there are many."""
    parts = []
    for topic, ranges in sorted(offsets.items()):
        shown = [f"{p}:[{start},{end})" for p, (start, end) in list(ranges.items())[:SHOWN_PARTITIONS]]
        more = len(ranges) - len(shown)
        parts.append(" ".join([topic, *shown] + ([f"(+{more} partitions)"] if more > 0 else [])))
    return "; ".join(parts)


def lag_records(offsets: OffsetRanges, topic: str, latest: Mapping[str, int]) -> int:
    """Records of ``topic`` beyond a batch's end offsets, given the topic's end offsets ``latest``; a partition the
    batch did not cover counts whole."""
    ends = {p: end for p, (_start, end) in offsets.get(topic, {}).items()}
    return sum(max(0, end - ends.get(p, 0)) for p, end in latest.items())


def added(summaries: Iterable[Mapping[str, str] | None]) -> dict[str, int]:
    """``rows_added`` and ``bytes_added`` of snapshots, from their summaries (a missing count is 0)."""
    rows = bytes_ = 0
    for summary in summaries:
        rows += int((summary or {}).get(ADDED_RECORDS, 0))
        bytes_ += int((summary or {}).get(ADDED_BYTES, 0))
    return {"rows_added": rows, "bytes_added": bytes_}


def batch_counts(ledger: Ledger, commits: Iterable[CommitRecord], first_table: str) -> dict[tuple[str, int], Counts]:
    """Each commit's batch counts (records read, rejects, late events), by (query id, batch id), from the entry of
    ``first_table`` (it carries them); one ledger read per batch committed to that table."""
    counts: dict[tuple[str, int], Counts] = {}
    for c in commits:
        if c.table == first_table and (c.query_id, c.batch_id) not in counts:
            entry = ledger.get(c.query_id, first_table, c.batch_id)
            counts[(c.query_id, c.batch_id)] = entry.metrics if entry is not None else {}
    return counts


def batch_metadata(counts: Iterable[Counts]) -> dict[str, int]:
    """``rejects`` and ``late_events`` summed over batches' counts."""
    counted = list(counts)
    return {
        "rejects": sum(int(c.get("rejects", 0)) for c in counted),
        "late_events": sum(int(c.get("late_events", 0)) for c in counted),
    }


@dataclass
class CommitFacts:
    """What a sensor tick learned about the commits it reports, beyond the ledger's commit records: the snapshot
    summaries (by table and snapshot id), each batch's counts, and the topic's end offsets (None: not known)."""

    summaries: dict[tuple[str, int], Mapping[str, str]] = field(default_factory=dict)
    counts: dict[tuple[str, int], Counts] = field(default_factory=dict)
    latest: Mapping[str, int] | None = None


def gather_facts(
    commits: Sequence[CommitRecord],
    *,
    ledger: Ledger,
    first_table: str,
    load_table: Callable[[str], Table],
    latest_offsets: Callable[[], Mapping[str, int]],
    warn: Callable[[str], None],
) -> CommitFacts:
    """The facts for reporting ``commits``: each table they touch loaded once, one ledger read per batch of the first
    table, the broker asked once. Each is optional: what fails is said through ``warn`` and left out of the
    metadata, never the reason a tick fails (the commits are still reported)."""
    facts = CommitFacts()
    if not commits:
        return facts
    for table_name in sorted({c.table for c in commits if c.committed_snapshot_id is not None}):
        try:
            table = load_table(table_name)
            for c in commits:
                if c.table == table_name and c.committed_snapshot_id is not None:
                    snapshot = table.metadata.snapshot_by_id(c.committed_snapshot_id)
                    if snapshot is not None and snapshot.summary is not None:
                        facts.summaries[(table_name, c.committed_snapshot_id)] = snapshot.summary.additional_properties
        except Exception as exc:  # a tick must report what it can: the catalog may be away
            warn(f"snapshot summaries of {table_name} not read ({type(exc).__name__}: {exc}); reported without them")
    try:
        facts.counts = batch_counts(ledger, commits, first_table)
    except Exception as exc:  # the ledger is busy: reported without the batches' counts
        warn(f"batch counts not read ({type(exc).__name__}: {exc}); reported without them")
    try:
        facts.latest = latest_offsets()
    except Exception as exc:  # the broker is away: reported without the lag
        warn(f"topic end offsets not read ({type(exc).__name__}: {exc}); reported without lag_records")
    return facts


def commit_materialization(
    commit: CommitRecord,
    key: dg.AssetKey,
    pending: int,
    facts: CommitFacts,
    first_table: str,
    topic: str,
    tags: Mapping[str, str] | None = None,
) -> dg.AssetMaterialization:
    """One commit made outside a commit run as a materialization of its table's asset; a batch that published
    nothing too (its table is then up to date through it, which its freshness policy counts). ``tags``: its data
    version and provenance (:func:`krishiv_assets.data_versions.table_tags`)."""
    published = commit.committed_snapshot_id is not None
    metadata: dict[str, object] = {
        "batch_id": identifier(commit.batch_id),
        "snapshot_id": identifier(commit.committed_snapshot_id),
        "query_id": identifier(commit.query_id),
        "kafka_offsets": offsets_text(commit.offsets),
        "committed_by": commit.committed_by or "unknown",
        "committed_at": dg.MetadataValue.timestamp(commit.committed_at),
        "snapshots_committed": 1 if published else 0,
        "rows_committed": commit.record_count,
        "staged_to_committed_s": round(commit.staged_to_committed_s, 3),
        "pending_entries": pending,
    }
    summary = facts.summaries.get((commit.table, commit.committed_snapshot_id or -1))
    if summary is not None or not published:
        metadata.update(added([summary]))
    if summary is not None and TOTAL_RECORDS in summary:
        metadata["dagster/row_count"] = int(summary[TOTAL_RECORDS])
    if commit.commit_ms is not None:
        metadata["commit_latency_ms"] = round(commit.commit_ms, 2)
    if facts.latest is not None:
        metadata["lag_records"] = lag_records(commit.offsets, topic, facts.latest)
    counts = facts.counts.get((commit.query_id, commit.batch_id))
    if commit.table == first_table and counts is not None:
        metadata.update(batch_metadata([counts]))
    what = "committed" if published else "committed with nothing to publish"
    return dg.AssetMaterialization(
        asset_key=key,
        description=f"batch {commit.batch_id} {what} by {commit.committed_by or 'another process'}",
        metadata=metadata,
        tags=tags,
    )


def pending_by_table(pending: Sequence[PendingBatch]) -> dict[str, int]:
    waiting: dict[str, int] = {}
    for e in pending:
        waiting[e.table] = waiting.get(e.table, 0) + 1
    return waiting
