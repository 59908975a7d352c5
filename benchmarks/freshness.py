"""Measurement 5: freshness in continuous mode, from an event produced to it being visible in the table.

A producer writes orders at a fixed rate with event time = now, and one in a hundred malformed. The staging
query runs continuously at the pipeline's trigger interval, and the relay runs every ``sensor_interval_s``
as the Dagster outbox sensor would start it. A poller watches the catalog every 100 ms.

- A reject is visible when the rejects table holds it: produced -> visible, per event.
- A window can only be visible once an event has closed it. The pipeline here uses 1 s windows and no
  watermark delay, so a window is closed by the first event of the next second; its freshness is from that
  event's production to the window being visible.

Events produced during ``seconds`` are measured; the producer keeps going while the last of them drain.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field, replace

from pyspark.sql import SparkSession

from krishiv_core.spec import KrishivSpec

REJECT_EVERY = 100
POLL_S = 0.1


@dataclass
class FreshnessResult:
    rate: float
    seconds: float
    trigger_interval_s: float
    sensor_interval_s: float
    window_latencies_s: list[float] = field(default_factory=list)
    reject_latencies_s: list[float] = field(default_factory=list)
    unseen: int = 0
    relay_errors: list[str] = field(default_factory=list)

    @property
    def target_s(self) -> float:
        return self.trigger_interval_s + self.sensor_interval_s + 2.0


class _Producer(threading.Thread):
    """Orders at ``rate`` per second, remembering when each measured one was produced."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float, measure_s: float) -> None:
        super().__init__(name="bench-producer", daemon=True)
        self.bootstrap, self.topic, self.partitions, self.rate = bootstrap, topic, partitions, rate
        self.started = time.time()
        self.measure_until = self.started + measure_s
        self.window_opened: dict[int, float] = {}  # second -> when its first event was produced
        self.rejects: dict[int, float] = {}  # seq -> when produced
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        seq = 0
        try:
            while not self.stop.is_set():
                now = time.time()
                due = int((now - self.started) * self.rate)
                for _ in range(due - seq):
                    self._produce_one(producer, seq, now)
                    seq += 1
                producer.poll(0)
                time.sleep(0.005)
        except BaseException as exc:  # reported by the caller; the thread must not die silently
            self.error = exc
        finally:
            producer.flush(10)

    def _produce_one(self, producer, seq: int, now: float) -> None:
        event_ms = int(now * 1000)
        measured = now < self.measure_until
        if seq % REJECT_EVERY == REJECT_EVERY - 1:
            value = json.dumps({"order_id": f"bad-{seq}", "customer_id": "c", "amount": "abc", "event_time": event_ms})
            if measured:
                self.rejects[seq] = now
        else:
            value = json.dumps({"order_id": f"o-{seq}", "customer_id": "c", "amount": "1.00", "event_time": event_ms})
            self.window_opened.setdefault(event_ms // 1000, now)
        producer.produce(self.topic, value=value.encode(), partition=seq % self.partitions)


def measure_freshness(
    spark: SparkSession,
    spec: KrishivSpec,
    *,
    rate: float,
    seconds: float,
    sensor_interval_s: float,
    drain_timeout_s: float = 120.0,
) -> FreshnessResult:
    from krishiv.operations import commit_pipelines, open_ledger
    from krishiv.produce import ensure_topic
    from krishiv_core.catalog import ensure_pipeline_tables, load_catalog
    from spark_jobs.job import start_pipeline, stop_between_batches

    pipeline = replace(spec.pipeline(), window_ms=1_000, watermark_delay_ms=0)
    spec = replace(spec, pipelines=(pipeline,))
    result = FreshnessResult(rate, seconds, pipeline.trigger_interval_ms / 1000, sensor_interval_s)
    partitions = ensure_topic(spec.kafka.bootstrap_servers, pipeline.topic, spec.kafka.partitions)
    catalog = load_catalog(spec)
    tables = ensure_pipeline_tables(catalog, spec, pipeline)
    table, rejects = tables[pipeline.table], tables[pipeline.rejects_table]
    running = start_pipeline(spark, spec, pipeline, catalog, open_ledger(spec), once=False)
    producer = _Producer(spec.kafka.bootstrap_servers, pipeline.topic, partitions, rate, seconds)
    stop_relay = threading.Event()

    def relay() -> None:
        while not stop_relay.wait(sensor_interval_s):
            try:
                commit_pipelines(spec, [pipeline])
            except Exception as exc:  # noted in the result; the next round retries, as the sensor would
                result.relay_errors.append(str(exc).splitlines()[0])

    relay_thread = threading.Thread(target=relay, name="bench-relay", daemon=True)
    producer.start()
    relay_thread.start()
    windows_seen: dict[int, float] = {}
    rejects_seen: dict[int, float] = {}
    try:
        snapshot_ids: tuple[int | None, int | None] = (None, None)
        deadline = time.time() + seconds + drain_timeout_s
        while time.time() < deadline:
            time.sleep(POLL_S)
            if producer.error is not None:
                raise producer.error
            table, rejects = table.refresh(), rejects.refresh()
            current = (_snapshot_id(table), _snapshot_id(rejects))
            if current != snapshot_ids:
                now = time.time()
                snapshot_ids = current  # type: ignore[assignment]
                for start in table.scan(selected_fields=("window_start",)).to_arrow().column(0).to_pylist():
                    windows_seen.setdefault(int(start.timestamp()), now)
                for value in rejects.scan(selected_fields=("value",)).to_arrow().column(0).to_pylist():
                    rejects_seen.setdefault(int(json.loads(value)["order_id"].removeprefix("bad-")), now)
            if time.time() > producer.measure_until and _all_seen(producer, windows_seen, rejects_seen):
                break
    finally:
        producer.stop.set()
        stop_relay.set()
        stop_between_batches(running.query)
        producer.join(30)
        relay_thread.join(60)
    for second, closed_at in _measured_windows(producer).items():
        if second in windows_seen:
            result.window_latencies_s.append(windows_seen[second] - closed_at)
        else:
            result.unseen += 1
    for seq, produced in producer.rejects.items():
        if seq in rejects_seen:
            result.reject_latencies_s.append(rejects_seen[seq] - produced)
        else:
            result.unseen += 1
    return result


def _snapshot_id(table) -> int | None:
    snapshot = table.current_snapshot()
    return snapshot.snapshot_id if snapshot else None


def _measured_windows(producer: _Producer) -> dict[int, float]:
    """Second -> when the event closing it was produced, for the windows closed while measuring."""
    opened = dict(producer.window_opened)
    return {
        second: opened[second + 1]
        for second in opened
        if second + 1 in opened and opened[second + 1] < producer.measure_until
    }


def _all_seen(producer: _Producer, windows: dict[int, float], rejects: dict[int, float]) -> bool:
    return all(s in windows for s in _measured_windows(producer)) and all(s in rejects for s in list(producer.rejects))
