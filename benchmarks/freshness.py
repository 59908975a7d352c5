"""Measurement 5: freshness in continuous mode, from an event produced to it being visible in the table.

The path measured is ``krishiv run``'s: :func:`krishiv.operations.run_pipelines` in continuous mode with a 1 s
trigger, its committer beside the query committing each batch as soon as it is staged (no sensor, no
``krishiv commit``). A producer writes orders at a fixed rate with event time = now, and one in a hundred
malformed. A poller reads the catalog every 100 ms.

- A reject is visible when the rejects table holds it: produced -> visible, per event.
- A window can only be visible once an event has closed it. The pipeline here uses 1 s windows and no
  watermark delay, so a window is closed by the first event of the next second; its freshness is from that
  event's production to the window being visible.

Each reject's way is split into segments (the rejects table names the batch of each row; the run's per-batch
and per-commit callbacks and Spark's progress say when): ``trigger_wait`` (produced -> its batch's trigger
began), ``spark_batch`` (the trigger -> its batch recorded in the ledger: planning, reading, the stager),
``commit`` (recorded -> the committer's commit of the rejects table returned: wake, ledger read, catalog commit,
ledger update) and ``poll`` (committed -> seen by the poller; slightly negative when the poller saw the snapshot
before the ledger update that follows it). Their p50s are in :attr:`FreshnessResult.breakdown`.

Events produced during ``seconds`` are measured; the producer keeps going while the last of them drain.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pyspark.sql import SparkSession

from krishiv_core.spec import KrishivSpec

REJECT_EVERY = 100
POLL_S = 0.1
TRIGGER_INTERVAL_MS = 1_000
#: The issue's targets for continuous mode with a 1 s trigger.
P50_TARGET_S = 1.0
P99_TARGET_S = 2.0
SEGMENTS = ("trigger_wait", "spark_batch", "commit", "poll")


@dataclass
class FreshnessResult:
    rate: float
    seconds: float
    trigger_interval_s: float
    window_latencies_s: list[float] = field(default_factory=list)
    reject_latencies_s: list[float] = field(default_factory=list)
    unseen: int = 0
    relay_errors: list[str] = field(default_factory=list)  # what the run said about commits (outages, refusals)
    #: Segment -> its duration for each measured reject, in seconds (see the module's docstring).
    segments_s: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SEGMENTS})
    #: Per batch with rows, the Spark trigger's own durations (ms): ``triggerExecution``, ``addBatch``, ...
    batch_durations_ms: list[dict[str, int]] = field(default_factory=list)
    #: The catalog call of each commit the run's committer made (ms).
    commit_latencies_ms: list[float] = field(default_factory=list)

    @property
    def target_s(self) -> float:
        """The p50 target (``freshness p50 <= target_s``)."""
        return P50_TARGET_S

    @property
    def p99_target_s(self) -> float:
        return P99_TARGET_S

    @property
    def breakdown(self) -> dict[str, float]:
        """Each segment's p50 (seconds) over the measured rejects."""
        from benchmarks import percentile

        return {s: percentile(v, 0.5) for s, v in self.segments_s.items() if v}


