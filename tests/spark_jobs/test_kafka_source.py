"""The Kafka source on its own.

Most cases are ones the local broker (Tansu) cannot produce: aborted transactions and compaction, retention, a
partition with a low watermark above 0, a broker that stalls. Those run against :class:`ScriptedConsumer`, a
consumer double that replays a recorded fetch sequence through the source's one seam (:class:`KafkaClients`).
What Tansu can do runs against it: commit markers (offset gaps, a range ending on a control record), the topic's
identity, a re-created topic.
"""

from __future__ import annotations

import json
import random
import re
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic, PartitionMetadata, TopicMetadata
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from krishiv.broker import LocalBroker
from krishiv.produce import ensure_topic
from krishiv_core.spec import FORCED_CONSUMER_SETTINGS
from spark_jobs import kafka_source
from spark_jobs.checkpoint import BatchOffsets
from spark_jobs.errors import KafkaSourceError, OffsetsDeleted, OffsetsMovedBackwards, SourceChanged
from spark_jobs.kafka_source import (
    RANGE_QUEUE_KBYTES,
    RANGE_QUEUE_MAX_RECORDS,
    TASK_PACK_RECORDS,
    KafkaAdmin,
    KafkaClients,
    KafkaRange,
    KafkaSplit,
    KafkaStreamReader,
    batch_rows,
    cap_offsets,
    consumer_config,
    range_consumer_config,
    read_range,
)

TOPIC = "orders"
PIPELINE = "orders_per_minute"
BOOTSTRAP = "double:9092"
SHORT_RECHECKS = (0.01, 0.01)  # the reader's watermark re-reads, shortened from ~2 s
WAIT_S = 15.0


# ----------------------------------------------------------------------------------------------- the doubles


@dataclass
class Message:
    """What ``Consumer.consume`` hands over: a record, or an error event."""

    _offset: int
    _error: KafkaError | None = None

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return f"k{self._offset}".encode()

    def value(self) -> bytes:
        return f"v{self._offset}".encode()

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000 + self._offset)

    def error(self) -> KafkaError | None:
        return self._error


@dataclass
class Fetch:
    """One ``consume`` answer: records at ``offsets``; then the position is ``then`` (past control records the
    consumer skipped without handing anything over) or the last offset + 1."""

    offsets: list[int]
    then: int | None = None
    error: int | None = None  # a KafkaError code delivered as an error event after the records


@dataclass
class ScriptedConsumer:
    """A ``confluent_kafka.Consumer`` double: replays scripted fetches and watermarks, and records every call.

    ``watermarks`` holds a sequence of ``(low, high)`` answers per partition; the last one repeats.
    """

    fetches: list[Fetch] = field(default_factory=list)
    watermarks: dict[int, list[tuple[int, int]]] = field(default_factory=lambda: {0: [(0, 1_000)]})
    cluster_id: str | None = "cluster-a"
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    configs: list[dict[str, Any]] = field(default_factory=list)
    _position: int = -1001  # librdkafka's OFFSET_INVALID until assigned

    def __call__(self, config: dict[str, Any]) -> ScriptedConsumer:
        """The factory of :class:`KafkaClients`: every client the source makes is this double."""
        self.configs.append(config)
        return self

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        self.calls.append(("list_topics", topic))
        metadata = ClusterMetadata()
        metadata.cluster_id = self.cluster_id
        described = TopicMetadata()
        described.topic = TOPIC
        described.partitions = {p: PartitionMetadata() for p in self.watermarks}
        metadata.topics = {TOPIC: described}
        return metadata

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        self.calls.append(("get_watermark_offsets", partition.partition))
        answers = self.watermarks[partition.partition]
        return answers.pop(0) if len(answers) > 1 else answers[0]

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(("assign", [(tp.topic, tp.partition, tp.offset) for tp in partitions]))
        self._position = partitions[0].offset

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        self.calls.append(("consume", num_messages))
        if not self.fetches:
            return []
        fetch = self.fetches[0]
        given, rest = fetch.offsets[:num_messages], fetch.offsets[num_messages:]
        if rest:  # a real consumer hands over at most num_messages; the rest comes with the next call
            self.fetches[0] = Fetch(rest, fetch.then, fetch.error)
        else:
            self.fetches.pop(0)
        msgs = [Message(o) for o in given]
        if given:
            self._position = given[-1] + 1
        if not rest:
            if fetch.then is not None:
                self._position = fetch.then
            if fetch.error is not None:
                msgs.append(Message(self._position, KafkaError(fetch.error)))
        return msgs

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        self.calls.append(("position",))
        return [TopicPartition(tp.topic, tp.partition, self._position) for tp in partitions]

    def close(self) -> None:
        self.calls.append(("close",))

    def count(self, name: str) -> int:
        return sum(1 for call in self.calls if call[0] == name)


@dataclass
class ScriptedAdmin:
    """An ``AdminClient`` double answering DescribeTopics with ``topic_id`` (or ``error``, a KafkaError code)."""

    topic_id: str | None = "topic-1"
    error: int | None = None
    described: int = 0

    def __call__(self, config: dict[str, Any]) -> ScriptedAdmin:
        return self

    def describe_topics(self, topics: Any, **kwargs: Any) -> dict[str, Future]:
        self.described += 1
        answer: Future = Future()
        if self.error is not None:
            answer.set_exception(KafkaException(KafkaError(self.error)))
        else:
            answer.set_result(SimpleNamespace(topic_id=self.topic_id))
        return {name: answer for name in topics.topic_names}


