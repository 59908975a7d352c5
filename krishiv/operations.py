"""The pipeline's operations behind the CLI, the demo and the Dagster assets: stage, commit, verify.

Each takes the spec (the pipelines, the table names, the Spark query's settings) and, optionally, the clients
it works with: the Iceberg catalog, the outbox ledger, the Spark session. The CLI passes none, and each is
opened from the spec (its addresses from the spec file and the environment); the Dagster assets pass their
resources' clients. Every entry point runs the same code.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import TYPE_CHECKING

from krishiv_core.errors import ConfigError, KrishivError
from krishiv_core.spec import KrishivSpec, PipelineSpec
from outbox.ledger import DEFAULT_LOCK_TIMEOUT_S, Ledger

if TYPE_CHECKING:  # Spark and pyiceberg load only when an operation runs, keeping `krishiv status` quick
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession

    from krishiv.verify import Verification
    from outbox.relay import TableCommitReport
    from spark_jobs.job import RunningPipeline
    from spark_jobs.staging import StagedBatch

#: Builds the per-batch progress callback of a pipeline, by pipeline name.
BatchReporter = Callable[[str], Callable[["StagedBatch"], None]]


#: How long a command waits for a ledger another process holds (seconds; default 30).
LEDGER_LOCK_TIMEOUT_ENV = "KRISHIV_LEDGER_LOCK_TIMEOUT_S"


#: How long a stager's lease lasts unless renewed (seconds; default 30): how soon a paused stager is fenced off.
STAGER_LEASE_TTL_ENV = "KRISHIV_STAGER_LEASE_TTL_S"


def _seconds_from_env(variable: str, default: float) -> float:
    raw = os.environ.get(variable)
    if not raw:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        raise ConfigError(variable, f"expected a number of seconds, got {raw!r}") from None
    if not seconds > 0:
        raise ConfigError(variable, f"expected a positive number of seconds, got {raw!r}")
    return seconds


def ledger_lock_timeout_s() -> float:
    """How long a ledger call waits for another process's lock: ``KRISHIV_LEDGER_LOCK_TIMEOUT_S``, else 30 s."""
    return _seconds_from_env(LEDGER_LOCK_TIMEOUT_ENV, DEFAULT_LOCK_TIMEOUT_S)


def open_ledger(spec: KrishivSpec) -> Ledger:
    """The spec's ledger (``storage.ledger_path``, relative to the spec file's folder)."""
    return Ledger(spec.resolve(spec.storage.ledger_path), ledger_lock_timeout_s())


def _catalog_address(catalog: Catalog) -> str:
    """How a catalog may be named in a message: its URI, redacted."""
    from krishiv_core.catalog import redact

    return redact(str(catalog.properties.get("uri", catalog.name)))


#: A Krishiv exception as Python prints it at the end of a traceback Spark carries: ``spark_jobs.errors.X: message``.
_KRISHIV_ERROR_LINE = re.compile(r"^(?:spark_jobs|outbox|krishiv)(?:\.\w+)*\.(\w+): (.+)$")


def _root_cause(exc: BaseException) -> str:
    """``Class: message`` of the Krishiv error in a Spark failure, else Spark's first line."""
    text = str(exc)
    for line in text.splitlines():
        found = _KRISHIV_ERROR_LINE.match(line.strip())
        if found:
            return f"{found.group(1)}: {found.group(2)}"
    return text.splitlines()[0] if text else repr(exc)


