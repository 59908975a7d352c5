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

This module holds the model (:class:`KrishivSpec`, :class:`PipelineSpec`), :func:`load_spec` and
:func:`parse_spec`, and what every pipeline shares (docs/spec.md "Every pipeline"). The rest is read, as the
docs are laid out, by: :mod:`krishiv_core.spec_sections` (the shared sections), :mod:`krishiv_core.formats`
(``format``, ``[schema_registry]``, Debezium), :mod:`krishiv_core.partitioning` (``partition_by``),
:mod:`krishiv_core.spec_windowed`, :mod:`krishiv_core.spec_events` and :mod:`krishiv_core.spec_upsert` (each
kind's options), :mod:`krishiv_core.spec_values` (durations, sizes, names, field types). The names other
modules use are all importable from here.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from krishiv_core import spec_events, spec_topics, spec_upsert, spec_windowed
from krishiv_core.errors import ConfigError
from krishiv_core.formats import (
    AVRO,
    FORMAT_KEYS,
    JSON,
    REGISTRY_FORMATS,
    RecordFormat,
    RegistrySettings,
    parse_record_format,
    parse_registry,
)
from krishiv_core.partitioning import PartitionField, parse_partition_by
from krishiv_core.schema_fields import registry_fields
from krishiv_core.spec_events import KAFKA_METADATA, KAFKA_METADATA_PREFIX, REJECTS, Route
from krishiv_core.spec_sections import (
    DUCKDB_LEDGER_SCHEME,
    FORCED_CONSUMER_SETTINGS,
    FORCED_SPARK_CONF,
    MIN_ORPHAN_GRACE_MS,
    SERVER_LEDGER_SCHEMES,
    IcebergSettings,
    KafkaSettings,
    MaintenanceSettings,
    SparkSettings,
    StorageSettings,
    parse_iceberg,
    parse_kafka,
    parse_maintenance,
    parse_spark,
    parse_storage,
)
from krishiv_core.spec_types import EventField, FieldPath, FieldType, field_paths
from krishiv_core.spec_values import (
    did_you_mean,
    expect,
    identifier,
    one_field,
    parse_cron,
    parse_duration_ms,
    parse_field_type,
    parse_fields,
    parse_size_bytes,
    positive_int,
)
from krishiv_core.spec_windowed import Aggregation
from krishiv_core.topic_matches import (
    MATCHED_TOPICS_FILE,
    BrokerTopics,
    matched_topics,
    pattern_of,
    remember_matches,
)

__all__ = [
    "DEFAULT_SPEC_FILE",
    "ENV_OVERRIDES",
    "EVENTS",
    "FORCED_CONSUMER_SETTINGS",
    "FORCED_SPARK_CONF",
    "KAFKA_METADATA",
    "KAFKA_METADATA_PREFIX",
    "KINDS",
    "MIN_ORPHAN_GRACE_MS",
    "REGISTRY_SCHEMA_FILE",
    "REJECTS",
    "SPEC_FILE_ENV",
    "UPSERT",
    "WINDOWED",
    "Aggregation",
    "EventField",
    "FieldType",
    "IcebergSettings",
    "KafkaSettings",
    "KrishivSpec",
    "MaintenanceSettings",
    "PipelineSpec",
    "Route",
    "SparkSettings",
    "StorageSettings",
    "load_spec",
    "parse_cron",
    "parse_duration_ms",
    "parse_field_type",
    "parse_size_bytes",
    "parse_spec",
]

DEFAULT_SPEC_FILE = "krishiv.toml"
SPEC_FILE_ENV = "KRISHIV_SPEC"

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
#: Where a Debezium pipeline keeps its key subject's latest schema (its key, when the spec gives none).
REGISTRY_KEY_SCHEMA_FILE = "krishiv/registry-key-schema.json"

WINDOWED, EVENTS, UPSERT = "windowed", "events", "upsert"
KINDS = (WINDOWED, EVENTS, UPSERT)


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
    #: The pipeline's table as the spec file holds it, to read its fields from the registry again
    #: (:func:`with_latest_fields`).
    source: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    #: A pipeline over several topics (``topics = [...]``, ``krishiv_core.spec_topics``): each topic's table as the
    #: single-topic pipeline it would be. Empty for a pipeline of one topic.
    members: tuple[PipelineSpec, ...] = ()
    #: Debezium's transaction metadata topic, whose marks keep a source transaction whole (several topics only).
    transaction_topic: str | None = None
    #: How long (Kafka time) a source transaction waits for the rest of its events before it is staged as it is.
    transaction_timeout_ms: int = 300_000
    #: ``topic_pattern``: the members are the topics it matches (``krishiv_core.topic_matches``), None for a list.
    topic_pattern: str | None = None
    #: How often a running query over ``topic_pattern`` looks for newly matching topics.
    topic_discovery_interval_ms: int = 30_000

    @property
    def topics(self) -> tuple[str, ...]:
        """Every topic the pipeline's query reads: its topic, or each member's and the transaction topic."""
        if not self.members:
            return (self.topic,)
        tail = (self.transaction_topic,) if self.transaction_topic else ()
        return (*(m.topic for m in self.members), *tail)

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
        """The tables the pipeline writes rows to, rejects aside: its table, or its routes' (and the default's), or
        each member's."""
        if self.members:
            return tuple(m.table for m in self.members)
        if not self.routes:
            return (self.table,)
        routed = tuple(dict.fromkeys(r.table for r in self.routes))
        return routed + ((self.unrouted,) if self.unrouted != REJECTS and self.unrouted not in routed else ())

    def writer_of(self, table: str) -> PipelineSpec:
        """The pipeline as it writes ``table``: the member of a pipeline over several topics that writes it, else
        itself."""
        return next((m for m in self.members if m.table == table), self)

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
        """The event field a name or a dotted path into structs (``meta.ts``) names."""
        return field_paths(self.fields)[name].field

    def path(self, name: str) -> FieldPath:
        """A field by its name or dotted path, with whether a row always has a value there."""
        return field_paths(self.fields)[name]


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

    def ledger_location(self, value: str | None = None) -> str:
        """Where the ledger lives (``storage.ledger_path``, or ``value`` given in its place): a PostgreSQL URI as
        written, else the DuckDB file's path, relative to the spec file's folder unless absolute."""
        value = self.storage.ledger_path if value is None else value
        if value.startswith(SERVER_LEDGER_SCHEMES):
            return value
        return str(self.resolve(value.removeprefix(DUCKDB_LEDGER_SCHEME)))

    @property
    def ledger_on_server(self) -> bool:
        """Whether the ledger is a PostgreSQL schema rather than a DuckDB file."""
        return self.storage.ledger_path.startswith(SERVER_LEDGER_SCHEMES)

    def catalog_uri(self) -> str:
        """The catalog URI with a relative SQLite path made absolute against the spec's folder."""
        uri = self.iceberg.catalog_uri
        prefix = "sqlite:///"
        if uri.startswith(prefix) and not uri.startswith(prefix + "/") and uri != "sqlite:///:memory:":
            return prefix + str(self.resolve(uri[len(prefix) :]))
        return uri


# --------------------------------------------------------------------------------------------- every pipeline

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
_KIND_KEYS = {WINDOWED: spec_windowed.KEYS, EVENTS: spec_events.KEYS, UPSERT: spec_upsert.KEYS}
#: Every key a pipeline may have, whatever its kind: a key no kind has is matched against them as a misspelling
#: (one of another kind is not: the message lists the kind's keys).
_ALL_PIPELINE_KEYS = _COMMON_KEYS.union(*_KIND_KEYS.values(), spec_topics.KEYS)


def _catch_up_records(value: Any, where: str, max_records: int) -> int:
    """``catch_up_records_per_batch``: 0 (off), or more than ``max_records_per_batch``."""
    if type(value) is int and value == 0:
        return 0
    records = positive_int(value, f"{where}.catch_up_records_per_batch")
    if records <= max_records:
        raise ConfigError(
            f"{where}.catch_up_records_per_batch",
            f"expected 0 (off) or more than max_records_per_batch ({max_records}), got {records}",
        )
    return records


def _output_columns(kind: str, fields: tuple[EventField, ...], extra: Mapping[str, Any]) -> dict[str, str]:
    """Each output column's spec type name, for validating ``partition_by``."""
    if kind == WINDOWED:
        paths = field_paths(fields)
        columns = {"window_start": "timestamp", "window_end": "timestamp"}
        columns |= {paths[g].column: paths[g].type.name for g in extra["group_by"]}
        return columns
    columns = {p.path: p.type.name for p in field_paths(fields).values()}
    types = {"topic": "string", "partition": "int", "offset": "long", "timestamp": "timestamp", "key": "binary"}
    return columns | {KAFKA_METADATA_PREFIX + m: types[m] for m in extra.get("kafka_metadata", ())}


def _fields(
    raw: Mapping[str, Any],
    where: str,
    fmt: RecordFormat,
    registry: RegistrySettings | None,
    env: Mapping[str, str],
    remembered: Path | None,
) -> tuple[tuple[EventField, ...], RecordFormat]:
    """The pipeline's fields: listed in the spec, or a registry format's subject's latest schema's (which then is
    the reader schema, its id the one a record of a later version with more fields is told by)."""
    if "fields" in raw or fmt.value not in REGISTRY_FORMATS or registry is None or fmt.subject is None:
        return parse_fields(raw.get("fields"), f"{where}.fields"), fmt
    fields, schema, schema_id = registry_fields(
        registry, fmt.subject, fmt.value, fmt.envelope is not None, env, remembered, fmt.flatten
    )
    reader = schema if fmt.value == AVRO and fmt.envelope is None else None
    return fields, replace(fmt, reader_schema=reader, fields_schema_id=schema_id)


def _registry_key(
    topic: str, fmt: RecordFormat, registry: RegistrySettings, env: Mapping[str, str], remembered: Path | None
) -> list[str]:
    """A Debezium pipeline's ``key`` when the spec gives none: the columns of its Kafka key, as the latest schema of
    the topic's ``<topic>-key`` subject names them (the table's primary key, as Debezium's converter registers it)."""
    fields, _, _ = registry_fields(registry, f"{topic}-key", fmt.key, False, env, remembered)
    return [f.name for f in fields]


def _parse_pipeline(
    raw: Any,
    where: str,
    registry: RegistrySettings | None = None,
    env: Mapping[str, str] | None = None,
    checkpoints: Path | None = None,
    broker: BrokerTopics | None = None,
) -> PipelineSpec:
    expect(raw, dict, where, "a table")
    if "topics" in raw or "topic_pattern" in raw:
        return _parse_topics_pipeline(raw, where, registry, env, checkpoints, broker)
    source = raw
    kind = raw.get("kind", WINDOWED)
    if kind not in KINDS:
        raise ConfigError(f"{where}.kind", f"expected one of {list(KINDS)}, got {kind!r}")
    known = _COMMON_KEYS | _KIND_KEYS[kind]
    unknown = set(raw) - known - {_MEMBER_OF}
    if unknown:
        raise ConfigError(
            where,
            f"unknown keys {sorted(unknown)} for {'an' if kind == EVENTS else 'a'} {kind} pipeline; "
            f"expected some of {sorted(known)}{did_you_mean(unknown - _ALL_PIPELINE_KEYS, _ALL_PIPELINE_KEYS)}",
        )
    name = identifier(raw.get("name"), f"{where}.name")
    topic = spec_topics.topic_name(raw.get("topic"), f"{where}.topic")
    table = identifier(raw.get("table", name), f"{where}.table")
    record_format = parse_record_format(raw, where, kind, topic, registry)
    remembered = checkpoints / _state_folder(raw, name) / REGISTRY_SCHEMA_FILE if checkpoints else None
    fields, record_format = _fields(raw, where, record_format, registry, env or {}, remembered)
    if record_format.envelope is not None:
        raw = dict(raw)
        fields = spec_upsert.with_cdc_fields(raw, where, fields, record_format)
        if "key" not in raw and record_format.key in REGISTRY_FORMATS and registry is not None:
            key_file = checkpoints / _state_folder(raw, name) / REGISTRY_KEY_SCHEMA_FILE if checkpoints else None
            raw["key"] = _registry_key(topic, record_format, registry, env or {}, key_file)
    event_time = raw.get("event_time_field")
    if event_time is not None or kind == WINDOWED:
        event_time = one_field(
            event_time,
            f"{where}.event_time_field",
            field_paths(fields),
            ("timestamp_ms", "timestamp"),
            "the event time field",
        )
    extra: dict[str, Any] = {}
    if kind == WINDOWED:
        extra = spec_windowed.parse_windowed(raw, where, fields)
    else:
        extra["kafka_metadata"] = spec_events.parse_metadata(
            raw.get("kafka_metadata"), f"{where}.kafka_metadata", fields
        )
        if kind == EVENTS:
            extra |= spec_events.parse_routes(raw, where, fields)
        else:
            extra |= spec_upsert.parse_upsert(raw, where, fields)
    partition_by = parse_partition_by(
        raw.get("partition_by", []), f"{where}.partition_by", _output_columns(kind, fields, extra)
    )
    max_records = positive_int(raw.get("max_records_per_batch", 200_000), f"{where}.max_records_per_batch")
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
        source=source,
        **extra,
    )


