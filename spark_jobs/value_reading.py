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
- ``date``: a date, an ISO-8601 date string, or an integer of days since 1970-01-01 (Avro ``date``).
"""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from krishiv_core.spec import FieldType
from spark_jobs.record_decoder import EXACT, INTEGER_RANGES, SHOWN, decimal_excess, iso_time

_EPOCH_DAY = date(1970, 1, 1)
#: ``date`` as days since the epoch: 0001-01-01 to 9999-12-31.
DATE_DAYS = ((date(1, 1, 1) - _EPOCH_DAY).days, (date(9999, 12, 31) - _EPOCH_DAY).days)


def _shown(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", Decimal: "decimal"}.get(type(value))
    if kind is None:
        kind = type(value).__name__
    text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return f"{kind} {text[:SHOWN]}"


def read_value(value: Any, t: FieldType) -> tuple[Any, str | None]:
    """(the value as ``t``, None) or (None, ``(type, got …[: why])``) for one non-null decoded value."""
    why: str | None = None
    name = t.name
    if isinstance(value, uuid.UUID):
        value = str(value)
    if name == "string" and isinstance(value, str):
        return value, None
    if name == "boolean" and isinstance(value, bool):
        return value, None
    is_integer = isinstance(value, int) and not isinstance(value, bool)
    if name in ("long", "int") and is_integer:
        low, high = INTEGER_RANGES[name]
        if low <= value <= high:
            return value, None
        why = "out of range"
    elif name == "double" and (is_integer or isinstance(value, float)):
        return float(value), None
    elif t.is_decimal and (is_integer or isinstance(value, Decimal)):
        digits = format(value, "f")
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
    return None, f"({t}, got {_shown(value)}" + (f": {why})" if why else ")")
