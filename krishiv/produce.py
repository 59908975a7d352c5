"""Seeded demo order events and a producer that writes them to Kafka.

Orders carry ``order_id``, ``customer_id``, ``amount`` (a decimal with two places, as JSON text) and
``event_time`` (epoch milliseconds). On request some events are late (ten minutes behind, placed in the
last quarter of the stream so the watermark has moved past them) and some are malformed, one of each kind
the Spark job must quarantine. Records go round-robin over partitions so every partition advances alike.
The last record of each partition is flushed in a batch of its own: Tansu reports a partition's high
watermark as the base offset of its last batch + 1, and this keeps every record below it.
"""

from __future__ import annotations

import json
import random
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal

from krishiv_core.errors import BrokerUnavailable

DEFAULT_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
DEFAULT_SPACING_MS = 50
LATE_BY_MS = 10 * 60_000
#: How long records may stay unacknowledged before ``produce`` gives up on the broker.
FLUSH_TIMEOUT_S = 30.0
#: How long ``produce`` waits on a broker that refuses connections (it may be restarting) before it gives up.
REFUSED_FOR_S = 5.0
MALFORMED_VALUES: tuple[tuple[bytes, str], ...] = (
    (b'{"order_id": "o-bad", "amount": "1.00", "event_time": ', "malformed JSON"),
    (b'{"order_id": "o-bad", "customer_id": "c-1", "event_time": 1767225600000}', "missing field: amount"),
    (b'{"order_id": "o-bad", "customer_id": "c-1", "amount": "abc", "event_time": 1767225600000}', "mistyped field"),
    (b'{"order_id": "o-bad", "customer_id": "c-1", "amount": "1.00", "event_time": null}', "null field: event_time"),
    (b"[1, 2, 3]", "malformed JSON"),
    (b'{"order_id": "o-bad", "customer_id": "c-1", "amount": "1.005", "event_time": 1767225600000}', "mistyped field"),
)


@dataclass(frozen=True)
class OrderEvent:
    """One record to produce, with what the generator meant by it (for tests and the demo's summary)."""

    seq: int
    partition: int
    key: bytes | None
    value: bytes | None
    kind: str  # "valid", "late" or "malformed"
    event_time_ms: int | None = None
    amount: Decimal | None = None


