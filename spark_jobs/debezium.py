"""Debezium's change events: which row an event writes or deletes, and its columns in their own encodings.

A change event's value holds ``op`` (``c`` create, ``r`` snapshot read, ``u`` update, ``d`` delete), the row
``before`` and ``after`` it, and ``source`` (``lsn``, ``ts_ms`` …). ``c``/``r``/``u`` upsert ``after``; ``d``
deletes the key its ``before`` holds (or its Kafka key, with ``REPLICA IDENTITY`` not covering the key); the
tombstone that follows a delete is the upsert kind's own tombstone. An event is ordered by its source position,
``source.lsn`` (PostgreSQL's log sequence number) or ``source.ts_ms`` (``cdc_position = "ts_ms"``, for connectors
with no log position), under the upsert rule.

Debezium writes some column types in encodings of its own, named by the column's schema (``schema.name`` in the
JSON converter's embedded schema, ``connect.name`` in the Avro converter's); where the schema is not in the record
(JSON with ``schemas.enable = false``), by the field's declared type:

- ``numeric``/``decimal`` (``org.apache.kafka.connect.data.Decimal``): by ``decimal_handling`` (Debezium's
  ``decimal.handling.mode``): ``precise`` the base64 of the big-endian two's-complement unscaled integer, at the
  schema's scale (else the field's); ``string`` its digits; ``double`` a JSON number (a double already: exact only
  when the double is). ``io.debezium.data.VariableScaleDecimal``: ``{"scale", "value"}``;
- ``timestamp``: ``MicroTimestamp`` microseconds (PostgreSQL's ``timestamp`` under ``time.precision.mode =
  adaptive``, the default, and the reading of an integer without a schema), ``Timestamp`` milliseconds,
  ``NanoTimestamp`` nanoseconds; ``timestamptz``: ``ZonedTimestamp``, ISO-8601 text;
- ``date``: ``Date``, days since 1970-01-01;
- PostgreSQL arrays: a Connect ``array`` (a JSON array, an Avro array), each element in its element type's encoding
  (the schema's ``items``; else the declared element type's): a ``list`` field reads each element so;
- ``json``/``jsonb`` (``io.debezium.data.Json``): the value's JSON text, which a ``json`` field keeps as its
  canonical text (the value rule parses it);
- Connect ``bytes`` (``bytea``, or a column of a type Debezium has no converter for, such as a composite type, with
  ``include.unknown.datatypes``: PostgreSQL's text form of it): a ``string`` field takes its UTF-8 text (the JSON
  converter's base64 decoded first).

An update that leaves a large (TOASTed) text, json or array column unchanged carries Debezium's placeholder there
unless the table's ``REPLICA IDENTITY`` is ``FULL``: such an event is a reject naming the column and the fix.

A ``struct`` or ``map`` field's parts are decoded by their declared types (a Connect struct or map, e.g. ``hstore``
under ``hstore.handling.mode = map``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import msgspec

from krishiv_core.spec import FieldType
from krishiv_core.spec_types import LIST, MAP, STRUCT

#: A column's schema as the record names it: (name, parameters).
Hint = tuple[str, Mapping[str, Any]]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_DAY = date(1970, 1, 1)
_TIME_UNITS = {
    "io.debezium.time.Timestamp": 1_000,
    "org.apache.kafka.connect.data.Timestamp": 1_000,
    "io.debezium.time.MicroTimestamp": 1,
    "io.debezium.time.NanoTimestamp": 0.001,
}
_DATES = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
#: The hint of a Connect array whose elements have a hint of their own (``{"element": Hint}``), and of Connect bytes
#: with no logical name (the JSON converter writes them in base64).
_ARRAY = "array"
_BYTES = "bytes"
_ANY = msgspec.json.Decoder()
#: Debezium's ``unavailable.value.placeholder`` (its default): what an unchanged TOASTed column holds in an update
#: under ``REPLICA IDENTITY DEFAULT`` (a text or json column; an array column holds a list of it).
UNAVAILABLE = "__debezium_unavailable_value"


class Unreadable(Exception):
    """A change event that is not one Krishiv can apply: the message is the reject's reason."""


@dataclass
class Decoded:
    """A decoded key or value with the schema hints of its row's columns (empty when the record has none)."""

    payload: Any
    hints: dict[str, Hint] = field(default_factory=dict)


def _connect_hint(schema: Any) -> Hint | None:
    """The hint of one Connect schema (the JSON converter's): its logical name, an array's element's, bytes."""
    if not isinstance(schema, Mapping):
        return None
    if schema.get("name"):
        return str(schema["name"]), schema.get("parameters") or {}
    if schema.get("type") == "array":
        element = _connect_hint(schema.get("items"))
        return (_ARRAY, {"element": element}) if element is not None else None
    if schema.get("type") == "bytes":
        return _BYTES, {}
    return None


def _struct_hints(schema: Any) -> dict[str, Hint]:
    """Column hints of a Connect struct schema (the JSON converter's embedded ``schema``)."""
    hints: dict[str, Hint] = {}
    for f in schema.get("fields", []) if isinstance(schema, Mapping) else []:
        hint = _connect_hint(f)
        if hint is not None and isinstance(f, Mapping):
            hints[f.get("field", "")] = hint
    return hints


