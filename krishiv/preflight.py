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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from krishiv_core.errors import BrokerUnavailable, CatalogUnavailable, KrishivError
from krishiv_core.runbook import runbook
from krishiv_core.spec import KrishivSpec, PipelineSpec

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

    from outbox.ledger import Ledger

BROKER_TIMEOUT_S = 5.0
CATALOG_TIMEOUT_S = 10.0


class TopicMissing(KrishivError):
    """A pipeline's topic does not exist on the broker."""


class CatalogMismatch(KrishivError):
    """The catalog and the ledger describe different histories of a pipeline: starting would lose or repeat rows."""


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


def check_topics(spec: KrishivSpec, pipelines: Sequence[PipelineSpec], timeout_s: float = BROKER_TIMEOUT_S) -> Any:
    """:func:`check_broker`, then each pipeline's topic exists on the broker: else one :class:`TopicMissing` line
    naming the topic, the address and what to do (Spark's JVM would otherwise start only to fail at its first
    batch). Returns the broker's metadata."""
    from confluent_kafka.admin import AdminClient

    from spark_jobs.kafka_clients import KafkaProblems, build, list_topics

    settings = spec.kafka.client_settings()
    problems = KafkaProblems(settings)
    admin = build(AdminClient, settings, problems)
    metadata = list_topics(admin, problems, spec.kafka.bootstrap_servers, timeout_s)
    for pipeline in pipelines:
        if pipeline.members:  # Debezium makes a table's topic with its first event: one of them is enough to start
            if not any(_exists(metadata, t) for t in pipeline.topics):
                raise TopicMissing(
                    f"none of the topics of pipeline {pipeline.name!r} exists on Kafka broker "
                    f"{spec.kafka.bootstrap_servers} ({', '.join(pipeline.topics)}): start the connector that "
                    f"writes them, or correct {'topic_pattern' if pipeline.topic_pattern else 'topics'} in the spec "
                    f"{runbook('A topic that does not exist')}"
                )
            continue
        if not _exists(metadata, pipeline.topic):
            raise TopicMissing(
                f"topic {pipeline.topic!r} of pipeline {pipeline.name!r} does not exist on Kafka broker "
                f"{spec.kafka.bootstrap_servers}: create it (krishiv produce creates it, or your Kafka tooling), or "
                f"correct the topic in the spec {runbook('A topic that does not exist')}"
            )
    return metadata


def _exists(metadata: Any, topic: str) -> bool:
    described = metadata.topics.get(topic)
    return described is not None and described.error is None and bool(described.partitions)


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


def _committed(ledger: Ledger, pipeline: PipelineSpec, table: str) -> dict[str, int]:
    """Per query of the pipeline, the highest batch the ledger holds as COMMITTED with rows in ``table``."""
    found = {q: ledger.last_committed_batch(q, table) for q in ledger.query_ids(pipeline.name)}
    return {q: b for q, b in found.items() if b is not None}


def check_new_catalog(
    spec: KrishivSpec, pipelines: Sequence[PipelineSpec], ledger: Ledger, say: Callable[[str], None]
) -> None:
    """:func:`check_catalog`, creating a SQL catalog that does not exist yet, and saying so in one line, unless the
    ledger already holds committed batches of one of the ``pipelines``: then the URI is most likely mistyped, and a new
    empty catalog would silently start the pipeline over, so :class:`CatalogMismatch` refuses before anything is
    created."""
    from krishiv_core.catalog import catalog_exists, catalog_properties, qualified, redact
    from krishiv_core.tables import output_tables

    uri = redact(catalog_properties(spec)["uri"])
    new = catalog_exists(spec) is False
    if new:
        for pipeline in pipelines:
            for output in output_tables(pipeline):
                table = qualified(spec, output.name)
                committed = _committed(ledger, pipeline, table)
                if committed:
                    raise CatalogMismatch(
                        f"there is no Iceberg catalog at {uri}, but ledger {ledger.path} holds committed batches of "
                        f"pipeline {pipeline.name!r} in table {table}; nothing was created: correct the catalog URI "
                        f"(storage.catalog_uri or KRISHIV_ICEBERG_CATALOG_URI) {runbook('A catalog that is missing')}"
                    )
    check_catalog(spec)
    if new:  # as the spec (or the environment) names it: short, and what a mistyped URI would show
        say(f"created a new catalog at {redact(spec.iceberg.catalog_uri)}")