def read(consumer: ScriptedConsumer, start: int, end: int, timeout_s: float = 30.0) -> list[int]:
    """The offsets ``read_range`` yields for ``[start, end)`` of partition 0."""
    part = KafkaRange(TOPIC, 0, start, end, consumer_config(BOOTSTRAP, {}), timeout_s, PIPELINE)
    batches = list(read_range(part, KafkaClients(consumer=consumer)))
    for batch in batches:
        assert batch.schema.field("offset").type == pa.int64()
    return [o for batch in batches for o in batch.column("offset").to_pylist()]


def ranges_of(splits: list[KafkaSplit]) -> list[tuple[int, int, int]]:
    """The ranges of a batch's tasks, in order, as (partition, start, end)."""
    return [(r.partition, r.start, r.end) for split in splits for r in split.ranges]


def reader(consumer: ScriptedConsumer, admin: ScriptedAdmin | None = None, **options: str) -> KafkaStreamReader:
    source = KafkaStreamReader(
        {"bootstrap.servers": BOOTSTRAP, "topic": TOPIC, "pipeline": PIPELINE, **options},
        KafkaClients(consumer=consumer, admin=admin or ScriptedAdmin()),
    )
    source.recheck_delays_s = SHORT_RECHECKS
    return source


# ------------------------------------------------------------------------------------------- reading a range


def test_offset_gaps_still_read_exactly_the_records_in_range() -> None:
    # 13-14: an aborted transaction and its marker; 17-19 compacted away; 26-27 a commit marker and a gap.
    consumer = ScriptedConsumer(fetches=[Fetch([10, 11, 12, 15, 16, 20]), Fetch([21, 22, 23, 24, 25]), Fetch([28, 29])])
    assert read(consumer, 10, 30) == [10, 11, 12, 15, 16, 20, 21, 22, 23, 24, 25, 28, 29]
    assert ("assign", [(TOPIC, 0, 10)]) in consumer.calls
    assert consumer.calls[-1] == ("close",)
    assert consumer.count("position") == 0, "a range ending on a record needs no position check"


def test_a_range_ending_on_control_records_ends_without_waiting() -> None:
    # Offsets 7-9 are transaction markers: nothing more comes, but the position moves past them to the end.
    consumer = ScriptedConsumer(fetches=[Fetch([0, 1, 2, 3, 4, 5, 6], then=10)])
    began = time.monotonic()
    assert read(consumer, 0, 10, timeout_s=60.0) == [0, 1, 2, 3, 4, 5, 6]
    assert time.monotonic() - began < 1.0
    assert consumer.count("position") == 1


def test_a_range_made_only_of_control_records_reads_nothing() -> None:
    consumer = ScriptedConsumer(fetches=[Fetch([], then=40)])
    assert read(consumer, 35, 40) == []
    assert consumer.calls[-1] == ("close",)


def test_records_before_start_and_at_or_beyond_end_are_dropped() -> None:
    consumer = ScriptedConsumer(fetches=[Fetch([8, 9, 10, 11]), Fetch([12, 14, 15, 16])])
    assert read(consumer, 10, 15) == [10, 11, 12, 14]


def test_consume_is_never_asked_for_more_than_the_range_holds() -> None:
    consumer = ScriptedConsumer(fetches=[Fetch(list(range(100, 110)))])
    assert read(consumer, 100, 103) == [100, 101, 102]
    assert [c[1] for c in consumer.calls if c[0] == "consume"] == [3]


def test_offsets_deleted_by_retention_fail_the_task_naming_them() -> None:
    consumer = ScriptedConsumer(watermarks={0: [(15, 100)]}, fetches=[Fetch([15, 16])])
    with pytest.raises(OffsetsDeleted) as info:
        read(consumer, 10, 20)
    message = str(info.value)
    assert "[10, 15)" in message and f"{TOPIC}/0" in message
    assert (
        f'krishiv skip-offsets --pipeline {PIPELINE} --partition 0 --to 15 --reason "deleted by retention"' in message
    )
    assert consumer.count("consume") == 0 and consumer.calls[-1] == ("close",)


def test_an_offset_reset_while_reading_is_offsets_deleted() -> None:
    consumer = ScriptedConsumer(fetches=[Fetch([10, 11], error=KafkaError._AUTO_OFFSET_RESET)])
    with pytest.raises(OffsetsDeleted, match=r"orders/0 \[10, 20\).*offset 12"):
        read(consumer, 10, 20)


def test_a_broker_error_while_reading_names_the_range() -> None:
    consumer = ScriptedConsumer(fetches=[Fetch([10], error=KafkaError.TOPIC_AUTHORIZATION_FAILED)])
    with pytest.raises(KafkaSourceError, match=r"reading orders/0 \[10, 20\) from double:9092 failed"):
        read(consumer, 10, 20)


def test_a_broker_out_of_reach_while_reading_is_waited_for() -> None:
    # librdkafka reports the lost connection and reconnects by itself: the range goes on when records come again.
    consumer = ScriptedConsumer(
        fetches=[
            Fetch([10, 11], error=KafkaError._TRANSPORT),
            Fetch([], error=KafkaError._ALL_BROKERS_DOWN),
            Fetch(list(range(12, 20))),
        ]
    )
    assert read(consumer, 10, 20) == list(range(10, 20))


