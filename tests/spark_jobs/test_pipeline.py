"""End to end through the real broker, Spark and catalogs: the table equals an independent oracle."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from chaos.oracle import parse, read_topic
from krishiv.operations import commit_pipelines, open_ledger, run_pipelines
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
