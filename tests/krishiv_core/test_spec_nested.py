"""Nested field declarations and dotted paths in the spec (docs/spec.md, "Nested fields"): what loads, what it
means, and the one line each mistake gets."""

from __future__ import annotations

from typing import Any

import pytest

from krishiv_core.errors import ConfigError
from krishiv_core.spec import parse_spec
from krishiv_core.spec_types import field_paths
from krishiv_core.spec_values import parse_field_type
from krishiv_core.tables import event_table_schema, output_tables

FIELDS: dict[str, Any] = {
    "van": {"type": "struct", "fields": {"id": "string", "model": {"type": "string", "required": False}}},
    "gps": {
        "type": "struct",
        "required": False,
        "fields": {"lat": "double", "alt": {"type": "double", "required": False}},
    },
    "tags": {"type": "list", "element": {"type": "string", "required": False}},
    "sensors": {"type": "map", "key": "string", "value": "decimal(12,2)"},
    "meta": {"type": "struct", "fields": {"ts": "timestamp", "site": "string", "seq": "long"}},
    "extra": {"type": "json", "required": False},
}


def _pipeline(fields: dict[str, Any] = FIELDS, **keys: Any):
    raw = {"name": "p", "kind": "events", "topic": "t", "fields": fields, **keys}
    return parse_spec({"pipelines": [raw]}, env={}).pipelines[0]


def test_declarations_mean_what_the_docs_say_and_round_trip() -> None:
    p = _pipeline()
    shown = {f.name: f.shown_type for f in p.fields}
    assert shown == {
        "van": "struct<id: string, model: string?>",
        "gps": "struct<lat: double, alt: double?>?",
        "tags": "list<string?>",
        "sensors": "map<string, decimal(12,2)>",
        "meta": "struct<ts: timestamp, site: string, seq: long>",
        "extra": "json?",
    }
    assert [f.required for f in p.fields] == [True, False, True, True, True, False]
    for f in p.fields:
        assert parse_field_type(f.type.declaration(), f.name) == f.type
    paths = field_paths(p.fields)
    assert [k for k in paths if "." in k] == [
        "van.id",
        "van.model",
        "gps.lat",
        "gps.alt",
        "meta.ts",
        "meta.site",
        "meta.seq",
    ]
    assert paths["gps.lat"].required is False, "inside an optional struct a required field may be absent"
    assert paths["meta.ts"].required is True


def test_paths_name_fields_inside_structs_in_every_key() -> None:
    upsert = _pipeline(kind="upsert", key=["van.id"], version_field="meta.seq", partition_by=["day(meta.ts)"])
    (table, _rejects) = output_tables(upsert)
    schema = event_table_schema(upsert)
    assert [schema.find_column_name(i) for i in schema.identifier_field_ids] == ["van.id"]
    assert [f.name for f in table.partition_by] == ["meta.ts_day"]
    windowed = _pipeline(
        kind="windowed",
        event_time_field="meta.ts",
        group_by=["meta.site"],
        aggregations=[{"name": "n", "function": "count"}, {"name": "lat", "function": "max", "field": "gps.lat"}],
    )
    assert [f.name for f in output_tables(windowed)[0].schema.fields] == [
        "window_start",
        "window_end",
        "meta_site",
        "n",
        "lat",
    ]


@pytest.mark.parametrize(
    ("fields", "keys", "message"),
    [
        (
            {"gps": {"type": "strcut", "fields": {"a": "long"}}},
            {},
            "pipelines[0].fields.gps.type: expected 'struct' beside fields, got 'strcut'",
        ),
        ({"tags": {"type": "list"}}, {}, 'a list names its element\'s type: { type = "list", element = "type" }'),
        ({"m": {"type": "map", "key": "double", "value": "long"}}, {}, "a map's key is a string, a whole number"),
        ({"m": {"type": "map", "value": "long"}}, {}, "a map names its key's and its value's types"),
        ({"s": {"type": "struct", "fields": {}}}, {}, "pipelines[0].fields.s.fields: expected at least one field"),
        ({"s": "struct"}, {}, 'a struct is declared as a table: { type = "struct", fields = { name = "type", ... } }'),
        ({"s": {"type": "struct", "fields": {"a": "long"}, "items": 1}}, {}, "unknown keys ['items']"),
        (FIELDS, {"partition_by": ["day(tags.x)"]}, "'tags.x' in 'day(tags.x)' goes through tags, a list"),
        (FIELDS, {"kind": "upsert", "key": ["sensors.x"]}, "'sensors.x' goes through sensors, a map"),
        (
            FIELDS,
            {"kind": "upsert", "key": ["van"]},
            "a key field must be required (and so every struct it is in), one",
        ),
        (FIELDS, {"kind": "upsert", "key": ["gps.lat"]}, "gps.lat is optional"),
        (FIELDS, {"kind": "upsert", "key": ["van.nope"]}, "expected one of the event fields"),
        (
            FIELDS,
            {
                "kind": "windowed",
                "event_time_field": "meta.ts",
                "group_by": ["tags"],
                "aggregations": [{"name": "n", "function": "count"}],
            },
            "a group-by field must be required",
        ),
        (
            FIELDS,
            {
                "kind": "windowed",
                "event_time_field": "meta.ts",
                "aggregations": [{"name": "s", "function": "sum", "field": "van.id"}],
            },
            "sum needs a numeric field; van.id is string",
        ),
    ],
)
def test_each_mistake_is_one_line_naming_where_and_the_way_out(fields: dict, keys: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _pipeline(fields, **keys)
    assert message in str(err.value)
    assert "\n" not in str(err.value)