def test_a_range_whose_end_is_gone_fails_at_once_with_the_exact_command() -> None:
    # The batch recorded [10, 20); the topic was re-created and holds 3 records: waiting would never end the range.
    consumer = ScriptedConsumer(watermarks={0: [(0, 3)]}, fetches=[])
    began = time.monotonic()
    with pytest.raises(OffsetsMovedBackwards) as info:
        read(consumer, 10, 20, timeout_s=120.0)
    assert time.monotonic() - began < 10, "refused at once, not after the read timeout"
    message = str(info.value)
    assert "high watermark 3 is below the batch's end offset 20" in message
    assert f'krishiv skip-offsets --pipeline {PIPELINE} --partition 0 --to 0 --reason "orders re-created' in message


def test_a_stuck_partition_fails_after_the_timeout() -> None:
    consumer = ScriptedConsumer(fetches=[Fetch([0, 1, 2])])  # then nothing, and the position stays at 3
    began = time.monotonic()
    with pytest.raises(KafkaSourceError, match=r"stuck at offset 3"):
        read(consumer, 0, 10, timeout_s=0.05)
    assert 0.05 <= time.monotonic() - began < 2.0
    assert consumer.calls[-1] == ("close",)


# ---------------------------------------------------------------------------------------------- cap_offsets


def test_cap_offsets_shares_the_limit_in_proportion_to_backlog() -> None:
    start = {"0": 0, "1": 100, "2": 5}
    assert cap_offsets(start, {"0": 600, "1": 400, "2": 105}, 100) == {"0": 60, "1": 130, "2": 15}


def test_cap_offsets_takes_the_exact_total_and_never_more_than_a_backlog() -> None:
    rng = random.Random(12)
    for _ in range(500):
        n = rng.randint(1, 6)
        start = {str(p): rng.randint(0, 50) for p in range(n)}
        latest = {p: s + rng.choice([0, 0, 1, 2, rng.randint(0, 1_000)]) for p, s in start.items()}
        limit = rng.randint(1, 300)
        end = cap_offsets(start, latest, limit)
        backlog = sum(latest[p] - start[p] for p in latest)
        assert sum(end[p] - start[p] for p in end) == min(limit, backlog)
        assert all(start[p] <= end[p] <= latest[p] for p in end)
        if backlog > limit:  # each partition gets its exact share rounded down or up
            assert all(abs((end[p] - start[p]) - (latest[p] - start[p]) * limit / backlog) < 1 for p in end)


def test_cap_offsets_leaves_partitions_without_backlog_and_everything_under_the_limit() -> None:
    assert cap_offsets({"0": 7, "1": 0}, {"0": 7, "1": 30}, 10) == {"0": 7, "1": 10}
    assert cap_offsets({"0": 7, "1": 0}, {"0": 9, "1": 3}, 10) == {"0": 9, "1": 3}


def test_cap_offsets_ends_a_new_partition_where_it_starts() -> None:
    # Partition 2 is not in start: it ends at the offset the caller gives (its low watermark) and takes no share.
    assert cap_offsets({"0": 0, "1": 0}, {"0": 50, "1": 50, "2": 40}, 10) == {"0": 5, "1": 5, "2": 40}
    assert cap_offsets({"0": 0}, {"0": 3, "1": 40}, 10) == {"0": 3, "1": 40}


# ------------------------------------------------------------------------------------- planning a batch


def test_latest_offset_reads_up_to_the_high_watermark() -> None:
    consumer = ScriptedConsumer(watermarks={0: [(0, 50)], 1: [(3, 80)]})
    source = reader(consumer)
    assert source.latestOffset({"0": 10, "1": 3}, ReadAllAvailable()) == {"0": 50, "1": 80}
    # Shares of 20: 40/117 and 77/117 of it, 6.84 and 13.16, rounded to 7 and 13.
    assert source.latestOffset({"0": 10, "1": 3}, ReadMaxRows(20)) == {"0": 17, "1": 16}


def test_batch_rows_grow_to_the_catch_up_size_only_while_more_than_a_batch_is_behind() -> None:
    assert batch_rows(backlog=5_000, max_rows=100, catch_up_rows=500) == 500
    assert batch_rows(backlog=101, max_rows=100, catch_up_rows=500) == 500  # cap_offsets then takes the 101
    assert batch_rows(backlog=100, max_rows=100, catch_up_rows=500) == 100
    assert batch_rows(backlog=5_000, max_rows=100, catch_up_rows=0) == 100  # off
    assert batch_rows(backlog=5_000, max_rows=100, catch_up_rows=50) == 100  # never below the batch size


def test_a_pipeline_behind_catches_up_in_larger_batches_then_reads_small_ones() -> None:
    consumer = ScriptedConsumer(watermarks={0: [(0, 1_000)], 1: [(0, 600)]})
    source = reader(consumer, maxRecordsPerBatch="100", catchUpRecordsPerBatch="400")
    limit = source.getDefaultReadLimit()
    assert isinstance(limit, ReadMaxRows) and limit.max_rows == 100
    # 1,600 behind: 400 offsets, shared in proportion to each partition's backlog (1,000 : 600).
    assert source.latestOffset({"0": 0, "1": 0}, limit) == {"0": 250, "1": 150}
    # 150 behind, more than one batch: all of it in one.
    assert source.latestOffset({"0": 900, "1": 550}, limit) == {"0": 1_000, "1": 600}
    # Without the option, batches stay at maxRecordsPerBatch.
    plain = reader(ScriptedConsumer(watermarks={0: [(0, 1_000)], 1: [(0, 600)]}), maxRecordsPerBatch="100")
    assert plain.latestOffset({"0": 0, "1": 0}, plain.getDefaultReadLimit()) == {"0": 63, "1": 37}


