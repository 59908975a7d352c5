"""Protobuf message types built from the Schema Registry's schemas, with no generated class.

confluent-kafka's ``ProtobufDeserializer`` parses into a generated class the consumer was built with; Krishiv reads
users' topics it has no classes for. The registry serves a Protobuf schema as a serialized ``FileDescriptorProto``
(``format=serialized``, as confluent-kafka's own deserializer asks), its imports as references (each a subject
and version); they are added to a descriptor pool beside protobuf's well-known types, and the message type a
record names (the wire format's message-index path: ``[i]`` the i-th top-level message, ``[i, j]`` its j-th nested
type) is made with ``message_factory``.

A message's fields as a pipeline's: ``string`` and enums ``string``; ``int32``/``sint32``/``sfixed32`` ``int``;
``int64``/``sint64``/``sfixed64``/``uint32``/``uint64``/``fixed*`` ``long`` (a ``uint64`` above the long's range is
a reject); ``double``/``float`` ``double``; ``bool`` ``boolean``; ``google.protobuf.Timestamp`` ``timestamp``; a
wrapper (``google.protobuf.StringValue`` …) its value's type, optional; a nested message flattened as Avro's
records are. A field with presence (proto3 ``optional``, a message) is optional; any other always has a value
(its default when unset), so it is required. Repeated fields, maps and bytes stop the load naming the field.
"""

from __future__ import annotations

import base64
from typing import Any

from google.protobuf import (
    any_pb2,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    message_factory,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from krishiv_core.errors import ConfigError
from krishiv_core.spec_types import ELEMENT, JSON_TEXT, LIST, MAP, STRUCT, VALUE, EventField, FieldType

_WELL_KNOWN = (any_pb2, duration_pb2, empty_pb2, struct_pb2, timestamp_pb2, wrappers_pb2)
TIMESTAMP = "google.protobuf.Timestamp"
BINARY = "binary"
#: The well-known types holding any JSON value: ``json``.
JSON_MESSAGES = ("google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue")
#: The wrapper types: their ``value`` field, optional.
WRAPPERS = {
    f"google.protobuf.{name}Value": name.lower()
    for name in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String")
}
_SCALARS = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_ENUM: "string",
    FieldDescriptor.TYPE_INT32: "int",
    FieldDescriptor.TYPE_SINT32: "int",
    FieldDescriptor.TYPE_SFIXED32: "int",
    FieldDescriptor.TYPE_INT64: "long",
    FieldDescriptor.TYPE_SINT64: "long",
    FieldDescriptor.TYPE_SFIXED64: "long",
    FieldDescriptor.TYPE_UINT32: "long",
    FieldDescriptor.TYPE_UINT64: "long",
    FieldDescriptor.TYPE_FIXED32: "long",
    FieldDescriptor.TYPE_FIXED64: "long",
    FieldDescriptor.TYPE_DOUBLE: "double",
    FieldDescriptor.TYPE_FLOAT: "double",
    FieldDescriptor.TYPE_BOOL: "boolean",
}
_WRAPPED = {
    "double": "double",
    "float": "double",
    "int64": "long",
    "uint64": "long",
    "int32": "int",
    "uint32": "long",
    "bool": "boolean",
    "string": "string",
}


def _file(schema_str: str, name: str) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema_str))
    proto.name = name
    return proto


def message_descriptor(client: Any, schema: Any, schema_id: int | str, indexes: list[int] | None) -> Descriptor:
    """The message type ``indexes`` names in ``schema`` (a registry ``Schema`` in serialized format), its references
    fetched through ``client`` (the client caches them)."""
    pool = descriptor_pool.DescriptorPool()
    added = set()
    for module in _WELL_KNOWN:
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
        added.add(module.DESCRIPTOR.name)

    def add_references(s: Any) -> None:
        for ref in s.references or []:
            if ref.name in added:
                continue
            referenced = client.get_version(ref.subject, ref.version, True, "serialized").schema
            add_references(referenced)
            pool.Add(_file(referenced.schema_str, ref.name))
            added.add(ref.name)

    add_references(schema)
    proto = _file(schema.schema_str, f"krishiv-writer-{schema_id}.proto")
    pool.Add(proto)
    names, container = [], proto.message_type
    for index in indexes or [0]:
        names.append(container[index].name)
        container = container[index].nested_type
    return pool.FindMessageTypeByName(".".join([proto.package, *names] if proto.package else names))


def message_class(descriptor: Descriptor) -> Any:
    return message_factory.GetMessageClass(descriptor)


def protobuf_fields(descriptor: Descriptor) -> list[EventField]:
    """The pipeline fields of a message type (see the module's docstring)."""
    return _message_fields(descriptor, (descriptor.full_name,))


def _message_fields(descriptor: Descriptor, open_types: tuple[str, ...], prefix: str = "") -> list[EventField]:
    fields: list[EventField] = []
    for f in descriptor.fields:
        name = prefix + f.name
        if f.is_repeated and f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
            entry = f.message_type
            key = _one_type(entry.fields_by_name["key"], open_types, name + "{}")
            value = _one_type(entry.fields_by_name["value"], open_types, name + "{}")
            # a map's value is never null (an unset message value reads as its defaults)
            t = FieldType(MAP, key=key, element=EventField(VALUE, value, True))
            fields.append(EventField(f.name, t, True))
            continue
        t = _one_type(f, open_types, name)
        if f.is_repeated:  # an absent repeated field is an empty list; an element is never null
            fields.append(EventField(f.name, FieldType(LIST, element=EventField(ELEMENT, t, True)), True))
            continue
        optional = f.has_presence or (f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.full_name in WRAPPERS)
        fields.append(EventField(f.name, t, not optional))
    return fields


def _one_type(f: FieldDescriptor, open_types: tuple[str, ...], name: str) -> FieldType:
    """One value's type of field ``f`` (an element's, for a repeated field)."""
    if f.type == FieldDescriptor.TYPE_MESSAGE:
        full = f.message_type.full_name
        if full == TIMESTAMP:
            return FieldType("timestamp")
        if full in WRAPPERS:
            return FieldType(_WRAPPED[WRAPPERS[full]])
        if full in JSON_MESSAGES:
            return FieldType(JSON_TEXT)
        if full in open_types:
            raise ConfigError(name, f"is a Protobuf message {full} that holds itself (recursive), which a table cannot")
        if full.startswith("google.protobuf."):
            raise ConfigError(name, f"is a Protobuf {full}, which Krishiv's tables do not hold")
        return FieldType(STRUCT, fields=tuple(_message_fields(f.message_type, (*open_types, full), name + ".")))
    if f.type == FieldDescriptor.TYPE_BYTES:
        return FieldType(BINARY)
    if f.type not in _SCALARS:
        raise ConfigError(name, f"is a Protobuf {f.type} field, which Krishiv's tables do not hold")
    return FieldType(_SCALARS[f.type])
