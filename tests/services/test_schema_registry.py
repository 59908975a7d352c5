"""The test Schema Registry against the REAL confluent-kafka Schema Registry client, over HTTP (not ``mock://``).

What these tests established about confluent-kafka 2.16.1 (``confluent_kafka.schema_registry``):

* it talks HTTP through ``httpx2`` when installed (it is here), else ``httpx``: a registry that is down raises
  ``httpx2.ConnectError`` (a ``TransportError``), *not* ``httpx.ConnectError`` and not ``SchemaRegistryError``;
  the portable way to name it is ``confluent_kafka.schema_registry.common._httpx_compat.httpx.TransportError``;
* it retries by itself: ``max.retries`` (default 3, i.e. 4 attempts) on a transport error and on 408/429/500/502/503/
  504, sleeping a full-jitter ``random() * min(retries.wait.ms * 2**i, retries.max.wait.ms)`` (defaults 1000 and
  20000 ms); other statuses (401, 404, 409, 422) are raised at once as ``SchemaRegistryError``;
* ``ProtobufDeserializer`` needs the generated class (it reads ``message_type.DESCRIPTOR`` in its constructor and
  always parses into that class), but the writer schema it fetches (``format=serialized``) is enough to decode a
  message without any generated class: see ``decode_protobuf_without_class`` below.
"""

from __future__ import annotations

import base64
import datetime as dt
import http.client
import json
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient, dual_schema_id_deserializer
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.common._httpx_compat import httpx as sr_httpx
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.schema_registry.serde import SchemaId
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    json_format,
    message_factory,
    timestamp_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from tests.services.schema_registry import SchemaRegistryServer

#: Fast retries, so that fault tests take milliseconds.
FAST = {"retries.wait.ms": 5, "retries.max.wait.ms": 20}


@pytest.fixture
def client(schema_registry: SchemaRegistryServer) -> Iterator[SchemaRegistryClient]:
    with SchemaRegistryClient({"url": schema_registry.url}) as c:
        yield c


def value_ctx(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


# ====================================================================== Avro

ORDER_V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "krishiv.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {
            "name": "customer",
            "type": {
                "type": "record",
                "name": "Customer",
                "fields": [{"name": "name", "type": "string"}, {"name": "vip", "type": "boolean"}],
            },
        },
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "counts", "type": {"type": "map", "values": "int"}},
    ],
}
ORDER_V2 = {**ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}

ORDER = {
    "id": 42,
    "amount": Decimal("1234.56"),
    "created_at": dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=dt.UTC),
    "customer": {"name": "Asha", "vip": True},
    "tags": ["new", "gift"],
    "counts": {"apples": 3, "pears": 0},
}


def test_avro_round_trip_wire_format_and_evolution(schema_registry: SchemaRegistryServer) -> None:
    topic, subject = "orders-avro", "orders-avro-value"
    with (
        SchemaRegistryClient({"url": schema_registry.url}) as producer_client,
        SchemaRegistryClient({"url": schema_registry.url}) as consumer_client,
    ):
        v1 = AvroSerializer(producer_client, json.dumps(ORDER_V1, indent=2), conf={"auto.register.schemas": True})
        data = v1(ORDER, value_ctx(topic))
        assert data is not None
        v1_id = schema_registry.latest(subject)["id"]
        assert v1_id == 1
        assert data[:5] == b"\x00" + v1_id.to_bytes(4, "big")  # Confluent wire format: magic 0, big-endian id

        assert AvroDeserializer(consumer_client)(data, value_ctx(topic)) == ORDER

        # v2 adds an optional field; the registry gives it version 2 and a new id.
        v2 = AvroSerializer(producer_client, json.dumps(ORDER_V2))
        data2 = v2({**ORDER, "note": "leave at the door"}, value_ctx(topic))
        assert data2 is not None
        assert int.from_bytes(data2[1:5], "big") == 2
        assert schema_registry.versions(subject) == [1, 2]

        # A v1 reader drops the new field (Avro schema resolution with the writer schema from the registry) ...
        old_reader = AvroDeserializer(consumer_client, schema_str=json.dumps(ORDER_V1))
        assert old_reader(data2, value_ctx(topic)) == ORDER
        # ... and a reader of the writer's schema sees it.
        assert AvroDeserializer(consumer_client)(data2, value_ctx(topic)) == {**ORDER, "note": "leave at the door"}

        latest = consumer_client.get_latest_version(subject)
        assert (latest.version, latest.schema_id, latest.subject) == (2, 2, subject)
        assert json.loads(latest.schema.schema_str or "") == ORDER_V2

    # The same schema (whitespace aside) under another subject keeps its id; the registry answers compact JSON.
    assert schema_registry.register("elsewhere-value", json.dumps(ORDER_V1)) == v1_id
    assert schema_registry.schema_by_id(v1_id) == {"schema": json.dumps(ORDER_V1, separators=(",", ":"))}
    assert schema_registry.unknown_requests == []


