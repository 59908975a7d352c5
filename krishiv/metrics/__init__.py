"""Operational metrics of the pipelines, from one OpenTelemetry instrumentation, exported where operators look.

* OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``…_METRICS_ENDPOINT``) is set; OpenTelemetry's own variables
  give the headers, interval (``OTEL_METRIC_EXPORT_INTERVAL``), timeout, temporality and resource
  (``OTEL_SERVICE_NAME``, default ``krishiv``). The last values are exported when the command ends, so a short
  ``krishiv commit`` reports too.
* A Prometheus endpoint on request (``--metrics-port`` / ``KRISHIV_METRICS_PORT``), bound to ``127.0.0.1`` unless
  ``KRISHIV_METRICS_HOST`` says otherwise.

The instruments (Prometheus names; labels never hold an address, a URI or any setting, so no secret):

=====================================  ==========================  =============================================
metric                                 labels                      what
=====================================  ==========================  =============================================
krishiv_consumer_lag                   pipeline, topic, partition  high watermark − end of the newest staged batch
krishiv_commit_lag                     pipeline, topic, partition  high watermark − end of the newest committed one
krishiv_entries_pending                pipeline, table             ledger entries waiting for the relay
krishiv_entries_committed              pipeline, table             ledger entries committed (archive included)
krishiv_freshness_seconds              pipeline, table             now − newest event time the table received
krishiv_batches_staged_total           pipeline                    batches this process recorded in the ledger
krishiv_records_read_total             pipeline                    Kafka records those batches read
krishiv_rejects_total                  pipeline                    of them, rejected (to ``<table>_rejects``)
krishiv_late_events_total              pipeline                    of them, late (windowed; kept in ``<table>_rejects``)
krishiv_batches_committed_total        pipeline, table             snapshots this process committed
krishiv_commit_latency_seconds         pipeline, table             histogram: one catalog commit
=====================================  ==========================  =============================================

The gauges show what a thread reads from the ledger (through the process's own :class:`~outbox.ledger.Ledger`) and
the broker every ``KRISHIV_METRICS_REFRESH_S`` (5 s), so a scrape is cheap; see :mod:`krishiv.metrics.readings`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from krishiv.metrics.readings import LedgerReader, Readings, newest_in_parquet
from krishiv.metrics.settings import MetricsSettings, metrics_settings
from krishiv_core.spec import KrishivSpec, PipelineSpec
from outbox.ledger import Ledger

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Observation

    from outbox.relay import TableCommitReport
    from spark_jobs.staging import StagedBatch

__all__ = ["Metrics", "MetricsSettings", "metrics_settings", "start_metrics"]

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "krishiv"
#: Commit latency buckets (seconds): a fast append takes tens of ms, a merge or a remote catalog up to seconds.
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: How long the final export on exit may take (ms) before the command ends anyway.
SHUTDOWN_TIMEOUT_MS = 10_000


class Metrics:
    """The process's instruments and exporters; a context manager that flushes and stops them on exit.

    Hooks: :meth:`batch_reporter` or :meth:`chain` (per staged batch), :meth:`record_commits` (the relay's reports).
    The gauges need no hook: a thread reads the ledger (through ``ledger``, the object the process stages or commits
    with) and the broker every ``refresh_s`` while something exports.
    """

    def __init__(
        self,
        spec: KrishivSpec,
        pipelines: Sequence[PipelineSpec],
        ledger: Ledger,
        settings: MetricsSettings,
        latest: Callable[[str], Mapping[str, int]] | None = None,
    ) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

        from krishiv_core.catalog import qualified

        self.settings = settings
        self.address: tuple[str, int] | None = None  # where the Prometheus endpoint listens
        self._pipeline_of = {qualified(spec, t): p.name for p in pipelines for t in p.all_tables}
        self.reader = LedgerReader(
            spec, pipelines, ledger, latest or _broker_watermarks(spec), _staged_files(spec), settings.refresh_s
        )
        readers: list[Any] = []
        self._server: Any = None
        if settings.port is not None:  # first: a port that is taken stops here, before any thread starts
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader

            from krishiv.metrics.prometheus import serve

            in_memory = InMemoryMetricReader()
            readers.append(in_memory)
            self._server, _thread = serve(in_memory, settings.host, settings.port)
            self.address = (str(self._server.server_address[0]), int(self._server.server_port))
        self._otlp: Any = None
        if settings.otlp:
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            from krishiv.metrics.otlp import QuietOtlpExporter

            self._otlp = QuietOtlpExporter()
            readers.append(PeriodicExportingMetricReader(self._otlp))
        latency = View(
            instrument_name="krishiv_commit_latency_seconds",
            aggregation=ExplicitBucketHistogramAggregation(LATENCY_BUCKETS_S),
        )
        self.provider = MeterProvider(metric_readers=readers, resource=_resource(), views=[latency])
        self._closed = False
        meter = self.provider.get_meter("krishiv")
        self._batches = meter.create_counter(
            "krishiv_batches_staged", unit="{batch}", description="batches this process recorded in the ledger"
        )
        self._records = meter.create_counter(
            "krishiv_records_read", unit="{record}", description="Kafka records the staged batches read"
        )
        self._rejects = meter.create_counter(
            "krishiv_rejects", unit="{record}", description="records rejected into the rejects table"
        )
        self._late = meter.create_counter(
            "krishiv_late_events", unit="{record}", description="late events, kept as rejects (windowed pipelines)"
        )
        self._committed = meter.create_counter(
            "krishiv_batches_committed", unit="{batch}", description="snapshots this process committed"
        )
        self._latency = meter.create_histogram(
            "krishiv_commit_latency_seconds", unit="s", description="one batch's catalog commit, in seconds"
        )
        if settings.enabled:
            self.reader.start()
        for name, description, callback in (
            ("krishiv_consumer_lag", "high watermark minus the end of the newest staged batch", self._consumer_lag),
            ("krishiv_commit_lag", "high watermark minus the end of the newest committed batch", self._commit_lag),
            ("krishiv_entries_pending", "ledger entries waiting for the commit relay", self._pending),
            ("krishiv_entries_committed", "ledger entries committed, archive included", self._entries_committed),
            ("krishiv_freshness_seconds", "now minus the newest event time the table received", self._freshness),
        ):
            meter.create_observable_gauge(name, callbacks=[callback], description=description)

    # ------------------------------------------------------------------------------------ hooks

    def batch_reporter(self, pipeline: str) -> Callable[[StagedBatch], None]:
        """The per-batch callback of ``pipeline``'s stager: counts the batches it recorded (a replay counts none)."""
        labels = {"pipeline": pipeline}

        def report(batch: StagedBatch) -> None:
            if not batch.recorded:
                return
            self._batches.add(1, labels)
            self._records.add(batch.records_read, labels)
            self._rejects.add(batch.rejects, labels)
            self._late.add(batch.late_events, labels)

        return report

    def chain(
        self, reporter: Callable[[str], Callable[[StagedBatch], None]] | None
    ) -> Callable[[str], Callable[[StagedBatch], None]]:
        """A :data:`krishiv.operations.BatchReporter` counting the batch, then calling ``reporter``'s callback (the
        CLI's print)."""

        def build(pipeline: str) -> Callable[[StagedBatch], None]:
            first = reporter(pipeline) if reporter is not None else None
            ours = self.batch_reporter(pipeline)

            def both(batch: StagedBatch) -> None:
                ours(batch)
                if first is not None:
                    first(batch)

            return both

        return build

    def record_commits(self, reports: Iterable[TableCommitReport]) -> None:
        """The relay's reports: each committed batch and its commit latency, by table."""
        for r in reports:
            labels = {"pipeline": self._pipeline_of.get(r.table, ""), "table": r.table}
            if r.committed:
                self._committed.add(len(r.committed), labels)
            for ms in r.commit_latencies_ms:
                self._latency.record(ms / 1000.0, labels)

    # ------------------------------------------------------------------------------------ gauges

    @property
    def otlp_failing(self) -> bool:
        """Whether the last OTLP export failed (the collector did not answer, or refused the metrics)."""
        return self._otlp is not None and self._otlp.failing

    def refresh(self) -> None:
        """Read the ledger and the broker now rather than at the next refresh (what a test or a command's end wants)."""
        self.reader.refresh()

    def _readings(self) -> Readings:
        return self.reader.readings()

    def _consumer_lag(self, _options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        for r in self._readings().partitions:
            yield Observation(r.consumer_lag, {"pipeline": r.pipeline, "topic": r.topic, "partition": r.partition})

    def _commit_lag(self, _options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        for r in self._readings().partitions:
            yield Observation(r.commit_lag, {"pipeline": r.pipeline, "topic": r.topic, "partition": r.partition})

    def _pending(self, _options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        for t in self._readings().tables:
            yield Observation(t.pending, {"pipeline": t.pipeline, "table": t.table})

    def _entries_committed(self, _options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        for t in self._readings().tables:
            yield Observation(t.committed, {"pipeline": t.pipeline, "table": t.table})

    def _freshness(self, _options: CallbackOptions) -> Iterable[Observation]:
        from datetime import UTC, datetime

        from opentelemetry.metrics import Observation

        now = datetime.now(UTC)
        for t in self._readings().tables:
            if t.newest_event is not None:
                seconds = (now - t.newest_event).total_seconds()
                yield Observation(seconds, {"pipeline": t.pipeline, "table": t.table})

    # ------------------------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Export the last values (OTLP), then stop the exporters and the endpoint. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.reader.stop()
        if self._otlp is not None:
            self._otlp.ending = True
            try:
                self.reader.refresh()  # the final export shows the ledger as the command leaves it
            except Exception as exc:  # the command's own outcome matters more than its last metrics
                log.warning("metrics: final reading failed: %s", exc)
        self.provider.shutdown(timeout_millis=SHUTDOWN_TIMEOUT_MS)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> Metrics:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _resource() -> Any:
    """OpenTelemetry's resource from ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``; service ``krishiv`` if
    neither names one."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


def _broker_watermarks(spec: KrishivSpec) -> Callable[[str], Mapping[str, int]]:
    def latest(topic: str) -> Mapping[str, int]:
        from spark_jobs.kafka_source import latest_offsets

        return latest_offsets(spec.kafka.bootstrap_servers, topic, spec.kafka.consumer_settings())

    return latest


def _staged_files(spec: KrishivSpec) -> Callable[[Sequence[str], str], Any]:
    """Reads staged files' footers through the FileIO the catalog's properties describe (S3 endpoint, keys…)."""
    newest: Callable[[Sequence[str], str], Any] | None = None

    def read(paths: Sequence[str], column: str) -> Any:
        nonlocal newest
        if newest is None:
            from pyiceberg.io import load_file_io

            from krishiv_core.catalog import catalog_properties

            newest = newest_in_parquet(load_file_io(catalog_properties(spec), paths[0]))
        return newest(paths, column)

    return read


def start_metrics(
    spec: KrishivSpec,
    ledger: Ledger,
    *,
    pipelines: Sequence[PipelineSpec] | None = None,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    latest: Callable[[str], Mapping[str, int]] | None = None,
) -> Metrics:
    """The metrics of ``pipelines`` (default: the spec's), exported as the environment and ``port`` ask.

    ``port`` is a command's ``--metrics-port`` (over ``KRISHIV_METRICS_PORT``); with neither and no OTLP endpoint
    the instruments still count but nothing is exported. ``latest`` replaces the broker's watermark query.
    """
    settings = metrics_settings(port, env)
    return Metrics(spec, list(spec.pipelines if pipelines is None else pipelines), ledger, settings, latest)
