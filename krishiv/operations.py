"""The pipeline's operations behind the CLI, the demo and the Dagster assets: stage, commit, verify.

Each takes the spec (the pipelines, the table names, the Spark query's settings) and, optionally, the clients
it works with: the Iceberg catalog, the outbox ledger, and for a run the Spark session too, as one
:class:`~krishiv.query_supervisor.RunClients`. The CLI passes none, and each is opened from the spec (its addresses
from the spec file and the environment); the Dagster assets pass their resources' clients. Every entry point runs
the same code; the queries of a run are started, and started again, by :mod:`krishiv.query_supervisor`.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

from krishiv.ledger_outage import LedgerOutage
from krishiv.query_supervisor import (
    SOURCE_DIED_RUNBOOK,
    WORKER_START_RUNBOOK,
    QuerySupervisor,
    ReadyClients,
    RunClients,
    ensure_tables,
)
from krishiv_core.env_settings import seconds_from_env
from krishiv_core.errors import KrishivError, StagerLeaseLost
from krishiv_core.reject_rate import reject_rate_warn
from krishiv_core.runbook import before_pointer
from krishiv_core.spec import KrishivSpec, PipelineSpec
from outbox.errors import ledger_outage
from outbox.ledger import Ledger
from outbox.ledger.connection import DEFAULT_LOCK_TIMEOUT_S

if TYPE_CHECKING:  # Spark and pyiceberg load only when an operation runs, keeping `krishiv status` quick
    from pyiceberg.catalog import Catalog
    from pyspark.sql.streaming import StreamingQuery

    from krishiv.verify import Verification
    from outbox.committer import Committer
    from outbox.lease import HeldLease
    from outbox.relay import TableCommitReport
    from spark_jobs.job import RunningPipeline
    from spark_jobs.staging import StagedBatch

#: Builds the per-batch progress callback of a pipeline, by pipeline name.
BatchReporter = Callable[[str], Callable[["StagedBatch"], None]]

#: Takes one line of progress (Spark starting, a query started, a stop requested) for the person watching.
Progress = Callable[[str], None]

#: Takes the report of each table a continuous run's committer committed to (or found its batches in).
CommitReporter = Callable[["TableCommitReport"], None]


class RunInterrupted(KrishivError):
    """A signal stopped a one-shot run between batches: what was staged is kept, the rest waits for the next run."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(
            f"stopped by {signal_name} between batches; what was staged is kept and the next `krishiv run` "
            "goes on from there"
        )
        self.signal_name = signal_name


class CommitsStopped(KrishivError):
    """A continuous run staged to the end, but stopped committing some tables (a refusal, an unexpected error):
    their batches are staged and pending, waiting for what the message names to be put right."""

    def __init__(self, running: list[RunningPipeline], failures: dict[str, str]) -> None:
        super().__init__(  # each table's refusal keeps its runbook pointer last
            "; ".join(
                before_pointer(
                    f"{table}: {why}", "; its batches are staged and pending: put that right, then run krishiv commit"
                )
                for table, why in failures.items()
            )
        )
        self.running = running
        self.failures = failures


class TablesRefused(KrishivError):
    """Some tables refused their commits (a staged file gone, the catalog refused, ...) while every other table was
    committed: one line per cause, naming the tables it holds back and the way out; their entries stay pending. A
    batch is committed to all of its tables or to none, so one missing file holds back each table of its batch."""

    def __init__(self, reports: list[TableCommitReport]) -> None:
        self.reports = reports
        self.refused = {r.table: r.refused for r in reports if r.refused}
        self._tables: dict[str, list[str]] = {}  # cause -> the tables it holds back
        for table, why in self.refused.items():
            self._tables.setdefault(why, []).append(table)
        super().__init__("; ".join(self.lines(": put that right, then run krishiv commit")))

    def lines(self, then: str = "") -> list[str]:
        """One line per cause: the tables it holds back, why, and that their batches stay pending, then ``then``
        (each cause's runbook pointer last)."""
        return [
            before_pointer(
                f"{', '.join(t)}: {why}", f"; {'its' if len(t) == 1 else 'their'} batches stay pending{then}"
            )
            for why, t in self._tables.items()
        ]