def run_pipelines(
    spec: KrishivSpec,
    pipelines: list[PipelineSpec],
    *,
    once: bool,
    spark: SparkSession | None = None,
    catalog: Catalog | None = None,
    ledger: Ledger | None = None,
    holder: str = "krishiv run",
    reporter: BatchReporter | None = None,
) -> list[RunningPipeline]:
    """Run the pipelines' streaming queries, each under its stager lease.

    With ``once`` (``AvailableNow``), return when the data present at start is staged; otherwise run until
    SIGTERM or Ctrl-C. Raises :class:`StagerBusy` if another live process runs one of the pipelines.
    ``spark``, ``catalog`` and ``ledger`` default to the spec's (the session built once the leases are held).
    """
    from pyspark.errors import StreamingQueryException

    from krishiv_core.catalog import ensure_pipeline_tables, load_catalog
    from outbox.lease import LEASE_TTL_S, stager_lease
    from spark_jobs.job import start_pipeline, stop_between_batches
    from spark_jobs.session import build_session

    ledger = open_ledger(spec) if ledger is None else ledger
    with ExitStack() as stack:
        ttl_s = _seconds_from_env(STAGER_LEASE_TTL_ENV, LEASE_TTL_S)
        leases = {p.name: stack.enter_context(stager_lease(ledger, p.name, holder, ttl_s)) for p in pipelines}
        catalog = load_catalog(spec) if catalog is None else catalog
        for p in pipelines:  # a table the spec cannot evolve is refused before Spark's JVM starts
            ensure_pipeline_tables(catalog, spec, p, pending=lambda t: len(ledger.pending_batches([t])))
        spark = build_session(spec) if spark is None else spark
        running: list[RunningPipeline] = []
        try:
            for p in pipelines:
                running.append(
                    start_pipeline(
                        spark,
                        spec,
                        p,
                        catalog,
                        ledger,
                        once=once,
                        on_batch=reporter(p.name) if reporter else None,
                        lease=leases[p.name],
                    )
                )
                if len(pipelines) > 1:
                    _wait_for_source(running[-1])
            if once:
                for r in running:
                    try:
                        r.query.awaitTermination()
                    except StreamingQueryException as exc:
                        raise KrishivError(f"query {r.query.name} failed: {_root_cause(exc)}") from exc
            else:

                def stop(*_: object) -> None:
                    for r in running:
                        stop_between_batches(r.query)

                signal.signal(signal.SIGTERM, stop)
                try:
                    spark.streams.awaitAnyTermination()
                except KeyboardInterrupt:
                    stop()
                except StreamingQueryException:
                    stop()
        except BaseException:
            for r in running:  # no query stages on once its stager lease is released below
                stop_between_batches(r.query)
            raise
        for r in running:
            if r.query.exception() is not None:
                raise KrishivError(f"query {r.query.name} failed: {_root_cause(r.query.exception())}")
    return running


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


def commit_pipelines(
    spec: KrishivSpec, pipelines: list[PipelineSpec], *, catalog: Catalog | None = None, ledger: Ledger | None = None
) -> list[TableCommitReport]:
    """Phase 2 for the pipelines' tables: promote their pending entries, in order; then keep the ledger small.

    ``catalog`` and ``ledger`` default to the spec's; the spec's catalog is loaded only if there is work.
    """
    from krishiv_core.catalog import load_catalog, qualified, redact
    from outbox.relay import CommitRelay

    ledger = open_ledger(spec) if ledger is None else ledger
    if catalog is None:
        relay = CommitRelay(ledger, lambda: load_catalog(spec), redact(spec.catalog_uri()))
    else:
        relay = CommitRelay(ledger, catalog, _catalog_address(catalog))
    reports = relay.run([qualified(spec, t) for p in pipelines for t in p.all_tables])
    ledger.compact_if_due()  # committed entries past the retention fold into per-query totals, hourly at most
    return reports


def verify_pipelines(
    spec: KrishivSpec, pipelines: list[PipelineSpec], *, catalog: Catalog | None = None, ledger: Ledger | None = None
) -> list[Verification]:
    """The exactly-once invariants of every table of each pipeline (``pipeline.all_tables``: its row tables, a
    fan-out's routes among them, then its rejects table), each checked by its row key and commit operation; an
    events pipeline with Kafka coordinates also has each offset in one table at most (``catalog``, ``ledger``:
    the spec's unless given)."""
    from krishiv.verify import checks_offsets, offset_violations, repeated_offsets, verify_output
    from krishiv_core.catalog import load_catalog, qualified
    from krishiv_core.tables import output_tables

    catalog = load_catalog(spec) if catalog is None else catalog
    ledger = open_ledger(spec) if ledger is None else ledger
    results = []
    for p in pipelines:
        outputs = output_tables(p)
        tables = {qualified(spec, o.name): catalog.load_table(qualified(spec, o.name)) for o in outputs}
        verified = [
            verify_output(tables[qualified(spec, o.name)], qualified(spec, o.name), ledger, p, o) for o in outputs
        ]
        if checks_offsets(p):  # an event in two tables (two routes, or a route and the rejects) is counted twice
            repeats = repeated_offsets(tables, rejects=qualified(spec, p.rejects_table))
            for v in verified:
                v.violations += offset_violations(repeats, v.table)
        results += verified
    return results
