"""A spec's shared sections: ``[kafka]``, ``[iceberg]``, ``[storage]``, ``[spark]`` and ``[maintenance]``.

Each section's settings (docs/spec.md "Shared sections") and its parsing and validation, including the settings
exactly-once depends on that ``[kafka.consumer]``, ``[kafka.properties]`` and ``[spark.conf]`` may not name.
``[schema_registry]`` is :mod:`krishiv_core.formats`'; the environment overrides of these sections' addresses
and paths are applied by :func:`krishiv_core.spec.parse_spec` first. :mod:`krishiv_core.spec` re-exports the
settings classes and constants here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from krishiv_core.client_settings import parse_properties, resolve
from krishiv_core.errors import ConfigError
from krishiv_core.postgres_location import (
    CATALOG_FORM,
    LEDGER_FORM,
    libpq_uri_problem,
    location_refused,
    sqlalchemy_uri_problem,
)
from krishiv_core.spec_values import (
    did_you_mean,
    expect,
    identifier,
    parse_cron,
    parse_duration_ms,
    parse_size_bytes,
    positive_int,
)

#: librdkafka settings exactly-once depends on. The Kafka source always sets them, after any user setting, and a
#: spec's ``[kafka.consumer]`` table may not name them.
FORCED_CONSUMER_SETTINGS: Mapping[str, str | bool] = MappingProxyType(
    {
        "isolation.level": "read_committed",  # never hand over records of open or aborted transactions
        "enable.auto.commit": False,  # Spark's checkpoint and the ledger own the offsets, not a consumer group
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",  # an offset that is gone is an error, never a silent jump to another one
    }
)

#: Spark settings Krishiv sets itself (spark_jobs/session.py), which ``[spark.conf]`` may not name.
FORCED_SPARK_CONF: Mapping[str, str] = MappingProxyType(
    {
        "spark.master": "set spark.master instead",
        "spark.sql.shuffle.partitions": "set spark.shuffle_partitions instead",
        "spark.sql.streaming.noDataMicroBatches.enabled": "Krishiv sets it to false: every batch must read records",
        "spark.sql.session.timeZone": "Krishiv sets it to UTC: window bounds are UTC",
    }
)

#: Orphan removal refuses a grace period below this unless forced: a file being written or staged, not yet
#: recorded in the ledger or the table, is younger than this.
MIN_ORPHAN_GRACE_MS = 10 * 60_000


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap_servers: str = "127.0.0.1:9092"
    partitions: int = 4
    #: librdkafka settings of the Spark source's consumer only (``[kafka.consumer]``), unresolved.
    consumer: Mapping[str, str] = field(default_factory=dict)
    #: librdkafka settings of every client: consumer, producer, admin (``[kafka.properties]``: security), unresolved.
    properties: Mapping[str, str] = field(default_factory=dict)

    def client_settings(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """What a producer or admin client is built with: the bootstrap servers and ``[kafka.properties]``."""
        resolved = resolve(self.properties, os.environ if env is None else env, "kafka.properties")
        return {**resolved, "bootstrap.servers": self.bootstrap_servers}

    def consumer_settings(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The source consumer's settings besides the bootstrap servers and those exactly-once forces:
        ``[kafka.properties]`` and ``[kafka.consumer]``."""
        environ = os.environ if env is None else env
        properties = resolve(self.properties, environ, "kafka.properties")
        return {**properties, **resolve(self.consumer, environ, "kafka.consumer")}


@dataclass(frozen=True)
class IcebergSettings:
    catalog_uri: str = "sqlite:///state/catalog.db"
    warehouse: str = "state/warehouse"
    namespace: str = "krishiv"
    catalog_name: str = "krishiv"
    #: Anything pyiceberg's ``load_catalog`` takes (``[iceberg.properties]``: REST token/credential/prefix,
    #: ``header.*``, S3 endpoint and keys for the FileIO), unresolved.
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StorageSettings:
    ledger_path: str = "state/ledger.duckdb"
    checkpoint_location: str = "state/checkpoints"