class RateProducer(threading.Thread):
    """Orders at ``rate`` per second, event time = now, one in :data:`REJECT_EVERY` malformed; remembers when each
    one produced in the first ``measure_s`` seconds was produced (the Dagster freshness bench measures them all)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float, measure_s: float = math.inf) -> None:
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


class _Run(threading.Thread):
    """``krishiv run`` (continuous, committing) in a thread, with when each batch was staged and committed."""

    def __init__(self, spark: SparkSession, spec: KrishivSpec, rejects_table: str) -> None:
        super().__init__(name="bench-run", daemon=True)
        self.spark, self.spec, self.rejects_table = spark, spec, rejects_table
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.staged_at: dict[int, float] = {}  # batch id -> when the stager recorded it
        self.committed_at: dict[int, float] = {}  # batch id -> when the rejects table's commit of it returned
        self.commit_latencies_ms: list[float] = []
        self.lines: list[str] = []

    def run(self) -> None:
        from krishiv.operations import run_pipelines
        from krishiv.query_supervisor import RunClients

        def reporter(_pipeline: str):
            def staged(batch) -> None:
                if batch.recorded:
                    self.staged_at[batch.batch_id] = time.time()

            return staged

        def committed(report) -> None:
            now = time.time()
            self.commit_latencies_ms += report.commit_latencies_ms
            if report.table == self.rejects_table:
                for b in report.committed:
                    self.committed_at[b] = now

        try:
            run_pipelines(
                self.spec,
                list(self.spec.pipelines),
                once=False,
                clients=RunClients(spark=self.spark),
                holder="krishiv bench",
                reporter=reporter,
                progress=self.lines.append,
                on_commit=committed,
                stop_when=self.stop.is_set,
            )
        except BaseException as exc:  # raised by the caller
            self.error = exc


def measure_freshness(
    spark: SparkSession,
    spec: KrishivSpec,
    *,
    rate: float,
    seconds: float,
    drain_timeout_s: float = 120.0,
) -> FreshnessResult:
    from krishiv.produce import ensure_topic
    from krishiv_core.catalog import ensure_pipeline_tables, load_catalog, qualified

    pipeline = replace(spec.pipeline(), window_ms=1_000, watermark_delay_ms=0, trigger_interval_ms=TRIGGER_INTERVAL_MS)
    spec = replace(spec, pipelines=(pipeline,))
    result = FreshnessResult(rate, seconds, pipeline.trigger_interval_ms / 1000)
    partitions = ensure_topic(spec.kafka.bootstrap_servers, pipeline.topic, spec.kafka.partitions)
    catalog = load_catalog(spec)  # the poller's own
    tables = ensure_pipeline_tables(catalog, spec, pipeline)
    table, rejects = tables[pipeline.table], tables[pipeline.rejects_table]
    run = _Run(spark, spec, qualified(spec, pipeline.rejects_table))
    run.start()
    # Spark's start-up and the query's first batch (its Python workers start) are not what this measures.
    _warm_up(spec, partitions, run)
    producer = RateProducer(spec.kafka.bootstrap_servers, pipeline.topic, partitions, rate, seconds)
    producer.start()
    windows_seen: dict[int, float] = {}
    rejects_seen: dict[int, tuple[float, int]] = {}  # seq -> (when seen, its batch)
    progress: dict[int, dict[str, Any]] = {}  # batch id -> Spark's progress of it
    try:
        snapshot_ids: tuple[int | None, int | None] = (None, None)
        deadline = time.time() + seconds + drain_timeout_s
        while time.time() < deadline:
            time.sleep(POLL_S)
            if producer.error is not None:
                raise producer.error
            if run.error is not None:
                raise run.error
            table, rejects = table.refresh(), rejects.refresh()
            current = (_snapshot_id(table), _snapshot_id(rejects))
            if current != snapshot_ids:
                now = time.time()
                snapshot_ids = current  # type: ignore[assignment]
                for start in table.scan(selected_fields=("window_start",)).to_arrow().column(0).to_pylist():
                    windows_seen.setdefault(int(start.timestamp()), now)
                seen = rejects.scan(selected_fields=("value", "batch_id")).to_arrow()
                for value, batch in zip(seen.column(0).to_pylist(), seen.column(1).to_pylist(), strict=True):
                    order = json.loads(value)["order_id"]
                    if order.startswith("bad-"):  # not the warm-up's
                        rejects_seen.setdefault(int(order.removeprefix("bad-")), (now, batch))
                _collect_progress(spark, pipeline.name, progress)
            if time.time() > producer.measure_until and _all_seen(producer, windows_seen, rejects_seen):
                break
        _collect_progress(spark, pipeline.name, progress)
    finally:
        producer.stop.set()
        run.stop.set()
        producer.join(30)
        run.join(120)
    result.relay_errors = [line for line in run.lines if "commits" in line]
    result.commit_latencies_ms = run.commit_latencies_ms
    for second, closed_at in _measured_windows(producer).items():
        if second in windows_seen:
            result.window_latencies_s.append(windows_seen[second] - closed_at)
        else:
            result.unseen += 1
    for seq, produced in producer.rejects.items():
        if seq in rejects_seen:
            seen_at, batch = rejects_seen[seq]
            result.reject_latencies_s.append(seen_at - produced)
            _split(result, produced, seen_at, batch, run, progress)
        else:
            result.unseen += 1
    result.batch_durations_ms = [
        dict(p["durationMs"]) for b, p in sorted(progress.items()) if p.get("numInputRows") and b in run.staged_at
    ]
    return result


def _warm_up(spec: KrishivSpec, partitions: int, run: _Run, timeout_s: float = 600.0) -> None:
    """Until a first batch of a few orders is staged: the query's source is up and its Python workers have started.
    Those orders are not measured."""
    from confluent_kafka import Producer

    pipeline = spec.pipeline()
    deadline = time.monotonic() + timeout_s
    producer = Producer({"bootstrap.servers": spec.kafka.bootstrap_servers})
    event_ms = int(time.time() * 1000)
    for p in range(partitions):
        good = {"order_id": f"warm-{p}", "customer_id": "c", "amount": "1.00", "event_time": event_ms}
        producer.produce(pipeline.topic, value=json.dumps(good).encode(), partition=p)
    producer.flush(30)
    while time.monotonic() < deadline and run.is_alive() and not run.staged_at:
        time.sleep(0.1)
    if run.error is not None:
        raise run.error
    if not run.staged_at:
        raise TimeoutError(f"the warm-up batch of {pipeline.name} was not staged within {timeout_s:.0f}s")


def _collect_progress(spark: SparkSession, name: str, into: dict[int, dict[str, Any]]) -> None:
    """Spark's recent progress of the query named ``name`` (it keeps the last 100 triggers), by batch id."""
    for query in spark.streams.active:
        if query.name == name:
            for p in query.recentProgress:
                into[int(p["batchId"])] = {
                    "timestamp": p["timestamp"],
                    "durationMs": p["durationMs"],
                    "numInputRows": p["numInputRows"],
                }


def _split(
    result: FreshnessResult, produced: float, seen_at: float, batch: int, run: _Run, progress: dict[int, dict[str, Any]]
) -> None:
    """One reject's way in segments, when every moment of it is known."""
    staged, committed, started = run.staged_at.get(batch), run.committed_at.get(batch), progress.get(batch)
    if staged is None or committed is None or started is None:
        return
    trigger = datetime.fromisoformat(started["timestamp"].replace("Z", "+00:00")).timestamp()
    for name, seconds in zip(
        SEGMENTS, (trigger - produced, staged - trigger, committed - staged, seen_at - committed), strict=True
    ):
        result.segments_s[name].append(seconds)


def _snapshot_id(table) -> int | None:
    snapshot = table.current_snapshot()
    return snapshot.snapshot_id if snapshot else None


def _measured_windows(producer: RateProducer) -> dict[int, float]:
    """Second -> when the event closing it was produced, for the windows closed while measuring."""
    opened = dict(producer.window_opened)
    return {
        second: opened[second + 1]
        for second in opened
        if second + 1 in opened and opened[second + 1] < producer.measure_until
    }


def _all_seen(producer: RateProducer, windows: dict[int, float], rejects: dict[int, Any]) -> bool:
    return all(s in windows for s in _measured_windows(producer)) and all(s in rejects for s in list(producer.rejects))
