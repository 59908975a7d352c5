"""A continuous ``krishiv run`` through a ledger outage: wait for the ledger, then start the queries again.

When a query's stager cannot record a batch because the ledger could not be written (its PostgreSQL server did
not answer, or a DuckDB file stayed locked, past the retry budget), or its stager lease expired while renewals
could not reach the ledger, the query has stopped and nothing of the batch counts yet. Restarting the whole run
is what a supervisor would do (a systemd unit, a Kubernetes pod), and it is safe: the checkpoint replays the batch
and the ledger's key makes a batch recorded twice the same batch (PROTOCOL.md, invariants 4 and 18). A continuous
run does it itself, as Flink restarts a job and Kafka Connect retries a sink: one line when the ledger goes, a
read of the ledger every few seconds, one line when it is back, and the queries start again in the same Spark
session, under leases taken again (a lease this process still holds is renewed; one another stager took since is
refused as at any start). Past ``KRISHIV_LEDGER_OUTAGE_S`` (300 s) of waiting the run stops with one line, as for
a broker outage. A server that answers with a refusal (a wrong password) is not an outage: no waiting helps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from krishiv_core.env_settings import seconds_from_env
from krishiv_core.errors import KrishivError
from krishiv_core.runbook import before_pointer
from outbox.errors import ledger_outage
from outbox.ledger import Ledger

if TYPE_CHECKING:
    from spark_jobs.job import RunningPipeline

#: How long a continuous run waits for a ledger that could not be written before it stops (seconds).
LEDGER_OUTAGE_ENV = "KRISHIV_LEDGER_OUTAGE_S"
DEFAULT_LEDGER_OUTAGE_S = 300.0
#: How long one look at the ledger waits for it, and the time between two looks (seconds).
PROBE_BUDGET_S = 2.0
PROBE_INTERVAL_S = 2.0

T = TypeVar("T")


class LedgerOutage(KrishivError):
    """A run's query stopped because the ledger could not be written (see :func:`outbox.errors.ledger_outage`)."""

    def __init__(self, message: str, running: list[RunningPipeline] | None = None) -> None:
        super().__init__(message)
        self.running = running or []  # the queries of the run it stopped, for their counts


def ledger_outage_s() -> float:
    """``KRISHIV_LEDGER_OUTAGE_S``, else :data:`DEFAULT_LEDGER_OUTAGE_S`."""
    return seconds_from_env(LEDGER_OUTAGE_ENV, DEFAULT_LEDGER_OUTAGE_S)


def wait_for_ledger(location: str, outage: KrishivError, bound_s: float) -> float:
    """Read the ledger at ``location`` until it answers; the seconds waited. Past ``bound_s``, a
    :class:`KrishivError` naming ``outage`` (what stopped the run) and the bound."""
    probe = Ledger(location, PROBE_BUDGET_S)
    started = time.monotonic()
    while True:
        try:
            probe.last_commit_seq()
            return time.monotonic() - started
        except KrishivError as exc:
            if not ledger_outage(exc):
                raise
        if time.monotonic() - started >= bound_s:
            raise KrishivError(
                before_pointer(
                    str(outage),
                    f"; it was not back after {bound_s:.0f}s ({LEDGER_OUTAGE_ENV}): run krishiv run again once it "
                    "is (the batch is replayed)",
                )
            )
        time.sleep(PROBE_INTERVAL_S)


def run_through_ledger_outages(
    location: str, run: Callable[[], T], say: Callable[[str], None], bound_s: float | None = None
) -> T:
    """``run()`` (a continuous run), started again each time it stops with :class:`LedgerOutage` once the ledger at
    ``location`` answers, up to ``bound_s`` (default :func:`ledger_outage_s`) of waiting per outage. While it starts
    again, a ledger that still cannot be written (for its lease, or a check) is the same outage."""
    bound = ledger_outage_s() if bound_s is None else bound_s
    outage: KrishivError | None = None  # the outage being waited out, once one stopped the run
    while True:
        try:
            return run()
        except LedgerOutage as exc:
            outage = exc
            say(
                before_pointer(
                    str(exc),
                    f"; waiting for the ledger up to {bound:.0f}s ({LEDGER_OUTAGE_ENV}), then the queries start "
                    "again from their checkpoints",
                )
            )
        except KrishivError as exc:
            if outage is None or not ledger_outage(exc):  # at the first start, a ledger that is away is one line
                raise
        waited = wait_for_ledger(location, outage, bound)
        say(f"the ledger is back after {waited:.0f}s; starting the queries again")
