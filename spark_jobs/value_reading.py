"""The field rule for values a deserializer already decoded (Avro, Protobuf, JSON Schema, Debezium's encodings).

The same rule as JSON's (docs/spec.md, "Field types"), stated for the values confluent-kafka's deserializers give: a
value that fits its field's type is stored exactly, any other makes the record a reject naming field, type and
what it got. By type:

- ``string``: a string (an Avro ``uuid`` too); ``boolean``: a boolean; ``double``: any number but a boolean;
- ``long``, ``int``: an integer in the type's range (a boolean is not one);
- ``decimal(p,s)``: a decimal or an integer that fits exactly (at most ``s`` fraction digits once trailing zeros
  are dropped, at most ``p - s`` integer digits): an Avro ``decimal`` of another scale is rescaled when that loses
  nothing;
- ``timestamp``, ``timestamp_ms``: a time (Avro ``timestamp-millis``/``-micros``; without a zone it is UTC), an
  ISO-8601 string, or for ``timestamp_ms`` an integer of epoch milliseconds;
- ``date``: a date, an ISO-8601 date string, or an integer of days since 1970-01-01 (Avro ``date``);
- ``binary``: bytes, or a string of their base64 (as JSON carries bytes);
- ``json``: any JSON value (a dict with string keys, a list or tuple, a string, an integer, a finite float, a decimal,
  a boolean, None inside), or a string holding JSON text, kept as its canonical text (docs/spec.md, "Nested fields");
- ``struct``: a mapping (a decoded record or message), its fields read from its keys as a record's are; ``list``: a
  list or tuple, in order; ``map``: a mapping, each key read by the key's type (from its text when it is a string),
  each value by the value's type.

Nested parts are named by their path (``gps.lat``, ``tags[3]``, ``attrs["speed"]``): :func:`read_value` gives the
value and every :class:`Problem` in it, :func:`read_row` a record's :class:`Reading` with the rule's reason.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from krishiv_core.spec_types import JSON_TEXT, LIST, MAP, STRUCT, EventField, FieldType
from spark_jobs.record_decoder import EXACT, INTEGER_RANGES, SHOWN, Reading, decimal_excess, iso_time, read_binary

_EPOCH_DAY = date(1970, 1, 1)
#: ``date`` as days since the epoch: 0001-01-01 to 9999-12-31.
DATE_DAYS = ((date(1, 1, 1) - _EPOCH_DAY).days, (date(9999, 12, 31) - _EPOCH_DAY).days)
BINARY = "binary"
MISTYPED, MISSING, NULL = "mistyped", "missing", "null"
_INTEGER_TEXT = re.compile(r"-?[0-9]+")
_PLAIN_TEXT = re.compile(r"-?[0-9]+(\.[0-9]+)?")
_EXPONENT_TEXT = re.compile(r"-?[0-9]+(\.[0-9]+)?[eE][+-]?[0-9]+")
_NUMBER_TEXT = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")


@dataclass(frozen=True)
class Problem:
    """Why one part of a record does not fit: ``kind`` is ``mistyped`` (``why`` then says ``(type, got …)``),
    ``missing`` or ``null`` (a required part); ``path`` names the part (``gps.lat``, ``tags[3]``, ``attrs["k"]``)."""

    kind: str
    path: str
    why: str = ""

    def __str__(self) -> str:
        return f"{self.path} {self.why}" if self.kind == MISTYPED else f"{self.kind} field: {self.path}"


def reason(problems: Sequence[Problem]) -> str | None:
    """A record's reason from its problems (in the spec's order): every mistyped part, else the first required part
    that is missing or null, else None."""
    mistyped = [str(p) for p in problems if p.kind == MISTYPED]
    if mistyped:
        return "mistyped field: " + ", ".join(mistyped)
    return str(problems[0]) if problems else None


def read_row(row: Mapping[str, Any], fields: Sequence[EventField], required: Collection[str]) -> Reading:
    """The fields of a decoded record (a mapping) by the rule: ``required`` names the fields (or dotted paths) that
    must be present and not null besides those declared required inside structs; a top-level field's own
    ``required`` is not used, the pipeline's ``required`` decides it (the event time is required too)."""
    problems: list[Problem] = []
    values = _read_fields(row, fields, "", problems, required, top=True)
    why = reason(problems)
    return Reading(why, {} if why else values)


