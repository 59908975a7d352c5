"""Dagster resources that are clients: the Kafka cluster, the Spark session, the DuckDB ledger, the Iceberg catalog.

The assets, checks and sensors ask a resource for its client (:meth:`IcebergCatalogResource.catalog`,
:meth:`LedgerResource.ledger`, :meth:`SparkResource.session`, :meth:`KafkaResource.latest_offsets`) and hand it
to the same operations the CLI runs (:mod:`krishiv.operations`).

A resource's config is what the UI shows, so it holds addresses and settings and never a secret. An address the
environment supplies is an ``EnvVar`` (the UI shows the variable's name); a catalog URI or warehouse from the
spec file that carries a password or a secret query parameter is held in its redacted form (:func:`displayed`).
The catalog and ledger resources also depend on the spec itself (a nested resource with no config, which the
UI names but never shows): it gives the catalog's name, the folder relative paths start from, and, inside the
run process that read the spec file, the real value a redacted one stands for (:func:`resolve_displayed`).

Nothing here imports PySpark until a staging run asks for its session (:meth:`SparkResource.session`): the code
location, the sensors and the commit runs load this module too, and a commit run should start in about a second,
not spend several loading Spark it never uses (``tests/krishiv_assets/test_commit_run_imports.py``).
"""

# No `from __future__ import annotations`: Dagster recognizes a ResourceDependency field by its evaluated annotation.

from dataclasses import replace
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr
from pyiceberg.catalog import Catalog

from krishiv_core.catalog import MASK, has_secret, redact
from krishiv_core.errors import ConfigError, EnvironmentProblem, KrishivError
from krishiv_core.spec import KrishivSpec
from outbox.ledger import Ledger

_SPEC_DESCRIPTION = (
    "The spec file's settings (no config: the UI never shows them): the catalog name, the folder relative paths "
    "start from, and the spec file's own value behind a redacted one."
)


class KafkaResource(dg.ConfigurableResource):
    """The Kafka cluster the pipelines read. Only the address is config (the UI shows it); the client settings,
    ``[kafka.properties]`` with their secrets, stay in the spec and are resolved from the environment when a
    query runs, so no password reaches the UI."""

    bootstrap_servers: str

    def latest_offsets(self, topic: str, consumer: dict[str, str]) -> dict[str, int]:
        """Each partition's high watermark, asked with ``consumer`` (``spec.kafka.consumer_settings()``); raises
        ``KafkaSourceError``, one line naming the broker and the cause, if it does not answer (librdkafka's own
        log stays out of the run's logs)."""
        from spark_jobs.kafka_source import latest_offsets

        return latest_offsets(self.bootstrap_servers, topic, consumer)


class IcebergCatalogResource(dg.ConfigurableResource):
    """Where the tables live: a SQL catalog (SQLite, PostgreSQL) or a REST catalog, by URI scheme.

    The namespace and table names belong to the spec: they are the assets' identity, not an address.
    """

    spec: dg.ResourceDependency[KrishivSpec] = Field(repr=False, exclude=True, description=_SPEC_DESCRIPTION)
    uri: str = Field(
        description=(
            "The catalog URI. A password or secret parameter shows as *** and the spec file's own value is used "
            "in the run; pass a secret through the environment (KRISHIV_ICEBERG_CATALOG_URI), not krishiv.toml."
        )
    )
    warehouse: str = Field(description="Where the tables' files go (a path or a URI); secrets show as ***.")
    _catalog: Catalog | None = PrivateAttr(default=None)

    def catalog(self) -> Catalog:
        """The catalog, loaded on first use and kept for this resource instance (one run, or one step).

        Raises :class:`ConfigError` for a redacted URI that is not the spec file's, and
        :class:`CatalogUnavailable` (naming the redacted address) if the catalog does not answer.
        """
        if self._catalog is None:
            from krishiv_core import catalog

            self._catalog = catalog.load_catalog(self._catalog_spec())
        return self._catalog

    def _catalog_spec(self) -> KrishivSpec:
        """The spec with this resource's real URI and warehouse: what ``load_catalog`` reads them from."""
        spec = self.spec
        uri = resolve_displayed(self.uri, spec.iceberg.catalog_uri, "iceberg.uri", "KRISHIV_ICEBERG_CATALOG_URI")
        warehouse = resolve_displayed(
            self.warehouse, spec.iceberg.warehouse, "iceberg.warehouse", "KRISHIV_ICEBERG_WAREHOUSE"
        )
        return replace(spec, iceberg=replace(spec.iceberg, catalog_uri=uri, warehouse=warehouse))

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        engine = getattr(self._catalog, "engine", None)  # a SQL catalog's connection pool
        if engine is not None:
            engine.dispose()


