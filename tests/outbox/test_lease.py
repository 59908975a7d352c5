"""The stager lease: one live process runs a pipeline's query; a dead or expired holder is taken over, and a
process that lost its lease records nothing more."""

from __future__ import annotations

import dataclasses
import multiprocessing
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from krishiv.cli import main
from krishiv.produce import ensure_topic
from krishiv_core.entries import OutboxEntry
from krishiv_core.errors import StagerLeaseLost
from outbox.errors import StagerBusy
from outbox.lease import HeldLease, stager_lease
from outbox.ledger import Ledger
from outbox.ledger.leases import StagerLease, node_identity, process_token

HOLD = (
    "import sys, time; from outbox.ledger import Ledger;"
    "Ledger(sys.argv[1]).acquire_lease('orders_per_minute', 'krishiv run', float(sys.argv[2]));"
    "print('held', flush=True); time.sleep(120)"
)


def _holder(path: Path, ttl_s: float = 60.0) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(ttl_s)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_live_holder_blocks_and_is_named(ledger: Ledger) -> None:
    holder = _holder(Path(ledger.path))
    try:
        with pytest.raises(StagerBusy, match=rf"already being staged by krishiv run \(pid {holder.pid} on "):
            ledger.acquire_lease("orders_per_minute", "dagster run x", 30)
        assert ledger.live_lease("orders_per_minute").pid == holder.pid
        # Another pipeline is free.
        assert ledger.acquire_lease("refunds", "dagster run x", 30).holder == "dagster run x"
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holder_is_taken_over_at_once(ledger: Ledger) -> None:
    holder = _holder(Path(ledger.path))
    holder.kill()
    holder.wait()
    assert ledger.live_lease("orders_per_minute") is None
    lease = ledger.acquire_lease("orders_per_minute", "krishiv run", 30)
    assert ledger.live_lease("orders_per_minute") == lease


def test_an_expired_lease_is_taken_over(ledger: Ledger) -> None:
    holder = _holder(Path(ledger.path), ttl_s=0.2)
    try:
        deadline = time.monotonic() + 10
        while ledger.live_lease("orders_per_minute") is not None:
            assert time.monotonic() < deadline, "the lease never expired"
            time.sleep(0.05)
        assert ledger.acquire_lease("orders_per_minute", "krishiv run", 30).pid != holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_the_context_renews_and_releases(ledger: Ledger) -> None:
    # Renewed every ttl/3; a TTL of 3 s leaves a loaded machine time for a late renewal.
    with stager_lease(ledger, "orders_per_minute", "krishiv run", ttl_s=3.0) as lease:
        assert not lease.lost
        first_expiry = ledger.live_lease("orders_per_minute").expires_at
        deadline = time.monotonic() + 10
        while ledger.live_lease("orders_per_minute").expires_at == first_expiry:
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.05)
        assert ledger.live_lease("orders_per_minute").pid == lease.pid
    assert ledger.live_lease("orders_per_minute") is None


def test_krishiv_run_refuses_a_pipeline_staged_elsewhere_and_goes_on_once_it_stops(
    spec_file: Path, make_spec, spark, capsys
) -> None:
    spec = make_spec()
    pipeline = spec.pipelines[0]
    ensure_topic(spec.kafka.bootstrap_servers, pipeline.topic, spec.kafka.partitions)  # the topic check comes first
    holder = _holder(spec.resolve(spec.storage.ledger_path))
    try:
        assert main(["--spec", str(spec_file), "run", "--once"]) == 2
        err = capsys.readouterr().err
        assert "pipeline 'orders_per_minute' is already being staged by krishiv run" in err
        assert f"pid {holder.pid}" in err
        assert err.rstrip().endswith("(see docs/operations.md: Recovery runbook > Another run holds the pipeline)"), err
    finally:
        holder.kill()  # the runbook's way: the holder stopped, the run goes on
        holder.wait()
    assert main(["--spec", str(spec_file), "run", "--once"]) == 0, capsys.readouterr().err


