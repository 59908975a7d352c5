"""Starting a pipeline's query: the checkpoint and the ledger must agree first."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from krishiv.operations import open_ledger, run_pipelines
from outbox.errors import LedgerCorrupt
from spark_jobs.checkpoint import Checkpoint
from spark_jobs.errors import CheckpointMismatch
from tests.spark_jobs.pipeline_helpers import produce_orders


def test_a_checkpoint_ahead_of_its_ledger_refuses_to_start_naming_both_and_the_batches(make_spec, spark, tmp_path):
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

    shutil.copy(backup, ledger_path)  # the ledger restored from an older backup
    known = {e.batch_id for e in open_ledger(spec).entries()}
    missing = [b for b in finished if b not in known]
    assert missing
    with pytest.raises(CheckpointMismatch) as refused:
        run_pipelines(spec, list(spec.pipelines), once=True)
    text = str(refused.value)
    assert str(checkpoint.path) in text and str(ledger_path) in text
    assert f"finished batches {', '.join(map(str, missing))} " in text
    assert {e.batch_id for e in open_ledger(spec).entries()} == known, "nothing was staged"

    Path(ledger_path).unlink()  # deleted: the same refusal, not an empty pipeline
    with pytest.raises(CheckpointMismatch, match=r"finished batches 0, 1"):
        run_pipelines(spec, list(spec.pipelines), once=True)


def test_a_ledger_file_that_is_not_a_ledger_is_named_before_spark_starts(make_spec):
    spec = make_spec()
    produce_orders(spec, 10)  # the topic exists: a missing one is refused first
    ledger_path = open_ledger(spec).path
    Path(ledger_path).parent.mkdir(parents=True, exist_ok=True)
    Path(ledger_path).write_bytes(b"not a database at all" * 300)
    with pytest.raises(LedgerCorrupt, match=r"is not a DuckDB ledger"):
        run_pipelines(spec, list(spec.pipelines), once=True)
