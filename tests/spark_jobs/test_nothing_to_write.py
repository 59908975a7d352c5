"""A batch with nothing to write is a batch: every kind stages what it has and commits.

Through the real broker, Spark and a SQLite catalog, each kind reads a 4-partition topic in three batches:

1. valid events in partitions 0-2 and one malformed record alone in partition 3 (that partition's task has no
   valid event);
2. only malformed records (the whole batch is rejects);
3. the kind's own nothing-to-write batch: only tombstones (upsert), only late events (windowed: nothing for its
   table, the events kept in the rejects table), only malformed
   records in one partition (events).

After each run the tables equal an oracle folded from the produced records by the rules of docs/spec.md, and
nothing is left pending; a batch that is only malformed records names their reason (``krishiv run`` warns of it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest

from chaos.workspace import ORDER_FIELDS, SETTINGS_TEMPLATE
from krishiv.operations import commit_pipelines, open_ledger, run_pipelines
from krishiv.produce import OrderEvent, ensure_topic, produce
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.entries import PENDING
from krishiv_core.reject_rate import CommonReason
from krishiv_core.spec import EVENTS, UPSERT, WINDOWED, KrishivSpec, load_spec

START_MS = 1_767_225_600_000
WINDOW_MS = 60_000
DELAY_MS = 5_000
PARTITIONS = 4

PIPELINES = {
    EVENTS: """
[[pipelines]]
name = "p"
kind = "events"
topic = "{topic}"
kafka_metadata = true
""",
    UPSERT: """
[[pipelines]]
name = "p"
kind = "upsert"
topic = "{topic}"
key = ["customer_id"]
version_field = "event_time"
""",
    WINDOWED: """
[[pipelines]]
name = "p"
topic = "{topic}"
event_time_field = "event_time"
watermark_delay = "5s"
window = "1m"
group_by = ["customer_id"]
aggregations = [
  {{ name = "orders", function = "count" }},
  {{ name = "amount_total", function = "sum", field = "amount" }},
]
""",
}


@dataclass(frozen=True)
class Sent:
    """A produced record, with the offset the broker gave it."""

    partition: int
    offset: int
    key: bytes
    value: bytes | None


def _spec(tmp_path: Path, bootstrap: str, topic: str, kind: str) -> KrishivSpec:
    path = tmp_path / "krishiv.toml"
    text = SETTINGS_TEMPLATE + PIPELINES[kind] + "max_records_per_batch = 1000\n" + ORDER_FIELDS
    path.write_text(
        text.format(
            bootstrap=bootstrap, partitions=PARTITIONS, catalog_uri="sqlite:///catalog.db", warehouse="w", topic=topic
        )
    )
    return load_spec(path, env={})


def _order(customer: int, seq: int, event_time_ms: int) -> bytes:
    amount = Decimal(100 + seq) / 100
    doc = {"order_id": f"o-{seq}", "customer_id": f"c-{customer}", "amount": str(amount), "event_time": event_time_ms}
    return json.dumps(doc).encode()


MALFORMED = b'{"order_id": "o-bad", "customer_id": "c-0", "amount": "1.00", "event_time": '


def _send(spec: KrishivSpec, records: list[tuple[int, bytes, bytes | None]], offsets: dict[int, int]) -> list[Sent]:
    """Produce ``(partition, key, value)`` records; ``offsets`` tracks each partition's next offset."""
    topic = spec.pipeline().topic
    ensure_topic(spec.kafka.bootstrap_servers, topic, PARTITIONS)
    events = [OrderEvent(n, p, k, v, "valid") for n, (p, k, v) in enumerate(records)]  # type: ignore[arg-type]
    produce(spec.kafka.bootstrap_servers, topic, events)
    sent = []
    for p, k, v in records:
        sent.append(Sent(p, offsets.get(p, 0), k, v))
        offsets[p] = offsets.get(p, 0) + 1
    return sent


def _rounds(kind: str) -> list[list[tuple[int, bytes, bytes | None]]]:
    """The three batches' records: (partition, key, value). Customer c-N lives in partition N % 3."""
    first = [(c % 3, f"c-{c}".encode(), _order(c, n, START_MS + n * 7_000)) for n, c in enumerate([0, 1, 2] * 10)]
    first.append((3, b"bad", MALFORMED))
    only_rejects = [(p, b"bad", MALFORMED + str(p).encode()) for p in range(PARTITIONS)]
    if kind == UPSERT:
        third = [(c % 3, f"c-{c}".encode(), None) for c in (0, 2)]  # only tombstones, of two of the three keys
    elif kind == WINDOWED:  # only late events: their windows closed long before the watermark
        third = [(c % 3, f"c-{c}".encode(), _order(c, 100 + c, START_MS - 10 * WINDOW_MS)) for c in (0, 1, 2)]
    else:
        third = [(1, b"bad", MALFORMED + b"x")]
    return [first, only_rejects, third]


