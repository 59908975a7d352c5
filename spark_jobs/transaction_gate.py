"""Source transactions kept whole: which of a batch's change events wait for the rest of their transaction.

With Debezium's transaction metadata (``provide.transaction.metadata``) each change event carries its transaction
(``_cdc_tx``: PostgreSQL's xid) and the transaction topic carries an END mark per transaction that counts its
events per table. A pipeline over several topics with ``transaction_topic`` reads that topic in the same query, so
a batch holds a range of it as of every change topic, recorded in the ledger like theirs.

The rule (PROTOCOL.md invariant 20): a batch stages a change event only with every other event of its
transaction that the pipeline reads. An event waits when its transaction is **open**: its END mark has not been
read yet, or fewer of its events have been read than the END counts for the pipeline's tables. Kafka keeps a
partition's order, and a key's events must be applied in it, so everything after a waiting event in its
partition waits too (a tombstone, an event of a later transaction), and a transaction with any event waiting
is open. Events outside a transaction (a snapshot's reads) never wait, and a reject waits only with its own
transaction: it counts among the transaction's events (the decoder keeps its ``_cdc_tx``), as the END counts
it. A transaction touching tables the pipeline does not read counts only the events of the tables it reads.

A transaction waits at most ``transaction_timeout`` (5 minutes by default) of Kafka time: once a row of the batch is
that much newer (by its Kafka timestamp) than the first row of the transaction read, the transaction is released
as it is, with a warning naming it. That bounds what an event lost before Krishiv could read it costs (one that is
not a change event at all, so its transaction is unknown; a connector writing no marks), and it is decided from
the batch's own rows, so a replay decides the same.

What waits is kept in the checkpoint after each batch (``krishiv/transaction-held/<batch>.parquet``, the rows
as the source decoded them, END marks of open transactions included) and joins the next batch, so a replay of
a batch reads the same waiting rows and stages the same files. A transaction larger than a batch waits over as
many batches as it takes.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import reduce
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column
from pyspark.sql import functions as F

from krishiv_core.runbook import runbook
from spark_jobs.batch_state_files import BatchStateFiles
from spark_jobs.errors import HeldRowsMissing
from spark_jobs.record_decoder import REASON, TOMBSTONE
from spark_jobs.topics_source import TX_COUNTS, TX_STATUS, TX_XID

log = logging.getLogger(__name__)

STATE_DIR = "krishiv/transaction-held"
#: The columns the gate decides by.
GATE_COLUMNS = ("topic", "partition", "offset", "timestamp", REASON, TOMBSTONE, TX_STATUS, TX_XID, TX_COUNTS)


def data_collection(topic: str) -> str:
    """The table Debezium names in a transaction's END for a topic ``<prefix>.<schema>.<table>``:
    ``<schema>.<table>``."""
    return ".".join(topic.split(".")[-2:])


@dataclass(frozen=True)
class Release:
    """What of a batch waits: each change partition from its first waiting offset on (its rejects aside), and the
    rows of open transactions kept one by one."""

    hold_from: dict[tuple[str, int], int] = field(default_factory=dict)
    #: (topic, partition, offset) of the rows that wait one by one: the END marks of open transactions, and the
    #: rejects inside them (a reject waits with its transaction, which counts it, not in its partition's order).
    kept: frozenset[tuple[str, int, int]] = frozenset()
    #: Each open transaction: (its events read, the events its END counts, or None before its END is read).
    open: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    #: Transactions released as they are after waiting longer than the timeout, the same counts.
    given_up: dict[str, tuple[int, int | None]] = field(default_factory=dict)

    @property
    def holds(self) -> bool:
        return bool(self.hold_from or self.kept)

    def waits(self, row: Mapping[str, Any]) -> bool:
        """Whether ``row`` (:data:`GATE_COLUMNS`) waits: :meth:`waiting` on the driver."""
        if (row["topic"], row["partition"], row["offset"]) in self.kept:
            return True
        start = self.hold_from.get((row["topic"], row["partition"]))
        return start is not None and row["offset"] >= start and row[REASON] is None

    def waiting(self) -> Column:
        """Spark's condition for a row that waits."""
        parts = [
            (F.col("topic") == t) & (F.col("partition") == p) & (F.col("offset") >= o) & F.col(REASON).isNull()
            for (t, p), o in sorted(self.hold_from.items())
        ]
        parts += [
            (F.col("topic") == t) & (F.col("partition") == p) & (F.col("offset") == o) for t, p, o in sorted(self.kept)
        ]
        return reduce(lambda a, b: a | b, parts) if parts else F.lit(False)


def counted_tables(topics: Sequence[str], pattern: str | None = None) -> Callable[[str], bool]:
    """Whether an END's count of a table (``<schema>.<table>``) is of events the pipeline reads: a table of one of
    ``topics``, or one whose topic (under a prefix of theirs) ``pattern`` matches, not read yet: the query starts
    again with that topic once it is found (``spark_jobs.topics_source``), and the transaction waits for it."""
    ours = {data_collection(t) for t in topics}
    prefixes = {t.rsplit(".", 2)[0] for t in topics if t.count(".") >= 2}
    matches = re.compile(pattern).fullmatch if pattern is not None else None

    def counted(table: str) -> bool:
        return table in ours or (matches is not None and any(matches(f"{p}.{table}") for p in prefixes))

    return counted


