"""Where the metrics go, from the environment: OTLP/HTTP when the standard ``OTEL_*`` variables name an endpoint,
a Prometheus endpoint when a port is asked for (``--metrics-port`` or ``KRISHIV_METRICS_PORT``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from krishiv_core.errors import ConfigError

#: The port of the Prometheus endpoint (``--metrics-port`` wins); unset: no endpoint. 0 picks a free port.
METRICS_PORT_ENV = "KRISHIV_METRICS_PORT"
#: The address the endpoint binds (default loopback: the metrics name pipelines and tables; expose them on purpose).
METRICS_HOST_ENV = "KRISHIV_METRICS_HOST"
#: How often the ledger and the broker are read for the gauges (seconds; default 5).
METRICS_REFRESH_ENV = "KRISHIV_METRICS_REFRESH_S"

DEFAULT_HOST = "127.0.0.1"
DEFAULT_REFRESH_S = 5.0

#: OpenTelemetry's own variables that switch the OTLP export on (the SDK reads them, and the headers, interval,
#: timeout, temporality and resource variables, itself).
OTLP_ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")


@dataclass(frozen=True)
class MetricsSettings:
    otlp: bool  # export over OTLP/HTTP (the endpoint and the rest from the OTEL_* variables)
    port: int | None  # the Prometheus endpoint's port, None for none
    host: str
    refresh_s: float

    @property
    def enabled(self) -> bool:
        return self.otlp or self.port is not None


def _port(raw: str, where: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        raise ConfigError(where, f"expected a port number (0-65535), got {raw!r}") from None
    if not 0 <= port <= 65535:
        raise ConfigError(where, f"expected a port number (0-65535), got {raw!r}")
    return port


def metrics_settings(port: int | None = None, env: Mapping[str, str] | None = None) -> MetricsSettings:
    """The settings from ``port`` (a command's ``--metrics-port``) and the environment."""
    environ = os.environ if env is None else env
    if port is not None:
        port = _port(str(port), "--metrics-port")
    elif environ.get(METRICS_PORT_ENV):
        port = _port(environ[METRICS_PORT_ENV], METRICS_PORT_ENV)
    refresh_raw = environ.get(METRICS_REFRESH_ENV)
    refresh_s = DEFAULT_REFRESH_S
    if refresh_raw:
        try:
            refresh_s = float(refresh_raw)
        except ValueError:
            raise ConfigError(METRICS_REFRESH_ENV, f"expected a number of seconds, got {refresh_raw!r}") from None
        if not 0 < refresh_s < float("inf"):
            raise ConfigError(METRICS_REFRESH_ENV, f"expected a positive number of seconds, got {refresh_raw!r}")
    disabled = environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    otlp = not disabled and any(environ.get(name) for name in OTLP_ENDPOINT_ENVS)
    return MetricsSettings(otlp, port, environ.get(METRICS_HOST_ENV) or DEFAULT_HOST, refresh_s)
