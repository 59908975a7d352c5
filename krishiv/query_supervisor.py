"""The clients a run works with, and the queries it keeps running with them.

:class:`RunClients` is what ``run_pipelines`` (:mod:`krishiv.operations`) is handed or builds from the spec: the
ledger, the catalog and the Spark session, built once per run and passed down as one object. :class:`QuerySupervisor`
starts each pipeline's query with them and starts a failed one again where a new start is the cure: Spark's Python
worker that did not connect back in time, or the lost Python process of the Kafka source (each a bounded number of
times), and a batch that met a newer schema version or new topics matching the pipeline's ``topic_pattern`` (the
pipeline read again from the spec, its new tables made first). The run's counts go on across each start.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from krishiv_core.runbook import runbook
from krishiv_core.spec import KrishivSpec, PipelineSpec, with_latest_fields
from outbox.ledger import Ledger

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession

    from outbox.committer import Committer
    from outbox.lease import HeldLease
    from spark_jobs.job import RunningPipeline
    from spark_jobs.staging import StagedBatch

#: The runbook section of a query whose Python worker did not connect back in time.
WORKER_START_RUNBOOK = runbook("A query that did not start in time")
#: The runbook section of a query whose Kafka source's Python process died.
SOURCE_DIED_RUNBOOK = runbook("A query whose source process died")
#: The runbook section of a batch whose records have fields of a newer schema version.
NEW_FIELDS_RUNBOOK = runbook("A schema version with new fields")


@dataclass
class RunClients:
    """The ledger, the Iceberg catalog and the Spark session of one run.

    A caller hands over the ones it already has (the Dagster resources' clients, a test's session); ``run_pipelines``
    opens the missing ledger at once, loads the missing catalog once the stager leases are held, and builds the
    missing session after that, so a run that is refused never starts Spark.
    """

    ledger: Ledger | None = None
    catalog: Catalog | None = None
    spark: SparkSession | None = None


@dataclass(frozen=True)
class ReadyClients:
    """Every client of a run, built."""

    ledger: Ledger
    catalog: Catalog
    spark: SparkSession


def ensure_tables(spec: KrishivSpec, pipeline: PipelineSpec, catalog: Catalog, ledger: Ledger) -> None:
    """Create the pipeline's missing tables; their schema is evolved at the first commit (a table with pending
    batches keeps the schema they were staged with until they are committed)."""
    from krishiv_core.catalog import ensure_pipeline_tables

    ensure_pipeline_tables(
        catalog, spec, pipeline, pending=lambda t: len(ledger.pending_batches([t])), defer_schema=True
    )


class QuerySupervisor:
    """Starts the pipelines' queries and, when one fails, starts it again if a new start is the cure."""

    def __init__(
        self,
        spec: KrishivSpec,
        clients: ReadyClients,
        leases: dict[str, HeldLease],
        committer: Committer | None,
        *,
        once: bool,
        on_batch: Callable[[str], Callable[[StagedBatch], None] | None],
        reject_rate_warn: float,
        say: Callable[[str], None],
    ) -> None:
        self.spec, self.clients, self.leases, self.committer = spec, clients, leases, committer
        self.once, self.on_batch, self.reject_rate_warn, self.say = once, on_batch, reject_rate_warn, say
        self.running: list[RunningPipeline] = []
        self._pipelines: dict[str, PipelineSpec] = {}
        self._restarts: Counter[tuple[str, str]] = Counter()  # (query, why) -> starts again so far

    def start(self, pipeline: PipelineSpec) -> RunningPipeline:
        """Start ``pipeline``'s query and keep it among :attr:`running`."""
        running = self._started(pipeline)
        self.running.append(running)
        return running

    def restarted(self, i: int) -> bool:
        """Start ``running[i]`` again if its query failed only because Spark's Python worker did not connect back
        within Spark's fixed limit (a loaded machine: nothing was read or staged), because the Python process of its
        Kafka source died (its checkpoint replays what it had not finished), or because its pipeline reads
        differently now (:meth:`_read_again`)."""
        from spark_jobs.job import (
            SOURCE_RESTART_ATTEMPTS,
            WORKER_START_ATTEMPTS,
            new_writer_schema,
            source_process_loss,
            topics_appeared,
            worker_start_timed_out,
        )

        name = self.running[i].query.name
        failure = self.running[i].query.exception()
        if failure is None:
            return False
        if new_writer_schema(failure) or topics_appeared(failure):
            return self._read_again(i)
        if worker_start_timed_out(failure):
            why, attempts = "worker start", WORKER_START_ATTEMPTS
        elif (said := source_process_loss(failure)) is not None:
            why, attempts = "source process", SOURCE_RESTART_ATTEMPTS
        else:
            return False
        if self._restarts[(name, why)] >= attempts - 1:
            return False
        self._restarts[(name, why)] += 1
        again = f"starting the query again ({self._restarts[(name, why)] + 1} of {attempts})"
        if why == "worker start":
            self.say(
                f"query {name}: Spark's Python worker did not connect back within Spark's 10 s "
                f"(a loaded machine?); {again} {WORKER_START_RUNBOOK}"
            )
        else:
            self.say(
                f"query {name}: the Python process of its Kafka source died (Spark said: {said}); "
                f"{again}, from its checkpoint {SOURCE_DIED_RUNBOOK}"
            )
        self._start_again(i, self._pipelines[name])
        return True

    def _read_again(self, i: int) -> bool:
        """Start ``running[i]`` again with its fields read again from the registry, when a batch stopped on records
        of a newer schema version, and its ``topic_pattern`` matched again, when new topics match it (their tables
        created first): the query starts again from its checkpoint, and a commit adds the new columns. Not when the
        pipeline read again is the same (the failure stands)."""
        from krishiv_core.catalog import qualified

        old = self._pipelines[self.running[i].query.name]
        newer = with_latest_fields(self.spec, old, os.environ)
        if newer == old:
            return False
        new_topics = {m.topic: m.table for m in newer.members if m.topic not in old.topics}
        if new_topics:
            ensure_tables(self.spec, newer, self.clients.catalog, self.clients.ledger)
            if self.committer is not None:
                self.committer.watch([qualified(self.spec, t) for t in newer.all_tables])
            self.say(
                f"query {old.name}: new topics match its topic_pattern: "
                + ", ".join(f"{topic} (table {table})" for topic, table in new_topics.items())
                + "; their tables are created and the query starts again from its checkpoint"
            )
        else:
            known = {f.name for m in (old, *old.members) for f in m.fields}
            added = sorted({f.name for m in (newer, *newer.members) for f in m.fields} - known)
            self.say(
                f"query {old.name}: a batch holds records of a newer schema version; starting the query again with "
                f"the fields of its subject's latest version (new: {', '.join(added) or 'none'}), from its "
                f"checkpoint {NEW_FIELDS_RUNBOOK}"
            )
        self._start_again(i, newer)
        return True

    def _start_again(self, i: int, pipeline: PipelineSpec) -> None:
        before = self.running[i].stager.history
        self.running[i] = self._started(pipeline)
        self.running[i].stager.history[:0] = before  # the run's counts go on across the start

    def _started(self, pipeline: PipelineSpec) -> RunningPipeline:
        from spark_jobs.job import start_pipeline

        self._pipelines[pipeline.name] = pipeline
        return start_pipeline(
            self.clients.spark,
            self.spec,
            pipeline,
            self.clients.catalog,
            self.clients.ledger,
            once=self.once,
            on_batch=self.on_batch(pipeline.name),
            lease=self.leases[pipeline.name],
            reject_rate_warn=self.reject_rate_warn,
        )
