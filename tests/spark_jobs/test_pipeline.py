"""End to end through the real broker, Spark and catalogs: the table equals an independent oracle."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

from chaos.kinds_oracle import expected_grouped_late
from chaos.oracle import LateEvent, parse, read_topic
from krishiv.operations import commit_pipelines, open_ledger, run_pipelines
from krishiv.produce import OrderEvent, ensure_topic, produce
from krishiv.status import pipeline_status
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.entries import COMMITTED
from spark_jobs.checkpoint import Checkpoint
from spark_jobs.kafka_source import KafkaAdmin
from tests.spark_jobs.pipeline_helpers import assert_exactly_once, produce_orders


@pytest.mark.parametrize("catalog", ["sqlite", "postgresql"])
def test_seeded_orders_are_counted_exactly_once(catalog, make_spec, broker, spark, request):
    uri = request.getfixturevalue("postgres_uri") if catalog == "postgresql" else "sqlite:///catalog.db"
    spec = make_spec(catalog_uri=uri, max_records=1_500)
    produce_orders(spec, 6_000, late=20, malformed=12)

    running = run_pipelines(spec, list(spec.pipelines), once=True)
    history = running[0].stager.history
    assert len([b for b in history if b.records_read]) >= 4, "the read limit should split the topic into batches"
    assert sum(b.records_read for b in history) == 6_000

    expected = assert_exactly_once(spec)
    assert len(expected.rejects) == 12
    assert sum(expected.late_by_batch.values()) > 0, "some late events must really be dropped"
    assert sum(w["order_count"] for w in expected.windows.values()) > 3_000


def test_malformed_events_are_quarantined_with_offsets_and_reasons(make_spec, broker, spark):
    spec = make_spec()
    produce_orders(spec, 600, malformed=60)
    run_pipelines(spec, list(spec.pipelines), once=True)
    assert_exactly_once(spec)

    rejects = load_catalog(spec).load_table(qualified(spec, spec.pipeline().rejects_table)).scan().to_arrow()
    assert rejects.num_rows == 60
    reasons = set(rejects.column("reason").to_pylist())
    assert {"malformed JSON", "missing field: amount", "null field: event_time"} <= reasons
    assert any(r.startswith("mistyped field: amount") for r in reasons)
    assert all(v is not None for v in rejects.column("value").to_pylist())
    assert set(rejects.column("topic").to_pylist()) == {spec.pipeline().topic}


def test_hopping_windows_carry_each_reject_once(make_spec, broker, spark):
    """The windowed job carries the batch's rejects as groups of their own; a hopping window puts a row in several
    windows, and a reject must still land once. The oracle: the topic read back, each record parsed on its own."""
    spec = make_spec(max_records=300)
    spec = replace(spec, pipelines=(replace(spec.pipeline(), slide_ms=spec.pipeline().window_ms // 4),))
    produce_orders(spec, 900, malformed=45)
    running = run_pipelines(spec, list(spec.pipelines), once=True)
    assert len(running[0].stager.history) >= 3
    commit_pipelines(spec, list(spec.pipelines))
    bootstrap, topic, partitions = spec.kafka.bootstrap_servers, spec.pipeline().topic, spec.kafka.partitions
    with KafkaAdmin(bootstrap, topic, {}) as admin:
        records = read_topic(bootstrap, topic, partitions, {p: admin.watermarks(p)[1] for p in range(partitions)})
    bad = {(p, o) for (p, o), value in records.items() if parse(value) is None}
    rejects = load_catalog(spec).load_table(qualified(spec, spec.pipeline().rejects_table)).scan().to_arrow()
    landed = list(zip(rejects.column("partition").to_pylist(), rejects.column("offset").to_pylist(), strict=True))
    assert len(bad) == 45 and sorted(landed) == sorted(bad)
    assert all(r.as_py() for r in rejects.column("reason"))


def test_rewound_checkpoint_replays_without_new_rows_or_snapshots(make_spec, broker, spark, tmp_path):
    spec = make_spec()
    produce_orders(spec, 4_000, late=10, malformed=5)
    run_pipelines(spec, list(spec.pipelines), once=True)
    old_copy = tmp_path / "checkpoint-copy"
    shutil.copytree(spec.checkpoint_dir(spec.pipeline()), old_copy)
    produce_orders(spec, 2_000, seed=8, start_ms=1_767_225_600_000 + 4_000 * 50)
    run_pipelines(spec, list(spec.pipelines), once=True)
    assert_exactly_once(spec)
    table_name = qualified(spec, spec.pipeline().table)
    ledger = open_ledger(spec)
    entries_before = len(ledger.entries())
    snapshots_before = len(load_catalog(spec).load_table(table_name).snapshots())

    # 1. Rewind: forget the last two batches' offsets and commits; Spark replays them.
    checkpoint = spec.checkpoint_dir(spec.pipeline())
    last = Checkpoint(checkpoint).rewind(2)
    replay = run_pipelines(spec, list(spec.pipelines), once=True)
    replayed = replay[0].stager.history
    assert [b.batch_id for b in replayed][:2] == [last - 1, last]
    assert not any(b.recorded for b in replayed if b.batch_id <= last)

    # 2. Restart from an old copy of the checkpoint: every batch since is replayed from the same offsets.
    shutil.rmtree(checkpoint)
    shutil.copytree(old_copy, checkpoint)
    replay = run_pipelines(spec, list(spec.pipelines), once=True)
    assert replay[0].stager.history and not any(b.recorded for b in replay[0].stager.history if b.records_read)

    assert_exactly_once(spec)
    assert len(ledger.entries()) - entries_before == sum(1 for b in replay[0].stager.history if b.recorded) * 2
    assert len(load_catalog(spec).load_table(table_name).snapshots()) == snapshots_before
    assert all(e.status == COMMITTED for e in ledger.entries())


T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _order(seq: int, partition: int, second: float) -> OrderEvent:
    at = T0_MS + int(second * 1000)
    value = {"order_id": f"o-{seq}", "customer_id": f"c-{seq % 3}", "amount": "1.25", "event_time": at}
    return OrderEvent(seq, partition, f"c-{seq}".encode(), json.dumps(value).encode(), "valid", at)


def _run_rounds(spec, rounds: list[list[OrderEvent]]) -> list[int]:
    """Each round produced, then read by one ``krishiv run --once`` (one batch per round); the batch ids."""
    batch_ids = []
    for events in rounds:
        produce(spec.kafka.bootstrap_servers, spec.pipeline().topic, events)
        running = run_pipelines(spec, list(spec.pipelines), once=True)
        batch_ids += [b.batch_id for b in running[0].stager.history if b.records_read]
    assert len(batch_ids) == len(rounds), "each round should be one batch"
    return batch_ids


def _kept_late(spec) -> tuple[dict[tuple[int, int, int], LateEvent], dict[tuple[int, int], bytes | None]]:
    """The rejects table's late rows by (batch, partition, offset), and every record of the topic."""
    commit_pipelines(spec, list(spec.pipelines))
    bootstrap, topic, partitions = spec.kafka.bootstrap_servers, spec.pipeline().topic, spec.kafka.partitions
    with KafkaAdmin(bootstrap, topic, {}) as admin:
        records = read_topic(bootstrap, topic, partitions, {p: admin.watermarks(p)[1] for p in range(partitions)})
    rejects = load_catalog(spec).load_table(qualified(spec, spec.pipeline().rejects_table)).scan().to_arrow()
    late = {
        (r["batch_id"], r["partition"], r["offset"]): LateEvent(r["reason"], r["value"])
        for r in rejects.to_pylist()
        if r["reason"].startswith("late:")
    }
    return late, records


