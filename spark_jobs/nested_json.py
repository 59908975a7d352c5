"""The field rule at every depth of a JSON value: structs, lists, maps and ``json`` (docs/spec.md, "Nested fields").

:func:`read_part` is the rule: one present, non-null JSON token read as a field type, a nested type's parts read
recursively by the scalar rule (:func:`spark_jobs.record_decoder.read_token`), each problem named by the part's
path (``gps.lat``, ``tags[3]``, ``attrs["speed"]``). :func:`canonical_json` is a ``json`` field's text.

:func:`fast_type` and :func:`fast_converter` are the fast path's side of the same rule, as for flat fields:
msgspec's typed decoder takes a nested value whose every part is plainly valid, and a converter turns what it gave
into the values Arrow takes, raising :class:`NotPlain` for anything it cannot settle (a decimal that may not fit, a
time that is not ISO 8601, a map key to read), which sends the record to the rule. So a value's reading never
depends on the path that took it.

Values as Arrow takes them: a struct a ``dict``, a list a ``list``, a map a list of ``(key, value)`` pairs, a time a
``datetime`` in UTC, a decimal a ``Decimal``, ``json`` its canonical text, ``binary`` ``bytes``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any

import msgspec

from krishiv_core.spec_types import JSON_TEXT, LIST, MAP, STRUCT, EventField, FieldType
from spark_jobs.record_decoder import (
    EXACT,
    INTEGER_RANGES,
    SHOWN,
    Malformed,
    decimal_excess,
    iso_time,
    read_binary,
    read_token,
)

_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])
#: A map key's text that is a JSON number or boolean token (for a key of a number or boolean type).
_NUMBER_TOKEN = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?|true|false")
_STRING_KEYED = ("string", "timestamp", "date", "binary")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _Number(str):
    """A JSON number as it was written (a ``json`` field keeps it so, never through a double)."""


def canonical_json(token: bytes) -> str:
    """A JSON value's canonical text: no whitespace outside strings, object keys sorted by code point (a key given
    twice keeps the last), strings escaped only where JSON must, numbers as written."""
    try:
        value = json.loads(token, parse_float=_Number, parse_int=_Number)
    except (ValueError, UnicodeDecodeError):
        raise Malformed from None
    return _text(value)


def _text(value: Any) -> str:
    if isinstance(value, _Number):
        return str.__str__(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, list):
        return "[" + ",".join(_text(v) for v in value) + "]"
    return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _text(value[k]) for k in sorted(value)) + "}"


def key_path(path: str, key: str) -> str:
    """A map value's path: ``attrs["speed"]``."""
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


class Problems:
    """A record's problems, in the order the rule meets them: parts that do not fit, and required parts missing or
    null."""

    __slots__ = ("absent", "mistyped")

    def __init__(self) -> None:
        self.mistyped: list[str] = []
        self.absent: list[str] = []


def read_part(token: bytes, t: FieldType, path: str, problems: Problems) -> Any:
    """One present, non-null JSON token as ``t`` (its value; None when it does not fit, with the problem noted)."""
    if t.name == STRUCT:
        if token[:1] != b"{":
            problems.mistyped.append(f"{path} {_got(token, t)}")
            return None
        return read_fields(_object(token), t.fields, path + ".", problems)
    if t.name == LIST:
        assert t.element is not None
        if token[:1] != b"[":
            problems.mistyped.append(f"{path} {_got(token, t)}")
            return None
        try:
            items = _ARRAY.decode(token)
        except (msgspec.DecodeError, UnicodeDecodeError):
            raise Malformed from None
        return [_element(bytes(raw), t.element, f"{path}[{i}]", problems) for i, raw in enumerate(items)]
    if t.name == MAP:
        assert t.element is not None and t.key is not None
        if token[:1] != b"{":
            problems.mistyped.append(f"{path} {_got(token, t)}")
            return None
        pairs = []
        for key, raw in _object(token).items():
            where = key_path(path, key)
            read_key, why = map_key(key, t.key)
            if why is not None:
                problems.mistyped.append(f"{where} {why}")
            pairs.append((read_key, _element(bytes(raw), t.element, where, problems)))
        return pairs
    if t.name == JSON_TEXT:
        return canonical_json(token)
    value, why = read_token(token, t)
    if why is not None:
        problems.mistyped.append(f"{path} {why}")
    elif t.name == "timestamp_ms" and ("." in path or "[" in path):  # (a column of them is cast from epoch ms)
        return _EPOCH + timedelta(milliseconds=value)
    return value


