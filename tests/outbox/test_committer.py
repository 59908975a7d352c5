"""The committer beside a stager: woken per batch, it commits through the relay against real catalogs (SQLite and
PostgreSQL), rides out a catalog outage, gives up on a table that refuses and races ``krishiv commit`` safely.

Batches are staged directly, as Spark would stage them (``tests/outbox/test_relay.py``'s ``stage``), no Spark here.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog

import outbox.committer
import outbox.relay
from krishiv.broker import free_port
from krishiv_core.entries import COMMITTED, PENDING, OutboxEntry
from outbox.committer import Committer
from outbox.ledger import Ledger
from outbox.relay import SUMMARY_BATCH_ID, CommitRelay
from tests.outbox.test_relay import TABLE, stage

OTHER = "other.orders_per_minute"
WAIT_S = 30.0


def sqlite_catalog(tmp_path: Path) -> Catalog:
    return SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=tmp_path.as_uri())


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.05)


def all_committed(ledger: Ledger, entries: list[OutboxEntry]) -> Callable[[], bool]:
    return lambda: all(ledger.get(e.query_id, e.table, e.batch_id).status == COMMITTED for e in entries)


def batches_in(catalog: Catalog, table: str) -> list[int]:
    """The batch id of each snapshot of ``table``, oldest first: a batch committed twice shows twice."""
    return [int(s.summary[SUMMARY_BATCH_ID]) for s in catalog.load_table(table).snapshots()]


class Lines(list[str]):
    def said(self, fragment: str) -> Callable[[], bool]:
        return lambda: any(fragment in line for line in list(self))


@pytest.fixture
def lines() -> Lines:
    return Lines()


@pytest.fixture
def quick_outages(monkeypatch: pytest.MonkeyPatch) -> None:
    """The relay gives up on an unreachable catalog after 0.5 s (20 s in production), the committer retries after
    0.2 s: the same path, in test time."""
    monkeypatch.setattr(outbox.relay, "CATALOG_RELOAD_BUDGET_S", 0.5)
    monkeypatch.setattr(outbox.committer, "BACKOFF_START_S", 0.2)


def test_commits_what_is_pending_at_start_then_each_batch_when_woken(
    tmp_path: Path, ledger: Ledger, lines: Lines
) -> None:
    catalog = sqlite_catalog(tmp_path)
    entries = [stage(catalog, ledger, 0, 0)]  # left pending by an earlier process
    reports = []
    # A long idle time: only the first pass and the wakes can commit within the test's wait.
    committer = Committer(
        CommitRelay(ledger, lambda: sqlite_catalog(tmp_path)),
        [TABLE],
        on_report=reports.append,
        progress=lines.append,
        idle_s=600,
    )
    committer.start()
    try:
        wait_for(all_committed(ledger, entries), "the entry pending at start")
        for b in (1, 2, 3):
            entries.append(stage(catalog, ledger, b, b))
            committer.wake()
            wait_for(all_committed(ledger, entries), f"batch {b}, after a wake")
    finally:
        committer.stop()
    assert not committer.running
    assert batches_in(catalog, TABLE) == [0, 1, 2, 3], "in order, one snapshot each"
    assert [s.snapshot_id for s in catalog.load_table(TABLE).snapshots()] == [e.intended_snapshot_id for e in entries]
    assert [b for r in reports for b in r.committed] == [0, 1, 2, 3]
    assert committer.committed == 4 and committer.failures == {} and committer.error is None
    assert lines == [], "nothing went wrong, so nothing was said"


def test_the_final_pass_commits_the_last_batch(tmp_path: Path, ledger: Ledger) -> None:
    catalog = sqlite_catalog(tmp_path)
    committer = Committer(CommitRelay(ledger, lambda: sqlite_catalog(tmp_path)), [TABLE], idle_s=600)
    committer.start()
    wait_for(lambda: committer.running, "the thread")
    last = stage(catalog, ledger, 0, 0)  # staged after the first pass, never woken for: stop's pass commits it
    committer.stop()
    assert ledger.get("q1", TABLE, 0).status == COMMITTED
    assert batches_in(catalog, TABLE) == [0] and committer.committed == 1
    assert catalog.load_table(TABLE).current_snapshot().snapshot_id == last.intended_snapshot_id


def test_a_stop_without_a_final_pass_leaves_the_last_batch_pending(tmp_path: Path, ledger: Ledger) -> None:
    """``stop(0)``, as a continuous run stopping for a ledger outage does: no last pass, so the batch staged after
    the first pass stays pending for the run that starts again."""
    catalog = sqlite_catalog(tmp_path)
    first = stage(catalog, ledger, 0, 0)
    committer = Committer(CommitRelay(ledger, lambda: sqlite_catalog(tmp_path)), [TABLE], idle_s=600)
    committer.start()
    wait_for(all_committed(ledger, [first]), "the first pass")
    stage(catalog, ledger, 1, 1)  # never woken for
    committer.stop(0.0)
    wait_for(lambda: not committer.running, "the thread to end")
    assert ledger.get("q1", TABLE, 1).status != COMMITTED and committer.committed == 1
    assert batches_in(catalog, TABLE) == [0]


class TcpForwarder:
    """A port that refuses connections until :meth:`open`, then forwards them to ``upstream``: an outage of a
    catalog server (PostgreSQL here) and its end, for a client that knows the catalog by this port."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = free_port()
        self._server: socket.socket | None = None
        self._threads: list[threading.Thread] = []

    def open(self) -> None:
        server = socket.create_server(("127.0.0.1", self.port))
        self._server = server
        self._spawn(self._accept, server)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self.upstream)
            self._spawn(self._pump, client, upstream)
            self._spawn(self._pump, upstream, client)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def postgres_outage(postgres_uri: str) -> Iterator[tuple[TcpForwarder, str]]:
    """A forwarder to the test's PostgreSQL database, closed to begin with, and the catalog URI through it."""
    parts = urlsplit(postgres_uri)
    forwarder = TcpForwarder((parts.hostname or "127.0.0.1", parts.port or 5432))
    user = f"{parts.username}@" if parts.username else ""
    through = urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{forwarder.port}"))
    yield forwarder, through
    forwarder.close()


