"""Records in the Schema Registry formats, decoded in the source's tasks (confluent-kafka's ``mock://`` client; the
end-to-end tests run the real HTTP path against ``tests.services.schema_registry``)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from hypothesis import given, settings
from hypothesis import strategies as st

from krishiv_core.schema_fields import avro_fields, json_schema_fields
from krishiv_core.spec_types import EventField, FieldType
from spark_jobs.errors import NewWriterSchema
from spark_jobs.record_decoder import Decoding
from spark_jobs.registry_decoder import decoder_for, registry_client

TOPIC = "orders"
ORDER = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 6}},
        {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {
            "name": "shipping",
            "type": {"type": "record", "name": "Ship", "fields": [{"name": "city", "type": "string"}]},
        },
        {"name": "quantity", "type": ["null", "int"], "default": None},
    ],
}


def _registry() -> dict[str, str]:
    return {"url": f"mock://{uuid.uuid4().hex}"}


def _decoding(fields: tuple[EventField, ...], registry: dict[str, str], **kw: Any) -> Decoding:
    required = frozenset(f.name for f in fields if f.required)
    decoding = Decoding(fields, required, tuple(f.name for f in fields), registry=registry, **kw)
    return Decoding.from_option(decoding.to_option())  # as the source's tasks receive it


def _decode(decoding: Decoding, values: list[bytes | None], keys: list[bytes | None] | None = None) -> list[dict]:
    n = len(values)
    batch = decoder_for(decoding).decode(keys or [None] * n, values, TOPIC, 0, list(range(n)), [0] * n)
    assert batch.schema == decoding.arrow_schema()  # every nested part nullable, as Spark's view of the source
    return batch.to_pylist()


def _avro(registry: dict[str, str], schema: dict, record: dict) -> bytes:
    serializer = AvroSerializer(registry_client(registry), json.dumps(schema))
    return serializer(record, SerializationContext(TOPIC, MessageField.VALUE))


def _order(**changes: Any) -> dict[str, Any]:
    return {
        "order_id": "o-1",
        "amount": Decimal("12345678901234567890123456789012.123456"),
        "placed_at": datetime(2026, 11, 26, 10, 0, 0, 123456, tzinfo=UTC),
        "day": date(2026, 11, 26),
        "ref": str(uuid.UUID(int=7)),
        "shipping": {"city": "Pune"},
        "quantity": 3,
    } | changes


def test_fields_from_an_avro_schema_follow_the_documented_mapping() -> None:
    fields = avro_fields(json.dumps(ORDER), debezium=False)
    expected = [
        ("order_id", "string", True),
        ("amount", "decimal(38,6)", True),
        ("placed_at", "timestamp", True),
        ("day", "date", True),
        ("ref", "string", True),
        ("shipping", "struct<city: string>", True),
        ("quantity", "int", False),
    ]
    assert [(f.name, str(f.type), f.required) for f in fields] == expected
    flat = avro_fields(json.dumps(ORDER), debezium=False, flatten=True)
    expected[5] = ("shipping_city", "string", True)
    assert [(f.name, str(f.type), f.required) for f in flat] == expected


@pytest.mark.parametrize("flatten", [False, True])
def test_an_avro_record_is_read_exactly_and_every_broken_record_is_a_reject_with_its_reason(flatten: bool) -> None:
    registry = _registry()
    fields = avro_fields(json.dumps(ORDER), debezium=False, flatten=flatten)
    good = _avro(registry, ORDER, _order())
    rows = _decode(
        _decoding(fields, registry, value_format="avro"),
        [good, b'{"order_id": "o-1"}', good[:9], b"\x00\x00\x00\x01\xf4" + good[5:], b"\x00\x00", b"\x00" + good[1:5]],
    )
    assert rows[0]["reason"] is None and rows[0]["value"] is None
    assert (rows[0]["order_id"], rows[0]["ref"]) == ("o-1", str(uuid.UUID(int=7)))
    assert rows[0]["amount"] == Decimal("12345678901234567890123456789012.123456")
    assert rows[0]["placed_at"] == datetime(2026, 11, 26, 10, 0, 0, 123456, tzinfo=UTC)
    shipping = rows[0]["shipping_city"] if flatten else rows[0]["shipping"]["city"]
    assert (rows[0]["day"], shipping, rows[0]["quantity"]) == (date(2026, 11, 26), "Pune", 3)
    assert [r["reason"] for r in rows[1:]] == [
        "not in the Confluent wire format: magic byte 0x7b, expected 0",
        "undecodable avro payload (schema id 1): it ends before the record does (truncated)",
        f"schema id 500 is not in the Schema Registry at {registry['url']}",
        "not in the Confluent wire format: 2 bytes, expected a magic byte 0, a 4-byte schema id and the avro payload",
        "not in the Confluent wire format: 5 bytes, expected a magic byte 0, a 4-byte schema id and the avro payload",
    ]
    assert all(r["value"] is not None for r in rows[1:]), "a reject keeps its raw value"


def test_a_spec_type_the_avro_value_does_not_fit_is_a_mistyped_field() -> None:
    registry = _registry()
    fields = (
        EventField("order_id", FieldType("long")),
        EventField("amount", FieldType("decimal", 10, 2)),
        EventField("quantity", FieldType("int"), required=False),
    )
    rows = _decode(_decoding(fields, registry, value_format="avro"), [_avro(registry, ORDER, _order())])
    assert rows[0]["reason"] == (
        "mistyped field: order_id (long, got string o-1), amount (decimal(10,2), got decimal "
        "12345678901234567890123456789012.123456: 6 decimal places, the scale is 2)"
    )


def test_a_newer_compatible_schema_is_read_by_the_reader_schema_and_an_incompatible_one_is_a_reject() -> None:
    registry = _registry()
    v1 = {"type": "record", "name": "Order", "fields": ORDER["fields"][:2]}
    v2 = {**v1, "fields": [*v1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}
    incompatible = {"type": "record", "name": "Order", "fields": [{"name": "order_id", "type": "long"}]}
    decoding = _decoding(
        avro_fields(json.dumps(v1), False), registry, value_format="avro", reader_schema=json.dumps(v1)
    )
    values = [
        _avro(registry, v1, _order()),
        _avro(registry, v2, _order(note="gift")),
        _avro(registry, incompatible, {"order_id": 5}),
    ]
    rows = _decode(decoding, values)
    assert [r["order_id"] for r in rows[:2]] == ["o-1", "o-1"] and "note" not in rows[1]
    assert rows[2]["reason"] == "undecodable avro payload (schema id 3): Schema mismatch: long is not string"


def test_a_later_schema_with_a_field_the_fields_lack_stops_the_batch_and_nothing_else_does() -> None:
    """With fields taken from schema id 2: a record of a later id with a field they lack (or one a table cannot
    hold) raises NewWriterSchema, so its value is never read away; a later id with fewer fields, an earlier id with
    more (a field the subject's versions since removed), and any id when the spec lists the fields, read as before."""
    registry = _registry()
    quantity = ORDER["fields"][-1]
    v1 = {"type": "record", "name": "Order", "fields": [*ORDER["fields"][:2], quantity]}
    older = {**v1, "fields": [*v1["fields"], {"name": "legacy", "type": ["null", "string"], "default": None}]}
    fewer = {**v1, "fields": v1["fields"][:2]}
    v2 = {**v1, "fields": [*v1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}
    tags = {**v1, "fields": [*v1["fields"], {"name": "tags", "type": ["string", "long"]}]}
    values = {
        "older": _avro(registry, older, _order(legacy="x")),  # id 1
        "v1": _avro(registry, v1, _order()),  # id 2: the fields' schema
        "fewer": _avro(registry, fewer, _order()),  # id 3
        "v2": _avro(registry, v2, _order(note="gift")),  # id 4
        "tags": _avro(registry, tags, _order(tags="a")),  # id 5
    }
    assert [int.from_bytes(v[1:5], "big") for v in values.values()] == [1, 2, 3, 4, 5]

    def decoding(fields_schema_id: int | None) -> Decoding:
        fields = avro_fields(json.dumps(v1), False)
        return _decoding(
            fields, registry, value_format="avro", reader_schema=json.dumps(v1), fields_schema_id=fields_schema_id
        )

    rows = _decode(decoding(2), [values["older"], values["v1"], values["fewer"]])
    read = [(r["reason"], r["order_id"], r["quantity"]) for r in rows]
    assert read == [(None, "o-1", 3), (None, "o-1", 3), (None, "o-1", None)]
    with pytest.raises(NewWriterSchema, match=r"records of schema id 4 have fields the query does not read \(note\)"):
        _decode(decoding(2), [values["v1"], values["v2"]])
    with pytest.raises(
        NewWriterSchema, match=r"schema id 5 have a field Krishiv's tables do not hold \(tags: is an Avro"
    ):
        _decode(decoding(2), [values["tags"]])
    rows = _decode(decoding(None), [values["v2"], values["tags"]])
    assert [(r["reason"], r["order_id"]) for r in rows] == [(None, "o-1"), (None, "o-1")]


JSON_ORDER = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "amount": {"type": ["string", "number"]},
        "placed_at": {"type": "string", "format": "date-time"},
    },
    "required": ["order_id", "amount"],
}


