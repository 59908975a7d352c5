"""Is the broker there, is the catalog there: asked before Spark starts, each answered in a few seconds.

``krishiv run`` used to discover a missing broker only after Spark had started (46 s), and ``produce``/``status``
after librdkafka had printed hundreds of lines. :func:`check_broker` and :func:`check_catalog` ask once, quietly,
with the spec's own client settings (``[kafka.properties]`` with its secrets from the environment,
``[iceberg.properties]``), and raise one line naming the address and the cause, secrets masked.
"""

from __future__ import annotations

import contextlib
import re
import threading
from typing import Any

from krishiv_core.errors import BrokerUnavailable, CatalogUnavailable, KrishivError
from krishiv_core.spec import KrishivSpec

BROKER_TIMEOUT_S = 5.0
CATALOG_TIMEOUT_S = 10.0


def check_broker(spec: KrishivSpec, timeout_s: float = BROKER_TIMEOUT_S) -> None:
    """Raise :class:`BrokerUnavailable` (address + cause) unless the broker answers a metadata request with the
    spec's client settings within ``timeout_s``: at once for failed authentication or TLS, after about a second for
    a refused connection. A missing ``${VARIABLE}`` of ``[kafka.properties]`` is a :class:`ConfigError`."""
    from confluent_kafka.admin import AdminClient

    from spark_jobs.kafka_clients import KafkaProblems, build, list_topics

    settings = spec.kafka.client_settings()
    problems = KafkaProblems(settings)
    admin = build(AdminClient, settings, problems)
    list_topics(admin, problems, spec.kafka.bootstrap_servers, timeout_s)


def check_catalog(spec: KrishivSpec, timeout_s: float = CATALOG_TIMEOUT_S) -> None:
    """Raise :class:`CatalogUnavailable` (the redacted address + the first line of the cause) unless the catalog
    loads and lists its namespaces within ``timeout_s`` (a REST token or credential that is refused shows here)."""
    from krishiv_core.catalog import catalog_properties, redact

    uri = catalog_properties(spec)["uri"]
    _import_catalog_modules(uri)  # outside the timed wait: importing pyiceberg takes seconds on a busy machine
    outcome: dict[str, Any] = {}

    def ask() -> None:
        try:
            _list_namespaces(spec)
            outcome["ok"] = True
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=ask, name="krishiv-check-catalog", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise CatalogUnavailable(f"Iceberg catalog at {redact(uri)} did not answer within {timeout_s:g}s")
    error = outcome.get("error")
    if error is None:
        return
    if isinstance(error, CatalogUnavailable):
        raise CatalogUnavailable(_first_line(str(error))) from error
    if isinstance(error, KrishivError):
        raise error
    raise CatalogUnavailable(
        f"Iceberg catalog at {redact(uri)} is unreachable: {_first_line(_masked(spec, uri, str(error)))}"
    ) from error


def _import_catalog_modules(uri: str) -> None:
    import importlib

    importlib.import_module("pyiceberg.catalog")
    with contextlib.suppress(ImportError):  # load_catalog names a missing driver itself
        importlib.import_module(
            "pyiceberg.catalog.rest" if uri.startswith(("http://", "https://")) else "pyiceberg.catalog.sql"
        )


def _list_namespaces(spec: KrishivSpec) -> None:
    from krishiv_core.catalog import load_catalog

    catalog = load_catalog(spec)
    try:
        catalog.list_namespaces()
    finally:
        engine = getattr(catalog, "engine", None)  # a SQL catalog's connection pool
        if engine is not None:
            engine.dispose()


def _masked(spec: KrishivSpec, uri: str, text: str) -> str:
    from krishiv_core.catalog import MASK, catalog_properties, redact_text
    from krishiv_core.client_settings import is_secret

    text = redact_text(text, uri)
    for name, value in catalog_properties(spec).items():
        if is_secret(name) and len(value) >= 4:
            text = text.replace(value, MASK)
    return text


#: The operating system's reason inside an HTTP client's wrapping (``... [Errno 111] Connection refused'))``).
_OS_REASON = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")


def _first_line(text: str, limit: int = 400) -> str:
    """A driver's message is often many lines (SQLAlchemy adds a link to its docs): its first says what failed;
    an HTTP client's connection error is reduced to the operating system's reason."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), text.strip())
    reason = _OS_REASON.search(line)
    if reason and "Max retries exceeded" in line:
        line = line[: line.index(": ", 0) + 2] + reason.group(1) if ": " in line[:200] else reason.group(1)
    return line if len(line) <= limit else line[: limit - 1] + "…"


__all__ = ["BrokerUnavailable", "CatalogUnavailable", "check_broker", "check_catalog"]
