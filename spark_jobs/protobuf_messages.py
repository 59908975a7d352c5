"""Protobuf records in the Confluent wire format read into Python values, with message types built from the
registry's schemas (``krishiv_core.protobuf_schemas``), cached per schema id and message-index path."""

from __future__ import annotations

import binascii
from datetime import UTC
from typing import Any

from confluent_kafka.serialization import SerializationError
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

from krishiv_core.protobuf_schemas import JSON_MESSAGES, TIMESTAMP, WRAPPERS, message_class, message_descriptor


def message_values(message: Any, descriptor: Descriptor) -> dict[str, Any]:
    """A message's fields as Python values: an unset field with presence is None, an enum its name, a timestamp a
    UTC time, a wrapper its value, ``Struct``/``Value``/``ListValue`` their JSON value, a nested message a dict, a
    repeated field a list, a map a dict (bytes stay bytes)."""
    values: dict[str, Any] = {}
    for f in descriptor.fields:
        if f.has_presence and not message.HasField(f.name):
            values[f.name] = None
            continue
        value = getattr(message, f.name)
        if f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
            value_field = f.message_type.fields_by_name["value"]
            values[f.name] = {k: _one_value(v, value_field) for k, v in value.items()}
        elif f.is_repeated:
            values[f.name] = [_one_value(v, f) for v in value]
        else:
            values[f.name] = _one_value(value, f)
    return values


def _one_value(value: Any, f: FieldDescriptor) -> Any:
    if f.type == FieldDescriptor.TYPE_ENUM:
        known = f.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    if f.type == FieldDescriptor.TYPE_MESSAGE:
        full = f.message_type.full_name
        if full == TIMESTAMP:
            return value.ToDatetime(tzinfo=UTC)
        if full in WRAPPERS:
            return value.value
        if full in JSON_MESSAGES:
            return json_format.MessageToDict(value)
        return message_values(value, f.message_type)
    return value


class ProtobufReader:
    """A deserializer for the wire format's Protobuf framing (magic byte, schema id, message indexes), called as
    confluent-kafka's are: ``reader(data, ctx)``."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._types: dict[tuple[int, tuple[int, ...]], tuple[Any, Descriptor]] = {}

    def __call__(self, data: bytes, ctx: Any) -> dict[str, Any]:
        from confluent_kafka.schema_registry import dual_schema_id_deserializer
        from confluent_kafka.schema_registry.serde import SchemaId

        schema_id = SchemaId("PROTOBUF")
        payload = dual_schema_id_deserializer(data, ctx, schema_id)
        key = (schema_id.id, tuple(schema_id.message_indexes or [0]))
        known = self._types.get(key)
        if known is None:
            schema = self.client.get_schema(schema_id.id, fmt="serialized")
            try:
                descriptor = message_descriptor(self.client, schema, schema_id.id, list(key[1]))
            except (DecodeError, binascii.Error, IndexError, KeyError, TypeError) as exc:
                raise SerializationError(f"not a Protobuf schema Krishiv can read ({exc})") from None
            known = self._types[key] = (message_class(descriptor), descriptor)
        cls, descriptor = known
        message = cls()
        message.ParseFromString(payload.read())
        return message_values(message, descriptor)