def test_a_batch_the_ledger_recorded_keeps_its_ends_while_catching_up(tmp_path) -> None:
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    (offsets / "0").write_text('v1\n{}\n{"0": 100}\n')  # Spark's offset log: batch 0 ended at 100
    recorded = json.dumps({"ends": {"1": {"0": 200}}, "skips": []})  # batch 1 was staged as [100, 200)
    source = reader(
        ScriptedConsumer(watermarks={0: [(0, 5_000)]}),
        maxRecordsPerBatch="100",
        catchUpRecordsPerBatch="1000",
        checkpointPath=str(tmp_path),
        recorded=recorded,
    )
    assert source.latestOffset({"0": 100}, source.getDefaultReadLimit()) == {"0": 200}
    (offsets / "1").write_text('v1\n{}\n{"0": 200}\n')  # batch 2 was never staged: planned afresh
    assert source.latestOffset({"0": 200}, source.getDefaultReadLimit()) == {"0": 1_200}


def test_a_high_watermark_below_the_start_stops_the_query() -> None:
    consumer = ScriptedConsumer(watermarks={0: [(0, 500)], 1: [(0, 4)]})
    with pytest.raises(OffsetsMovedBackwards) as info:
        reader(consumer).latestOffset({"0": 100, "1": 120}, ReadAllAvailable())
    message = str(info.value)
    assert f"{TOPIC}/1" in message and "high watermark 4" in message and "start offset 120" in message
    assert (
        f'krishiv skip-offsets --pipeline {PIPELINE} --partition 1 --to 0 --reason "topic {TOPIC} re-created or'
        in message
    )
    # Believed only after the watermarks were re-read once per pause.
    assert consumer.count("list_topics") == len(SHORT_RECHECKS) + 1


def test_a_recorded_batch_whose_end_is_gone_is_refused_when_planned(tmp_path) -> None:
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    (offsets / "0").write_text('v1\n{}\n{"0": 100, "1": 50}\n')
    recorded = json.dumps({"ends": {"1": {"0": 200, "1": 80}}, "skips": []})  # batch 1 was staged as 100-200, 50-80
    consumer = ScriptedConsumer(watermarks={0: [(0, 150)], 1: [(0, 60)]})  # emptied and refilled: ends are gone
    source = reader(consumer, checkpointPath=str(tmp_path), recorded=recorded)
    with pytest.raises(OffsetsMovedBackwards) as info:
        source.latestOffset({"0": 100, "1": 50}, ReadAllAvailable())
    message = str(info.value)
    assert "high watermark 150 is below the batch's recorded end offset 200" in message
    for partition in (0, 1):
        assert f"krishiv skip-offsets --pipeline {PIPELINE} --partition {partition} --to 0 --reason" in message


class FlakyConsumer(ScriptedConsumer):
    """A consumer whose broker does not answer the next ``down`` watermark requests."""

    down: int = 0

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        if self.down > 0:
            self.down -= 1
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return super().get_watermark_offsets(partition, timeout, cached)


def test_a_broker_out_of_reach_is_retried_with_a_line_when_it_goes_and_one_when_it_is_back(monkeypatch, capsys) -> None:
    monkeypatch.setattr(kafka_source, "OUTAGE_BACKOFF_S", (0.01,))
    consumer = FlakyConsumer(watermarks={0: [(0, 500)]})
    consumer.down = 5
    source = reader(consumer)
    assert source.latestOffset({"0": 100}, ReadAllAvailable()) == {"0": 500}
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert "did not report offsets of orders/0" in lines[0] and "retrying for up to 300s" in lines[0]
    assert lines[1].startswith(f"krishiv-kafka: Kafka broker at {BOOTSTRAP} is back after")


def test_a_broker_out_of_reach_past_the_bound_is_one_line(monkeypatch, capsys) -> None:
    monkeypatch.setattr(kafka_source, "OUTAGE_BACKOFF_S", (0.05,))
    consumer = FlakyConsumer(watermarks={0: [(0, 500)]})
    consumer.down = 10_000
    source = reader(consumer, brokerOutageSeconds="0.5")
    with pytest.raises(KafkaSourceError) as info:
        source.latestOffset({"0": 100}, ReadAllAvailable())
    message = str(info.value)
    assert message.startswith(f"Kafka broker at {BOOTSTRAP} did not answer for ") and "the query stopped" in message
    assert "docs/operations.md: Recovery runbook > A broker outage" in message and "\n" not in message
    assert len(capsys.readouterr().err.splitlines()) == 1, "one line when it went, none per attempt"


class TopicGoneConsumer(ScriptedConsumer):
    """A broker that answers without the topic for the next ``gone`` metadata requests (``krishiv broker`` restarted:
    its topics were in memory), then has it again."""

    gone: int = 0

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        metadata = super().list_topics(topic, timeout)
        if self.gone > 0:
            self.gone -= 1
            metadata.topics = {}
        return metadata


def test_a_broker_that_answers_without_the_topic_is_said_so_and_its_return_too(monkeypatch, capsys) -> None:
    monkeypatch.setattr(kafka_source, "OUTAGE_BACKOFF_S", (0.01,))
    consumer = TopicGoneConsumer(watermarks={0: [(0, 500)]})
    consumer.gone = 3
    assert reader(consumer).latestOffset({"0": 100}, ReadAllAvailable()) == {"0": 500}
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert f"topic '{TOPIC}' does not exist on {BOOTSTRAP}" in lines[0] and "retrying for up to 300s" in lines[0]
    assert lines[0].endswith("A topic that does not exist)"), "the way out stays last"
    assert lines[1].startswith(f"krishiv-kafka: topic '{TOPIC}' is back after"), lines[1]


