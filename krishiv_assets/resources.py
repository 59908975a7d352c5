"""Dagster resources: the Kafka cluster, the Spark session, the DuckDB ledger and the Iceberg catalog.

Each holds only addresses and settings, and never a secret: the UI shows every resource's config. An address
the environment supplies is an ``EnvVar`` (the UI shows the variable's name); a catalog URI or warehouse from
the spec file that carries a password or a secret query parameter is held in its redacted form
(:func:`displayed`), and :func:`effective_spec` puts the spec file's real value back inside the run process.
The assets run the same operations as the CLI with that spec.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import Field, PrivateAttr

from krishiv_core.catalog import MASK, has_secret, redact
from krishiv_core.errors import ConfigError
from krishiv_core.spec import KrishivSpec
from outbox.ledger import DEFAULT_LOCK_TIMEOUT_S, Ledger


class KafkaResource(dg.ConfigurableResource):
    """The Kafka cluster the pipelines read (consumer settings beyond the address stay in the spec)."""

    bootstrap_servers: str

    def latest_offsets(self, topic: str, consumer: dict[str, str]) -> dict[str, int]:
        """Each partition's high watermark; raises ``KafkaSourceError`` naming the broker if it does not answer."""
        from spark_jobs.kafka_source import latest_offsets

        return latest_offsets(self.bootstrap_servers, topic, consumer)


class IcebergCatalogResource(dg.ConfigurableResource):
    """Where the tables live: a SQL catalog (SQLite, PostgreSQL) or a REST catalog, by URI scheme.

    The namespace and table names belong to the spec: they are the assets' identity, not an address.
    """

    uri: str = Field(
        description=(
            "The catalog URI. A password or secret parameter shows as *** and the spec file's own value is used "
            "in the run; pass a secret through the environment (KRISHIV_ICEBERG_CATALOG_URI), not krishiv.toml."
        )
    )
    warehouse: str = Field(description="Where the tables' files go (a path or a URI); secrets show as ***.")


class LedgerResource(dg.ConfigurableResource):
    """The DuckDB outbox ledger; every call opens it for one short transaction."""

    path: str

    def open(self, spec: KrishivSpec, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Ledger:
        return Ledger(spec.resolve(self.path), lock_timeout_s)


class SparkResource(dg.ConfigurableResource):
    """The Spark session, built by dagster-pyspark on first use, plus where the query checkpoints live."""

    pyspark: LazyPySparkResource
    checkpoint_location: str
    _owns_session: bool = PrivateAttr(default=False)

    def session(self) -> Any:
        from pyspark.sql import SparkSession

        from spark_jobs.session import prepare_environment, prepare_session

        prepare_environment()
        self._owns_session = self._owns_session or SparkSession.getActiveSession() is None
        return prepare_session(self.pyspark.spark_session)

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        # A run process started the JVM; stop it so the run ends promptly. A session that was there
        # before (materialize() inside a test, say) belongs to its creator.
        if self._owns_session:
            from pyspark.sql import SparkSession

            active = SparkSession.getActiveSession()
            if active is not None:
                active.stop()


def displayed(value: str) -> str:
    """A spec value as a resource may hold it: with its secrets redacted (the UI shows resource config)."""
    return redact(value)


def resolve_displayed(value: str, spec_value: str, field: str, variable: str) -> str:
    """The real value behind a resource's ``value``.

    The redacted form of the spec's own value stands for that value (the spec file is read again in each
    run process); any other value is used as given, unless it is a redacted form itself, whose secret is
    nowhere to be had.
    """
    if value == spec_value:
        return value
    if has_secret(spec_value) and value == redact(spec_value):
        return spec_value
    if MASK in value and has_secret(value) and redact(value) == value:
        raise ConfigError(
            field,
            f"{value} is a redacted value, not the spec file's ({redact(spec_value)}); pass the real one in "
            f"the environment as {variable}, which the code location gives the resource as an EnvVar",
        )
    return value


def effective_spec(
    spec: KrishivSpec,
    *,
    kafka: KafkaResource | None = None,
    iceberg: IcebergCatalogResource | None = None,
    ledger: LedgerResource | None = None,
    spark: SparkResource | None = None,
) -> KrishivSpec:
    """The spec with the given resources' addresses and paths; relative paths stay relative to the spec file.

    A catalog URI or warehouse the resource holds in redacted form is the spec's own: the spec keeps it.
    """
    if kafka is not None:
        spec = replace(spec, kafka=replace(spec.kafka, bootstrap_servers=kafka.bootstrap_servers))
    if iceberg is not None:
        uri = resolve_displayed(iceberg.uri, spec.iceberg.catalog_uri, "iceberg.uri", "KRISHIV_ICEBERG_CATALOG_URI")
        warehouse = resolve_displayed(
            iceberg.warehouse, spec.iceberg.warehouse, "iceberg.warehouse", "KRISHIV_ICEBERG_WAREHOUSE"
        )
        spec = replace(spec, iceberg=replace(spec.iceberg, catalog_uri=uri, warehouse=warehouse))
    if ledger is not None:
        spec = replace(spec, storage=replace(spec.storage, ledger_path=ledger.path))
    if spark is not None:
        spec = replace(spec, storage=replace(spec.storage, checkpoint_location=spark.checkpoint_location))
    return spec
