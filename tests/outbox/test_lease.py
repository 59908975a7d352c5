"""The stager lease: one live process runs a pipeline's query; a dead or expired holder is taken over, and a
process that lost its lease records nothing more, fenced by both of the lease's tokens: the process's, and the
fencing token ``epoch`` that grows by one with each takeover by another process.

Every test of the lease's behaviour runs on both of the ledger's databases (``ledger_location``); the tests that
lock a DuckDB file to hold renewals back are about DuckDB, and have a PostgreSQL counterpart where it is worth one.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from krishiv.cli import main
from krishiv.produce import ensure_topic
from krishiv_core.entries import OutboxEntry
from krishiv_core.errors import StagerLeaseLost
from outbox.errors import StagerBusy, ledger_outage
from outbox.lease import HeldLease, stager_lease
from outbox.ledger import Ledger
from outbox.ledger.leases import StagerLease, node_identity, process_token
from tests.outbox.test_ledger import CHILD_TIMEOUT_S, ON_POSTGRESQL, Child, _hold_postgresql_write_lock, _release

PIPELINE = "orders_per_minute"

HOLD = """
    import sys
    from outbox.ledger import Ledger

    Ledger(sys.argv[1]).acquire_lease("orders_per_minute", "krishiv run", float(sys.argv[2]))
    print("held", flush=True)
    sys.stdin.readline()  # alive, and holding the lease, until told to stop or killed
"""


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.kill()


def _holder(location: str, children: list[Child], ttl_s: float = 60.0) -> Child:
    """Another process that takes the pipeline's lease for ``ttl_s`` and stays alive until killed."""
    holder = Child(HOLD, location, str(ttl_s))
    children.append(holder)
    assert holder.read_line(timeout=CHILD_TIMEOUT_S) == "held"
    return holder


def _wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout}s"
        time.sleep(0.02)


def test_a_live_holder_blocks_and_is_named(ledger: Ledger, ledger_location: str, children: list[Child]) -> None:
    holder = _holder(ledger_location, children)
    with pytest.raises(StagerBusy, match=rf"already being staged by krishiv run \(pid {holder.pid} on "):
        ledger.acquire_lease(PIPELINE, "dagster run x", 30)
    live = ledger.live_lease(PIPELINE)
    assert live is not None and live.pid == holder.pid
    # Another pipeline is free.
    assert ledger.acquire_lease("refunds", "dagster run x", 30).holder == "dagster run x"


def test_a_killed_holder_is_taken_over_at_once(ledger: Ledger, ledger_location: str, children: list[Child]) -> None:
    holder = _holder(ledger_location, children)
    holder.kill()
    assert ledger.live_lease(PIPELINE) is None
    lease = ledger.acquire_lease(PIPELINE, "krishiv run", 30)
    assert ledger.live_lease(PIPELINE) == lease


def test_an_expired_lease_is_taken_over(ledger: Ledger, ledger_location: str, children: list[Child]) -> None:
    holder = _holder(ledger_location, children, ttl_s=0.2)
    _wait_until(lambda: ledger.live_lease(PIPELINE) is None, "the lease never expired")
    assert ledger.acquire_lease(PIPELINE, "krishiv run", 30).pid != holder.pid


def test_the_context_renews_and_releases(ledger: Ledger) -> None:
    # Renewed every ttl/3; a TTL of 3 s leaves a loaded machine time for a late renewal.
    with stager_lease(ledger, PIPELINE, "krishiv run", ttl_s=3.0) as lease:
        assert not lease.lost
        first = ledger.live_lease(PIPELINE)
        assert first is not None
        _wait_until(lambda: _live(ledger).expires_at != first.expires_at, "the lease was never renewed")
        assert _live(ledger).pid == lease.pid
        assert _live(ledger).epoch == first.epoch  # a renewal is no takeover
    assert ledger.live_lease(PIPELINE) is None


def _live(ledger: Ledger) -> StagerLease:
    lease = ledger.live_lease(PIPELINE)
    assert lease is not None, "nobody holds the lease"
    return lease


