"""The benchmark's input: seeded orders produced in chunks, so millions of events never sit in memory at once.

Each chunk is :func:`krishiv.produce.demo_orders` with its own seed and a start time after the previous
chunk, so event time keeps moving forward and windows close; one event in 10,000 is late and one malformed,
as in the demo.
"""

from __future__ import annotations

import time

from krishiv.produce import DEFAULT_SPACING_MS, DEFAULT_START_MS, demo_orders, ensure_topic, produce

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
