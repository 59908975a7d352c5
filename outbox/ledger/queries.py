"""The read side: the totals and lookups of ``krishiv status``, the Dagster sensors and checks, and ``verify``.

What the hot paths read is answered in SQL, never by loading every entry: the offset ranges of
``outbox_offsets`` and the metric columns of ``outbox`` are summed there, with the archive rows that
:mod:`outbox.ledger.retention` folds old COMMITTED entries into, so every total still counts compacted batches.
The start-up checks' lookups (which batches and queries the ledger knows) are here too. A read that
needs several results takes them in one open of the file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from krishiv_core.entries import COMMITTED, OffsetRanges
from krishiv_core.reject_rate import RECENT_BATCHES, RejectRate
from outbox.ledger.connection import LedgerConnection, column_rows
from outbox.ledger.dialect import Dialect
from outbox.ledger.schema import COMMIT_ORDER


@dataclass(frozen=True)
class CommitRecord:
    """One commit as the ledger recorded it, for reporting (the Dagster outbox sensor): no files, no metrics.

    ``commit_seq`` orders commits as they reached the ledger; ``committed_snapshot_id`` is None when the batch
    published nothing (or its snapshot had expired when it was found committed); ``commit_ms`` is the catalog
    call's duration when the committing process made it (None when it found the batch already committed).
    """

    commit_seq: int
    table: str
    pipeline: str
    query_id: str
    batch_id: int
    committed_snapshot_id: int | None
    record_count: int
    offsets: OffsetRanges
    created_at: datetime
    committed_at: datetime
    committed_by: str | None
    commit_ms: float | None

    @property
    def staged_to_committed_s(self) -> float:
        """Seconds from the batch's staging (its entry recorded) to its commit."""
        return (self.committed_at - self.created_at).total_seconds()


#: How many of a table's newest entries ``krishiv status`` and the Dagster ``late_events`` check look at.
RECENT_LATE_BATCHES = 20


@dataclass(frozen=True)
class BatchCounts:
    """One batch's counts, as its first table's entry records them."""

    batch_id: int
    records_read: int
    rejects: int
    late_events: int


@dataclass(frozen=True)
class TableSummary:
    """What a table's entries add up to, the archive included (counts are entries, one per batch)."""

    table: str
    pending: int = 0
    committed: int = 0
    archived: int = 0  # of ``committed``, how many were folded into the archive
    records_read: int = 0
    rejects: int = 0
    late_events: int = 0
    committed_records: int = 0  # staged records of the COMMITTED entries: the rows the table received
    last_commit_at: datetime | None = None
    last_snapshot_id: int | None = None
    oldest_pending_at: datetime | None = None
    staged_offsets: dict[str, int] = field(default_factory=dict)  # filled when a topic is given
    committed_offsets: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CommittedBatches:
    """A table's COMMITTED batches: the staged record count of each entry still in the ledger, and the archive's."""

    records: dict[tuple[str, int], int]  # (query id, batch id) -> staged records
    archived_through: dict[str, int]  # query id -> highest batch id folded into the archive
    archived_records: int = 0
    #: The batches committed as a snapshot (a committed snapshot id), rows or not: a merge that only deletes too.
    published: frozenset[tuple[str, int]] = frozenset()

    @property
    def total_records(self) -> int:
        return sum(self.records.values()) + self.archived_records

    def includes(self, query_id: str, batch_id: int) -> bool:
        return (query_id, batch_id) in self.records or batch_id <= self.archived_through.get(query_id, -1)


#: The topic id (incarnation) of the table's newest entry that recorded one; its one parameter is the table.
_NEWEST_TOPIC_ID = (
    "(SELECT topic_id FROM outbox WHERE table_name = ? AND topic_id IS NOT NULL AND topic_id <> '' "
    "ORDER BY created_at DESC, batch_id DESC LIMIT 1)"
)


