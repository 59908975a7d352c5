"""``krishiv status`` says what must not pass silently, each with its way out (the CLI's run of it on a real
pipeline: ``tests/krishiv/test_cli.py``)."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime, timedelta

from krishiv.status import BrokerSide, PartitionLag, PipelineStatus, status_warnings
from outbox.ledger.entries import PendingBatch
from outbox.ledger.leases import StagerLease, node_identity

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def _status(staged: int = 100) -> PipelineStatus:
    return PipelineStatus("orders", "krishiv.orders", partitions=[PartitionLag("0", 150, staged, staged)])


def _lease(expires_in_s: float, pid: int) -> StagerLease:
    return StagerLease(
        "orders",
        "krishiv run",
        socket.gethostname(),
        pid,
        NOW,
        NOW + timedelta(seconds=expires_in_s),
        "token",
        node_identity(),
    )


def test_a_healthy_pipeline_has_no_warning() -> None:
    live = _lease(30, os.getpid())
    pending = [PendingBatch("q", "krishiv.orders", 4, NOW - timedelta(seconds=5))]
    assert status_warnings(_status(), BrokerSide({"0": 50}, "id-1"), "id-1", pending, live, NOW) == []


def test_a_re_created_topic_is_named_and_not_mistaken_for_retention() -> None:
    [line] = status_warnings(_status(), BrokerSide({"0": 0}, "id-2"), "id-1", [], None, NOW)
    assert line.startswith("topic re-created: its id is id-2, the last batch was read from id-1")
    assert "krishiv skip-offsets" in line


def test_offsets_deleted_before_they_were_read_name_the_skip_command() -> None:
    [line] = status_warnings(_status(staged=100), BrokerSide({"0": 120}, "id-1"), "id-1", [], None, NOW)
    assert line == (
        "partition 0: offsets 100 to 119 were deleted by the broker's retention before the query read them; the next "
        'run stops there: krishiv skip-offsets --pipeline orders --partition 0 --to 120 --reason "…" moves on, recorded'
    )


def test_entries_pending_past_the_age_and_an_expired_lease() -> None:
    pending = [
        PendingBatch("q", "krishiv.orders", 4, NOW - timedelta(minutes=31)),
        PendingBatch("q", "krishiv.orders_rejects", 4, NOW - timedelta(minutes=31)),
    ]
    lines = status_warnings(_status(), BrokerSide(), None, pending, _lease(-60, os.getpid()), NOW, 600)
    assert lines[0] == (
        "2 pending entries, the oldest staged 31 min ago: nothing is committing them; run krishiv commit (or krishiv "
        "run, or turn on Dagster's sensors)"
    )
    assert lines[1].startswith("the stager lease of krishiv run (pid ") and "has expired" in lines[1]
    assert status_warnings(_status(), BrokerSide(), None, pending, None, NOW, 3600) == []
