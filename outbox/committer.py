"""Phase 2 beside phase 1: a thread that commits a running query's batches as soon as they are staged.

In continuous mode ``krishiv run`` stages a batch per trigger; waiting for a separate ``krishiv commit`` (or the
Dagster outbox sensor) to publish it adds that process's start-up and polling interval to every event's way into
the table. A :class:`Committer` runs the same :class:`~outbox.relay.CommitRelay` in the staging process instead:
the stager calls :meth:`Committer.wake` after each batch it records, and the thread reads the ledger's pending
entries in one call and commits them, in batch order. The relay's checks make it safe beside any other committer
(``krishiv commit``, a Dagster commit run): it looks for each batch in the table before committing it, and a batch
another process committed first is only marked.

The thread never polls the ledger in a tight loop (a DuckDB read costs ~20 ms and shares the file with the
stager): it sleeps until woken, or for ``idle_s`` at most (so entries an earlier process left pending go too, and
a conflict is retried). Its catalog is its own (the relay is built with a factory): a REST catalog's HTTP session
is not safe to share with the query's thread.

Like every commit run, it keeps the ledger small: at most every :data:`COMPACTION_CHECK_S` it calls the ledger's
:meth:`~outbox.ledger.Ledger.compact_if_due` (one read when not due; hourly, committed entries past the retention
fold into per-query totals), so a long continuous run's ledger does not grow for want of a ``krishiv commit``.

What goes wrong never stops the query, which keeps staging (entries stay pending, and the safety net commits
them later):

- the catalog does not answer (:class:`~krishiv_core.errors.CatalogUnavailable`), or the ledger stays busy: one
  line, then back off (1 s doubling to 30 s) and try again; one line when commits resume;
- concurrent writers kept winning (:class:`~outbox.errors.CommitConflict`): one line, retried at the next wake;
- a refusal that asking again cannot change (the catalog refused the table or the commit, the table lost the
  query's committed batches, a staged file is gone, a merge is refused): one line, and that table is not committed
  to again by this process (:attr:`Committer.failures`), while the others go on;
- anything else: one line, and the committer stops (:attr:`Committer.error`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from krishiv_core.catalog import CatalogRefused
from krishiv_core.errors import CatalogUnavailable, KrishivError
from krishiv_core.runbook import before_pointer
from outbox.errors import (
    CommitConflict,
    CommittedBatchesMissing,
    LedgerBusyError,
    LedgerCorrupt,
    MergeRefused,
    StagedFileMissing,
)
from outbox.ledger.retention import DEFAULT_RETENTION_S, CompactionReport
from outbox.relay import CommitRelay, TableCommitReport

log = logging.getLogger(__name__)

#: Longest sleep between two looks at the ledger when nothing wakes the committer (seconds).
IDLE_S = 1.0
#: Back-off after the catalog or the ledger did not answer: the first wait, doubled each time up to the last.
BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0
#: How long :meth:`Committer.stop` lets the final pass run (seconds).
FINAL_PASS_S = 10.0

#: How often the committer asks the ledger whether its hourly compaction is due (seconds).
COMPACTION_CHECK_S = 60.0

#: Failures that asking again cannot change: the table is not committed to again by this process.
REFUSALS: tuple[type[Exception], ...] = (CatalogRefused, CommittedBatchesMissing, StagedFileMissing, MergeRefused)

#: Takes each pass's report of a table with something committed or found already committed.
ReportSink = Callable[[TableCommitReport], None]
#: Takes one line for the person watching (an outage, a refusal, a resumption).
LineSink = Callable[[str], None]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Committer:
    """Commits the pending entries of ``tables`` through ``relay`` in a daemon thread, when woken.

    ``tables``: qualified table names, in the order they are committed within a pass. ``on_report`` receives every
    report with a committed or already-present batch; ``progress`` one line per outage, refusal or resumption. Call
    :meth:`start`, then :meth:`wake` after each staged batch, and :meth:`stop` when the query has stopped.
    """

    def __init__(
        self,
        relay: CommitRelay,
        tables: Sequence[str],
        *,
        on_report: ReportSink | None = None,
        progress: LineSink | None = None,
        idle_s: float = IDLE_S,
        ledger_retention_s: float = DEFAULT_RETENTION_S,
    ) -> None:
        self.relay = relay
        self.tables = list(dict.fromkeys(tables))
        self.idle_s = idle_s
        self._on_report = on_report or (lambda _report: None)
        self._say = progress or (lambda _line: None)
        self._woken = threading.Event()
        self._stopping = threading.Event()
        self._final_pass = True
        self._thread = threading.Thread(target=self._run, name="krishiv-committer", daemon=True)
        #: Table -> why this process stopped committing it (one line).
        self.failures: dict[str, str] = {}
        #: Why the committer stopped altogether (an unexpected error), or None.
        self.error: str | None = None
        #: Every pass's reports with something committed or found, oldest first.
        self.reports: list[TableCommitReport] = []
        self._backoff_s = 0.0
        self._retry_at = 0.0  # monotonic time before which the catalog is not tried again
        self._outage: str | None = None  # what the current outage is, once reported
        self.ledger_retention_s = ledger_retention_s
        self._compaction_check_at = 0.0  # monotonic time of the next look at whether the ledger's compaction is due
        #: What the ledger compactions this committer ran folded, oldest first.
        self.compactions: list[CompactionReport] = []

    # ------------------------------------------------------------------------------------ control

    def start(self) -> None:
        """Start the thread; its first pass commits what is pending already (left by an earlier process)."""
        self._thread.start()

    def watch(self, tables: Sequence[str]) -> None:
        """Commit ``tables`` too from the next pass on (a pipeline's new tables, made while it runs). Safe from any
        thread: the list a pass reads is replaced, never changed in place."""
        self.tables = list(dict.fromkeys([*self.tables, *tables]))

    def wake(self) -> None:
        """Ask for a pass now (the stager recorded a batch). Cheap, and safe from any thread."""
        self._woken.set()

    def stop(self, final_pass_s: float = FINAL_PASS_S) -> None:
        """One last pass (unless the catalog is backing off), bounded by ``final_pass_s``, then end the thread.

        Call it once the query has stopped, so the last staged batch is committed too. What the pass did not finish
        stays pending for ``krishiv commit`` or the outbox sensor. With ``final_pass_s`` 0 (the ledger is away, and
        the run starts again once it answers) there is no last pass: the thread ends after the call it is in, and
        this returns at once.
        """
        self._final_pass = final_pass_s > 0
        self._stopping.set()
        self._woken.set()
        if not self._final_pass:
            return
        self._thread.join(final_pass_s)
        if self._thread.is_alive():
            self._say(
                f"commits: the final pass was still running after {final_pass_s:.0f}s; "
                "what it did not commit stays pending for krishiv commit"
            )

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def committed(self) -> int:
        """How many batches this committer committed."""
        return sum(len(r.committed) for r in self.reports)

    # ------------------------------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            woken = False
            while not self._stopping.is_set():
                self._pass(staged=woken)
                woken = self._woken.wait(self._wait_s())
                self._woken.clear()
            if not self._final_pass:
                return
            if self._backing_off():
                self._say(f"commits: not retried before stopping ({self._outage}); pending entries stay pending")
            else:
                self._pass()
        except Exception as exc:  # must not die silently: said, and no more commits by this process
            self.error = f"{type(exc).__name__}: {_first_line(exc)}"
            log.exception("the committer stopped")
            self._say(f"commits stopped: {self.error}; pending entries stay pending for krishiv commit")

    def _wait_s(self) -> float:
        if self._backing_off():
            return max(0.0, self._retry_at - time.monotonic())
        return self.idle_s

    def _backing_off(self) -> bool:
        return time.monotonic() < self._retry_at

    def _pass(self, staged: bool = False) -> None:
        """Commit every table with pending entries, unless backing off. Woken by a staged batch (``staged``), every
        table of its pipeline has one; otherwise one ledger read finds which, if any."""
        if self._backing_off():
            return
        tables = [t for t in self.tables if t not in self.failures]
        if not tables:
            return
        if not staged:
            try:
                pending = {b.table for b in self.relay.ledger.pending_batches(tables)}
            except LedgerCorrupt:
                raise
            except LedgerBusyError as exc:
                self._back_off(f"ledger busy: {_first_line(exc)}")
                return
            tables = [t for t in tables if t in pending]
        for table in tables:
            if not self._commit(table):
                return  # the catalog or the ledger is away: every table waits for the back-off
        self._resumed()
        self._compact_ledger()

    def _compact_ledger(self) -> None:
        """The ledger's compaction, when due (hourly), asked at most every :data:`COMPACTION_CHECK_S`. A busy
        ledger is only logged: the next check tries again."""
        if time.monotonic() < self._compaction_check_at:
            return
        self._compaction_check_at = time.monotonic() + COMPACTION_CHECK_S
        try:
            report = self.relay.ledger.compact_if_due(self.ledger_retention_s)
        except LedgerBusyError as exc:
            log.info("ledger compaction put off: %s", _first_line(exc))
            return
        if report is not None:
            self.compactions.append(report)

    def _commit(self, table: str) -> bool:
        """Commit ``table``'s pending entries; False if the catalog or the ledger did not answer. What a batch's
        other tables got with them is reported too, even when a later batch stopped this table."""
        try:
            return self._commit_table(table)
        finally:
            self._publish(self.relay.also)

    def _publish(self, reports: list[TableCommitReport]) -> None:
        for done in reports:
            if done.committed or done.recovered:
                self.reports.append(done)
                self._on_report(done)

    def _commit_table(self, table: str) -> bool:
        try:
            report = self.relay.commit_table(table)
        except CatalogUnavailable as exc:
            self._back_off(_first_line(exc))
            return False
        except LedgerBusyError as exc:
            self._back_off(f"ledger busy: {_first_line(exc)}")
            return False
        except LedgerCorrupt:
            raise
        except CommitConflict as exc:
            self._say(f"commits of {table}: {_first_line(exc)}; retried at the next batch")
            return True
        except REFUSALS as exc:
            self._refused(table, exc)
            return True
        except KrishivError as exc:  # the relay's other errors are certain too: nothing was committed
            self._refused(table, exc)
            return True
        self._publish([report])
        return True

    def _refused(self, table: str, exc: BaseException) -> None:
        self.failures[table] = _first_line(exc)
        self._say(
            before_pointer(
                f"commits of {table} stopped: {self.failures[table]}", "; its batches are still staged and stay pending"
            )
        )

    def _back_off(self, why: str) -> None:
        self._backoff_s = BACKOFF_START_S if self._backoff_s == 0 else min(self._backoff_s * 2, BACKOFF_MAX_S)
        self._retry_at = time.monotonic() + self._backoff_s
        if self._outage is None:
            self._say(
                before_pointer(
                    f"commits paused: {why}",
                    f"; staging goes on, retrying from {self._backoff_s:.0f}s up to every {BACKOFF_MAX_S:.0f}s",
                )
            )
        self._outage = why

    def _resumed(self) -> None:
        if self._outage is not None:
            self._say("commits resumed")
        self._outage = None
        self._backoff_s = 0.0
        self._retry_at = 0.0