def test_json_schema_values_are_validated_by_their_schema_and_read_by_the_json_rule() -> None:
    registry = _registry()
    serializer = JSONSerializer(json.dumps(JSON_ORDER), registry_client(registry))
    ctx = SerializationContext(TOPIC, MessageField.VALUE)
    good = serializer({"order_id": "o-1", "amount": "0.1000000000000000000000000000000000001"}, ctx)
    fields = (
        EventField("order_id", FieldType("string")),
        EventField("amount", FieldType("decimal", 38, 37)),
        EventField("placed_at", FieldType("timestamp"), required=False),
    )
    missing = good[:5] + b'{"amount": 1}'
    rows = _decode(_decoding(fields, registry, value_format="json_schema"), [good, missing])
    assert rows[0]["reason"] is None and rows[0]["amount"] == Decimal("0.1000000000000000000000000000000000001")
    assert rows[1]["reason"].startswith("undecodable json_schema payload (schema id 1): ")
    assert "order_id" in rows[1]["reason"]


def test_fields_from_a_json_schema() -> None:
    properties = {k: v for k, v in JSON_ORDER["properties"].items() if k != "amount"}
    properties |= {
        "n": {"type": "integer"},
        "ok": {"type": ["boolean", "null"]},
        "day": {"type": "string", "format": "date"},
    }
    fields = json_schema_fields(json.dumps({**JSON_ORDER, "properties": properties}))
    assert [(f.name, str(f.type), f.required) for f in fields] == [
        ("order_id", "string", True),
        ("placed_at", "timestamp", False),
        ("n", "long", False),
        ("ok", "boolean", False),
        ("day", "date", False),
    ]