def check_topic_unchanged(pipelines: Sequence[PipelineSpec], ledger: Ledger) -> None:
    """Before Spark starts: each pipeline reads the topic its recorded batches were read from. A pipeline's checkpoint,
    offsets and tables belong to one topic; another topic under the same pipeline would be taken by the source for
    its topic re-created (and its way out, skipping to the new topic's offsets, would pour the other topic's events
    into the same tables). Refused, naming both topics and the two ways out."""
    from krishiv_core.table_purpose import SPEC_CHANGE, SpecChangeRefused

    for pipeline in pipelines:
        read = ledger.newest_topic(pipeline.name)
        if read is not None and read not in pipeline.topics:
            raise SpecChangeRefused(
                f"pipeline {pipeline.name!r} has read topic {read!r} (its batches are in the ledger and its "
                f"checkpoint) and the spec now says topic {pipeline.topic!r}; a pipeline's checkpoint and tables hold "
                f"one topic, so nothing was started: set topic back to {read!r}, or read {pipeline.topic!r} with a "
                f"new pipeline (a new name: its own checkpoint and tables) {SPEC_CHANGE}"
            )


def check_history(catalog: Catalog, spec: KrishivSpec, pipelines: Sequence[PipelineSpec], ledger: Ledger) -> None:
    """Before Spark starts: each table of the ``pipelines`` and the ledger tell one history.

    - The ledger holds committed batches of a query that the table shows no trace of (no high-water property, no
      snapshot; the table missing, re-created, or another catalog): starting would build on a table that lost them
      (the relay's fail-closed would stop only at the first commit). Refused, naming table and ledger.
    - The table holds snapshots or high-water marks of this pipeline's queries that the ledger does not know (the
      ledger deleted, with the checkpoints): a new query would read the topic from its start and write every event a
      second time. Refused, naming the table and the recovery.
    """
    from pyiceberg.exceptions import NoSuchTableError

    from krishiv_core.catalog import catalog_address, catalog_call, qualified, table_identifier
    from krishiv_core.tables import output_tables
    from outbox.relay import SUMMARY_PIPELINE, SUMMARY_QUERY_ID, high_water_marks, shows_query

    known = {q for p in spec.pipelines for q in ledger.query_ids(p.name)}
    for pipeline in pipelines:
        for output in output_tables(pipeline):
            name = qualified(spec, output.name)
            try:
                with catalog_call(catalog, f"load table {name}"):
                    table = catalog.load_table(table_identifier(spec, output.name))
            except NoSuchTableError:
                table = None
            for query, batch in sorted(_committed(ledger, pipeline, name).items()):
                if table is None or not shows_query(table, query):
                    state = "does not exist" if table is None else f"shows no trace of query {query}"
                    raise CatalogMismatch(
                        f"table {name} in the catalog at {catalog_address(catalog)} {state}, but ledger {ledger.path} "
                        f"holds its batches up to {batch} as committed; nothing was started: point the spec at the "
                        f"catalog that holds them, or restore the table {runbook('A catalog that is missing')}"
                    )
            if table is None:
                continue
            seen = set(high_water_marks(table)) | {
                s.summary.get(SUMMARY_QUERY_ID)
                for s in table.snapshots()
                if s.summary is not None and s.summary.get(SUMMARY_PIPELINE) == pipeline.name
            }
            unknown = sorted(q for q in seen if q and q not in known)
            if unknown:
                raise CatalogMismatch(
                    f"table {name} holds batches of pipeline {pipeline.name!r} (query {unknown[-1]}) that ledger "
                    f"{ledger.path} does not know: the ledger was lost or replaced, and starting over would write "
                    f"every event a second time; restore the ledger and the checkpoint, or give the pipeline a new "
                    f"table {runbook('A ledger that was lost')}"
                )


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


__all__ = [
    "BrokerUnavailable",
    "CatalogMismatch",
    "CatalogUnavailable",
    "TopicMissing",
    "check_broker",
    "check_catalog",
    "check_history",
    "check_new_catalog",
    "check_topics",
]
