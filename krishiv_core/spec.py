"""The declarative pipeline spec: one TOML file drives the Spark job, the relay and the Dagster assets.

A spec file holds shared settings (Kafka, Iceberg, storage, Spark) and one or more ``[[pipelines]]``.
Each pipeline reads one topic and parses JSON events with a declared schema; its ``kind`` says what it writes:

- ``windowed`` (the default): aggregates per event-time window (tumbling, or hopping with ``slide``), per
  ``group_by`` key, written once the watermark passes a window (``output_mode = "append"``) or replaced as its
  events arrive (``"update"``);
- ``events``: every valid event one row, with optional Kafka metadata columns; ``route_by`` a field sends
  each event to the table of its value's route (fan-out);
- ``upsert``: the latest row per ``key`` (by ``version_field``, else Kafka offset), deleted by a tombstone.

Every pipeline also writes ``<table>_rejects``, and any table may be partitioned (``partition_by``).
Environment variables override the shared addresses and paths so one file serves a laptop and a cluster.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from krishiv_core.client_settings import parse_properties, resolve
from krishiv_core.errors import ConfigError
from krishiv_core.formats import (
    AVRO,
    CDC_COLUMNS,
    FORMAT_KEYS,
    REGISTRY_FORMATS,
    RecordFormat,
    RegistrySettings,
    parse_record_format,
    parse_registry,
)
from krishiv_core.partitioning import PartitionField, parse_partition_by
from krishiv_core.schema_fields import registry_fields
from krishiv_core.spec_types import EventField, FieldType

DEFAULT_SPEC_FILE = "krishiv.toml"
SPEC_FILE_ENV = "KRISHIV_SPEC"

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

#: Environment overrides, by the field of the spec they replace.
ENV_OVERRIDES = {
    "KRISHIV_KAFKA_BOOTSTRAP": "kafka.bootstrap_servers",
    "KRISHIV_ICEBERG_CATALOG_URI": "iceberg.catalog_uri",
    "KRISHIV_ICEBERG_WAREHOUSE": "iceberg.warehouse",
    "KRISHIV_LEDGER_PATH": "storage.ledger_path",
    "KRISHIV_CHECKPOINT_LOCATION": "storage.checkpoint_location",
}

#: Where a pipeline whose fields come from the registry keeps the schema it read last (in its checkpoint folder).
REGISTRY_SCHEMA_FILE = "krishiv/registry-schema.json"

_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
_SCALAR_TYPES = ("string", "long", "int", "double", "boolean", "timestamp_ms", "timestamp", "date")
_AGG_FUNCTIONS = ("count", "sum", "min", "max", "avg")
_DURATION = re.compile(r"^(\d+)\s*(ms|s|m|h|d)$")
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_SIZE = re.compile(r"^(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?$")
_SIZE_BYTES = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}
_CRON_FIELD = re.compile(r"^[0-9A-Za-z*/,?-]+$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OUTPUT_MODES = ("append", "update")
WINDOWED, EVENTS, UPSERT = "windowed", "events", "upsert"
KINDS = (WINDOWED, EVENTS, UPSERT)
#: Kafka metadata columns an ``events`` or ``upsert`` pipeline may add, by the name used in ``kafka_metadata``.
KAFKA_METADATA = ("topic", "partition", "offset", "timestamp", "key")
KAFKA_METADATA_PREFIX = "_kafka_"
REJECTS = "rejects"


@dataclass(frozen=True)
class Aggregation:
    """One output column: ``function(field)`` named ``name``; ``count`` takes no field."""

    name: str
    function: str
    field: str | None = None


@dataclass(frozen=True)
class Route:
    """Events whose ``route_by`` field equals ``value`` go to ``table``."""

    value: str
    table: str


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    topic: str
    table: str
    event_time_field: str | None
    fields: tuple[EventField, ...]
    aggregations: tuple[Aggregation, ...] = ()
    kind: str = WINDOWED
    watermark_delay_ms: int = 5_000
    window_ms: int = 60_000
    slide_ms: int | None = None  # hopping windows: a window starts every slide; None is tumbling
    group_by: tuple[str, ...] = ()
    trigger_interval_ms: int = 2_000
    max_records_per_batch: int = 200_000
    # While more than one batch behind, a batch planned afresh may read this many records (0: never more than
    # max_records_per_batch): each batch has a fixed cost, so a backlog drains sooner in fewer, larger batches.
    catch_up_records_per_batch: int = 0
    output_mode: str = "append"
    partition_by: tuple[PartitionField, ...] = ()
    kafka_metadata: tuple[str, ...] = ()
    route_by: str | None = None
    routes: tuple[Route, ...] = ()
    unrouted: str = REJECTS  # the table events without a route go to, or REJECTS
    key: tuple[str, ...] = ()
    version_field: str | None = None
    delete_field: str | None = None
    #: How the topic's records are encoded (JSON by default; Schema Registry formats; a Debezium envelope).
    record_format: RecordFormat = field(default_factory=RecordFormat)

    @property
    def remembers_deletes(self) -> bool:
        """Whether a delete event carries a version the key must remember (upsert rule): a ``delete_field`` or
        Debezium's ``d`` events, ordered by a version."""
        return bool(self.version_field) and (bool(self.delete_field) or self.record_format.envelope is not None)

    @property
    def rejects_table(self) -> str:
        return f"{self.table}_rejects"

    @property
    def tables(self) -> tuple[str, ...]:
        """The tables the pipeline writes rows to, rejects aside: its table, or its routes' (and the default's)."""
        if not self.routes:
            return (self.table,)
        routed = tuple(dict.fromkeys(r.table for r in self.routes))
        return routed + ((self.unrouted,) if self.unrouted != REJECTS and self.unrouted not in routed else ())

    @property
    def all_tables(self) -> tuple[str, ...]:
        """Every table the pipeline writes: its row tables, then its rejects table."""
        return (*self.tables, self.rejects_table)

    @property
    def metadata_columns(self) -> tuple[str, ...]:
        return tuple(KAFKA_METADATA_PREFIX + m for m in self.kafka_metadata)

    @property
    def window_slide_ms(self) -> int:
        return self.slide_ms or self.window_ms

    def field(self, name: str) -> EventField:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)


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


