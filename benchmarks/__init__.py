"""``make bench`` (``python -m benchmarks``): the exactly-once pipeline measured beside the raw Kafka limit and an
at-least-once baseline."""

from __future__ import annotations

DEFAULT_POSTGRES_URI = "postgresql+psycopg://postgres@127.0.0.1:5432/test"  # the relay's second catalog


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by the nearest-rank method; NaN if there are none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")