#: How long a command waits for a ledger another process holds (seconds; default 30).
LEDGER_LOCK_TIMEOUT_ENV = "KRISHIV_LEDGER_LOCK_TIMEOUT_S"


#: How long a stager's lease lasts unless renewed (seconds; default 30): how soon a paused stager is fenced off.
STAGER_LEASE_TTL_ENV = "KRISHIV_STAGER_LEASE_TTL_S"


def ledger_lock_timeout_s() -> float:
    """How long a ledger call waits for another process's lock: ``KRISHIV_LEDGER_LOCK_TIMEOUT_S``, else 30 s."""
    return seconds_from_env(LEDGER_LOCK_TIMEOUT_ENV, DEFAULT_LOCK_TIMEOUT_S)


def open_ledger(spec: KrishivSpec) -> Ledger:
    """The spec's ledger (``storage.ledger_path``: a DuckDB file relative to the spec file's folder, or PostgreSQL)."""
    return Ledger(spec.ledger_location(), ledger_lock_timeout_s())


def open_writable_ledger(spec: KrishivSpec) -> Ledger:
    """The spec's ledger for a command that stages: its folder made, or an error naming why it cannot be
    (:func:`krishiv.inputs.require_writable_ledger`)."""
    from krishiv.inputs import require_writable_ledger

    return Ledger(require_writable_ledger(spec), ledger_lock_timeout_s())


def open_existing_ledger(spec: KrishivSpec) -> Ledger:
    """The spec's ledger for a command that reads it (status, verify, lineage, commit): a missing file is an
    error naming the path (:class:`krishiv.inputs.LedgerMissing`), never an empty pipeline."""
    from krishiv.inputs import require_ledger

    return Ledger(require_ledger(spec, ledger_lock_timeout_s()), ledger_lock_timeout_s())


def _catalog_address(catalog: Catalog) -> str:
    """How a catalog may be named in a message: its URI, redacted."""
    from krishiv_core.catalog import redact

    return redact(str(catalog.properties.get("uri", catalog.name)))


#: A Krishiv exception as Python prints it at the end of a traceback Spark carries: ``spark_jobs.errors.X: message``.
_KRISHIV_ERROR_LINE = re.compile(r"^(?:spark_jobs|outbox|krishiv_core|krishiv)(?:\.\w+)*\.(\w+): (.+)$")


def _root_cause(exc: BaseException) -> str:
    """``Class: message`` of the Krishiv error in a Spark failure, else Spark's first line."""
    text = str(exc)
    for line in text.splitlines():
        found = _KRISHIV_ERROR_LINE.match(line.strip())
        if found:
            return f"{found.group(1)}: {found.group(2)}"
    return text.splitlines()[0] if text else repr(exc)


def _query_failed(running: RunningPipeline, failure: BaseException, leases: dict[str, HeldLease]) -> KrishivError:
    """``query <name> failed: <cause>``; when every start timed out waiting for Spark's Python worker, or the source's
    Python process died at every start, with the runbook's section. A :class:`LedgerOutage` when the stager stopped
    because the ledger could not be written, or because its lease expired while renewals could not reach it. A query
    whose stager lost its lease says so (``StagerLeaseLost``), whatever Spark failed on."""
    from spark_jobs.job import source_process_loss, worker_start_timed_out

    pointer = f" {WORKER_START_RUNBOOK}" if worker_start_timed_out(failure) else ""
    message = f"query {running.query.name} failed: {_root_cause(failure)}{pointer}"
    said = source_process_loss(failure)
    if said is not None:
        message = (
            f"query {running.query.name} failed: the Python process of its Kafka source died again (Spark said: "
            f"{said}) {SOURCE_DIED_RUNBOOK}"
        )
    cause, lease = running.stager.failure, leases[running.stager.pipeline.name]
    if cause is None:  # Spark's own: fenced off, a run fails on the checkpoint logs the new holder wrote
        try:
            lease.check_ledger()
        except StagerLeaseLost as lost:
            cause, message = lost, f"query {running.query.name} failed: {type(lost).__name__}: {lost}"
    if isinstance(cause, StagerLeaseLost) and ledger_outage(lease.lost_to):
        cause = lease.lost_to
    if cause is not None and ledger_outage(cause):
        return LedgerOutage(message)
    return KrishivError(message)


