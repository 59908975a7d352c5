"""Offsets only move forward: a re-created topic stops the query by name, and ``krishiv skip-offsets`` moves past it
on the record (ledger and snapshot summary), through the real broker, Spark, ledger and catalog."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka.admin import AdminClient

from chaos.workspace import ORDER_FIELDS, SETTINGS_TEMPLATE
from krishiv.cli import main
from krishiv.operations import commit_pipelines, open_ledger, run_pipelines
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.errors import KrishivError
from krishiv_core.spec import load_spec
from outbox.relay import SUMMARY_SKIPPED
from spark_jobs.checkpoint import Checkpoint
from tests.spark_jobs.pipeline_helpers import produce_orders

RECREATE_TIMEOUT_S = 30.0


def recreate_topic(bootstrap: str, topic: str) -> None:
    """Delete ``topic`` and wait until the broker no longer lists it (it is created again by the next produce)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([topic]).values():
        future.result(RECREATE_TIMEOUT_S)
    deadline = time.monotonic() + RECREATE_TIMEOUT_S
    while topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"{topic} was still listed {RECREATE_TIMEOUT_S:.0f}s after its deletion"
        time.sleep(0.1)


@pytest.mark.heavy  # make test keeps the re-created topic with the batch in flight below; the matrix names skips
def test_a_recreated_topic_stops_the_query_and_a_recorded_skip_moves_past_it(make_spec, spec_file, spark, capsys):
    spec = make_spec(max_records=5_000)
    pipeline = spec.pipeline()
    produce_orders(spec, 2_000, malformed=4)
    run_pipelines(spec, [pipeline], once=True)
    commit_pipelines(spec, [pipeline])
    ledger = open_ledger(spec)
    before = {e.batch_id for e in ledger.entries()}

    recreate_topic(spec.kafka.bootstrap_servers, pipeline.topic)
    produce_orders(spec, 400, malformed=3, seed=11, start_ms=1_767_225_600_000 + 3_600_000)
    with pytest.raises(KrishivError, match=rf"SourceChanged: topic '{pipeline.topic}' .* is not the one"):
        run_pipelines(spec, [pipeline], once=True)
    assert {e.batch_id for e in ledger.entries()} == before, "nothing was staged from the new topic"

    stuck = Checkpoint(spec.checkpoint_dir(pipeline)).batch(max(before)).end
    for partition in sorted(stuck, key=int):
        code = main(
            ["--spec", str(spec_file), "skip-offsets", "--partition", partition, "--to", "0", "--reason", "re-created"]
        )
        assert code == 0, capsys.readouterr().err
    assert "moves from offset" in capsys.readouterr().out

    running = run_pipelines(spec, [pipeline], once=True)
    staged = [b for b in running[0].stager.history if b.recorded]
    assert sum(b.records_read for b in staged) == 400
    skips = ledger.skips(Checkpoint(spec.checkpoint_dir(pipeline)).query_id())
    assert {(s.partition, s.from_offset, s.to_offset) for s in skips} == {(p, end, 0) for p, end in stuck.items()}
    applied = {s.applied_batch_id for s in skips}
    assert applied == {staged[0].batch_id}, "the first batch after the skip applied every partition's skip"
    first = ledger.batch(skips[0].query_id, staged[0].batch_id)[qualified(spec, pipeline.table)]
    assert {p: r[0] for p, r in first.offsets[pipeline.topic].items()} == {p: 0 for p in stuck}

    commit_pipelines(spec, [pipeline])
    rejects = load_catalog(spec).load_table(qualified(spec, pipeline.rejects_table))
    assert rejects.scan().to_arrow().num_rows == 7, "4 rejects of the old topic and 3 of the new, once each"
    summaries = [s.summary.additional_properties for s in rejects.snapshots()]
    published = [json.loads(s[SUMMARY_SKIPPED]) for s in summaries if SUMMARY_SKIPPED in s]
    assert len(published) == 1, "the first snapshot after the skips names them, and no other"
    assert sorted((s["partition"], s["from"], s["to"], s["batch"]) for s in published[0]) == sorted(
        (p, end, 0, staged[0].batch_id) for p, end in stuck.items()
    )
    assert all(s["reason"].startswith("re-created") and s["by"] for s in published[0])

    # A replay of the batch that applied the skips reads the same offsets again.
    Checkpoint(spec.checkpoint_dir(pipeline)).rewind(1)
    replay = run_pipelines(spec, [pipeline], once=True)
    assert not any(b.recorded for b in replay[0].stager.history)


