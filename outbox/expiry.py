"""Snapshot expiry that the relay's exactly-once check survives.

Every batch the relay commits is one snapshot, so a table's metadata grows by a snapshot per batch and each
commit reads and rewrites all of them. Expiry drops old snapshots from the metadata: a snapshot is kept if it is
one of the newest ``keep_last`` or younger than ``keep_younger_than`` (Iceberg's min-snapshots-to-keep and
max-snapshot-age), and the current snapshot and every branch or tag head always are. It deletes no file: what the
expired snapshots alone referred to is left to orphan removal (``outbox.orphans``), after its grace period.

Why the relay stays right: it finds a committed batch by its intended snapshot id *or* by the query's
high-water property (``krishiv.high-water.<query>``), which each commit moves in the same metadata commit as its
snapshot; expiry removes snapshots and never touches properties, so a batch whose snapshot expired is still found
(``relay.find_committed`` reports it as committed with an expired snapshot) and never committed twice.

Running beside the relay: pyiceberg 0.12's expire-snapshots commit carries no requirement on the head, so it
applies to whatever the catalog holds when it lands; a relay commit in between is kept (it is newer than anything
expired). The catalog's own optimistic check (the metadata location moved) fails one of the two with
``CommitFailedException`` (tables have ``commit.retry.num-retries=0``); a snapshot already removed by another
expiry fails the update with ``ValueError``. Either way expiry reloads, recomputes and tries again, bounded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from krishiv_core.faults import fault_point
from outbox.errors import OutboxError

log = logging.getLogger(__name__)

MAX_EXPIRY_ATTEMPTS = 8
EXPIRY_BACKOFF_S = 0.05


class ExpiryConflict(OutboxError):
    """Expiry lost to concurrent commits more times than it retries; nothing was expired by the last attempt."""


@dataclass
class ExpiryReport:
    table: str
    expired: list[int] = field(default_factory=list)  # snapshot ids expired (or, dry run, that would be)
    kept: int = 0  # snapshots left in the table
    dry_run: bool = False


def protected_snapshot_ids(table: Table) -> set[int]:
    """The current snapshot and every branch or tag head: never expired."""
    ids = {ref.snapshot_id for ref in table.metadata.refs.values()}
    current = table.current_snapshot()
    if current is not None:
        ids.add(current.snapshot_id)
    return ids


def snapshots_to_expire(table: Table, *, keep_last: int, keep_younger_than_ms: int, now_ms: int) -> list[int]:
    """The ids of snapshots neither among the newest ``keep_last``, nor younger than ``keep_younger_than_ms``,
    nor protected; oldest first."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be at least 1, got {keep_last}")
    newest_first = sorted(table.snapshots(), key=lambda s: (s.timestamp_ms, s.sequence_number or 0), reverse=True)
    keep = protected_snapshot_ids(table) | {s.snapshot_id for s in newest_first[:keep_last]}
    cutoff = now_ms - keep_younger_than_ms
    return [s.snapshot_id for s in reversed(newest_first) if s.snapshot_id not in keep and s.timestamp_ms < cutoff]


def expire_snapshots(
    load: Callable[[], Table],
    *,
    keep_last: int,
    keep_younger_than_ms: int,
    dry_run: bool = False,
    now_ms: Callable[[], int] | None = None,
) -> ExpiryReport:
    """Expire the table's snapshots past ``keep_last`` and ``keep_younger_than_ms``; ``load`` (re)loads the table.

    A lost race reloads, recomputes and retries up to :data:`MAX_EXPIRY_ATTEMPTS` times, then raises
    :class:`ExpiryConflict`. ``dry_run`` reports what would be expired and commits nothing.
    """
    clock = now_ms or (lambda: int(time.time() * 1000))
    for attempt in range(MAX_EXPIRY_ATTEMPTS):
        table = load()
        name = ".".join(table.name())
        ids = snapshots_to_expire(table, keep_last=keep_last, keep_younger_than_ms=keep_younger_than_ms, now_ms=clock())
        report = ExpiryReport(name, ids, len(table.snapshots()) - len(ids), dry_run)
        if dry_run or not ids:
            return report
        try:
            fault_point("expiry.before_commit")
            table.maintenance.expire_snapshots().by_ids(ids).commit()
        except (CommitFailedException, ValueError) as exc:
            # Another writer moved the table (the relay committed), or another expiry removed one of these.
            log.info("expiring snapshots of %s lost a race (%s); reloading", name, exc)
            time.sleep(EXPIRY_BACKOFF_S * (attempt + 1))
            continue
        return report
    raise ExpiryConflict(
        f"expiring snapshots lost to concurrent commits {MAX_EXPIRY_ATTEMPTS} times in a row; nothing more was "
        "expired, run it again when the table is quieter"
    )