def run_pipelines(
    spec: KrishivSpec,
    pipelines: list[PipelineSpec],
    *,
    once: bool,
    clients: RunClients | None = None,
    holder: str = "krishiv run",
    reporter: BatchReporter | None = None,
    progress: Progress | None = None,
    stop_on_signals: bool = False,
    stop_when: Callable[[], bool] | None = None,
    commit: bool = True,
    on_commit: CommitReporter | None = None,
) -> list[RunningPipeline]:
    """Run the pipelines' streaming queries, each under its stager lease.

    With ``once`` (``AvailableNow``), return when the data present at start is staged; otherwise run until
    SIGTERM or Ctrl-C. Raises :class:`StagerBusy` if another live process runs one of the pipelines.
    ``clients``: the ledger, catalog and Spark session the caller has (:class:`RunClients`); the missing ones are the
    spec's (the session built once the leases are held). ``progress`` is told when Spark starts and each query
    starts. With ``stop_on_signals`` (the CLI), SIGINT and SIGTERM stop a one-shot run between batches too
    (:class:`RunInterrupted`); a second one ends the process at once. Signals are only handled in the main thread,
    and a continuous run always stops on them. ``stop_when`` (continuous mode): asked every half second; once it
    returns True the queries stop between batches, as on SIGTERM, and the run returns (a Dagster staging run that
    lingers while events arrive).

    A continuous run with ``commit`` (the default) commits too: a :class:`~outbox.committer.Committer` with a
    catalog of its own (the spec's) commits every table of the pipelines as soon as a batch is staged, and once
    more after the queries stop; ``on_commit`` gets its reports, ``progress`` a line per outage or refusal. A table
    it stopped committing is :class:`CommitsStopped` at the end. A one-shot run only stages (``krishiv commit``
    and the Dagster commit step publish).
    """
    from krishiv.preflight import check_history, check_new_catalog, check_topic_unchanged, check_topics

    given = clients or RunClients()
    say = progress or (lambda _line: None)
    warn_above = reject_rate_warn()  # a setting that is not a share is one line now, not after Spark's start-up
    ledger = given.ledger if given.ledger is not None else open_writable_ledger(spec)
    # A broker, topic or catalog that is not there is one line now, not a failed query after Spark's start-up.
    if given.spark is None:
        check_topics(spec, pipelines)
    if given.catalog is None:
        check_new_catalog(spec, pipelines, ledger, say)

    from pyspark.errors import StreamingQueryException  # seconds of imports: after the checks

    from krishiv_core.catalog import load_catalog
    from outbox.lease import LEASE_TTL_S, stager_lease
    from spark_jobs.job import check_checkpoint, stop_between_batches
    from spark_jobs.session import build_session
    from spark_jobs.window_state import check_output_mode

    committing = commit and not once
    with ExitStack() as stack:
        ttl_s = seconds_from_env(STAGER_LEASE_TTL_ENV, LEASE_TTL_S)
        leases = {
            p.name: stack.enter_context(stager_lease(ledger, p.name, holder, ttl_s, committing=committing))
            for p in pipelines
        }
        catalog = load_catalog(spec) if given.catalog is None else given.catalog
        check_topic_unchanged(pipelines, ledger)
        check_history(catalog, spec, pipelines, ledger)  # the ledger and the tables tell one history
        for p in pipelines:  # a table the spec cannot evolve, or a change unsafe now, is refused before Spark starts
            check_output_mode(p, check_checkpoint(spec, p, ledger))
            ensure_tables(spec, p, catalog, ledger)
        committer = _start_committer(spec, pipelines, ledger, on_commit, say, holder) if committing else None
        outage: list[LedgerOutage] = []  # the ledger is away: no final pass, the leases left (see LedgerOutage)
        if committer is not None:  # a final pass once the queries have stopped (callbacks run last in, first out)
            stack.callback(lambda: committer.stop(0.0) if outage else committer.stop())
        spark = given.spark
        if spark is None:
            say(f"starting Spark (master {spec.spark.master})")
            spark = build_session(spec)
        queries = QuerySupervisor(
            spec,
            ReadyClients(ledger, catalog, spark),
            leases,
            committer,
            once=once,
            on_batch=lambda name: _waking(committer, reporter(name) if reporter else None),
            reject_rate_warn=warn_above,
            say=say,
        )
        running = queries.running
        # From here on a signal is a request to stop (PySpark's own handler would make a py4j call inside it).
        with _stop_requests(stop_on_signals or not once, say) as requested:
            try:
                if not once:  # a shared session's earlier queries would end the wait below at once
                    spark.streams.resetTerminated()
                for p in pipelines:
                    if requested.is_set():
                        break
                    queries.start(p)
                    say(f"query {p.name} started; waiting for its first batch")
                    if len(pipelines) > 1:
                        _wait_for_source(running[-1])
                if once:
                    # Every query is looked at in turn, so one that failed to start is started again at once, not
                    # after the queries before it have read their topics.
                    left = list(range(len(running)))
                    while left and not requested.is_set():
                        for i in list(left):
                            try:
                                if running[i].query.awaitTermination(_POLL_S / len(left)):
                                    left.remove(i)
                            except StreamingQueryException as exc:
                                if not queries.restarted(i):
                                    raise _query_failed(running[i], exc, leases) from exc
                else:
                    while True:
                        try:
                            while not requested.is_set() and not spark.streams.awaitAnyTermination(_POLL_S):
                                if stop_when is not None and stop_when():
                                    break
                            break
                        except StreamingQueryException:
                            if [i for i in range(len(running)) if queries.restarted(i)]:
                                spark.streams.resetTerminated()
                                continue
                            break  # named below, from the query that failed
                for r in running:
                    if requested.is_set():
                        _stop_after_the_batch_in_flight(r.query)
                    stop_between_batches(r.query)
                if once and requested.is_set():
                    raise RunInterrupted(requested.signal_name)
            except BaseException:
                for r in running:  # no query stages on once its stager lease is released below
                    stop_between_batches(r.query)
                raise
        for r in running:
            if r.query.exception() is not None:
                failed = _query_failed(r, r.query.exception(), leases)
                if isinstance(failed, LedgerOutage):
                    failed.running = running
                    outage.append(failed)
                    for held in leases.values():
                        held.leave()
                raise failed
    if committer is not None and (committer.failures or committer.error):
        failures = dict(committer.failures)
        if committer.error:
            failures["every table"] = committer.error
        raise CommitsStopped(running, failures)
    return running


