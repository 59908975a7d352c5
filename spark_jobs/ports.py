"""What the Spark side needs from the outbox, as narrow interfaces: the application passes the ledger in.

``spark_jobs`` imports only the core; :class:`outbox.ledger.Ledger` satisfies :class:`StagingLedger` and
:class:`outbox.lease.HeldLease` satisfies :class:`StagerLeaseHandle`. The Kafka source, which runs in a Python
worker process of its own, receives no ledger at all: the driver reads :class:`RecordedBatches` once, when the
query starts, and hands it to the source as an option (:meth:`RecordedBatches.to_option`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol

from krishiv_core.entries import OffsetSkip, OutboxEntry, StagedFile


class StagingLedger(Protocol):
    """The ledger operations phase 1 uses."""

    @property
    def path(self) -> str: ...  # how messages name the ledger: a file's path, or a server's URI

    def batch(self, query_id: str, batch_id: int) -> dict[str, OutboxEntry]: ...

    def last_batch_id(self, query_id: str, table: str) -> int: ...

    def record_batch(self, entries: Sequence[OutboxEntry], lease: Any = None) -> list[bool]: ...

    def replace_files(self, entry: OutboxEntry, files: Sequence[StagedFile]) -> bool: ...

    def skips(self, query_id: str, topic: str | None = None) -> list[OffsetSkip]: ...

    def mark_skip_applied(self, skip: OffsetSkip, batch_id: int, lease: Any = None) -> OffsetSkip: ...

    def missing_batches(self, query_id: str, table: str, batch_ids: Sequence[int]) -> list[int]: ...

    def query_ids(self, pipeline: str) -> list[str]: ...

    def pending_batches(self, tables: Sequence[str] | None = None) -> Sequence[Any]: ...

    def recorded_ends(
        self, query_id: str, table: str, topic: str, after_batch_id: int
    ) -> dict[int, dict[str, int]]: ...


class StagerLeaseHandle(Protocol):
    """The stager's lease, held for the query's life: checked before each batch, named when recording one."""

    @property
    def lease(self) -> Any: ...

    def ensure_held(self) -> None: ...

    def check_ledger(self) -> None: ...  # ensure_held, the ledger asked now


@dataclass(frozen=True)
class RecordedBatches:
    """What the ledger holds that the Kafka source must follow, read when the query starts.

    ``ends``: the end offsets of batches recorded past the checkpoint's last batch (a rewound checkpoint plans
    them again, and must read exactly what was staged). ``skips``: the operator's offset skips of the topic
    (``krishiv skip-offsets``), recorded only while no query runs, so they cannot change while the source reads.
    """

    ends: dict[int, dict[str, int]] = field(default_factory=dict)
    skips: tuple[OffsetSkip, ...] = ()

    @classmethod
    def read(cls, ledger: StagingLedger, query_id: str, table: str, topic: str, after_batch_id: int) -> RecordedBatches:
        return cls(ledger.recorded_ends(query_id, table, topic, after_batch_id), tuple(ledger.skips(query_id, topic)))

    def to_option(self) -> str:
        return json.dumps(
            {
                "ends": {str(b): e for b, e in self.ends.items()},
                "skips": [
                    {
                        "pipeline": s.pipeline,
                        "query_id": s.query_id,
                        "topic": s.topic,
                        "partition": s.partition,
                        "from": s.from_offset,
                        "to": s.to_offset,
                        "reason": s.reason,
                        "operator": s.operator,
                        "at": s.created_at.isoformat(),
                        "batch": s.applied_batch_id,
                    }
                    for s in self.skips
                ],
            },
            sort_keys=True,
        )

    @classmethod
    def from_option(cls, text: str | None) -> RecordedBatches:
        if not text:
            return cls()
        doc = json.loads(text)
        skips = tuple(
            OffsetSkip(
                s["pipeline"],
                s["query_id"],
                s["topic"],
                str(s["partition"]),
                int(s["from"]),
                int(s["to"]),
                s["reason"],
                s["operator"],
                datetime.fromisoformat(s["at"]),
                s["batch"],
            )
            for s in doc.get("skips", [])
        )
        ends = {int(b): {str(p): int(o) for p, o in e.items()} for b, e in doc.get("ends", {}).items()}
        return cls(ends, skips)


def apply_skips(
    skips: list[OffsetSkip], start: dict[str, int], batch_id: int
) -> tuple[dict[str, int], list[OffsetSkip]]:
    """``start`` of batch ``batch_id`` with the operator's skips applied, and the skips as they are after it.

    A skip names the offset a partition is stuck at (``from_offset``) and where to read on from; the first batch
    starting there applies it (an unapplied skip becomes applied by ``batch_id``), and only that batch, so a
    replay of it reads from the same offset and no later batch applies it again. The source (planning and
    reading) and the stager (recording which batch applied it) decide the same way from the same offsets.
    """
    moved, after = dict(start), []
    for skip in skips:
        if skip.applied_batch_id is None and start.get(skip.partition) == skip.from_offset:
            skip = replace(skip, applied_batch_id=batch_id)
        if skip.applied_batch_id == batch_id:
            moved[skip.partition] = skip.to_offset
        after.append(skip)
    return moved, after


def apply_topic_skips(
    skips: list[OffsetSkip], start: dict[str, dict[str, int]], batch_id: int
) -> tuple[dict[str, dict[str, int]], list[OffsetSkip]]:
    """:func:`apply_skips` for a source over several topics (``start``: ``{topic: {partition: offset}}``), each
    topic's skips applied to its offsets; the skips after it in their order."""
    moved = {t: dict(offsets) for t, offsets in start.items()}
    after: dict[int, OffsetSkip] = {}
    for topic in {s.topic for s in skips}:
        mine = [i for i, s in enumerate(skips) if s.topic == topic]
        moved[topic], applied = apply_skips([skips[i] for i in mine], start.get(topic, {}), batch_id)
        after |= dict(zip(mine, applied, strict=True))
    return {t: o for t, o in moved.items() if o or t in start}, [after[i] for i in range(len(skips))]