def test_avro_references(schema_registry: SchemaRegistryServer, client: SchemaRegistryClient) -> None:
    customer = {
        "type": "record",
        "name": "Customer",
        "namespace": "krishiv.test",
        "fields": [{"name": "name", "type": "string"}],
    }
    order = {
        "type": "record",
        "name": "Order",
        "namespace": "krishiv.test",
        "fields": [{"name": "id", "type": "long"}, {"name": "customer", "type": "krishiv.test.Customer"}],
    }
    client.register_schema("customer", Schema(json.dumps(customer), "AVRO"))
    ref = SchemaReference("krishiv.test.Customer", "customer", 1)
    order_schema = Schema(json.dumps(order), "AVRO", [ref])
    client.register_schema("refs-value", order_schema)
    serializer = AvroSerializer(client, order_schema, conf={"auto.register.schemas": False})
    data = serializer({"id": 7, "customer": {"name": "Ravi"}}, value_ctx("refs"))
    with SchemaRegistryClient({"url": schema_registry.url}) as fresh:
        assert AvroDeserializer(fresh)(data, value_ctx("refs")) == {"id": 7, "customer": {"name": "Ravi"}}
    # An Avro schema naming an unknown type, without the reference, is invalid (422 / 42201).
    with pytest.raises(SchemaRegistryError) as e:
        client.register_schema("broken-value", Schema(json.dumps(order), "AVRO"))
    assert (e.value.http_status_code, e.value.error_code) == (422, 42201)
    assert schema_registry.unknown_requests == []


# ====================================================================== Protobuf (classes built without protoc)

_F = descriptor_pb2.FieldDescriptorProto


def _field(
    msg: descriptor_pb2.DescriptorProto, name: str, number: int, kind: int, type_name: str = "", repeated: bool = False
) -> descriptor_pb2.FieldDescriptorProto:
    f = msg.field.add(name=name, number=number, type=kind)  # type: ignore[arg-type]
    f.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if type_name:
        f.type_name = type_name
    return f


def protobuf_files() -> tuple[descriptor_pb2.FileDescriptorProto, descriptor_pb2.FileDescriptorProto]:
    """money.proto and order.proto (importing it and google/protobuf/timestamp.proto), as protoc would make them."""
    money = descriptor_pb2.FileDescriptorProto(name="krishiv_test/money.proto", package="krishiv.test", syntax="proto3")
    m = money.message_type.add(name="Money")
    _field(m, "currency", 1, _F.TYPE_STRING)
    _field(m, "units", 2, _F.TYPE_INT64)

    order = descriptor_pb2.FileDescriptorProto(name="krishiv_test/order.proto", package="krishiv.test", syntax="proto3")
    order.dependency.extend(["krishiv_test/money.proto", "google/protobuf/timestamp.proto"])
    o = order.message_type.add(name="Order")
    status = o.enum_type.add(name="Status")
    for i, name in enumerate(["STATUS_UNSPECIFIED", "PLACED", "SHIPPED"]):
        status.value.add(name=name, number=i)
    line = o.nested_type.add(name="Line")
    _field(line, "sku", 1, _F.TYPE_STRING)
    _field(line, "qty", 2, _F.TYPE_INT32)
    entry = o.nested_type.add(name="CountsEntry")  # map<string, int64> counts = 4
    entry.options.map_entry = True
    _field(entry, "key", 1, _F.TYPE_STRING)
    _field(entry, "value", 2, _F.TYPE_INT64)
    _field(o, "id", 1, _F.TYPE_INT64)
    _field(o, "customer", 2, _F.TYPE_STRING)
    _field(o, "tags", 3, _F.TYPE_STRING, repeated=True)
    _field(o, "counts", 4, _F.TYPE_MESSAGE, ".krishiv.test.Order.CountsEntry", repeated=True)
    _field(o, "total", 5, _F.TYPE_MESSAGE, ".krishiv.test.Money")
    _field(o, "created_at", 6, _F.TYPE_MESSAGE, ".google.protobuf.Timestamp")
    _field(o, "status", 7, _F.TYPE_ENUM, ".krishiv.test.Order.Status")
    note = _field(o, "note", 8, _F.TYPE_STRING)  # proto3 `optional string note = 8;`
    note.proto3_optional = True
    o.oneof_decl.add(name="payment")
    _field(o, "card", 9, _F.TYPE_STRING).oneof_index = 0
    _field(o, "iban", 10, _F.TYPE_STRING).oneof_index = 0
    note.oneof_index = 1
    o.oneof_decl.add(name="_note")
    _field(o, "lines", 11, _F.TYPE_MESSAGE, ".krishiv.test.Order.Line", repeated=True)
    return money, order


