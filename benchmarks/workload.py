"""The benchmark's input: seeded orders produced in chunks, so millions of events never sit in memory at once.

Each chunk is :func:`krishiv.produce.demo_orders` with its own seed and a start time after the previous
chunk, so event time keeps moving forward and windows close; one event in 10,000 is late and one malformed,
as in the demo.

The nested orders (:func:`produce_nested_orders`) are the same orders with the customer in a struct of a struct,
two order lines (a list of structs with a decimal each), a map of decimals and the event time inside a struct
(:data:`NESTED_FIELDS`, docs/spec.md's "Nested fields"): what ``python -m benchmarks.decode`` times on one core,
here through the whole ``events`` pipeline. Every one of them is valid, so the table holds one row per record.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from krishiv.produce import DEFAULT_SPACING_MS, DEFAULT_START_MS, OrderEvent, demo_orders, ensure_topic, produce
from krishiv_core.spec_types import ELEMENT, LIST, MAP, STRUCT, VALUE, EventField, FieldType

CHUNK = 200_000
SPECIAL_EVERY = 10_000  # one late and one malformed event per this many


def produce_orders(bootstrap: str, topic: str, records: int, *, seed: int, partitions: int) -> float:
    """Create ``topic`` and produce ``records`` orders to it; returns the seconds it took."""
    started = time.perf_counter()
    partitions = ensure_topic(bootstrap, topic, partitions)
    done = 0
    while done < records:
        n = min(CHUNK, records - done)
        special = n // SPECIAL_EVERY
        events = demo_orders(
            n,
            seed=seed + done,
            partitions=partitions,
            late=special,
            malformed=special,
            start_ms=DEFAULT_START_MS + done * DEFAULT_SPACING_MS,
        )
        produce(bootstrap, topic, events)
        done += n
    return time.perf_counter() - started


#: The nested orders' fields: the orders' own, with the customer and the event time inside structs, two order lines
#: (a list of structs with a decimal each) and a map of decimals beside them (docs/spec.md, "Nested fields").
NESTED_FIELDS = (
    EventField("order_id", FieldType("string")),
    EventField(
        "customer",
        FieldType(
            STRUCT,
            fields=(
                EventField("id", FieldType("string")),
                EventField("address", FieldType(STRUCT, fields=(EventField("city", FieldType("string")),))),
            ),
        ),
    ),
    EventField("amount", FieldType("decimal", 12, 2)),
    EventField(
        "lines",
        FieldType(
            LIST,
            element=EventField(
                ELEMENT,
                FieldType(
                    STRUCT,
                    fields=(
                        EventField("sku", FieldType("string")),
                        EventField("qty", FieldType("long")),
                        EventField("price", FieldType("decimal", 12, 2)),
                    ),
                ),
            ),
        ),
    ),
    EventField(
        "attrs", FieldType(MAP, key=FieldType("string"), element=EventField(VALUE, FieldType("decimal", 20, 6)))
    ),
    EventField("meta", FieldType(STRUCT, fields=(EventField("event_time", FieldType("timestamp")),))),
)
NESTED_EVENT_TIME = "meta.event_time"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def nested_order(order_id: str, customer_id: str, amount: Decimal, event_time: datetime) -> dict[str, Any]:
    """One order as the nested record of :data:`NESTED_FIELDS` (14 values, the event time as ISO-8601 text)."""
    return {
        "order_id": order_id,
        "customer": {"id": customer_id, "address": {"city": f"city-{customer_id[-1]}"}},
        "amount": str(amount),
        "lines": [{"sku": "s-1", "qty": 1, "price": str(amount)}, {"sku": "s-2", "qty": 2, "price": "0.50"}],
        "attrs": {"speed": "1.500000", "load": "-0.25"},
        "meta": {"event_time": event_time.isoformat()},
    }


def nested_orders(records: int, *, seed: int, partitions: int, start_ms: int = DEFAULT_START_MS) -> list[OrderEvent]:
    """:func:`krishiv.produce.demo_orders` (none late, none malformed) as nested records: the same keys, partitions,
    ids, customers, amounts and event times."""
    events = []
    for e in demo_orders(records, seed=seed, partitions=partitions, start_ms=start_ms):
        flat = json.loads(e.value or b"{}")
        at = EPOCH + timedelta(milliseconds=flat["event_time"])
        value = nested_order(flat["order_id"], flat["customer_id"], Decimal(flat["amount"]), at)
        events.append(replace(e, value=json.dumps(value).encode()))
    return events


def produce_nested_orders(bootstrap: str, topic: str, records: int, *, seed: int, partitions: int) -> float:
    """Create ``topic`` and produce ``records`` nested orders to it, in chunks; returns the seconds it took."""
    started = time.perf_counter()
    partitions = ensure_topic(bootstrap, topic, partitions)
    done = 0
    while done < records:
        n = min(CHUNK, records - done)
        start_ms = DEFAULT_START_MS + done * DEFAULT_SPACING_MS
        produce(bootstrap, topic, nested_orders(n, seed=seed + done, partitions=partitions, start_ms=start_ms))
        done += n
    return time.perf_counter() - started