def _start_committer(
    spec: KrishivSpec,
    pipelines: list[PipelineSpec],
    ledger: Ledger,
    on_commit: CommitReporter | None,
    say: Progress,
    committed_by: str,
) -> Committer:
    """A committer for every table of ``pipelines``, started: its first pass commits what an earlier run left. The
    ledger records each of its commits as made by ``committed_by``, the lease holder's name (``krishiv run``, or
    ``dagster run <run id>`` for a lingering staging run).

    Its catalog is its own, built from the spec in its thread: the queries' catalog is used by Spark's
    ``foreachBatch`` thread, and a REST catalog's HTTP session is not safe to share between threads."""
    from krishiv_core.catalog import load_catalog, qualified, redact
    from outbox.committer import Committer
    from outbox.relay import CommitRelay

    relay = CommitRelay(ledger, lambda: load_catalog(spec), redact(spec.catalog_uri()), committed_by=committed_by)
    tables = [qualified(spec, t) for p in pipelines for t in p.all_tables]
    tables += [t for t in ledger.pending_tables([p.name for p in pipelines]) if t not in tables]  # a removed route's
    committer = Committer(relay, tables, on_report=on_commit, progress=say)
    committer.start()
    return committer


def _waking(
    committer: Committer | None, report: Callable[[StagedBatch], None] | None
) -> Callable[[StagedBatch], None] | None:
    """The per-batch callback: wake the committer first (its pass runs while the line is printed), then report."""
    if committer is None:
        return report

    def staged(batch: StagedBatch) -> None:
        if batch.recorded:
            committer.wake()
        if report is not None:
            report(batch)

    return staged