def order_class() -> type[Message]:
    """The generated class of krishiv.test.Order, from a private pool (no protoc on this machine)."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    for proto in protobuf_files():
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("krishiv.test.Order"))


def an_order(cls: type[Message]) -> Message:
    msg = cls()
    payload: dict[str, Any] = {
        "id": "42",
        "customer": "Asha",
        "tags": ["new", "gift"],
        "counts": {"apples": "3"},
        "total": {"currency": "INR", "units": "1234"},
        "createdAt": "2024-05-06T07:08:09.123Z",
        "status": "SHIPPED",
        "note": "",  # set to the default value: proto3 `optional` keeps presence
        "iban": "DE89370400440532013000",
        "lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-2", "qty": 1}],
    }
    return json_format.ParseDict(payload, msg)


#: What a registry serves without a generated class: files the confluent-kafka deserializer pool also preloads.
_WELL_KNOWN = (timestamp_pb2, duration_pb2, wrappers_pb2)


def decode_protobuf_without_class(
    client: SchemaRegistryClient, data: bytes, ctx: SerializationContext | None = None
) -> dict[str, Any]:
    """Decode a Confluent-framed Protobuf message with only the writer schema from the registry.

    The framing is parsed by confluent-kafka's public ``dual_schema_id_deserializer`` (magic byte, schema id,
    message-index path); the schema is fetched with ``format=serialized`` (a base64 ``FileDescriptorProto``, as
    confluent-kafka's own deserializer asks), its references likewise, and the message type is built at run time.
    """
    schema_id = SchemaId("PROTOBUF")
    payload = dual_schema_id_deserializer(data, ctx, schema_id)
    assert schema_id.id is not None
    writer = client.get_schema(schema_id.id, fmt="serialized")
    pool = descriptor_pool.DescriptorPool()
    for module in _WELL_KNOWN:
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    added: set[str] = {module.DESCRIPTOR.name for module in _WELL_KNOWN}

    def add_references(schema: Schema) -> None:
        for ref in schema.references or []:
            if ref.name in added or ref.subject is None or ref.version is None:
                continue
            referenced = client.get_version(ref.subject, ref.version, True, "serialized").schema
            add_references(referenced)
            proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(referenced.schema_str or ""))
            proto.name = ref.name or ""
            pool.Add(proto)
            added.add(proto.name)

    add_references(writer)
    proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(writer.schema_str or ""))
    proto.name = f"writer-{schema_id.id}.proto"
    pool.Add(proto)
    # The message-index path: [i] is the i-th top-level message, [i, j] its j-th nested type, and so on.
    names, container = [], proto.message_type
    for index in schema_id.message_indexes or [0]:
        names.append(container[index].name)
        container = container[index].nested_type
    desc: Descriptor = pool.FindMessageTypeByName(".".join([proto.package, *names] if proto.package else names))
    msg = message_factory.GetMessageClass(desc)()
    msg.ParseFromString(payload.read())
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def test_protobuf_round_trip_with_a_reference(schema_registry: SchemaRegistryServer) -> None:
    cls = order_class()
    order = an_order(cls)
    topic, subject = "orders-pb", "orders-pb-value"
    with SchemaRegistryClient({"url": schema_registry.url}) as producer_client:
        serializer = ProtobufSerializer(cls, producer_client, {"use.deprecated.format": False})
        data = serializer(order, value_ctx(topic))
    assert data is not None
    order_id = schema_registry.latest(subject)["id"]
    # magic 0, id, then the message-index path [0] written as the single byte 0.
    assert data[:6] == b"\x00" + order_id.to_bytes(4, "big") + b"\x00"
    # The import became a reference registered under its file name: a subject with a '/' in it (URL-encoded).
    assert schema_registry.subjects() == ["krishiv_test/money.proto", subject]
    assert schema_registry.latest(subject)["references"] == [
        {"name": "krishiv_test/money.proto", "subject": "krishiv_test/money.proto", "version": 1}
    ]

    with SchemaRegistryClient({"url": schema_registry.url}) as consumer_client:
        deserializer = ProtobufDeserializer(cls, {"use.deprecated.format": False}, consumer_client)
        assert deserializer(data, value_ctx(topic)) == order
    asked = [r for r in schema_registry.requests if r.method == "GET"]
    assert [(r.path, r.query.get("format")) for r in asked if not r.path.startswith("/associations")] == [
        (f"/schemas/ids/{order_id}", ["serialized"]),
        ("/subjects/krishiv_test/money.proto/versions/1", ["serialized"]),
    ]
    assert schema_registry.unknown_requests == []


def test_protobuf_is_served_as_proto_text_by_default(schema_registry: SchemaRegistryServer) -> None:
    cls = order_class()
    with SchemaRegistryClient({"url": schema_registry.url}) as c:
        ProtobufSerializer(cls, c, {"use.deprecated.format": False})(an_order(cls), value_ctx("pb"))
        order_id = schema_registry.latest("pb-value")["id"]
        text = c.get_schema(order_id).schema_str or ""  # what a real registry answers without ?format=
    assert text.startswith('syntax = "proto3";\npackage krishiv.test;\n')
    assert 'import "krishiv_test/money.proto";' in text
    assert "map<string, int64> counts = 4;" in text
    assert "optional string note = 8;" in text
    assert "oneof payment {" in text
    # The text parses back to the same schema: registered as text (as a Java producer does), it gets the same id.
    money_ref = {"name": "krishiv_test/money.proto", "subject": "krishiv_test/money.proto", "version": 1}
    assert schema_registry.register("copy-value", text, "PROTOBUF", [money_ref]) == order_id
    assert schema_registry.unknown_requests == []


def test_protobuf_registered_as_text_decodes_with_and_without_a_class(schema_registry: SchemaRegistryServer) -> None:
    """A schema registered as .proto text (a Java producer) read by confluent-kafka and by the class-less decoder."""
    money_text = 'syntax = "proto3";\npackage krishiv.test;\nmessage Money { string currency = 1; int64 units = 2; }\n'
    money_id = schema_registry.register("krishiv_test/money.proto", money_text, "PROTOBUF")
    order_text = """
        syntax = "proto3";
        package krishiv.test;
        import "krishiv_test/money.proto";
        import "google/protobuf/timestamp.proto";
        // the same Order as protobuf_files(), written by hand
        message Order {
          enum Status { STATUS_UNSPECIFIED = 0; PLACED = 1; SHIPPED = 2; }
          message Line { string sku = 1; int32 qty = 2; }
          int64 id = 1;
          string customer = 2;
          repeated string tags = 3;
          map<string, int64> counts = 4;
          Money total = 5;
          google.protobuf.Timestamp created_at = 6;
          Status status = 7;
          optional string note = 8;
          oneof payment { string card = 9; string iban = 10; }
          repeated Line lines = 11;
        }
    """
    ref = {"name": "krishiv_test/money.proto", "subject": "krishiv_test/money.proto", "version": 1}
    order_id = schema_registry.register("orders-value", order_text, "PROTOBUF", [ref])
    assert (money_id, order_id) == (1, 2)

    cls = order_class()
    order = an_order(cls)
    data = b"\x00" + order_id.to_bytes(4, "big") + b"\x00" + order.SerializeToString()
    with SchemaRegistryClient({"url": schema_registry.url}) as c:
        assert ProtobufDeserializer(cls, {"use.deprecated.format": False}, c)(data, value_ctx("orders")) == order
        decoded = decode_protobuf_without_class(c, data, value_ctx("orders"))
    assert decoded == json_format.MessageToDict(order, preserving_proto_field_name=True)
    assert decoded["total"] == {"currency": "INR", "units": "1234"}
    assert decoded["created_at"] == "2024-05-06T07:08:09.123Z"
    assert decoded["note"] == ""  # presence kept
    assert schema_registry.unknown_requests == []


def test_protobuf_without_the_generated_class(schema_registry: SchemaRegistryServer) -> None:
    cls = order_class()
    order = an_order(cls)
    with SchemaRegistryClient({"url": schema_registry.url}) as c:
        data = ProtobufSerializer(cls, c, {"use.deprecated.format": False})(order, value_ctx("pb"))
    assert data is not None
    with SchemaRegistryClient({"url": schema_registry.url}) as c:
        # confluent-kafka's deserializer cannot do it: it needs the class up front ...
        with pytest.raises(AttributeError, match="DESCRIPTOR"):
            ProtobufDeserializer(None, {"use.deprecated.format": False}, c)  # type: ignore[arg-type]
        # ... but the writer schema from the registry is enough.
        decoded = decode_protobuf_without_class(c, data, value_ctx("pb"))
    assert decoded == json_format.MessageToDict(order, preserving_proto_field_name=True)
    assert decoded["lines"] == [{"sku": "A-1", "qty": 2}, {"sku": "B-2", "qty": 1}]
    assert decoded["status"] == "SHIPPED"
    assert schema_registry.unknown_requests == []


def test_protobuf_nested_message_index_without_a_class(schema_registry: SchemaRegistryServer) -> None:
    """A nested type is framed with its index path ([0, 0]: Order's first nested type, Line)."""
    line_cls = order_class().Line  # type: ignore[attr-defined]
    line = line_cls(sku="C-3", qty=5)
    with SchemaRegistryClient({"url": schema_registry.url}) as c:
        data = ProtobufSerializer(line_cls, c, {"use.deprecated.format": False})(line, value_ctx("lines"))
    assert data is not None
    assert data[5:8] == b"\x04\x00\x00"  # zigzag varints: 2 indexes (zigzag 4), 0, 0
    with SchemaRegistryClient({"url": schema_registry.url}) as c:
        assert decode_protobuf_without_class(c, data, value_ctx("lines")) == {"sku": "C-3", "qty": 5}
    assert schema_registry.unknown_requests == []


#: protoc-generated files installed here: their text form must parse back to the same descriptor.
_REAL_PROTO_MODULES = (
    "google.protobuf.struct_pb2",
    "google.protobuf.type_pb2",
    "google.protobuf.field_mask_pb2",
    "google.type.money_pb2",
    "google.type.postal_address_pb2",
    "opentelemetry.proto.common.v1.common_pb2",
    "opentelemetry.proto.resource.v1.resource_pb2",
    "opentelemetry.proto.metrics.v1.metrics_pb2",
    "opentelemetry.proto.trace.v1.trace_pb2",
)


def test_proto_text_of_real_protoc_descriptors_parses_back(schema_registry: SchemaRegistryServer) -> None:
    """Each file registered as base64 (as confluent-kafka sends it) is answered as .proto text by default; that text,
    registered again with the same references (as a Java producer would), is the same schema: same id."""
    import importlib

    files: dict[str, descriptor_pb2.FileDescriptorProto] = {}

    def collect(fd: Any) -> None:
        for dep in fd.dependencies:
            collect(dep)
        files.setdefault(fd.name, descriptor_pb2.FileDescriptorProto.FromString(fd.serialized_pb))

    for name in _REAL_PROTO_MODULES:
        try:
            collect(importlib.import_module(name).DESCRIPTOR)
        except ImportError:
            continue
    assert len(files) >= 5
    with SchemaRegistryClient({"url": schema_registry.url}) as c:
        for name, proto in files.items():
            refs = [SchemaReference(dep, dep, 1) for dep in proto.dependency]
            encoded = base64.b64encode(proto.SerializeToString()).decode()
            schema_id = c.register_schema(name, Schema(encoded, "PROTOBUF", refs))
            text = schema_registry.schema_by_id(schema_id)["schema"]
            assert text.startswith("syntax = "), name
            as_text = [{"name": dep, "subject": dep, "version": 1} for dep in proto.dependency]
            assert schema_registry.register(f"text:{name}", text, "PROTOBUF", as_text) == schema_id, name
            served = c.get_version(name, 1, fmt="serialized").schema.schema_str or ""
            assert descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(served)) == proto
    assert schema_registry.unknown_requests == []


def test_proto_without_a_text_form_is_served_as_base64(schema_registry: SchemaRegistryServer) -> None:
    """descriptor.proto has extension ranges, which this registry does not render: it answers base64 instead."""
    proto = descriptor_pb2.FileDescriptorProto.FromString(descriptor_pb2.DESCRIPTOR.serialized_pb)
    encoded = base64.b64encode(proto.SerializeToString()).decode()
    schema_id = schema_registry.register("google/protobuf/descriptor.proto", encoded, "PROTOBUF")
    assert schema_registry.schema_by_id(schema_id) == {"schema": encoded, "schemaType": "PROTOBUF"}
    with SchemaRegistryClient({"url": schema_registry.url}) as c, pytest.raises(SchemaRegistryError) as e:
        c.register_schema("bad", Schema('syntax = "proto3"; message M { Unknown u = 1; }', "PROTOBUF"))
    assert (e.value.http_status_code, e.value.error_code) == (422, 42201)
    assert "unknown type 'Unknown'" in e.value.error_message
    assert schema_registry.unknown_requests == []


# ====================================================================== JSON Schema

PERSON_JSON_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Person",
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "emails": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name"],
}