def test_a_topic_that_stays_missing_past_the_bound_names_its_section(monkeypatch, capsys) -> None:
    monkeypatch.setattr(kafka_source, "OUTAGE_BACKOFF_S", (0.05,))
    consumer = TopicGoneConsumer(watermarks={0: [(0, 500)]})
    consumer.gone = 10_000
    with pytest.raises(KafkaSourceError) as info:
        reader(consumer, brokerOutageSeconds="0.3").latestOffset({"0": 100}, ReadAllAvailable())
    message = str(info.value)
    assert message.startswith(f"topic '{TOPIC}' does not exist on {BOOTSTRAP}: create it") and "waited" in message
    assert message.endswith("(see docs/operations.md: Recovery runbook > A topic that does not exist)"), message
    assert "A broker outage" not in message
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_a_high_watermark_low_for_a_moment_is_read_again() -> None:
    consumer = ScriptedConsumer(watermarks={0: [(0, 90), (0, 95), (0, 130)]})
    assert reader(consumer).latestOffset({"0": 100}, ReadAllAvailable()) == {"0": 130}


def test_the_available_now_target_below_the_start_is_not_the_broker_going_backwards() -> None:
    consumer = ScriptedConsumer(watermarks={0: [(0, 40), (0, 60)], 1: [(0, 10)]})
    source = reader(consumer)
    source.prepareForTriggerAvailableNow()  # pins {"0": 40, "1": 10}
    assert source.latestOffset({"0": 50, "1": 5}, ReadAllAvailable()) == {"0": 50, "1": 10}


def test_a_start_below_the_low_watermark_stops_the_query_when_planning() -> None:
    consumer = ScriptedConsumer(watermarks={0: [(0, 90)], 1: [(25, 90)]})
    with pytest.raises(OffsetsDeleted) as info:
        reader(consumer).latestOffset({"0": 10, "1": 10}, ReadAllAvailable())
    message = str(info.value)
    assert f"{TOPIC}/1" in message and "start offset 10" in message and "low watermark 25" in message
    assert "--partition 1 --to 25" in message


def test_a_partition_the_topic_lost_stops_the_query() -> None:
    consumer = ScriptedConsumer(watermarks={0: [(0, 90)]})
    with pytest.raises(SourceChanged, match=r"no partition 1 now .* from offset 10"):
        reader(consumer).latestOffset({"0": 10, "1": 10}, ReadAllAvailable())


def test_a_new_partition_starts_at_its_low_watermark() -> None:
    consumer = ScriptedConsumer(watermarks={0: [(0, 50)], 1: [(7, 9)]})
    source = reader(consumer, recordsPerSplit="100")
    start = {"0": 10}
    end = source.latestOffset(start, ReadAllAvailable())
    assert end == {"0": 50, "1": 7}
    assert source.latestOffset(start, ReadMaxRows(5)) == {"0": 15, "1": 7}
    # Nothing of the new partition is read in the batch that finds it; the next batch reads from its low watermark.
    assert ranges_of(source.partitions(start, end)) == [(0, 10, 50)]
    assert source.latestOffset(end, ReadAllAvailable()) == {"0": 50, "1": 9}
    assert ranges_of(source.partitions(end, {"0": 50, "1": 9})) == [(1, 7, 9)]
    assert BatchOffsets(3, start, end).ranges() == {"0": [10, 50], "1": [7, 7]}


def test_small_ranges_share_a_task_and_large_ones_are_split() -> None:
    """A task's start costs more than reading a few thousand records: a batch's ranges are packed into tasks of up
    to TASK_PACK_RECORDS records (recordsPerSplit if smaller); a range longer than recordsPerSplit is split."""
    marks = {p: [(0, 10**6)] for p in range(4)}
    source = reader(ScriptedConsumer(watermarks=marks))
    small = source.partitions({str(p): 0 for p in range(4)}, {str(p): 250 for p in range(4)})
    assert [len(s.ranges) for s in small] == [4]
    assert ranges_of(small) == [(p, 0, 250) for p in range(4)]
    big = TASK_PACK_RECORDS + 1
    ends = {"0": big, "1": big, "2": 10, "3": 20}
    mixed = source.partitions({p: 0 for p in ends}, ends)
    assert [[(r.partition, r.end) for r in s.ranges] for s in mixed] == [[(0, big)], [(1, big)], [(2, 10), (3, 20)]]
    by_two = reader(ScriptedConsumer(watermarks=marks), recordsPerSplit="2").partitions(
        {"0": 0, "1": 0}, {"0": 5, "1": 2}
    )
    assert [ranges_of([s]) for s in by_two] == [[(0, 0, 2)], [(0, 2, 4)], [(0, 4, 5)], [(1, 0, 2)]]


def test_a_task_reads_each_of_its_ranges_exactly() -> None:
    consumer = ScriptedConsumer(watermarks={0: [(0, 6)], 1: [(0, 6)]}, fetches=[Fetch([2, 3, 4]), Fetch([0, 1])])
    source = reader(consumer)
    (split,) = source.partitions({"0": 2, "1": 0}, {"0": 5, "1": 2})
    batches = list(source.read(split))
    assert [(b.column("partition").to_pylist(), b.column("offset").to_pylist()) for b in batches] == [
        ([0, 0, 0], [2, 3, 4]),
        ([1, 1], [0, 1]),
    ]
    assert consumer.count("close") == 2, "each range's consumer is closed"


def test_the_reader_reads_its_ranges_through_the_seam() -> None:
    consumer = ScriptedConsumer(watermarks={0: [(0, 6)]}, fetches=[Fetch([2, 3, 5])])
    source = reader(consumer)
    (part,) = source.partitions({"0": 2}, {"0": 6})
    assert [b.num_rows for b in source.read(part)] == [3]