def _stop_after_the_batch_in_flight(query: StreamingQuery, timeout_s: float = 120.0) -> None:
    """Stop ``query`` as soon as no batch is running or the one running has finished (its progress is reported
    after Spark's commit log is written). ``AvailableNow`` starts the next batch at once, so waiting for an idle
    trigger alone would let it run to the end of the topic."""
    deadline = time.monotonic() + timeout_s
    running = _progress_batch(query)
    while query.isActive and time.monotonic() < deadline:
        if not query.status["isTriggerActive"] or _progress_batch(query) != running:
            break
        time.sleep(0.02)
    query.stop()


def _progress_batch(query: StreamingQuery) -> int | None:
    progress = query.lastProgress
    return None if progress is None else int(progress["batchId"])


def _kill_spark_driver() -> None:
    """Kill the JVM PySpark launched, before this process ends at once: left alone, it would log the Python side's
    disappearance mid-batch as a Java stack trace on the same terminal."""
    from pyspark import SparkContext

    process = getattr(SparkContext._gateway, "proc", None)
    if process is not None:
        process.kill()


#: How often the waiting driver looks for a stop request (seconds): the signal handler only sets a flag, since a
#: py4j call made inside it would interleave with the main thread's call in flight on the same connection.
_POLL_S = 0.5


class _StopRequest(threading.Event):
    signal_name = ""


@contextmanager
def _stop_requests(handle: bool, say: Progress) -> Iterator[_StopRequest]:
    """A flag set by the first SIGINT or SIGTERM while inside (when ``handle`` and in the main thread); the second
    one ends the process at once (the batch in flight is replayed by the next run). The previous handlers, such
    as PySpark's, which cancels every job and raises ``KeyboardInterrupt`` into a py4j call, come back after."""
    requested = _StopRequest()
    if not handle or threading.current_thread() is not threading.main_thread():
        yield requested
        return

    def on_signal(signum: int, _frame: object) -> None:
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if requested.is_set():
            say(f"{name} again: stopping at once; the batch in flight is replayed by the next run")
            _kill_spark_driver()
            os._exit(128 + signum)
        requested.signal_name = name
        requested.set()
        again = " (Ctrl-C again stops at once)" if signum == signal.SIGINT else ""
        say(f"{name}: stopping after the batch in flight{again}")

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield requested
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


#: How long a query's source may take to start before the next query starts anyway.
SOURCE_START_WAIT_S = 120.0


def _wait_for_source(running: RunningPipeline) -> None:
    """Wait until the query's source is up (Spark handed the sink a batch, or finished a trigger) or the query
    stopped, before the next query starts.

    Each query's Python source starts a Python process that must connect back to Spark within a hard-coded
    10 s (``PythonWorkerFactory.createSimpleWorker``); started together on a loaded 2-core machine, several
    queries' processes miss it and the query fails. One at a time, they do not compete. The batch itself is not
    waited for: it may take long, or be paused.
    """
    deadline = time.monotonic() + SOURCE_START_WAIT_S
    query = running.query
    while (
        query.isActive
        and not running.stager.called.is_set()
        and query.lastProgress is None
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)


def removed_pipelines_pending(spec: KrishivSpec, ledger: Ledger) -> list[str]:
    """The pipelines the spec no longer has whose batches the ledger holds PENDING, in name order: what
    ``krishiv commit`` (without ``--pipeline``) and Dagster's removed-pipelines commit run commit, each batch to
    the tables it was staged for, and what ``krishiv status`` lists apart."""
    known = {p.name for p in spec.pipelines}
    return [name for name in ledger.pending_pipelines() if name not in known]