def test_json_schema_round_trip(schema_registry: SchemaRegistryServer) -> None:
    person = {"name": "Meera", "age": 31, "emails": ["m@example.com"]}
    with SchemaRegistryClient({"url": schema_registry.url}) as c:
        data = JSONSerializer(json.dumps(PERSON_JSON_SCHEMA), c)(person, value_ctx("people"))
    assert data is not None
    assert data[:5] == b"\x00\x00\x00\x00\x01"
    assert json.loads(data[5:]) == person
    assert schema_registry.latest("people-value")["schemaType"] == "JSON"
    with SchemaRegistryClient({"url": schema_registry.url}) as c:
        assert JSONDeserializer(None, schema_registry_client=c)(data, value_ctx("people")) == person
    # An invalid JSON Schema is refused with 42201.
    with SchemaRegistryClient({"url": schema_registry.url}) as c, pytest.raises(SchemaRegistryError) as e:
        c.register_schema("bad-value", Schema(json.dumps({"type": 12}), "JSON"))
    assert (e.value.http_status_code, e.value.error_code) == (422, 42201)
    assert schema_registry.unknown_requests == []


# ====================================================================== the REST API through the client


def test_subject_version_config_and_mode_endpoints(
    schema_registry: SchemaRegistryServer, client: SchemaRegistryClient
) -> None:
    v1 = Schema(json.dumps(ORDER_V1), "AVRO")
    v2 = Schema(json.dumps(ORDER_V2), "AVRO")
    assert client.register_schema("a-value", v1) == 1
    assert client.register_schema("a-value", v2) == 2
    assert client.register_schema("b-value", v1) == 1  # same schema, another subject: same id
    assert client.get_subjects() == ["a-value", "b-value"]
    assert client.get_versions("a-value") == [1, 2]
    assert client.lookup_schema("a-value", v2).version == 2
    with pytest.raises(SchemaRegistryError) as e:
        client.lookup_schema("b-value", v2)
    assert (e.value.http_status_code, e.value.error_code) == (404, 40403)
    assert client.get_version("a-value", 1).schema_id == 1
    assert [(sv.subject, sv.version) for sv in client.get_schema_versions(1)] == [("a-value", 1), ("b-value", 1)]
    assert client.get_subjects_by_schema_id(1) == ["a-value", "b-value"]
    assert client.get_schema_types() == ["AVRO", "JSON", "PROTOBUF"]
    assert client.test_compatibility("a-value", v2) is True
    assert client.test_compatibility_all_versions("a-value", v2) is True
    assert client.get_compatibility() == "BACKWARD"
    assert client.set_compatibility("a-value", "FULL") == {"compatibility": "FULL"}
    assert client.get_compatibility("a-value") == "FULL"
    with pytest.raises(SchemaRegistryError) as e:
        client.get_compatibility("b-value")  # no subject-level config, no defaultToGlobal
    assert e.value.error_code == 40408
    assert client.get_global_mode() == "READWRITE"
    assert client.update_mode("b-value", "READONLY") == "READONLY"
    with pytest.raises(SchemaRegistryError) as e:
        client.register_schema("b-value", v2)
    assert (e.value.http_status_code, e.value.error_code) == (422, 42205)
    assert client.delete_mode("b-value") == "READONLY"
    assert client.get_contexts() == ["."]

    assert client.delete_version("a-value", 2) == 2
    assert client.get_versions("a-value") == [1]
    assert client.get_versions("a-value", deleted=True) == [1, 2]
    assert client.delete_subject("b-value") == [1]
    assert client.get_subjects() == ["a-value"]
    assert client.get_subjects(deleted=True) == ["a-value", "b-value"]
    assert client.delete_subject("b-value", permanent=True) == [1]
    assert client.get_subjects(deleted=True) == ["a-value"]
    with pytest.raises(SchemaRegistryError) as e:
        client.get_latest_version("b-value")
    assert (e.value.http_status_code, e.value.error_code) == (404, 40401)
    with pytest.raises(SchemaRegistryError) as e:
        client.get_version("a-value", 9)
    assert (e.value.http_status_code, e.value.error_code) == (404, 40402)
    assert schema_registry.unknown_requests == []