# ------------------------------------------------------------------------------------------- fencing

CONNECT = """
import time

import duckdb


def connect(path):
    # The other process may hold the file for a moment (a renewal): retry, as the ledger would.
    deadline = time.monotonic() + 60
    while True:
        try:
            return duckdb.connect(path)
        except duckdb.IOException as exc:
            if "lock" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
"""

TAKEOVER = (
    CONNECT
    + """
import sys, time
from datetime import UTC, datetime

from outbox.errors import StagerBusy
from outbox.ledger import Ledger

path = sys.argv[1]
# Holding the file open keeps the other process's renewals waiting, as a pause or a partition would.
con = connect(path)
print("locked", flush=True)
deadline = time.monotonic() + 60
while True:
    row = con.execute("SELECT expires_at FROM stager_lease WHERE pipeline = 'orders_per_minute'").fetchone()
    wait = (row[0] - datetime.now(UTC)).total_seconds() if row else 0.0
    if wait > 0:
        time.sleep(wait + 0.01)  # until the lease's own expiry, a known instant
    try:
        Ledger(path).acquire_lease("orders_per_minute", "krishiv run (second)", 60)
        break
    except StagerBusy:
        assert time.monotonic() < deadline, "the lease never expired"
con.close()
print("took over", flush=True)
sys.stdin.readline()
"""
)

LOCK = (
    CONNECT
    + """
import sys

con = connect(sys.argv[1])
print("locked", flush=True)
sys.stdin.readline()
con.close()
print("released", flush=True)
sys.stdin.readline()
"""
)


def _child(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def _entry(batch_id: int) -> OutboxEntry:
    return OutboxEntry(
        "q1", "orders_per_minute", "orders_per_minute", batch_id, {"orders": {"0": [0, 10]}}, (), 1_000 + batch_id
    )


def _wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)


def test_a_stager_whose_expired_lease_was_taken_over_records_nothing(ledger: Ledger) -> None:
    old = ledger.acquire_lease("orders_per_minute", "krishiv run", 2.0)
    assert ledger.lease_held(old)
    assert ledger.record_batch([_entry(0)], lease=old) == [True]
    _wait_until(lambda: ledger.live_lease("orders_per_minute") is None)
    assert not ledger.lease_held(old)  # expired, though nobody took it yet

    second = _holder(Path(ledger.path))
    try:
        with pytest.raises(StagerLeaseLost) as info:
            ledger.record_batch([_entry(1)], lease=old)
        message = str(info.value)
        assert "pipeline 'orders_per_minute'" in message
        assert f"now held by krishiv run (pid {second.pid} on " in message
        assert "nothing was written" in message
        assert message.endswith("(see docs/operations.md: Recovery runbook > Another run holds the pipeline)")
        assert [e.batch_id for e in ledger.entries()] == [0]
        assert not ledger.lease_held(old)
        assert not ledger.renew_lease(old, 30)
        ledger.release_lease(old)  # releasing a lease it lost leaves the new holder's alone
        assert ledger.live_lease("orders_per_minute").pid == second.pid
        # Without a lease, recording does not look at the lease (the relay and the tests record freely).
        assert ledger.record_batch([_entry(1)]) == [True]
    finally:
        second.kill()
        second.wait()


def test_an_expired_lease_is_refused_even_before_anyone_takes_it(ledger: Ledger) -> None:
    lease = ledger.acquire_lease("orders_per_minute", "krishiv run", 0.5)
    _wait_until(lambda: not ledger.lease_held(lease))
    with pytest.raises(StagerLeaseLost, match=r"expired at .* without a renewal"):
        ledger.record_batch([_entry(0)], lease=lease)
    assert ledger.entries() == []