def read_fields(
    doc: dict[str, Any],
    fields: tuple[EventField, ...],
    prefix: str,
    problems: Problems,
    required: AbstractSet[str] = frozenset(),
) -> dict[str, Any]:
    """A struct's (or a record's) fields from its object's raw tokens; ``required`` names fields required besides
    those that say so (a record's event time)."""
    values: dict[str, Any] = {}
    for f in fields:
        raw = doc.get(f.name)
        if raw is None or bytes(raw) == b"null":
            if f.required or f.name in required:
                problems.absent.append(f"{'missing' if raw is None else 'null'} field: {prefix}{f.name}")
            values[f.name] = None
            continue
        values[f.name] = read_part(bytes(raw), f.type, prefix + f.name, problems)
    return values


def _element(token: bytes, part: EventField, path: str, problems: Problems) -> Any:
    if token == b"null":
        if part.required:
            problems.absent.append(f"null field: {path}")
        return None
    return read_part(token, part.type, path, problems)


def _object(token: bytes) -> dict[str, Any]:
    try:
        return _OBJECT.decode(token)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        raise Malformed from None


def _got(token: bytes, t: FieldType) -> str:
    """``(type, got …)`` of a token of the wrong JSON kind for a nested type."""
    _, why = read_token(token, FieldType("boolean") if token[:1] not in (b"t", b"f") else FieldType("string"))
    assert why is not None
    return f"({t}, got {why.split(', got ', 1)[1]}"


def map_key(key: str, t: FieldType) -> tuple[Any, str | None]:
    """A map key's text as the key's type: a string type from the text, a number or a boolean from the JSON token
    the text is."""
    if t.name == "string":
        return key, None
    if t.name in _STRING_KEYED:
        value, why = read_token(json.dumps(key).encode(), t)
    elif _NUMBER_TOKEN.fullmatch(key):
        value, why = read_token(key.encode(), t)
    else:
        value, why = None, "not a JSON number or boolean"
    if why is None:
        return value, None
    detail = why.rsplit(": ", 1)[1].rstrip(")") if ": " in why else None
    got = f"(map key {t}, got {json.dumps(key, ensure_ascii=False)[:SHOWN]}"
    return None, got + (f": {detail})" if detail else ")")


# --- the fast path -----------------------------------------------------------------------------------------------


class NotPlain(Exception):
    """A nested value the fast path cannot settle: the record is read by the rule."""


def fast_type(t: FieldType) -> Any:
    """The msgspec type a plainly valid value of ``t`` decodes as (a required part without null, so a null there
    fails and the rule names it)."""
    if t.name == STRUCT:
        specs = []
        for i, f in enumerate(t.fields):
            inner = fast_type(f.type)
            if f.required:
                specs.append((f"f{i}", inner))
            else:  # (msgspec cannot join a raw token with None: an absent raw part is the token null)
                specs.append((f"f{i}", inner, msgspec.Raw(b"null")) if _raw(f.type) else (f"f{i}", inner | None, None))
        rename = {f"f{i}": f.name for i, f in enumerate(t.fields)}
        return msgspec.defstruct("Part", specs, kw_only=True, rename=rename, gc=False)
    if t.name in (LIST, MAP):
        assert t.element is not None
        inner = fast_type(t.element.type)
        inner = inner if t.element.required or _raw(t.element.type) else inner | None
        return list[inner] if t.name == LIST else dict[str, inner]
    if t.is_decimal or t.name == JSON_TEXT:
        return msgspec.Raw
    if t.name in INTEGER_RANGES:
        low, high = INTEGER_RANGES[t.name]
        return Annotated[int, msgspec.Meta(ge=low, le=high)]
    return {"string": str, "timestamp": str, "date": str, "binary": str, "double": float, "boolean": bool}[t.name]