# --------------------------------------------------------------------------------------- consumer settings


def test_a_range_consumer_may_queue_its_whole_range_unless_the_user_says_otherwise() -> None:
    """librdkafka pauses a partition's fetching for a second once queued.min.messages (100,000) are queued; a task's
    consumer may queue its whole range instead, its bytes bounded by queued.max.messages.kbytes."""
    base = consumer_config(BOOTSTRAP, {})
    assert base["queued.max.messages.kbytes"] == RANGE_QUEUE_KBYTES and base["fetch.max.bytes"] <= 32 * 1024 * 1024
    assert KafkaRange(TOPIC, 0, 0, 250_000, base, 1.0).config["queued.min.messages"] == 250_000
    assert KafkaRange(TOPIC, 0, 0, 10, base, 1.0).config["queued.min.messages"] == 100_000, "never below the default"
    assert range_consumer_config(base, 10**9)["queued.min.messages"] == RANGE_QUEUE_MAX_RECORDS
    mine = consumer_config(BOOTSTRAP, {"queued.min.messages": "5000"})
    assert KafkaRange(TOPIC, 0, 0, 250_000, mine, 1.0).config["queued.min.messages"] == "5000"


def test_forced_consumer_settings_override_extras() -> None:
    extras = {
        "isolation.level": "read_uncommitted",
        "enable.auto.commit": "true",
        "enable.auto.offset.store": "true",
        "auto.offset.reset": "earliest",
        "group.id": "mine",
        "fetch.min.bytes": "7",
    }
    config = consumer_config(BOOTSTRAP, extras)
    assert {k: config[k] for k in FORCED_CONSUMER_SETTINGS} == {
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
    }
    assert config["group.id"] == "mine" and config["fetch.min.bytes"] == "7"
    # Every consumer the source makes gets them, the driver's and the tasks'.
    consumer = ScriptedConsumer(watermarks={0: [(0, 6)]}, fetches=[Fetch([0, 1])])
    source = reader(consumer, **{"kafka.fetch.min.bytes": "7"})
    source.latestOffset({"0": 0}, ReadAllAvailable())
    list(source.read(source.partitions({"0": 0}, {"0": 2})[0]))
    assert len(consumer.configs) == 2
    assert all(c["isolation.level"] == "read_committed" and c["fetch.min.bytes"] == "7" for c in consumer.configs)


@pytest.mark.parametrize("key", sorted(FORCED_CONSUMER_SETTINGS))
def test_the_source_refuses_a_forced_setting_as_an_option(key: str) -> None:
    with pytest.raises(KafkaSourceError, match=rf"option kafka\.{key}: Krishiv sets this itself"):
        reader(ScriptedConsumer(), **{f"kafka.{key}": "x"})


# --------------------------------------------------------------------------------------------------- identity


def test_identity_is_the_cluster_id_and_the_topic_id() -> None:
    admin = KafkaAdmin(BOOTSTRAP, TOPIC, {}, KafkaClients(consumer=ScriptedConsumer(), admin=ScriptedAdmin("t-9")))
    assert admin.identity() == {"cluster_id": "cluster-a", "topic_id": "t-9"}
    unsupported = ScriptedAdmin(error=KafkaError._UNSUPPORTED_FEATURE)
    admin = KafkaAdmin(BOOTSTRAP, TOPIC, {}, KafkaClients(consumer=ScriptedConsumer(), admin=unsupported))
    assert admin.identity() == {"cluster_id": "cluster-a", "topic_id": None}
    failing = ScriptedAdmin(error=KafkaError._TRANSPORT)
    admin = KafkaAdmin(BOOTSTRAP, TOPIC, {}, KafkaClients(consumer=ScriptedConsumer(), admin=failing))
    with pytest.raises(KafkaSourceError, match="did not describe topic 'orders'"):
        admin.identity()


def test_an_identity_change_stops_the_query_naming_both() -> None:
    expected = json.dumps({"cluster_id": "cluster-a", "topic_id": "topic-1"})
    source = reader(ScriptedConsumer(), ScriptedAdmin("topic-2"), expectedIdentity=expected)
    with pytest.raises(SourceChanged) as info:
        source.latestOffset({"0": 0}, ReadAllAvailable())
    message = str(info.value)
    assert "'orders'" in message and '"topic_id": "topic-1"' in message and '"topic_id": "topic-2"' in message

    # Re-created with more partitions: the way out names the partition the query reads, not the new ones.
    wider = ScriptedConsumer(watermarks={0: [(0, 3)], 1: [(0, 3)], 2: [(0, 0)]})
    with pytest.raises(SourceChanged) as info:
        reader(wider, ScriptedAdmin("topic-2"), expectedIdentity=expected).latestOffset({"0": 7}, ReadAllAvailable())
    message = str(info.value)
    assert "--partition 0 --to 0" in message and "--partition 1 " not in message and "--partition 2 " not in message

    other_cluster = ScriptedConsumer(cluster_id="cluster-b")
    with pytest.raises(SourceChanged, match='"cluster_id": "cluster-b"'):
        reader(other_cluster, ScriptedAdmin("topic-1"), expectedIdentity=expected).latestOffset(
            {"0": 0}, ReadAllAvailable()
        )


