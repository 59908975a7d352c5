"""The transaction gate's rule over random streams cut into random batches, checked against what it promises
(docs/formats.md, "Source transactions kept whole"), not against how it decides:

- every change event is staged exactly once, once every END has been read;
- the events of one source transaction (in the topics the pipeline reads) are all staged by one batch;
- within a partition, events are staged in offset order;
- a reject waits only with its own transaction, which counts it.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from spark_jobs.record_decoder import REASON, TOMBSTONE
from spark_jobs.topics_source import TX_COUNTS, TX_STATUS, TX_XID
from spark_jobs.transaction_gate import data_collection, describe_open, plan_release

TOPICS = ("db.public.orders", "db.public.lines", "db.public.payments")
MARKS = "db.transaction"
PARTITIONS = 2
EPOCH = datetime(2026, 11, 29, tzinfo=UTC)


def _row(topic: str, partition: int, offset: int, at: int = 0, **values: Any) -> dict[str, Any]:
    """A row of the gate's columns; ``at``: its Kafka timestamp, in seconds."""
    stamp = EPOCH + timedelta(seconds=at)
    row = {"topic": topic, "partition": partition, "offset": offset, "timestamp": stamp, REASON: None, TOMBSTONE: False}
    return row | {TX_STATUS: None, TX_XID: None, TX_COUNTS: None} | values


def _stream(rng: random.Random, transactions: int) -> tuple[dict[tuple[str, int], list[dict]], list[dict]]:
    """Each change partition's rows and the transaction topic's, as Debezium writes them: a snapshot's reads
    (no transaction), then transactions in commit order, each contiguous in every partition it touches, a delete's
    tombstone after it, an END counting its events per table (one it does not read too), some rejects (inside a
    transaction and outside)."""
    parts: dict[tuple[str, int], list[dict]] = defaultdict(list)
    marks: list[dict] = []

    def add(topic: str, key: int, **values: Any) -> None:
        where = (topic, key % PARTITIONS)
        parts[where].append(_row(topic, where[1], len(parts[where]), **values))

    for key in range(rng.randrange(0, 6)):
        add(rng.choice(TOPICS), key)
    for n in range(transactions):
        xid = str(1000 + n)
        marks.append(_row(MARKS, 0, len(marks), **{TX_STATUS: "BEGIN", TX_XID: xid}))
        counts: dict[str, int] = defaultdict(int)
        for _ in range(rng.randrange(1, 6)):
            topic, key = rng.choice(TOPICS), rng.randrange(20)
            add(topic, key, **{TX_XID: xid})
            counts[data_collection(topic)] += 1
            if rng.random() < 0.15:
                add(topic, key, **{TOMBSTONE: True})
            if rng.random() < 0.05:  # a change event that is a reject: its END counts it
                add(topic, key, **{REASON: "column doc holds Debezium's placeholder", TX_XID: xid})
                counts[data_collection(topic)] += 1
            if rng.random() < 0.05:  # a record that is not a change event: no transaction
                add(topic, key, **{REASON: "malformed JSON"})
        if rng.random() < 0.3:
            counts["public.not_read"] += rng.randrange(1, 3)
        marks.append(_row(MARKS, 0, len(marks), **{TX_STATUS: "END", TX_XID: xid, TX_COUNTS: json.dumps(counts)}))
    return parts, marks


@pytest.mark.parametrize("seed", range(40))
def test_random_streams_cut_at_random_stage_each_transaction_whole_and_every_event_once(seed: int) -> None:
    rng = random.Random(seed)
    parts, marks = _stream(rng, transactions=rng.randrange(1, 25))
    logs = {**parts, (MARKS, 0): marks}
    read = dict.fromkeys(logs, 0)
    held: list[dict] = []
    staged: list[tuple[int, dict]] = []  # (batch, row)
    batch = 0
    while any(read[w] < len(rows) for w, rows in logs.items()) or held:
        batch_rows = []
        for where, rows in logs.items():  # each partition's end moves on by its own random amount
            step = rng.randrange(0, 5) if batch < 200 else len(rows)
            batch_rows += rows[read[where] : read[where] + step]
            read[where] = min(len(rows), read[where] + step)
        rows = held + batch_rows
        release = plan_release(rows, TOPICS, MARKS, timedelta(days=1))  # nothing waits that long here
        held = [r for r in rows if release.waits(r)]
        staged += [(batch, r) for r in rows if not release.waits(r) and r["topic"] != MARKS]
        batch += 1
        assert batch < 400, "events wait although every END has been read"

    events = [r for where, rows in parts.items() for r in rows]
    key = lambda r: (r["topic"], r["partition"], r["offset"])  # noqa: E731
    assert sorted(map(key, (r for _, r in staged))) == sorted(map(key, events)), "each event staged exactly once"
    batches_of: dict[str, set[int]] = defaultdict(set)
    for b, r in staged:
        if r[TX_XID] is not None:
            batches_of[r[TX_XID]].add(b)
    assert all(len(b) == 1 for b in batches_of.values()), {x: b for x, b in batches_of.items() if len(b) > 1}
    last: dict[tuple[str, int], int] = {}  # staged in batch order, a partition's offsets rise
    for _batch, r in sorted(staged, key=lambda br: (br[0], br[1]["offset"])):
        if r[REASON] is not None:
            continue
        where = (r["topic"], r["partition"])
        assert where not in last or last[where] < r["offset"], (where, r)
        last[where] = r["offset"]