def test_unknown_schema_id_is_40403(schema_registry: SchemaRegistryServer, client: SchemaRegistryClient) -> None:
    with pytest.raises(SchemaRegistryError) as e:
        client.get_schema(999)
    assert (e.value.http_status_code, e.value.error_code, e.value.error_message) == (404, 40403, "Schema 999 not found")
    # A message framed with an unknown id fails the same way inside the deserializer.
    with pytest.raises(SchemaRegistryError) as e:
        AvroDeserializer(client)(b"\x00\x00\x00\x03\xe7\x02", value_ctx("t"))
    assert e.value.error_code == 40403
    assert schema_registry.unknown_requests == []


def test_wire_shapes_for_other_clients(schema_registry: SchemaRegistryServer) -> None:
    """The exact JSON a Java client (RestService over HttpURLConnection) gets, including a chunked request body."""
    conn = http.client.HTTPConnection("127.0.0.1", schema_registry.port, timeout=10)
    headers = {
        "Content-Type": "application/vnd.schemaregistry.v1+json",
        "Accept": "application/vnd.schemaregistry.v1+json",
    }

    def call(method: str, path: str, body: Any = None, chunked: bool = False) -> tuple[int, Any, str]:
        payload = None if body is None else json.dumps(body).encode()
        if chunked and payload is not None:
            conn.request(method, path, body=iter([payload[:10], payload[10:]]), headers=headers, encode_chunked=True)
        else:
            conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read()), response.getheader("Content-Type") or ""

    schema = json.dumps({"type": "record", "name": "K", "fields": [{"name": "id", "type": "int"}]})
    compact = json.dumps(json.loads(schema), separators=(",", ":"))
    assert call("POST", "/subjects/dbz.public.k-key/versions", {"schema": schema}, chunked=True) == (
        200,
        {"id": 1},
        "application/vnd.schemaregistry.v1+json",
    )
    assert call("GET", "/schemas/ids/1?fetchMaxId=false&subject=dbz.public.k-key")[:2] == (200, {"schema": compact})
    assert call("GET", "/schemas/ids/1?fetchMaxId=true")[1] == {"schema": compact, "maxId": 1}
    assert call("POST", "/subjects/dbz.public.k-key?deleted=false", {"schema": schema})[:2] == (
        200,
        {"subject": "dbz.public.k-key", "version": 1, "id": 1, "schema": compact},
    )
    assert call("GET", "/subjects/dbz.public.k-key/versions/latest/schema")[1] == json.loads(schema)
    assert call("GET", "/schemas/ids/1/versions")[1] == [{"subject": "dbz.public.k-key", "version": 1}]
    assert call("GET", "/subjects/dbz.public.k-key/versions/0")[:2] == (
        422,
        {
            "error_code": 42202,
            "message": "The specified version '0' is not a valid version id. "
            'Allowed values are between [1, 2^31-1] and the string "latest"',
        },
    )
    assert call("POST", "/subjects/x/versions", {"schema": "{not json"})[1]["error_code"] == 42201
    assert call("GET", "/")[:2] == (200, {})
    assert call("GET", "/no/such/path")[:2] == (404, {"error_code": 404, "message": "HTTP 404 Not Found"})
    conn.close()
    assert [(r.method, r.path) for r in schema_registry.unknown_requests] == [("GET", "/no/such/path")]