def test_krishiv_run_refuses_a_pipeline_staged_elsewhere_and_goes_on_once_it_stops(
    spec_file: Path, make_spec, spark, capsys, children: list[Child]
) -> None:
    spec = make_spec()
    pipeline = spec.pipelines[0]
    ensure_topic(spec.kafka.bootstrap_servers, pipeline.topic, spec.kafka.partitions)  # the topic check comes first
    holder = _holder(spec.ledger_location(), children)
    try:
        assert main(["--spec", str(spec_file), "run", "--once"]) == 2
        err = capsys.readouterr().err
        assert "pipeline 'orders_per_minute' is already being staged by krishiv run" in err
        assert f"pid {holder.pid}" in err
        assert err.rstrip().endswith("(see docs/operations.md: Recovery runbook > Another run holds the pipeline)"), err
    finally:
        holder.kill()  # the runbook's way: the holder stopped, the run goes on
    assert main(["--spec", str(spec_file), "run", "--once"]) == 0, capsys.readouterr().err


# ------------------------------------------------------------------------------------------- fencing


def _entry(batch_id: int) -> OutboxEntry:
    return OutboxEntry("q1", PIPELINE, "orders_per_minute", batch_id, {"orders": {"0": [0, 10]}}, (), 1_000 + batch_id)


def _epoch(ledger: Ledger) -> int | None:
    current = ledger.current_lease(PIPELINE)
    assert current is not None, "the lease row is gone"
    return current.epoch


def test_a_stager_whose_expired_lease_was_taken_over_records_nothing(
    ledger: Ledger, ledger_location: str, children: list[Child]
) -> None:
    old = ledger.acquire_lease(PIPELINE, "krishiv run", 2.0)
    assert ledger.lease_held(old)
    assert ledger.record_batch([_entry(0)], lease=old) == [True]
    _wait_until(lambda: ledger.live_lease(PIPELINE) is None, "the lease never expired")
    assert not ledger.lease_held(old)  # expired, though nobody took it yet

    second = _holder(ledger_location, children)
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
    assert _live(ledger).pid == second.pid
    # Without a lease, recording does not look at the lease (the relay and the tests record freely).
    assert ledger.record_batch([_entry(1)]) == [True]


def test_an_expired_lease_is_refused_even_before_anyone_takes_it(ledger: Ledger) -> None:
    lease = ledger.acquire_lease(PIPELINE, "krishiv run", 0.5)
    _wait_until(lambda: not ledger.lease_held(lease), "the lease never expired")
    with pytest.raises(StagerLeaseLost, match=r"expired at .* without a renewal"):
        ledger.record_batch([_entry(0)], lease=lease)
    assert ledger.entries() == []


def test_the_fencing_token_grows_with_each_takeover_by_another_process_and_stays_on_renewal(
    ledger: Ledger, ledger_location: str, children: list[Child]
) -> None:
    first = ledger.acquire_lease(PIPELINE, "krishiv run", 30)
    assert first.epoch is not None and _epoch(ledger) == first.epoch

    # This process renewing its lease, or taking it again, is no takeover.
    assert ledger.renew_lease(first, 30)
    again = ledger.acquire_lease(PIPELINE, "krishiv run", 0.5)
    assert again.epoch == _epoch(ledger) == first.epoch

    # Another process takes the expired lease over: one more.
    _wait_until(lambda: not ledger.lease_held(again), "the lease never expired")
    other = _holder(ledger_location, children)
    assert _epoch(ledger) == first.epoch + 1
    with pytest.raises(StagerBusy):
        ledger.acquire_lease(PIPELINE, "krishiv run", 30)
    assert _epoch(ledger) == first.epoch + 1  # a refused attempt changes nothing

    # This process takes the dead holder's lease over: one more again; its renewals keep it.
    other.kill()
    taken = ledger.acquire_lease(PIPELINE, "krishiv run", 30)
    assert taken.epoch == _epoch(ledger) == first.epoch + 2
    assert ledger.renew_lease(taken, 30) and ledger.renew_lease(taken, 30)
    assert ledger.acquire_lease(PIPELINE, "krishiv run", 30).epoch == _epoch(ledger) == first.epoch + 2

    # A third process, once this one's lease expired: one more.
    ledger.acquire_lease(PIPELINE, "krishiv run", 0.5)
    _wait_until(lambda: ledger.live_lease(PIPELINE) is None, "the lease never expired")
    third = _holder(ledger_location, children)
    assert _epoch(ledger) == first.epoch + 3
    assert _live(ledger).pid == third.pid

    # A lease given up leaves no row, but its token stays behind: the next holder's is greater still.
    third.kill()
    mine = ledger.acquire_lease(PIPELINE, "krishiv run", 30)
    ledger.release_lease(mine)
    assert ledger.current_lease(PIPELINE) is None
    assert ledger.acquire_lease(PIPELINE, "krishiv run", 30).epoch == first.epoch + 5


