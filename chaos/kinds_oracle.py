"""Independent models of the ``events``, ``upsert`` and grouped ``windowed`` kinds over the demo's order events.

Like :mod:`chaos.oracle`, each reads the topic's records back and replays the batches the ledger recorded, in
plain Python, from the semantics docs/spec.md states, not from Krishiv's code:

- ``events``: every valid order one row, in the table of its route (or the default table), exactly once;
- ``upsert``: the upsert rule (docs/spec.md), folded one event at a time (:func:`fold_upserts`): an event applies when
  its version is at least the key's remembered one (a null is lower than every version), a row becomes the key's
  row, a delete removes it and the key remembers its version, a tombstone (null value, key from the Kafka key)
  removes it and forgets the version. The demo's upsert is key ``customer_id``, version ``event_time``;
- ``windowed`` with ``group_by`` and hopping windows in update mode: the table holds, per (window, group), the
  aggregate of every event of a batch whose window had not ended at or before the watermark the batch before
  left; an event falls in every window of the slide grid that holds it, and is late (kept in the rejects table,
  the reason naming its last window and the watermark) when its last window had ended at or before it;
- rejects: every record that is no valid order, by the batch that read it, except an upsert's tombstones (and an
  events pipeline's events routed to ``rejects``, and a windowed pipeline's late events).
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from chaos.oracle import LateEvent, Records, late_reason, parse
from krishiv_core.entries import OutboxEntry
from krishiv_core.spec import EVENTS, UPSERT, WINDOWED, PipelineSpec


@dataclass(frozen=True)
class Order:
    partition: int
    offset: int
    order_id: str
    customer_id: str
    amount: Decimal
    event_time: int


def order(records: Records, partition: int, offset: int) -> Order | None:
    value = records[(partition, offset)]
    if parse(value) is None:
        return None
    doc = json.loads(value)  # type: ignore[arg-type]
    return Order(partition, offset, doc["order_id"], doc["customer_id"], Decimal(doc["amount"]), doc["event_time"])


def _batches(entries: list[OutboxEntry], topic: str):
    for entry in sorted(entries, key=lambda e: e.batch_id):
        yield (
            entry.batch_id,
            [(int(p), o) for p, (start, end) in sorted(entry.offsets[topic].items()) for o in range(start, end)],
        )


@dataclass
class EventsExpected:
    rows: dict[str, set[tuple[int, int]]] = field(default_factory=dict)  # table -> (partition, offset)
    rejects: set[tuple[int, int]] = field(default_factory=set)


def expected_events(records: Records, pipeline: PipelineSpec) -> EventsExpected:
    exp = EventsExpected({t: set() for t in pipeline.tables})
    routes = {r.value: r.table for r in pipeline.routes}
    for p, o in records:
        found = order(records, p, o)
        if found is None:
            exp.rejects.add((p, o))
            continue
        table = pipeline.table if not routes else routes.get(found.customer_id, pipeline.unrouted)
        if table == "rejects":
            exp.rejects.add((p, o))
        else:
            exp.rows[table].add((p, o))
    return exp


@dataclass(frozen=True)
class UpsertEvent:
    """One event of an upsert stream as the upsert rule of docs/spec.md sees it: a row (``row`` set), a delete
    (``row`` None), or a tombstone; ``version`` None is a null version (every event's, without a version field)."""

    key: Hashable
    version: Any = None
    row: Any = None
    tombstone: bool = False


def _at_least(version: Any, remembered: Any) -> bool:
    """``version >= remembered``, a null version being lower than every version (and equal to a null)."""
    return remembered is None or (version is not None and version >= remembered)


def fold_upserts(events: Iterable[UpsertEvent]) -> dict[Hashable, Any]:
    """key -> row after folding ``events`` in order, by the upsert rule of docs/spec.md, one event at a time."""
    state: dict[Hashable, tuple[Any, Any]] = {}  # key -> (remembered version, row or None for a delete)
    for e in events:
        if e.tombstone:
            state.pop(e.key, None)  # the row goes and the version is forgotten
        elif e.key not in state or _at_least(e.version, state[e.key][0]):
            state[e.key] = (e.version, e.row)  # a delete keeps its version, so an older event stays out
    return {k: row for k, (_version, row) in state.items() if row is not None}


def expected_upsert(
    records: Records, keys: Records, entries: list[OutboxEntry] | None = None, topic: str | None = None
) -> dict[str, Order]:
    """customer id -> the order the table must hold for it (``keys``: each record's Kafka key), folding the
    demo's orders and tombstones by :func:`fold_upserts`.

    A key's events in one partition are folded in offset order, whatever the batches. The demo's producer spreads a
    customer's orders over the partitions, which Kafka does not order among themselves: given the ledger's
    ``entries``, records are taken in the order the batches read them and by (offset, partition) within a batch;
    without them, by (offset, partition).
    """
    if entries is not None and topic is not None:
        coordinates = [(p, o) for _batch, offsets in _batches(entries, topic) for p, o in sorted(offsets, key=_pos)]
    else:
        coordinates = sorted(records, key=_pos)
    events = []
    for p, o in coordinates:
        if (p, o) not in records:  # a batch's range past the records read (a gap)
            continue
        if records[(p, o)] is None:
            key = (keys.get((p, o)) or b"").decode()
            if key:
                events.append(UpsertEvent(key, tombstone=True))
            continue
        found = order(records, p, o)
        if found is not None:
            events.append(UpsertEvent(found.customer_id, found.event_time, found))
    return fold_upserts(events)


def _pos(coordinates: tuple[int, int]) -> tuple[int, int]:
    partition, offset = coordinates
    return (offset, partition)


def _grouped_windows_and_late(
    records: Records, entries: list[OutboxEntry], pipeline: PipelineSpec
) -> tuple[dict[tuple[int, int, str], list], dict[tuple[int, int, int], LateEvent]]:
    """The batches replayed: per (window start, end, customer) the running (count, total), and the late events,
    by (batch, partition, offset): those whose last window (the latest of the grid holding them) had ended at or
    before the watermark the batch before left."""
    size, slide = pipeline.window_ms, pipeline.window_slide_ms
    state: dict[tuple[int, int, str], list] = {}
    late: dict[tuple[int, int, int], LateEvent] = {}
    watermark = 0
    for batch, offsets in _batches(entries, pipeline.topic):
        latest = None
        for p, o in offsets:
            found = order(records, p, o)
            if found is None:
                continue
            t = found.event_time
            latest = t if latest is None else max(latest, t)
            start = t - t % slide
            if watermark > 0 and start + size <= watermark:
                late[(batch, p, o)] = LateEvent(late_reason(start, start + size, watermark), records[(p, o)])
            while start > t - size:
                if not (watermark > 0 and start + size <= watermark):
                    agg = state.setdefault((start, start + size, found.customer_id), [0, Decimal(0)])
                    agg[0] += 1
                    agg[1] += found.amount
                start -= slide
        if latest is not None:
            watermark = max(watermark, latest - pipeline.watermark_delay_ms)
    return state, late


def expected_grouped_windows(
    records: Records, entries: list[OutboxEntry], pipeline: PipelineSpec
) -> dict[tuple[int, int, str], tuple[int, Decimal]]:
    """(window start ms, window end ms, customer id) -> (order count, amount total), update mode."""
    state, _late = _grouped_windows_and_late(records, entries, pipeline)
    return {k: (v[0], v[1]) for k, v in state.items()}


def expected_grouped_late(
    records: Records, entries: list[OutboxEntry], pipeline: PipelineSpec
) -> dict[tuple[int, int, int], LateEvent]:
    """The grouped windowed pipeline's late events, each kept once in its rejects table by the batch that read it."""
    return _grouped_windows_and_late(records, entries, pipeline)[1]


def expected_rejects(
    records: Records, keys: Records, entries: list[OutboxEntry], pipeline: PipelineSpec
) -> set[tuple[int, int, int]]:
    """(batch id, partition, offset) of every record the pipeline's rejects table must hold once: each record that
    is no valid order (a tombstone too, except in an upsert, where one with a key deletes it), and an events
    pipeline's events without a route when its default is ``rejects``."""
    routed_away = expected_events(records, pipeline).rejects if pipeline.kind == EVENTS else set()
    out = set(expected_grouped_late(records, entries, pipeline)) if pipeline.kind == WINDOWED else set()
    for batch, offsets in _batches(entries, pipeline.topic):
        for p, o in offsets:
            if pipeline.kind == UPSERT and records[(p, o)] is None and keys.get((p, o)):
                continue
            if order(records, p, o) is None or (p, o) in routed_away:
                out.add((batch, p, o))
    return out
