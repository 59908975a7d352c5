"""A pipeline's fields from its subject's latest schema in the Schema Registry, when the spec lists none.

Read when the spec is loaded (``krishiv run`` and every other command). The schema it was read from becomes the
reader schema of the Avro deserializer; a record written with a version registered after it (a higher schema id)
that has fields it lacks stops its batch before anything is staged, and a run reads the fields again
(:func:`krishiv_core.spec.with_latest_fields`) and starts its query again from its checkpoint, so the new fields
become new optional columns (by the spec's evolution rules) with the batch that first carries them. A record that
cannot be read as this one is a reject naming its schema id and why.

Avro: ``string``, ``enum`` and ``uuid`` are ``string``; ``int`` ``int``; ``long`` ``long``; ``float`` and
``double`` ``double``; ``boolean``; ``decimal`` (bytes or fixed) ``decimal(p,s)``; ``timestamp-millis``,
``timestamp-micros`` and their ``local-`` forms ``timestamp``; ``date`` ``date``. A union with ``null`` is an
optional field, any other field required. A nested record's fields are flattened into ``<record>_<field>``
(:data:`SEPARATOR`). Debezium's envelope (``envelope = "debezium"``) gives the fields of its ``after`` row, with
the column types Debezium names (``io.debezium.time.*``, Connect's ``Decimal``). JSON Schema: a ``properties``
object's ``string`` (``format: date-time`` a ``timestamp``, ``date`` a ``date``), ``integer`` (``long``),
``number`` (``double``), ``boolean``; ``required`` lists the required fields. Protobuf: the subject's first
message type, by ``krishiv_core.protobuf_schemas``. A type Krishiv's tables do not
hold (an array, a map, bytes, a union of two types) stops the load naming the field: list the fields to keep under
``[pipelines.fields]``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from krishiv_core.errors import ConfigError
from krishiv_core.formats import AVRO, JSON_SCHEMA, PROTOBUF, RegistrySettings
from krishiv_core.runbook import runbook
from krishiv_core.spec_types import EventField, FieldType

_RUNBOOK = runbook("A Schema Registry that does not answer")
#: Between a nested record's name and its fields' names, in a flattened field's name.
SEPARATOR = "_"

_AVRO_PRIMITIVES = {
    "string": "string",
    "int": "int",
    "long": "long",
    "float": "double",
    "double": "double",
    "boolean": "boolean",
    "enum": "string",
}
_AVRO_LOGICAL = {
    "timestamp-millis": "timestamp",
    "timestamp-micros": "timestamp",
    "local-timestamp-millis": "timestamp",
    "local-timestamp-micros": "timestamp",
    "date": "date",
    "uuid": "string",
}
_CONNECT_NAMES = {
    "io.debezium.time.Date": "date",
    "org.apache.kafka.connect.data.Date": "date",
    "io.debezium.time.Timestamp": "timestamp",
    "io.debezium.time.MicroTimestamp": "timestamp",
    "io.debezium.time.NanoTimestamp": "timestamp",
    "io.debezium.time.ZonedTimestamp": "timestamp",
    "org.apache.kafka.connect.data.Timestamp": "timestamp",
}


class _Unsupported(Exception):
    pass


def _avro_type(t: Any, name: str) -> FieldType:
    if isinstance(t, str):
        if t in _AVRO_PRIMITIVES:
            return FieldType(_AVRO_PRIMITIVES[t])
        raise _Unsupported(f"Avro {t}")
    kind = t.get("type")
    connect = t.get("connect.name")
    if connect in _CONNECT_NAMES:
        return FieldType(_CONNECT_NAMES[connect])
    logical = t.get("logicalType")
    if logical == "decimal":
        precision, scale = int(t.get("precision", 0)), int(t.get("scale", 0))
        if not 1 <= precision <= 38:
            raise _Unsupported(f"Avro decimal({precision},{scale}): Iceberg holds a precision of 1 to 38")
        return FieldType("decimal", precision, scale)
    if logical in _AVRO_LOGICAL:
        return FieldType(_AVRO_LOGICAL[logical])
    if kind == "enum":
        return FieldType("string")
    if isinstance(kind, str) and kind in _AVRO_PRIMITIVES:
        return FieldType(_AVRO_PRIMITIVES[kind])
    raise _Unsupported(f"Avro {kind}")


def _avro_fields(record: Mapping[str, Any], prefix: str = "") -> list[EventField]:
    fields: list[EventField] = []
    for f in record.get("fields", []):
        name = prefix + f["name"]
        t = f["type"]
        branches = t if isinstance(t, list) else [t]
        kept = [b for b in branches if b != "null"]
        required = len(kept) == len(branches)
        if len(kept) != 1:
            raise ConfigError(name, "is an Avro union of several types, which a table column cannot hold")
        only = kept[0]
        if isinstance(only, dict) and only.get("type") == "record":
            nested = _avro_fields(only, name + SEPARATOR)
            fields += nested if required else [EventField(n.name, n.type, False) for n in nested]
            continue
        try:
            fields.append(EventField(name, _avro_type(only, name), required))
        except _Unsupported as exc:
            raise ConfigError(name, f"is an {exc}, which Krishiv's tables do not hold") from None
    return fields


def avro_fields(schema_text: str, debezium: bool) -> tuple[EventField, ...]:
    """The fields of an Avro record schema (of a Debezium envelope: its ``after`` row's)."""
    schema = json.loads(schema_text)
    if debezium:
        # the row's record is defined where it first appears (``before``); ``after`` names it
        sides = [f for f in schema.get("fields", []) if f.get("name") in ("before", "after")]
        rows = [b for f in sides for b in f.get("type", []) if isinstance(b, dict) and b.get("type") == "record"]
        if not rows:
            raise ConfigError("schema", "is not a Debezium envelope: no after record")
        schema = rows[0]
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ConfigError("schema", "is not an Avro record: its fields cannot be columns")
    return tuple(_avro_fields(schema))


_JSON_TYPES = {"integer": "long", "number": "double", "boolean": "boolean", "string": "string"}
_JSON_FORMATS = {"date-time": "timestamp", "date": "date"}


def json_schema_fields(schema_text: str) -> tuple[EventField, ...]:
    schema = json.loads(schema_text)
    required = set(schema.get("required", []))
    fields = []
    for name, prop in schema.get("properties", {}).items():
        t = prop.get("type")
        types = [x for x in t if x != "null"] if isinstance(t, list) else [t]
        optional = isinstance(t, list) and "null" in t
        if len(types) != 1 or types[0] not in _JSON_TYPES:
            raise ConfigError(name, f"is a JSON Schema {t}, which Krishiv's tables do not hold")
        type_name = _JSON_FORMATS.get(prop.get("format", ""), _JSON_TYPES[types[0]]) if types[0] == "string" else None
        fields.append(
            EventField(name, FieldType(type_name or _JSON_TYPES[types[0]]), name in required and not optional)
        )
    return tuple(fields)


class RegistryDown(ConfigError):
    """The registry did not answer when the fields were to be read from it."""


def latest_schema(client: Any, registry: RegistrySettings, subject: str, fmt: str | None = None) -> Any:
    """The subject's latest registered schema (a ``RegisteredSchema``); one clear line when it cannot be read."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        return client.get_latest_version(subject, fmt=fmt)
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404:
            raise ConfigError(
                "schema_registry",
                f"subject {subject!r} is not in the Schema Registry at {registry.url}: register its schema, set the "
                "pipeline's subject, or list its fields under [pipelines.fields]",
            ) from None
        raise ConfigError(
            "schema_registry",
            f"the Schema Registry at {registry.url} answered {exc.http_status_code} {exc.error_message} {_RUNBOOK}",
        ) from None
    except Exception as exc:
        raise RegistryDown(
            "schema_registry",
            f"the Schema Registry at {registry.url} did not answer ({type(exc).__name__}); the fields of {subject!r} "
            f"come from it: start it, or list the fields under [pipelines.fields] {_RUNBOOK}",
        ) from None


def fields_of(client: Any, schema: Any, schema_id: int, fmt: str, debezium: bool) -> tuple[EventField, ...]:
    """The fields of a registry schema (a ``Schema``; Protobuf's in serialized format) in format ``fmt``; a
    :class:`ConfigError` naming a field whose type a table cannot hold."""
    text = schema.schema_str
    if fmt == AVRO:
        return avro_fields(text, debezium)
    if fmt == JSON_SCHEMA:
        return json_schema_fields(text)
    from krishiv_core.protobuf_schemas import message_descriptor, protobuf_fields

    return tuple(protobuf_fields(message_descriptor(client, schema, schema_id, [0])))


def registry_fields(
    registry: RegistrySettings,
    subject: str,
    fmt: str,
    debezium: bool,
    env: Mapping[str, str],
    remembered: Path | None = None,
) -> tuple[tuple[EventField, ...], str, int]:
    """(the fields, the schema's text, its id) of ``subject``'s latest schema.

    ``remembered``: a file keeping the last schema read, so that commands that decode nothing (``commit``,
    ``status``, ``verify``…) still load the spec while the registry does not answer; a run then waits for the
    registry in its tasks (up to ``KRISHIV_REGISTRY_OUTAGE_S``) as it would for a schema id it has not seen.
    """
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient.new_client(registry.client_config(env))
    try:
        registered = latest_schema(client, registry, subject, "serialized" if fmt == PROTOBUF else None)
        schema, schema_id = registered.schema, registered.schema_id
    except RegistryDown:
        kept = json.loads(remembered.read_text()) if remembered is not None and remembered.exists() else {}
        if kept.get("subject") != subject or kept.get("format") != fmt:
            raise
        schema, schema_id = Schema(kept["schema"], kept["type"]), kept["schema_id"]
    else:
        if remembered is not None:
            doc = {"subject": subject, "format": fmt, "schema_id": schema_id, "type": schema.schema_type}
            doc["schema"] = schema.schema_str
            text = json.dumps(doc, indent=1)
            if not remembered.exists() or remembered.read_text() != text:
                remembered.parent.mkdir(parents=True, exist_ok=True)
                remembered.write_text(text)
    try:
        return fields_of(client, schema, schema_id, fmt, debezium), schema.schema_str, schema_id
    except ConfigError as exc:
        raise ConfigError(
            f"subject {subject} (schema id {schema_id}) field {exc.field}",
            str(exc).split(": ", 1)[1] + "; list the fields to keep under [pipelines.fields]",
        ) from None