EVENTS_SPEC = (
    SETTINGS_TEMPLATE
    + """
[[pipelines]]
name = "orders_raw"
kind = "events"
topic = "{topic}"
kafka_metadata = ["partition", "offset"]
max_records_per_batch = 5000
{fields}
"""
)


def test_a_batch_recorded_before_the_topic_was_re_created_is_committed_once_and_verify_tells_the_topics_apart(
    tmp_path, broker, topic, spark, capsys, monkeypatch
):
    """The batch in flight when the topic goes: staged and recorded, but not in Spark's commit log (the driver died
    after the ledger). Its entries stand, with the old topic's id; the skip applies to the batch after it, which
    reads the new topic from offset 0. ``verify`` then sees the same (partition, offset) in two rows, one per
    incarnation of the topic, and names no duplicate, before and after the ledger folds its entries; a real copy
    of a row is still named."""
    spec_file = tmp_path / "krishiv.toml"
    spec_file.write_text(
        EVENTS_SPEC.format(
            bootstrap=broker.bootstrap,
            partitions=2,
            catalog_uri="sqlite:///catalog.db",
            warehouse="warehouse",
            topic=topic,
            fields=ORDER_FIELDS,
        )
    )
    spec = load_spec(spec_file, env={})
    pipeline = spec.pipeline()
    cli = ["--spec", str(spec_file)]
    produce_orders(spec, 400, malformed=4)
    monkeypatch.setenv("KRISHIV_FAULTS", "stage.after_ledger@0:raise")
    with pytest.raises(KrishivError):
        run_pipelines(spec, [pipeline], once=True)
    monkeypatch.delenv("KRISHIV_FAULTS")
    ledger = open_ledger(spec)
    (old_id,) = {e.topic_id for e in ledger.entries()}
    assert old_id is not None, "Tansu reports topic ids, and the entry records the one the batch was read from"

    recreate_topic(spec.kafka.bootstrap_servers, pipeline.topic)
    produce_orders(spec, 300, malformed=3, seed=11)
    with pytest.raises(KrishivError, match=r"SourceChanged: .* krishiv skip-offsets --pipeline orders_raw"):
        run_pipelines(spec, [pipeline], once=True)
    recorded = Checkpoint(spec.checkpoint_dir(pipeline)).batch(0)
    for partition in sorted(recorded.end, key=int):  # the refusal's own commands
        code = main([*cli, "skip-offsets", "--partition", partition, "--to", "0", "--reason", "re-created"])
        assert code == 0, capsys.readouterr().err
    running = run_pipelines(spec, [pipeline], once=True)
    staged = [b for b in running[0].stager.history if b.recorded]
    assert sum(b.records_read for b in staged) == 300, "the new topic's records, each once; batch 0 not again"
    new_ids = {e.topic_id for e in ledger.entries() if e.batch_id > 0}
    assert len(new_ids) == 1 and old_id not in new_ids
    skips = ledger.skips(Checkpoint(spec.checkpoint_dir(pipeline)).query_id())
    assert {(s.partition, s.from_offset, s.to_offset) for s in skips} == {(p, e, 0) for p, e in recorded.end.items()}

    commit_pipelines(spec, [pipeline])
    catalog = load_catalog(spec)
    events = catalog.load_table(qualified(spec, pipeline.table)).scan().to_arrow()
    rejects = catalog.load_table(qualified(spec, pipeline.rejects_table)).scan().to_arrow()
    assert (events.num_rows, rejects.num_rows) == (396 + 297, 4 + 3), "batch 0 as recorded, the new topic once"
    coordinates = list(zip(events["_kafka_partition"].to_pylist(), events["_kafka_offset"].to_pylist(), strict=True))
    assert len(set(coordinates)) < len(coordinates), "the new topic reuses offsets the old one had"
    capsys.readouterr()
    assert main([*cli, "verify"]) == 0, capsys.readouterr().out
    assert main([*cli, "ledger-compact", "--retention", "0s"]) == 0  # the ranges go to the archive, by topic id
    assert main([*cli, "verify"]) == 0, capsys.readouterr().out

    table = catalog.load_table(qualified(spec, pipeline.table))
    copy = table.scan().to_arrow().slice(0, 1)
    table.append(copy)  # a second writer writes one event again
    capsys.readouterr()
    assert main([*cli, "verify"]) == 1
    partition, offset = copy["_kafka_partition"][0].as_py(), copy["_kafka_offset"][0].as_py()
    assert f"Kafka partition {partition} offset {offset} appears more than once" in capsys.readouterr().out