def test_an_event_waits_for_its_end_and_for_the_events_it_counts() -> None:
    orders, lines = TOPICS[0], TOPICS[1]
    order = _row(orders, 0, 0, **{TX_XID: "7"})
    line = _row(lines, 1, 0, **{TX_XID: "7"})
    end = _row(
        MARKS, 0, 1, **{TX_STATUS: "END", TX_XID: "7", TX_COUNTS: json.dumps({"public.orders": 1, "public.lines": 2})}
    )
    assert plan_release([order, line], TOPICS, MARKS).hold_from == {(orders, 0): 0, (lines, 1): 0}
    waiting = plan_release([order, line, end], TOPICS, MARKS)
    assert waiting.kept == {(MARKS, 0, 1)} and waiting.open == {"7": (2, 3)}
    assert describe_open(waiting.open) == "7 (2 of 3 events)"
    second = _row(lines, 1, 1, **{TX_XID: "7"})
    assert not plan_release([order, line, second, end], TOPICS, MARKS).holds


def test_a_snapshot_read_behind_a_waiting_event_waits_with_it_and_a_reject_only_with_its_transaction() -> None:
    orders = TOPICS[0]
    rows = [
        _row(orders, 0, 0),  # a snapshot's read: no transaction
        _row(orders, 0, 1, **{TX_XID: "9"}),
        _row(orders, 0, 2, **{REASON: "malformed JSON"}),
        _row(orders, 0, 3),
        _row(orders, 1, 0, **{REASON: "column doc holds Debezium's placeholder", TX_XID: "9"}),
    ]
    release = plan_release(rows, TOPICS, MARKS)
    assert [release.waits(r) for r in rows] == [False, True, False, True, True]
    assert describe_open(release.open) == "9 (2 events, END not read)"


def test_a_transaction_short_of_an_unreadable_event_waits_for_the_timeout_of_kafka_time_then_is_staged() -> None:
    """An event that is not a change event at all (not JSON) cannot say its transaction: its END counts it, so the
    transaction waits, and the events behind it in its partition with it, until a record newer by the timeout."""
    orders, lines = TOPICS[0], TOPICS[1]
    counts = json.dumps({"public.orders": 1, "public.lines": 2})
    rows = [
        _row(orders, 0, 0, 10, **{TX_XID: "503"}),
        _row(lines, 0, 0, 10, **{TX_XID: "503"}),
        _row(lines, 0, 1, 10, **{REASON: "malformed JSON value"}),  # the third event, unreadable
        _row(MARKS, 0, 0, 11, **{TX_STATUS: "END", TX_XID: "503", TX_COUNTS: counts}),
        _row(orders, 0, 1, 40, **{TX_XID: "504"}),  # complete, but behind 503 in its partition
        _row(MARKS, 0, 1, 41, **{TX_STATUS: "END", TX_XID: "504", TX_COUNTS: json.dumps({"public.orders": 1})}),
    ]
    timeout = timedelta(seconds=60)
    waiting = plan_release(rows, TOPICS, MARKS, timeout)
    assert waiting.open == {"503": (2, 3), "504": (1, 1)} and not waiting.given_up
    assert [waiting.waits(r) for r in rows] == [True, True, False, True, True, True]
    newer = _row(lines, 0, 2, 71)  # a snapshot's read 61 s after 503's first event
    given = plan_release([*rows, newer], TOPICS, MARKS, timeout)
    assert given.given_up == {"503": (2, 3)} and not given.holds


def test_under_a_topic_pattern_an_end_counting_a_table_whose_topic_is_not_read_yet_waits_for_it() -> None:
    """A transaction that touches a table whose topic the pattern matches but the query does not read yet (its topic
    was made with that very transaction) waits until the query reads it too; a table the pattern leaves out does
    not hold it."""
    orders = TOPICS[0]
    order = _row(orders, 0, 0, **{TX_XID: "9"})
    counts = {data_collection(orders): 1, "public.refunds": 1, "audit.log": 1}
    end = _row(MARKS, 0, 1, **{TX_STATUS: "END", TX_XID: "9", TX_COUNTS: json.dumps(counts)})
    pattern = r"db\.public\..*"
    waiting = plan_release([order, end], [orders], MARKS, pattern=pattern)
    assert waiting.open == {"9": (1, 2)} and waiting.hold_from == {(orders, 0): 0}
    assert not plan_release([order, end], [orders], MARKS).holds  # a list of topics counts only its own
    refund = _row("db.public.refunds", 0, 0, **{TX_XID: "9"})
    assert not plan_release([order, refund, end], [orders, "db.public.refunds"], MARKS, pattern=pattern).holds
