"""What an upsert pipeline's keys remember of their deletes, carried from batch to batch in the checkpoint.

By the upsert rule (docs/spec.md, PROTOCOL.md invariant 13) a ``delete_field`` event that applies removes its key's row
and the key keeps the delete's version: a later event of a lower version is ignored. The table no longer holds a
row to compare with, so phase 1 remembers those versions itself: one row per key whose state is a delete with a
non-null version (the key and the version, each a column named by its path: ``id``, or ``device.id`` inside a
struct). A row that applies, or a tombstone, makes the key forget.
Only a pipeline with both a ``version_field`` and a ``delete_field`` needs it: without a version every event
applies, and without a delete field only tombstones delete, and they forget.

As with the windowed kind's open windows (``spark_jobs.window_state``), each batch's memory is one Parquet file
in the checkpoint, ``krishiv/upsert-deletes/<batch>.parquet``, the whole memory after that batch, written through
a temporary file of a unique name and an atomic rename before the batch's ledger entry. A replayed batch reads
the memory of the batch before it, so it stages the same files again. The last 100 batches' files are kept.

A checkpoint without the folder at all (written by a Krishiv from before deletes were remembered) starts with an
empty memory, with a warning; a folder without the previous batch's file is refused.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from krishiv_core.runbook import runbook
from spark_jobs.batch_state_files import BatchStateFiles
from spark_jobs.errors import DeleteMemoryMissing

log = logging.getLogger(__name__)

STATE_DIR = "krishiv/upsert-deletes"


class DeleteMemoryStore(BatchStateFiles):
    """The remembered deletes after each batch, one Parquet file per batch id inside a query's checkpoint."""

    def __init__(self, checkpoint: Path, *, new_when_missing: bool = False) -> None:
        """``new_when_missing``: no folder means the table is new to the query (a member of a pipeline over several
        topics, which came after deletes were remembered, added since the last batch): it starts remembering none,
        without the warning an older checkpoint gets."""
        super().__init__(checkpoint, STATE_DIR)
        self.new_when_missing = new_when_missing

    def load_before(self, batch_id: int) -> pa.Table | None:
        """The memory batch ``batch_id`` starts from; None when it is empty (batch 0)."""
        if batch_id == 0:
            return None
        path = self.path(batch_id - 1)
        if path.exists():
            return pq.read_table(path)
        if not self.folder.exists():
            if self.new_when_missing:
                return None
            log.warning(
                "%s does not exist: the checkpoint was written before upsert deletes were remembered, so batch %s "
                "starts remembering none (a delete staged earlier does not block an older event)",
                self.folder,
                batch_id,
            )
            return None
        raise DeleteMemoryMissing(
            f"the remembered deletes after batch {batch_id - 1} are not in {self.folder}, so batch {batch_id} "
            f"cannot be staged; restore the checkpoint with its {STATE_DIR} folder "
            + runbook("A checkpoint that does not match its ledger")
        )