# ====================================================================== faults


def test_basic_auth() -> None:
    with SchemaRegistryServer(user="krishiv", password="s3cret:pw") as server:
        with SchemaRegistryClient({"url": server.url, "basic.auth.user.info": "krishiv:s3cret:pw"}) as c:
            assert c.register_schema("a-value", Schema(json.dumps(ORDER_V1))) == 1
        for conf in ({"basic.auth.user.info": "krishiv:wrong"}, {}):
            with SchemaRegistryClient({"url": server.url, **conf}) as c, pytest.raises(SchemaRegistryError) as e:
                c.get_subjects()
            assert (e.value.http_status_code, e.value.error_code, e.value.error_message) == (401, 401, "Unauthorized")
        assert [r.status for r in server.requests] == [200, 401, 401]  # a 401 is not retried
        # Credentials in the URL work too.
        with SchemaRegistryClient({"url": server.url.replace("http://", "http://krishiv:s3cret%3Apw@")}) as c:
            assert c.get_subjects() == ["a-value"]
        assert server.unknown_requests == []


def test_bearer_token() -> None:
    with SchemaRegistryServer(token="t0ken") as server:
        conf = {
            "url": server.url,
            "bearer.auth.credentials.source": "STATIC_TOKEN",
            "bearer.auth.token": "t0ken",
            "bearer.auth.logical.cluster": "lsrc-test",
        }
        with SchemaRegistryClient(conf) as c:
            assert c.get_subjects() == []
        assert server.requests[-1].headers["target-sr-cluster"] == "lsrc-test"
        with SchemaRegistryClient({**conf, "bearer.auth.token": "other"}) as c, pytest.raises(SchemaRegistryError) as e:
            c.get_subjects()
        assert e.value.http_status_code == 401