def test_a_lease_of_an_older_epoch_is_refused_and_writes_nothing(
    ledger: Ledger, ledger_location: str, children: list[Child]
) -> None:
    """This process lost its lease to a takeover, then took the lease back: the row carries this process's token
    again, but a newer fencing token, so the lease it lost stays lost (only the epoch tells the two apart)."""
    old = ledger.acquire_lease(PIPELINE, "krishiv run", 0.5)
    skip = ledger.record_skip(PIPELINE, "q1", "orders", 0, 10, 20, "deleted by retention", "ana")
    _wait_until(lambda: not ledger.lease_held(old), "the lease never expired")
    _holder(ledger_location, children).kill()  # took the expired lease over, and died holding it
    new = ledger.acquire_lease(PIPELINE, "krishiv run", 30)
    assert old.epoch is not None
    assert new.token == old.token and new.epoch == old.epoch + 2  # two takeovers by another process each

    with pytest.raises(StagerLeaseLost) as info:
        ledger.record_batch([_entry(0)], lease=old)
    assert "nothing was written" in str(info.value)
    with pytest.raises(StagerLeaseLost):
        ledger.mark_skip_applied(skip, 0, lease=old)
    assert ledger.entries() == []
    assert ledger.skips("q1") == [skip]  # not applied
    assert not ledger.lease_held(old)
    assert not ledger.renew_lease(old, 30)
    ledger.release_lease(old)  # leaves the current lease alone
    assert ledger.live_lease(PIPELINE) == new

    assert ledger.lease_held(new)
    assert ledger.record_batch([_entry(0)], lease=new) == [True]


RACER = """
    import sys
    from outbox.errors import StagerBusy
    from outbox.ledger import Ledger

    ledger = Ledger(sys.argv[1])
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"
    for pipeline in sys.argv[2:]:
        try:
            print(pipeline, "acquired", ledger.acquire_lease(pipeline, "krishiv run", 60).epoch, flush=True)
        except StagerBusy:
            print(pipeline, "busy", "-", flush=True)
    sys.stdin.readline()  # alive, and holding what it took, until told to stop
"""


def test_processes_racing_for_a_free_lease_one_gets_it_the_other_is_busy(
    ledger: Ledger, ledger_location: str, children: list[Child]
) -> None:
    """Two processes ask for the same free leases at the same moment (five pipelines, in the same order): each lease
    goes to exactly one of them, and the other is told it is busy."""
    pipelines = [f"pipeline_{n}" for n in range(5)]
    ledger.migrate()
    racers = [Child(RACER, ledger_location, *pipelines) for _ in range(2)]
    children.extend(racers)
    for racer in racers:
        assert racer.read_line(timeout=CHILD_TIMEOUT_S) == "ready"
    for racer in racers:
        racer.send("go")
    outcomes = [[racer.read_line(timeout=CHILD_TIMEOUT_S).split() for _ in pipelines] for racer in racers]

    for n, pipeline in enumerate(pipelines):
        said = {racer.pid: outcome[n] for racer, outcome in zip(racers, outcomes, strict=True)}
        assert all(name == pipeline for name, _, _ in said.values())
        assert sorted(word for _, word, _ in said.values()) == ["acquired", "busy"], said
        winner = next(pid for pid, (_, word, _) in said.items() if word == "acquired")
        current = ledger.live_lease(pipeline)
        assert current is not None and (current.pid, current.epoch) == (winner, int(said[winner][2]))
    for racer in racers:
        racer.send("stop")
        assert racer.finish(timeout=CHILD_TIMEOUT_S) == 0, racer.stderr


# ------------------------------------------------------------------------------------------- renewals held back

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