def _coordinates(records: dict[tuple[int, int], bytes | None]) -> dict[str, tuple[int, int]]:
    """(partition, offset) of each valid order, by its order id."""
    return {json.loads(v)["order_id"]: where for where, v in records.items() if parse(v) is not None}


def test_late_events_are_kept_once_with_their_window_and_watermark(make_spec, broker, spark):
    """Late events placed deliberately: batch 0 moves the watermark to 00:02:05; batch 1 is one late event alone
    (00:00:30, its window [00:00, 00:01) written by batch 0); batch 2 mixes a late event (00:01:59), one on time in
    an open window, a malformed record and one that moves the watermark on. Each late event is in the rejects
    table once, by the batch that read it, with its value and reason, also after the batches are replayed; the
    windows leave them out (the oracle, folded from the topic by the documented watermark rule, says so)."""
    spec = make_spec(partitions=1)
    ensure_topic(spec.kafka.bootstrap_servers, spec.pipeline().topic, 1)
    rounds = [
        [_order(0, 0, 10), _order(1, 0, 70), _order(2, 0, 130)],
        [_order(3, 0, 30)],
        [
            _order(4, 0, 119),
            _order(5, 0, 121),
            OrderEvent(6, 0, b"c-6", b"{not json", "malformed"),
            _order(7, 0, 200),
        ],
    ]
    batches = _run_rounds(spec, rounds)
    expected = assert_exactly_once(spec)  # windows, rejects and late rows against the oracle
    late, records = _kept_late(spec)
    assert late == expected.late
    at = _coordinates(records)
    assert sorted(late) == [(batches[1], *at["o-3"]), (batches[2], *at["o-4"])], "the events placed late, each once"
    assert {b: n for b, n in expected.late_by_batch.items() if n} == {batches[1]: 1, batches[2]: 1}
    p = spec.pipeline()
    status = pipeline_status(open_ledger(spec), p.name, qualified(spec, p.table), p.topic, None)
    assert status.late_batches == sorted(((b, n) for b, n in expected.late_by_batch.items() if n), reverse=True)
    entries = open_ledger(spec).entries(table=qualified(spec, spec.pipeline().rejects_table))
    alone = next(e for e in entries if e.batch_id == batches[1])
    assert sum(f.records for f in alone.files) == 1, "a batch of one late event stages its row"

    # Replayed from a rewound checkpoint, the batches decide the same late events: nothing new is kept.
    Checkpoint(spec.checkpoint_dir(spec.pipeline())).rewind(2)
    replay = run_pipelines(spec, list(spec.pipelines), once=True)
    assert [b.late_events for b in replay[0].stager.history if b.records_read] == [1, 1]
    assert not any(b.recorded for b in replay[0].stager.history)
    assert _kept_late(spec)[0] == late
    assert_exactly_once(spec)