def _value(s: Sent) -> dict | None:
    if s.value is None:
        return None
    try:
        doc = json.loads(s.value)
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def _expected(kind: str, batches: list[list[Sent]]) -> tuple[set, set]:
    """(the table's rows, the rejects' coordinates), folded from the produced records by the rules of docs/spec.md."""
    rejects = {(s.partition, s.offset) for b in batches for s in b if s.value is not None and _value(s) is None}
    valid = [[(s, _value(s)) for s in b if _value(s) is not None or s.value is None] for b in batches]
    if kind == EVENTS:
        return {(s.partition, s.offset, d["order_id"]) for b in valid for s, d in b}, rejects
    if kind == UPSERT:  # in offset order per key (a key lives in one partition): the latest version; None deletes
        latest: dict[str, tuple[int, str]] = {}
        for b in valid:
            for s, d in sorted(b, key=lambda x: (x[0].partition, x[0].offset)):
                if d is None:
                    latest.pop(s.key.decode(), None)
                elif d["customer_id"] not in latest or d["event_time"] >= latest[d["customer_id"]][0]:
                    latest[d["customer_id"]] = (d["event_time"], d["order_id"])
        return {(k, order) for k, (_, order) in latest.items()}, rejects
    # windowed, append: an event is late when its window ended at or before the watermark the batch before left,
    # and then kept in the rejects table
    watermark, windows = 0, {}
    for b in valid:
        times = [d["event_time"] for _, d in b]
        for s, d in b:
            start = d["event_time"] // WINDOW_MS * WINDOW_MS
            if start + WINDOW_MS > watermark:
                count, total = windows.get((start, d["customer_id"]), (0, Decimal(0)))
                windows[(start, d["customer_id"])] = (count + 1, total + Decimal(d["amount"]))
            else:
                rejects.add((s.partition, s.offset))
        if times:
            watermark = max(watermark, max(times) - DELAY_MS)
    closed = {(start, c, n, total) for (start, c), (n, total) in windows.items() if start + WINDOW_MS <= watermark}
    return closed, rejects


def _got(spec: KrishivSpec, kind: str) -> tuple[set, set]:
    catalog = load_catalog(spec)
    pipeline = spec.pipeline()
    rows = catalog.load_table(qualified(spec, pipeline.table)).scan().to_arrow().to_pylist()
    rejects = catalog.load_table(qualified(spec, pipeline.rejects_table)).scan().to_arrow().to_pylist()
    if kind == EVENTS:
        table = {(r["_kafka_partition"], r["_kafka_offset"], r["order_id"]) for r in rows}
    elif kind == UPSERT:
        table = {(r["customer_id"], r["order_id"]) for r in rows}
    else:
        table = {
            (int(r["window_start"].timestamp() * 1000), r["customer_id"], r["orders"], r["amount_total"]) for r in rows
        }
    assert len(table) == len(rows), "a row is there twice"
    coordinates = [(r["partition"], r["offset"]) for r in rejects]
    assert len(set(coordinates)) == len(coordinates), "a reject is there twice"
    return table, set(coordinates)


@pytest.mark.parametrize("kind", [EVENTS, UPSERT, WINDOWED])
def test_batches_with_nothing_to_write_stage_and_commit(kind, tmp_path, broker, spark, topic):
    spec = _spec(tmp_path, broker.bootstrap, topic, kind)
    offsets: dict[int, int] = {}
    batches: list[list[Sent]] = []
    for records in _rounds(kind):
        batches.append(_send(spec, records, offsets))
        running = run_pipelines(spec, list(spec.pipelines), once=True)
        [staged] = [b for b in running[0].stager.history if b.recorded]
        assert staged.records_read == len(records)
        # A batch whose every record is malformed names that reason, for `krishiv run`'s warning; any other, none.
        malformed = sum(1 for _, _, v in records if v is not None and _value(Sent(0, 0, b"", v)) is None)
        named = CommonReason("malformed JSON", malformed) if malformed == len(records) else None
        assert staged.common_reason == named
        commit_pipelines(spec, list(spec.pipelines))
        assert _got(spec, kind) == _expected(kind, batches)
        assert not open_ledger(spec).entries(status=PENDING)
    assert _expected(kind, batches)[0], "the oracle's table is not empty"
