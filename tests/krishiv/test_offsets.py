"""Offsets only move forward: a re-created topic stops the query by name, and ``krishiv skip-offsets`` moves past it
on the record (ledger and snapshot summary), through the real broker, Spark, ledger and catalog."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka.admin import AdminClient

from krishiv.cli import main
from krishiv.operations import commit_pipelines, open_ledger, run_pipelines
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.errors import KrishivError
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
