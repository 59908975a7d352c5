"""The state folder (ledger, checkpoints, catalog, warehouse) removed under a running ``krishiv run``: the run stops
with one line naming what disappeared and the README section with the way out, exit 2, no traceback. The real
``krishiv run`` process, broker, Spark, catalog and ledger."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.services.processes import stop
from tests.spark_jobs.pipeline_helpers import ROOT, produce_orders

TIMEOUT_S = 240.0  # a bound, not a target: Spark starts in a process of its own on a loaded 2-core machine


def _wait_for(condition, what: str, output: Path) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {TIMEOUT_S:.0f}s; the run said:\n{output.read_text()[-3000:]}")
        time.sleep(0.2)


@pytest.mark.heavy
def test_a_state_folder_removed_under_a_run_is_one_line(make_spec, spec_file: Path, tmp_path: Path) -> None:
    spec = make_spec(catalog_uri="sqlite:///state/catalog.db", warehouse="state/warehouse", max_records=500)
    text = spec_file.read_text()
    text = text.replace('ledger_path = "ledger.duckdb"', 'ledger_path = "state/ledger.duckdb"')
    spec_file.write_text(text.replace('checkpoint_location = "checkpoints"', 'checkpoint_location = "state/cp"'))
    produce_orders(spec, 300)
    output = tmp_path / "run.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KRISHIV_")}
    with open(output, "w") as log:
        run = subprocess.Popen(
            [sys.executable, "-m", "krishiv.cli", "--spec", str(spec_file), "run"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        _wait_for(lambda: "committed batch 0" in output.read_text(), "batch 0 was not committed", output)
        assert (tmp_path / "state" / "cp").is_dir() and (tmp_path / "state" / "ledger.duckdb").is_file()
        state = tmp_path / "state"
        _wait_for(lambda: shutil.rmtree(state, ignore_errors=True) or not state.exists(), "state not removed", output)
        produce_orders(spec, 300, seed=8)  # the next batch finds the state gone
        code = run.wait(TIMEOUT_S)
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
            stop(run)
    said = output.read_text()
    assert code == 2, said
    assert "Traceback" not in said, said
    failures = [line for line in said.splitlines() if line.startswith("krishiv run:")]
    assert len(failures) == 1, said
    assert "disappeared while krishiv run ran" in failures[0] and str(tmp_path / "state") in failures[0], said
    assert "README: Recovery runbook > A state folder removed while running" in failures[0]
