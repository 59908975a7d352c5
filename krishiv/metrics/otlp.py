"""The OTLP/HTTP export, saying in one line when the collector does not answer.

OpenTelemetry's exporter logs every retry of every export (a warning per attempt, then an error), so a collector
that is down floods the command's output. :class:`QuietOtlpExporter` wraps it: the exporter's own log lines are
dropped, one warning names the endpoint when exports start failing and one line says when they work again; and
once the command is ending, an export to a collector already known to be down is not attempted, so the exit is
not held up by the exporter's retries.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from krishiv_core.catalog import redact

log = logging.getLogger(__name__)

#: The exporter's logger, whose per-attempt lines :class:`QuietOtlpExporter` replaces.
EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.http.metric_exporter"


class _DropExporterLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


_DROP = _DropExporterLines()


class QuietOtlpExporter(MetricExporter):
    """OpenTelemetry's OTLP/HTTP metric exporter (configured by the ``OTEL_*`` variables), one line per outage."""

    def __init__(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        self.inner = OTLPMetricExporter()
        super().__init__(self.inner._preferred_temporality, self.inner._preferred_aggregation)
        self.endpoint = redact(str(self.inner._endpoint))
        self.failing = False
        self.ending = False  # the command is ending: do not wait on a collector already known to be down
        logging.getLogger(EXPORTER_LOGGER).addFilter(_DROP)

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        if self.ending and self.failing:
            return MetricExportResult.FAILURE
        result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        if result is MetricExportResult.SUCCESS:
            if self.failing:
                log.warning("metrics: the OTLP endpoint %s answers again", self.endpoint)
            self.failing = False
        else:
            if not self.failing:
                log.warning(
                    "metrics: the OTLP endpoint %s did not take the metrics (unreachable, or it refused them); "
                    "retrying at each export interval",
                    self.endpoint,
                )
            self.failing = True
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)
        logging.getLogger(EXPORTER_LOGGER).removeFilter(_DROP)
