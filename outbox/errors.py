"""Domain exceptions of the outbox (ledger and commit relay)."""

from __future__ import annotations


class OutboxError(Exception):
    """Base class of the outbox's errors."""


class LedgerBusyError(OutboxError):
    """Another process held the ledger file for longer than the retry budget."""

    def __init__(self, path: str, waited_s: float, detail: str) -> None:
        super().__init__(
            f"ledger {path} stayed locked by another process for {waited_s:.1f}s (the retry budget); "
            f"nothing was written. DuckDB said: {detail}"
        )
        self.path = path


class LedgerSchemaError(OutboxError):
    """The ledger file was written by a newer Krishiv than this one."""


class BatchReplayMismatch(OutboxError):
    """A batch id came back with other offsets than the ledger recorded: the checkpoint and ledger disagree."""


class StagedFileMissing(OutboxError):
    """A staged file referenced by a pending entry is gone; committing would lose data, so the relay stops."""


class CatalogUnavailable(OutboxError):
    """The Iceberg catalog did not answer; pending entries stay pending."""


class CommitConflict(OutboxError):
    """Concurrent writers kept winning for longer than the retry budget."""


class StagerBusy(OutboxError):
    """Another live process is running the pipeline's Spark query (its checkpoint allows only one)."""