def _current_incarnation(dialect: Dialect, table: str) -> tuple[str, str, list[Any], str, list[Any]]:
    """How to keep only the offsets the table read from the topic's newest incarnation: a topic deleted and
    re-created starts its offsets at 0 again, so the old incarnation's ends say nothing of the new one's (taken
    together, the highest would hide the new topic's records until its offsets passed the old ones).

    Returns the join and WHERE condition for ``outbox_offsets f`` (an anti-join on the entries read from another
    known incarnation: normally none, so it costs little) with their parameters, and the condition for
    ``outbox_archive_ranges a`` with its. An entry without a recorded topic id counts as the newest incarnation's,
    as the source compares no unknown id."""
    join, unmatched = dialect.keyed_join(
        False,
        "SELECT query_id, batch_id FROM outbox WHERE table_name = ? AND topic_id IS NOT NULL AND topic_id <> '' "
        f"AND topic_id <> {_NEWEST_TOPIC_ID}",
        "x",
        "query_id, batch_id",
    )
    archive = f"(a.topic_id = '' OR {_NEWEST_TOPIC_ID} IS NULL OR a.topic_id = {_NEWEST_TOPIC_ID})"
    return join, unmatched, [table, table], archive, [table, table]


def _end_offsets_query(
    dialect: Dialect, table: str, topic: str, status: str | None = None, pipeline: str | None = None
) -> tuple[str, list[Any]]:
    """Per partition, the highest end offset of the table's entries (and archive) for a topic, in its newest
    incarnation (:func:`_current_incarnation`).

    The filters avoid joining every entry: a pipeline is its few query ids, and COMMITTED (nearly every
    entry) is everything but the few entries in another status (an anti-join; DuckDB plans a correlated
    NOT EXISTS as a join over every offset row, several times slower).
    """
    join, where, params = "", "f.table_name = ? AND f.topic = ?", []
    if status is not None:
        keep, op = (False, "<>") if status == COMMITTED else (True, "=")
        join, unmatched = dialect.keyed_join(
            keep,
            f"SELECT query_id, batch_id FROM outbox WHERE table_name = ? AND status {op} ?",
            "o",
            "query_id, batch_id",
        )
        where += f" AND {unmatched}" if unmatched else ""
        params += [table, status]
    other, other_unmatched, other_params, archive_current, archive_params = _current_incarnation(dialect, table)
    join += other
    where += f" AND {other_unmatched}" if other_unmatched else ""
    params += other_params
    params += [table, topic]
    if pipeline is not None:
        where += " AND f.query_id IN (SELECT DISTINCT query_id FROM outbox WHERE table_name = ? AND pipeline = ?)"
        params += [table, pipeline]
    parts = [f"SELECT f.partition, f.end_offset FROM outbox_offsets f{join} WHERE {where}"]
    if status in (None, COMMITTED):  # the archive holds COMMITTED entries only
        archive_join = " JOIN outbox_archive s USING (query_id, table_name)" if pipeline else ""
        archive_where = f"a.table_name = ? AND a.topic = ? AND {archive_current}" + (
            " AND s.pipeline = ?" if pipeline else ""
        )
        parts.append(
            f"SELECT a.partition, a.end_offset FROM outbox_archive_ranges a{archive_join} WHERE {archive_where}"
        )
        params += [table, topic, *archive_params] + ([pipeline] if pipeline else [])
    sql = (
        f"SELECT partition, max(end_offset) FROM ({' UNION ALL '.join(parts)}) AS u "
        f"GROUP BY partition ORDER BY {dialect.partition_order}"
    )
    return sql, params