class _WithSchema(msgspec.Struct, forbid_unknown_fields=True):
    """A JSON converter's record with its schema (``schemas.enable = true``): the schema kept as its text."""

    schema: msgspec.Raw
    payload: Any


_WITH_SCHEMA = msgspec.json.Decoder(_WithSchema)
#: Column hints by the text of the schema they come from, for keys and for values: a topic's records repeat one
#: schema (a few, across its versions), which is then read once rather than with every record.
_HINTS: dict[tuple[bytes, str], dict[str, Hint]] = {}
_HINTS_KEPT = 256


def unwrap_json(data: bytes, what: str) -> Decoded:
    """A JSON key or value of the JSON converter, with (``schemas.enable = true``) or without its schema."""
    try:
        record = _WITH_SCHEMA.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        record = None  # no schema (or not JSON: read again below to say so)
    if record is not None:
        key = (bytes(record.schema), what)
        hints = _HINTS.get(key)
        if hints is None:
            if len(_HINTS) >= _HINTS_KEPT:
                _HINTS.clear()
            hints = _HINTS[key] = _schema_hints(_ANY.decode(key[0]), what)
        return Decoded(record.payload, hints)
    try:
        return Decoded(_ANY.decode(data))
    except (msgspec.DecodeError, UnicodeDecodeError):
        raise Unreadable(f"malformed JSON {what}") from None


def _schema_hints(schema: Any, what: str) -> dict[str, Hint]:
    """The column hints of a key's schema, or of a change event's envelope: the fields of its ``after`` (or
    ``before``) struct are the row's columns."""
    if what == "key":
        return _struct_hints(schema)
    hints: dict[str, Hint] = {}
    for f in schema.get("fields", []) if isinstance(schema, Mapping) else []:
        if isinstance(f, Mapping) and f.get("field") in ("before", "after"):
            hints |= _struct_hints(f)
    return hints


def avro_hints(schema_text: str) -> dict[str, Hint]:
    """Column hints of a Debezium envelope (or key) in Avro: each field's ``connect.name`` and parameters."""
    import json

    schema = json.loads(schema_text)
    hints: dict[str, Hint] = {}

    def hint(t: Any) -> Hint | None:
        for branch in t if isinstance(t, list) else [t]:
            if isinstance(branch, dict) and branch.get("connect.name"):
                params = branch.get("connect.parameters") or {}
                if branch.get("logicalType") == "decimal" and "scale" not in params:
                    params = {"scale": branch.get("scale", 0)}
                return branch["connect.name"], params
            if isinstance(branch, dict) and branch.get("type") == "array":
                element = hint(branch.get("items"))
                if element is not None:
                    return _ARRAY, {"element": element}
        return None

    def record(s: Any) -> None:
        for f in s.get("fields", []):
            found = hint(f.get("type"))
            if found is not None:
                hints[f["name"]] = found

    if isinstance(schema, dict):
        rows = [f for f in schema.get("fields", []) if f.get("name") in ("before", "after")]
        for f in rows:
            for branch in f["type"] if isinstance(f["type"], list) else [f["type"]]:
                if isinstance(branch, dict) and branch.get("type") == "record":
                    record(branch)
        if not rows:
            record(schema)
    return hints


def _unscaled(value: Any) -> int:
    raw = value if isinstance(value, bytes) else base64.b64decode(str(value), validate=True)
    return int.from_bytes(raw, "big", signed=True)


def _scaled(unscaled: int, scale: int) -> Decimal:
    """``unscaled`` × 10^-``scale``, exactly (``scaleb`` rounds to the context's 28 digits)."""
    return Decimal(f"{unscaled}E{-scale}")


def decode_column(value: Any, t: FieldType, hint: Hint | None, decimal_handling: str) -> Any:
    """One column's value out of Debezium's encoding, for the value rule to read as ``t`` (unchanged when it is
    not one of Debezium's: the rule names what it got)."""
    if value is None:
        return None
    name, params = hint or ("", {})
    if t.is_nested:
        return _decode_nested(value, t, params.get("element") if name == _ARRAY else None, decimal_handling)
    try:
        if t.name == "string" and (isinstance(value, bytes) or (name == _BYTES and isinstance(value, str))):
            raw = value if isinstance(value, bytes) else base64.b64decode(value, validate=True)
            return raw.decode("utf-8")
        if name == _VARIABLE_DECIMAL and isinstance(value, Mapping):
            return _scaled(_unscaled(value["value"]), int(value["scale"]))
        if t.is_decimal or name == _DECIMAL:
            if isinstance(value, Decimal | int | float) and not isinstance(value, bool):
                return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
            if isinstance(value, bytes) or (isinstance(value, str) and decimal_handling == "precise"):
                scale = int(params.get("scale", t.scale))
                return _scaled(_unscaled(value), scale)
            if isinstance(value, str):
                return Decimal(value)
        if name in _TIME_UNITS and isinstance(value, int):
            return _EPOCH + timedelta(microseconds=value * _TIME_UNITS[name])
        if name in _DATES and isinstance(value, int):
            return _EPOCH_DAY + timedelta(days=value)
        if not name and t.name == "timestamp" and isinstance(value, int) and not isinstance(value, bool):
            return _EPOCH + timedelta(microseconds=value)  # MicroTimestamp, adaptive precision's default
    except (binascii.Error, ValueError, ArithmeticError, OverflowError, KeyError, TypeError):
        return value  # not the encoding it should be in (UnicodeDecodeError is a ValueError): the rule names it
    return value