def test_an_unknown_topic_id_is_not_compared_and_the_identity_is_checked_at_every_batch() -> None:
    admin = ScriptedAdmin(error=KafkaError._UNSUPPORTED_FEATURE)
    source = reader(
        ScriptedConsumer(), admin, expectedIdentity=json.dumps({"cluster_id": "cluster-a", "topic_id": "x"})
    )
    assert source.latestOffset({"0": 0}, ReadAllAvailable()) == {"0": 1_000}
    source = reader(
        ScriptedConsumer(), admin, expectedIdentity=json.dumps({"cluster_id": "cluster-a", "topic_id": None})
    )
    source.latestOffset({"0": 0}, ReadAllAvailable())
    source.latestOffset({"0": 1_000}, ReadAllAvailable())
    assert admin.described == 3


def test_a_topic_re_created_between_two_batches_stops_the_second_with_no_outage_seen() -> None:
    # The broker came back empty and the topic was re-created between two batches: no call of the source failed,
    # so only the identity tells the incarnations apart.
    admin = ScriptedAdmin("topic-1")
    expected = json.dumps({"cluster_id": "cluster-a", "topic_id": "topic-1"})
    source = reader(ScriptedConsumer(), admin, expectedIdentity=expected)
    end = source.latestOffset({"0": 0}, ReadAllAvailable())
    source.partitions({"0": 0}, end)
    admin.topic_id = "topic-2"
    with pytest.raises(SourceChanged, match='"topic_id": "topic-2"'):
        source.latestOffset(end, ReadAllAvailable())
    with pytest.raises(SourceChanged):  # a batch planned before the change is not handed out either
        source.partitions({"0": 0}, end)


def test_a_task_checks_the_identity_before_and_after_it_reads() -> None:
    expected = json.dumps({"cluster_id": "cluster-a", "topic_id": "topic-1"})
    admin = ScriptedAdmin("topic-1")
    fetches = [Fetch([0, 1]), Fetch([2, 3])]
    source = reader(ScriptedConsumer(watermarks={0: [(0, 4)]}, fetches=list(fetches)), admin, expectedIdentity=expected)
    split = source.partitions({"0": 0}, {"0": 4})[0]
    admin.described = 0
    assert [o for b in source.read(split) for o in b.column("offset").to_pylist()] == [0, 1, 2, 3]
    assert admin.described == 2

    # Re-created before the task reads: nothing is read.
    source = reader(ScriptedConsumer(watermarks={0: [(0, 4)]}, fetches=list(fetches)), admin, expectedIdentity=expected)
    split = source.partitions({"0": 0}, {"0": 4})[0]
    admin.topic_id = "topic-2"
    with pytest.raises(SourceChanged, match="not the one this query began on"):
        next(iter(source.read(split)))

    # Re-created while it reads (the broker came back empty under the task): the task fails after its last record,
    # so the batch fails before anything of it is staged.
    admin.topic_id = "topic-1"
    source = reader(ScriptedConsumer(watermarks={0: [(0, 4)]}, fetches=list(fetches)), admin, expectedIdentity=expected)
    split = source.partitions({"0": 0}, {"0": 4})[0]
    records = iter(source.read(split))
    next(records)
    admin.topic_id = "topic-2"
    with pytest.raises(SourceChanged, match="partition 0 --to 0"):
        list(records)


def test_a_bad_expected_identity_option_is_named() -> None:
    with pytest.raises(KafkaSourceError, match="option expectedIdentity: expected JSON"):
        reader(ScriptedConsumer(), expectedIdentity="{nope")
    with pytest.raises(KafkaSourceError, match="option expectedIdentity"):
        reader(ScriptedConsumer(), expectedIdentity='{"cluster": "a"}')


# -------------------------------------------------------------------------------------- the real broker


@pytest.fixture
def real_topic(broker: LocalBroker) -> Iterator[str]:
    name = f"source-{uuid.uuid4().hex[:10]}"
    yield name
    AdminClient({"bootstrap.servers": broker.bootstrap}).delete_topics([name], operation_timeout=10)


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {WAIT_S:.0f}s")
        time.sleep(0.05)


def _recreate(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again, as an operator might, waiting until the broker serves the new one."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([topic], operation_timeout=10).values():
        future.result(WAIT_S)
    _wait_for(lambda: topic not in admin.list_topics(timeout=WAIT_S).topics, f"{topic} was not deleted")
    for future in admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)]).values():
        future.result(WAIT_S)
    _wait_for(
        lambda: len(admin.list_topics(topic, timeout=WAIT_S).topics[topic].partitions) == partitions,
        f"{topic} was not re-created",
    )


