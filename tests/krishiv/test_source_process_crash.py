"""The Python process behind a continuous ``krishiv run``'s Kafka source dies (Spark's
``python_streaming_source_runner``; librdkafka#3608 aborts it in the wild, SIGABRT here): the run starts the query
again from its checkpoint, says so in one line, and the tables end exactly once. The real ``krishiv run`` process,
Spark, broker, catalog and ledger."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import psutil

from tests.services.processes import stop
from tests.spark_jobs.pipeline_helpers import (
    all_committed,
    assert_exactly_once,
    produce_orders,
    start_krishiv,
    wait_for,
)

TIMEOUT_S = 240.0  # a bound, not a target: Spark starts in a process of its own on a loaded 2-core machine
SECOND_WAVE_START_MS = 1_767_225_600_000 + 400 * 50
SOURCE_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def _source_runners(pid: int) -> list[psutil.Process]:
    """The live source runners under the run (a dead one may linger as a zombie until Spark reaps it)."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if SOURCE_RUNNER in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.Error:
            continue
    return found


def test_a_continuous_run_starts_its_query_again_when_the_source_process_dies(make_spec, spec_file: Path, tmp_path):
    spec = make_spec(partitions=2, max_records=500)
    produce_orders(spec, 400, malformed=4)
    output = tmp_path / "run.log"
    run = start_krishiv(spec_file, "run", output=output)
    try:
        wait_for(lambda: all_committed(spec), "the first wave was not committed", output, TIMEOUT_S)
        (runner,) = _source_runners(run.pid)
        runner.send_signal(signal.SIGABRT)
        restart = "starting the query again (2 of 3)"
        wait_for(lambda: restart in output.read_text() or run.poll() is not None, "no restart", output, TIMEOUT_S)
        assert restart in output.read_text(), output.read_text()
        wait_for(lambda: [p for p in _source_runners(run.pid) if p.pid != runner.pid], "no new source", output, 60)
        produce_orders(spec, 400, malformed=4, seed=8, start_ms=SECOND_WAVE_START_MS)
        wait_for(lambda: all_committed(spec), "the second wave was not committed", output, TIMEOUT_S)
        assert run.poll() is None, output.read_text()
        run.send_signal(signal.SIGTERM)
        code = run.wait(TIMEOUT_S)
    finally:
        stop(run)
    said = output.read_text()
    assert code == 0, said
    (line,) = [x for x in said.splitlines() if "the Python process of its Kafka source died" in x]
    assert line.startswith("query orders_per_minute: ") and "docs/operations.md" in line, line
    assert "Traceback" not in said, said
    # The summary counts the batches of both queries.
    assert re.search(r"^orders_per_minute: (\d+) batch(?:es)?, \1 staged, 800 records read", said, re.M), said
    assert_exactly_once(spec)