def test_outage_is_a_connection_error_and_recovery_works(schema_registry: SchemaRegistryServer) -> None:
    with SchemaRegistryClient({"url": schema_registry.url, "max.retries": 2, **FAST}) as c:
        c.register_schema("a-value", Schema(json.dumps(ORDER_V1)))  # a pooled keep-alive connection now exists
        schema_registry.down()
        started = time.monotonic()
        with pytest.raises(sr_httpx.ConnectError) as e:
            c.get_subjects()
        assert time.monotonic() - started < 5
        assert type(e.value).__module__.startswith("httpx2")  # confluent-kafka 2.16 uses httpx2 when installed
        assert isinstance(e.value, sr_httpx.TransportError)
        assert not isinstance(e.value, SchemaRegistryError)
        assert len(schema_registry.requests) == 1  # nothing reached the server while it was down
        schema_registry.up()
        assert c.get_subjects() == ["a-value"]  # same port, same state
    assert schema_registry.unknown_requests == []


def test_a_request_in_flight_when_the_registry_goes_down(schema_registry: SchemaRegistryServer) -> None:
    import threading

    outcome: list[BaseException | list[str]] = []
    with SchemaRegistryClient({"url": schema_registry.url, "max.retries": 0, "timeout": 30}) as c:
        schema_registry.delay_next(1, 30.0)

        def ask() -> None:
            try:
                outcome.append(c.get_subjects())
            except BaseException as e:
                outcome.append(e)

        asking = threading.Thread(target=ask)
        asking.start()
        deadline = time.monotonic() + 10
        while schema_registry.faults_pending and time.monotonic() < deadline:
            threading.Event().wait(0.01)  # until the server holds the request
        assert schema_registry.faults_pending == 0
        schema_registry.down()
        asking.join(timeout=10)
        assert isinstance(outcome[0], sr_httpx.RemoteProtocolError)  # "Server disconnected without a response"
        assert isinstance(outcome[0], sr_httpx.TransportError)  # so the client would have retried it
        schema_registry.up()
        assert c.get_subjects() == []
    assert schema_registry.unknown_requests == []