def test_a_catalog_outage_pauses_commits_and_they_resume_when_it_is_back(
    tmp_path: Path, ledger: Ledger, lines: Lines, postgres_uri: str, postgres_outage, quick_outages
) -> None:
    forwarder, through = postgres_outage
    direct = SqlCatalog("t", uri=postgres_uri, warehouse=tmp_path.as_uri())
    entries = [stage(direct, ledger, 0, 0)]
    committer = Committer(
        CommitRelay(ledger, lambda: SqlCatalog("t", uri=through, warehouse=tmp_path.as_uri()), "pg-through"),
        [TABLE],
        progress=lines.append,
    )
    committer.start()
    try:
        wait_for(lines.said("commits paused"), "the outage to be said")
        entries.append(stage(direct, ledger, 1, 1))  # staging goes on meanwhile
        committer.wake()
        assert committer.running and committer.error is None and committer.failures == {}
        assert ledger.get("q1", TABLE, 0).status == PENDING and direct.load_table(TABLE).current_snapshot() is None
        forwarder.open()
        wait_for(all_committed(ledger, entries), "the commits once the catalog is back")
        wait_for(lines.said("commits resumed"), "the resumption to be said")
    finally:
        committer.stop()
    assert batches_in(direct, TABLE) == [0, 1]
    paused = [line for line in lines if "commits paused" in line]
    assert len(paused) == 1, f"one line per outage, not one per retry: {lines}"
    assert "pg-through" in paused[0], "the line names the catalog"


def test_a_table_that_refuses_stops_while_the_others_go_on(tmp_path: Path, ledger: Ledger, lines: Lines) -> None:
    catalog = sqlite_catalog(tmp_path)
    broken = stage(catalog, ledger, 0, 0)
    Path(broken.files[0].path.removeprefix("file://")).unlink()  # committing it would lose its rows
    others = [stage(catalog, ledger, 0, 0, namespace="other", query_id="q2")]  # another pipeline's table
    committer = Committer(
        CommitRelay(ledger, lambda: sqlite_catalog(tmp_path)), [TABLE, OTHER], progress=lines.append, idle_s=600
    )
    committer.start()
    try:
        wait_for(all_committed(ledger, others), "the other table's batch")
        wait_for(lambda: TABLE in committer.failures, "the refusal")
        later = [stage(catalog, ledger, 1, 1), stage(catalog, ledger, 1, 1, namespace="other", query_id="q2")]
        others.append(later[1])
        committer.wake()
        wait_for(all_committed(ledger, others), "the other table's next batch")
    finally:
        committer.stop()
    pointer = "(see docs/operations.md: Recovery runbook > A staged file that is gone)"
    assert "missing" in committer.failures[TABLE] and committer.failures[TABLE].endswith(pointer)
    assert [line for line in lines if TABLE in line] == [
        f"commits of {TABLE} stopped: {committer.failures[TABLE].removesuffix(' ' + pointer)}; its batches are still "
        f"staged and stay pending {pointer}"
    ]
    assert [ledger.get("q1", TABLE, b).status for b in (0, 1)] == [PENDING, PENDING]
    assert catalog.load_table(TABLE).current_snapshot() is None
    assert batches_in(catalog, OTHER) == [0, 1]
    assert committer.error is None


