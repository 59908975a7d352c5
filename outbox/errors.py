"""Domain exceptions of the outbox (ledger and commit relay)."""

from __future__ import annotations

from krishiv_core.errors import KrishivError


class OutboxError(KrishivError):
    """Base class of the outbox's errors."""


class LedgerBusyError(OutboxError):
    """Another process held the ledger file for longer than the retry budget."""

    def __init__(self, path: str, waited_s: float, detail: str) -> None:
        super().__init__(
            f"ledger {path} stayed locked by another process for {waited_s:.1f}s (the retry budget); "
            f"nothing was written. DuckDB said: {detail}"
        )
        self.path = path


class LedgerCorrupt(OutboxError):
    """The ledger path holds something that is not a Krishiv ledger: an empty or damaged file, or another database.

    Retrying cannot help (unlike :class:`LedgerBusyError`), so it is raised at once, naming what was found.
    """

    def __init__(self, path: str, found: str) -> None:
        super().__init__(
            f"ledger {path} is not a DuckDB ledger ({found}); restore it from a backup or point "
            "storage.ledger_path at the right file"
        )
        self.path = path
        self.found = found


class LedgerSchemaError(OutboxError):
    """The ledger file was written by a newer Krishiv than this one."""


class BatchReplayMismatch(OutboxError):
    """A batch id came back with other offsets than the ledger recorded: the checkpoint and ledger disagree."""


class StagedFileMissing(OutboxError):
    """A staged file referenced by a pending entry is gone; committing would lose data, so the relay stops."""


class CommitConflict(OutboxError):
    """Concurrent writers kept winning for longer than the retry budget."""


class StagerBusy(OutboxError):
    """Another live process is running the pipeline's Spark query (its checkpoint allows only one)."""


class StagerLeaseLost(OutboxError):
    """This process no longer holds the pipeline's stager lease (expired, or taken over); it must stop staging."""

    def __init__(self, pipeline: str, holder: str) -> None:
        super().__init__(
            f"the stager lease of pipeline {pipeline!r} is no longer held by this process ({holder}); "
            "nothing was written, and this process must stop staging"
        )
        self.pipeline = pipeline
        self.holder = holder


class OffsetSkipConflict(OutboxError):
    """An offset skip was recorded or applied twice with different values."""


class CommittedBatchesMissing(OutboxError):
    """The ledger says batches of a query are in a table that shows no trace of that query: never append again."""
