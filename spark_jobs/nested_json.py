"""The field rule at every depth of a JSON value: structs, lists, maps and ``json`` (docs/spec.md, "Nested fields").

:func:`read_part` is the rule: one present, non-null JSON token read as a field type, a nested type's parts read
recursively by the scalar rule (:func:`spark_jobs.record_decoder.read_token`), each problem named by the part's
path (``gps.lat``, ``tags[3]``, ``attrs["speed"]``). :func:`canonical_json` is a ``json`` field's text.

:func:`fast_type` and :func:`fast_column` are the fast path's side of the same rule, as for flat fields:
msgspec's typed decoder takes a nested value whose every part is plainly of its type, and the column is built from
what it gave a level at a time (decimals and times by the flat fast path's Arrow kernels), leaving to the rule
every record with a part it cannot settle (a decimal that may not fit, a time that is not ISO 8601, a map key that
is not its type, a required raw part null). So a value's reading never depends on the path that took it.

Values as Arrow takes them: a struct a ``dict``, a list a ``list``, a map a list of ``(key, value)`` pairs, a time a
``datetime`` in UTC, a decimal a ``Decimal``, ``json`` its canonical text, ``binary`` ``bytes``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from krishiv_core.spec_types import JSON_TEXT, LIST, MAP, STRUCT, EventField, FieldType
from spark_jobs.record_decoder import (
    INTEGER_RANGES,
    SHOWN,
    Malformed,
    arrow_type,
    fast_decimals,
    fast_times,
    read_binary,
    read_token,
    shown_token,
)
from spark_jobs.value_reading import canonical_json as json_text

_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])
#: A map key's text that is a JSON number or boolean token (for a key of a number or boolean type).
_NUMBER_TOKEN = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?|true|false")
_STRING_KEYED = ("string", "timestamp", "date", "binary")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def canonical_json(token: bytes) -> str:
    """A JSON value's canonical text (:func:`spark_jobs.value_reading.canonical_json`, the one writer of it: no
    whitespace outside strings, object keys sorted by code point with a key given twice keeping the last, strings
    escaped only where JSON must, numbers as written)."""
    try:
        text = json_text(token.decode())[0]
    except UnicodeDecodeError:
        raise Malformed from None
    if text is None:  # (msgspec has read the record as JSON already: only a broken string can get here)
        raise Malformed
    return text


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
    return f"({t}, got {shown_token(token)[1]})"


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


def fast_type(t: FieldType) -> Any:
    """The msgspec type a plainly valid value of ``t`` decodes as (a required part without null, so a null there
    fails and the rule names it)."""
    if t.name == STRUCT:
        specs = []
        for i, f in enumerate(t.fields):
            inner = fast_type(f.type)
            raw = f.type.is_decimal or f.type.name == JSON_TEXT
            if f.required:
                specs.append((f"f{i}", inner))
            else:  # (msgspec cannot join a raw token with None: an absent raw part is the token null)
                specs.append((f"f{i}", inner, msgspec.Raw(b"null")) if raw else (f"f{i}", inner | None, None))
        rename = {f"f{i}": f.name for i, f in enumerate(t.fields)}
        return msgspec.defstruct("Part", specs, kw_only=True, rename=rename, gc=False)
    if t.name in (LIST, MAP):
        assert t.element is not None
        inner = fast_type(t.element.type)
        raw = t.element.type.is_decimal or t.element.type.name == JSON_TEXT
        inner = inner if t.element.required or raw else inner | None
        return list[inner] if t.name == LIST else dict[str, inner]
    if t.is_decimal or t.name == JSON_TEXT:
        return msgspec.Raw
    if t.name in INTEGER_RANGES:
        low, high = INTEGER_RANGES[t.name]
        return Annotated[int, msgspec.Meta(ge=low, le=high)]
    return {"string": str, "timestamp": str, "date": str, "binary": str, "double": float, "boolean": bool}[t.name]


def _zero(t: FieldType) -> pa.Scalar:
    """A placeholder of a map key's type (a map's key cannot be null, even in a row the rule will read again)."""
    if t.name == "boolean":
        return pa.scalar(False)
    if t.name == "binary":
        return pa.scalar(b"")
    return pa.scalar(0, pa.int64()).cast(arrow_type(t))


def fast_column(values: list[Any], part: EventField, rows: np.ndarray | None = None) -> tuple[pa.Array, set[int]]:
    """The Arrow column of a part's values as :func:`fast_type` decoded them (None under a null parent), built a
    level at a time (a list's or a map's parts flattened, decimals and times read by Arrow's kernels), and the rows
    (of ``rows``: each value's record) the rule must read."""
    rows = np.arange(len(values)) if rows is None else rows
    t = part.type
    bad: set[int] = set()
    if t.name == STRUCT:
        children = []
        for i, f in enumerate(t.fields):
            attr = f"f{i}"
            child, more = fast_column([None if v is None else getattr(v, attr) for v in values], f, rows)
            children.append(child)
            bad |= more
        mask = pa.array([v is None for v in values], pa.bool_())
        return pa.StructArray.from_arrays(children, fields=list(arrow_type(t)), mask=mask), bad
    if t.name in (LIST, MAP):
        assert t.element is not None
        lengths = np.fromiter((0 if v is None else len(v) for v in values), dtype=np.int64, count=len(values))
        offsets = pa.array(
            np.concatenate([[0], np.cumsum(lengths)]),
            pa.int32(),
            mask=np.array([v is None for v in values] + [False], dtype=bool),
        )
        inner = np.repeat(rows, lengths)
        if t.name == LIST:
            child, bad = fast_column([x for v in values if v for x in v], t.element, inner)
            return pa.ListArray.from_arrays(offsets, child, type=arrow_type(t)), bad
        assert t.key is not None
        keys = [k for v in values if v for k in v]
        items, bad = fast_column([x for v in values if v for x in v.values()], t.element, inner)
        key_column = pa.array(keys, pa.string())
        if t.key.name != "string":  # a key that is not its type: its record goes to the rule, a placeholder here
            read = [map_key(k, t.key) for k in keys]
            bad |= {int(inner[i]) for i, (_, why) in enumerate(read) if why is not None}
            key_column = pc.fill_null(pa.array([value for value, _ in read], arrow_type(t.key)), _zero(t.key))
        return pa.MapArray.from_arrays(offsets, key_column, items, type=arrow_type(t)), bad
    if t.is_decimal or t.name == JSON_TEXT:  # raw tokens: None under a null parent, the token null a null
        nulls = [i for i, v in enumerate(values) if v is not None and bytes(v) == b"null"]
        if part.required:
            bad |= {int(rows[i]) for i in nulls}
        if t.is_decimal:
            column, misfits = fast_decimals([b"null" if v is None else bytes(v) for v in values], t, False)
            return column, bad | {int(rows[i]) for i in misfits}
        texts: list[str | None] = []
        for i, v in enumerate(values):
            try:
                texts.append(None if v is None or bytes(v) == b"null" else canonical_json(bytes(v)))
            except Malformed:
                texts.append(None)
                bad.add(int(rows[i]))
        return pa.array(texts, pa.string()), bad
    if t.name in ("timestamp", "date"):
        times, misfits = fast_times(values, dates=t.name == "date")
        return pa.array(times, arrow_type(t)), {int(rows[i]) for i in misfits}
    if t.name == "timestamp_ms":
        return pa.array(values, pa.int64()).cast(pa.timestamp("ms")).cast(pa.timestamp("us", tz="UTC")), bad
    if t.name == "binary":
        data = [None if v is None else read_binary(v) for v in values]
        bad = {int(rows[i]) for i, (v, d) in enumerate(zip(values, data, strict=True)) if v is not None and d is None}
        return pa.array(data, pa.binary()), bad
    return pa.array(values, arrow_type(t)), bad