def _staged_and_committed_query(
    dialect: Dialect, table: str, topic: str, pipeline: str | None = None
) -> tuple[str, list[Any]]:
    """Per partition, the highest end offset of all the table's entries and of its COMMITTED ones, in one pass, in
    the topic's newest incarnation (:func:`_current_incarnation`)."""
    other, other_unmatched, other_params, archive_current, archive_params = _current_incarnation(dialect, table)
    where, params = "f.table_name = ? AND f.topic = ?", [table, *other_params, table, topic]
    where += f" AND {other_unmatched}" if other_unmatched else ""
    if pipeline is not None:
        where += " AND f.query_id IN (SELECT DISTINCT query_id FROM outbox WHERE table_name = ? AND pipeline = ?)"
        params += [table, pipeline]
    archive_join = " JOIN outbox_archive s USING (query_id, table_name)" if pipeline else ""
    archive_where = f"a.table_name = ? AND a.topic = ? AND {archive_current}" + (
        " AND s.pipeline = ?" if pipeline else ""
    )
    params += [table, topic, *archive_params] + ([pipeline] if pipeline else [])
    sql = (
        "SELECT partition, max(end_offset), max(end_offset) FILTER (WHERE committed) FROM ("
        "SELECT f.partition, f.end_offset, o.batch_id IS NULL AS committed FROM outbox_offsets f "
        f"LEFT JOIN (SELECT query_id, batch_id FROM outbox WHERE table_name = ? AND status <> '{COMMITTED}') o "
        f"USING (query_id, batch_id){other} WHERE {where} "
        f"UNION ALL SELECT a.partition, a.end_offset, true FROM outbox_archive_ranges a{archive_join} "
        f"WHERE {archive_where}) AS u GROUP BY partition ORDER BY {dialect.partition_order}"
    )
    return sql, params


#: What a :class:`CommitRecord` is read from, in its fields' order.
_COMMIT_COLUMNS = (
    "commit_seq, table_name, pipeline, query_id, batch_id, committed_snapshot_id, record_count, offsets, created_at, "
    "committed_at, committed_by, commit_ms"
)


def _commit_records(rows: Sequence[tuple[Any, ...]]) -> list[CommitRecord]:
    return [
        CommitRecord(int(seq), table, pipeline, query, int(batch), snapshot, int(records), json.loads(offsets), *rest)
        for seq, table, pipeline, query, batch, snapshot, records, offsets, *rest in rows
    ]


