"""Measurement 1, the limit: the topic read with plain ``confluent-kafka``, one process per partition.

Each reader only counts records and value bytes. The clock runs from a barrier that all readers (already connected
and assigned) pass together until the last one has read its partition to the end, so process start-up is not
counted. The limit is read with the best settings found (the source's own for a range of the partition's size,
:func:`spark_jobs.kafka_source.range_consumer_config`: librdkafka may queue the whole partition), and again with
librdkafka's queueing defaults beside it, which pause a partition's fetching for a second once 100,000 records are
queued.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass
from typing import Any

from spark_jobs.kafka_source import consumer_config, latest_offsets, range_consumer_config


@dataclass(frozen=True)
class RawConsumeResult:
    records: int
    value_bytes: int
    seconds: float
    readers: int
    settings: dict[str, Any]  # what each reader set beyond the source's base settings

    @property
    def events_per_s(self) -> float:
        return self.records / self.seconds


def tuned_settings(records: int) -> dict[str, Any]:
    """The settings the source's range consumer adds for a range of ``records`` offsets."""
    base = consumer_config("", {})
    return {k: v for k, v in range_consumer_config(base, records).items() if base.get(k) != v}


def _read_partition(bootstrap: str, topic: str, partition: int, end: int, settings, barrier, results) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**consumer_config(bootstrap, {}), **settings})
    consumer.assign([TopicPartition(topic, partition, 0)])
    barrier.wait()
    records = size = 0
    next_offset = 0
    while next_offset < end:
        for m in consumer.consume(10_000, timeout=0.5):
            if m.error() is None and m.offset() < end:
                records += 1
                size += len(m.value() or b"")
                next_offset = m.offset() + 1
    consumer.close()
    results.put((records, size))


def raw_consume(bootstrap: str, topic: str, *, tuned: bool = True, timeout_s: float = 600) -> RawConsumeResult:
    """The topic read to its end; ``tuned``: with the source's range settings for a whole partition, else with
    librdkafka's queueing defaults."""
    ends = {int(p): end for p, end in latest_offsets(bootstrap, topic).items()}
    settings = tuned_settings(max(ends.values(), default=0)) if tuned else {}
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(len(ends) + 1), ctx.Queue()
    readers = [
        ctx.Process(target=_read_partition, args=(bootstrap, topic, p, end, settings, barrier, results), daemon=True)
        for p, end in ends.items()
    ]
    for r in readers:
        r.start()
    try:
        barrier.wait(timeout=60)
        started = time.perf_counter()
        counts = [results.get(timeout=timeout_s) for _ in readers]
        seconds = time.perf_counter() - started
    finally:
        for r in readers:
            r.join(5)
            if r.is_alive():
                r.kill()
    return RawConsumeResult(sum(c[0] for c in counts), sum(c[1] for c in counts), seconds, len(readers), settings)
