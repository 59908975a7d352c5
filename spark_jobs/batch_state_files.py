"""Per-batch state files in the checkpoint: one Parquet file per batch id, written whole or not at all.

The window state (``spark_jobs.window_state``) and the upsert delete memory (``spark_jobs.delete_memory``) both keep
the state after each batch as ``<folder>/<batch id>.parquet``, so a replayed batch reads the state of the batch
before it and writes the same file again. A file is written under a unique temporary name and renamed into place
(a stager that lost its lease cannot leave half a file), and only the last :data:`RETAINED_BATCHES` are kept, as
Spark keeps its state store's versions.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

RETAINED_BATCHES = 100


def save_batch_file(folder: Path, path: Path, table: pa.Table, batch_id: int) -> None:
    """Write ``table`` to ``path`` (in ``folder``) atomically, then drop the files of batches no longer retained."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex}.tmp")
    try:
        pq.write_table(table, tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    for old in folder.glob("*.parquet"):
        if old.stem.isdigit() and int(old.stem) <= batch_id - RETAINED_BATCHES:
            old.unlink(missing_ok=True)


class BatchStateFiles:
    """A kind of state kept per batch in a query's checkpoint: ``<checkpoint>/<state_dir>/<batch id>.parquet``."""

    def __init__(self, checkpoint: Path, state_dir: str) -> None:
        self.folder = checkpoint / state_dir

    def path(self, batch_id: int) -> Path:
        return self.folder / f"{batch_id:012d}.parquet"

    def save(self, batch_id: int, table: pa.Table) -> None:
        """Write the state after ``batch_id`` atomically, and drop those older than the retained batches."""
        save_batch_file(self.folder, self.path(batch_id), table, batch_id)