def test_renewals_after_a_takeover_mark_the_handle_lost(tmp_path: Path, children: list[Child]) -> None:
    ledger = Ledger(tmp_path / "ledger.duckdb", lock_timeout_s=60.0)
    ledger.migrate()
    with stager_lease(ledger, PIPELINE, "krishiv run", ttl_s=3.0) as held:
        assert isinstance(held, HeldLease) and not held.lost and held.lost_reason is None
        assert held.pipeline == held.lease.pipeline == PIPELINE  # usable as the lease
        second = Child(TAKEOVER, ledger.path)
        children.append(second)
        assert second.read_line(timeout=CHILD_TIMEOUT_S) == "locked"
        assert second.read_line(timeout=CHILD_TIMEOUT_S) == "took over"
        assert held.wait_lost(timeout=60), "the renewer never noticed the takeover"
        assert held.lost
        assert f"taken over by krishiv run (second) (pid {second.pid} on " in (held.lost_reason or "")
        with pytest.raises(StagerLeaseLost, match=r"taken over by krishiv run \(second\)"):
            held.ensure_held()
        with pytest.raises(StagerLeaseLost):
            ledger.record_batch([_entry(0)], lease=held.lease)
        assert ledger.entries() == []
        assert second.finish(timeout=CHILD_TIMEOUT_S) == 0, second.stderr
    # A lost lease is not released on exit: the row is the second holder's.
    current = ledger.current_lease(PIPELINE)
    assert current is not None and current.holder == "krishiv run (second)"


def test_a_lease_that_expires_while_the_ledger_is_unreachable_is_lost(tmp_path: Path, children: list[Child]) -> None:
    ledger = Ledger(tmp_path / "ledger.duckdb", lock_timeout_s=0.2)
    ledger.migrate()
    with stager_lease(ledger, PIPELINE, "krishiv run", ttl_s=2.0) as held:
        holder = Child(LOCK, ledger.path)
        children.append(holder)
        assert holder.read_line(timeout=CHILD_TIMEOUT_S) == "locked"
        assert held.wait_lost(timeout=30)
        # Usually "expired while the ledger could not be written"; a renewal the load delayed past the
        # expiry before the file was locked says "expired at ..." instead.
        assert "expired" in (held.lost_reason or "")
        if "could not be written" in (held.lost_reason or ""):  # what a continuous run then waits out
            assert ledger_outage(held.lost_to), held.lost_to
        holder.send("release")
        assert holder.read_line(timeout=CHILD_TIMEOUT_S) == "released"
        with pytest.raises(StagerLeaseLost):
            ledger.record_batch([_entry(0)], lease=held.lease)
        assert holder.finish(timeout=CHILD_TIMEOUT_S) == 0, holder.stderr


@ON_POSTGRESQL
def test_a_lease_that_expires_while_the_postgresql_ledger_is_locked_is_lost(
    ledger_location: str, children: list[Child]
) -> None:
    """Another process's write holds the PostgreSQL ledger's lock past the lease's expiry: every renewal finds the
    ledger busy, and once the lease has certainly expired the handle is lost; the stager records nothing more."""
    ledger = Ledger(ledger_location, lock_timeout_s=0.2)
    ledger.migrate()
    with stager_lease(ledger, PIPELINE, "krishiv run", ttl_s=2.0) as held:
        holder, _ = _hold_postgresql_write_lock(ledger_location, children)
        assert held.wait_lost(timeout=30)
        assert "expired" in (held.lost_reason or "")  # as with a locked DuckDB file (see the test above)
        _release(holder)
        with pytest.raises(StagerLeaseLost):
            ledger.record_batch([_entry(0)], lease=held.lease)
    assert ledger.entries() == []


# ------------------------------------------------------------------------------------------- the lease row


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
    first = ledger.acquire_lease(PIPELINE, "krishiv run", 30)
    again = ledger.acquire_lease(PIPELINE, "krishiv run", 30)
    assert first.token == again.token == process_token()
    assert ledger.lease_held(again) and ledger.lease_held(first)


def test_a_lease_left_on_exit_stays_and_this_process_takes_it_again_as_a_renewal(ledger: Ledger) -> None:
    """What a continuous run does when the ledger went away: it leaves its lease (a release would wait out the
    budget), then, once the ledger answers, takes it again under the same fencing token."""
    with stager_lease(ledger, PIPELINE, "krishiv run", ttl_s=30.0) as held:
        held.leave()
    left = _live(ledger)
    assert left.token == held.lease.token == process_token()
    with stager_lease(ledger, PIPELINE, "krishiv run", ttl_s=30.0) as again:
        assert again.lease.epoch == left.epoch and not again.lost
    assert ledger.live_lease(PIPELINE) is None  # released this time