def fast_converter(t: FieldType) -> Callable[[Any], Any]:
    """What turns :func:`fast_type`'s value of ``t`` (not None) into the value Arrow takes; :class:`NotPlain` when
    the rule must read it."""
    if t.name == STRUCT:
        parts = [(f"f{i}", f.name, _part(f)) for i, f in enumerate(t.fields)]

        def struct(value: Any) -> dict[str, Any]:
            return {name: convert(getattr(value, attr)) for attr, name, convert in parts}

        return struct
    if t.name == LIST:
        assert t.element is not None
        if _identity(t.element.type):
            return list
        element = _part(t.element)
        return lambda items: [element(v) for v in items]
    if t.name == MAP:
        assert t.element is not None and t.key is not None
        value_of = _part(t.element)
        if t.key.name != "string":
            key_type = t.key

            def key_of(key: str) -> Any:
                read, why = map_key(key, key_type)
                if why is not None:
                    raise NotPlain
                return read
        else:
            key_of = None  # type: ignore[assignment]
        plain_values = _identity(t.element.type)

        def mapping(value: dict[str, Any]) -> list[tuple[Any, Any]]:
            return [
                (
                    k if key_of is None else key_of(k),
                    v if plain_values else value_of(v),
                )
                for k, v in value.items()
            ]

        return mapping
    if t.is_decimal:
        return _fast_decimal(t)
    if t.name == JSON_TEXT:
        return lambda raw: canonical_json(bytes(raw))
    if t.name == "timestamp":
        return _fast_time
    if t.name == "date":
        return _fast_date
    if t.name == "timestamp_ms":
        return lambda ms: _EPOCH + timedelta(milliseconds=ms)
    if t.name == "binary":
        return _fast_binary
    return _same


def _part(part: EventField) -> Callable[[Any], Any]:
    """A struct field's, a list element's or a map value's converter, None where it is null (a required part
    decodes null only as a raw token: the rule names it)."""
    convert = fast_converter(part.type)
    if not _raw(part.type):
        return lambda v: None if v is None else convert(v)
    required = part.required

    def raw(v: Any) -> Any:
        if bytes(v) == b"null":
            if required:
                raise NotPlain
            return None
        return convert(v)

    return raw


def _raw(t: FieldType) -> bool:
    """A type the fast path decodes as its raw token (checked, or kept as written, by the converter)."""
    return t.is_decimal or t.name == JSON_TEXT


def _identity(t: FieldType) -> bool:
    return t.name in ("string", "long", "int", "double", "boolean")


def _same(value: Any) -> Any:
    return value


_PLAIN_DECIMAL = re.compile(rb'"?-?[0-9]+(\.[0-9]+)?"?')


def _fast_decimal(t: FieldType) -> Callable[[Any], Decimal]:
    quantum = Decimal(1).scaleb(-t.scale)

    def decimal_of(raw: Any) -> Decimal:
        token = bytes(raw)
        if not _PLAIN_DECIMAL.fullmatch(token) or (token[:1] == b'"') != (token[-1:] == b'"'):
            raise NotPlain
        digits = token.strip(b'"').decode()
        if decimal_excess(digits, t) is not None:
            raise NotPlain
        return Decimal(digits).quantize(quantum, context=EXACT)

    return decimal_of


def _fast_time(text: str) -> datetime:
    moment = iso_time(text)
    if moment is None:
        raise NotPlain
    return moment


def _fast_date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise NotPlain from None


def _fast_binary(text: str) -> bytes:
    data = read_binary(text)
    if data is None:
        raise NotPlain
    return data
