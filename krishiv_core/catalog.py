"""The Iceberg catalog behind one narrow interface: load it from the spec, create the output tables.

``KRISHIV_ICEBERG_CATALOG_URI`` picks the catalog by scheme: ``sqlite:///PATH`` or
``postgresql+psycopg://…`` for pyiceberg's SQL catalog, ``http(s)://…`` for a REST catalog.

A REST catalog takes its token, OAuth2 credential, prefix or warehouse and ``header.*`` from
``[iceberg.properties]`` (secrets as ``${VARIABLE}``). pyiceberg (0.12) puts no timeout on its HTTP calls, so
Krishiv bounds every call after the first (``connection.timeout`` seconds, the property later pyiceberg
releases read themselves; :data:`DEFAULT_REST_TIMEOUT_S` by default): a catalog that stops answering fails the
call instead of hanging a run or the relay, and the relay treats a commit that timed out as an unknown
outcome. A catalog that refuses a table operation (a 4xx: a wrong token, a namespace the server does not
allow) is one :class:`CatalogRefused` line with the server's reason; one that does not answer is one
:class:`~krishiv_core.errors.CatalogUnavailable` line; neither shows a secret.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    RESTError,
    TableAlreadyExistsError,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from krishiv_core.client_settings import MASK, is_secret, resolve
from krishiv_core.errors import CatalogUnavailable, ConfigError, KrishivError, SchemaConflict
from krishiv_core.evolution import evolve_partitioning, evolve_schema, partitioning_differs, planned_schema
from krishiv_core.partitioning import PartitionField, describe_spec, partition_spec
from krishiv_core.runbook import runbook
from krishiv_core.spec import KrishivSpec, PipelineSpec
from krishiv_core.table_purpose import check_purpose, purpose_properties
from krishiv_core.tables import output_tables

#: Table properties Krishiv sets on the tables it creates. The relay owns commit retries (it re-checks
#: the table before each attempt), so pyiceberg's own retry loop is switched off.
#: Table properties that keep a table's metadata from growing with every commit: pyiceberg (0.12, in
#: ``Table._do_commit``) deletes metadata files that fall off a log of at most ``previous-versions-max`` entries.
#: Set on the tables Krishiv creates, and added to an existing table that lacks them (a user's own value stays).
METADATA_PROPERTIES = {
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
}
TABLE_PROPERTIES = {
    "format-version": "2",
    "commit.retry.num-retries": "0",
    "write.parquet.compression-codec": "zstd",
    **METADATA_PROPERTIES,
}


def _with_metadata_properties(table: Table) -> Table:
    """``table`` with :data:`METADATA_PROPERTIES` it lacks set (one metadata commit), or as it is."""
    missing = {k: v for k, v in METADATA_PROPERTIES.items() if k not in table.properties}
    if not missing:
        return table
    with table.transaction() as tx:
        tx.set_properties(missing)
    return table


#: How long one HTTP call to a REST catalog may take, in seconds, unless ``connection.timeout`` says otherwise.
DEFAULT_REST_TIMEOUT_S = 60.0
REST_TIMEOUT_PROPERTY = "connection.timeout"
#: HTTP statuses with which a REST catalog refuses a request it did not carry out: bad request, unauthorized,
#: forbidden, not found, unprocessable. Any other failure (5xx, a timeout, a dropped connection) may have been
#: carried out, or the catalog is down.
REFUSED_STATUSES = frozenset({400, 401, 403, 404, 422})


class CatalogRefused(KrishivError):
    """The catalog answered and refused an operation (a wrong token, a namespace it does not allow); nothing changed."""


#: A query parameter whose name contains one of these (case-insensitive) holds a secret: ``password``,
#: ``sslpassword``, ``token``, ``secret``, ``access_key``, ``secret_access_key``, ``credential``, ``api_key``…
_SECRET_PARAMETER = re.compile(r"pass(word|wd)|pwd|token|secret|credential|key", re.IGNORECASE)
#: ``scheme://user:password@``. The password runs to the last ``@`` (SQLAlchemy takes ``/``, ``?`` and ``#``
#: in it unescaped, urllib an ``@``), so whatever a driver may read as the password is masked.
_USERINFO_PASSWORD = re.compile(r"(?:[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s]*:)(?P<secret>[^\s]*)@")
_QUERY_PARAMETER = re.compile(r"[?&;](?P<name>[^=&;#?\s]+)=(?P<secret>[^&;#\s]*)")


def _secret_spans(uri: str) -> list[tuple[int, int]]:
    """Where the secrets of ``uri`` are, in order: user-info passwords, then secret query parameters."""
    spans = [m.span("secret") for m in _USERINFO_PASSWORD.finditer(uri) if m.group("secret")]
    query = uri.find("?")
    if query >= 0:
        spans += [
            m.span("secret")
            for m in _QUERY_PARAMETER.finditer(uri, query)
            if m.group("secret")
            and _SECRET_PARAMETER.search(m.group("name"))
            and not any(start <= m.start("secret") < end for start, end in spans)
        ]
    return sorted(spans)


def redact(uri: str) -> str:
    """The URI as it may be shown: the user-info password and secret query parameters replaced by ``***``.

    ``postgresql+psycopg://app:pw@db/iceberg?sslmode=require&password=pw`` becomes
    ``postgresql+psycopg://app:***@db/iceberg?sslmode=require&password=***``; the scheme, user, host, path
    and the other parameters stay readable.
    """
    out, last = [], 0
    for start, end in _secret_spans(uri):
        out += [uri[last:start], MASK]
        last = end
    return "".join(out) + uri[last:]


def has_secret(uri: str) -> bool:
    """Whether :func:`redact` hides anything in ``uri``."""
    return bool(_secret_spans(uri))


def redact_text(text: str, uri: str) -> str:
    """``text`` (a driver's error message, say) with ``uri`` and each of its secrets redacted wherever they appear."""
    text = text.replace(uri, redact(uri))
    for start, end in _secret_spans(uri):
        secret = uri[start:end]
        for form in {secret, unquote(secret)}:
            if len(form) >= 4:  # masking a shorter one would garble ordinary words
                text = text.replace(form, MASK)
    return text


def catalog_properties(spec: KrishivSpec, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the catalog is built with, over pyiceberg's own configuration for the catalog's name.

    pyiceberg merges ``.pyiceberg.yaml`` and ``PYICEBERG_CATALOG__<NAME>__*`` under these: ``[iceberg.properties]``
    (secrets resolved from the environment), then the spec's URI and warehouse.
    """
    properties = resolve(spec.iceberg.properties, os.environ if env is None else env, "iceberg.properties")
    uri = spec.catalog_uri()
    if uri.startswith("postgresql://"):
        uri = "postgresql+psycopg://" + uri[len("postgresql://") :]
    properties["uri"] = uri
    if "warehouse" not in properties:
        properties["warehouse"] = spec.warehouse_uri()
    return properties


def masked(text: str, properties: Mapping[str, Any], uri: str) -> str:
    """``text`` with ``uri``'s secrets and the value of every secret property (``token``, ``credential``…) masked."""
    text = redact_text(text, uri)
    for name, value in properties.items():
        if is_secret(name) and isinstance(value, str) and len(value) >= 4:
            text = text.replace(value, MASK)
    return text


#: The operating system's reason inside an HTTP client's wrapping (``... [Errno 111] Connection refused'))``).
_OS_REASON = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")


def failure_reason(exc: BaseException) -> str:
    """What went wrong, in one line: in a few words when an HTTP client wrapped it (``Connection refused`` rather than
    urllib3's ``HTTPConnectionPool(host=…): Max retries exceeded with url: … (Caused by NewConnectionError(…))``), and
    a SQL catalog's error without the statement, parameters and link SQLAlchemy adds on the lines after (a catalog
    server restarted under a commit: ``(psycopg.errors.AdminShutdown) terminating connection …``)."""
    import requests

    if isinstance(exc, requests.Timeout):
        return f"no answer within the timeout ({type(exc).__name__})"
    reason = _OS_REASON.search(str(exc))
    if isinstance(exc, requests.ConnectionError) and reason:
        return reason.group(1).strip()
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def rest_timeout_s(properties: Mapping[str, str]) -> float:
    """``connection.timeout`` of the catalog's properties, in seconds (:data:`DEFAULT_REST_TIMEOUT_S` if unset)."""
    raw = properties.get(REST_TIMEOUT_PROPERTY)
    if raw is None:
        return DEFAULT_REST_TIMEOUT_S
    try:
        timeout = float(raw)
    except ValueError:
        timeout = 0.0
    if not timeout > 0:
        raise ConfigError(f"iceberg.properties.{REST_TIMEOUT_PROPERTY}", f"expected seconds > 0, got {raw!r}")
    return timeout


def _bound_http_calls(catalog: Catalog, timeout_s: float) -> None:
    """Give every HTTP call of a REST catalog's session a timeout, unless the call sets its own.

    A call that times out raises ``requests.Timeout``: the relay takes it as an unknown outcome (reload, re-check),
    never as a failed commit, since the server may have applied it.
    """
    import requests

    session = getattr(catalog, "_session", None)
    if not isinstance(session, requests.Session):
        return
    send = session.request

    @functools.wraps(send)
    def request(method: str, url: str, *args: Any, **kwargs: Any) -> requests.Response:
        if len(args) < 7 and kwargs.get("timeout") is None:  # the 7th positional argument after url is timeout
            kwargs["timeout"] = timeout_s
        return send(method, url, *args, **kwargs)

    session.request = request  # type: ignore[method-assign]


#: The table pyiceberg's SQL catalog keeps its tables in (created with the catalog on first use).
SQL_CATALOG_TABLE = "iceberg_tables"


def catalog_exists(spec: KrishivSpec) -> bool | None:
    """Whether the spec's SQL catalog exists already (a SQLite file, or a database holding pyiceberg's
    ``iceberg_tables``); None for a REST catalog, or a database that cannot be asked (its load names why).

    :func:`load_catalog` creates a SQL catalog that does not exist: a mistyped URI would quietly become a new,
    empty catalog, so ``krishiv run`` asks first and says when it creates one."""
    uri = catalog_properties(spec)["uri"]
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///") :]).exists()
    if uri.startswith(("http://", "https://")):
        return None
    try:
        import sqlalchemy

        engine = sqlalchemy.create_engine(uri, connect_args={"connect_timeout": 5})
        try:
            return sqlalchemy.inspect(engine).has_table(SQL_CATALOG_TABLE)
        finally:
            engine.dispose()
    except Exception:  # unreachable: load_catalog says so in one line
        return None


#: How a catalog commits a batch written to several tables (``outbox.multi_table_commit``): all of them in one
#: catalog transaction, or one after the other.
ATOMIC = "atomic"
TABLE_BY_TABLE = "table by table"
#: What ``krishiv status`` says of each.
BATCH_COMMITS_SAID = {
    ATOMIC: "each batch goes into all of its tables at once",
    TABLE_BY_TABLE: "each batch goes into its tables one by one",
}


def multi_table_commits_at(catalog_uri: str) -> str:
    """How the catalog at ``catalog_uri`` commits a batch's tables, known without connecting (``krishiv status``):
    pyiceberg builds its SQL catalog, whose commits are atomic across tables, for ``sqlite:`` and ``postgresql``
    URIs."""
    return ATOMIC if catalog_uri.startswith(("sqlite:", "postgresql:", "postgresql+")) else TABLE_BY_TABLE


def load_catalog(spec: KrishivSpec) -> Catalog:
    """The spec's catalog: pyiceberg's SQL catalog for ``sqlite:``/``postgresql:`` URIs, its REST catalog for
    ``http(s):`` ones; a catalog that does not answer is one :class:`CatalogUnavailable` line."""
    from pyiceberg.catalog import load_catalog as pyiceberg_load_catalog

    from krishiv_core.sql_catalog import with_metadata_cache

    properties = catalog_properties(spec)
    uri = properties["uri"]
    warehouse = properties["warehouse"]
    rest = uri.startswith(("http://", "https://"))
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    if warehouse.startswith("file://") and not rest:  # a REST server places its tables itself
        Path(urlparse(warehouse).path).mkdir(parents=True, exist_ok=True)
    timeout_s = rest_timeout_s(properties) if rest else None
    if not rest:
        properties.setdefault("type", "sql")
    try:
        catalog = with_metadata_cache(pyiceberg_load_catalog(spec.iceberg.catalog_name, **properties))
    except Exception as exc:  # connection errors differ by driver: name the address whatever they are
        message = masked(failure_reason(exc), properties, uri)
        raise CatalogUnavailable(f"Iceberg catalog at {redact(uri)} is unreachable: {message}") from exc
    if timeout_s is not None:
        _bound_http_calls(catalog, timeout_s)
    return catalog


def http_status(exc: BaseException) -> int | None:
    """The HTTP status a REST catalog answered with, if ``exc`` is pyiceberg's error for an HTTP answer."""
    response = getattr(exc.__cause__, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def refusal_hint(status: int | None) -> str:
    """What to check after a refusal with ``status``, as a ``; …`` suffix (empty when there is nothing to say)."""
    return "; check the token or credential in [iceberg.properties]" if status in (401, 403) else ""


def catalog_address(catalog: Catalog) -> str:
    """The catalog's URI as it may be shown."""
    return redact(str(catalog.properties.get("uri", catalog.name)))


@contextlib.contextmanager
def catalog_call(catalog: Catalog, doing: str) -> Iterator[None]:
    """Turn a REST catalog's refusal into :class:`CatalogRefused` and a call it did not answer into
    :class:`CatalogUnavailable`: one line naming the catalog, ``doing`` and the server's reason, secrets masked.

    pyiceberg's own outcomes (no such table, already exists, a commit conflict) pass through, as does everything
    a SQL catalog raises.
    """
    import requests

    try:
        yield
    except RESTError as exc:
        status = http_status(exc)
        reason = masked(str(exc), catalog.properties, str(catalog.properties.get("uri", "")))
        if status in REFUSED_STATUSES:
            raise CatalogRefused(
                f"Iceberg catalog at {catalog_address(catalog)} refused to {doing} (HTTP {status}): {reason}"
                f"{refusal_hint(status)} {runbook('A catalog that refuses')}"
            ) from exc
        raise CatalogUnavailable(
            f"Iceberg catalog at {catalog_address(catalog)} failed to {doing}"
            f"{f' (HTTP {status})' if status else ''}: {reason}"
        ) from exc
    except requests.RequestException as exc:
        reason = masked(failure_reason(exc), catalog.properties, str(catalog.properties.get("uri", "")))
        raise CatalogUnavailable(
            f"Iceberg catalog at {catalog_address(catalog)} did not answer while trying to {doing} ({reason})"
        ) from exc


def table_identifier(spec: KrishivSpec, table: str) -> tuple[str, str]:
    return (spec.iceberg.namespace, table)


def qualified(spec: KrishivSpec, table: str) -> str:
    """``namespace.table``, as the ledger, the relay and the catalog name a table."""
    return ".".join(table_identifier(spec, table))


def ensure_table(
    catalog: Catalog,
    identifier: tuple[str, str],
    schema: Schema,
    *,
    partition_by: tuple[PartitionField, ...] = (),
    pending: int = 0,
    properties: Mapping[str, str] | None = None,
    defer_schema: bool = False,
) -> Table:
    """Load the table, creating the namespace and table on first use (concurrent creators are fine), and bring
    an existing table to ``schema`` and ``partition_by`` as ``krishiv_core.evolution`` allows, or raise
    :class:`~krishiv_core.errors.SchemaConflict`.

    A new table gets ``partition_by`` as its partition spec. Evolving is idempotent: a table that already fits is
    not touched. ``pending``: batches staged for the table and not yet committed; its partitioning does not change
    under them (their files were written per partition of the current spec), so the start is refused instead.
    When another process changes the table's metadata at the same moment (two creators evolving it
    alike, say), the commit fails, the table is reloaded and compared again. ``properties`` are set on a new table
    (and on an existing one with its schema change).

    With ``defer_schema`` (a run's start) the schema change is only checked (a conflict is still raised) and not
    made: the first batch staged applies it (``spark_jobs.staging``), so a run that fails before that leaves the
    table as it was. A partitioning change is made at once (it may need the new schema: then both are).
    """
    name = ".".join(identifier)
    try:
        with catalog_call(catalog, f"load table {name}"):
            table = catalog.load_table(identifier)
    except NoSuchTableError:
        with (
            catalog_call(catalog, f"create namespace {identifier[0]}"),
            contextlib.suppress(NamespaceAlreadyExistsError),
        ):
            catalog.create_namespace(identifier[0])
        try:
            with catalog_call(catalog, f"create table {name}"):
                return catalog.create_table(
                    identifier,
                    schema=schema,
                    partition_spec=partition_spec(schema, partition_by),
                    properties={**TABLE_PROPERTIES, **(properties or {})},
                )
        except TableAlreadyExistsError:
            with catalog_call(catalog, f"load table {name}"):
                table = catalog.load_table(identifier)
    if pending and partitioning_differs(table, partition_by):
        shown = "[" + ", ".join(map(str, partition_by)) + "]" if partition_by else "unpartitioned"
        raise SchemaConflict(
            f"table {name} is partitioned by {describe_spec(table.spec(), table.schema())} and the spec asks for "
            f"{shown}, but {pending} batch(es) staged for the current partitioning are not committed yet; nothing "
            f"was changed: run krishiv commit first, then start again {runbook('A spec change the table cannot take')}"
        )
    if defer_schema and not partitioning_differs(table, partition_by):
        planned_schema(table, schema, name)  # a conflict is refused now; the change waits for the first batch
        with catalog_call(catalog, f"update table {name}"):
            return _with_metadata_properties(table)

    def evolve(table: Table) -> Table:
        evolved = evolve_schema(table, schema, name, properties)
        return _with_metadata_properties(evolve_partitioning(evolved, partition_by, name))

    attempts = 5  # a concurrent metadata change won the commit: reload, compare again (bounded)
    with catalog_call(catalog, f"update table {name}"):
        for _ in range(attempts - 1):
            try:
                return evolve(table)
            except CommitFailedException:
                table = catalog.load_table(identifier)
        return evolve(table)


def ensure_pipeline_tables(
    catalog: Catalog,
    spec: KrishivSpec,
    pipeline: PipelineSpec,
    pending: Callable[[str], int] | None = None,
    *,
    defer_schema: bool = False,
) -> dict[str, Table]:
    """Every table the pipeline writes (``krishiv_core.tables.output_tables``), by unqualified name, created from
    the spec if missing and evolved to it otherwise. ``pending``: how many batches of a (qualified) table are staged
    and not committed (see :func:`ensure_table`). A row table records what it was created for
    (``krishiv_core.table_purpose``), and a spec that changes that is refused first, naming the pipeline.
    ``defer_schema``: check schema changes without making them (see :func:`ensure_table`)."""
    tables = {}
    for t in output_tables(pipeline):
        identifier = table_identifier(spec, t.name)
        writer = pipeline.writer_of(t.name)
        purpose = None if t.rejects else purpose_properties(writer)
        if purpose is not None:
            with contextlib.suppress(NoSuchTableError), catalog_call(catalog, f"load table {'.'.join(identifier)}"):
                check_purpose(writer, qualified(spec, t.name), catalog.load_table(identifier).properties)
        tables[t.name] = ensure_table(
            catalog,
            identifier,
            t.schema,
            partition_by=t.partition_by,
            pending=pending(qualified(spec, t.name)) if pending else 0,
            properties=purpose,
            defer_schema=defer_schema,
        )
    return tables