@settings(max_examples=60, deadline=None)
@given(
    digits=st.integers(min_value=-(10**38) + 1, max_value=10**38 - 1),
    scale=st.integers(min_value=0, max_value=38),
    spec_scale=st.integers(min_value=0, max_value=12),
)
def test_an_avro_decimal_is_stored_exactly_or_refused_by_the_rule(digits: int, scale: int, spec_scale: int) -> None:
    """The oracle: the value's exact digits fit decimal(38, s) iff, trailing zeros dropped, at most s fraction
    digits and 38 - s integer digits remain."""
    value = Decimal(digits).scaleb(-scale)
    _sign, ds, exponent = value.normalize().as_tuple() if value else (0, (), 0)
    fraction = max(0, -int(exponent))
    whole = max(0, len(ds) + int(exponent))
    fits = fraction <= spec_scale and whole <= 38 - spec_scale
    schema = {
        "type": "record",
        "name": "D",
        "fields": [{"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": scale}}],
    }
    registry = _registry()
    rows = _decode(
        _decoding((EventField("d", FieldType("decimal", 38, spec_scale)),), registry, value_format="avro"),
        [_avro(registry, schema, {"d": value})],
    )
    if fits:
        assert rows[0]["reason"] is None and rows[0]["d"] == value
    else:
        assert rows[0]["reason"].startswith(f"mistyped field: d (decimal(38,{spec_scale}), got decimal ")


def test_an_upsert_tombstone_with_an_avro_key_is_read_through_the_registry() -> None:
    registry = _registry()
    key_schema = {"type": "record", "name": "Key", "fields": [{"name": "order_id", "type": "string"}]}
    serializer = AvroSerializer(registry_client(registry), json.dumps(key_schema))
    key = serializer({"order_id": "o-9"}, SerializationContext(TOPIC, MessageField.KEY))
    fields = (EventField("order_id", FieldType("string")), EventField("n", FieldType("long"), False))
    decoding = _decoding(fields, registry, value_format="avro", key_format="avro")
    decoding = Decoding(**{**decoding.__dict__, "tombstone_key": ("order_id",)})
    rows = _decode(decoding, [None, None], keys=[key, b"\x07"])
    assert (rows[0]["reason"], rows[0]["order_id"], rows[0]["__tombstone"]) == (None, "o-9", True)
    assert rows[1]["reason"].startswith("not in the Confluent wire format: 1 bytes")


