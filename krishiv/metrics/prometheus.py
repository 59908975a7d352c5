"""The Prometheus endpoint: OpenTelemetry's collected data in Prometheus's text format, served by prometheus_client.

An in-memory reader of the one meter provider collects on each scrape (cumulative, as Prometheus expects); the
collector below turns its sums, gauges and histograms into Prometheus families, so the endpoint and the OTLP
export show the same instruments. The server binds loopback unless told otherwise.
"""

from __future__ import annotations

import errno
import math
from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk.metrics.export import Gauge, Histogram, InMemoryMetricReader, Sum
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from krishiv_core.errors import KrishivError


class MetricsEndpointError(KrishivError):
    """The Prometheus endpoint could not listen where it was asked to."""


def _labels(points: list[Any]) -> list[str]:
    names: dict[str, None] = {}
    for point in points:
        names.update(dict.fromkeys(point.attributes or {}))
    return list(names)


def _values(point: Any, names: list[str]) -> list[str]:
    attributes = point.attributes or {}
    return [str(attributes.get(n, "")) for n in names]


def _bound(value: float) -> str:
    return "+Inf" if math.isinf(value) else repr(float(value))


class OpenTelemetryCollector(Collector):
    """A prometheus_client collector over an OpenTelemetry in-memory reader."""

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self.reader = reader

    def collect(self) -> Iterator[Metric]:
        data = self.reader.get_metrics_data()
        if data is None:
            return
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    family = self._family(metric)
                    if family is not None:
                        yield family

    @staticmethod
    def _family(metric: Any) -> Metric | None:
        points = list(metric.data.data_points)
        names = _labels(points)
        text = metric.description or metric.name
        if isinstance(metric.data, Sum) and metric.data.is_monotonic:
            name = metric.name[: -len("_total")] if metric.name.endswith("_total") else metric.name
            counter = CounterMetricFamily(name, text, labels=names)
            for p in points:
                counter.add_metric(_values(p, names), p.value)
            return counter
        if isinstance(metric.data, Gauge | Sum):
            gauge = GaugeMetricFamily(metric.name, text, labels=names)
            for p in points:
                gauge.add_metric(_values(p, names), p.value)
            return gauge
        if isinstance(metric.data, Histogram):
            histogram = HistogramMetricFamily(metric.name, text, labels=names)
            for p in points:
                cumulative, buckets = 0, []
                for bound, count in zip([*p.explicit_bounds, math.inf], p.bucket_counts, strict=True):
                    cumulative += count
                    buckets.append((_bound(bound), cumulative))
                histogram.add_metric(_values(p, names), buckets, p.sum)
            return histogram
        return None


def serve(reader: InMemoryMetricReader, host: str, port: int) -> tuple[Any, Any]:
    """Start the endpoint's HTTP server thread; returns ``(server, thread)``. A taken port is one clear error."""
    from prometheus_client import start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(OpenTelemetryCollector(reader))
    try:
        return start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        reason = "the port is in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise MetricsEndpointError(
            f"metrics endpoint {host}:{port} cannot listen: {reason}; choose another with --metrics-port or "
            "KRISHIV_METRICS_PORT (KRISHIV_METRICS_HOST for the address)"
        ) from exc
