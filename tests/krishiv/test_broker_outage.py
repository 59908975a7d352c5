"""A broker that goes away under a continuous ``krishiv run``: the query waits for it (one line when it goes, one
when it is back) and goes on, the tables ending exactly once; one that stays away past the bound stops the run with
one line and a non-zero exit. The real ``krishiv run`` process, Spark, catalog and ledger; the broker is a Tansu of
its own behind a front that is cut and put back (:mod:`tests.services.tcp_front` says why)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tests.services.processes import stop
from tests.services.tcp_front import TcpFront, fronted_broker  # noqa: F401 - the fixture
from tests.spark_jobs.pipeline_helpers import (
    all_committed,
    assert_exactly_once,
    produce_orders,
    start_krishiv,
    wait_for,
)

TIMEOUT_S = 240.0  # a bound, not a target: Spark starts in a process of its own on a loaded 2-core machine
OUTAGE_BOUND_S = 25
OUTAGE_S = 12.0  # the first outage: shorter than the bound
SECOND_WAVE_START_MS = 1_767_225_600_000 + 400 * 50


def _wait(condition: Callable[[], object], what: str, output: Path) -> None:
    wait_for(condition, what, output, TIMEOUT_S)


def test_a_continuous_run_rides_out_a_broker_outage_and_stops_after_the_bound(
    make_spec,
    spec_file: Path,
    fronted_broker: TcpFront,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    spec = make_spec(bootstrap=fronted_broker.bootstrap, partitions=2, max_records=500)
    spec_file.write_text(spec_file.read_text())  # the file the run reads is the one make_spec wrote
    produce_orders(spec, 400, malformed=4)
    output = tmp_path / "run.log"
    run = start_krishiv(spec_file, "run", output=output, env={"KRISHIV_BROKER_OUTAGE_S": str(OUTAGE_BOUND_S)})
    try:
        _wait(lambda: all_committed(spec), "the first wave was not committed", output)

        fronted_broker.cut()
        cut_at = time.monotonic()
        _wait(lambda: "retrying for up to" in output.read_text(), "the outage was not reported", output)
        # The outage lasts OUTAGE_S (a duration the test sets, not a wait for a condition); the run stays up.
        _wait(lambda: time.monotonic() - cut_at >= OUTAGE_S or run.poll() is not None, "the outage ended", output)
        assert run.poll() is None, output.read_text()
        fronted_broker.restore()
        _wait(lambda: "is back after" in output.read_text(), "the broker's return was not reported", output)
        produce_orders(spec, 400, malformed=4, seed=8, start_ms=SECOND_WAVE_START_MS)
        _wait(lambda: all_committed(spec), "the second wave was not committed", output)
        assert run.poll() is None, output.read_text()

        # Gone for longer than the bound: the run stops with one line naming the broker and the way out.
        fronted_broker.cut()
        began = time.monotonic()
        code = run.wait(TIMEOUT_S)
        assert time.monotonic() - began >= OUTAGE_BOUND_S - 5, "stopped only after the bound"
    finally:
        stop(run)  # SIGTERM, then SIGKILL; nothing if the run already exited
    said = output.read_text()
    assert code == 2, said
    failures = [line for line in said.splitlines() if line.startswith("krishiv run:")]
    assert len(failures) == 1, said
    assert f"Kafka broker at {fronted_broker.bootstrap} did not answer for" in failures[0], said
    assert "docs/operations.md: Recovery runbook > A broker outage" in failures[0]
    assert said.count("retrying for up to") == 2 and said.count("is back after") == 1, said
    assert "Traceback" not in said, said
    fronted_broker.restore()
    assert_exactly_once(spec)
