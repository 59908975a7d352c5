"""Domain exceptions of the outbox (ledger and commit relay)."""

from __future__ import annotations

from krishiv_core.errors import KrishivError
from krishiv_core.postgres_location import LEDGER_FORM, location_refused
from krishiv_core.runbook import runbook


class OutboxError(KrishivError):
    """Base class of the outbox's errors."""


class LedgerBusyError(OutboxError):
    """Another process held the ledger for longer than the retry budget (or, as :class:`LedgerUnavailable`, the
    ledger's server did not answer): nothing was written, and trying again later is the way on."""

    def __init__(self, path: str, waited_s: float, detail: str) -> None:
        super().__init__(
            f"ledger {path} stayed locked by another process for {waited_s:.1f}s (the retry budget); "
            f"nothing was written. {detail} {runbook('A ledger that is locked or damaged')}"
        )
        self.path = path


class LedgerUnavailable(LedgerBusyError):
    """The ledger's PostgreSQL server did not answer, or the connection was lost during an operation.

    ``written`` says what became of a write: False (nothing was written), None (lost during its COMMIT: unknown;
    the protocol settles it, as a replayed batch or an entry found committed).
    """

    def __init__(self, path: str, reason: str, written: bool | None, refused: bool = False) -> None:
        outcome = (
            "nothing was written"
            if written is False
            else "the write may or may not have been made; the next run finds out from the ledger"
        )
        what = f"refused the connection: {reason}" if refused else f"did not answer ({reason})"
        OutboxError.__init__(self, f"ledger {path} {what}; {outcome} {runbook('A ledger that is locked or damaged')}")
        self.path = path
        self.written = written
        self.refused = refused


def ledger_outage(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the ledger could not be written for a while (busy past the budget, or its server did not
    answer), so that trying again once it answers is the way on. A server that answered with a refusal (a wrong
    password, a missing database) is not an outage: no waiting helps."""
    return isinstance(exc, LedgerBusyError) and not getattr(exc, "refused", False)


class LedgerCorrupt(OutboxError):
    """The ledger path holds something that is not a Krishiv ledger: an empty or damaged file, or another database.

    Retrying cannot help (unlike :class:`LedgerBusyError`), so it is raised at once, naming what was found.
    """

    def __init__(self, path: str, found: str, database: str = "DuckDB") -> None:
        where = "file" if database == "DuckDB" else "database and schema"
        super().__init__(
            f"ledger {path} is not a {database} ledger ({found}); restore it from a backup or point "
            f"storage.ledger_path at the right {where} {runbook('A ledger that is locked or damaged')}"
        )
        self.path = path
        self.found = found


class LedgerLocationWrong(OutboxError):
    """A PostgreSQL ledger location that cannot be right (it does not parse, names a parameter libpq does not know, a
    port that is not a number): refused before any connection, since no retry makes it right."""

    def __init__(self, shown: str, problem: str) -> None:
        super().__init__(f"ledger {shown}: {location_refused(problem, 'the location', LEDGER_FORM)}")
        self.path = shown


class LedgerGone(OutboxError):
    """The ledger's file was removed while this process used it: nothing is written to a new, empty one in its
    place (a stager would record batches no relay of the old history knows, a relay find nothing pending)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"ledger {path} is gone: it was removed while in use; nothing was written")
        self.path = path


class LedgerMoved(OutboxError):
    """``krishiv ledger-copy`` moved this ledger to another database; it is read and written there now."""

    def __init__(self, path: str, target: str) -> None:
        super().__init__(
            f"ledger {path} was moved to {target} by krishiv ledger-copy; point storage.ledger_path (or "
            f"$KRISHIV_LEDGER_PATH) at it {runbook('Moving the ledger to PostgreSQL')}"
        )
        self.path = path
        self.target = target


class CopyRefused(OutboxError):
    """A ledger copy that would lose or mix batches: a live stager on the source, or a target already in use."""


class LedgerSchemaError(OutboxError):
    """The ledger file was written by a newer Krishiv than this one."""


class StagedFileMissing(OutboxError):
    """A staged file referenced by a pending entry is gone; committing would lose data, so the relay stops."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"staged file {path} of a pending entry is missing; refusing to commit a partial batch: `krishiv restage` "
            f"stages the batch again {runbook('A staged file that is gone')}"
        )
        self.path = path


class CommitConflict(OutboxError):
    """Concurrent writers kept winning for longer than the retry budget."""


class StagerBusy(OutboxError):
    """Another live process is running the pipeline's Spark query (its checkpoint allows only one)."""


class OffsetSkipConflict(OutboxError):
    """An offset skip was recorded or applied twice with different values."""


class CommittedBatchesMissing(OutboxError):
    """The ledger says batches of a query are in a table that shows no trace of that query: never append again."""


class MergeRefused(OutboxError):
    """The relay refuses to merge an entry: committing it could not give MERGE INTO's result. Nothing is committed."""


class MergeKeyNull(MergeRefused):
    """A merge's staged file holds a null in a key column: phase 1 never stages one, so the relay refuses it."""

    def __init__(self, table: str, batch_id: int, column: str, path: str) -> None:
        super().__init__(
            f"{table} batch {batch_id}: key column {column!r} is null in staged file {path}; a merge cannot match "
            "a null key, so nothing was committed. Phase 1 drops or rejects such rows: remove the batch's staged "
            f"files and run krishiv restage {runbook('A merge the relay refuses')}"
        )
        self.table = table
        self.batch_id = batch_id
        self.column = column


class MergeKeyDuplicate(MergeRefused):
    """A merge's staged data files hold two rows for one key: phase 1 deduplicates, so the relay refuses them."""


class MergeRetriesEnabled(MergeRefused):
    """pyiceberg's own commit retry is on for a table the relay merges into: a retry would reuse a stale plan."""
