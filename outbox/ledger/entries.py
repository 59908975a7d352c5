"""The outbox entries: recording a batch (phase 1), marking an entry committed (phase 2), and reading them back.

Each entry is one table's part of one batch of a query, keyed (query, table, batch): its staged files, offsets
and metrics as JSON in ``outbox`` (the record), its offset ranges again one row per partition in
``outbox_offsets`` and its metrics as columns, for the aggregate reads of :mod:`outbox.ledger.queries`.
:meth:`Entries.record_batch` writes a batch's entries in one transaction: a replay of a recorded batch changes
nothing, one with other offsets is refused, and one of a batch that compaction folded into the archive is
recognised from the offsets the archive covers. The reads here are what the stager and the relay need: an
entry or a batch whole, the PENDING ones, the ends of recorded batches. :meth:`Entries.entries` lists only the
entries still in the ledger.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from krishiv_core.entries import COMMITTED, PENDING, CommitOperation, OutboxEntry, StagedFile
from krishiv_core.errors import BatchReplayMismatch
from krishiv_core.runbook import runbook
from outbox.ledger.connection import Connection, LedgerConnection
from outbox.ledger.leases import StagerLease, check_lease
from outbox.ledger.schema import COMMIT_ORDER

#: The metrics kept as columns of ``outbox`` (summed by status and the checks), besides the JSON.
METRIC_COLUMNS = ("records_read", "rejects", "late_events", "windows")
_COLUMNS = (
    "query_id, pipeline, table_name, batch_id, status, intended_snapshot_id, committed_snapshot_id, "
    "offsets, files, metrics, created_at, committed_at, operation, schema_id, topic_id, schema_change"
)


@dataclass(frozen=True)
class PendingBatch:
    """A PENDING entry's key and age, without its files and offsets."""

    query_id: str
    table: str
    batch_id: int
    created_at: datetime


def _row_to_entry(row: Sequence[Any]) -> OutboxEntry:
    (
        query_id,
        pipeline,
        table,
        batch_id,
        status,
        intended,
        committed,
        offsets,
        files,
        metrics,
        created_at,
        committed_at,
        operation,
        schema_id,
        topic_id,
        schema_change,
    ) = row
    return OutboxEntry(
        query_id=query_id,
        pipeline=pipeline,
        table=table,
        batch_id=batch_id,
        status=status,
        intended_snapshot_id=intended,
        committed_snapshot_id=committed,
        offsets=json.loads(offsets),
        files=tuple(StagedFile(**f) for f in json.loads(files)),
        metrics=json.loads(metrics),
        created_at=created_at,
        committed_at=committed_at,
        operation=CommitOperation.from_json(json.loads(operation) if operation else None),
        schema_id=schema_id,
        topic_id=topic_id,
        schema_change=schema_change,
    )


