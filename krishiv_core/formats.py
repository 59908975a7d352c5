"""How a pipeline's Kafka records are encoded: the value's and the key's format, the Schema Registry, Debezium.

A pipeline's ``format`` says how each Kafka value is written: ``json`` (the default: a JSON object, each field read
by the rule of docs/spec.md "Field types"), or one of the Schema Registry formats, written in the Confluent wire format
(a magic byte 0, a 4-byte big-endian schema id, the payload) and decoded through confluent-kafka's Schema Registry
client and deserializers: ``avro``, ``protobuf``, ``json_schema``. ``key_format`` is the same choice for the
Kafka key (``string``, the default, is the key's UTF-8 text). ``envelope = "debezium"`` (upsert pipelines only)
reads Debezium's change events: ``op``, ``before``, ``after`` and ``source``, in any of those formats.

``[schema_registry]`` configures the client: ``url`` and any other setting confluent-kafka's
``SchemaRegistryClient`` takes (``basic.auth.user.info``, ``bearer.auth.*``, ``ssl.*``), secrets as ``${VAR}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from krishiv_core.client_settings import parse_properties, resolve
from krishiv_core.errors import ConfigError

JSON = "json"
AVRO = "avro"
PROTOBUF = "protobuf"
JSON_SCHEMA = "json_schema"
STRING = "string"
#: Formats decoded through the Schema Registry (the Confluent wire format).
REGISTRY_FORMATS = (AVRO, PROTOBUF, JSON_SCHEMA)
VALUE_FORMATS = (JSON, *REGISTRY_FORMATS)
KEY_FORMATS = (STRING, JSON, *REGISTRY_FORMATS)
DEBEZIUM = "debezium"

#: Debezium's ``decimal.handling.mode``: how a ``numeric`` column is written.
DECIMAL_HANDLING = ("precise", "string", "double")
#: The change-event columns an upsert table fed by Debezium may carry, by the name ``cdc_columns`` uses.
#: ``tx``: the source transaction's id (PostgreSQL's xid) from Debezium's transaction metadata, null without it.
CDC_COLUMNS = {
    "op": ("_cdc_op", "string"),
    "lsn": ("_cdc_lsn", "long"),
    "ts": ("_cdc_ts", "timestamp"),
    "tx": ("_cdc_tx", "string"),
}
#: What orders a key's change events (the upsert rule's version): PostgreSQL's log position, or the source time.
CDC_POSITIONS = {"lsn": "_cdc_lsn", "ts_ms": "_cdc_ts"}


@dataclass(frozen=True)
class RegistrySettings:
    """``[schema_registry]``: confluent-kafka's ``SchemaRegistryClient`` configuration, unresolved."""

    properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.properties["url"]

    def client_config(self, env: Mapping[str, str]) -> dict[str, str]:
        """The client's configuration with every ``${VAR}`` resolved."""
        return resolve(self.properties, env, "schema_registry")


def parse_registry(raw: Any, env: Mapping[str, str]) -> RegistrySettings | None:
    if raw is None:
        return None
    properties = parse_properties(raw, "schema_registry", env)
    url = properties.get("url", "")
    if not url.startswith(("http://", "https://")) and not url.startswith("mock://"):
        raise ConfigError("schema_registry.url", f"expected http(s)://host:port of the Schema Registry, got {url!r}")
    return RegistrySettings(properties)


@dataclass(frozen=True)
class CdcOptions:
    """An upsert pipeline fed by Debezium (``envelope = "debezium"``)."""

    #: The column whose value orders a key's events: ``_cdc_lsn`` (PostgreSQL's ``source.lsn``) or ``_cdc_ts``.
    position: str = "lsn"
    decimal_handling: str = "precise"
    #: The change-event columns the table carries (the position's always).
    columns: tuple[str, ...] = ("lsn",)

    @property
    def version_column(self) -> str:
        return CDC_POSITIONS[self.position]