class LedgerResource(dg.ConfigurableResource):
    """The outbox ledger (a DuckDB file or a PostgreSQL schema); every call on it is one short transaction."""

    spec: dg.ResourceDependency[KrishivSpec] = Field(repr=False, exclude=True, description=_SPEC_DESCRIPTION)
    path: str
    _ledgers: dict[float | None, Ledger] = PrivateAttr(default_factory=dict)

    def ledger(self, lock_timeout_s: float | None = None) -> Ledger:
        """The ledger at ``path`` (a DuckDB file relative to the spec file's folder, or a PostgreSQL URI), kept for
        this resource instance.

        ``lock_timeout_s``: how long a call waits for another process's lock; by default
        ``KRISHIV_LEDGER_LOCK_TIMEOUT_S`` (30 s), as for the CLI.
        """
        if lock_timeout_s not in self._ledgers:
            from krishiv.operations import ledger_lock_timeout_s

            path = resolve_displayed(
                self.path, self.spec.storage.ledger_path, "storage.ledger_path", "KRISHIV_LEDGER_PATH"
            )
            self._ledgers[lock_timeout_s] = Ledger(
                self.spec.ledger_location(path),
                lock_timeout_s if lock_timeout_s is not None else ledger_lock_timeout_s(),
            )
        return self._ledgers[lock_timeout_s]


#: The Spark application name of Dagster's runs.
DAGSTER_SPARK_APP = "krishiv-dagster"


def shown_spark_conf(spec: KrishivSpec) -> dict[str, str]:
    """The Spark configuration the UI may show: Krishiv's, with no secret of ``[spark.conf]`` in it."""
    from krishiv_core.client_settings import is_secret
    from spark_jobs.session import spark_conf

    return {k: v for k, v in spark_conf(spec, DAGSTER_SPARK_APP).items() if not is_secret(k)}


class LazySparkSession(dg.ConfigurableResource):
    """The Spark settings the UI shows, and the session built from them on first use.

    dagster-pyspark's ``LazyPySparkResource`` does the same, but importing ``dagster_pyspark`` imports PySpark and
    py4j: measured, 0.14 s and 10 MB more in every process that loads the code location (the webserver's, each
    sensor tick's, each commit run's), for a session only a staging run builds. This one imports PySpark in
    :attr:`spark_session`, in a staging run only; :class:`SparkResource` adds what Krishiv needs around it (the
    Java check, the secrets the UI is not shown, the Kafka source, stopping the session the run started), so
    Krishiv does not depend on dagster-pyspark.
    """

    spark_config: dict[str, Any]
    _spark_session: Any = PrivateAttr(default=None)

    @property
    def spark_session(self) -> Any:
        if self._spark_session is None:
            from pyspark.sql import SparkSession

            builder = SparkSession.builder
            for key, value in self.spark_config.items():
                builder = builder.config(key, value)
            self._spark_session = builder.getOrCreate()
        return self._spark_session


class SparkResource(dg.ConfigurableResource):
    """The Spark session, built on first use (:class:`LazySparkSession`), plus where the query checkpoints live."""

    spec: dg.ResourceDependency[KrishivSpec] = Field(repr=False, exclude=True, description=_SPEC_DESCRIPTION)
    pyspark: LazySparkSession
    checkpoint_location: str
    _owns_session: bool = PrivateAttr(default=False)

    def session(self) -> Any:
        """The session, with Java checked and Krishiv's Kafka source registered.

        Raises :class:`EnvironmentProblem`, one line naming what is missing, if Spark cannot start.
        """
        from pyspark.sql import SparkSession

        from spark_jobs.session import prepare_environment, prepare_session, require_master, spark_conf

        conf = {**spark_conf(self.spec, DAGSTER_SPARK_APP), **self.pyspark.spark_config}
        prepare_environment(conf)  # names a missing or too old Java before Spark's own, longer failure
        master = conf.get("spark.master", "the default master")
        if SparkSession.getActiveSession() is None:
            self._owns_session = True
            require_master(master)
            if conf.keys() - self.pyspark.spark_config.keys():
                # The secrets the UI was not shown: the session is built here with them, and the lazy
                # session's getOrCreate below returns it.
                builder = SparkSession.builder
                for key, value in conf.items():
                    builder = builder.config(key, value)
                builder.getOrCreate()
        try:
            return prepare_session(self.pyspark.spark_session)
        except KrishivError:
            raise
        except Exception as exc:
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            reason = lines[0] if lines else type(exc).__name__
            raise EnvironmentProblem(
                f"Spark did not start (master {master}): {reason}; check Java (JAVA_HOME, java on PATH) and "
                "the spark settings of the spec"
            ) from exc

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


def effective_spec(spec: KrishivSpec, *, kafka: KafkaResource, spark: SparkResource) -> KrishivSpec:
    """The spec the Spark query runs with: the resources' broker address and checkpoint folder.

    The query reads both from the spec (the Kafka source's options, the checkpoint path); the catalog and the
    ledger reach the operations as clients. A relative checkpoint path stays relative to the spec file.
    """
    return replace(
        spec,
        kafka=replace(spec.kafka, bootstrap_servers=kafka.bootstrap_servers),
        storage=replace(spec.storage, checkpoint_location=spark.checkpoint_location),
    )
