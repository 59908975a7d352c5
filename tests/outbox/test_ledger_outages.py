"""The ledger on a PostgreSQL server that dies, stalls and comes back: PROTOCOL invariant 18 under real faults.

Every case runs real :class:`Ledger` objects against a private server of the session's
(:mod:`tests.services.ledger_postgres`) that the tests SIGKILL, SIGSTOP and start again on the same data folder. The
steps are placed exactly by a TCP front between the ledger and the server (:class:`LedgerFront`): it kills or pauses
the server when the ledger sends a given statement, and cuts a transaction's connection at its ``COMMIT``, before
the server sees it or after the server answered it. Why a front: "the connection was lost during COMMIT" is a race
between the server committing and the client reading the answer; a fault point in the client can only stop before
sending the COMMIT, and ``pg_terminate_backend`` lands before or after the commit by chance. The front forwards the
COMMIT, waits for the server's ``COMMIT`` answer and drops it, so both outcomes of the unknown are tested on purpose.

What each fault must leave (docs/operations.md, "A ledger that is locked or damaged"):

* killed inside a write: :class:`LedgerUnavailable` with ``written=False``; after the restart nothing of the batch is
  there, and recording it again records it once;
* lost at the COMMIT: ``written=None``; the replay of the batch and the next relay settle it either way, with one
  entry per table, the intended snapshot id of the attempt that was recorded, and one snapshot per batch;
* paused: a call completes once the server resumes within the call's budget, or fails after the budget, never
  later (connecting, or waiting for a statement's answer);
* a writer stopped inside its transaction: other writers are told who holds the lock, until the server ends the
  stopped session (``idle_in_transaction_session_timeout``) and the lock with it.

``krishiv status``, ``verify`` and ``commit`` on a server that is down or paused say so in one line. The end-to-end
case (heavy: Spark starts twice) runs a continuous ``krishiv run`` against the server through a kill and a pause.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

import psutil
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from chaos.workspace import EVENTS_SPEC_TEMPLATE, SPEC_TEMPLATE
from krishiv.broker import LocalBroker
from krishiv.cli import main
from krishiv.produce import OrderEvent, demo_orders, ensure_topic, produce
from krishiv.verify import check_ledger_agreement
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.entries import COMMITTED, PENDING, OutboxEntry
from krishiv_core.spec import KrishivSpec, load_spec
from outbox.errors import LedgerBusyError, LedgerUnavailable
from outbox.ledger import Ledger
from outbox.ledger import postgres as ledger_postgres_module
from outbox.relay import CommitRelay
from spark_jobs.kafka_source import latest_offsets
from tests.outbox.test_ledger import REJECTS, TABLE, _entry
from tests.outbox.test_relay import TABLE as RELAY_TABLE
from tests.outbox.test_relay import stage
from tests.services.ledger_postgres import COMMIT_QUERY, LedgerFront, LedgerServer, wait_until
from tests.services.processes import stop
from tests.spark_jobs.pipeline_helpers import krishiv_cli, start_krishiv, wait_for

ROOT = Path(__file__).resolve().parents[2]
#: The budget of the ledgers under test (``lock_timeout_s``): the most a call may wait for the server.
BUDGET_S = 3.0
#: How far past its budget a failing call may end: a connection attempt waits at least libpq's 2 s, and a loaded
#: machine schedules late. A call that waited for the server's return instead would end far later.
SLACK_S = 3.0
#: How long the tests keep the server paused while calls wait on it.
PAUSE_S = 4.0
#: The budget of a call that must ride a pause or a restart out.
PATIENT_S = 30.0
#: The idle-in-transaction timeout the stopped writer's process gives its sessions (the default is 60 s).
IDLE_S = 4.0
CHILD_TIMEOUT_S = 60.0
#: Statements of the ledger's transactions, as the front sees them go by.
ENTRY_INSERT = b"INSERT INTO outbox ("
OFFSETS_INSERT = b"INSERT INTO outbox_offsets"
MARK_UPDATE = b"UPDATE outbox SET status"
PENDING_READ = b"SELECT query_id, table_name, batch_id, created_at FROM outbox"
LEDGER_LOOKUP = b"FROM information_schema.tables"

T = TypeVar("T")


class Background(Generic[T]):
    """A call in a thread of its own: its result or its exception, and how long it took."""

    def __init__(self, call: Callable[[], T]) -> None:
        self._call = call
        self._result: T | None = None
        self._error: BaseException | None = None
        self.started = time.monotonic()
        self.ended: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._call()
        except BaseException as exc:
            self._error = exc
        finally:
            self.ended = time.monotonic()

    @property
    def done(self) -> bool:
        return self.ended is not None

    @property
    def elapsed(self) -> float:
        assert self.ended is not None, "the call has not returned"
        return self.ended - self.started

    def result(self, timeout_s: float) -> T:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"the call did not return within {timeout_s:.0f}s"
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


def _batch(batch_id: int, snapshot_ids: tuple[int, int] = (111, 222)) -> list[OutboxEntry]:
    """One batch of a fan-out pipeline: its table's entry and its rejects' entry, recorded in one transaction."""
    return [
        _entry("q1", batch_id, TABLE, intended_snapshot_id=snapshot_ids[0]),
        _entry("q1", batch_id, REJECTS, intended_snapshot_id=snapshot_ids[1]),
    ]


def _stored(ledger: Ledger) -> list[tuple[str, int, int]]:
    """The ledger's entries as (table, batch, intended snapshot id), sorted."""
    return _keys(ledger.entries())