class Entries(LedgerConnection):
    """Recording, committing and reading the entries still in the ledger."""

    def record_batch(self, entries: Sequence[OutboxEntry], lease: StagerLease | None = None) -> list[bool]:
        """Record one batch's entries (one per table) atomically; returns which were new.

        An entry already present for the same (query, table, batch) is kept as it is, with its
        intended snapshot id, so a replay changes nothing; if the replay covers other offsets the
        checkpoint and the ledger disagree and :class:`BatchReplayMismatch` is raised. A batch that
        compaction folded into the archive counts as present when its offsets lie inside what the archive
        committed, and as a mismatch otherwise (the checkpoint was rewound past the retention).

        With ``lease``, the same transaction first checks that the lease is still this process's and
        unexpired, else raises :class:`StagerLeaseLost` naming the current holder; nothing is written.
        """
        inserted: list[bool] = []
        now = datetime.now(UTC)
        with self._transaction() as con:
            if lease is not None:
                check_lease(con, lease, now)
            for e in entries:
                row = con.execute(
                    "SELECT offsets FROM outbox WHERE query_id = ? AND table_name = ? AND batch_id = ?",
                    [e.query_id, e.table, e.batch_id],
                ).fetchone()
                if row is not None:
                    if json.loads(row[0]) != e.offsets:
                        raise BatchReplayMismatch(
                            f"batch {e.batch_id} of query {e.query_id} for table {e.table} was recorded with "
                            f"offsets {row[0]} but is now replayed with {json.dumps(e.offsets)}; the Spark "
                            "checkpoint does not belong to this ledger "
                            + runbook("A checkpoint that does not match its ledger")
                        )
                    inserted.append(False)
                    continue
                if self._archived(con, e):
                    inserted.append(False)
                    continue
                con.execute(
                    f"INSERT INTO outbox ({_COLUMNS}, record_count, {', '.join(METRIC_COLUMNS)}) "
                    "VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, NULL, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        e.query_id,
                        e.pipeline,
                        e.table,
                        e.batch_id,
                        PENDING,
                        e.intended_snapshot_id,
                        json.dumps(e.offsets, sort_keys=True),
                        json.dumps([f.to_json() for f in e.files]),
                        json.dumps(e.metrics, sort_keys=True),
                        now,
                        None if e.operation.to_json() is None else json.dumps(e.operation.to_json()),
                        e.schema_id,
                        e.topic_id,
                        e.schema_change,
                        e.record_count,
                        *(int(e.metrics.get(m, 0)) for m in METRIC_COLUMNS),
                    ],
                )
                ranges = [
                    [e.query_id, e.table, e.batch_id, topic, str(p), int(start), int(end)]
                    for topic, parts in e.offsets.items()
                    for p, (start, end) in parts.items()
                ]
                if ranges:  # one statement: DuckDB's executemany runs one per row
                    con.execute(
                        "INSERT INTO outbox_offsets VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * len(ranges)),
                        [value for r in ranges for value in r],
                    )
                inserted.append(True)
        return inserted

    def _archived(self, con: Connection, e: OutboxEntry) -> bool:
        """Whether ``e`` replays a batch compaction folded into the archive (raising if its offsets disagree)."""
        row = con.execute(
            "SELECT max_batch_id FROM outbox_archive WHERE query_id = ? AND table_name = ?", [e.query_id, e.table]
        ).fetchone()
        if row is None or e.batch_id > row[0]:
            return False
        covered = {
            (topic, p): (start, end)
            for topic, p, start, end in con.execute(
                "SELECT topic, partition, start_offset, end_offset FROM outbox_archive_offsets "
                "WHERE query_id = ? AND table_name = ?",
                [e.query_id, e.table],
            ).fetchall()
        }
        for topic, parts in e.offsets.items():
            for p, (start, end) in parts.items():
                lo, hi = covered.get((topic, str(p)), (0, 0))
                if end > start and (start < lo or end > hi):
                    raise BatchReplayMismatch(
                        f"batch {e.batch_id} of query {e.query_id} for table {e.table} was compacted into the "
                        f"ledger's archive (batches up to {row[0]}, which committed {topic} partition {p} "
                        f"offsets [{lo}, {hi})) but is now replayed with {json.dumps(e.offsets)}; the Spark "
                        "checkpoint was rewound past the ledger's retention "
                        + runbook("A checkpoint that does not match its ledger")
                    )
        return True

    def mark_committed(
        self,
        entry: OutboxEntry,
        snapshot_id: int | None,
        committed_by: str | None = None,
        commit_ms: float | None = None,
    ) -> int | None:
        """Mark a PENDING entry COMMITTED (``snapshot_id`` None: nothing published, or the snapshot expired).

        The same transaction gives the commit the next ``commit_seq``, the order in which commits reached the
        ledger (:meth:`commits_since` reads by it), and records ``committed_by`` (``krishiv run``, ``krishiv
        commit``, ``dagster run <id>``) and ``commit_ms``, the catalog call's duration when this process made
        it. Returns the commit's sequence number, or None if the entry was no longer PENDING (nothing changed).
        """
        with self._transaction() as con:
            rows = con.execute(
                "UPDATE outbox SET status = ?, committed_snapshot_id = ?, committed_at = ?, "
                "commit_seq = nextval('outbox_commit_seq'), committed_by = ?, commit_ms = ? "
                "WHERE query_id = ? AND table_name = ? AND batch_id = ? AND status = ? RETURNING commit_seq",
                [
                    COMMITTED,
                    snapshot_id,
                    datetime.now(UTC),
                    committed_by,
                    commit_ms,
                    entry.query_id,
                    entry.table,
                    entry.batch_id,
                    PENDING,
                ],
            ).fetchall()
        return int(rows[0][0]) if rows else None

    def replace_files(self, entry: OutboxEntry, files: Sequence[StagedFile]) -> bool:
        """Give a PENDING entry new staged files (its old ones are gone); False if it is no longer PENDING.

        Offsets, intended snapshot id and record count stay: the files hold the same rows again.
        """
        with self._transaction() as con:
            changed = con.execute(
                "UPDATE outbox SET files = ? WHERE query_id = ? AND table_name = ? AND batch_id = ? "
                "AND status = ? AND record_count = ? RETURNING 1",
                [
                    json.dumps([f.to_json() for f in files]),
                    entry.query_id,
                    entry.table,
                    entry.batch_id,
                    PENDING,
                    sum(f.records for f in files),
                ],
            ).fetchall()
        return bool(changed)

    def get(self, query_id: str, table: str, batch_id: int) -> OutboxEntry | None:
        rows = self._read(
            f"SELECT {_COLUMNS} FROM outbox WHERE query_id = ? AND table_name = ? AND batch_id = ?",
            [query_id, table, batch_id],
        )
        return _row_to_entry(rows[0]) if rows else None

    def batch(self, query_id: str, batch_id: int) -> dict[str, OutboxEntry]:
        """The entries recorded for one batch of a query, by table, in one read."""
        rows = self._read(f"SELECT {_COLUMNS} FROM outbox WHERE query_id = ? AND batch_id = ?", [query_id, batch_id])
        return {e.table: e for e in map(_row_to_entry, rows)}

    def entries(self, table: str | None = None, status: str | None = None) -> list[OutboxEntry]:
        """Entries in commit order: by first appearance of their query, then batch id.

        Every entry still in the ledger, parsed whole: for tools that want them all (the oracle, the
        chaos checks). Hot paths use the aggregate reads below; compacted entries are not listed here.
        """
        where, params = [], []
        if table is not None:
            where.append("table_name = ?")
            params.append(table)
        if status is not None:
            where.append("status = ?")
            params.append(status)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._read(f"SELECT {_COLUMNS} FROM outbox {clause} ORDER BY {COMMIT_ORDER}", params)
        return [_row_to_entry(r) for r in rows]

    def last_batch_id(self, query_id: str, table: str) -> int:
        """The highest batch id recorded for the query and table, -1 if none."""
        rows = self._read(
            "SELECT greatest(max(batch_id), (SELECT max(max_batch_id) FROM outbox_archive "
            "WHERE query_id = ? AND table_name = ?)) FROM outbox WHERE query_id = ? AND table_name = ?",
            [query_id, table, query_id, table],
        )
        return -1 if not rows or rows[0][0] is None else int(rows[0][0])

    def recorded_ends(self, query_id: str, table: str, topic: str, after_batch_id: int) -> dict[int, dict[str, int]]:
        """End offsets of the batches recorded for the query and table past ``after_batch_id``, by batch id.

        A rewound checkpoint makes Spark plan these batch ids again; the source must give them exactly these ends.
        """
        rows = self._read(
            "SELECT batch_id, partition, end_offset FROM outbox_offsets "
            "WHERE query_id = ? AND table_name = ? AND topic = ? AND batch_id > ?",
            [query_id, table, topic, after_batch_id],
        )
        ends: dict[int, dict[str, int]] = {}
        for batch_id, partition, end in rows:
            ends.setdefault(int(batch_id), {})[str(partition)] = int(end)
        return ends

    def pending(self, table: str) -> list[OutboxEntry]:
        """The table's PENDING entries, whole, in commit order (only PENDING rows are read)."""
        return self.entries(table=table, status=PENDING)

    def pending_batches(self, tables: Sequence[str] | None = None, pipeline: str | None = None) -> list[PendingBatch]:
        """The keys and ages of PENDING entries (of ``tables``, or all), in commit order, without their JSON. With
        ``pipeline``, its batches' entries too, whatever table they name (a route since removed from the spec)."""
        clause, params = "", []
        if tables is not None:
            names = f"table_name IN ({', '.join('?' * len(tables))})" if tables else "FALSE"
            clause = f" AND ({names}{' OR pipeline = ?' if pipeline is not None else ''})"
            params = [*tables, *([pipeline] if pipeline is not None else [])]
            if not tables and pipeline is None:
                return []
        elif pipeline is not None:
            clause, params = " AND pipeline = ?", [pipeline]
        rows = self._read(
            f"SELECT query_id, table_name, batch_id, created_at FROM outbox WHERE status = ?{clause} "
            f"ORDER BY {COMMIT_ORDER}",
            [PENDING, *params],
        )
        return [PendingBatch(*r) for r in rows]

    def pending_tables(self, pipelines: Sequence[str] | None = None) -> list[str]:
        """The tables with PENDING entries (of ``pipelines``' batches, or of any), in name order: each entry names
        the table it was staged for, whatever the spec says now (a route removed since still has its entries)."""
        clause, params = "", []
        if pipelines is not None:
            if not pipelines:
                return []
            clause = f" AND pipeline IN ({', '.join('?' * len(pipelines))})"
            params = list(pipelines)
        rows = self._read(
            f"SELECT DISTINCT table_name FROM outbox WHERE status = ?{clause} ORDER BY 1", [PENDING, *params]
        )
        return [r[0] for r in rows]

    def pending_pipelines(self) -> list[str]:
        """The pipelines with PENDING entries, in name order."""
        return [r[0] for r in self._read("SELECT DISTINCT pipeline FROM outbox WHERE status = ? ORDER BY 1", [PENDING])]

    def staged_paths(self, table: str) -> set[str]:
        """Every staged file the entries of ``table`` still in the ledger refer to (PENDING or COMMITTED)."""
        return {
            f["path"]
            for (files,) in self._read("SELECT files FROM outbox WHERE table_name = ?", [table])
            for f in json.loads(files)
        }
