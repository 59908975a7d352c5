"""Debezium change events read into upsert rows, by Debezium's documented encodings (the end-to-end tests capture
a real PostgreSQL with Debezium's engine: ``tests/spark_jobs/test_cdc.py``)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest

from krishiv_core.spec_types import EventField, FieldType
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
