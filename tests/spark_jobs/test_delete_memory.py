"""The deletes an upsert pipeline remembers between batches (``spark_jobs.delete_memory``): their files in the
checkpoint, kept like the window state, and what a checkpoint without them does. The upsert rule itself is
checked through Spark and the catalogs in ``test_upsert_rule.py``."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pytest

from krishiv_core.errors import KrishivError
from krishiv_core.runbook import runbook
from spark_jobs.batch_state_files import RETAINED_BATCHES
from spark_jobs.delete_memory import STATE_DIR, DeleteMemoryStore
from spark_jobs.errors import DeleteMemoryMissing


def _memory(*pairs: tuple[int, int]) -> pa.Table:
    return pa.table(
        {"id": [k for k, _ in pairs], "v": [v for _, v in pairs]}, pa.schema([("id", pa.int64()), ("v", pa.int64())])
    )


def test_each_batch_starts_from_the_memory_the_batch_before_saved(tmp_path: Path) -> None:
    store = DeleteMemoryStore(tmp_path)
    assert store.load_before(0) is None
    store.save(0, _memory((1, 7)))
    store.save(1, _memory((1, 7), (2, 3)))
    assert store.load_before(1).to_pylist() == [{"id": 1, "v": 7}]
    assert store.load_before(2).to_pylist() == [{"id": 1, "v": 7}, {"id": 2, "v": 3}]
    store.save(1, _memory())  # a replay of batch 1 writes its file again, whole
    assert store.load_before(2).num_rows == 0
    assert not [p for p in store.folder.iterdir() if p.suffix != ".parquet"], "no temporary file left"


def test_the_last_retained_batches_are_kept(tmp_path: Path) -> None:
    store = DeleteMemoryStore(tmp_path)
    for batch in range(RETAINED_BATCHES + 3):
        store.save(batch, _memory((batch, batch)))
    kept = sorted(int(p.stem) for p in store.folder.glob("*.parquet"))
    assert kept == list(range(3, RETAINED_BATCHES + 3))


def test_a_missing_file_is_refused_and_a_checkpoint_from_before_starts_empty(tmp_path: Path, caplog) -> None:
    older = DeleteMemoryStore(tmp_path / "older")  # no folder at all: written before deletes were remembered
    with caplog.at_level(logging.WARNING, logger="spark_jobs.delete_memory"):
        assert older.load_before(5) is None
    assert "before upsert deletes were remembered" in caplog.text

    store = DeleteMemoryStore(tmp_path / "copied")
    store.save(3, _memory((1, 1)))
    with pytest.raises(DeleteMemoryMissing, match=rf"after batch 4 are not in .*{STATE_DIR}.*batch 5") as raised:
        store.load_before(5)
    assert isinstance(raised.value, KrishivError) and "restore the checkpoint" in str(raised.value)
    assert str(raised.value).endswith(runbook("A checkpoint that does not match its ledger"))