def read_value(value: Any, t: FieldType, path: str = "", required: Collection[str] = ()) -> tuple[Any, list[Problem]]:
    """(the value as ``t``, []) or (anything, the problems) for one non-null decoded value at ``path``;
    ``required``: dotted paths required besides what the type declares (a nested event time)."""
    problems: list[Problem] = []
    read = _read(value, t, path, problems, required)
    return read, problems


def _read_fields(
    row: Mapping[str, Any],
    fields: Sequence[EventField],
    prefix: str,
    problems: list[Problem],
    required: Collection[str],
    top: bool = False,
) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for f in fields:
        path = prefix + f.name
        raw = row.get(f.name)
        if raw is None:
            values[f.name] = None
            if path in required or (f.required and not top):
                problems.append(Problem(MISSING if f.name not in row else NULL, path))
            continue
        values[f.name] = _read(raw, f.type, path, problems, required)
    return values


def _shown(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a record" if value else "an empty record"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)}"
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", Decimal: "decimal"}.get(type(value))
    if kind is None:
        kind = type(value).__name__
    text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return f"{kind} {text[:SHOWN]}"


def _mistyped(problems: list[Problem], path: str, t: Any, value: Any, why: str | None = None) -> None:
    problems.append(Problem(MISTYPED, path, f"({t}, got {_shown(value)}" + (f": {why})" if why else ")")))


def _read(value: Any, t: FieldType, path: str, problems: list[Problem], required: Collection[str]) -> Any:
    name = t.name
    if name == STRUCT:
        if isinstance(value, Mapping):
            return _read_fields(value, t.fields, path + ".", problems, required)
        _mistyped(problems, path, t, value)
        return None
    if name == LIST:
        assert t.element is not None
        if not isinstance(value, list | tuple):
            _mistyped(problems, path, t, value)
            return None
        return [_part(v, t.element, f"{path}[{i}]", problems, required) for i, v in enumerate(value)]
    if name == MAP:
        return _read_map(value, t, path, problems, required)
    if name == JSON_TEXT:
        text, why = canonical_json(value)
        if why is not None:
            _mistyped(problems, path, t, value, why)
        return text
    read, why = _scalar(value, t)
    if why is not None:
        _mistyped(problems, path, t, value, why)
    return read


def _part(value: Any, part: EventField, path: str, problems: list[Problem], required: Collection[str]) -> Any:
    """A list's element or a map's value (null only where it is optional)."""
    if value is None:
        if part.required:
            problems.append(Problem(NULL, path))
        return None
    return _read(value, part.type, path, problems, required)


def _read_map(value: Any, t: FieldType, path: str, problems: list[Problem], required: Collection[str]) -> Any:
    assert t.element is not None and t.key is not None
    if not isinstance(value, Mapping):
        _mistyped(problems, path, t, value)
        return None
    entries: dict[Any, Any] = {}
    for raw_key, raw_value in value.items():
        shown_key = raw_key if isinstance(raw_key, str) else str(raw_key)
        here = f"{path}[{json.dumps(shown_key, ensure_ascii=False)}]"
        key, why = _map_key(raw_key, t.key)
        if why is not None:
            got = json.dumps(raw_key, ensure_ascii=False)[:SHOWN] if isinstance(raw_key, str) else _shown(raw_key)
            problems.append(Problem(MISTYPED, here, f"(map key {t.key}, got {got}" + (f": {why})" if why else ")")))
            continue
        entries.pop(key, None)  # a key given twice counts once, the last (and in its place)
        entries[key] = _part(raw_value, t.element, here, problems, required)
    return list(entries.items())


def _map_key(key: Any, t: FieldType) -> tuple[Any, str | None]:
    """A map's key as the key's type, or (None, why): a string key of another type is read from its text as the JSON
    token (or ISO-8601 string) the text would be."""
    if isinstance(key, str):
        if t.name in INTEGER_RANGES and _INTEGER_TEXT.fullmatch(key):
            key = int(key)
        elif t.is_decimal:
            if not _PLAIN_TEXT.fullmatch(key):
                return None, "not a number" if not _EXPONENT_TEXT.fullmatch(key) else "exponent notation"
            key = Decimal(key)
        elif t.name == "double" and _NUMBER_TEXT.fullmatch(key):
            key = float(key)
        elif t.name == "boolean":
            key = {"true": True, "false": False}.get(key, key)
    read, why = _scalar(key, t)
    return (read, None) if why is None else (None, why)


def canonical_json(value: Any) -> tuple[str | None, str | None]:
    """(the canonical JSON text of ``value``, None) or (None, why it is not a JSON value). A string is JSON text and
    is parsed (exactly: numbers kept as written); any other value is a decoded JSON value."""
    try:
        if isinstance(value, str):
            value = json.loads(
                value, object_pairs_hook=dict, parse_float=_Number, parse_int=_Number, parse_constant=_no_constant
            )
        text = "".join(_canonical(value))
        text.encode("utf-8")
    except (ValueError, UnicodeError) as exc:
        return None, "not JSON text" if isinstance(exc, json.JSONDecodeError) else str(exc)[:SHOWN]
    return text, None


class _Number(str):
    """A number in JSON text, kept as written."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _canonical(value: Any) -> Any:
    if value is None:
        yield "null"
    elif isinstance(value, bool):
        yield "true" if value else "false"
    elif isinstance(value, _Number):
        yield str.__str__(value)
    elif isinstance(value, str):
        yield json.dumps(value, ensure_ascii=False)
    elif isinstance(value, int):
        yield str(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a JSON number")
        yield repr(value)
    elif isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{value} is not a JSON number")
        yield format(value, "f")
    elif isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise ValueError(f"a key {str(key)[:SHOWN]} that is not a string")
        yield "{"
        for i, key in enumerate(sorted(value)):
            yield ("," if i else "") + json.dumps(key, ensure_ascii=False) + ":"
            yield from _canonical(value[key])
        yield "}"
    elif isinstance(value, list | tuple):
        yield "["
        for i, item in enumerate(value):
            if i:
                yield ","
            yield from _canonical(item)
        yield "]"
    else:
        raise ValueError(f"a {type(value).__name__}, not a JSON value")


def _scalar(value: Any, t: FieldType) -> tuple[Any, str | None]:
    """(the value as scalar ``t``, None) or (None, why: \"\" when the kind alone is wrong)."""
    why = ""
    name = t.name
    if isinstance(value, uuid.UUID):
        value = str(value)
    if name == "string" and isinstance(value, str):
        return value, None
    if name == "boolean" and isinstance(value, bool):
        return value, None
    is_integer = isinstance(value, int) and not isinstance(value, bool)
    if name == BINARY:
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value), None
        if isinstance(value, str):
            data = read_binary(value)
            if data is not None:
                return data, None
            why = "not base64"
    elif name in ("long", "int") and is_integer:
        low, high = INTEGER_RANGES[name]
        if low <= value <= high:
            return value, None
        why = "out of range"
    elif name == "double" and (is_integer or isinstance(value, float)):
        return float(value), None
    elif t.is_decimal and (is_integer or isinstance(value, Decimal)):
        digits = str(value) if is_integer else format(value, "f")  # (format(int, "f") goes through a float)
        if isinstance(value, Decimal) and not value.is_finite():
            why = "not a number"
        else:
            why = decimal_excess(digits, t)
            if why is None:
                return Decimal(digits).quantize(Decimal(1).scaleb(-t.scale), context=EXACT), None
    elif name in ("timestamp", "timestamp_ms"):
        if isinstance(value, datetime):
            return (value if value.tzinfo else value.replace(tzinfo=UTC)), None
        if isinstance(value, str):
            moment = iso_time(value)
            if moment is not None:
                return moment, None
            why = "not an ISO-8601 time"
        elif name == "timestamp_ms" and is_integer:
            low, high = INTEGER_RANGES[name]
            if low <= value <= high:
                return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=value), None
            why = "out of range"
    elif name == "date":
        if isinstance(value, date) and not isinstance(value, datetime):
            return value, None
        if isinstance(value, str):
            try:
                return date.fromisoformat(value), None
            except ValueError:
                why = "not an ISO-8601 date"
        elif is_integer:
            if DATE_DAYS[0] <= value <= DATE_DAYS[1]:
                return _EPOCH_DAY + timedelta(days=value), None
            why = "out of range"
    return None, why