def _produce(bootstrap: str, topic: str, records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(records):
        producer.produce(topic, value=f"r{i}".encode(), partition=0)
        producer.flush(WAIT_S)  # one record batch each, so Tansu's high watermark counts every record
    assert producer.flush(WAIT_S) == 0


def _real_reader(bootstrap: str, topic: str, **options: str) -> KafkaStreamReader:
    source = KafkaStreamReader({"bootstrap.servers": bootstrap, "topic": topic, **options})
    source.recheck_delays_s = SHORT_RECHECKS
    return source


def test_a_re_created_topic_has_a_new_identity_and_stops_the_query(broker: LocalBroker, real_topic: str) -> None:
    ensure_topic(broker.bootstrap, real_topic, 1)
    _produce(broker.bootstrap, real_topic, 3)
    with KafkaAdmin(broker.bootstrap, real_topic, {}) as admin:
        before = admin.identity()
        assert set(before) == {"cluster_id", "topic_id"}
        assert isinstance(before["cluster_id"], str) and before["cluster_id"]
        assert isinstance(before["topic_id"], str) and before["topic_id"]
        start = admin.latest()
    assert start["0"] >= 1

    _recreate(broker.bootstrap, real_topic, 1)
    with KafkaAdmin(broker.bootstrap, real_topic, {}) as admin:
        after = admin.identity()
    assert after["cluster_id"] == before["cluster_id"] and after["topic_id"] != before["topic_id"]

    source = _real_reader(broker.bootstrap, real_topic, expectedIdentity=json.dumps(before), pipeline=PIPELINE)
    try:
        with pytest.raises(SourceChanged, match=re.escape(str(before["topic_id"]))) as info:
            source.latestOffset(start, ReadAllAvailable())
        # The command to move on, with real values: partition 0 of the new topic starts at 0.
        command = f'krishiv skip-offsets --pipeline {PIPELINE} --partition 0 --to 0 --reason "topic {real_topic} re'
        assert command in str(info.value)
        # A batch planned before the topic was re-created (Spark replays it from its offset log) is not read either.
        with pytest.raises(SourceChanged):
            source.partitions(start, {"0": start["0"] + 1})
    finally:
        source.stop()
    # Without the pinned identity, the offsets going backwards stop it all the same.
    source = _real_reader(broker.bootstrap, real_topic)
    try:
        with pytest.raises(
            OffsetsMovedBackwards, match=rf"{real_topic}/0 .*high watermark 0 .*start offset {start['0']}"
        ):
            source.latestOffset(start, ReadAllAvailable())
    finally:
        source.stop()


def test_commit_markers_leave_gaps_and_a_range_may_end_on_one(broker: LocalBroker, real_topic: str) -> None:
    ensure_topic(broker.bootstrap, real_topic, 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{real_topic}"})
    producer.init_transactions(WAIT_S)
    for values in ([b"a", b"b"], [b"c"]):  # records 0, 1, marker 2, record 3, marker 4
        producer.begin_transaction()
        for value in values:
            producer.produce(real_topic, value=value, partition=0)
        producer.commit_transaction(WAIT_S)
    with KafkaAdmin(broker.bootstrap, real_topic, {}) as admin:
        assert admin.watermarks(0) == (0, 5)

    def offsets(start: int, end: int) -> list[int]:
        part = KafkaRange(real_topic, 0, start, end, consumer_config(broker.bootstrap, {}), WAIT_S)
        return [o for batch in read_range(part) for o in batch.column("offset").to_pylist()]

    began = time.monotonic()
    assert offsets(0, 5) == [0, 1, 3]
    assert offsets(0, 3) == [0, 1]
    assert time.monotonic() - began < WAIT_S / 2, "ranges ending on a marker must end, not wait for the timeout"


def test_partitions_the_start_does_not_know_begin_at_their_low_watermark(broker: LocalBroker, real_topic: str) -> None:
    """Tansu cannot add partitions (CreatePartitions is unsupported), so the start knows one of three, as it would
    after two were added."""
    ensure_topic(broker.bootstrap, real_topic, 3)
    _produce(broker.bootstrap, real_topic, 2)
    source = _real_reader(broker.bootstrap, real_topic)
    try:
        end = source.latestOffset({"0": 0}, ReadAllAvailable())
        assert end == {"0": 2, "1": 0, "2": 0}
        assert ranges_of(source.partitions({"0": 0}, end)) == [(0, 0, 2)]
    finally:
        source.stop()


def test_spark_plans_catch_up_batches_larger_than_its_read_limit(
    broker: LocalBroker, real_topic: str, spark, tmp_path
) -> None:
    """Through Spark (Trigger.AvailableNow): 300 records behind, batches of 50, catching up in up to 200."""
    from spark_jobs.kafka_source import SOURCE_NAME

    ensure_topic(broker.bootstrap, real_topic, 1)
    _produce(broker.bootstrap, real_topic, 300)
    seen: list[tuple[int, list[int]]] = []
    query = (
        spark.readStream.format(SOURCE_NAME)
        .option("bootstrap.servers", broker.bootstrap)
        .option("topic", real_topic)
        .option("maxRecordsPerBatch", "50")
        .option("catchUpRecordsPerBatch", "200")
        .load()
        .writeStream.foreachBatch(
            lambda batch, batch_id: seen.append((batch_id, sorted(r.offset for r in batch.select("offset").collect())))
        )
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120), "the query did not finish within 120s"
    assert query.exception() is None
    # 300 behind: 200; then 100 behind, still more than a batch of 50: all of it. Every record once, in order.
    assert [(batch_id, len(offsets)) for batch_id, offsets in seen] == [(0, 200), (1, 100)]
    assert [o for _batch_id, offsets in seen for o in offsets] == list(range(300))


def test_a_continuous_query_never_reads_more_than_its_read_limit_per_batch(
    broker: LocalBroker, real_topic: str, spark, tmp_path
) -> None:
    """Through Spark (a processing-time trigger, as `krishiv run` without --once): 600 records behind and a limit
    of 200 without catch-up: the first batch too holds 200, never the backlog."""
    from spark_jobs.kafka_source import SOURCE_NAME

    ensure_topic(broker.bootstrap, real_topic, 1)
    _produce(broker.bootstrap, real_topic, 600)
    seen: list[int] = []
    query = (
        spark.readStream.format(SOURCE_NAME)
        .option("bootstrap.servers", broker.bootstrap)
        .option("topic", real_topic)
        .option("maxRecordsPerBatch", "200")
        .load()
        .writeStream.foreachBatch(lambda batch, _batch_id: seen.append(batch.count()))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        while sum(seen) < 600 and time.monotonic() < deadline and query.exception() is None:
            time.sleep(0.1)
    finally:
        query.stop()
    assert sum(seen) == 600 and max(seen) <= 200, seen
    assert seen[0] == 200, seen