def test_a_failure_of_krishivs_own_is_never_a_reject_the_batch_fails_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what the deserializer raises for an unreadable payload makes a reject; a missing module or a bug must
    fail the batch (which is read again), not turn every record into a reject."""
    from spark_jobs import registry_decoder

    def broken(data: bytes, *args: Any) -> Any:
        raise AttributeError("a bug")

    registry = _registry()
    fields = avro_fields(json.dumps(ORDER), debezium=False)
    good = _avro(registry, ORDER, _order())
    monkeypatch.setattr(registry_decoder, "avro_reader", lambda *args: broken)
    with pytest.raises(AttributeError, match="a bug"):
        decoder_for(_decoding(fields, registry, value_format="avro")).decode([None], [good], TOPIC, 0, [0], [0])
    json_schema = _decoding((EventField("order_id", FieldType("string")),), registry, value_format="json_schema")
    decoder = decoder_for(json_schema)
    decoder.values._deserialize = broken  # the deserializer's own path
    with pytest.raises(AttributeError, match="a bug"):
        decoder.decode([None], [good], TOPIC, 0, [0], [0])


def test_canary_the_avro_fast_reader_reads_as_confluent_kafkas_deserializer_does() -> None:
    """``avro_reader`` uses ``AvroDeserializer``'s ``_get_parsed_schema`` and ``_reader_schema``: if a release of
    confluent-kafka changes them, this fails before any record is read otherwise."""
    from confluent_kafka.schema_registry.avro import AvroDeserializer

    from spark_jobs.registry_decoder import avro_reader

    registry = _registry()
    client = registry_client(registry)
    value = _avro(registry, ORDER, _order())
    ctx = SerializationContext(TOPIC, MessageField.VALUE)
    v1 = {"type": "record", "name": "Order", "fields": ORDER["fields"][:2]}
    for deserializer in (AvroDeserializer(client), AvroDeserializer(client, schema_str=json.dumps(v1))):
        writer = client.get_schema(int.from_bytes(value[1:5], "big"))
        assert avro_reader(deserializer, writer)(value[5:]) == deserializer(value, ctx)


LOOSE = {
    "type": "record",
    "name": "Loose",
    "fields": [
        {"name": "n", "type": "long"},
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 4}},
        {"name": "s", "type": ["null", "string"], "default": None},
        {"name": "t", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}], "default": None},
    ],
}
_LOOSE_RECORDS = st.lists(
    st.fixed_dictionaries(
        {
            "n": st.sampled_from([0, 1, -(2**31), 2**31 - 1, 2**31, -(2**31) - 1, 2**62]),
            "d": st.sampled_from([Decimal("0"), Decimal("1.5000"), Decimal("1.2345"), Decimal("12345678.9")]),
            "s": st.sampled_from([None, "", "x"]),
            "t": st.sampled_from([None, datetime(2026, 1, 1, tzinfo=UTC)]),
        }
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=40, deadline=None)
@given(records=_LOOSE_RECORDS)
def test_the_fast_path_reads_every_avro_record_as_the_rule_does(records: list[dict[str, Any]]) -> None:
    """A batch (the fast path: Arrow columns where values plainly fit) against each record read alone by the rule
    (``read_slow``): the same rows, values and reasons, whatever else the batch holds."""
    registry = _registry()
    fields = (
        EventField("n", FieldType("int")),
        EventField("d", FieldType("decimal", 9, 2)),
        EventField("s", FieldType("string")),
        EventField("t", FieldType("timestamp"), required=False),
    )
    decoder = decoder_for(_decoding(fields, registry, value_format="avro"))
    values = [_avro(registry, LOOSE, r) for r in records]
    batch = decoder.decode([None] * len(values), values, TOPIC, 0, list(range(len(values))), [0] * len(values))
    for row, value in zip(batch.to_pylist(), values, strict=True):
        alone = decoder.read_slow(None, value, TOPIC)
        assert row["reason"] == alone.reason
        if alone.reason is None:
            assert {f.name: row[f.name] for f in fields} == {f.name: alone.values.get(f.name) for f in fields}
