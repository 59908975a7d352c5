"""Retention (``krishiv ledger-compact``, and every commit run): folding old COMMITTED entries into the archive.

:meth:`Retention.compact` folds COMMITTED entries older than a retention into one ``outbox_archive`` row per
(query, table), with the offsets they covered per partition (and per topic incarnation), and deletes them,
keeping the newest entry of each (query, table) so the replay checks still find it. Every total read includes
the archive, and a replay of a compacted batch is recognised from the offsets the archive covers, so the hot
tables stay small without anything forgetting a batch. :meth:`Retention.compact_if_due` lets the commit path
ask after every run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from krishiv_core.entries import COMMITTED
from outbox.ledger.connection import Connection, LedgerConnection

#: Committed entries older than this are folded into the archive by :meth:`Ledger.compact`.
DEFAULT_RETENTION_S = 7 * 24 * 3600.0
#: Entries folded per compaction transaction, so no transaction holds the file for long.
COMPACT_CHUNK = 20_000
#: How often the commit path folds old entries (``compact_if_due``): a steady ledger has little to fold.
COMPACT_EVERY_S = 3600.0


@dataclass(frozen=True)
class CompactionReport:
    entries_archived: int
    groups: int  # (query, table) pairs that received archived entries
    entries_kept: int  # entries left in the hot table


class Retention(LedgerConnection):
    """Folding old COMMITTED entries into the archive, in chunks of one transaction each."""

    def compact(
        self, retention_s: float = DEFAULT_RETENTION_S, now: datetime | None = None, chunk: int = COMPACT_CHUNK
    ) -> CompactionReport:
        """Fold COMMITTED entries committed more than ``retention_s`` ago into the archive, and delete them.

        The newest entry of each (query, table) always stays, whatever its age, so ``last_batch_id``, a
        replay of the latest batch and the source's lookup of it keep working. The archive row keeps the
        entry count, staged records, metric sums, batch range, creation times, the last commit and its
        snapshot, and per partition the offsets covered. Each ``chunk`` of entries is its own transaction,
        so a first compaction of a large ledger does not hold the file for long.
        """
        if not self.exists():
            return CompactionReport(0, 0, 0)  # nothing to compact, and no reason to create a ledger
        cutoff = (now or datetime.now(UTC)) - timedelta(seconds=retention_s)
        archived, groups = 0, set()
        while True:
            with self._transaction() as con:
                con.execute(
                    "CREATE TEMP TABLE compacting AS "
                    "SELECT o.* FROM outbox o JOIN "
                    "(SELECT query_id, table_name, max(batch_id) AS newest FROM outbox "
                    "GROUP BY query_id, table_name) n "
                    "USING (query_id, table_name) "
                    "WHERE o.status = ? AND o.committed_at < ? AND o.batch_id < n.newest "
                    "ORDER BY o.committed_at LIMIT ?",
                    [COMMITTED, cutoff, chunk],
                )
                found = con.execute("SELECT count(*) FROM compacting").fetchone()[0]
                if found:
                    groups.update(con.execute("SELECT DISTINCT query_id, table_name FROM compacting").fetchall())
                    self._fold(con)
                con.execute("DROP TABLE compacting")
            archived += found
            if found < chunk:
                break
        kept = self._read("SELECT count(*) FROM outbox")
        return CompactionReport(archived, len(groups), int(kept[0][0]) if kept else 0)

    def compact_if_due(
        self, retention_s: float = DEFAULT_RETENTION_S, every_s: float = COMPACT_EVERY_S, now: datetime | None = None
    ) -> CompactionReport | None:
        """:meth:`compact`, unless the ledger was compacted less than ``every_s`` ago; None when not due.

        Cheap enough to call after every commit run (one read when not due), so a ledger never grows past
        its retention for want of someone running ``krishiv ledger-compact``.
        """
        now = now or datetime.now(UTC)
        last = self._read("SELECT value FROM ledger_meta WHERE key = 'compacted_at'")
        if last and (now - datetime.fromisoformat(last[0][0])).total_seconds() < every_s:
            return None
        report = self.compact(retention_s, now)
        if self.exists():
            with self._transaction() as con:
                self._set_meta(con, "compacted_at", now.isoformat())
        return report

    def _fold(self, con: Connection) -> None:
        """Add the temporary table ``compacting``'s entries to the archive and delete them from the hot tables."""
        con.execute(
            """
            INSERT INTO outbox_archive AS a
            SELECT query_id, table_name, min(pipeline), count(*), sum(record_count), sum(records_read),
                sum(rejects), sum(late_events), sum(windows), min(batch_id), max(batch_id), min(created_at),
                max(created_at), max(committed_at), {last_snapshot},
                max(committed_at) FILTER (WHERE committed_snapshot_id IS NOT NULL)
            FROM compacting GROUP BY query_id, table_name
            ON CONFLICT (query_id, table_name) DO UPDATE SET
                entries = a.entries + excluded.entries,
                record_count = a.record_count + excluded.record_count,
                records_read = a.records_read + excluded.records_read,
                rejects = a.rejects + excluded.rejects,
                late_events = a.late_events + excluded.late_events,
                windows = a.windows + excluded.windows,
                min_batch_id = least(a.min_batch_id, excluded.min_batch_id),
                max_batch_id = greatest(a.max_batch_id, excluded.max_batch_id),
                min_created_at = least(a.min_created_at, excluded.min_created_at),
                max_created_at = greatest(a.max_created_at, excluded.max_created_at),
                last_committed_at = greatest(a.last_committed_at, excluded.last_committed_at),
                last_snapshot_id = CASE
                    WHEN excluded.last_snapshot_at IS NOT NULL
                        AND (a.last_snapshot_at IS NULL OR excluded.last_snapshot_at >= a.last_snapshot_at)
                    THEN excluded.last_snapshot_id ELSE a.last_snapshot_id END,
                last_snapshot_at = greatest(a.last_snapshot_at, excluded.last_snapshot_at)
            """.format(
                last_snapshot=self.dialect.arg_max(
                    "committed_snapshot_id", "committed_at", "committed_snapshot_id IS NOT NULL"
                )
            )
        )
        con.execute(
            """
            INSERT INTO outbox_archive_offsets AS a
            SELECT f.query_id, f.table_name, f.topic, f.partition, min(f.start_offset), max(f.end_offset)
            FROM outbox_offsets f JOIN compacting c USING (query_id, table_name, batch_id)
            GROUP BY f.query_id, f.table_name, f.topic, f.partition
            ON CONFLICT (query_id, table_name, topic, partition) DO UPDATE SET
                start_offset = least(a.start_offset, excluded.start_offset),
                end_offset = greatest(a.end_offset, excluded.end_offset)
            """
        )
        con.execute(
            """
            INSERT INTO outbox_archive_ranges AS a
            SELECT f.query_id, f.table_name, f.topic, coalesce(c.topic_id, ''), f.partition, min(f.start_offset),
                max(f.end_offset)
            FROM outbox_offsets f JOIN compacting c USING (query_id, table_name, batch_id)
            GROUP BY f.query_id, f.table_name, f.topic, coalesce(c.topic_id, ''), f.partition
            ON CONFLICT (query_id, table_name, topic, topic_id, partition) DO UPDATE SET
                start_offset = least(a.start_offset, excluded.start_offset),
                end_offset = greatest(a.end_offset, excluded.end_offset)
            """
        )
        for table in ("outbox_offsets", "outbox"):
            con.execute(
                f"DELETE FROM {table} USING compacting c WHERE {table}.query_id = c.query_id "
                f"AND {table}.table_name = c.table_name AND {table}.batch_id = c.batch_id"
            )
