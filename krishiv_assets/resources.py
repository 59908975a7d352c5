"""Dagster resources: the Kafka cluster, the Spark session, the DuckDB ledger and the Iceberg catalog.

Each holds only addresses and settings (given as ``EnvVar`` where the environment supplies them, so the UI
shows the variable, not a password in a catalog URI). :func:`effective_spec` lays them over the pipeline
spec, and the assets run the same operations as the CLI with that spec.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import PrivateAttr

from krishiv.spec import KrishivSpec
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

    uri: str
    warehouse: str


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


def effective_spec(
    spec: KrishivSpec,
    *,
    kafka: KafkaResource | None = None,
    iceberg: IcebergCatalogResource | None = None,
    ledger: LedgerResource | None = None,
    spark: SparkResource | None = None,
) -> KrishivSpec:
    """The spec with the given resources' addresses and paths; relative paths stay relative to the spec file."""
    if kafka is not None:
        spec = replace(spec, kafka=replace(spec.kafka, bootstrap_servers=kafka.bootstrap_servers))
    if iceberg is not None:
        spec = replace(spec, iceberg=replace(spec.iceberg, catalog_uri=iceberg.uri, warehouse=iceberg.warehouse))
    if ledger is not None:
        spec = replace(spec, storage=replace(spec.storage, ledger_path=ledger.path))
    if spark is not None:
        spec = replace(spec, storage=replace(spec.storage, checkpoint_location=spark.checkpoint_location))
    return spec