def demo_orders(
    records: int,
    *,
    seed: int = 7,
    partitions: int = 4,
    late: int = 0,
    malformed: int = 0,
    start_ms: int = DEFAULT_START_MS,
    spacing_ms: int = DEFAULT_SPACING_MS,
    jitter_ms: int = 1_000,
) -> list[OrderEvent]:
    """``records`` events in total, of which ``late`` are late and ``malformed`` are malformed."""
    if late + malformed > records:
        raise ValueError(f"late ({late}) + malformed ({malformed}) exceed records ({records})")
    rng = random.Random(seed)
    special_from = records - records // 4
    special = rng.sample(range(special_from if late + malformed <= records // 4 else 0, records), late + malformed)
    late_at, malformed_at = set(special[:late]), set(special[late:])
    events = []
    for seq in range(records):
        partition = seq % partitions
        key = f"c-{rng.randrange(1000):03d}".encode()
        if seq in malformed_at:
            value, _ = MALFORMED_VALUES[len([m for m in malformed_at if m < seq]) % len(MALFORMED_VALUES)]
            events.append(OrderEvent(seq, partition, key, value, "malformed"))
            continue
        now = start_ms + seq * spacing_ms + rng.randint(-jitter_ms, jitter_ms)
        event_time = now - LATE_BY_MS if seq in late_at else now
        amount = Decimal(rng.randint(100, 50_000)) / 100
        value = json.dumps(
            {
                "order_id": f"o-{seed}-{seq:08d}",
                "customer_id": key.decode(),
                "amount": str(amount),
                "event_time": event_time,
            }
        ).encode()
        events.append(OrderEvent(seq, partition, key, value, "late" if seq in late_at else "valid", event_time, amount))
    return events


def file_events(lines: Iterable[str], partitions: int, key_field: str | None, where: str) -> list[OrderEvent]:
    """One record per non-empty line of a JSON lines file, its text as the value, sent as it is (a line that is not
    a JSON object is produced too: Krishiv makes it a reject with its reason). With ``key_field`` the Kafka key is
    that field of the line (or the value at a dotted path, ``van.id``: a string as its text, any other value as its
    JSON), and the partition the key's CRC32
    modulo the partition count, as librdkafka's default partitioner puts a key; without one, lines go round the
    partitions in turn. A line that is not a JSON object, or has no such field (or a null), is sent as it is without a
    key, round the partitions too: it becomes a reject, or an event without a key, as the pipeline reads it. Blank
    lines are skipped."""
    events = []
    for text in (line.rstrip("\r\n") for line in lines):
        if not text.strip():
            continue
        key = _key_of(text, key_field) if key_field is not None else None
        partition = zlib.crc32(key) % partitions if key is not None else len(events) % partitions
        events.append(OrderEvent(len(events), partition, key, text.encode(), "valid"))
    return events


def _key_of(text: str, field: str) -> bytes | None:
    """The Kafka key of a JSON line: its ``field``, or the value at a dotted path into its objects (``van.id``), a
    string as its text, any other value as its JSON; or None."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    for part in field.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return None
    return (value if isinstance(value, str) else json.dumps(value)).encode()


def ensure_topic(
    bootstrap: str,
    topic: str,
    partitions: int,
    timeout_s: float = 15.0,
    *,
    settings: Mapping[str, str] | None = None,
) -> int:
    """Create the topic if missing; returns its partition count.

    ``settings``: the librdkafka settings of the spec (``spec.kafka.client_settings()``: ``[kafka.properties]`` with
    its secrets resolved); ``bootstrap`` wins over theirs. A broker that cannot be reached or refuses the client is
    one :class:`BrokerUnavailable` line naming the cause, as soon as it is known.
    """
    from confluent_kafka.admin import AdminClient, NewTopic

    from spark_jobs.kafka_clients import KafkaProblems, build, list_topics

    config = {**(settings or {}), "bootstrap.servers": bootstrap}
    problems = KafkaProblems(config)
    admin = build(AdminClient, config, problems)
    existing = list_topics(admin, problems, bootstrap, timeout_s).topics
    if topic in existing and existing[topic].partitions:
        return len(existing[topic].partitions)
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    for future in futures.values():
        try:
            future.result(timeout_s)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                problems.serve(admin)
                raise BrokerUnavailable(
                    problems.scrub(f"Kafka broker at {bootstrap} did not create topic {topic!r}: {exc}")
                ) from None
    return partitions


def produce(
    bootstrap: str,
    topic: str,
    events: list[OrderEvent],
    *,
    rate: float | None = None,
    on_progress: Callable[[int], None] | None = None,
    settings: Mapping[str, str] | None = None,
) -> None:
    """Write ``events`` in order; with ``rate`` (events/s) paced by the wall clock.

    ``settings`` as for :func:`ensure_topic`. Stops with one :class:`BrokerUnavailable` line as soon as the broker
    refuses the client (authentication, TLS), or when records stay unacknowledged for :data:`FLUSH_TIMEOUT_S`.
    """
    from confluent_kafka import Producer

    from spark_jobs.kafka_clients import KafkaProblems, build

    config = {
        **(settings or {}),
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "enable.idempotence": False,
        "queue.buffering.max.messages": 1_000_000,
    }
    problems = KafkaProblems(config)
    producer = build(Producer, config, problems)
    failures: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    def flush() -> None:
        """Wait for every record's acknowledgement; give up at once if the broker refused the client, after
        :data:`REFUSED_FOR_S` of refused connections, or after :data:`FLUSH_TIMEOUT_S`."""
        started = time.monotonic()
        deadline = started + FLUSH_TIMEOUT_S
        while True:
            remaining = producer.flush(min(0.5, max(0.0, deadline - time.monotonic())))
            now = time.monotonic()
            if not remaining and not failures:
                return
            refused_long = problems.refused() and now - started >= REFUSED_FOR_S
            if failures or problems.fatal() or refused_long or now >= deadline:
                cause = problems.cause() or "; ".join(failures[:3]) or f"no acknowledgement within {FLUSH_TIMEOUT_S:g}s"
                raise BrokerUnavailable(
                    problems.scrub(
                        f"{remaining} of {len(events)} records were not acknowledged by {bootstrap}: {cause}"
                    )
                )

    last_of_partition = {}
    for e in events:
        last_of_partition[e.partition] = e.seq
    tail = set(last_of_partition.values())
    started = time.monotonic()
    for n, e in enumerate(_paced(events, rate, started), start=1):
        if e.seq in tail:
            flush()
        producer.produce(topic, value=e.value, key=e.key, partition=e.partition, on_delivery=delivered)
        if e.seq in tail:
            flush()
        if n % 10_000 == 0:
            producer.poll(0)
            if problems.fatal():
                raise BrokerUnavailable(problems.describe(bootstrap))
            if on_progress:
                on_progress(n)
    flush()
    if on_progress:
        on_progress(len(events))


def _paced(events: list[OrderEvent], rate: float | None, started: float) -> Iterator[OrderEvent]:
    for n, e in enumerate(events):
        if rate:
            wait = started + n / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        yield e