def plan_release(
    rows: Sequence[Mapping[str, Any]],
    topics: Sequence[str],
    transaction_topic: str,
    timeout: timedelta | None = None,
    pattern: str | None = None,
) -> Release:
    """Which of ``rows`` (:data:`GATE_COLUMNS` of a batch's rows, the waiting ones before it included) wait, by the
    rule of this module. ``topics``: the change-event topics the pipeline reads, and ``pattern`` its
    ``topic_pattern`` (:func:`counted_tables`). ``timeout``: how long a transaction waits, in Kafka time (from the
    Kafka timestamp of its first row read to the newest row's)."""
    ours = counted_tables(topics, pattern)
    expected: dict[str, int] = {}
    marks: list[Mapping[str, Any]] = []
    events: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    seen: Counter[str] = Counter()
    rejects: list[Mapping[str, Any]] = []
    for r in rows:
        if r["topic"] == transaction_topic:
            if r[REASON] is None and r[TX_STATUS] == "END":
                counts = json.loads(r[TX_COUNTS] or "{}")
                expected[r[TX_XID]] = sum(n for c, n in counts.items() if ours(c))
                marks.append(r)
            continue
        if r[TX_XID] is not None:  # a reject too: its END counts it
            seen[r[TX_XID]] += 1
        if r[REASON] is None:
            events.setdefault((r["topic"], r["partition"]), []).append(r)
        elif r[TX_XID] is not None:
            rejects.append(r)
    open_ = {x for x in seen if x not in expected or seen[x] < expected[x]}
    open_ |= {x for x, n in expected.items() if seen[x] < n}
    given_up = _timed_out(rows, open_, timeout) if timeout is not None else set()
    open_ -= given_up
    for run in events.values():
        run.sort(key=lambda r: r["offset"])
    while True:
        hold_from: dict[tuple[str, int], int] = {}
        dragged: set[str] = set()
        for where, run in events.items():
            first = next((i for i, r in enumerate(run) if r[TX_XID] in open_), None)
            if first is not None:
                hold_from[where] = run[first]["offset"]
                dragged |= {r[TX_XID] for r in run[first:] if r[TX_XID] is not None}
        if dragged <= open_:
            break
        open_ |= dragged
    kept = frozenset((r["topic"], r["partition"], r["offset"]) for r in (*marks, *rejects) if r[TX_XID] in open_)
    counts = {x: (seen[x], expected.get(x)) for x in sorted(open_ | given_up)}
    return Release(hold_from, kept, {x: counts[x] for x in sorted(open_)}, {x: counts[x] for x in sorted(given_up)})


def _timed_out(rows: Sequence[Mapping[str, Any]], open_: set[str], timeout: timedelta) -> set[str]:
    """The open transactions whose first row read is older than the newest row by more than ``timeout``, in Kafka
    time: what a batch decides from its own rows, so a replay decides the same."""
    stamps = [r["timestamp"] for r in rows if r["timestamp"] is not None]
    if not stamps:
        return set()
    first: dict[str, datetime] = {}
    for r in rows:
        x = r[TX_XID]
        if x in open_ and r["timestamp"] is not None and (x not in first or r["timestamp"] < first[x]):
            first[x] = r["timestamp"]
    newest = max(stamps)
    return {x for x, at in first.items() if newest - at > timeout}


class HeldRowsStore(BatchStateFiles):
    """The rows waiting after each batch, one Parquet file per batch id inside a query's checkpoint."""

    def __init__(self, checkpoint: Path) -> None:
        super().__init__(checkpoint, STATE_DIR)

    def load_before(self, batch_id: int) -> pa.Table | None:
        """The rows waiting when batch ``batch_id`` starts; None when none do."""
        if batch_id == 0:
            return None
        path = self.path(batch_id - 1)
        if path.exists():
            held = pq.read_table(path)
            return held if held.num_rows else None
        if not self.folder.exists() or not any(self.folder.glob("*.parquet")):
            return None  # no batch has been staged with a transaction topic yet
        raise HeldRowsMissing(
            f"the change events waiting for their transactions after batch {batch_id - 1} are not in {self.folder}, "
            f"so batch {batch_id} cannot be staged; restore the checkpoint with its {STATE_DIR} folder "
            + runbook("A checkpoint that does not match its ledger")
        )


def describe_open(transactions: Mapping[str, tuple[int, int | None]], shown: int = 3) -> str:
    """Transactions for a log line (:attr:`Release.open`, :attr:`Release.given_up`):
    ``571 (2 of 3 events), 572 (1 event, END not read)``."""
    parts = []
    for xid, (seen, expected) in list(transactions.items())[:shown]:
        got = f"{seen} event{'s' * (seen != 1)}"
        parts.append(f"{xid} ({got}, END not read)" if expected is None else f"{xid} ({seen} of {expected} events)")
    more = len(transactions) - shown
    return ", ".join(parts) + (f" and {more} more" if more > 0 else "")