@dataclass(frozen=True)
class SparkSettings:
    master: str = "local[*]"
    shuffle_partitions: int = 4
    records_per_split: int = 250_000
    #: Any other Spark configuration (``[spark.conf]``), unresolved; applied before the settings Krishiv forces.
    conf: Mapping[str, str] = field(default_factory=dict)

    def resolved_conf(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        return resolve(self.conf, os.environ if env is None else env, "spark.conf")


@dataclass(frozen=True)
class MaintenanceSettings:
    """``[maintenance]``: snapshot expiry, orphan-file removal and compaction of every table Krishiv writes.

    A snapshot is kept if it is one of the newest ``keep_last`` or younger than ``keep_younger_than``; the
    current snapshot and any branch or tag head always are (Iceberg's min-snapshots-to-keep and
    max-snapshot-age). A file neither a retained snapshot, the table's metadata nor a PENDING ledger entry refers
    to is removed once older than ``orphan_grace``. Compaction rewrites a partition's files smaller than
    ``target_file_size`` once it has ``min_files`` of them. ``schedule`` (cron) runs all three from Dagster;
    ``enabled = false`` leaves the schedule stopped (the commands still run when asked).
    """

    enabled: bool = True
    schedule: str = "0 * * * *"
    keep_last: int = 100
    keep_younger_than_ms: int = 15 * 60_000
    orphan_grace_ms: int = 24 * 3_600_000
    target_file_size: int = 128 << 20
    min_files: int = 5


# --------------------------------------------------------------------------------------------- parsing


def section(raw: Mapping[str, Any], name: str, allowed: set[str]) -> dict[str, Any]:
    """The spec's table ``name`` (empty when absent), refusing keys not in ``allowed``."""
    table = raw.get(name, {})
    expect(table, dict, name, "a table")
    unknown = set(table) - allowed
    if unknown:
        raise ConfigError(
            name, f"unknown keys {sorted(unknown)}; expected some of {sorted(allowed)}{did_you_mean(unknown, allowed)}"
        )
    return dict(table)


def _consumer_settings(raw: Any, env: Mapping[str, str]) -> dict[str, str]:
    """librdkafka settings of ``[kafka.consumer]``, refusing the settings exactly-once depends on."""
    settings = parse_properties(raw, "kafka.consumer", env)
    for name in settings:
        if name in FORCED_CONSUMER_SETTINGS:
            forced = FORCED_CONSUMER_SETTINGS[name]
            shown = str(forced).lower() if isinstance(forced, bool) else forced
            raise ConfigError(
                f"kafka.consumer.{name}", f"Krishiv sets this itself ({shown}) for exactly-once; remove it"
            )
    return settings


def _kafka_properties(raw: Any, env: Mapping[str, str]) -> dict[str, str]:
    """librdkafka settings of ``[kafka.properties]``, shared by every client (security, timeouts)."""
    settings = parse_properties(raw, "kafka.properties", env)
    for name in settings:
        if name == "bootstrap.servers":
            raise ConfigError("kafka.properties.bootstrap.servers", "set kafka.bootstrap_servers instead")
        if name in FORCED_CONSUMER_SETTINGS or name == "group.id":
            raise ConfigError(f"kafka.properties.{name}", "a consumer setting: Krishiv sets it itself; remove it")
    return settings


def parse_kafka(doc: Mapping[str, Any], env: Mapping[str, str]) -> KafkaSettings:
    k = section(doc, "kafka", {"bootstrap_servers", "partitions", "consumer", "properties"})
    kafka = KafkaSettings(
        bootstrap_servers=expect(
            k.get("bootstrap_servers", KafkaSettings.bootstrap_servers),
            str,
            "kafka.bootstrap_servers",
            "host:port[,host:port]",
        ),
        partitions=positive_int(k.get("partitions", 4), "kafka.partitions"),
        consumer=_consumer_settings(k.get("consumer", {}), env),
        properties=_kafka_properties(k.get("properties", {}), env),
    )
    servers = [server.strip() for server in kafka.bootstrap_servers.split(",")]
    kafka = replace(kafka, bootstrap_servers=",".join(servers))
    for server in servers:
        m = re.match(r"^[^:\s]+:(\d{1,5})$", server)
        if not m or not 0 < int(m.group(1)) < 65536:
            raise ConfigError(
                "kafka.bootstrap_servers", f"expected host:port[,host:port], got {kafka.bootstrap_servers!r}"
            )
    return kafka


def _pyiceberg_configured_uri(catalog_name: str) -> str | None:
    """The URI pyiceberg's own configuration (``.pyiceberg.yaml``, ``PYICEBERG_CATALOG__<NAME>__URI``) gives the
    catalog, which a spec without ``catalog_uri`` uses."""
    from pyiceberg.utils.config import Config

    uri = (Config().get_catalog_config(catalog_name) or {}).get("uri")
    return uri if isinstance(uri, str) else None


def parse_iceberg(doc: Mapping[str, Any], env: Mapping[str, str]) -> IcebergSettings:
    i = section(doc, "iceberg", {"catalog_uri", "warehouse", "namespace", "catalog_name", "properties"})
    catalog_name = identifier(i.get("catalog_name", IcebergSettings.catalog_name), "iceberg.catalog_name")
    iceberg = IcebergSettings(
        catalog_uri=expect(
            i.get("catalog_uri", _pyiceberg_configured_uri(catalog_name) or IcebergSettings.catalog_uri),
            str,
            "iceberg.catalog_uri",
            "a URI",
        ),
        warehouse=expect(i.get("warehouse", IcebergSettings.warehouse), str, "iceberg.warehouse", "a path or URI"),
        namespace=identifier(i.get("namespace", IcebergSettings.namespace), "iceberg.namespace"),
        catalog_name=catalog_name,
        properties=parse_properties(i.get("properties", {}), "iceberg.properties", env),
    )
    for name in ("uri", "warehouse"):
        if name in iceberg.properties:
            raise ConfigError(f"iceberg.properties.{name}", f"set iceberg.{'catalog_uri' if name == 'uri' else name}")
    scheme = iceberg.catalog_uri.split(":", 1)[0]
    if scheme not in ("sqlite", "postgresql+psycopg", "postgresql", "http", "https"):
        raise ConfigError(
            "iceberg.catalog_uri",
            # The scheme only: the rest of a URI may carry a password.
            f"expected sqlite:///PATH, postgresql+psycopg://… or http(s)://… (REST), got a {scheme!r} URI",
        )
    if scheme.startswith("postgresql"):  # read by SQLAlchemy's psycopg dialect, as the catalog will be
        uri = "postgresql+psycopg://" + iceberg.catalog_uri.split("://", 1)[-1]
        if problem := sqlalchemy_uri_problem(uri):
            raise ConfigError(
                "iceberg.catalog_uri", location_refused(problem, "it (or $KRISHIV_ICEBERG_CATALOG_URI)", CATALOG_FORM)
            )
    return iceberg


#: ``scheme://…``: a URI, where the storage settings take a path (``spec.resolve`` would make ``s3://b/x`` a
#: local folder named ``s3:``).
_URI_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_CHECKPOINT_NEEDS = (
    "Spark's checkpoint needs a filesystem with atomic rename, which an object store lacks, and no object-store "
    "connector (hadoop-aws) is installed; keep the warehouse on the object store and the checkpoint on a local "
    "disk or a mount every driver shares (NFS, EFS)"
)
_LEDGER_NEEDS = (
    "the ledger is a DuckDB file (a path, or duckdb:///path) on a local disk or a POSIX mount the stager, the relay "
    "and Dagster share, or a PostgreSQL schema (postgresql://user@host:5432/db?schema=krishiv) when they share no disk"
)
#: Locations of a ledger on a PostgreSQL server (``storage.ledger_path``); anything else is a DuckDB file.
SERVER_LEDGER_SCHEMES = ("postgresql://", "postgres://", "postgresql+psycopg://")
DUCKDB_LEDGER_SCHEME = "duckdb://"


def parse_storage(doc: Mapping[str, Any]) -> StorageSettings:
    s = section(doc, "storage", {"ledger_path", "checkpoint_location"})
    storage = StorageSettings(
        ledger_path=expect(
            s.get("ledger_path", StorageSettings.ledger_path),
            str,
            "storage.ledger_path",
            "a path, duckdb:///path or postgresql://…",
        ),
        checkpoint_location=expect(
            s.get("checkpoint_location", StorageSettings.checkpoint_location),
            str,
            "storage.checkpoint_location",
            "a path",
        ),
    )

    for name, value, what, reason in (
        (
            "storage.checkpoint_location",
            storage.checkpoint_location,
            "a path on a local disk or a shared filesystem",
            _CHECKPOINT_NEEDS,
        ),
        ("storage.ledger_path", storage.ledger_path, "a path, duckdb:///path or postgresql://…", _LEDGER_NEEDS),
    ):
        if name == "storage.ledger_path" and value.startswith(SERVER_LEDGER_SCHEMES):
            if problem := libpq_uri_problem(value, own=("schema",)):
                raise ConfigError(name, location_refused(problem, "it (or $KRISHIV_LEDGER_PATH)", LEDGER_FORM))
            continue
        if name == "storage.ledger_path" and value.startswith(DUCKDB_LEDGER_SCHEME):
            continue
        if m := _URI_SCHEME.match(value):
            if m.group(1).lower() == "file":
                raise ConfigError(name, f"expected a path, not a file:// URI: write the path itself ({value[7:]})")
            raise ConfigError(name, f"expected {what}, not a {m.group(1)}:// URI: {reason}")
    return storage


def _spark_conf(raw: Any, env: Mapping[str, str]) -> dict[str, str]:
    conf = parse_properties(raw, "spark.conf", env)
    for name in conf:
        if name in FORCED_SPARK_CONF:
            raise ConfigError(f"spark.conf.{name}", FORCED_SPARK_CONF[name])
        if not name.startswith("spark."):
            raise ConfigError(f"spark.conf.{name}", "expected a Spark setting, whose name starts with 'spark.'")
    return conf


def parse_spark(doc: Mapping[str, Any], env: Mapping[str, str]) -> SparkSettings:
    sp = section(doc, "spark", {"master", "shuffle_partitions", "records_per_split", "conf"})
    return SparkSettings(
        master=expect(sp.get("master", SparkSettings.master), str, "spark.master", "a Spark master URL"),
        shuffle_partitions=positive_int(sp.get("shuffle_partitions", 4), "spark.shuffle_partitions"),
        records_per_split=positive_int(sp.get("records_per_split", 250_000), "spark.records_per_split"),
        conf=_spark_conf(sp.get("conf", {}), env),
    )


def parse_maintenance(doc: Mapping[str, Any]) -> MaintenanceSettings:
    m = section(
        doc,
        "maintenance",
        {"enabled", "schedule", "keep_last", "keep_younger_than", "orphan_grace", "target_file_size", "min_files"},
    )
    d = MaintenanceSettings()
    settings = MaintenanceSettings(
        enabled=expect(m.get("enabled", d.enabled), bool, "maintenance.enabled", "true or false"),
        schedule=parse_cron(m.get("schedule", d.schedule), "maintenance.schedule"),
        keep_last=positive_int(m.get("keep_last", d.keep_last), "maintenance.keep_last"),
        keep_younger_than_ms=parse_duration_ms(
            m.get("keep_younger_than", d.keep_younger_than_ms), "maintenance.keep_younger_than"
        ),
        orphan_grace_ms=parse_duration_ms(m.get("orphan_grace", d.orphan_grace_ms), "maintenance.orphan_grace"),
        target_file_size=parse_size_bytes(
            m.get("target_file_size", d.target_file_size), "maintenance.target_file_size"
        ),
        min_files=positive_int(m.get("min_files", d.min_files), "maintenance.min_files"),
    )
    if settings.min_files < 2:
        raise ConfigError(
            "maintenance.min_files", f"expected at least 2 (one file is not compacted), got {m['min_files']!r}"
        )
    if settings.orphan_grace_ms < MIN_ORPHAN_GRACE_MS:
        raise ConfigError(
            "maintenance.orphan_grace",
            f"expected at least {MIN_ORPHAN_GRACE_MS // 60_000}m (a file being staged is not recorded yet), "
            f"got {m['orphan_grace']!r}",
        )
    return settings