def commit_pipelines(
    spec: KrishivSpec,
    pipelines: list[PipelineSpec],
    *,
    catalog: Catalog | None = None,
    ledger: Ledger | None = None,
    committed_by: str = "krishiv commit",
    removed_pipelines: bool = False,
) -> list[TableCommitReport]:
    """Phase 2 for the pipelines' tables: promote their pending entries, in order; then keep the ledger small.

    The tables are the pipelines' tables in the spec, then every other table the ledger holds PENDING entries of
    the pipelines' batches for (a route or a table removed from the spec since: an entry is committed to the table
    it was staged for, whatever the spec says now); with ``removed_pipelines``, also those of pipelines the spec no
    longer has. A table that refuses stops only itself: every other table is still committed, and then
    :class:`TablesRefused` names each refused table (its ``reports`` hold every table's report).

    ``catalog`` and ``ledger`` default to the spec's; the spec's catalog is loaded only if there is work.
    ``committed_by`` is recorded in the ledger with each commit (a Dagster run names itself).
    """
    from krishiv_core.catalog import load_catalog, qualified, redact
    from outbox.relay import CommitRelay

    ledger = open_ledger(spec) if ledger is None else ledger
    if catalog is None:
        relay = CommitRelay(ledger, lambda: load_catalog(spec), redact(spec.catalog_uri()), committed_by)
    else:
        relay = CommitRelay(ledger, catalog, _catalog_address(catalog), committed_by)
    tables = [qualified(spec, t) for p in pipelines for t in p.all_tables]
    names = [p.name for p in pipelines]
    if removed_pipelines:
        names += removed_pipelines_pending(spec, ledger)
    tables += [t for t in ledger.pending_tables(names) if t not in tables]
    reports = relay.run(tables)
    ledger.compact_if_due()  # committed entries past the retention fold into per-query totals, hourly at most
    if any(r.refused for r in reports):
        raise TablesRefused(reports)
    return reports


def verify_pipelines(
    spec: KrishivSpec, pipelines: list[PipelineSpec], *, catalog: Catalog | None = None, ledger: Ledger | None = None
) -> list[Verification]:
    """The exactly-once invariants of every table of each pipeline (``pipeline.all_tables``: its row tables, a
    fan-out's routes among them, then its rejects table), each checked by its row key and commit operation; an
    events pipeline with Kafka coordinates also has each offset in one table at most (``catalog``, ``ledger``:
    the spec's unless given). A pipeline's first table also carries the records its batches read and rejected, and
    a warning when its recent batches are mostly rejects."""
    from krishiv.inputs import load_table
    from krishiv.reject_storms import pipeline_warning
    from krishiv.verify import beyond_incarnations, checks_offsets, offset_violations, repeated_offsets, verify_output
    from krishiv_core.catalog import load_catalog, qualified
    from krishiv_core.tables import output_tables

    warn_above = reject_rate_warn()
    ledger = open_ledger(spec) if ledger is None else ledger
    catalog = load_catalog(spec) if catalog is None else catalog
    address = _catalog_address(catalog)
    results = []
    for p in pipelines:
        outputs = output_tables(p)
        tables = {qualified(spec, o.name): load_table(catalog, qualified(spec, o.name), address) for o in outputs}
        verified = [
            verify_output(tables[qualified(spec, o.name)], qualified(spec, o.name), ledger, p, o) for o in outputs
        ]
        if checks_offsets(p):  # an event in two tables (two routes, or a route and the rejects) is counted twice
            repeats = repeated_offsets(tables, rejects=qualified(spec, p.rejects_table))
            repeats = beyond_incarnations(repeats, ledger, p)
            for v in verified:
                v.violations += offset_violations(repeats, v.table)
        # How many records its batches read and rejected; a storm is said (a warning: the tables are exactly-once).
        first, summary = verified[0], ledger.table_summary(verified[0].table, pipeline=p.name)
        first.records_read, first.rejects = summary.records_read, summary.rejects
        recent = ledger.recent_rejects(first.table, pipeline=p.name)
        storm = pipeline_warning(recent, warn_above, qualified(spec, p.rejects_table))
        if storm:
            first.warnings.append(storm)
        results += verified
    return results