def _keys(entries: list[OutboxEntry]) -> list[tuple[str, int, int]]:
    return sorted((e.table, e.batch_id, e.intended_snapshot_id) for e in entries)


def _offset_rows(server: LedgerServer, batch_id: int) -> int:
    with server.server.connect() as conn:
        row = conn.execute(
            f'SELECT count(*) FROM "{server.schema}".outbox_offsets WHERE batch_id = %s', (batch_id,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _fails_within_budget(call: Callable[[], object], budget_s: float) -> LedgerUnavailable:
    """``call`` raises :class:`LedgerUnavailable` after waiting its budget, and not much longer."""
    started = time.monotonic()
    with pytest.raises(LedgerUnavailable) as failed:
        call()
    waited = time.monotonic() - started
    assert budget_s - 0.1 <= waited < budget_s + SLACK_S, f"gave up after {waited:.1f}s, budget {budget_s}s"
    return failed.value


# ------------------------------------------------------------------------------------------------ killed


def test_a_server_killed_inside_record_batch_writes_nothing_and_the_replay_records_it_once(
    ledger_server: LedgerServer, ledger_front: LedgerFront
) -> None:
    server = ledger_server.server
    ledger = Ledger(ledger_server.uri_through(ledger_front), lock_timeout_s=BUDGET_S)
    assert ledger.record_batch(_batch(0)) == [True, True]

    # Batch 1's first entry and its offsets are written inside the transaction; the server dies as the second
    # entry's offsets go out.
    killed = ledger_front.when_sent(OFFSETS_INSERT, server.kill, occurrence=2)
    with pytest.raises(LedgerUnavailable) as lost:
        ledger.record_batch(_batch(1, (333, 444)))
    assert killed.wait(CHILD_TIMEOUT_S) and server.postmaster() is None
    assert lost.value.written is False
    assert f"ledger {ledger.path} did not answer" in str(lost.value) and "nothing was written" in str(lost.value)

    # While it is down, a read waits for its budget (connections refused are retried), then says so.
    down = Ledger(ledger_server.uri, lock_timeout_s=BUDGET_S)
    assert _fails_within_budget(down.entries, BUDGET_S).written is False

    server.restart()
    after = Ledger(ledger_server.uri, lock_timeout_s=BUDGET_S)
    assert _stored(after) == _keys(_batch(0)), "batch 0, answered before the kill, is kept; nothing of batch 1"
    assert _offset_rows(ledger_server, 1) == 0
    assert ledger.record_batch(_batch(1, (555, 666))) == [True, True], "the same Ledger goes on after the restart"
    assert ledger.record_batch(_batch(1, (777, 888))) == [False, False]
    assert _stored(after) == _keys(_batch(0) + _batch(1, (555, 666)))
    assert _offset_rows(ledger_server, 1) == 4, "two partitions per entry, once"


def test_a_write_waiting_for_a_killed_server_goes_through_once_it_is_back(ledger_server: LedgerServer) -> None:
    server = ledger_server.server
    ledger = Ledger(ledger_server.uri, lock_timeout_s=PATIENT_S)
    ledger.migrate()
    server.kill()
    write = Background(lambda: ledger.record_batch(_batch(0)))
    # Down for a second (a time the test sets): the write keeps trying to connect meanwhile.
    wait_until(lambda: time.monotonic() - write.started >= 1.0 or write.done, "a second passed", 5)
    assert not write.done
    server.restart()
    assert write.result(PATIENT_S) == [True, True]
    assert write.elapsed < PATIENT_S
    assert _stored(Ledger(ledger_server.uri)) == _keys(_batch(0))


# ------------------------------------------------------------------------------------------------ lost at COMMIT


@pytest.mark.parametrize("answered", [False, True], ids=["commit-never-arrived", "commit-answer-lost"])
def test_a_record_batch_lost_at_its_commit_is_settled_by_the_replay(
    ledger_server: LedgerServer, ledger_front: LedgerFront, answered: bool
) -> None:
    ledger = Ledger(ledger_server.uri_through(ledger_front), lock_timeout_s=BUDGET_S)
    ledger.migrate()
    ledger_front.cut_commit(ENTRY_INSERT, answered=answered)
    first = _batch(0, (111, 222))
    with pytest.raises(LedgerUnavailable) as lost:
        ledger.record_batch(first)
    assert ledger_front.cut_done.wait(5) and ledger_front.cut_at == ("after" if answered else "before")
    assert lost.value.written is None, "the client cannot know whether the server committed"
    assert "the write may or may not have been made" in str(lost.value)

    # The stager that lost the answer stops; Spark replays the batch with intended snapshot ids of its own.
    replay = _batch(0, (333, 444))
    assert ledger.record_batch(replay) == [not answered, not answered]
    recorded = first if answered else replay
    direct = Ledger(ledger_server.uri, lock_timeout_s=BUDGET_S)
    assert _stored(direct) == _keys(recorded), "one entry per table, with the recorded attempt's snapshot id"
    assert ledger.record_batch(_batch(0, (555, 666))) == [False, False]
    assert _stored(direct) == _keys(recorded)
    assert _offset_rows(ledger_server, 0) == 4


@pytest.mark.parametrize("answered", [False, True], ids=["commit-never-arrived", "commit-answer-lost"])
def test_a_mark_lost_at_its_commit_is_settled_by_the_next_relay_without_a_second_snapshot(
    ledger_server: LedgerServer, ledger_front: LedgerFront, tmp_path: Path, answered: bool
) -> None:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=tmp_path.as_uri())
    ledger = Ledger(ledger_server.uri, lock_timeout_s=BUDGET_S)
    entries = [stage(catalog, ledger, 0, 0)]
    assert CommitRelay(ledger, catalog).commit_table(RELAY_TABLE).committed == [0]
    entries += [stage(catalog, ledger, b, b) for b in (1, 2)]

    # The relay commits batch 1 to the table; the connection of its ledger mark is cut at the COMMIT.
    ledger_front.cut_commit(MARK_UPDATE, answered=answered)
    cut = Ledger(ledger_server.uri_through(ledger_front), lock_timeout_s=BUDGET_S)
    with pytest.raises(LedgerUnavailable) as lost:
        CommitRelay(cut, catalog).commit_table(RELAY_TABLE)
    assert ledger_front.cut_done.wait(5) and ledger_front.cut_at == ("after" if answered else "before")
    assert lost.value.written is None
    table = catalog.load_table(RELAY_TABLE)
    assert [s.snapshot_id for s in table.snapshots()] == [e.intended_snapshot_id for e in entries[:2]], (
        "batch 1 is in the table; the relay stopped before batch 2"
    )
    assert ledger.get("q1", RELAY_TABLE, 1).status == (COMMITTED if answered else PENDING)  # type: ignore[union-attr]

    report = CommitRelay(ledger, catalog).commit_table(RELAY_TABLE)
    assert (report.recovered, report.committed) == ([] if answered else [1], [2])
    table = catalog.load_table(RELAY_TABLE)
    ids = [s.snapshot_id for s in table.snapshots()]
    assert ids == [e.intended_snapshot_id for e in entries], "one snapshot per batch, batch 1 not twice"
    assert [s.parent_snapshot_id for s in table.snapshots()] == [None, *ids[:-1]]
    assert table.scan().to_arrow().num_rows == 3
    stored = ledger.entries(table=RELAY_TABLE)
    assert [(e.status, e.committed_snapshot_id) for e in stored] == [(COMMITTED, i) for i in ids]
    assert check_ledger_agreement(table, RELAY_TABLE, ledger) == []
    assert CommitRelay(ledger, catalog).commit_table(RELAY_TABLE).committed == [], "a third run commits nothing"


# ------------------------------------------------------------------------------------------------ paused


def test_calls_to_a_paused_server_complete_once_it_resumes_within_their_budget(ledger_server: LedgerServer) -> None:
    server = ledger_server.server
    ledger = Ledger(ledger_server.uri, lock_timeout_s=PATIENT_S)
    ledger.migrate()
    server.pause()
    paused_at = time.monotonic()
    write = Background(lambda: ledger.record_batch(_batch(0)))
    read = Background(lambda: Ledger(ledger_server.uri, lock_timeout_s=PATIENT_S).pending_batches())
    # The pause lasts PAUSE_S (a time the test sets); neither call comes back meanwhile.
    wait_until(lambda: time.monotonic() - paused_at >= PAUSE_S or write.done or read.done, "the pause ended", 30)
    assert not write.done and not read.done
    server.resume()
    assert write.result(PATIENT_S) == [True, True]
    assert len(read.result(PATIENT_S)) in (0, 2), "the read saw the ledger before or after the write, whole"
    assert PAUSE_S - 0.1 <= write.elapsed < PATIENT_S and PAUSE_S - 0.1 <= read.elapsed < PATIENT_S
    assert _stored(ledger) == _keys(_batch(0))


def test_a_server_paused_past_the_budget_fails_calls_after_the_budget(ledger_server: LedgerServer) -> None:
    server = ledger_server.server
    ledger = Ledger(ledger_server.uri, lock_timeout_s=BUDGET_S)
    ledger.migrate()
    server.pause()
    try:
        write = _fails_within_budget(lambda: ledger.record_batch(_batch(0)), BUDGET_S)
        assert write.written is False and "nothing was written" in str(write)
        assert _fails_within_budget(ledger.entries, BUDGET_S).written is False
        assert _fails_within_budget(Ledger(ledger_server.uri, lock_timeout_s=BUDGET_S).entries, BUDGET_S)
    finally:
        server.resume()
    assert ledger.entries() == []
    assert ledger.record_batch(_batch(0)) == [True, True]


def test_statements_the_paused_server_does_not_answer_fail_after_the_budget(
    ledger_server: LedgerServer, ledger_front: LedgerFront
) -> None:
    """Paused with a statement in flight: TCP still acknowledges (the kernel answers for the stopped server), so no
    keepalive or TCP timeout notices; the ledger's own bound on each wait does."""
    server = ledger_server.server
    ledger = Ledger(ledger_server.uri_through(ledger_front), lock_timeout_s=BUDGET_S)
    ledger.migrate()

    paused = ledger_front.when_sent(OFFSETS_INSERT, server.pause)
    try:
        write = _fails_within_budget(lambda: ledger.record_batch(_batch(0)), BUDGET_S)
    finally:
        assert paused.wait(5)
        server.resume()
    assert write.written is False and f"did not answer (for {BUDGET_S:.1f}s, with a statement in flight)" in str(write)

    paused = ledger_front.when_sent(PENDING_READ, server.pause)
    try:
        assert _fails_within_budget(ledger.pending_batches, BUDGET_S).written is False
    finally:
        assert paused.wait(5)
        server.resume()

    # A new Ledger's first look (is the ledger there?) likewise.
    paused = ledger_front.when_sent(LEDGER_LOOKUP, server.pause)
    try:
        fresh = Ledger(ledger_server.uri_through(ledger_front), lock_timeout_s=BUDGET_S)
        assert _fails_within_budget(fresh.entries, BUDGET_S).written is False
    finally:
        assert paused.wait(5)
        server.resume()

    # The abandoned transaction was rolled back, its lock released: the batch is recorded once, now.
    assert ledger.entries() == []
    assert ledger.record_batch(_batch(0)) == [True, True]
    assert _offset_rows(ledger_server, 0) == 4


# ------------------------------------------------------------------------------------------------ a stopped writer

_STOPPED_WRITER = textwrap.dedent(
    """
    import json, sys

    from outbox.ledger import postgres

    postgres.IDLE_IN_TRANSACTION_TIMEOUT_S = float(sys.argv[2])

    from outbox.errors import LedgerUnavailable
    from outbox.ledger import Ledger
    from tests.outbox.test_ledger import _entry

    try:
        outcome = {"recorded": Ledger(sys.argv[1], lock_timeout_s=10).record_batch([_entry("q-stopped", 7)])}
    except LedgerUnavailable as exc:
        outcome = {"error": type(exc).__name__, "written": exc.written, "message": str(exc)}
    print(json.dumps(outcome))
    """
)


@pytest.mark.parametrize(
    "before_commit",
    [False, True],
    ids=["stopped-waiting-for-an-answer", "stopped-before-sending-its-commit"],
)
def test_a_writer_stopped_inside_its_transaction_holds_the_lock_until_the_server_ends_its_session(
    ledger_server: LedgerServer, ledger_front: LedgerFront, before_commit: bool
) -> None:
    """A writer's process stopped inside its transaction: the server ends the idle session after
    ``idle_in_transaction_session_timeout`` (the writer's process sets it to :data:`IDLE_S` through the module's
    constant) and the lock goes with it. Woken, the writer is told its write failed: stopped waiting for an answer it
    finds the connection closed (``written=None``); stopped before its COMMIT left (the front drops it, as if never
    sent) it gets the server's own answer, the idle-session timeout (``written=False``)."""
    assert ledger_postgres_module.IDLE_IN_TRANSACTION_TIMEOUT_S == 60, "docs/operations.md says 60 s"
    server = ledger_server.server
    Ledger(ledger_server.uri).migrate()
    holder = "krishiv-stopped"
    children: list[subprocess.Popen[str]] = []

    def stop_writer() -> None:
        children[0].send_signal(signal.SIGSTOP)

    if before_commit:
        stopped = ledger_front.when_sent(COMMIT_QUERY, stop_writer, after=OFFSETS_INSERT, forward=False)
    else:  # as it sends its offsets: its entry is written, its transaction open
        stopped = ledger_front.when_sent(OFFSETS_INSERT, stop_writer)
    uri = ledger_server.uri_through(ledger_front, application_name=holder)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KRISHIV_")}
    children.append(
        subprocess.Popen(
            [sys.executable, "-c", _STOPPED_WRITER, uri, str(IDLE_S)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
    )
    child = children[0]
    try:
        assert stopped.wait(CHILD_TIMEOUT_S), "the writer never got inside its transaction"
        stopped_at = time.monotonic()
        process = psutil.Process(child.pid)
        wait_until(lambda: process.status() == psutil.STATUS_STOPPED, "the writer did not stop", 10)
        (pid,) = server.backend_pids(holder)
        wait_until(lambda: server.backend_state(pid) == "idle in transaction", "the entry was not written", 10)

        other = Ledger(ledger_server.uri, lock_timeout_s=1.0)
        with pytest.raises(LedgerBusyError) as busy:
            other.record_batch(_batch(0))
        assert not isinstance(busy.value, LedgerUnavailable), "the server answers: the lock is held"
        said = " ".join(str(busy.value).split())
        assert f"Held by server process {pid} ({holder} from 127.0.0.1, idle in transaction)." in said
        assert "nothing was written" in said

        patient = Ledger(ledger_server.uri, lock_timeout_s=IDLE_S + PATIENT_S)
        assert patient.record_batch(_batch(0)) == [True, True]
        freed_after = time.monotonic() - stopped_at
        # The server's clock starts when the session goes idle, a moment before or after the stop is seen here.
        assert IDLE_S - 0.5 <= freed_after < IDLE_S + SLACK_S, f"the lock was freed after {freed_after:.1f}s"
        assert server.backend_pids(holder) == [], "the server ended the stopped writer's session"
    finally:
        child.send_signal(signal.SIGCONT)
        out, err = child.communicate(timeout=CHILD_TIMEOUT_S)
    outcome = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"stderr": err}
    assert outcome.get("error") == "LedgerUnavailable", outcome
    if before_commit:
        assert outcome["written"] is False and "idle-in-transaction timeout" in outcome["message"], outcome
    else:
        assert outcome["written"] is None and "server closed the connection" in outcome["message"], outcome
    assert _stored(patient) == _keys(_batch(0)), "nothing of the stopped writer's batch"


# ------------------------------------------------------------------------------------------------ the commands


@pytest.mark.parametrize("fault", ["killed", "paused"])
def test_commands_on_a_ledger_server_that_does_not_answer_say_so_in_one_line(
    broker: LocalBroker,
    topic: str,
    tmp_path: Path,
    ledger_server: LedgerServer,
    fault: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec_file = tmp_path / "krishiv.toml"
    text = SPEC_TEMPLATE.format(
        bootstrap=broker.bootstrap,
        partitions=2,
        catalog_uri="sqlite:///catalog.db",
        warehouse="warehouse",
        topic=topic,
        max_records=100,
    )
    spec_file.write_text(text.replace('ledger_path = "ledger.duckdb"', f'ledger_path = "{ledger_server.uri}"'))
    Ledger(ledger_server.uri).record_batch(_batch(0))
    monkeypatch.setenv("KRISHIV_LEDGER_LOCK_TIMEOUT_S", "1")
    server = ledger_server.server
    if fault == "killed":
        server.kill()
    else:
        server.pause()
    for command in ("status", "verify", "commit"):
        started = time.monotonic()
        assert main(["--spec", str(spec_file), command]) == 2, command
        waited = time.monotonic() - started
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        said = " ".join(err.split())
        assert lines and lines[0].startswith(f"krishiv {command}: ledger postgresql://"), err
        assert f"schema={ledger_server.schema} did not answer (for " in said and "nothing was written" in said, err
        assert "Traceback" not in err and waited < 1 + SLACK_S, (command, waited, err)


# ------------------------------------------------------------------------------------------------ end to end

RUN_TIMEOUT_S = 240.0  # a bound, not a target: Spark starts in a process of its own on a loaded 2-core machine
#: How long the server stays paused under the running query: well inside the ledger's 30 s budget.
RUN_PAUSE_S = 8.0
WAVE_MS = 1_767_225_600_000


def _all_committed(spec: KrishivSpec, ledger: Ledger) -> bool:
    """Every table of the pipeline committed its topic up to the latest offsets, nothing pending (False while the
    ledger does not answer)."""
    pipeline = spec.pipeline()
    tables = [qualified(spec, t) for t in pipeline.all_tables]
    latest = latest_offsets(spec.kafka.bootstrap_servers, pipeline.topic)
    try:
        return all(ledger.end_offsets(t, pipeline.topic, status=COMMITTED) == latest for t in tables) and not (
            ledger.pending_batches(tables)
        )
    except LedgerBusyError:
        return False


@pytest.mark.heavy
def test_a_continuous_run_keeps_every_event_once_through_a_killed_and_a_paused_ledger_server(
    broker: LocalBroker, topic: str, tmp_path: Path, ledger_server: LedgerServer, ledger_front: LedgerFront
) -> None:
    """``krishiv run`` with its ledger on the private server (through the front, which places each fault on the
    stager's write of a batch). Killed while the stager records a batch: that write cannot be finished and the query
    stops; the run says so in one line and waits for the ledger (the server stays down until it has said so), then
    starts its query again, whose replay records the batch. Paused for seconds under the next batch's write: the run
    waits and goes on. The oracle is the events the test produced: each valid one once in the table, each malformed
    one a reject."""
    server = ledger_server.server
    spec_file = tmp_path / "krishiv.toml"
    text = EVENTS_SPEC_TEMPLATE.format(
        bootstrap=broker.bootstrap,
        partitions=2,
        catalog_uri="sqlite:///catalog.db",
        warehouse="warehouse",
        topic=topic,
        max_records=150,
    )
    location = ledger_server.uri_through(ledger_front)
    spec_file.write_text(text.replace('ledger_path = "ledger.duckdb"', f'ledger_path = "{location}"'))
    spec = load_spec(spec_file, env={})
    pipeline = spec.pipeline()
    watcher = Ledger(ledger_server.uri, lock_timeout_s=2.0)  # the test's own look, past the front
    produced: list[OrderEvent] = []

    def produce_wave(seed: int, records: int = 300) -> None:
        partitions = ensure_topic(spec.kafka.bootstrap_servers, pipeline.topic, spec.kafka.partitions)
        events = demo_orders(
            records, seed=seed, partitions=partitions, malformed=3, start_ms=WAVE_MS + seed * 3_600_000
        )
        produce(spec.kafka.bootstrap_servers, pipeline.topic, events)
        produced.extend(events)

    log = tmp_path / "run.log"

    def wait(condition: Callable[[], object], what: str) -> None:
        wait_for(condition, what, log, RUN_TIMEOUT_S)

    produce_wave(1)
    run = start_krishiv(spec_file, "run", output=log)
    try:
        wait(lambda: _all_committed(spec, watcher), "the first wave was not committed")

        # Killed as the stager writes the next batch's entries; started again once the run waits for it.
        killed = ledger_front.when_sent(ENTRY_INSERT, server.kill)
        produce_wave(2)
        wait(killed.is_set, "the stager did not write the second wave's batch")
        wait(lambda: "waiting for the ledger up to" in log.read_text(), "the run did not say it waits for the ledger")
        down_at = time.monotonic()  # kept down for RUN_PAUSE_S while the run waits
        wait(lambda: time.monotonic() - down_at >= RUN_PAUSE_S or run.poll() is not None, "down")
        assert run.poll() is None, log.read_text()
        server.restart()
        wait(lambda: _all_committed(spec, watcher), "the replayed batch was not committed")

        # Paused as the stager writes the third wave's first batch, for RUN_PAUSE_S (a time the test sets).
        paused = ledger_front.when_sent(ENTRY_INSERT, server.pause)
        produce_wave(3)
        wait(paused.is_set, "the stager did not write the third wave's batch")
        paused_at = time.monotonic()
        wait(lambda: time.monotonic() - paused_at >= RUN_PAUSE_S or run.poll() is not None, "paused")
        assert run.poll() is None, log.read_text()
        server.resume()
        wait(lambda: _all_committed(spec, watcher), "the third wave was not committed")
        assert run.poll() is None, log.read_text()
        run.send_signal(signal.SIGTERM)
        code = run.wait(RUN_TIMEOUT_S)
    finally:
        server.resume()
        if server.postmaster() is None:
            server.restart()
        stop(run)
    said = log.read_text()
    assert code == 0 and "Traceback" not in said, said
    waiting = [line for line in said.splitlines() if "waiting for the ledger up to" in line]
    assert len(waiting) == 1, said
    assert "LedgerUnavailable: ledger postgresql://" in waiting[0] and ledger_server.schema in waiting[0], said
    assert "did not answer" in waiting[0] and "nothing was written" in waiting[0], said
    (back,) = [line for line in said.splitlines() if line.startswith("the ledger is back after ")]
    assert int(back.split()[5].rstrip("s;")) >= RUN_PAUSE_S - 1, back

    verified = krishiv_cli(spec_file, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr

    catalog = load_catalog(spec)
    rows = catalog.load_table(qualified(spec, pipeline.table)).scan().to_arrow()
    valid = [json.loads(e.value)["order_id"] for e in produced if e.kind == "valid" and e.value is not None]
    assert len(valid) == 891 and len(set(valid)) == len(valid)
    assert sorted(rows.column("order_id").to_pylist()) == sorted(valid), "every valid event once"
    rejects = catalog.load_table(qualified(spec, pipeline.rejects_table)).scan().to_arrow()
    assert rejects.num_rows == sum(e.kind == "malformed" for e in produced) == 9
    assert sorted(rejects.column("value").to_pylist()) == sorted(e.value for e in produced if e.kind == "malformed")
