"""An independent model of what the pipeline must produce, computed from the topic itself.

It reads every record back from the broker, validates it in plain Python, and replays Krishiv's
append-mode semantics over the batch ranges the ledger recorded: after batch N the watermark is
W(N) = max(W(N-1), max event time of batch N - delay) (W(-1) = 0); an event of batch N whose window ended
at or before W(N-1), the watermark the batch before left, is late: left out of its window (written already)
and kept once in the rejects table, by batch N, with its payload and the reason docs/spec.md states
(``late: window [start, end) closed at watermark W``, instants in UTC to the millisecond); a window is written
by the batch whose W(N) first reaches its end, so after the last batch every window ending at or before the
final watermark is in the table and no other.

A topic deleted and re-created starts its offsets at 0 again: the batches before the operator's skip onto the
new topic read the old one, so their records come from a copy taken before the deletion (``earlier``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal

from confluent_kafka import Consumer, TopicPartition

from krishiv_core.entries import OutboxEntry

AMOUNT = re.compile(r"^-?[0-9]{1,10}(\.[0-9]{1,2})?$")

CONSUME_BATCH = 10_000
POLL_TIMEOUT_S = 0.5
READ_TIMEOUT_S = 30.0  # without a record, for one partition

#: A topic's records by (partition, offset).
Records = dict[tuple[int, int], bytes | None]


@dataclass(frozen=True)
class LateEvent:
    """A late event's row of the rejects table, as the oracle expects it: its reason and its Kafka value."""

    reason: str
    value: bytes | None


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def late_reason(window_start_ms: int, window_end_ms: int, watermark_ms: int) -> str:
    """The reason docs/spec.md gives a late event: the window it missed and the watermark that had closed it."""
    return f"late: window [{_utc(window_start_ms)}, {_utc(window_end_ms)}) closed at watermark {_utc(watermark_ms)}"


@dataclass
class Expected:
    windows: dict[int, dict[str, object]] = field(default_factory=dict)  # window start ms -> aggregates
    rejects: set[tuple[int, int, int]] = field(default_factory=set)  # (batch id, partition, offset)
    late: dict[tuple[int, int, int], LateEvent] = field(default_factory=dict)  # by (batch id, partition, offset)
    late_by_batch: dict[int, int] = field(default_factory=dict)
    watermark_by_batch: dict[int, int] = field(default_factory=dict)  # the watermark each batch starts from
    final_watermark: int = 0
    valid_events: int = 0


def read_topic(
    bootstrap: str, topic: str, partitions: int, ends: dict[int, int], keys: Records | None = None
) -> Records:
    """Every record below ``ends`` of every partition, keyed by (partition, offset); their Kafka keys into ``keys``.

    Asks for no more records than are left below the end, so ``consume`` returns as soon as they are there rather
    than after its timeout; offsets that hold no record (gaps) end the read once the consumer's position passes them.
    """
    out: Records = {}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "oracle", "enable.auto.commit": False})
    try:
        for p in range(partitions):
            end = ends.get(p, 0)
            if end == 0:
                continue
            consumer.assign([TopicPartition(topic, p, 0)])
            next_offset, deadline = 0, time.monotonic() + READ_TIMEOUT_S
            while next_offset < end:
                msgs = consumer.consume(min(CONSUME_BATCH, end - next_offset), timeout=POLL_TIMEOUT_S)
                for m in msgs:
                    if m.error() is not None:
                        raise RuntimeError(f"oracle read of {topic}/{p} failed: {m.error()}")
                    if m.offset() < end:
                        out[(p, m.offset())] = m.value()
                        if keys is not None:
                            keys[(p, m.offset())] = m.key()
                    next_offset = max(next_offset, m.offset() + 1)
                if msgs:
                    deadline = time.monotonic() + READ_TIMEOUT_S
                    continue
                if consumer.position([TopicPartition(topic, p)])[0].offset >= end:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"oracle could not read {topic}/{p} up to {end} from {bootstrap}")
    finally:
        consumer.close()
    return out


def parse(value: bytes | None) -> tuple[int, Decimal] | None:
    """(event time ms, amount) of a valid order, None for a reject."""
    if value is None:
        return None
    try:
        doc = json.loads(value)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    if not isinstance(doc.get("order_id"), str) or not isinstance(doc.get("customer_id"), str):
        return None
    amount, event_time = doc.get("amount"), doc.get("event_time")
    if not isinstance(amount, str | int | float) or isinstance(amount, bool) or not AMOUNT.match(str(amount)):
        return None
    if not isinstance(event_time, int) or isinstance(event_time, bool):
        return None
    return event_time, Decimal(str(amount))


def expected_output(
    records: Records,
    batches: list[OutboxEntry],
    topic: str,
    window_ms: int = 60_000,
    delay_ms: int = 5_000,
    earlier: Sequence[tuple[int, Records]] = (),
) -> Expected:
    """What the tables must hold after ``batches``. ``earlier`` lists the topic's former generations, oldest first,
    as (first batch id that read the next generation, that generation's records); later batches read ``records``."""
    exp = Expected()
    state: dict[int, list[Decimal | int]] = {}
    watermark = 0
    for entry in sorted(batches, key=lambda e: e.batch_id):
        exp.watermark_by_batch[entry.batch_id] = watermark
        late = 0
        batch_max = None
        source = next((recs for until, recs in earlier if entry.batch_id < until), records)
        for p, (start, end) in entry.offsets[topic].items():
            for offset in range(start, end):
                parsed = parse(source[(int(p), offset)])
                if parsed is None:
                    exp.rejects.add((entry.batch_id, int(p), offset))
                    continue
                event_time, amount = parsed
                exp.valid_events += 1
                batch_max = event_time if batch_max is None else max(batch_max, event_time)
                window_start = event_time - event_time % window_ms
                if watermark > 0 and window_start + window_ms <= watermark:
                    late += 1
                    reason = late_reason(window_start, window_start + window_ms, watermark)
                    exp.late[(entry.batch_id, int(p), offset)] = LateEvent(reason, source[(int(p), offset)])
                    continue
                agg = state.setdefault(window_start, [0, Decimal(0), amount, amount])
                agg[0] += 1
                agg[1] += amount
                agg[2] = min(agg[2], amount)
                agg[3] = max(agg[3], amount)
        exp.late_by_batch[entry.batch_id] = late
        if batch_max is not None:
            watermark = max(watermark, batch_max - delay_ms)
    exp.final_watermark = watermark
    for start, (count, total, low, high) in state.items():
        if start + window_ms <= watermark:
            exp.windows[start] = {
                "order_count": count,
                "amount_total": total,
                "amount_min": low,
                "amount_max": high,
                "amount_avg": (total / count).quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP),
            }
    return exp
