"""Measurement 1, the limit: the topic read with plain ``confluent-kafka``, one process per partition.

Each reader uses the Spark source's consumer settings and only counts records and value bytes. The clock
runs from a barrier that all readers (already connected and assigned) pass together until the last one has
read its partition to the end, so process start-up is not counted.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass

from spark_jobs.kafka_source import consumer_config, latest_offsets


@dataclass(frozen=True)
class RawConsumeResult:
    records: int
    value_bytes: int
    seconds: float
    readers: int

    @property
    def events_per_s(self) -> float:
        return self.records / self.seconds


def _read_partition(bootstrap: str, topic: str, partition: int, end: int, barrier, results) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(consumer_config(bootstrap, {}))
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


def raw_consume(bootstrap: str, topic: str, timeout_s: float = 600) -> RawConsumeResult:
    ends = {int(p): end for p, end in latest_offsets(bootstrap, topic).items()}
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(len(ends) + 1), ctx.Queue()
    readers = [
        ctx.Process(target=_read_partition, args=(bootstrap, topic, p, end, barrier, results), daemon=True)
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
    return RawConsumeResult(sum(c[0] for c in counts), sum(c[1] for c in counts), seconds, len(readers))