#: Orphan removal refuses a grace period below this unless forced: a file being written or staged, not yet
#: recorded in the ledger or the table, is younger than this.
MIN_ORPHAN_GRACE_MS = 10 * 60_000


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


def _resolved(base_dir: Path, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (base_dir / p).resolve()


@dataclass(frozen=True)
class KrishivSpec:
    kafka: KafkaSettings
    iceberg: IcebergSettings
    storage: StorageSettings
    spark: SparkSettings
    pipelines: tuple[PipelineSpec, ...]
    base_dir: Path = Path(".")
    maintenance: MaintenanceSettings = field(default_factory=MaintenanceSettings)
    schema_registry: RegistrySettings | None = None

    def pipeline(self, name: str | None = None) -> PipelineSpec:
        if name is None:
            return self.pipelines[0]
        for p in self.pipelines:
            if p.name == name:
                return p
        raise ConfigError("pipelines", f"no pipeline named {name!r}; have {[p.name for p in self.pipelines]}")

    def checkpoint_dir(self, pipeline: PipelineSpec) -> Path:
        return self.resolve(self.storage.checkpoint_location) / pipeline.name

    def resolve(self, path: str) -> Path:
        """A path of the spec, relative to the spec file's folder unless absolute."""
        return _resolved(self.base_dir, path)

    def warehouse_uri(self) -> str:
        w = self.iceberg.warehouse
        if "://" in w:
            return w
        return self.resolve(w).as_uri()

    def catalog_uri(self) -> str:
        """The catalog URI with a relative SQLite path made absolute against the spec's folder."""
        uri = self.iceberg.catalog_uri
        prefix = "sqlite:///"
        if uri.startswith(prefix) and not uri.startswith(prefix + "/") and uri != "sqlite:///:memory:":
            return prefix + str(self.resolve(uri[len(prefix) :]))
        return uri


# --------------------------------------------------------------------------------------------- parsing


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


#: Spark settings Krishiv sets itself (spark_jobs/session.py), which ``[spark.conf]`` may not name.
FORCED_SPARK_CONF: Mapping[str, str] = MappingProxyType(
    {
        "spark.master": "set spark.master instead",
        "spark.sql.shuffle.partitions": "set spark.shuffle_partitions instead",
        "spark.sql.streaming.noDataMicroBatches.enabled": "Krishiv sets it to false: every batch must read records",
        "spark.sql.session.timeZone": "Krishiv sets it to UTC: window bounds are UTC",
    }
)


def _spark_conf(raw: Any, env: Mapping[str, str]) -> dict[str, str]:
    conf = parse_properties(raw, "spark.conf", env)
    for name in conf:
        if name in FORCED_SPARK_CONF:
            raise ConfigError(f"spark.conf.{name}", FORCED_SPARK_CONF[name])
        if not name.startswith("spark."):
            raise ConfigError(f"spark.conf.{name}", "expected a Spark setting, whose name starts with 'spark.'")
    return conf


def _expect(value: Any, kind: type | tuple[type, ...], field_name: str, what: str) -> Any:
    if isinstance(value, bool) and kind in (int, (int,)):
        raise ConfigError(field_name, f"expected {what}, got {value!r}")
    if not isinstance(value, kind):
        raise ConfigError(field_name, f"expected {what}, got {value!r}")
    return value


def parse_duration_ms(value: Any, field_name: str) -> int:
    """``"5s"``, ``"1m"``, ``"250ms"``, ``"1h"``, ``"7d"`` or a whole number of milliseconds."""
    if isinstance(value, int) and not isinstance(value, bool):
        ms = value
    elif isinstance(value, str) and (m := _DURATION.match(value.strip())):
        ms = int(m.group(1)) * _DURATION_MS[m.group(2)]
    else:
        raise ConfigError(field_name, f"expected a duration like '5s', '1m' or '250ms', got {value!r}")
    if ms <= 0:
        raise ConfigError(field_name, f"expected a positive duration, got {value!r}")
    return ms


def parse_size_bytes(value: Any, field_name: str) -> int:
    """``"128MiB"``, ``"512KiB"``, ``"1GB"`` or a whole number of bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (m := _SIZE.match(value.strip())):
        size = int(m.group(1)) * _SIZE_BYTES[m.group(2) or "B"]
    else:
        raise ConfigError(field_name, f"expected a size like '128MiB', '512KiB' or a number of bytes, got {value!r}")
    if size <= 0:
        raise ConfigError(field_name, f"expected a positive size, got {value!r}")
    return size


def parse_cron(value: Any, field_name: str) -> str:
    """A cron string of five fields (minute hour day-of-month month day-of-week), as Dagster's schedules take."""
    fields = value.split() if isinstance(value, str) else []
    if len(fields) != 5 or not all(_CRON_FIELD.match(f) for f in fields):
        raise ConfigError(field_name, f"expected a cron string of five fields such as '0 * * * *', got {value!r}")
    return " ".join(fields)


def _parse_maintenance(doc: Mapping[str, Any]) -> MaintenanceSettings:
    m = _section(
        doc,
        "maintenance",
        {"enabled", "schedule", "keep_last", "keep_younger_than", "orphan_grace", "target_file_size", "min_files"},
    )
    d = MaintenanceSettings()
    settings = MaintenanceSettings(
        enabled=_expect(m.get("enabled", d.enabled), bool, "maintenance.enabled", "true or false"),
        schedule=parse_cron(m.get("schedule", d.schedule), "maintenance.schedule"),
        keep_last=_positive_int(m.get("keep_last", d.keep_last), "maintenance.keep_last"),
        keep_younger_than_ms=parse_duration_ms(
            m.get("keep_younger_than", d.keep_younger_than_ms), "maintenance.keep_younger_than"
        ),
        orphan_grace_ms=parse_duration_ms(m.get("orphan_grace", d.orphan_grace_ms), "maintenance.orphan_grace"),
        target_file_size=parse_size_bytes(
            m.get("target_file_size", d.target_file_size), "maintenance.target_file_size"
        ),
        min_files=_positive_int(m.get("min_files", d.min_files), "maintenance.min_files"),
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


def parse_field_type(value: Any, field_name: str) -> FieldType:
    text = _expect(value, str, field_name, f"a type ({', '.join(_SCALAR_TYPES)} or decimal(p,s))").strip()
    if text in _SCALAR_TYPES:
        return FieldType(text)
    m = _DECIMAL.match(text)
    if m:
        precision, scale = int(m.group(1)), int(m.group(2))
        if not (1 <= precision <= 38 and 0 <= scale <= precision):
            raise ConfigError(field_name, f"decimal precision must be 1..38 and scale 0..precision, got {text}")
        return FieldType("decimal", precision, scale)
    raise ConfigError(field_name, f"expected one of {', '.join(_SCALAR_TYPES)} or decimal(p,s), got {text!r}")


def _identifier(value: Any, field_name: str) -> str:
    text = _expect(value, str, field_name, "a name")
    if not _IDENTIFIER.match(text):
        raise ConfigError(field_name, f"expected a name of letters, digits and underscores, got {text!r}")
    return text


def _catch_up_records(value: Any, where: str, max_records: int) -> int:
    """``catch_up_records_per_batch``: 0 (off), or more than ``max_records_per_batch``."""
    if type(value) is int and value == 0:
        return 0
    records = _positive_int(value, f"{where}.catch_up_records_per_batch")
    if records <= max_records:
        raise ConfigError(
            f"{where}.catch_up_records_per_batch",
            f"expected 0 (off) or more than max_records_per_batch ({max_records}), got {records}",
        )
    return records


def _positive_int(value: Any, field_name: str) -> int:
    number = _expect(value, int, field_name, "a whole number")
    if number <= 0:
        raise ConfigError(field_name, f"expected a positive whole number, got {number}")
    return number


def _parse_fields(raw: Any, where: str) -> tuple[EventField, ...]:
    _expect(raw, dict, where, "a table of field = type")
    fields = []
    for name, decl in raw.items():
        fname = f"{where}.{name}"
        _identifier(name, fname)
        if isinstance(decl, dict):
            unknown = set(decl) - {"type", "required"}
            if unknown:
                raise ConfigError(fname, f"unknown keys {sorted(unknown)}; expected 'type' and 'required'")
            ftype = parse_field_type(decl.get("type"), f"{fname}.type")
            required = _expect(decl.get("required", True), bool, f"{fname}.required", "true or false")
        else:
            ftype, required = parse_field_type(decl, fname), True
        fields.append(EventField(name, ftype, required))
    if not fields:
        raise ConfigError(where, "expected at least one field")
    return tuple(fields)


def _parse_aggregations(raw: Any, where: str, fields: tuple[EventField, ...]) -> tuple[Aggregation, ...]:
    _expect(raw, list, where, "a list of {name, function, field}")
    by_name = {f.name: f for f in fields}
    out: list[Aggregation] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        _expect(item, dict, at, "a table with name, function and field")
        unknown = set(item) - {"name", "function", "field"}
        if unknown:
            raise ConfigError(at, f"unknown keys {sorted(unknown)}; expected name, function, field")
        name = _identifier(item.get("name"), f"{at}.name")
        function = item.get("function")
        if function not in _AGG_FUNCTIONS:
            raise ConfigError(f"{at}.function", f"expected one of {', '.join(_AGG_FUNCTIONS)}, got {function!r}")
        source = item.get("field")
        if function == "count":
            if source is not None and source not in by_name:
                raise ConfigError(f"{at}.field", f"no event field named {source!r}")
        else:
            if source not in by_name:
                raise ConfigError(f"{at}.field", f"expected one of the event fields {sorted(by_name)}, got {source!r}")
            ftype = by_name[source].type
            if function in ("sum", "avg") and not ftype.is_numeric:
                raise ConfigError(f"{at}.field", f"{function} needs a numeric field; {source} is {ftype}")
        if name in {a.name for a in out} or name in ("window_start", "window_end"):
            raise ConfigError(f"{at}.name", f"output column {name!r} is used twice")
        out.append(Aggregation(name, function, source))
    if not out:
        raise ConfigError(where, "expected at least one aggregation")
    return tuple(out)


_COMMON_KEYS = {
    "name",
    "kind",
    "topic",
    "table",
    "fields",
    "trigger_interval",
    "max_records_per_batch",
    "catch_up_records_per_batch",
    "partition_by",
    *FORMAT_KEYS,
}
_KIND_KEYS = {
    WINDOWED: {"event_time_field", "watermark_delay", "window", "slide", "group_by", "output_mode", "aggregations"},
    EVENTS: {"event_time_field", "kafka_metadata", "route_by", "routes", "unrouted"},
    UPSERT: {"event_time_field", "kafka_metadata", "key", "version_field", "delete_field"},
}
#: Every key a pipeline may have, whatever its kind: a key no kind has is matched against them as a misspelling
#: (one of another kind is not: the message lists the kind's keys).
_ALL_PIPELINE_KEYS = _COMMON_KEYS.union(*_KIND_KEYS.values())


def _field_names(raw: Any, where: str, by_name: Mapping[str, EventField], what: str) -> tuple[str, ...]:
    names = [raw] if isinstance(raw, str) else _expect(raw, list, where, f"a list of {what}")
    for i, name in enumerate(names):
        if not isinstance(name, str) or name not in by_name:
            raise ConfigError(f"{where}[{i}]", f"expected one of the event fields {sorted(by_name)}, got {name!r}")
    if len(set(names)) != len(names):
        raise ConfigError(where, f"a field is named twice: {names}")
    return tuple(names)


def _one_field(raw: Any, where: str, by_name: Mapping[str, EventField], types: tuple[str, ...], what: str) -> str:
    if not isinstance(raw, str) or raw not in by_name:
        raise ConfigError(where, f"expected one of the event fields {sorted(by_name)}, got {raw!r}")
    if by_name[raw].type.name not in types:
        raise ConfigError(where, f"{what} must be of type {' or '.join(types)}; {raw} is {by_name[raw].type}")
    return raw


def _parse_windowed(raw: Mapping[str, Any], where: str, fields: tuple[EventField, ...]) -> dict[str, Any]:
    by_name = {f.name: f for f in fields}
    window_ms = parse_duration_ms(raw.get("window", "1m"), f"{where}.window")
    slide_ms = None
    if "slide" in raw:
        slide_ms = parse_duration_ms(raw["slide"], f"{where}.slide")
        if slide_ms > window_ms or window_ms % slide_ms:
            raise ConfigError(
                f"{where}.slide", f"expected a slide that divides the window ({window_ms} ms), got {slide_ms} ms"
            )
        slide_ms = None if slide_ms == window_ms else slide_ms
    group_by = _field_names(raw.get("group_by", []), f"{where}.group_by", by_name, "event fields")
    for i, name in enumerate(group_by):
        f = by_name[name]
        if not f.required or f.type.name == "double":
            raise ConfigError(
                f"{where}.group_by[{i}]",
                f"a group-by field must be required and not a double (its rows are a window's key); {name} is "
                f"{'optional' if not f.required else f.type}",
            )
    output_mode = raw.get("output_mode", "append")
    if output_mode not in _OUTPUT_MODES:
        raise ConfigError(f"{where}.output_mode", f"expected one of {list(_OUTPUT_MODES)}, got {output_mode!r}")
    aggregations = _parse_aggregations(raw.get("aggregations"), f"{where}.aggregations", fields)
    clash = set(group_by) & {a.name for a in aggregations}
    if clash:
        raise ConfigError(f"{where}.aggregations", f"output columns {sorted(clash)} are also group-by fields")
    return {
        "aggregations": aggregations,
        "watermark_delay_ms": parse_duration_ms(raw.get("watermark_delay", "5s"), f"{where}.watermark_delay"),
        "window_ms": window_ms,
        "slide_ms": slide_ms,
        "group_by": group_by,
        "output_mode": output_mode,
    }


def _parse_metadata(raw: Any, where: str, fields: tuple[EventField, ...]) -> tuple[str, ...]:
    if raw is True:
        chosen: tuple[str, ...] = KAFKA_METADATA
    elif raw is False or raw is None:
        return ()
    else:
        _expect(raw, list, where, f"true or a list of {list(KAFKA_METADATA)}")
        for i, name in enumerate(raw):
            if name not in KAFKA_METADATA:
                raise ConfigError(f"{where}[{i}]", f"expected one of {list(KAFKA_METADATA)}, got {name!r}")
        chosen = tuple(m for m in KAFKA_METADATA if m in raw)
    clash = {KAFKA_METADATA_PREFIX + m for m in chosen} & {f.name for f in fields}
    if clash:
        raise ConfigError(where, f"event fields {sorted(clash)} clash with the Kafka metadata columns")
    return chosen


def _route_value(value: str, field_type: str, where: str) -> str:
    """A route's value as the event's field reads as text (``"1"``, ``"true"``): one it can hold, written so."""
    if field_type in ("long", "int"):
        if not re.match(r"^-?(0|[1-9][0-9]*)$", value):
            raise ConfigError(where, f"the route_by field is a whole number; expected a value like 42, got {value!r}")
    elif field_type == "boolean" and value not in ("true", "false"):
        raise ConfigError(where, f"the route_by field is a boolean; expected 'true' or 'false', got {value!r}")
    return value


def _parse_routes(raw: Mapping[str, Any], where: str, fields: tuple[EventField, ...]) -> dict[str, Any]:
    by_name = {f.name: f for f in fields}
    if "route_by" not in raw:
        for key in ("routes", "unrouted"):
            if key in raw:
                raise ConfigError(f"{where}.{key}", "only a pipeline with route_by has routes")
        return {}
    route_by = _one_field(
        raw["route_by"], f"{where}.route_by", by_name, ("string", "long", "int", "boolean"), "route_by"
    )
    routes_raw = _expect(raw.get("routes"), dict, f"{where}.routes", "a table of field value = table name")
    if not routes_raw:
        raise ConfigError(f"{where}.routes", "expected at least one route")
    kind = by_name[route_by].type.name
    routes = tuple(
        Route(_route_value(v, kind, f"{where}.routes.{v}"), _identifier(t, f"{where}.routes.{v}"))
        for v, t in routes_raw.items()
    )
    unrouted = raw.get("unrouted", REJECTS)
    if unrouted != REJECTS:
        unrouted = _identifier(unrouted, f"{where}.unrouted")
    return {"route_by": route_by, "routes": routes, "unrouted": unrouted}


def _parse_upsert(raw: Mapping[str, Any], where: str, fields: tuple[EventField, ...]) -> dict[str, Any]:
    by_name = {f.name: f for f in fields}
    if "key" not in raw:
        raise ConfigError(f"{where}.key", "an upsert pipeline needs key = [field, ...]: the fields naming a row")
    key = _field_names(raw["key"], f"{where}.key", by_name, "event fields")
    if not key:
        raise ConfigError(f"{where}.key", "expected at least one key field")
    for i, name in enumerate(key):
        f = by_name[name]
        if not f.required or f.type.name == "double":
            raise ConfigError(
                f"{where}.key[{i}]",
                f"a key field must be required and not a double; {name} is {'optional' if not f.required else f.type}",
            )
    version = raw.get("version_field")
    if version is not None:
        version = _one_field(
            version,
            f"{where}.version_field",
            by_name,
            ("long", "int", "timestamp_ms", "timestamp", "decimal"),
            "version_field",
        )
    delete = raw.get("delete_field")
    if delete is not None:
        delete = _one_field(delete, f"{where}.delete_field", by_name, ("boolean",), "delete_field")
    return {"key": key, "version_field": version, "delete_field": delete}


def _output_columns(kind: str, fields: tuple[EventField, ...], extra: Mapping[str, Any]) -> dict[str, str]:
    """Each output column's spec type name, for validating ``partition_by``."""
    if kind == WINDOWED:
        by_name = {f.name: f for f in fields}
        columns = {"window_start": "timestamp", "window_end": "timestamp"}
        columns |= {g: by_name[g].type.name for g in extra["group_by"]}
        return columns
    columns = {f.name: f.type.name for f in fields}
    types = {"topic": "string", "partition": "int", "offset": "long", "timestamp": "timestamp", "key": "binary"}
    return columns | {KAFKA_METADATA_PREFIX + m: types[m] for m in extra.get("kafka_metadata", ())}


def _with_cdc_fields(raw: dict[str, Any], where: str, fields: tuple[EventField, ...], fmt: RecordFormat) -> Any:
    """A Debezium pipeline's fields: the row's, then the change-event columns it keeps; its version is the position."""
    assert fmt.cdc is not None
    for name in ("version_field", "delete_field"):
        if name in raw:
            raise ConfigError(
                f"{where}.{name}",
                "a Debezium pipeline is ordered by the source position (cdc_position) and deletes by op = d; "
                f"remove {name}",
            )
    names = {f.name for f in fields}
    for short in fmt.cdc.columns:
        column, type_name = CDC_COLUMNS[short]
        if column in names:
            raise ConfigError(f"{where}.fields.{column}", "is the change events' own column: rename the field")
        fields += (EventField(column, FieldType(type_name), required=False),)
    raw["version_field"] = fmt.cdc.version_column
    return fields


def _fields(
    raw: Mapping[str, Any],
    where: str,
    fmt: RecordFormat,
    registry: RegistrySettings | None,
    env: Mapping[str, str],
    remembered: Path | None,
) -> tuple[tuple[EventField, ...], RecordFormat]:
    """The pipeline's fields: listed in the spec, or a registry format's subject's latest schema's (which then is
    the reader schema, so records of newer versions are read as the fields were taken)."""
    if "fields" in raw or fmt.value not in REGISTRY_FORMATS or registry is None or fmt.subject is None:
        return _parse_fields(raw.get("fields"), f"{where}.fields"), fmt
    fields, schema = registry_fields(registry, fmt.subject, fmt.value, fmt.envelope is not None, env, remembered)
    return fields, replace(fmt, reader_schema=schema if fmt.value == AVRO and fmt.envelope is None else None)


def _parse_pipeline(
    raw: Any,
    where: str,
    registry: RegistrySettings | None = None,
    env: Mapping[str, str] | None = None,
    checkpoints: Path | None = None,
) -> PipelineSpec:
    _expect(raw, dict, where, "a table")
    kind = raw.get("kind", WINDOWED)
    if kind not in KINDS:
        raise ConfigError(f"{where}.kind", f"expected one of {list(KINDS)}, got {kind!r}")
    known = _COMMON_KEYS | _KIND_KEYS[kind]
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(
            where,
            f"unknown keys {sorted(unknown)} for {'an' if kind == EVENTS else 'a'} {kind} pipeline; "
            f"expected some of {sorted(known)}{_did_you_mean(unknown - _ALL_PIPELINE_KEYS, _ALL_PIPELINE_KEYS)}",
        )
    name = _identifier(raw.get("name"), f"{where}.name")
    topic = _expect(raw.get("topic"), str, f"{where}.topic", "a Kafka topic name")
    if not re.match(r"^[A-Za-z0-9._-]{1,249}$", topic):
        raise ConfigError(f"{where}.topic", f"not a valid Kafka topic name: {topic!r}")
    table = _identifier(raw.get("table", name), f"{where}.table")
    record_format = parse_record_format(raw, where, kind, topic, registry)
    remembered = checkpoints / str(raw.get("name")) / REGISTRY_SCHEMA_FILE if checkpoints else None
    fields, record_format = _fields(raw, where, record_format, registry, env or {}, remembered)
    if record_format.envelope is not None:
        raw = dict(raw)
        fields = _with_cdc_fields(raw, where, fields, record_format)
    by_name = {f.name: f for f in fields}
    event_time = raw.get("event_time_field")
    if event_time is not None or kind == WINDOWED:
        event_time = _one_field(
            event_time, f"{where}.event_time_field", by_name, ("timestamp_ms", "timestamp"), "the event time field"
        )
    extra: dict[str, Any] = {}
    if kind == WINDOWED:
        extra = _parse_windowed(raw, where, fields)
    else:
        extra["kafka_metadata"] = _parse_metadata(raw.get("kafka_metadata"), f"{where}.kafka_metadata", fields)
        if kind == EVENTS:
            extra |= _parse_routes(raw, where, fields)
        else:
            extra |= _parse_upsert(raw, where, fields)
    partition_by = parse_partition_by(
        raw.get("partition_by", []), f"{where}.partition_by", _output_columns(kind, fields, extra)
    )
    max_records = _positive_int(raw.get("max_records_per_batch", 200_000), f"{where}.max_records_per_batch")
    return PipelineSpec(
        name=name,
        topic=topic,
        table=table,
        event_time_field=event_time,
        fields=fields,
        kind=kind,
        trigger_interval_ms=parse_duration_ms(raw.get("trigger_interval", "2s"), f"{where}.trigger_interval"),
        max_records_per_batch=max_records,
        catch_up_records_per_batch=_catch_up_records(raw.get("catch_up_records_per_batch", 0), where, max_records),
        partition_by=partition_by,
        record_format=record_format,
        **extra,
    )


def _pyiceberg_configured_uri(catalog_name: str) -> str | None:
    """The URI pyiceberg's own configuration (``.pyiceberg.yaml``, ``PYICEBERG_CATALOG__<NAME>__URI``) gives the
    catalog, which a spec without ``catalog_uri`` uses."""
    from pyiceberg.utils.config import Config

    uri = (Config().get_catalog_config(catalog_name) or {}).get("uri")
    return uri if isinstance(uri, str) else None


def _section(raw: Mapping[str, Any], name: str, allowed: set[str]) -> dict[str, Any]:
    section = raw.get(name, {})
    _expect(section, dict, name, "a table")
    unknown = set(section) - allowed
    if unknown:
        raise ConfigError(
            name, f"unknown keys {sorted(unknown)}; expected some of {sorted(allowed)}{_did_you_mean(unknown, allowed)}"
        )
    return dict(section)


def _did_you_mean(unknown: set[str], known: set[str]) -> str:
    """``; did you mean 'format' (for 'formt')?`` for each unknown key close to a known one, else nothing."""
    guesses = []
    for key in sorted(unknown):
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
        if close:
            guesses.append(f"{close[0]!r} (for {key!r})")
    return f"; did you mean {', '.join(guesses)}?" if guesses else ""


def _apply_env(raw: dict[str, Any], env: Mapping[str, str]) -> None:
    for var, path in ENV_OVERRIDES.items():
        value = env.get(var)
        if value is None or value == "":
            continue
        section, key = path.split(".")
        raw.setdefault(section, {})
        _expect(raw[section], dict, section, "a table")
        raw[section][key] = value


#: ``scheme://…``: a URI, where the storage settings take a path (``spec.resolve`` would make ``s3://b/x`` a
#: local folder named ``s3:``).
_URI_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_CHECKPOINT_NEEDS = (
    "Spark's checkpoint needs a filesystem with atomic rename, which an object store lacks, and no object-store "
    "connector (hadoop-aws) is installed; keep the warehouse on the object store and the checkpoint on a local "
    "disk or a mount every driver shares (NFS, EFS)"
)
_LEDGER_NEEDS = (
    "the DuckDB ledger is one file, opened read-write by one process at a time under a file lock; keep it on a "
    "local disk or a POSIX mount the stager, the relay and Dagster share"
)


def parse_spec(
    raw: Mapping[str, Any], env: Mapping[str, str] | None = None, base_dir: Path | None = None
) -> KrishivSpec:
    """Validate a decoded spec document, applying environment overrides first."""
    doc = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    _apply_env(doc, env if env is not None else {})
    unknown = set(doc) - {"kafka", "iceberg", "storage", "spark", "maintenance", "schema_registry", "pipelines"}
    if unknown:
        sections = {"kafka", "iceberg", "storage", "spark", "maintenance", "schema_registry", "pipelines"}
        raise ConfigError("spec", f"unknown sections {sorted(unknown)}{_did_you_mean(unknown, sections)}")

    environ = env if env is not None else {}
    k = _section(doc, "kafka", {"bootstrap_servers", "partitions", "consumer", "properties"})
    kafka = KafkaSettings(
        bootstrap_servers=_expect(
            k.get("bootstrap_servers", KafkaSettings.bootstrap_servers),
            str,
            "kafka.bootstrap_servers",
            "host:port[,host:port]",
        ),
        partitions=_positive_int(k.get("partitions", 4), "kafka.partitions"),
        consumer=_consumer_settings(k.get("consumer", {}), environ),
        properties=_kafka_properties(k.get("properties", {}), environ),
    )
    servers = [server.strip() for server in kafka.bootstrap_servers.split(",")]
    kafka = replace(kafka, bootstrap_servers=",".join(servers))
    for server in servers:
        m = re.match(r"^[^:\s]+:(\d{1,5})$", server)
        if not m or not 0 < int(m.group(1)) < 65536:
            raise ConfigError(
                "kafka.bootstrap_servers", f"expected host:port[,host:port], got {kafka.bootstrap_servers!r}"
            )

    i = _section(doc, "iceberg", {"catalog_uri", "warehouse", "namespace", "catalog_name", "properties"})
    catalog_name = _identifier(i.get("catalog_name", IcebergSettings.catalog_name), "iceberg.catalog_name")
    iceberg = IcebergSettings(
        catalog_uri=_expect(
            i.get("catalog_uri", _pyiceberg_configured_uri(catalog_name) or IcebergSettings.catalog_uri),
            str,
            "iceberg.catalog_uri",
            "a URI",
        ),
        warehouse=_expect(i.get("warehouse", IcebergSettings.warehouse), str, "iceberg.warehouse", "a path or URI"),
        namespace=_identifier(i.get("namespace", IcebergSettings.namespace), "iceberg.namespace"),
        catalog_name=catalog_name,
        properties=parse_properties(i.get("properties", {}), "iceberg.properties", environ),
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

    s = _section(doc, "storage", {"ledger_path", "checkpoint_location"})
    storage = StorageSettings(
        ledger_path=_expect(s.get("ledger_path", StorageSettings.ledger_path), str, "storage.ledger_path", "a path"),
        checkpoint_location=_expect(
            s.get("checkpoint_location", StorageSettings.checkpoint_location),
            str,
            "storage.checkpoint_location",
            "a path",
        ),
    )

    for name, value, reason in (
        ("storage.checkpoint_location", storage.checkpoint_location, _CHECKPOINT_NEEDS),
        ("storage.ledger_path", storage.ledger_path, _LEDGER_NEEDS),
    ):
        if m := _URI_SCHEME.match(value):
            if m.group(1).lower() == "file":
                raise ConfigError(name, f"expected a path, not a file:// URI: write the path itself ({value[7:]})")
            raise ConfigError(
                name, f"expected a path on a local disk or a shared filesystem, not a {m.group(1)}:// URI: {reason}"
            )

    sp = _section(doc, "spark", {"master", "shuffle_partitions", "records_per_split", "conf"})
    spark = SparkSettings(
        master=_expect(sp.get("master", SparkSettings.master), str, "spark.master", "a Spark master URL"),
        shuffle_partitions=_positive_int(sp.get("shuffle_partitions", 4), "spark.shuffle_partitions"),
        records_per_split=_positive_int(sp.get("records_per_split", 250_000), "spark.records_per_split"),
        conf=_spark_conf(sp.get("conf", {}), environ),
    )

    raw_pipelines = doc.get("pipelines")
    _expect(raw_pipelines, list, "pipelines", "at least one [[pipelines]] table")
    if not raw_pipelines:
        raise ConfigError("pipelines", "expected at least one [[pipelines]] table")
    registry = parse_registry(doc.get("schema_registry"), environ)
    checkpoints = _resolved(base_dir or Path.cwd(), storage.checkpoint_location)
    pipelines = tuple(
        _parse_pipeline(p, f"pipelines[{n}]", registry, environ, checkpoints) for n, p in enumerate(raw_pipelines)
    )
    names = [p.name for p in pipelines]
    dupes = {v for v in names if names.count(v) > 1}
    if dupes:
        raise ConfigError("pipelines.name", f"must be unique across pipelines; repeated: {sorted(dupes)}")
    tables = [t for p in pipelines for t in (*p.tables, p.rejects_table)]
    dupes = {v for v in tables if tables.count(v) > 1}
    if dupes:
        raise ConfigError(
            "pipelines.table", f"each table is written by one pipeline only; written by several: {sorted(dupes)}"
        )
    maintenance = _parse_maintenance(doc)
    return KrishivSpec(kafka, iceberg, storage, spark, pipelines, base_dir or Path.cwd(), maintenance, registry)


def load_spec(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> KrishivSpec:
    """Load a spec file (default: ``$KRISHIV_SPEC`` or ``./krishiv.toml``) and apply environment overrides."""
    environ = os.environ if env is None else env
    spec_path = Path(path or environ.get(SPEC_FILE_ENV) or DEFAULT_SPEC_FILE).expanduser().resolve()
    try:
        text = spec_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("spec", f"no spec file at {spec_path}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("spec", f"{spec_path} is not valid TOML: {exc}") from None
    return parse_spec(raw, environ, spec_path.parent)
