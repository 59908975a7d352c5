"""A continuous run waits out a ledger outage (:mod:`krishiv.ledger_outage`), on the private PostgreSQL server the
tests kill and start again (:mod:`tests.services.ledger_postgres`).

The run itself is a stand-in here (a callable that fails as a run's query does, then runs); the heavy case in
``tests/outbox/test_ledger_outages.py`` drives a real ``krishiv run`` through the same outage.
"""

from __future__ import annotations

import threading
import time

import pytest

from krishiv.ledger_outage import LEDGER_OUTAGE_ENV, LedgerOutage, run_through_ledger_outages, wait_for_ledger
from krishiv_core.errors import KrishivError
from outbox.errors import LedgerBusyError, LedgerUnavailable, ledger_outage
from outbox.ledger import Ledger
from tests.services.ledger_postgres import LedgerServer

#: How long the tests keep the server down while the run waits.
DOWN_S = 4.0


def _outage(uri: str) -> LedgerUnavailable:
    """The error a ledger call raises while the server is down (it must be)."""
    with pytest.raises(LedgerUnavailable) as raised:
        Ledger(uri, lock_timeout_s=0.5).last_commit_seq()
    return raised.value


def _back_after(ledger_server: LedgerServer, seconds: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), ledger_server.server.restart()), daemon=True)
    thread.start()
    return thread


def test_what_counts_as_an_outage(tmp_path) -> None:
    assert ledger_outage(LedgerUnavailable("postgresql://db/x", "connection refused", written=False))
    assert ledger_outage(LedgerUnavailable("postgresql://db/x", "lost during COMMIT", written=None))
    assert ledger_outage(LedgerBusyError(str(tmp_path / "ledger.duckdb"), 30.0, "DuckDB said: locked"))
    # The server answered: no waiting helps.
    assert not ledger_outage(LedgerUnavailable("postgresql://db/x", "password authentication failed", False, True))
    assert not ledger_outage(KrishivError("query failed: a schema conflict"))
    assert not ledger_outage(None)


def test_the_run_starts_again_once_the_killed_server_is_back(ledger_server: LedgerServer) -> None:
    uri = ledger_server.uri
    Ledger(uri).migrate()
    ledger_server.server.kill()
    outage = _outage(uri)
    back = _back_after(ledger_server, DOWN_S)
    said: list[str] = []
    calls: list[float] = []

    def run() -> str:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise LedgerOutage(f"query orders failed: LedgerUnavailable: {outage}")
        return "ran"

    assert run_through_ledger_outages(uri, run, said.append, bound_s=60) == "ran"
    back.join()
    assert len(calls) == 2 and calls[1] - calls[0] >= DOWN_S - 1  # not before the server was back
    assert len(said) == 2, said
    assert said[0].startswith("query orders failed: LedgerUnavailable: ledger postgresql://")
    assert f"waiting for the ledger up to 60s ({LEDGER_OUTAGE_ENV})" in said[0]
    assert said[0].index("waiting") < said[0].index("docs/operations.md")  # the way out stays last
    assert said[1].startswith("the ledger is back after ") and "starting the queries again" in said[1]


def test_a_ledger_still_away_while_the_run_starts_again_is_the_same_outage(ledger_server: LedgerServer) -> None:
    """The restart's first ledger call (its lease) meets the server down again: waited out as well."""
    uri = ledger_server.uri
    Ledger(uri).migrate()
    said: list[str] = []
    calls = 0

    def run() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            ledger_server.server.kill()
            outage = _outage(uri)
            ledger_server.server.restart()
            raise LedgerOutage(f"query orders failed: {outage}")
        if calls == 2:  # down again as the run takes its lease
            ledger_server.server.kill()
            failed = _outage(uri)
            _back_after(ledger_server, 1.0)
            raise failed
        return "ran"

    assert run_through_ledger_outages(uri, run, said.append, bound_s=60) == "ran"
    assert calls == 3
    assert [line.startswith("the ledger is back after") for line in said] == [False, True, True], said


def test_past_the_bound_the_run_stops_with_one_line(ledger_server: LedgerServer) -> None:
    uri = ledger_server.uri
    Ledger(uri).migrate()
    ledger_server.server.kill()
    outage = LedgerOutage(f"query orders failed: {_outage(uri)}")
    started = time.monotonic()
    with pytest.raises(KrishivError) as stopped:
        wait_for_ledger(uri, outage, bound_s=3.0)
    assert time.monotonic() - started < 3.0 + 10  # the bound, plus a last look's budget and a loaded machine's slack
    message = str(stopped.value)
    assert message.startswith("query orders failed: ledger postgresql://") and "did not answer" in message
    assert f"it was not back after 3s ({LEDGER_OUTAGE_ENV}): run krishiv run again once it is" in message
    assert message.index("not back after") < message.index("docs/operations.md")  # the way out stays last


def test_other_failures_and_a_first_start_on_a_ledger_that_is_away_are_not_waited_for(
    ledger_server: LedgerServer,
) -> None:
    uri = ledger_server.uri
    Ledger(uri).migrate()
    said: list[str] = []

    def refused() -> None:
        raise KrishivError("query orders failed: SchemaConflict: the table changed")

    with pytest.raises(KrishivError, match="SchemaConflict"):
        run_through_ledger_outages(uri, refused, said.append, bound_s=60)
    ledger_server.server.kill()
    outage = _outage(uri)

    def first_start() -> None:  # a run that cannot take its lease: one line now, as any command
        raise outage

    started = time.monotonic()
    with pytest.raises(LedgerUnavailable):
        run_through_ledger_outages(uri, first_start, said.append, bound_s=60)
    assert time.monotonic() - started < 5 and said == []