class Queries(LedgerConnection):
    """Aggregates and lookups over the entries and the archive, each one read-only open of the file."""

    def commits_since(
        self, commit_seq: int, tables: Sequence[str] | None = None, limit: int = 50
    ) -> list[CommitRecord]:
        """The commits after ``commit_seq`` (of ``tables``, or all), oldest first, at most ``limit``.

        A cursor over the ledger's commits: pass the last record's ``commit_seq`` to read on. Only entries still
        in the ledger are read: commits that :meth:`compact` folded into the archive before a reader reached them
        are skipped (they are older than the retention), and commits recorded before schema version 8 have no
        sequence number and are never listed.
        """
        clause, params = "", [commit_seq]
        if tables is not None:
            if not tables:
                return []
            clause = f" AND table_name IN ({', '.join('?' * len(tables))})"
            params += list(tables)
        rows = self._read(
            f"SELECT {_COMMIT_COLUMNS} FROM outbox WHERE commit_seq > ?{clause} ORDER BY commit_seq LIMIT ?",
            [*params, limit],
        )
        return _commit_records(rows)

    def newest_commits(self, tables: Sequence[str], per_table: int, through: int) -> list[CommitRecord]:
        """The newest ``per_table`` commits of each of ``tables`` numbered at most ``through``, oldest first.

        What a reader that starts late shows of the history before it (the Dagster outbox sensor's first tick),
        bounded per table, then reads on with :meth:`commits_since` from ``through``: no commit is in both. As
        :meth:`commits_since`, only entries still in the ledger, and only those with a sequence number.
        """
        if not tables or per_table <= 0:
            return []
        rows = self._read(
            f"SELECT {_COMMIT_COLUMNS} FROM (SELECT {_COMMIT_COLUMNS}, "
            "row_number() OVER (PARTITION BY table_name ORDER BY commit_seq DESC) AS newest FROM outbox "
            f"WHERE commit_seq <= ? AND table_name IN ({', '.join('?' * len(tables))})) AS c "
            "WHERE newest <= ? ORDER BY commit_seq",
            [through, *tables, per_table],
        )
        return _commit_records(rows)

    def last_commit_seq(self) -> int:
        """The highest ``commit_seq`` given so far, 0 if none (a reader starting now reads on from it).

        From the sequence itself, so a commit compaction already folded away still counts.
        """
        rows = self._read(
            f"SELECT greatest((SELECT max(commit_seq) FROM outbox), ({self.dialect.last_sequence_value}))"
        )
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    def end_offsets(
        self, table: str, topic: str, status: str | None = None, pipeline: str | None = None
    ) -> dict[str, int]:
        """Per partition, the end offset of the newest batch of ``table`` covering ``topic`` (archive included).

        With ``status``, only entries in that status count; with ``pipeline``, only that pipeline's.
        """
        sql, params = _end_offsets_query(self.dialect, table, topic, status, pipeline)
        return {p: int(end) for p, end in self._read(sql, params)}

    def table_summary(self, table: str, pipeline: str | None = None, topic: str | None = None) -> TableSummary:
        """Counts by status, metric sums, the last commit and the oldest PENDING entry, archive included.

        With ``topic``, also the staged and committed end offsets per partition; all in one open of the file.
        """
        where, params = "table_name = ?", [table]
        if pipeline is not None:
            where += " AND pipeline = ?"
            params.append(pipeline)
        queries: list[tuple[str, Sequence[Any]]] = [
            (
                "SELECT count(*) FILTER (WHERE status = 'PENDING'), count(*) FILTER (WHERE status = 'COMMITTED'), "
                "sum(records_read), sum(rejects), sum(late_events), "
                "sum(record_count) FILTER (WHERE status = 'COMMITTED'), "
                "max(committed_at) FILTER (WHERE status = 'COMMITTED'), "
                + self.dialect.arg_max(
                    "committed_snapshot_id",
                    "committed_at",
                    "status = 'COMMITTED' AND committed_snapshot_id IS NOT NULL",
                )
                + ", "
                "max(committed_at) FILTER (WHERE status = 'COMMITTED' AND committed_snapshot_id IS NOT NULL), "
                f"min(created_at) FILTER (WHERE status = 'PENDING') FROM outbox WHERE {where}",
                params,
            ),
            (
                "SELECT sum(entries), sum(records_read), sum(rejects), sum(late_events), sum(record_count), "
                f"max(last_committed_at), {self.dialect.arg_max('last_snapshot_id', 'last_snapshot_at')}, "
                "max(last_snapshot_at) "
                f"FROM outbox_archive WHERE {where}",
                params,
            ),
        ]
        if topic is not None:
            queries.append(_staged_and_committed_query(self.dialect, table, topic, pipeline))
        results = self._reads(queries)
        if not results[0]:
            return TableSummary(table)
        (pending, committed, read, rejects, late, records, last_at, snap, snap_at, oldest) = results[0][0]
        (a_entries, a_read, a_rejects, a_late, a_records, a_last_at, a_snap, a_snap_at) = results[1][0]
        if a_snap_at is not None and (snap_at is None or a_snap_at > snap_at):
            snap = a_snap
        last = [t for t in (last_at, a_last_at) if t is not None]
        return TableSummary(
            table,
            pending=pending,
            committed=committed + int(a_entries or 0),
            archived=int(a_entries or 0),
            records_read=int(read or 0) + int(a_read or 0),
            rejects=int(rejects or 0) + int(a_rejects or 0),
            late_events=int(late or 0) + int(a_late or 0),
            committed_records=int(records or 0) + int(a_records or 0),
            last_commit_at=max(last, default=None),
            last_snapshot_id=snap,
            oldest_pending_at=oldest,
            staged_offsets={p: int(e) for p, e, _ in results[2]} if topic is not None else {},
            committed_offsets={p: int(c) for p, _, c in results[2] if c is not None} if topic is not None else {},
        )

    def recent_rejects(self, table: str, pipeline: str | None = None, batches: int = RECENT_BATCHES) -> RejectRate:
        """Records read and rejected by the newest ``batches`` entries of ``table`` (:meth:`recent_batches`)."""
        recent = self.recent_batches(table, pipeline, batches)
        return RejectRate(sum(b.records_read for b in recent), sum(b.rejects for b in recent), len(recent))

    def recent_batches(
        self, table: str, pipeline: str | None = None, batches: int = RECENT_LATE_BATCHES
    ) -> list[BatchCounts]:
        """The counts of the newest ``batches`` entries of ``table`` (a pipeline's first table, whose entries carry
        each batch's counts), pending or committed, newest first; with ``pipeline``, only its own. The archive holds
        only entries past the retention, never recent ones. A windowed batch's late events are rows of the
        pipeline's rejects table."""
        where, params = "table_name = ?", [table]
        if pipeline is not None:
            where += " AND pipeline = ?"
            params.append(pipeline)
        rows = self._read(
            f"SELECT batch_id, records_read, rejects, late_events FROM outbox WHERE {where} "
            "ORDER BY created_at DESC, batch_id DESC LIMIT ?",
            [*params, batches],
        )
        return [BatchCounts(int(b), int(read or 0), int(rej or 0), int(late or 0)) for b, read, rej, late in rows]

    def incarnations_reading(
        self, pipeline: str, topic: str, offsets: Sequence[tuple[int, int]]
    ) -> dict[tuple[int, int], int]:
        """For each ``(partition, offset)`` of ``offsets`` that a COMMITTED batch of ``pipeline`` read: from how many
        incarnations of ``topic`` (distinct topic ids; an unknown id counts as one), archive included. A topic
        deleted and re-created starts its offsets at 0 again, so each incarnation may put an offset in one row."""
        if not offsets:
            return {}
        rows = self._read(
            f"""
            WITH wanted AS ({self.dialect.zipped_pairs}),
            ranges AS (
                SELECT f.partition, f.start_offset, f.end_offset, coalesce(e.topic_id, '') AS topic_id
                FROM outbox_offsets f JOIN outbox e USING (query_id, table_name, batch_id)
                WHERE e.pipeline = ? AND e.status = ? AND f.topic = ?
                UNION ALL
                SELECT r.partition, r.start_offset, r.end_offset, r.topic_id
                FROM outbox_archive_ranges r JOIN outbox_archive a USING (query_id, table_name)
                WHERE a.pipeline = ? AND r.topic = ?
            )
            SELECT w.p, w.o, count(DISTINCT r.topic_id) FROM wanted w JOIN ranges r
                ON r.partition = CAST(w.p AS VARCHAR) AND w.o >= r.start_offset AND w.o < r.end_offset
            GROUP BY w.p, w.o
            """,
            [[int(p) for p, _ in offsets], [int(o) for _, o in offsets], pipeline, COMMITTED, topic, pipeline, topic],
        )
        return {(int(p), int(o)): int(n) for p, o, n in rows}

    def committed_batches(self, table: str) -> CommittedBatches:
        """The table's COMMITTED batches with their staged record counts (keys only, no JSON), archive included."""
        hot, archive = self._reads(
            [
                (
                    "SELECT query_id, batch_id, record_count, committed_snapshot_id IS NOT NULL FROM outbox "
                    f"WHERE table_name = ? AND status = ? ORDER BY {COMMIT_ORDER}",
                    [table, COMMITTED],
                ),
                ("SELECT query_id, max_batch_id, record_count FROM outbox_archive WHERE table_name = ?", [table]),
            ],
            columns=True,
        )
        hot, archive = column_rows(hot), column_rows(archive)
        return CommittedBatches(
            records={(q, b): int(n) for q, b, n, _ in hot},
            archived_through={q: int(b) for q, b, _ in archive},
            archived_records=sum(int(n) for _, _, n in archive),
            published=frozenset((q, b) for q, b, _, snapshot in hot if snapshot),
        )

    def last_committed_batch(self, query_id: str, table: str, at_most: int | None = None) -> int | None:
        """The highest COMMITTED batch of the query that gave ``table`` rows (archive included), None if none; with
        ``at_most``, the highest at or below it (an archived range reaching past it counts as its upper end's
        least possible batch, its ``min_batch_id``)."""
        bound = (1 << 62) if at_most is None else at_most
        rows = self._read(
            "SELECT greatest((SELECT max(batch_id) FROM outbox WHERE query_id = ? AND table_name = ? "
            "AND status = ? AND record_count > 0 AND batch_id <= ?), (SELECT max(least(max_batch_id, ?)) "
            "FROM outbox_archive WHERE query_id = ? AND table_name = ? AND record_count > 0 AND min_batch_id <= ?))",
            [query_id, table, COMMITTED, bound, bound, query_id, table, bound],
        )
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    def missing_batches(self, query_id: str, table: str, batch_ids: Sequence[int]) -> list[int]:
        """Those of ``batch_ids`` the ledger holds no entry of for the query and table (archived ones are held)."""
        if not batch_ids:
            return []
        hot, archive = self._reads(
            [
                (
                    "SELECT batch_id FROM outbox WHERE query_id = ? AND table_name = ? AND batch_id BETWEEN ? AND ?",
                    [query_id, table, min(batch_ids), max(batch_ids)],
                ),
                ("SELECT max_batch_id FROM outbox_archive WHERE query_id = ? AND table_name = ?", [query_id, table]),
            ]
        )
        held = {int(b) for (b,) in hot}
        archived_through = int(archive[0][0]) if archive else -1
        return sorted(b for b in set(batch_ids) if b not in held and b > archived_through)

    def tables(self) -> list[str]:
        return [
            r[0]
            for r in self._read("SELECT table_name FROM outbox UNION SELECT table_name FROM outbox_archive ORDER BY 1")
        ]

    def query_ids(self, pipeline: str) -> list[str]:
        """The pipeline's query ids, oldest first (the archive remembers when compacted queries began)."""
        return [
            r[0]
            for r in self._read(
                "SELECT query_id FROM (SELECT query_id, created_at FROM outbox WHERE pipeline = ? "
                "UNION ALL SELECT query_id, min_created_at FROM outbox_archive WHERE pipeline = ?) AS q "
                "GROUP BY query_id ORDER BY MIN(created_at), query_id",
                [pipeline, pipeline],
            )
        ]

    def newest_topic(self, pipeline: str) -> str | None:
        """The topic the pipeline's newest entry still in the ledger was read from (its offsets' topic), if any."""
        rows = self._read(
            "SELECT offsets FROM outbox WHERE pipeline = ? ORDER BY created_at DESC, batch_id DESC LIMIT 1", [pipeline]
        )
        topics = sorted(json.loads(rows[0][0])) if rows else []
        return topics[0] if topics else None

    def newest_metrics(self, table: str, pipeline: str) -> dict[str, int]:
        """The metrics of ``pipeline``'s newest entry of ``table`` still in the ledger (empty if none)."""
        rows = self._read(
            "SELECT metrics FROM outbox WHERE table_name = ? AND pipeline = ? ORDER BY created_at DESC, batch_id DESC "
            "LIMIT 1",
            [table, pipeline],
        )
        return json.loads(rows[0][0]) if rows else {}

    def newest_topic_id(self, table: str) -> str | None:
        """The topic id (incarnation) the table's newest entry still in the ledger was read from, if recorded."""
        rows = self._read(
            "SELECT topic_id FROM outbox WHERE table_name = ? AND topic_id IS NOT NULL AND topic_id <> '' "
            "ORDER BY created_at DESC LIMIT 1",
            [table],
        )
        return rows[0][0] if rows else None
