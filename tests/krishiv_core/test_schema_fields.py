"""Registry schemas to a pipeline's fields, nested (docs/formats.md: each format's mapping), and flattened where the
pipeline says ``flatten = true``. The expected types are written from the documented mapping."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema
from google.protobuf import descriptor_pb2

from krishiv_core.errors import ConfigError
from krishiv_core.protobuf_schemas import message_descriptor, protobuf_fields
from krishiv_core.schema_fields import avro_fields, json_schema_fields
from krishiv_core.spec_types import EventField


def _shown(fields: tuple[EventField, ...] | list[EventField]) -> list[tuple[str, str, bool]]:
    return [(f.name, str(f.type), f.required) for f in fields]


POINT = {"type": "record", "name": "Point", "namespace": "geo", "fields": [{"name": "lat", "type": "double"}]}
VAN = {
    "type": "record",
    "name": "Van",
    "namespace": "fleet",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "gps", "type": POINT},
        {"name": "last", "type": ["null", "geo.Point"], "default": None},  # a named type given by its full name
        {"name": "route", "type": {"type": "array", "items": "geo.Point"}},
        {"name": "tags", "type": {"type": "array", "items": ["null", "string"]}},
        {
            "name": "attrs",
            "type": {"type": "map", "values": {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 6}},
        },
        {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["ON", "OFF"]}},
        {"name": "again", "type": "State"},  # an enum given by its name in the record's namespace
        {"name": "mac", "type": {"type": "fixed", "name": "Mac", "size": 6}},
        {"name": "blob", "type": ["null", "bytes"]},
        {
            "name": "deep",
            "type": {
                "type": "map",
                "values": {
                    "type": "array",
                    "items": {"type": "record", "name": "D", "fields": [{"name": "n", "type": ["null", "long"]}]},
                },
            },
        },
    ],
}


def test_avro_records_arrays_maps_enums_fixed_and_bytes_become_nested_types() -> None:
    assert _shown(avro_fields(json.dumps(VAN), debezium=False)) == [
        ("id", "string", True),
        ("gps", "struct<lat: double>", True),
        ("last", "struct<lat: double>", False),
        ("route", "list<struct<lat: double>>", True),
        ("tags", "list<string?>", True),
        ("attrs", "map<string, decimal(20,6)>", True),
        ("state", "string", True),
        ("again", "string", True),
        ("mac", "binary", True),
        ("blob", "binary", False),
        ("deep", "map<string, list<struct<n: long?>>>", True),
    ]


def test_flatten_keeps_the_old_record_columns_and_nested_types_elsewhere() -> None:
    inner = {
        "type": "record",
        "name": "In",
        "fields": [{"name": "x", "type": "int"}, {"name": "y", "type": ["null", "string"]}],
    }
    outer = {"type": "record", "name": "Out", "fields": [{"name": "in", "type": inner}, {"name": "z", "type": "long"}]}
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "a", "type": outer},
            {"name": "b", "type": ["null", "Out"]},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
        ],
    }
    assert _shown(avro_fields(json.dumps(schema), debezium=False, flatten=True)) == [
        ("a_in_x", "int", True),
        ("a_in_y", "string", False),
        ("a_z", "long", True),
        ("b_in_x", "int", False),  # optional where its record is
        ("b_in_y", "string", False),
        ("b_z", "long", False),
        ("tags", "list<string>", True),
    ]


@pytest.mark.parametrize(
    ("t", "why"),
    [
        (["string", "long"], "is an Avro union of several types (string, long), which a table column cannot hold"),
        ({"type": "array", "items": ["null", "int", "string"]}, "x[]: is an Avro union of several types (int, string)"),
        ({"type": "int", "logicalType": "time-millis"}, None),
        ("Nope", "x: is an Avro type 'Nope' that the schema does not define"),
    ],
)
def test_an_avro_type_a_table_cannot_hold_is_refused_in_one_line(t: Any, why: str | None) -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "x", "type": t}]}
    if why is None:  # time-millis: its int is read as an int
        assert _shown(avro_fields(json.dumps(schema), debezium=False)) == [("x", "int", True)]
        return
    with pytest.raises(ConfigError) as refused:
        avro_fields(json.dumps(schema), debezium=False)
    assert why in str(refused.value) and "\n" not in str(refused.value)


def test_a_recursive_avro_record_is_refused() -> None:
    node = {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}
    with pytest.raises(ConfigError, match=r"next: is an Avro record Node that holds itself \(recursive\)"):
        avro_fields(json.dumps(node), debezium=False)


def test_json_schema_objects_arrays_maps_and_free_form_values() -> None:
    schema = {
        "type": "object",
        "required": ["id", "gps", "tags"],
        "$defs": {
            "point": {
                "type": "object",
                "required": ["lat"],
                "properties": {"lat": {"type": "number"}, "at": {"type": "string", "format": "date-time"}},
            }
        },
        "properties": {
            "id": {"type": "integer"},
            "gps": {"$ref": "#/$defs/point"},
            "tags": {"type": "array", "items": {"type": ["string", "null"]}},
            "route": {"type": "array", "items": {"$ref": "#/$defs/point"}},
            "attrs": {"type": "object", "additionalProperties": {"type": "number"}},
            "extra": {},
            "either": {"type": ["string", "integer"]},
            "loose": {"type": "object"},
            "free": {"type": "array"},
        },
    }
    assert _shown(json_schema_fields(json.dumps(schema))) == [
        ("id", "long", True),
        ("gps", "struct<lat: double, at: timestamp?>", True),
        ("tags", "list<string?>", True),
        ("route", "list<struct<lat: double, at: timestamp?>>", False),
        ("attrs", "map<string, double>", False),
        ("extra", "json", False),
        ("either", "json", False),
        ("loose", "json", False),
        ("free", "list<json?>", False),
    ]


PROTO = """
syntax = "proto3";
package fleet;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
message Van {
  message Point { double lat = 1; optional double lon = 2; }
  string id = 1;
  Point gps = 2;
  repeated Point route = 3;
  repeated string tags = 4;
  map<string, int64> counts = 5;
  map<int32, Point> by_hour = 6;
  oneof reading { double celsius = 7; string note = 8; }
  google.protobuf.Int32Value speed = 9;
  google.protobuf.Timestamp at = 10;
  bytes blob = 11;
  google.protobuf.Struct extra = 12;
}
"""


def _van_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """The descriptor protoc writes for ``PROTO`` (built by hand: no protoc here)."""
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="van.proto", package="fleet", syntax="proto3")
    proto.dependency.extend(
        ["google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto", "google/protobuf/struct.proto"]
    )
    van = proto.message_type.add(name="Van")
    point = van.nested_type.add(name="Point")
    point.field.add(name="lat", number=1, type=f.TYPE_DOUBLE, label=f.LABEL_OPTIONAL)
    point.field.add(
        name="lon", number=2, type=f.TYPE_DOUBLE, label=f.LABEL_OPTIONAL, proto3_optional=True, oneof_index=0
    )
    point.oneof_decl.add(name="_lon")
    for name, key, value, type_name in (
        ("CountsEntry", f.TYPE_STRING, f.TYPE_INT64, ""),
        ("ByHourEntry", f.TYPE_INT32, f.TYPE_MESSAGE, ".fleet.Van.Point"),
    ):
        entry = van.nested_type.add(name=name)
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=key, label=f.LABEL_OPTIONAL)
        entry.field.add(name="value", number=2, type=value, label=f.LABEL_OPTIONAL)
        if type_name:
            entry.field[1].type_name = type_name
    van.oneof_decl.add(name="reading")
    add = van.field.add
    add(name="id", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    add(name="gps", number=2, type=f.TYPE_MESSAGE, label=f.LABEL_OPTIONAL, type_name=".fleet.Van.Point")
    add(name="route", number=3, type=f.TYPE_MESSAGE, label=f.LABEL_REPEATED, type_name=".fleet.Van.Point")
    add(name="tags", number=4, type=f.TYPE_STRING, label=f.LABEL_REPEATED)
    add(name="counts", number=5, type=f.TYPE_MESSAGE, label=f.LABEL_REPEATED, type_name=".fleet.Van.CountsEntry")
    add(name="by_hour", number=6, type=f.TYPE_MESSAGE, label=f.LABEL_REPEATED, type_name=".fleet.Van.ByHourEntry")
    add(name="celsius", number=7, type=f.TYPE_DOUBLE, label=f.LABEL_OPTIONAL, oneof_index=0)
    add(name="note", number=8, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL, oneof_index=0)
    add(name="speed", number=9, type=f.TYPE_MESSAGE, label=f.LABEL_OPTIONAL, type_name=".google.protobuf.Int32Value")
    add(name="at", number=10, type=f.TYPE_MESSAGE, label=f.LABEL_OPTIONAL, type_name=".google.protobuf.Timestamp")
    add(name="blob", number=11, type=f.TYPE_BYTES, label=f.LABEL_OPTIONAL)
    add(name="extra", number=12, type=f.TYPE_MESSAGE, label=f.LABEL_OPTIONAL, type_name=".google.protobuf.Struct")
    return proto


def van_schema() -> Schema:
    return Schema(base64.b64encode(_van_descriptor().SerializeToString()).decode(), "PROTOBUF")


def test_protobuf_messages_repeated_maps_oneofs_wrappers_and_bytes_become_nested_types() -> None:
    fields = protobuf_fields(message_descriptor(None, van_schema(), 1, [0]))
    assert _shown(fields) == [
        ("id", "string", True),
        ("gps", "struct<lat: double, lon: double?>", False),
        ("route", "list<struct<lat: double, lon: double?>>", True),
        ("tags", "list<string>", True),
        ("counts", "map<string, long>", True),
        ("by_hour", "map<int, struct<lat: double, lon: double?>>", True),
        ("celsius", "double", False),
        ("note", "string", False),
        ("speed", "int", False),
        ("at", "timestamp", False),
        ("blob", "binary", True),
        ("extra", "json", False),
    ]