def _state_folder(raw: Mapping[str, Any], name: str) -> str:
    """Where in the checkpoints a pipeline keeps what it reads of the registry: its folder, or its member's."""
    member = raw.get(_MEMBER_OF)
    return f"{member}/{spec_topics.MEMBERS_DIR}/{raw['table']}" if member else name


#: Marks a member's spec table (``krishiv_core.spec_topics``) with the pipeline it belongs to.
_MEMBER_OF = "__member_of"


def _parse_topics_pipeline(
    raw: Mapping[str, Any],
    where: str,
    registry: RegistrySettings | None,
    env: Mapping[str, str] | None,
    checkpoints: Path | None,
    broker: BrokerTopics | None,
) -> PipelineSpec:
    """An upsert pipeline over several topics (:mod:`krishiv_core.spec_topics`): one member per topic, listed or
    matched by ``topic_pattern`` (:mod:`krishiv_core.topic_matches`)."""
    name = identifier(raw.get("name"), f"{where}.name")
    unknown = set(raw) - _COMMON_KEYS - _KIND_KEYS[UPSERT] - spec_topics.KEYS
    if unknown:
        raise ConfigError(where, f"unknown keys {sorted(unknown)} for an upsert pipeline over several topics")

    def member(source: dict[str, Any], at: str) -> PipelineSpec:
        if pattern is not None and "fields" not in source and source.get("format", JSON) not in REGISTRY_FORMATS:
            raise ConfigError(
                at,
                f"topic {source['topic']} matches topic_pattern and its table has no fields (a JSON record names "
                f"none): give it a [pipelines.tables.{source['table']}] section with key and fields, or narrow "
                "topic_pattern",
            )
        try:
            return _parse_pipeline({**source, _MEMBER_OF: name}, at, registry, env, checkpoints)
        except ConfigError as exc:
            if pattern is None:
                raise
            raise ConfigError(
                exc.field,
                f"{str(exc).removeprefix(exc.field + ': ')} (topic {source['topic']} matches topic_pattern: give "
                f"its table a [pipelines.tables.{source['table']}] section it can be read with, or narrow "
                "topic_pattern)",
            ) from None

    pattern, matched = None, ()
    kept_in = checkpoints / name / MATCHED_TOPICS_FILE if checkpoints else None
    if "topic_pattern" in raw:
        pattern = pattern_of(raw["topic_pattern"], f"{where}.topic_pattern")
        exclude = [t for t in [spec_topics.transaction_topic(raw, where)] if t]
        matched = matched_topics(pattern, broker, kept_in, exclude, f"{where}.topic_pattern")
    members, transaction = spec_topics.parse_members(raw, where, member, matched)
    key = "topic_pattern" if pattern is not None else "topics"
    spec_topics.check_none_dropped(members, checkpoints / name if checkpoints else None, f"{where}.{key}")
    if pattern is not None:  # the matches make a pipeline without a mistake: kept
        remember_matches(kept_in, pattern, matched)
    first = members[0]
    return PipelineSpec(
        name=name,
        topic=first.topic,
        table=name,
        event_time_field=None,
        fields=(),
        kind=UPSERT,
        trigger_interval_ms=first.trigger_interval_ms,
        max_records_per_batch=first.max_records_per_batch,
        catch_up_records_per_batch=first.catch_up_records_per_batch,
        record_format=first.record_format,
        source=raw,
        members=members,
        transaction_topic=transaction,
        transaction_timeout_ms=parse_duration_ms(raw.get("transaction_timeout", "5m"), f"{where}.transaction_timeout"),
        topic_pattern=None if pattern is None else pattern.pattern,
        topic_discovery_interval_ms=parse_duration_ms(
            raw.get("topic_discovery_interval", "30s"), f"{where}.topic_discovery_interval"
        ),
    )