def _decode_nested(value: Any, t: FieldType, element_hint: Hint | None, decimal_handling: str) -> Any:
    """A list's elements (by the array's element hint), a struct's fields or a map's values, each out of Debezium's
    encoding; a value of another kind unchanged, for the rule to name."""
    if t.name == LIST and isinstance(value, list | tuple):
        assert t.element is not None
        element = t.element.type
        return [decode_column(v, element, element_hint, decimal_handling) for v in value]
    if t.name == STRUCT and isinstance(value, Mapping):
        return decode_columns(value, {f.name: f.type for f in t.fields}, {}, decimal_handling)
    if t.name == MAP and isinstance(value, Mapping):
        assert t.element is not None
        return {k: decode_column(v, t.element.type, None, decimal_handling) for k, v in value.items()}
    return value


def _unavailable(value: Any) -> bool:
    return value == UNAVAILABLE or (isinstance(value, list) and value == [UNAVAILABLE])


def decode_columns(
    row: Mapping[str, Any], types: Mapping[str, FieldType], hints: Mapping[str, Hint], decimal_handling: str
) -> dict[str, Any]:
    """The row's declared columns out of Debezium's encodings; the others as they are. A column holding Debezium's
    placeholder for a value it did not get makes the event :class:`Unreadable`: applied, it would replace the row's
    value with the placeholder."""
    decoded = {}
    for name, value in row.items():
        if name in types:
            if _unavailable(value):
                raise Unreadable(
                    f"column {name} holds Debezium's placeholder {UNAVAILABLE} (PostgreSQL did not send the "
                    "unchanged TOASTed value): ALTER TABLE ... REPLICA IDENTITY FULL makes it send it"
                )
            value = decode_column(value, types[name], hints.get(name), decimal_handling)
        decoded[name] = value
    return decoded


@dataclass
class ChangeEvent:
    op: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    #: The change-event columns: ``_cdc_op``, ``_cdc_lsn``, ``_cdc_ts``.
    cdc: dict[str, Any]

    @property
    def deletes(self) -> bool:
        return self.op == "d"


def transaction_of(block: Any) -> str | None:
    """The source transaction of Debezium's ``transaction`` block (``provide.transaction.metadata``): the part of its
    ``id`` before the first ``:``. PostgreSQL's connector writes the id as ``<xid>:<lsn>`` with each record's own
    LSN (DBZ-5329), so only the xid is the same for every event, and the BEGIN and END marks, of one transaction.
    None for an event outside one (a snapshot's read) or without the metadata."""
    if not isinstance(block, Mapping) or block.get("id") is None:
        return None
    return str(block["id"]).split(":", 1)[0]


def change_event(
    decoded: Decoded, types: Mapping[str, FieldType], decimal_handling: str, position: str | None
) -> ChangeEvent:
    """The change event of a decoded Debezium value, its rows' columns decoded; :class:`Unreadable` otherwise.
    ``position`` is the ordering column the pipeline keeps (``_cdc_lsn`` or ``_cdc_ts``): an event without it is
    unreadable, since the upsert rule could not order it."""
    doc = decoded.payload
    if not isinstance(doc, Mapping) or "op" not in doc:
        raise Unreadable("not a Debezium change event: no op (is the topic's envelope debezium?)")
    op = doc.get("op")
    if op not in ("c", "r", "u", "d"):
        raise Unreadable(f"Debezium op {op!r} is not applied (only c, r, u and d are)")
    source = doc.get("source") if isinstance(doc.get("source"), Mapping) else {}
    lsn = source.get("lsn")
    ts_ms = source.get("ts_ms")
    cdc = {
        "_cdc_op": op,
        "_cdc_lsn": lsn,
        "_cdc_ts": _EPOCH + timedelta(milliseconds=ts_ms) if isinstance(ts_ms, int) else ts_ms,
        "_cdc_tx": transaction_of(doc.get("transaction")),
    }
    if position is not None and cdc.get(position) is None:
        wanted = "source.lsn" if position == "_cdc_lsn" else "source.ts_ms"
        raise Unreadable(f"Debezium event without {wanted}, which orders a key's changes (cdc_position)")
    rows = []
    for name in ("before", "after"):
        row = doc.get(name)
        if row is not None and not isinstance(row, Mapping):
            raise Unreadable(f"Debezium {name} is not a row: {str(row)[:40]}")
        rows.append(None if row is None else decode_columns(row, types, decoded.hints, decimal_handling))
    before, after = rows
    if op != "d" and after is None:
        raise Unreadable(f"Debezium op {op} without an after row")
    return ChangeEvent(op, before, after, cdc)