def test_a_lease_says_whether_its_process_commits_its_own_batches(ledger: Ledger) -> None:
    with stager_lease(ledger, PIPELINE, "krishiv run", committing=True) as held:
        assert held.committing
        seen = ledger.live_lease(PIPELINE)
        assert seen is not None and seen.committing
        assert "krishiv run (pid" in seen.describe() and "committing its own batches" in seen.describe()
    with stager_lease(ledger, PIPELINE, "dagster run 1a2b3c4d") as held:
        assert not held.committing
        seen = ledger.live_lease(PIPELINE)
        assert seen is not None and not seen.committing and "committing" not in seen.describe()


# ------------------------------------------------------------------------------------------- a paused stager


@pytest.mark.heavy  # two Spark runs, one in a process of its own (2-4 minutes on 2 cores); make test has the
# replay path in tests/spark_jobs/test_staging.py::test_a_replay_is_not_passed_by_a_stager_whose_lease_is_lost
def test_a_stager_paused_past_its_lease_while_another_run_took_over_ends_with_the_lease_line(
    make_spec, spec_file: Path, spark, tmp_path: Path, capsys
) -> None:
    """The issue's case: a ``krishiv run`` SIGSTOPped past its lease as it began a batch, another run takes the
    pipeline over and stages that batch and the rest, then the first is resumed. It finds the batch recorded (by the
    other run) and Spark's checkpoint logs written past it: fenced, it records nothing, and its last word is the
    lease's line, never Spark's ``CONCURRENT_STREAM_LOG_UPDATE`` (nor a batch it took for a replay of its own)."""
    import signal

    from krishiv.operations import STAGER_LEASE_TTL_ENV
    from krishiv_core.faults import FAULTS_ENV, FAULTS_SYNC_ENV
    from tests.services.processes import stop
    from tests.spark_jobs.pipeline_helpers import assert_exactly_once, produce_orders, start_krishiv, wait_for

    spec = make_spec(max_records=200)
    produce_orders(spec, 600, late=3, malformed=2)
    ledger = Ledger(spec.ledger_location())
    sync, output = tmp_path / "sync", tmp_path / "first.log"
    sync.mkdir()
    env = {STAGER_LEASE_TTL_ENV: "3", FAULTS_ENV: "stage.begin@1:pause", FAULTS_SYNC_ENV: str(sync)}
    first = start_krishiv(spec_file, "run", "--once", output=output, env=env)
    try:
        wait_for(lambda: (sync / "stage.begin@1.reached").exists(), "batch 1 was not begun", output, 240)
        _stop_outside_the_ledger(first, ledger.path)  # its renewer too; Spark's JVM, a process of its own, runs on
        (sync / "stage.begin@1.go").write_text("go")  # it would go on at once, were it not stopped
        wait_for(lambda: ledger.live_lease(PIPELINE) is None, "the paused stager's lease did not expire", output, 60)

        assert main(["--spec", str(spec_file), "run", "--once"]) == 0, capsys.readouterr().err  # takes over
        first.send_signal(signal.SIGCONT)
        code = first.wait(240)
    finally:
        first.send_signal(signal.SIGCONT)
        stop(first)
    said = output.read_text()
    failure = [line for line in said.splitlines() if line.startswith("krishiv run: ")]
    assert code == 2 and failure, said
    assert "failed: StagerLeaseLost: the stager lease of pipeline 'orders_per_minute' is no longer held" in failure[-1]
    assert "CONCURRENT_STREAM_LOG_UPDATE" not in failure[-1], said
    assert_exactly_once(spec)


def _stop_outside_the_ledger(process: subprocess.Popen, location: str) -> None:
    """SIGSTOP ``process`` at a moment its lease renewer holds no ledger transaction (a DuckDB file held by a stopped
    process would keep the run taking over waiting on the file instead of on the lease)."""
    import signal

    from outbox.errors import LedgerBusyError

    for _ in range(50):
        process.send_signal(signal.SIGSTOP)
        try:
            Ledger(location, lock_timeout_s=1.0).current_lease(PIPELINE)
            return
        except LedgerBusyError:
            process.send_signal(signal.SIGCONT)
            time.sleep(0.1)
    raise AssertionError("the stager kept the ledger locked")