@dataclass(frozen=True)
class RecordFormat:
    """A pipeline's encoding: what its tasks decode with."""

    value: str = JSON
    key: str = STRING
    #: The value's subject in the registry (TopicNameStrategy: ``<topic>-value``), for fields from the schema.
    subject: str | None = None
    envelope: str | None = None
    cdc: CdcOptions | None = None
    #: The Avro schema the fields were taken from (the deserializer's reader schema); None when the spec lists them.
    reader_schema: str | None = None
    #: The registry's id of the schema the fields were taken from; None when the spec lists them.
    fields_schema_id: int | None = None
    #: Avro and Protobuf fields from the registry with nested records as ``<record>_<field>`` columns (the columns
    #: Krishiv made before nested types), not structs.
    flatten: bool = False

    @property
    def uses_registry(self) -> bool:
        return self.value in REGISTRY_FORMATS or self.key in REGISTRY_FORMATS


#: The pipeline keys this module parses.
FORMAT_KEYS = {
    "format",
    "key_format",
    "subject",
    "envelope",
    "cdc_position",
    "decimal_handling",
    "cdc_columns",
    "flatten",
}


def _choice(raw: Mapping[str, Any], name: str, where: str, choices: tuple[str, ...], default: str) -> str:
    value = raw.get(name, default)
    if value not in choices:
        raise ConfigError(f"{where}.{name}", f"expected one of {list(choices)}, got {value!r}")
    return str(value)


def parse_record_format(
    raw: Mapping[str, Any], where: str, kind: str, topic: str, registry: RegistrySettings | None
) -> RecordFormat:
    """A pipeline's ``format``, ``key_format``, ``subject`` and, for Debezium, its ``envelope`` options."""
    value = _choice(raw, "format", where, VALUE_FORMATS, JSON)
    envelope = raw.get("envelope")
    # Debezium's converters write the key as they write the value
    default_key = value if envelope == DEBEZIUM else STRING
    key = _choice(raw, "key_format", where, KEY_FORMATS, default_key)
    for name, chosen in (("format", value), ("key_format", key)):
        if chosen in REGISTRY_FORMATS and registry is None:
            raise ConfigError(
                f"{where}.{name}",
                f'{chosen} is read through a Schema Registry: add [schema_registry] with url = "http://host:port"',
            )
    subject = raw.get("subject", f"{topic}-value")
    if not isinstance(subject, str) or not subject:
        raise ConfigError(f"{where}.subject", f"expected the value's subject in the registry, got {subject!r}")
    flatten = raw.get("flatten", False)
    if not isinstance(flatten, bool):
        raise ConfigError(f"{where}.flatten", f"expected true or false, got {flatten!r}")
    if flatten and value not in (AVRO, PROTOBUF):
        raise ConfigError(
            f"{where}.flatten",
            f"applies to format avro or protobuf (their nested records as <record>_<field> columns), not {value}",
        )
    cdc_keys = {"cdc_position", "decimal_handling", "cdc_columns"} & set(raw)
    if envelope is None:
        if cdc_keys:
            raise ConfigError(f"{where}.{sorted(cdc_keys)[0]}", 'applies to envelope = "debezium" only')
        return RecordFormat(value, key, subject, flatten=flatten)
    if envelope != DEBEZIUM:
        raise ConfigError(f"{where}.envelope", f'expected "debezium" (or no envelope), got {envelope!r}')
    if kind != "upsert":
        raise ConfigError(f"{where}.envelope", f'Debezium change events need kind = "upsert", not {kind!r}')
    if value == PROTOBUF:
        raise ConfigError(f"{where}.format", "Debezium's converters write json or avro, not protobuf")
    position = _choice(raw, "cdc_position", where, tuple(CDC_POSITIONS), "lsn")
    handling = _choice(raw, "decimal_handling", where, DECIMAL_HANDLING, "precise")
    columns = raw.get("cdc_columns", [])
    if not isinstance(columns, list) or any(c not in CDC_COLUMNS for c in columns):
        raise ConfigError(f"{where}.cdc_columns", f"expected a list of {sorted(CDC_COLUMNS)}, got {columns!r}")
    position_column = "lsn" if position == "lsn" else "ts"
    chosen = tuple(c for c in CDC_COLUMNS if c in columns or c == position_column)
    return RecordFormat(value, key, subject, DEBEZIUM, CdcOptions(position, handling, chosen), flatten=flatten)
