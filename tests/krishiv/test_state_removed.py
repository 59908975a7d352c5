"""The state folder (ledger, checkpoints, catalog, warehouse) removed under a running ``krishiv run``: the run stops
with one line naming what disappeared and the runbook section with the way out, exit 2, no traceback. The real
``krishiv run`` process, broker, Spark, catalog and ledger."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.services.processes import stop
from tests.spark_jobs.pipeline_helpers import produce_orders, start_krishiv, wait_for

TIMEOUT_S = 240.0  # a bound, not a target: Spark starts in a process of its own on a loaded 2-core machine


def _wait_for(condition: Callable[[], object], what: str, output: Path) -> None:
    wait_for(condition, what, output, TIMEOUT_S)


@pytest.mark.heavy
def test_a_state_folder_removed_under_a_run_is_one_line(make_spec, spec_file: Path, tmp_path: Path) -> None:
    spec = make_spec(catalog_uri="sqlite:///state/catalog.db", warehouse="state/warehouse", max_records=500)
    text = spec_file.read_text()
    text = text.replace('ledger_path = "ledger.duckdb"', 'ledger_path = "state/ledger.duckdb"')
    spec_file.write_text(text.replace('checkpoint_location = "checkpoints"', 'checkpoint_location = "state/cp"'))
    produce_orders(spec, 300)
    output = tmp_path / "run.log"
    run = start_krishiv(spec_file, "run", output=output)
    try:
        _wait_for(lambda: "committed batch 0" in output.read_text(), "batch 0 was not committed", output)
        assert (tmp_path / "state" / "cp").is_dir() and (tmp_path / "state" / "ledger.duckdb").is_file()
        state = tmp_path / "state"
        _wait_for(lambda: shutil.rmtree(state, ignore_errors=True) or not state.exists(), "state not removed", output)
        produce_orders(spec, 300, seed=8)  # the next batch finds the state gone
        code = run.wait(TIMEOUT_S)
    finally:
        stop(run)  # SIGTERM, then SIGKILL; nothing if the run already exited
    said = output.read_text()
    assert code == 2, said
    assert "Traceback" not in said, said
    failures = [line for line in said.splitlines() if line.startswith("krishiv run:")]
    assert len(failures) == 1, said
    assert "disappeared while krishiv run ran" in failures[0] and str(tmp_path / "state") in failures[0], said
    assert "docs/operations.md: Recovery runbook > A state folder removed while running" in failures[0]
