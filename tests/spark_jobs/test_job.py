"""Starting a pipeline's query: the checkpoint and the ledger must agree first."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from krishiv.operations import open_ledger, run_pipelines
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.runbook import runbook
from krishiv_core.spec import load_spec
from outbox.errors import LedgerCorrupt
from spark_jobs.checkpoint import Checkpoint
from spark_jobs.errors import CheckpointMismatch
from spark_jobs.job import source_process_loss
from tests.spark_jobs.pipeline_helpers import assert_exactly_once, produce_orders

RUNBOOK = "(see docs/operations.md: Recovery runbook > A checkpoint that does not match its ledger)"


def test_a_checkpoint_ahead_of_its_ledger_refuses_to_start_and_the_runbook_ways_out_go_on(make_spec, spark, tmp_path):
    """The checkpoint and the ledger of different histories are refused before any batch, naming the runbook's
    section; its ways out (the ledger path pointed back, the checkpoint restored) go on exactly once."""
    spec = make_spec(max_records=1_000)
    produce_orders(spec, 1_500)
    run_pipelines(spec, list(spec.pipelines), once=True)
    ledger_path = open_ledger(spec).path
    backup = tmp_path / "ledger-backup.duckdb"
    shutil.copy(ledger_path, backup)
    produce_orders(spec, 2_000, seed=9, start_ms=1_767_225_600_000 + 1_500 * 50)
    run_pipelines(spec, list(spec.pipelines), once=True)
    checkpoint = Checkpoint(spec.checkpoint_dir(spec.pipeline()))
    finished = checkpoint.committed_batch_ids()

    staged_into = tmp_path / "ledger-staged-into.duckdb"
    shutil.copy(ledger_path, staged_into)  # kept aside: the ledger this checkpoint staged into
    shutil.copy(backup, ledger_path)  # the ledger restored from an older backup
    known = {e.batch_id for e in open_ledger(spec).entries()}
    missing = [b for b in finished if b not in known]
    assert missing
    with pytest.raises(CheckpointMismatch) as refused:
        run_pipelines(spec, list(spec.pipelines), once=True)
    text = str(refused.value)
    assert str(checkpoint.path) in text and str(ledger_path) in text
    assert f"finished batches {', '.join(map(str, missing))} " in text
    assert text.endswith(RUNBOOK), text
    assert {e.batch_id for e in open_ledger(spec).entries()} == known, "nothing was staged"

    Path(ledger_path).unlink()  # deleted: the same refusal, not an empty pipeline
    with pytest.raises(CheckpointMismatch, match=r"finished batches 0, 1"):
        run_pipelines(spec, list(spec.pipelines), once=True)

    # The runbook's ways out. KRISHIV_LEDGER_PATH pointed back at the ledger the checkpoint staged into ...
    spec_file = tmp_path / "krishiv.toml"
    spec = load_spec(spec_file, env={"KRISHIV_LEDGER_PATH": str(staged_into)})
    # ... but the checkpoint moved away: refused too, until it is back.
    moved = tmp_path / "checkpoint-moved"
    shutil.move(checkpoint.path, moved)
    with pytest.raises(CheckpointMismatch, match=r"is empty, but ledger") as refused:
        run_pipelines(spec, list(spec.pipelines), once=True)
    assert str(refused.value).endswith(RUNBOOK)
    shutil.move(moved, checkpoint.path)
    # The pipeline's table renamed in the spec: its checkpoint belongs to the old table.
    renamed = tmp_path / "renamed.toml"
    renamed.write_text(spec_file.read_text().replace('table = "orders_per_minute"', 'table = "orders_v2"'))
    other = load_spec(renamed, env={"KRISHIV_LEDGER_PATH": str(staged_into)})
    with pytest.raises(CheckpointMismatch, match=r"into other tables than the spec's krishiv\.orders_v2_rejects") as no:
        run_pipelines(other, list(other.pipelines), once=True)
    assert str(no.value).endswith("(see docs/operations.md: Recovery runbook > A spec change the table cannot take)")
    assert not load_catalog(other).table_exists(qualified(other, "orders_v2")), "refused before any table was made"

    produce_orders(spec, 500, seed=10, start_ms=1_767_225_600_000 + 3_500 * 50)
    run_pipelines(spec, list(spec.pipelines), once=True)
    assert_exactly_once(spec)


def test_a_ledger_file_that_is_not_a_ledger_is_named_before_spark_starts(make_spec):
    spec = make_spec()
    produce_orders(spec, 10)  # the topic exists: a missing one is refused first
    ledger_path = open_ledger(spec).path
    Path(ledger_path).parent.mkdir(parents=True, exist_ok=True)
    Path(ledger_path).write_bytes(b"not a database at all" * 300)
    with pytest.raises(LedgerCorrupt, match=r"is not a DuckDB ledger") as refused:
        run_pipelines(spec, list(spec.pipelines), once=True)
    assert str(refused.value).endswith(runbook("A ledger that is locked or damaged"))


_QUERY = "Query [id = 5f0c, runId = 9a1e]"
_PLAN = '\n=== Streaming Query ===\nCurrent Committed Offsets: {PythonMicroBatchStream@1f2: {"0": 400}}'


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        (
            f"[STREAM_FAILED] {_QUERY} terminated with exception:  SQLSTATE: XXKST (no cause message){_PLAN}",
            "no cause message",
        ),
        ("[STREAM_FAILED] over another source: SQLSTATE: XXKST (no cause message)", None),
        (f"Connection reset{_PLAN}", "Connection reset"),
        (
            f"[STREAM_FAILED] {_QUERY} terminated with exception: Connection reset SQLSTATE: XXKST{_PLAN}",
            "Connection reset",
        ),
        (
            f"[STREAM_FAILED] {_QUERY} terminated with exception: Connection reset by peer SQLSTATE: XXKST",
            "Connection reset by peer",
        ),
        ("Broken pipe", "Broken pipe"),
        (
            f"[STREAM_FAILED] {_QUERY} terminated with exception: spark_jobs.errors.SourceChanged: topic 'orders' …",
            None,
        ),
        (f"[STREAM_FAILED] {_QUERY} terminated with exception: Connection refused SQLSTATE: XXKST{_PLAN}", None),
    ],
)
def test_the_source_process_is_said_to_have_died_by_what_spark_says(failure: str, said: str | None) -> None:
    """A run starts its query again when the source's Python process died; Spark says so without a message, or with
    the message of the JVM's socket to the process (``Connection reset``, seen in a loaded CI run)."""
    assert source_process_loss(RuntimeError(failure)) == said
