"""Offset skips, table ``offset_skips``: an operator's approved skip over offsets a query cannot read.

``krishiv skip-offsets`` records who skipped which partition from which offset to which, when and why; the
batch starting at the stuck offset applies the skip, and :meth:`OffsetSkips.mark_skip_applied` records which
batch that was. Recording the same skip again, or applying it again in the same batch (a replay), changes
nothing; a skip to another offset, or applied by another batch, is refused (:class:`OffsetSkipConflict`).
"""

from __future__ import annotations

from datetime import UTC, datetime

from krishiv_core.entries import OffsetSkip
from krishiv_core.runbook import runbook
from outbox.errors import OffsetSkipConflict
from outbox.ledger.connection import LedgerConnection
from outbox.ledger.leases import StagerLease, check_lease

_SKIP_COLUMNS = (
    "pipeline, query_id, topic, partition, from_offset, to_offset, reason, operator, created_at, applied_batch_id"
)


class OffsetSkips(LedgerConnection):
    """Recording, listing and applying offset skips."""

    def record_skip(
        self,
        pipeline: str,
        query_id: str,
        topic: str,
        partition: str | int,
        from_offset: int,
        to_offset: int,
        reason: str,
        operator: str,
    ) -> OffsetSkip:
        """Record an operator's skip of a partition from ``from_offset`` to ``to_offset``; returns it.

        Recording the same skip again returns the first record; a different ``to_offset`` for the same
        (query, topic, partition, from offset) raises :class:`OffsetSkipConflict`.
        """
        if from_offset < 0 or to_offset < 0:
            raise ValueError(f"offsets must not be negative, got {from_offset} -> {to_offset}")
        key = [query_id, topic, str(partition), from_offset]
        with self._transaction() as con:
            row = con.execute(
                f"SELECT {_SKIP_COLUMNS} FROM offset_skips "
                "WHERE query_id = ? AND topic = ? AND partition = ? AND from_offset = ?",
                key,
            ).fetchone()
            if row is not None:
                existing = OffsetSkip(*row)
                if existing.to_offset != to_offset:
                    raise OffsetSkipConflict(
                        f"query {query_id} already has a skip of {topic} partition {partition} from offset "
                        f"{from_offset} to {existing.to_offset} (by {existing.operator}); not recording one to "
                        f"{to_offset}: run the query, which applies it, then skip again from where it stops "
                        + runbook("Offsets a query cannot read exactly")
                    )
                return existing
            skip = OffsetSkip(
                pipeline, query_id, topic, str(partition), from_offset, to_offset, reason, operator, datetime.now(UTC)
            )
            con.execute(
                f"INSERT INTO offset_skips ({_SKIP_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                [
                    skip.pipeline,
                    skip.query_id,
                    skip.topic,
                    skip.partition,
                    skip.from_offset,
                    skip.to_offset,
                    skip.reason,
                    skip.operator,
                    skip.created_at,
                ],
            )
        return skip

    def skips(self, query_id: str, topic: str | None = None) -> list[OffsetSkip]:
        """The query's recorded skips (of one topic, or all), by partition and offset."""
        clause, params = "", [query_id]
        if topic is not None:
            clause = " AND topic = ?"
            params.append(topic)
        rows = self._read(
            f"SELECT {_SKIP_COLUMNS} FROM offset_skips WHERE query_id = ?{clause} "
            f"ORDER BY topic, {self.dialect.partition_order}, from_offset",
            params,
        )
        return [OffsetSkip(*r) for r in rows]

    def mark_skip_applied(self, skip: OffsetSkip, batch_id: int, lease: StagerLease | None = None) -> OffsetSkip:
        """Record the batch that applied ``skip``; applying it again in the same batch (a replay) changes nothing.

        Raises :class:`OffsetSkipConflict` if another batch already applied it, or it was never recorded; with
        ``lease``, :class:`StagerLeaseLost` (nothing written) if the stager no longer holds it, as ``record_batch``.
        """
        key = [skip.query_id, skip.topic, skip.partition, skip.from_offset]
        where = "WHERE query_id = ? AND topic = ? AND partition = ? AND from_offset = ?"
        with self._transaction() as con:
            if lease is not None:
                check_lease(con, lease, datetime.now(UTC))
            row = con.execute(f"SELECT {_SKIP_COLUMNS} FROM offset_skips {where}", key).fetchone()
            if row is None:
                raise OffsetSkipConflict(
                    f"no skip of {skip.topic} partition {skip.partition} from offset {skip.from_offset} is recorded "
                    f"for query {skip.query_id} {runbook('A checkpoint that does not match its ledger')}"
                )
            current = OffsetSkip(*row)
            if current.applied_batch_id == batch_id:
                return current
            if current.applied_batch_id is not None:
                raise OffsetSkipConflict(
                    f"the skip of {skip.topic} partition {skip.partition} from offset {skip.from_offset} was applied "
                    f"by batch {current.applied_batch_id} of query {skip.query_id}, not {batch_id} "
                    + runbook("A checkpoint that does not match its ledger")
                )
            con.execute(f"UPDATE offset_skips SET applied_batch_id = ? {where}", [batch_id, *key])
        return OffsetSkip(*(*row[:-1], batch_id))