def test_5xx_is_retried_by_the_client(schema_registry: SchemaRegistryServer) -> None:
    with SchemaRegistryClient({"url": schema_registry.url, "max.retries": 3, **FAST}) as c:
        schema_registry.fail_next(2, 500)
        assert c.get_subjects() == []
        assert [r.status for r in schema_registry.requests] == [500, 500, 200]

        schema_registry.clear_requests()
        schema_registry.fail_next(10, 503)
        with pytest.raises(SchemaRegistryError) as e:
            c.get_subjects()
        assert (e.value.http_status_code, e.value.error_code) == (503, 50301)
        assert len(schema_registry.requests) == 4  # 1 + max.retries, then the error is raised
        schema_registry.clear_faults()

        schema_registry.clear_requests()
        schema_registry.fail_next(1, 409)  # not retriable: raised at once
        with pytest.raises(SchemaRegistryError) as e:
            c.register_schema("a-value", Schema(json.dumps(ORDER_V1)))
        assert (e.value.http_status_code, e.value.error_code) == (409, 409)
        assert len(schema_registry.requests) == 1
    assert schema_registry.unknown_requests == []


def test_slow_registry_hits_the_client_timeout(schema_registry: SchemaRegistryServer) -> None:
    with SchemaRegistryClient({"url": schema_registry.url, "timeout": 0.3, "max.retries": 0}) as c:
        schema_registry.delay_next(1, 3.0)
        with pytest.raises(sr_httpx.ReadTimeout):
            c.get_subjects()
        assert c.get_subjects() == []


def test_the_client_cache_asks_once_per_id(schema_registry: SchemaRegistryServer) -> None:
    with SchemaRegistryClient({"url": schema_registry.url}) as c:
        serializer = AvroSerializer(c, json.dumps(ORDER_V1))
        first = serializer(ORDER, value_ctx("cached"))
        second = serializer({**ORDER, "id": 43}, value_ctx("cached"))
    assert first is not None and second is not None
    with SchemaRegistryClient({"url": schema_registry.url}) as c:
        deserializer = AvroDeserializer(c)
        assert deserializer(first, value_ctx("cached"))["id"] == 42
        assert deserializer(second, value_ctx("cached"))["id"] == 43
        assert AvroDeserializer(c)(first, value_ctx("cached"))["id"] == 42  # another deserializer, same client
    assert schema_registry.calls("POST") == [("POST", "/subjects/cached-value/versions")]
    assert schema_registry.calls("GET", "/schemas") == [("GET", "/schemas/ids/1")]
    assert schema_registry.unknown_requests == []


def test_wait_for_request(schema_registry: SchemaRegistryServer, client: SchemaRegistryClient) -> None:
    client.get_subjects()
    found = schema_registry.wait_for_request(lambda r: r.path == "/subjects", timeout_s=5)
    assert found.status == 200
    with pytest.raises(AssertionError, match="no matching request"):
        schema_registry.wait_for_request(lambda r: r.method == "DELETE", timeout_s=0.2)
