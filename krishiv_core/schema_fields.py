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
the column types Debezium names (``io.debezium.time.*``, Connect's ``Decimal``, ``io.debezium.data.Json`` a
``json``; a PostgreSQL array is an Avro array, so a ``list``; ``VariableScaleDecimal`` is refused). JSON Schema: a
``properties`` object's ``string`` (``format: date-time`` a ``timestamp``, ``date`` a ``date``), ``integer`` (``long``),
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
from krishiv_core.spec_types import ELEMENT, JSON_TEXT, LIST, MAP, STRUCT, VALUE, EventField, FieldType

_RUNBOOK = runbook("A Schema Registry that does not answer")
#: Between a nested record's name and its fields' names, in a flattened field's name.
SEPARATOR = "_"
BINARY = "binary"

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
    "io.debezium.data.Json": JSON_TEXT,
}
#: Debezium's ``numeric`` without precision and scale: a record ``{scale, value}`` that no one decimal type holds.
_VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"


class _Unsupported(Exception):
    pass


class _AvroTypes:
    """Avro types to field types, the schema's named types (records, enums, fixed) remembered where they are defined
    so that a later reference by name reads the same; ``flatten`` keeps the old ``<record>_<field>`` columns."""

    def __init__(self, flatten: bool) -> None:
        self.flatten = flatten
        self.named: dict[str, Any] = {}
        self.open: set[str] = set()  # the records being read (a record inside itself is recursive)

    def remember(self, t: Mapping[str, Any], namespace: str) -> str:
        name = str(t.get("name", ""))
        space = t.get("namespace", namespace)
        full = name if "." in name or not space else f"{space}.{name}"
        self.named[full] = self.named[name] = t
        return full

    def resolve(self, t: Any, namespace: str, where: str) -> tuple[Any, str]:
        """A type given by name: its definition (and the namespace it was defined in)."""
        if isinstance(t, str) and t not in _AVRO_PRIMITIVES and t not in ("bytes", "null"):
            full = t if "." in t or not namespace else f"{namespace}.{t}"
            found = self.named.get(full, self.named.get(t))
            if found is None:
                raise ConfigError(where, f"is an Avro type {t!r} that the schema does not define")
            return found, found.get("namespace", namespace)
        return t, namespace

    def field_type(self, t: Any, where: str, namespace: str) -> tuple[FieldType, bool]:
        """(the type, whether a value is required: not a union with null) of a field, element or value."""
        branches = t if isinstance(t, list) else [t]
        kept = [b for b in branches if b != "null"]
        if len(kept) != 1:
            shown = ", ".join(b if isinstance(b, str) else str(b.get("type")) for b in kept)
            raise ConfigError(where, f"is an Avro union of several types ({shown}), which a table column cannot hold")
        return self.one_type(kept[0], where, namespace), len(kept) == len(branches)

    def one_type(self, t: Any, where: str, namespace: str) -> FieldType:
        t, namespace = self.resolve(t, namespace, where)
        if isinstance(t, str):
            if t in _AVRO_PRIMITIVES:
                return FieldType(_AVRO_PRIMITIVES[t])
            if t == "bytes":
                return FieldType(BINARY)
            raise _Unsupported(f"Avro {t}")
        kind = t.get("type")
        if isinstance(kind, dict | list):  # {"type": {"type": ...}}: the inner type
            return self.one_type(kind, where, namespace)
        if kind in ("record", "enum", "fixed", "error"):
            full = self.remember(t, namespace)
            namespace = t.get("namespace", namespace)
        named = _connect_named(t.get("connect.name"))
        if named is not None:
            return named
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
        if kind in ("fixed", "bytes"):
            return FieldType(BINARY)
        if kind in ("record", "error"):
            if full in self.open:
                raise _Unsupported(f"Avro record {full} that holds itself (recursive)")
            self.open.add(full)
            fields = tuple(self.fields(t, where + ".", namespace))
            self.open.discard(full)
            return FieldType(STRUCT, fields=fields)
        if kind == "array":
            element, required = self.field_type(t.get("items"), where + "[]", namespace)
            return FieldType(LIST, element=EventField(ELEMENT, element, required))
        if kind == "map":
            value, required = self.field_type(t.get("values"), where + "{}", namespace)
            return FieldType(MAP, key=FieldType("string"), element=EventField(VALUE, value, required))
        if isinstance(kind, str) and kind in _AVRO_PRIMITIVES:
            return FieldType(_AVRO_PRIMITIVES[kind])
        raise _Unsupported(f"Avro {kind}")

    def fields(self, record: Mapping[str, Any], prefix: str, namespace: str) -> list[EventField]:
        fields: list[EventField] = []
        for f in record.get("fields", []):
            name = prefix + f["name"]
            try:
                t, required = self.field_type(f["type"], name, namespace)
            except _Unsupported as exc:
                raise ConfigError(name, f"is an {exc}, which Krishiv's tables do not hold") from None
            field = EventField(f["name"], t, required)
            # flatten: the old columns, a nested record's fields as <record>_<field>, optional where the record is
            fields += _flattened((field,), "") if self.flatten and not prefix else [field]
        return fields