def test_renewals_after_a_takeover_mark_the_handle_lost(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.duckdb", lock_timeout_s=60.0)
    ledger.migrate()
    with stager_lease(ledger, "orders_per_minute", "krishiv run", ttl_s=3.0) as held:
        assert isinstance(held, HeldLease) and not held.lost and held.lost_reason is None
        assert held.pipeline == held.lease.pipeline == "orders_per_minute"  # usable as the lease
        second = _child(TAKEOVER, ledger.path)
        try:
            assert second.stdout.readline().strip() == "locked"
            assert second.stdout.readline().strip() == "took over"
            assert held.wait_lost(timeout=60), "the renewer never noticed the takeover"
            assert held.lost
            assert f"taken over by krishiv run (second) (pid {second.pid} on " in (held.lost_reason or "")
            with pytest.raises(StagerLeaseLost, match=r"taken over by krishiv run \(second\)"):
                held.ensure_held()
            with pytest.raises(StagerLeaseLost):
                ledger.record_batch([_entry(0)], lease=held.lease)
            assert ledger.entries() == []
        finally:
            second.stdin.close()
            second.wait(timeout=60)
    # A lost lease is not released on exit: the row is the second holder's.
    assert ledger.current_lease("orders_per_minute").holder == "krishiv run (second)"


def test_a_lease_that_expires_while_the_ledger_is_unreachable_is_lost(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.duckdb", lock_timeout_s=0.2)
    ledger.migrate()
    with stager_lease(ledger, "orders_per_minute", "krishiv run", ttl_s=2.0) as held:
        holder = _child(LOCK, ledger.path)
        try:
            assert holder.stdout.readline().strip() == "locked"
            assert held.wait_lost(timeout=30)
            # Usually "expired while the ledger could not be written"; a renewal the load delayed past the
            # expiry before the file was locked says "expired at ..." instead.
            assert "expired" in (held.lost_reason or "")
            holder.stdin.write("release\n")
            holder.stdin.flush()
            assert holder.stdout.readline().strip() == "released"
            with pytest.raises(StagerLeaseLost):
                ledger.record_batch([_entry(0)], lease=held.lease)
        finally:
            holder.stdin.close()
            holder.wait(timeout=60)


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_the_pid_is_checked_only_in_this_pid_space() -> None:
    now = datetime.now(UTC)
    here = StagerLease(
        "p", "krishiv run", socket.gethostname(), _dead_pid(), now, now + timedelta(minutes=1), "t", node_identity()
    )
    assert not here.alive()  # same host, same pid space: the dead pid means the holder is gone
    # Another container with the same hostname (another pid namespace or boot): its pid says nothing here.
    assert dataclasses.replace(here, node="another-boot/4026531836").alive()
    assert dataclasses.replace(here, node=None).alive()  # a row from before the identity was recorded
    assert not dataclasses.replace(here, expires_at=now).alive(now)


def _report_token(results) -> None:
    results.put(process_token())


def test_a_forked_child_gets_its_own_token() -> None:
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_report_token, args=(results,))
    child.start()
    try:
        assert results.get(timeout=60) != process_token()
    finally:
        child.join(timeout=60)
    assert len(process_token()) == 32


def test_this_process_may_take_its_own_lease_again(ledger: Ledger) -> None:
    first = ledger.acquire_lease("orders_per_minute", "krishiv run", 30)
    again = ledger.acquire_lease("orders_per_minute", "krishiv run", 30)
    assert first.token == again.token == process_token()
    assert ledger.lease_held(again) and ledger.lease_held(first)


def test_a_lease_says_whether_its_process_commits_its_own_batches(ledger: Ledger) -> None:
    with stager_lease(ledger, "orders_per_minute", "krishiv run", committing=True) as held:
        assert held.committing
        seen = ledger.live_lease("orders_per_minute")
        assert seen is not None and seen.committing
        assert "krishiv run (pid" in seen.describe() and "committing its own batches" in seen.describe()
    with stager_lease(ledger, "orders_per_minute", "dagster run 1a2b3c4d") as held:
        assert not held.committing
        seen = ledger.live_lease("orders_per_minute")
        assert seen is not None and not seen.committing and "committing" not in seen.describe()