def test_a_hopping_event_is_late_only_when_its_last_window_is_closed(make_spec, broker, spark):
    """Hopping windows of a minute every 15 s: after the watermark reaches 00:02:05, an event at 00:01:06 (last
    window [00:01:00, 00:02:00)) is late, one at 00:01:20 (last window [00:01:15, 00:02:15) still open) is not,
    though its earlier windows are closed. The late events are the kinds oracle's fold of the topic."""
    spec = make_spec(partitions=1)
    spec = replace(spec, pipelines=(replace(spec.pipeline(), slide_ms=15_000),))
    ensure_topic(spec.kafka.bootstrap_servers, spec.pipeline().topic, 1)
    rounds = [
        [_order(0, 0, 10), _order(1, 0, 70), _order(2, 0, 130)],
        [_order(3, 0, 66), _order(4, 0, 80), _order(5, 0, 150)],
    ]
    batches = _run_rounds(spec, rounds)
    late, records = _kept_late(spec)
    entries = open_ledger(spec).entries(table=qualified(spec, spec.pipeline().rejects_table))
    assert late == expected_grouped_late(records, entries, spec.pipeline())
    where = (batches[1], *_coordinates(records)["o-3"])
    assert sorted(late) == [where], "only the event whose last window closed is late"
    assert late[where].reason == (
        "late: window [2026-01-01T00:01:00.000Z, 2026-01-01T00:02:00.000Z) closed at watermark 2026-01-01T00:02:05.000Z"
    )
    first = open_ledger(spec).entries(table=qualified(spec, spec.pipeline().table))
    assert {e.batch_id: e.metrics.get("late_events") for e in first} == {batches[0]: 0, batches[1]: 1}
