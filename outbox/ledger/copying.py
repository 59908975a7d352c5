"""Moving a ledger to another database (``krishiv ledger-copy --to``): a DuckDB file onto PostgreSQL, say.

:meth:`Copying.copy_to` copies every row of every ledger table into an empty ledger at the target, in one write
transaction on each side, and keeps the commit sequence where it was (the Dagster sensors' cursors stay valid).
It refuses while a process holds a live lease on the source (a stager would record batches the copy misses), and
into a target that already holds entries. The same source transaction then marks the source moved
(``ledger_meta.moved_to``): from then on every read and write of it is refused with :class:`LedgerMoved`, naming
the target, so no process can go on staging into the ledger that was left behind.

Every refusal is decided before the target's file or schema is made: a refused copy leaves the target as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from krishiv_core.runbook import runbook
from outbox.errors import CopyRefused
from outbox.ledger.connection import Connection, LedgerConnection
from outbox.ledger.leases import _EPOCH_KEY, _LEASE_COLUMNS, StagerLease

#: The tables copied, parents first. Leases are not: a lease names a process on the source's side.
COPIED_TABLES = (
    "outbox",
    "outbox_offsets",
    "outbox_archive",
    "outbox_archive_offsets",
    "outbox_archive_ranges",
    "offset_skips",
)


@dataclass(frozen=True)
class CopyReport:
    source: str
    target: str
    rows: dict[str, int]  # table -> rows copied
    commit_seq: int  # the commit sequence's last value, carried over


class Copying(LedgerConnection):
    """Copying the whole ledger into another database, and marking it moved."""

    def copy_to(self, target: LedgerConnection) -> CopyReport:
        if target.path == self.path or (
            not target.on_server and not self.on_server and Path(target.path).resolve() == Path(self.path).resolve()
        ):
            raise CopyRefused(f"ledger {self.path} cannot be copied onto itself; name another --to")
        if target.exists():  # read, not made: a refused copy leaves a target that was not there not there
            _refuse_entries(target, target._reads(_HELD))
        with self._transaction() as source:  # the source's write lock: nothing is recorded while it copies
            leases = [
                StagerLease(*row) for row in source.execute(f"SELECT {_LEASE_COLUMNS} FROM stager_lease").fetchall()
            ]
            live = [lease for lease in leases if lease.alive()]
            if live:
                raise CopyRefused(
                    f"ledger {self.path} is in use: {live[0].pipeline!r} is held by {live[0].describe()}; stop it "
                    f"(krishiv run, a Dagster staging run), then copy {runbook('Moving the ledger to PostgreSQL')}"
                )
            tables = {name: _rows(source, name) for name in COPIED_TABLES}
            # What ledger_meta carries besides the schema version (the target's own): when it was last compacted, and
            # the fencing token each pipeline's lease last had, so the next holder's is greater on the target too.
            meta = source.execute(
                "SELECT key, value FROM ledger_meta WHERE key = 'compacted_at' OR key LIKE ?", [_EPOCH_KEY + "%"]
            ).fetchall()
            meta += [(_EPOCH_KEY + lease.pipeline, str(lease.epoch)) for lease in leases if lease.epoch is not None]
            last_seq = source.execute(
                f"SELECT greatest((SELECT max(commit_seq) FROM outbox), ({self.dialect.last_sequence_value}))"
            ).fetchone()[0]
            with target._transaction() as into:  # made here, after every refusal of the source's
                _refuse_entries(target, [into.execute(sql).fetchall() for sql, _ in _HELD])
                for name, (columns, rows) in tables.items():
                    target._backend.insert_rows(into, name, columns, rows)
                for key, value in meta:
                    target._set_meta(into, key, value)
                if last_seq:
                    for statement in target.dialect.restart_sequence(int(last_seq)):
                        into.execute(statement)
            self._set_meta(source, "moved_to", target.path)
        if target.on_server:  # the planner's statistics of the new tables, before the first query reads them
            with target._transaction() as into:
                into.execute("ANALYZE")
        return CopyReport(self.path, target.path, {n: len(r) for n, (_, r) in tables.items()}, int(last_seq or 0))


#: What a target must not hold: entries, and archived totals.
_HELD = [("SELECT count(*) FROM outbox", ()), ("SELECT count(*) FROM outbox_archive", ())]


def _refuse_entries(target: LedgerConnection, counts: list[Any]) -> None:
    held = sum(rows[0][0] for rows in counts)
    if held:
        raise CopyRefused(
            f"ledger {target.path} already holds {held} entries; copy only into a new, empty ledger (another "
            "schema= or file) so no two histories mix"
        )


def _rows(con: Connection, table: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    cursor = con.execute(f"SELECT * FROM {table}")
    columns = [d[0] for d in cursor.description]
    return columns, cursor.fetchall()