class BreaksOnMarking(Ledger):
    """A ledger whose update after a commit fails with an error nobody planned for."""

    def mark_committed(self, *args: object, **kwargs: object) -> None:
        raise ValueError("a bug")


def test_an_unexpected_error_is_said_and_stops_the_committer(tmp_path: Path, ledger: Ledger, lines: Lines) -> None:
    catalog = sqlite_catalog(tmp_path)
    stage(catalog, ledger, 0, 0)
    committer = Committer(
        CommitRelay(BreaksOnMarking(ledger.path), lambda: sqlite_catalog(tmp_path)), [TABLE], progress=lines.append
    )
    committer.start()
    wait_for(lambda: not committer.running, "the committer to stop")
    committer.stop()
    assert committer.error == "ValueError: a bug"
    assert lines == ["commits stopped: ValueError: a bug; pending entries stay pending for krishiv commit"]
    assert ledger.get("q1", TABLE, 0).status == PENDING, "the table has it: the next relay finds it and marks it"
    assert CommitRelay(ledger, catalog).commit_table(TABLE).recovered == [0]


def test_krishiv_commit_racing_the_committer_commits_no_batch_twice(
    tmp_path: Path, ledger: Ledger, lines: Lines, postgres_uri: str
) -> None:
    def pg() -> Catalog:
        return SqlCatalog("t", uri=postgres_uri, warehouse=tmp_path.as_uri())

    catalog = pg()
    committer = Committer(CommitRelay(ledger, pg), [TABLE], progress=lines.append, idle_s=0.05)
    stop = threading.Event()
    rival_errors: list[BaseException] = []
    rival_committed: list[int] = []

    def krishiv_commit() -> None:  # another process's relay: its own ledger object and catalog
        relay = CommitRelay(Ledger(ledger.path), pg)
        while not stop.is_set():
            try:
                rival_committed.extend(relay.commit_table(TABLE).committed)
            except BaseException as exc:  # reported by the test
                rival_errors.append(exc)
                return

    rival = threading.Thread(target=krishiv_commit, daemon=True)
    entries: list[OutboxEntry] = []
    committer.start()
    rival.start()
    try:
        for b in range(8):
            entries.append(stage(catalog, ledger, b, b))
            committer.wake()
        wait_for(all_committed(ledger, entries), "every batch")
    finally:
        stop.set()
        rival.join(WAIT_S)
        committer.stop()
    assert rival_errors == [] and committer.error is None and committer.failures == {}
    assert batches_in(catalog, TABLE) == list(range(8)), "one snapshot per batch, in order, whoever committed it"
    mine = [b for r in committer.reports for b in r.committed]
    assert sorted(mine + rival_committed) == list(range(8)), "each batch committed by exactly one of the two"
    assert catalog.load_table(TABLE).scan().to_arrow().num_rows == 8


def test_the_committer_compacts_the_ledger_on_its_schedule(tmp_path: Path, ledger: Ledger) -> None:
    """A long continuous run never calls krishiv commit: its committer folds committed entries past the retention
    into the archive itself, once due (and not again before the hourly schedule says so)."""
    catalog = sqlite_catalog(tmp_path)
    for b in range(4):
        stage(catalog, ledger, b, b)
    committer = Committer(CommitRelay(ledger, lambda: sqlite_catalog(tmp_path)), [TABLE], ledger_retention_s=0.0)
    committer.start()
    try:
        wait_for(lambda: bool(committer.compactions), "the ledger's compaction")
        stage(catalog, ledger, 4, 4)
        committer.wake()
        wait_for(lambda: ledger.table_summary(TABLE).committed == 5, "the next batch")
    finally:
        committer.stop()
    assert len(committer.compactions) == 1, "hourly at most"
    assert committer.compactions[0].entries_archived == 3, "the newest entry of the query stays"
    summary = ledger.table_summary(TABLE)
    assert (summary.committed, summary.archived) == (5, 3), "archived entries still count"
    assert [e.batch_id for e in ledger.entries(TABLE)] == [3, 4]
    assert batches_in(catalog, TABLE) == [0, 1, 2, 3, 4]
