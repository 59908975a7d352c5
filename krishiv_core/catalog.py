"""The Iceberg catalog behind one narrow interface: load it from the spec, create the output tables.

``KRISHIV_ICEBERG_CATALOG_URI`` picks the catalog by scheme: ``sqlite:///PATH`` or
``postgresql+psycopg://…`` for pyiceberg's SQL catalog, ``http(s)://…`` for a REST catalog.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import unquote, urlparse

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from krishiv_core.client_settings import MASK, is_secret, resolve
from krishiv_core.errors import CatalogUnavailable, SchemaConflict
from krishiv_core.evolution import evolve_partitioning, evolve_schema, partitioning_differs
from krishiv_core.partitioning import PartitionField, describe_spec, partition_spec
from krishiv_core.spec import KrishivSpec, PipelineSpec
from krishiv_core.tables import output_tables

#: Table properties Krishiv sets on the tables it creates. The relay owns commit retries (it re-checks
#: the table before each attempt), so pyiceberg's own retry loop is switched off.
TABLE_PROPERTIES = {
    "format-version": "2",
    "commit.retry.num-retries": "0",
    "write.parquet.compression-codec": "zstd",
}


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


def load_catalog(spec: KrishivSpec) -> Catalog:
    """The spec's catalog: pyiceberg's SQL catalog for ``sqlite:``/``postgresql:`` URIs, its REST catalog for
    ``http(s):`` ones; a catalog that does not answer is one :class:`CatalogUnavailable` line."""
    from pyiceberg.catalog import load_catalog as pyiceberg_load_catalog

    properties = catalog_properties(spec)
    uri = properties["uri"]
    warehouse = properties["warehouse"]
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    if warehouse.startswith("file://"):
        Path(urlparse(warehouse).path).mkdir(parents=True, exist_ok=True)
    if not uri.startswith(("http://", "https://")):
        properties.setdefault("type", "sql")
    try:
        return pyiceberg_load_catalog(spec.iceberg.catalog_name, **properties)
    except Exception as exc:  # connection errors differ by driver: name the address whatever they are
        message = redact_text(str(exc), uri)
        for name, value in properties.items():
            if is_secret(name) and len(value) >= 4:
                message = message.replace(value, MASK)
        raise CatalogUnavailable(f"Iceberg catalog at {redact(uri)} is unreachable: {message}") from exc


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
) -> Table:
    """Load the table, creating the namespace and table on first use (concurrent creators are fine), and bring
    an existing table to ``schema`` and ``partition_by`` as ``krishiv_core.evolution`` allows, or raise
    :class:`~krishiv_core.errors.SchemaConflict`.

    A new table gets ``partition_by`` as its partition spec. Evolving is idempotent: a table that already fits is
    not touched. ``pending``: batches staged for the table and not yet committed; its partitioning does not change
    under them (their files were written per partition of the current spec), so the start is refused instead.
    When another process changes the table's metadata at the same moment (two creators evolving it
    alike, say), the commit fails, the table is reloaded and compared again.
    """
    name = ".".join(identifier)
    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        with contextlib.suppress(NamespaceAlreadyExistsError):
            catalog.create_namespace(identifier[0])
        try:
            return catalog.create_table(
                identifier,
                schema=schema,
                partition_spec=partition_spec(schema, partition_by),
                properties=TABLE_PROPERTIES,
            )
        except TableAlreadyExistsError:
            table = catalog.load_table(identifier)
    if pending and partitioning_differs(table, partition_by):
        shown = "[" + ", ".join(map(str, partition_by)) + "]" if partition_by else "unpartitioned"
        raise SchemaConflict(
            f"table {name} is partitioned by {describe_spec(table.spec(), table.schema())} and the spec asks for "
            f"{shown}, but {pending} batch(es) staged for the current partitioning are not committed yet; nothing "
            "was changed: run krishiv commit first, then start again"
        )
    attempts = 5  # a concurrent metadata change won the commit: reload, compare again (bounded)
    for _ in range(attempts - 1):
        try:
            return evolve_partitioning(evolve_schema(table, schema, name), partition_by, name)
        except CommitFailedException:
            table = catalog.load_table(identifier)
    return evolve_partitioning(evolve_schema(table, schema, name), partition_by, name)


def ensure_pipeline_tables(
    catalog: Catalog, spec: KrishivSpec, pipeline: PipelineSpec, pending: Callable[[str], int] | None = None
) -> dict[str, Table]:
    """Every table the pipeline writes (``krishiv_core.tables.output_tables``), by unqualified name, created from
    the spec if missing and evolved to it otherwise. ``pending``: how many batches of a (qualified) table are staged
    and not committed (see :func:`ensure_table`)."""
    return {
        t.name: ensure_table(
            catalog,
            table_identifier(spec, t.name),
            t.schema,
            partition_by=t.partition_by,
            pending=pending(qualified(spec, t.name)) if pending else 0,
        )
        for t in output_tables(pipeline)
    }
