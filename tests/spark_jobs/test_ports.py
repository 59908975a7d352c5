"""The operator's skips applied to a batch's start, for one topic and for a source over several."""

from __future__ import annotations

from datetime import UTC, datetime

from krishiv_core.entries import OffsetSkip
from spark_jobs.ports import apply_topic_skips


def _skip(topic: str, partition: str, start: int, to: int, applied: int | None = None) -> OffsetSkip:
    return OffsetSkip(
        "shop", "q", topic, partition, start, to, "re-created", "ops", datetime(2026, 1, 1, tzinfo=UTC), applied
    )


def test_each_topics_skips_move_only_that_topics_partitions_and_keep_their_order() -> None:
    skips = [_skip("orders", "0", 40, 0), _skip("lines", "0", 40, 7), _skip("lines", "1", 9, 12, applied=3)]
    start = {"orders": {"0": 40, "1": 5}, "lines": {"0": 40, "1": 9}}
    moved, after = apply_topic_skips(skips, start, batch_id=8)
    assert moved == {"orders": {"0": 0, "1": 5}, "lines": {"0": 7, "1": 9}}  # the third was batch 3's
    assert [s.applied_batch_id for s in after] == [8, 8, 3]
    assert [(s.topic, s.partition) for s in after] == [("orders", "0"), ("lines", "0"), ("lines", "1")]
    again, _ = apply_topic_skips(after, start, batch_id=8)  # a replay of batch 8 reads the same
    assert again == moved
    later, _ = apply_topic_skips(after, {"orders": {"0": 40}, "lines": {"0": 40}}, batch_id=9)
    assert later == {"orders": {"0": 40}, "lines": {"0": 40}}  # applied once, by batch 8 only