def _flattened(fields: tuple[EventField, ...], prefix: str) -> list[EventField]:
    """Fields with each struct's fields as ``<struct>_<field>`` (to any depth), optional where a struct is."""
    out: list[EventField] = []
    for f in fields:
        if f.type.name == STRUCT:
            inner = _flattened(f.type.fields, prefix + f.name + SEPARATOR)
            out += [EventField(n.name, n.type, n.required and f.required) for n in inner]
        else:
            out.append(EventField(prefix + f.name, f.type, f.required))
    return out


def avro_fields(schema_text: str, debezium: bool, flatten: bool = False) -> tuple[EventField, ...]:
    """The fields of an Avro record schema (of a Debezium envelope: its ``after`` row's); ``flatten``: nested
    records' fields as ``<record>_<field>`` columns, else structs."""
    schema = json.loads(schema_text)
    if debezium:
        # the row's record is defined where it first appears (``before``); ``after`` names it
        sides = [f for f in schema.get("fields", []) if f.get("name") in ("before", "after")]
        rows = [b for f in sides for b in f.get("type", []) if isinstance(b, dict) and b.get("type") == "record"]
        if not rows:
            raise ConfigError("schema", "is not a Debezium envelope: no after record")
        schema = {**rows[0], "namespace": rows[0].get("namespace", schema.get("namespace", ""))}
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ConfigError("schema", "is not an Avro record: its fields cannot be columns")
    types = _AvroTypes(flatten)
    namespace = str(schema.get("namespace", ""))
    types.open.add(types.remember(schema, namespace))
    return tuple(types.fields(schema, "", namespace))


_JSON_TYPES = {"integer": "long", "number": "double", "boolean": "boolean", "string": "string"}
_JSON_FORMATS = {"date-time": "timestamp", "date": "date"}