# --------------------------------------------------------------------------------------------- the spec file


def _apply_env(raw: dict[str, Any], env: Mapping[str, str]) -> None:
    for var, path in ENV_OVERRIDES.items():
        value = env.get(var)
        if value is None or value == "":
            continue
        section, key = path.split(".")
        raw.setdefault(section, {})
        expect(raw[section], dict, section, "a table")
        raw[section][key] = value


#: Every top-level table a spec may hold.
_SECTIONS = frozenset({"kafka", "iceberg", "storage", "spark", "maintenance", "schema_registry", "pipelines"})


def parse_spec(
    raw: Mapping[str, Any], env: Mapping[str, str] | None = None, base_dir: Path | None = None
) -> KrishivSpec:
    """Validate a decoded spec document, applying environment overrides first."""
    doc = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    _apply_env(doc, env if env is not None else {})
    unknown = set(doc) - _SECTIONS
    if unknown:
        raise ConfigError("spec", f"unknown sections {sorted(unknown)}{did_you_mean(unknown, _SECTIONS)}")

    environ = env if env is not None else {}
    kafka = parse_kafka(doc, environ)
    iceberg = parse_iceberg(doc, environ)
    storage = parse_storage(doc)
    spark = parse_spark(doc, environ)

    raw_pipelines = doc.get("pipelines")
    expect(raw_pipelines, list, "pipelines", "at least one [[pipelines]] table")
    if not raw_pipelines:
        raise ConfigError("pipelines", "expected at least one [[pipelines]] table")
    registry = parse_registry(doc.get("schema_registry"), environ)
    checkpoints = _resolved(base_dir or Path.cwd(), storage.checkpoint_location)
    broker = BrokerTopics(kafka.client_settings(environ))  # asked only by a pipeline's topic_pattern
    pipelines = tuple(
        _parse_pipeline(p, f"pipelines[{n}]", registry, environ, checkpoints, broker)
        for n, p in enumerate(raw_pipelines)
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
    maintenance = parse_maintenance(doc)
    return KrishivSpec(kafka, iceberg, storage, spark, pipelines, base_dir or Path.cwd(), maintenance, registry)


def with_latest_fields(spec: KrishivSpec, pipeline: PipelineSpec, env: Mapping[str, str]) -> PipelineSpec:
    """``pipeline`` parsed again from its table in the spec file, its fields read again from its subjects' latest
    schemas (a running query met records of a newer version) and its ``topic_pattern`` matched again against the
    broker's topics (a running query found a new one): the same pipeline when the spec lists its fields and its
    topics. A version the pipeline cannot take (a field a table cannot hold), or a new topic it cannot read, is the
    :class:`ConfigError` a load would give."""
    from_registry = any(m.record_format.fields_schema_id is not None for m in (pipeline, *pipeline.members))
    if pipeline.source is None or not (from_registry or pipeline.topic_pattern):
        return pipeline
    names = [p.name for p in spec.pipelines]
    where = f"pipelines[{names.index(pipeline.name) if pipeline.name in names else pipeline.name}]"
    checkpoints = spec.resolve(spec.storage.checkpoint_location)
    broker = BrokerTopics(spec.kafka.client_settings(env))
    return _parse_pipeline(pipeline.source, where, spec.schema_registry, env, checkpoints, broker)


def load_spec(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> KrishivSpec:
    """Load a spec file (default: ``$KRISHIV_SPEC`` or ``./krishiv.toml``) and apply environment overrides."""
    environ = os.environ if env is None else env
    spec_path = Path(path or environ.get(SPEC_FILE_ENV) or DEFAULT_SPEC_FILE).expanduser().resolve()
    try:
        text = spec_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            "spec",
            f"no spec file at {spec_path}: name yours with --spec or ${SPEC_FILE_ENV}, or write one with "
            "krishiv init --topic TOPIC (docs/quickstart.md)",
        ) from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("spec", f"{spec_path} is not valid TOML: {exc}") from None
    return parse_spec(raw, environ, spec_path.parent)
