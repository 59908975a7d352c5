"""Debezium change events read into upsert rows, by Debezium's documented encodings (the end-to-end tests capture
a real PostgreSQL with Debezium's engine: ``tests/spark_jobs/test_cdc.py``)."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest

from krishiv_core.spec_types import EventField, FieldType
from spark_jobs.debezium import avro_hints
from spark_jobs.record_decoder import CDC_DELETE, TOMBSTONE, Decoding
from spark_jobs.registry_decoder import decoder_for

FIELDS = (
    EventField("id", FieldType("int")),
    EventField("name", FieldType("string"), False),
    EventField("amount", FieldType("decimal", 12, 2), False),
    EventField("updated_at", FieldType("timestamp"), False),
    EventField("born", FieldType("date"), False),
    EventField("_cdc_op", FieldType("string"), False),
    EventField("_cdc_lsn", FieldType("long"), False),
)


def _decoding(handling: str = "precise", position: str = "_cdc_lsn") -> Decoding:
    decoding = Decoding(
        FIELDS,
        frozenset({"id"}),
        tuple(f.name for f in FIELDS),
        ("id",),
        value_format="json",
        key_format="json",
        envelope="debezium",
        decimal_handling=handling,
        cdc_version=position,
    )
    return Decoding.from_option(decoding.to_option())


def _unscaled(value: int, length: int = 3) -> str:
    """Debezium's ``precise`` decimal: the base64 of the big-endian two's complement unscaled integer."""
    return base64.b64encode(value.to_bytes(length, "big", signed=True)).decode()


def _event(op: str, before: dict | None, after: dict | None, lsn: int | None = 100, **source: Any) -> bytes:
    doc = {"op": op, "before": before, "after": after, "source": {"lsn": lsn, "ts_ms": 1_700_000_000_000, **source}}
    return json.dumps(doc).encode()


def _with_schema(payload: bytes, columns: list[dict]) -> bytes:
    row = {"type": "struct", "fields": columns, "optional": True, "name": "server.public.t.Value"}
    schema = {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"}]}
    return json.dumps({"schema": schema, "payload": json.loads(payload)}).encode()


def _rows(values: list[bytes | None], keys: list[bytes | None], decoding: Decoding | None = None) -> list[dict]:
    decoding = decoding or _decoding()
    n = len(values)
    batch = decoder_for(decoding).decode(keys, values, "cdc", 0, list(range(n)), [0] * n)
    assert batch.schema == decoding.arrow_schema()
    return batch.to_pylist()


def _key(i: int, schema: bool = False) -> bytes:
    if schema:
        key_schema = {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}]}
        return json.dumps({"schema": key_schema, "payload": {"id": i}}).encode()
    return json.dumps({"id": i}).encode()


def test_create_update_delete_and_the_tombstone_become_upserts_deletes_and_a_tombstone() -> None:
    after = {"id": 1, "name": "a", "amount": _unscaled(-12345), "updated_at": 1_764_151_200_123_456, "born": 20_000}
    rows = _rows(
        [
            _event("r", None, after, lsn=90),
            _event("c", None, {**after, "id": 2}, lsn=100),
            _event("u", after, {**after, "name": "b"}, lsn=110),
            _event("d", {"id": 2, "name": None, "amount": None, "updated_at": None, "born": None}, None, lsn=120),
            None,
        ],
        [_key(1), _key(2), _key(1), _key(2), _key(2)],
    )
    assert [r["reason"] for r in rows] == [None] * 5
    assert [(r["id"], r["_cdc_op"], r["_cdc_lsn"], r[CDC_DELETE], r[TOMBSTONE]) for r in rows] == [
        (1, "r", 90, False, False),
        (2, "c", 100, False, False),
        (1, "u", 110, False, False),
        (2, "d", 120, True, False),
        (2, None, None, False, True),
    ]
    assert rows[2]["name"] == "b" and rows[0]["amount"] == Decimal("-123.45")
    assert rows[0]["updated_at"] == datetime(2025, 11, 26, 10, 0, 0, 123456, tzinfo=UTC)
    assert rows[0]["born"] == date(2024, 10, 4)


def test_with_the_embedded_schema_columns_are_read_by_their_debezium_types() -> None:
    columns = [
        {"type": "int32", "optional": False, "field": "id"},
        {
            "type": "bytes",
            "optional": True,
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "1"},
            "field": "amount",
        },
        {"type": "int64", "optional": True, "name": "io.debezium.time.Timestamp", "field": "updated_at"},
        {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "field": "born"},
    ]
    after = {"id": 3, "amount": _unscaled(12345), "updated_at": 1_764_151_200_123, "born": -1}
    rows = _rows([_with_schema(_event("c", None, after), columns)], [_key(3, schema=True)])
    assert rows[0]["reason"] is None
    # the schema's scale (1) wins over the field's (2): 1234.5 is stored as 1234.50
    assert rows[0]["amount"] == Decimal("1234.50")
    assert rows[0]["updated_at"] == datetime(2025, 11, 26, 10, 0, 0, 123000, tzinfo=UTC)
    assert rows[0]["born"] == date(1969, 12, 31)


def test_a_zoned_timestamp_and_the_string_and_double_decimal_modes() -> None:
    after = {"id": 4, "amount": "1234.50", "updated_at": "2026-11-26T10:00:00.5+05:30"}
    rows = _rows([_event("c", None, after)], [_key(4)], _decoding("string"))
    assert rows[0]["amount"] == Decimal("1234.50")
    assert rows[0]["updated_at"] == datetime(2026, 11, 26, 4, 30, 0, 500000, tzinfo=UTC)
    rows = _rows(
        [_event("c", None, {"id": 4, "amount": 0.1}), _event("c", None, {"id": 5, "amount": 0.125})],
        [_key(4), _key(5)],
        _decoding("double"),
    )
    assert rows[0]["amount"] == Decimal("0.10")
    assert (
        rows[1]["reason"]
        == "mistyped field: amount (decimal(12,2), got decimal 0.125: 3 decimal places, the scale is 2)"
    )


def test_a_delete_whose_before_lacks_the_key_takes_it_from_the_kafka_key() -> None:
    rows = _rows([_event("d", None, None)], [_key(7)])
    assert (rows[0]["reason"], rows[0]["id"], rows[0][CDC_DELETE]) == (None, 7, True)


@pytest.mark.parametrize(
    ("value", "key", "reason"),
    [
        (b"not json", _key(1), "malformed JSON value"),
        (
            json.dumps({"id": 1}).encode(),
            _key(1),
            "not a Debezium change event: no op (is the topic's envelope debezium?)",
        ),
        (_event("t", None, None), _key(1), "Debezium op 't' is not applied (only c, r, u and d are)"),
        (_event("c", None, None), _key(1), "Debezium op c without an after row"),
        (
            _event("c", None, {"id": 1}, lsn=None),
            _key(1),
            "Debezium event without source.lsn, which orders a key's changes (cdc_position)",
        ),
        (_event("c", None, {"id": "x"}), _key(1), "mistyped field: id (int, got string x)"),
        (_event("c", None, {"name": "n"}), _key(1), "missing field: id"),
        (
            _event("c", None, {"id": 1, "amount": "%%%"}),
            _key(1),
            "mistyped field: amount (decimal(12,2), got string %%%)",
        ),
        (_event("d", None, None), None, "no Kafka key: expected it to hold id"),
        (None, b"{", "malformed JSON key"),
    ],
)
def test_what_cannot_be_applied_is_a_reject_with_its_reason(
    value: bytes | None, key: bytes | None, reason: str
) -> None:
    assert _rows([value], [key])[0]["reason"] == reason


def test_ordering_by_source_ts_ms() -> None:
    fields = (*FIELDS[:-1], EventField("_cdc_ts", FieldType("timestamp"), False))
    decoding = Decoding(
        fields,
        frozenset({"id"}),
        tuple(f.name for f in fields),
        ("id",),
        "json",
        "json",
        "debezium",
        "precise",
        "_cdc_ts",
    )
    rows = _rows([_event("c", None, {"id": 1}, lsn=None)], [_key(1)], decoding)
    assert rows[0]["_cdc_ts"] == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)


# --- PostgreSQL arrays, json/jsonb and composite columns (issue 36) ------------------------------------------------
# The columns' schemas and values below are what Debezium 3.6's PostgreSQL connector emitted (JSON converter with
# schemas) for a row inserted as
#   INSERT INTO t VALUES (1, '{1,NULL,3}', '{1.5,NULL,-2.125}', '{1.5,NULL,123456789012345678901234567890.12}',
#     '{"b": 1.10, "a": [1, 2.50], "n": {"y": 1e3}}', '{"2024-01-02T03:04:05.123456Z"}', '{2024-01-02}', ROW(1.25, 'p'))
# into (id int, ints int[], nums numeric(10,3)[], anynums numeric[], jb jsonb, ts timestamptz[], dates date[],
# pt point2), point2 a composite type (x numeric(6,2), label text), with include.unknown.datatypes = true.


def _optional(t: FieldType) -> FieldType:
    return FieldType("list", element=EventField("element", t, False))


NESTED_FIELDS = (
    EventField("id", FieldType("int")),
    EventField("ints", _optional(FieldType("int")), False),
    EventField("nums", _optional(FieldType("decimal", 10, 3)), False),
    EventField("anynums", _optional(FieldType("decimal", 38, 2)), False),
    EventField("jb", FieldType("json"), False),
    EventField("ts", _optional(FieldType("timestamp")), False),
    EventField("dates", _optional(FieldType("date")), False),
    EventField("pt", FieldType("string"), False),
    EventField("_cdc_op", FieldType("string"), False),
    EventField("_cdc_lsn", FieldType("long"), False),
)
CAPTURED_COLUMNS = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "array", "items": {"type": "int32", "optional": True}, "optional": True, "field": "ints"},
    {
        "type": "array",
        "items": {
            "type": "bytes",
            "optional": True,
            "name": "org.apache.kafka.connect.data.Decimal",
            "version": 1,
            "parameters": {"scale": "3", "connect.decimal.precision": "10"},
        },
        "optional": True,
        "field": "nums",
    },
    {
        "type": "array",
        "items": {
            "type": "struct",
            "fields": [
                {"type": "int32", "optional": False, "field": "scale"},
                {"type": "bytes", "optional": False, "field": "value"},
            ],
            "optional": True,
            "name": "io.debezium.data.VariableScaleDecimal",
            "version": 1,
            "doc": "Variable scaled decimal",
        },
        "optional": True,
        "field": "anynums",
    },
    {"type": "string", "optional": True, "name": "io.debezium.data.Json", "version": 1, "field": "jb"},
    {
        "type": "array",
        "items": {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "version": 1},
        "optional": True,
        "field": "ts",
    },
    {
        "type": "array",
        "items": {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1},
        "optional": True,
        "field": "dates",
    },
    {"type": "bytes", "optional": True, "field": "pt"},
]
CAPTURED_ROW = {
    "id": 1,
    "ints": [1, None, 3],
    "nums": ["Bdw=", None, "97M="],
    "anynums": [{"scale": 1, "value": "Dw=="}, None, {"scale": 2, "value": "AJvTCjxkWUPdFpCgOhQ="}],
    "jb": '{"a": [1, 2.50], "b": 1.10, "n": {"y": 1000}}',
    "ts": ["2024-01-02T03:04:05.123456Z"],
    "dates": [19724],
    "pt": "KDEuMjUscCk=",
}
#: The row by the documented mapping, from the values the INSERT wrote (jsonb's own text of its value: keys as jsonb
#: orders them, 1e3 as the numeric 1000).
EXPECTED_ROW = {
    "id": 1,
    "ints": [1, None, 3],
    "nums": [Decimal("1.500"), None, Decimal("-2.125")],
    "anynums": [Decimal("1.50"), None, Decimal("123456789012345678901234567890.12")],
    "jb": '{"a":[1,2.50],"b":1.10,"n":{"y":1000}}',
    "ts": [datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)],
    "dates": [date(2024, 1, 2)],
    "pt": "(1.25,p)",
}


PLACEHOLDER = (
    "column {column} holds Debezium's placeholder __debezium_unavailable_value (PostgreSQL did not send the unchanged "
    "TOASTed value): ALTER TABLE ... REPLICA IDENTITY FULL makes it send it"
)


def _nested_decoding(handling: str = "precise") -> Decoding:
    names = tuple(f.name for f in NESTED_FIELDS)
    decoding = Decoding(
        NESTED_FIELDS, frozenset({"id"}), names, ("id",), "json", "json", "debezium", handling, "_cdc_lsn"
    )
    return Decoding.from_option(decoding.to_option())


def test_arrays_json_and_a_composite_column_with_the_embedded_schema() -> None:
    empty = {"id": 2, "ints": [], "nums": [], "anynums": None, "jb": '"s"', "ts": [], "dates": None, "pt": None}
    values = [
        _with_schema(_event("r", None, CAPTURED_ROW, lsn=90), CAPTURED_COLUMNS),
        _with_schema(_event("c", None, empty, lsn=91), CAPTURED_COLUMNS),
        _with_schema(_event("d", CAPTURED_ROW, None, lsn=92), CAPTURED_COLUMNS),
    ]
    rows = _rows(values, [_key(1, schema=True), _key(2, schema=True), _key(1, schema=True)], _nested_decoding())
    assert [r["reason"] for r in rows] == [None, None, None]
    assert {k: rows[0][k] for k in EXPECTED_ROW} == EXPECTED_ROW
    # an empty array is an empty list, not a null; a null column a null
    assert {k: rows[1][k] for k in EXPECTED_ROW} == {**empty, "jb": '"s"'}
    assert (rows[2]["id"], rows[2][CDC_DELETE]) == (1, True)


def test_arrays_without_the_schema_are_read_by_the_declared_element_types() -> None:
    """JSON with ``schemas.enable = false``: a ``precise`` decimal element at the declared scale, a date element's
    days, json's text; the composite's base64 cannot be told from text without the schema."""
    row = {k: v for k, v in CAPTURED_ROW.items() if k not in ("anynums", "pt")}
    rows = _rows([_event("c", None, row)], [_key(1)], _nested_decoding())
    assert rows[0]["reason"] is None
    assert {k: rows[0][k] for k in row} == {k: EXPECTED_ROW[k] for k in row}
    text = {**row, "nums": ["1.500", None, "-2.125"]}
    rows = _rows([_event("c", None, text)], [_key(1)], _nested_decoding("string"))
    assert rows[0]["nums"] == EXPECTED_ROW["nums"]


@pytest.mark.parametrize(
    ("column", "value", "reason"),
    [
        (
            "ints",
            [1, "x", 2**31],
            "mistyped field: ints[1] (int, got string x), ints[2] (int, got integer 2147483648: out of range)",
        ),
        (
            "nums",
            ["1.2345", "x"],
            "mistyped field: nums[0] (decimal(10,3), got decimal 1.2345: 4 decimal places, the scale is 3), "
            "nums[1] (decimal(10,3), got string x)",
        ),
        ("ints", {"a": 1}, "mistyped field: ints (list<int?>, got a record)"),
        ("jb", "{not json", "mistyped field: jb (json, got string {not json: not JSON text)"),
        (
            "jb",
            "__debezium_unavailable_value",
            PLACEHOLDER.format(column="jb"),
        ),
        (
            "ints",
            ["__debezium_unavailable_value"],
            PLACEHOLDER.format(column="ints"),
        ),
    ],
)
def test_a_nested_value_that_does_not_fit_is_a_reject_naming_its_path(column: str, value: Any, reason: str) -> None:
    rows = _rows([_event("u", None, {"id": 1, column: value})], [_key(1)], _nested_decoding("string"))
    assert rows[0]["reason"] == reason


def test_avro_hints_reach_array_elements() -> None:
    """The Avro converter's schema of an array column (as registered by Debezium's capture)."""
    decimal = {
        "type": "bytes",
        "scale": 3,
        "precision": 10,
        "connect.version": 1,
        "connect.parameters": {"scale": "3", "connect.decimal.precision": "10"},
        "connect.name": "org.apache.kafka.connect.data.Decimal",
        "logicalType": "decimal",
    }
    json_text = {"type": "string", "connect.version": 1, "connect.name": "io.debezium.data.Json"}
    row = {
        "type": "record",
        "name": "Value",
        "fields": [
            {"name": "id", "type": "int"},
            {"name": "ints", "type": ["null", {"type": "array", "items": ["null", "int"]}], "default": None},
            {"name": "nums", "type": ["null", {"type": "array", "items": ["null", decimal]}], "default": None},
            {"name": "jb", "type": ["null", json_text], "default": None},
        ],
    }
    envelope = {"type": "record", "name": "Envelope", "fields": [{"name": "before", "type": ["null", row]}]}
    hints = avro_hints(json.dumps(envelope))
    assert hints == {
        "nums": ("array", {"element": ("org.apache.kafka.connect.data.Decimal", decimal["connect.parameters"])}),
        "jb": ("io.debezium.data.Json", {}),
    }


def test_fields_from_a_debezium_avro_schema_are_lists_and_json() -> None:
    """The fields of Debezium's Avro envelope for (id int, ints int[], nums numeric(10,3)[], jb jsonb, anynums
    numeric[]), its schema as the Avro converter registered it: arrays are lists of optional elements, jsonb json; a
    numeric without precision and scale is refused in one line."""
    from krishiv_core.errors import ConfigError
    from krishiv_core.schema_fields import avro_fields

    decimal = {
        "type": "bytes",
        "scale": 3,
        "precision": 10,
        "connect.version": 1,
        "connect.parameters": {"scale": "3", "connect.decimal.precision": "10"},
        "connect.name": "org.apache.kafka.connect.data.Decimal",
        "logicalType": "decimal",
    }
    columns = [
        {"name": "id", "type": "int"},
        {"name": "ints", "type": ["null", {"type": "array", "items": ["null", "int"]}], "default": None},
        {"name": "nums", "type": ["null", {"type": "array", "items": ["null", decimal]}], "default": None},
        {
            "name": "jb",
            "type": ["null", {"type": "string", "connect.version": 1, "connect.name": "io.debezium.data.Json"}],
            "default": None,
        },
    ]

    def envelope(columns: list[dict]) -> str:
        row = {"type": "record", "name": "Value", "namespace": "krishiv.public.t", "fields": columns}
        fields = [{"name": "before", "type": ["null", row], "default": None}]
        fields.append({"name": "after", "type": ["null", "Value"], "default": None})
        return json.dumps({"type": "record", "name": "Envelope", "namespace": "krishiv.public.t", "fields": fields})

    assert avro_fields(envelope(columns), debezium=True) == (
        EventField("id", FieldType("int")),
        EventField("ints", _optional(FieldType("int")), False),
        EventField("nums", _optional(FieldType("decimal", 10, 3)), False),
        EventField("jb", FieldType("json"), False),
    )
    variable = {
        "type": "record",
        "name": "VariableScaleDecimal",
        "namespace": "io.debezium.data",
        "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
        "connect.name": "io.debezium.data.VariableScaleDecimal",
    }
    anynums = {"name": "anynums", "type": ["null", {"type": "array", "items": ["null", variable]}], "default": None}
    with pytest.raises(ConfigError, match=r"^anynums: is an unbounded numeric \(Debezium's VariableScaleDecimal"):
        avro_fields(envelope([*columns, anynums]), debezium=True)


def test_each_event_keeps_its_source_transaction_a_reject_too() -> None:
    """``_cdc_tx``: the xid of the event's ``transaction`` block (``<xid>:<lsn>`` on PostgreSQL), null outside one;
    a reject keeps it, since the transaction's END counts it (``spark_jobs.transaction_gate``)."""
    fields = (*FIELDS, EventField("_cdc_tx", FieldType("string"), False))
    decoding = replace(_decoding(), fields=fields, output=tuple(f.name for f in fields))

    def within(event: bytes, transaction: dict | None) -> bytes:
        return json.dumps({**json.loads(event), "transaction": transaction}).encode()

    block = {"id": "571:24023128", "total_order": 1, "data_collection_order": 1}
    values = [
        within(_event("c", None, {"id": 1, "name": "a"}), block),
        within(_event("r", None, {"id": 2, "name": "b"}), None),  # a snapshot's read
        within(_event("u", None, {"id": 3, "name": "__debezium_unavailable_value"}), block),
    ]
    rows = _rows(values, [_key(1), _key(2), _key(3)], decoding)
    assert [(r["_cdc_tx"], r["reason"] is None) for r in rows] == [("571", True), (None, True), ("571", False)]