class _JsonSchemaTypes:
    """JSON Schema (draft 4 to 2020-12, the parts a table's types can say) to field types: ``$ref`` to the document's
    own definitions (``#/definitions/X``, ``#/$defs/X``) is followed."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.document = document
        self.open: list[str] = []

    def deref(self, prop: Any, where: str) -> Any:
        while isinstance(prop, Mapping) and "$ref" in prop:
            ref = str(prop["$ref"])
            if not ref.startswith("#/"):
                raise ConfigError(
                    where, f"is a JSON Schema $ref {ref!r} outside the schema, which Krishiv cannot follow"
                )
            target: Any = self.document
            for part in ref[2:].split("/"):
                target = target.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(target, Mapping) else None
            if target is None:
                raise ConfigError(where, f"is a JSON Schema $ref {ref!r} the schema does not define")
            prop = target
        return prop

    def field_type(self, prop: Any, where: str) -> tuple[FieldType, bool]:
        """(the type, whether it may not be null) of a property, an array's items or a map's values."""
        ref = prop.get("$ref") if isinstance(prop, Mapping) else None
        if ref is not None:
            if ref in self.open:
                raise ConfigError(where, f"is a JSON Schema {ref} that holds itself (recursive), which a table cannot")
            self.open.append(ref)
        try:
            return self._field_type(self.deref(prop, where), where)
        finally:
            if ref is not None:
                self.open.pop()

    def _field_type(self, prop: Any, where: str) -> tuple[FieldType, bool]:
        if not isinstance(prop, Mapping):
            return FieldType(JSON_TEXT), prop is not True
        t = prop.get("type")
        listed = t if isinstance(t, list) else [t] if t is not None else []
        types = [x for x in listed if x != "null"]
        required = "null" not in listed
        if len(types) != 1:  # no type (null too), or several: any JSON value
            return FieldType(JSON_TEXT), required and bool(types)
        kind = types[0]
        if kind == "string":
            return FieldType(_JSON_FORMATS.get(str(prop.get("format", "")), "string")), required
        if kind in _JSON_TYPES:
            return FieldType(_JSON_TYPES[kind]), required
        if kind == "array":
            items = prop.get("items", {})
            if isinstance(items, list):  # a tuple's positions: any JSON values
                return FieldType(LIST, element=EventField(ELEMENT, FieldType(JSON_TEXT), False)), required
            element, element_required = self.field_type(items, where + "[]")
            return FieldType(LIST, element=EventField(ELEMENT, element, element_required)), required
        if kind == "object":
            extra = prop.get("additionalProperties")
            if not prop.get("properties") and isinstance(extra, Mapping):
                value, value_required = self.field_type(extra, where + "{}")
                return FieldType(
                    MAP, key=FieldType("string"), element=EventField(VALUE, value, value_required)
                ), required
            if not prop.get("properties"):
                return FieldType(JSON_TEXT), required
            return FieldType(STRUCT, fields=tuple(self.fields(prop, where + "."))), required
        return FieldType(JSON_TEXT), required

    def fields(self, schema: Mapping[str, Any], prefix: str) -> list[EventField]:
        wanted = set(schema.get("required", []))
        fields = []
        for name, prop in schema.get("properties", {}).items():
            t, not_null = self.field_type(prop, prefix + name)
            fields.append(EventField(name, t, name in wanted and not_null))
        return fields


_CONNECT_TYPES = {
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "long",
    "float": "double",
    "double": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": BINARY,
}
_CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"


def _connect_named(name: Any) -> FieldType | None:
    """The field type a Kafka Connect schema name gives (Debezium's times, dates and JSON), if it gives one; a
    VariableScaleDecimal is refused."""
    if name in _CONNECT_NAMES:
        return FieldType(_CONNECT_NAMES[name])
    if name == _VARIABLE_DECIMAL:
        raise _Unsupported(
            "unbounded numeric (Debezium's VariableScaleDecimal: a PostgreSQL numeric without precision and scale, "
            "its scale varying by value; declare it as a decimal(p,s) that holds its values)"
        )
    return None


def _connect_type(schema: Mapping[str, Any]) -> FieldType:
    """A Kafka Connect schema (as the JSON converter embeds it) as a field type."""
    name = schema.get("name")
    named = _connect_named(name)
    if named is not None:
        return named
    kind = schema.get("type")
    if name == _CONNECT_DECIMAL:
        params = schema.get("parameters") or {}
        precision, scale = int(params.get("connect.decimal.precision", 0)), int(params.get("scale", 0))
        if not 1 <= precision <= 38:
            shown = precision or "unknown"
            raise _Unsupported(f"out-of-range Connect decimal of precision {shown} (Iceberg holds 1 to 38)")
        return FieldType("decimal", precision, scale)
    if kind == "array":
        items = schema.get("items") or {}
        return FieldType(LIST, element=EventField(ELEMENT, _connect_type(items), not items.get("optional", False)))
    if kind == "map":
        values = schema.get("values") or {}
        element = EventField(VALUE, _connect_type(values), not values.get("optional", False))
        return FieldType(MAP, key=_connect_type(schema.get("keys") or {}), element=element)
    if kind == "struct":
        return FieldType(STRUCT, fields=tuple(connect_field(f) for f in schema.get("fields", [])))
    if kind in _CONNECT_TYPES:
        return FieldType(_CONNECT_TYPES[kind])
    raise _Unsupported(f"unknown Connect type {kind}")


def connect_field(column: Mapping[str, Any]) -> EventField:
    """One column of a Connect struct schema as a field; a :class:`ConfigError` naming it when no column holds it."""
    try:
        t = _connect_type(column)
    except _Unsupported as exc:
        raise ConfigError(column["field"], f"is an {exc}, which Krishiv's tables do not hold") from None
    return EventField(column["field"], t, not column.get("optional", False))


def envelope_row(envelope: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The columns of a Debezium envelope's row in its Connect schema (its ``after``, else ``before``, struct)."""
    rows = [f for f in envelope.get("fields", []) if isinstance(f, Mapping) and f.get("field") in ("after", "before")]
    if not rows:
        raise ConfigError("schema", "is not a Debezium envelope: no after row")
    return list(rows[0].get("fields", []))


def json_schema_fields(schema_text: str) -> tuple[EventField, ...]:
    """The fields of a JSON Schema object: objects with properties are structs, arrays lists, objects with only
    ``additionalProperties`` maps, anything else (no type, several types) ``json``."""
    schema = json.loads(schema_text)
    types = _JsonSchemaTypes(schema)
    return tuple(types.fields(types.deref(schema, "schema"), ""))


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


def fields_of(
    client: Any, schema: Any, schema_id: int, fmt: str, debezium: bool, flatten: bool = False
) -> tuple[EventField, ...]:
    """The fields of a registry schema (a ``Schema``; Protobuf's in serialized format) in format ``fmt`` (``flatten``:
    nested records as ``<record>_<field>`` columns); a :class:`ConfigError` naming a field a table cannot hold."""
    text = schema.schema_str
    if fmt == AVRO:
        return avro_fields(text, debezium, flatten)
    if fmt == JSON_SCHEMA:
        return json_schema_fields(text)
    from krishiv_core.protobuf_schemas import message_descriptor, protobuf_fields

    fields = protobuf_fields(message_descriptor(client, schema, schema_id, [0]))
    return tuple(_flattened(fields, "") if flatten else fields)


def registry_fields(
    registry: RegistrySettings,
    subject: str,
    fmt: str,
    debezium: bool,
    env: Mapping[str, str],
    remembered: Path | None = None,
    flatten: bool = False,
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
        return fields_of(client, schema, schema_id, fmt, debezium, flatten), schema.schema_str, schema_id
    except ConfigError as exc:
        raise ConfigError(
            f"subject {subject} (schema id {schema_id}) field {exc.field}",
            str(exc).split(": ", 1)[1] + "; list the fields to keep under [pipelines.fields]",
        ) from None
