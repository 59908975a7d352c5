"""The source over several topics against a real broker: one read limit shared by every topic's partitions, a
topic that appears later read from its low watermark, and each topic's rows decoded with its own fields."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from krishiv.broker import LocalBroker
from krishiv.produce import OrderEvent, ensure_topic, produce
from krishiv_core.spec import PipelineSpec, parse_spec
from spark_jobs.record_decoder import Decoding
from spark_jobs.topics_source import TX_COUNTS, TX_STATUS, TX_XID, TopicsLayout, TopicsStreamReader


def _members(prefix: str) -> PipelineSpec:
    doc = {
        "kafka": {"bootstrap_servers": "unused:9092"},
        "pipelines": [
            {
                "name": "shop",
                "kind": "upsert",
                "envelope": "debezium",
                "topics": [f"{prefix}.public.orders", f"{prefix}.public.lines"],
                "transaction_topic": f"{prefix}.transaction",
                "tables": {
                    "orders": {"key": ["id"], "fields": {"id": "int", "total": "decimal(12,2)"}},
                    "lines": {"key": ["id"], "fields": {"id": "int", "order_id": "int"}},
                },
            }
        ],
    }
    return parse_spec(doc).pipeline()


def _layout(pipeline: PipelineSpec) -> TopicsLayout:
    return TopicsLayout(
        tuple(m.topic for m in pipeline.members),
        tuple(Decoding.of(m) for m in pipeline.members),
        pipeline.transaction_topic,
    )


def _reader(broker: LocalBroker, layout: TopicsLayout, **options: str) -> TopicsStreamReader:
    return TopicsStreamReader(
        {"bootstrap.servers": broker.bootstrap, "pipeline": "shop", "layout": layout.to_option(), **options}
    )


def _change(row: dict, op: str, xid: str | None, lsn: int) -> bytes:
    transaction = None if xid is None else {"id": f"{xid}:{lsn}", "total_order": 1, "data_collection_order": 1}
    source = {"lsn": lsn, "txId": xid}
    return json.dumps({"op": op, "before": None, "after": row, "source": source, "transaction": transaction}).encode()


def _send(broker: LocalBroker, topic: str, values: list[bytes | None], partition: int = 0) -> None:
    produce(broker.bootstrap, topic, [OrderEvent(i, partition, b"k", v, "valid") for i, v in enumerate(values)])  # type: ignore[arg-type]


@pytest.fixture
def prefix() -> str:
    return f"db{uuid.uuid4().hex[:8]}"


def test_one_read_limit_is_shared_by_every_topic_and_a_topic_made_later_starts_at_its_low_watermark(
    broker: LocalBroker, prefix: str
) -> None:
    pipeline = _members(prefix)
    orders, lines = (m.topic for m in pipeline.members)
    ensure_topic(broker.bootstrap, orders, 2)
    _send(broker, orders, [b"{}"] * 30, partition=0)
    _send(broker, orders, [b"{}"] * 10, partition=1)
    source = _reader(broker, _layout(pipeline))
    start = source.initialOffset()
    assert start == {orders: {"0": 0, "1": 0}, lines: {}, pipeline.transaction_topic: {}}  # not made yet
    end = source.latestOffset(start, ReadMaxRows(20))
    assert end[orders] == {"0": 15, "1": 5} and end[lines] == {}  # shared by backlog
    # Spark's progress asks for the latest offsets after each plan: a topic not there yet is not waited for
    assert source.reportLatestOffset() == {orders: {"0": 30, "1": 10}, lines: {}, pipeline.transaction_topic: {}}

    ensure_topic(broker.bootstrap, lines, 1)
    _send(broker, lines, [b"{}"] * 4)
    seen = source.latestOffset(end, ReadMaxRows(1_000))
    assert seen[lines] == {"0": 0}, "a topic seen for the first time is recorded at its low watermark, unread"
    assert [(r.topic, r.partition, r.start, r.end) for s in source.partitions(end, seen) for r in s.ranges] == [
        (orders, 0, 15, 30),
        (orders, 1, 5, 10),
    ]
    after = source.latestOffset(seen, ReadAllAvailable())
    assert after[lines] == {"0": 4}


def test_each_topic_decodes_with_its_own_fields_and_the_marks_into_the_transaction_columns(
    broker: LocalBroker, prefix: str
) -> None:
    pipeline = _members(prefix)
    orders, lines = (m.topic for m in pipeline.members)
    marks = str(pipeline.transaction_topic)
    for topic in (orders, lines, marks):
        ensure_topic(broker.bootstrap, topic, 1)
    _send(broker, orders, [_change({"id": 1, "total": 7.5}, "c", "571", 10)])
    _send(
        broker,
        lines,
        [_change({"id": 9, "order_id": 1}, "c", "571", 11), _change({"id": 8, "order_id": 1}, "r", None, 5)],
    )
    end = {
        "status": "END",
        "id": "571:12",
        "event_count": 2,
        "data_collections": [
            {"data_collection": "public.orders", "event_count": 1},
            {"data_collection": "public.lines", "event_count": 1},
        ],
    }
    _send(broker, marks, [json.dumps({"status": "BEGIN", "id": "571:9"}).encode(), json.dumps(end).encode(), b"[]"])
    layout = _layout(pipeline)
    source = _reader(broker, layout)
    start = source.initialOffset()
    stop = source.latestOffset(start, ReadAllAvailable())
    table = pa.Table.from_batches(
        [b for split in source.partitions(start, stop) for b in source.read(split)], schema=layout.arrow_schema()
    )
    rows = {(r["topic"], r["offset"]): r for r in table.to_pylist()}
    order = rows[(orders, 0)]
    assert order["__t0"] == {"id": 1, "total": Decimal("7.50"), "_cdc_lsn": 10, "_cdc_tx": "571"}
    assert order["__t1"] is None and order[TX_XID] == "571" and order["reason"] is None
    assert rows[(lines, 0)]["__t1"]["order_id"] == 1 and rows[(lines, 0)]["__t0"] is None
    assert rows[(lines, 1)][TX_XID] is None  # a snapshot's read: no transaction
    begin, closing, broken = rows[(marks, 0)], rows[(marks, 1)], rows[(marks, 2)]
    assert (begin[TX_STATUS], begin[TX_XID], begin["reason"]) == ("BEGIN", "571", None)
    assert (closing[TX_STATUS], json.loads(closing[TX_COUNTS])) == ("END", {"public.orders": 1, "public.lines": 1})
    assert broken["reason"] == "not a Debezium transaction mark: no status BEGIN or END" and broken["value"] == b"[]"
