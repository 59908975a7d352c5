"""The type ``krishiv init`` gives a sampled field: the one that reads most of its values, the others named.

Each candidate type is judged by the field rule itself (``read_token``, docs/spec.md "Field types"): a candidate
reads a sampled value when the rule would store it. The field gets the candidate that reads the most of its non-null
sampled values, provided that is more than half of them; of candidates that read as many, the narrower, in the order
of ``_ORDER``. So a wider number type takes in a narrower one's values (a decimal reads integers as well as
fractions), a ``string`` that reads every value keeps a field of strings (a name among times is no reason for a
reject: the comment says which type most values are and what declaring it would reject), and one ``"N/A"`` among
numbers no longer leaves the field out: it stays a number, and the values its type does not read are named in the
comment beside it, since their records will be rejects. The candidates:

- ``boolean``, ``long`` and ``string``; ``date`` for ISO dates of 10 characters; ``timestamp`` for ISO times;
  ``timestamp_ms`` when the name says time, for integers of 2001 to 2286 in epoch milliseconds;
- a decimal when a number has a fraction (a JSON number, or a string of plain digits with one) or an integer is
  beyond ``long``, wide enough for every such value of at most 38 digits (Iceberg's widest decimal) with room for
  four more integer digits; strings of whole numbers alone may be ids and do not make one;
- ``double`` when a number is in exponent notation, or when most values are numbers of more than 38 digits (no
  decimal holds them; a double keeps about 17 of their digits, and the comment says so).

Scalar values that no candidate reads more than half of (mixed types) are ``json``: each kept as its JSON text.

Nested values are typed by the same rule at every depth (``infer``), each part named in the comments by its path
(``gps.alt``, ``tags[*]`` for a list's elements, ``attrs[*]`` for a map's values):

- objects are a **struct** whose fields are the keys, each typed from its values in the objects holding it, and
  required when it is in every object and never null (a key null in every object is left out, as a struct's
  undeclared keys are ignored); or a **map** of ``string`` keys when the keys vary: more than ``MAP_KEYS`` (16)
  distinct keys with an object holding at most half of them on average, or a key that is no field name (``"c-17"``,
  ``"2026-11-26"``); its values typed together, optional when one is null;
- arrays are a **list**, its element typed from every element of every sampled array, optional when one is null;
- shapes by the same majority rule as scalar types: when more than half of a place's values are objects (or
  arrays, or scalars), the type is inferred from those, and the values of another shape are named as rejects
  (``4 of 500 sampled values are not objects and will be rejects: 4 numbers with a fraction (lines …)``);
- ``json`` where no shape has a majority (as many objects as arrays or scalars, or elements of mixed shapes), where
  every sampled object or array was empty (no key or element to type: a list of unknown elements is better kept
  whole than typed ``string`` and rejected later), or every element or value was null; and for a **free-form**
  object: one whose keys vary (a key missing from some objects) and whose struct would have a field rejecting
  more than ``FREE_FORM_REJECTS`` (5%) of that field's sampled values by the field rule (``extra.a`` a string in
  some objects and a number in others): ``json`` rejects none of them, a struct would reject records for keys the
  producer never fixed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import msgspec

from krishiv_core.spec_types import ELEMENT, JSON_TEXT, LIST, MAP, STRUCT, VALUE, EventField, FieldType
from spark_jobs.record_decoder import INTEGER_RANGES, read_token

#: The candidates, narrowest first: of two that read as many values, the earlier is the field's type.
_ORDER = ("boolean", "timestamp_ms", "long", "decimal", "double", "date", "timestamp", "string")
_TIME_NAME = re.compile(r"(time|_ts$|^ts$|_at$|_ms$|date)", re.IGNORECASE)
_EPOCH_MS = (978_307_200_000, 9_999_999_999_999)  # 2001-01-01 .. 2286-11-20
_PLAIN = re.compile(r"-?[0-9]+(\.[0-9]+)?")
#: Iceberg's widest decimal.
DECIMAL_DIGITS = 38
#: A comment shows this many distinct values the type does not read, each with this many places.
_SHOWN = 3
_TEXT = msgspec.json.Decoder(str)
_RAW_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RAW_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])
#: A key a struct's field can have (the spec's field names).
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Objects with more distinct keys than this, each holding at most half of them on average, are a map.
MAP_KEYS = 16
#: Objects whose keys vary are ``json`` when a struct's field would reject more than this share of its values.
FREE_FORM_REJECTS = 0.05


def json_kind(token: bytes) -> str:
    """The JSON kind of a non-null token: string, integer, number (a fraction or exponent), boolean, object, array."""
    kinds = {b'"': "string", b"{": "object", b"[": "array", b"t": "boolean", b"f": "boolean"}
    first = token[:1]
    if first in kinds:
        return kinds[first]
    return "number" if any(c in token for c in b".eE") else "integer"


@dataclass(frozen=True)
class _Value:
    token: bytes
    kind: str
    plain: str | None  # plain digits a decimal may read: a JSON number, or a JSON string holding one

    @classmethod
    def of(cls, token: bytes) -> _Value:
        kind = json_kind(token)
        text = token.decode() if kind in ("integer", "number") else _TEXT.decode(token) if kind == "string" else ""
        return cls(token, kind, text if _PLAIN.fullmatch(text) else None)

    @property
    def digits(self) -> int:
        """The digits a decimal needs for it: integer and fraction digits, leading and trailing zeros aside."""
        whole, _, fraction = (self.plain or "").lstrip("-").partition(".")
        return len(whole.lstrip("0")) + len(fraction.rstrip("0"))

    @property
    def beyond_long(self) -> bool:
        low, high = INTEGER_RANGES["long"]
        return self.kind == "integer" and not low <= int(self.token) <= high

    @property
    def too_long(self) -> bool:
        """A JSON number in plain notation that no decimal holds."""
        return self.kind != "string" and self.plain is not None and self.digits > DECIMAL_DIGITS


@dataclass(frozen=True)
class Candidate:
    type: FieldType
    note: str
    reads: tuple[bool, ...]  # for each sampled value, whether the field rule reads it as this type

    @property
    def count(self) -> int:
        return sum(self.reads)


def _decimal(plains: Sequence[str]) -> FieldType:
    """A decimal that holds each of ``plains``, with room for four more integer digits, within 38 digits."""
    whole = max(len(p.lstrip("-").split(".")[0].lstrip("0")) for p in plains)
    scale = min(DECIMAL_DIGITS, max(len(p.split(".")[1]) if "." in p else 0 for p in plains))
    return FieldType("decimal", min(DECIMAL_DIGITS, whole + scale + 4), scale)


def _candidates(name: str, values: Sequence[_Value]) -> list[Candidate]:
    def judged(t: FieldType, note: str = "", also: Callable[[_Value], bool] | None = None) -> Candidate:
        reads = tuple(read_token(v.token, t)[1] is None and (also is None or also(v)) for v in values)
        return Candidate(t, note, reads)

    out = [judged(FieldType("boolean"))]
    if _TIME_NAME.search(name):
        in_epoch = lambda v: v.kind == "integer" and _EPOCH_MS[0] <= int(v.token) <= _EPOCH_MS[1]  # noqa: E731
        out.append(judged(FieldType("timestamp_ms"), "epoch milliseconds", in_epoch))
    out.append(judged(FieldType("long")))
    plains = [v for v in values if v.plain is not None and v.digits <= DECIMAL_DIGITS]
    beyond = any(v.beyond_long for v in values)
    if plains and (beyond or any("." in (v.plain or "") for v in values)):
        strings = sum(v.kind == "string" for v in plains)
        notes = ["integers beyond long"] if beyond else []
        if strings:
            notes.append("numbers sent as strings" if strings == len(plains) else "numbers, some sent as strings")
        exact = 'numbers with a fraction, kept exact (or declare "double")'
        out.append(judged(_decimal([v.plain or "" for v in plains]), "; ".join(notes) or exact))
    if any(v.kind == "number" and v.plain is None for v in values):
        out.append(judged(FieldType("double"), "exponent notation in the sample"))
    elif sum(v.too_long for v in values) * 2 > len(values):
        note = f"numbers of more than {DECIMAL_DIGITS} digits, beyond any decimal: a double keeps about 17 of them"
        out.append(judged(FieldType("double"), note))
    ten_long = lambda v: len(v.token) == 12  # noqa: E731  # "2026-11-26": a basic-format "20261126" is no date here
    out.append(judged(FieldType("date"), "", ten_long))
    out += [judged(FieldType("timestamp"), "ISO 8601"), judged(FieldType("string"))]
    return out


#: Where the sampled values of a place in the records were: (the JSON token, "line 17" or "partition 0 offset 9").
Seen = Sequence[tuple[bytes, str]]


@dataclass(frozen=True)
class Typed:
    """What the sample says of one place in the records: its type (None: left out), why, and its parts' notes."""

    type: FieldType | None
    note: str = ""
    parts: tuple[tuple[str, str], ...] = ()  # (a part's path, its note), for the parts inside a nested type


def infer(name: str, path: str, seen: Seen) -> Typed:
    """The type of the non-null values ``seen`` at ``path`` (``name``: the key they came under, which may say time).

    Objects are a struct or a map, arrays a list, both typed by this rule at every depth; scalars get the scalar
    candidate reading most of them. Of mixed shapes, the one of more than half the values is typed from them, the
    others named as rejects; ``json`` where no shape or no type reads more than half."""
    if not seen:
        return Typed(None, f"left out: {path} was null in every sampled value")
    kinds: dict[str, list[str]] = {}
    shapes: dict[str, list[tuple[bytes, str]]] = {}
    for token, where in seen:
        kind = json_kind(token)
        kinds.setdefault(kind, []).append(where)
        shapes.setdefault(kind if kind in ("object", "array") else "scalar", []).append((token, where))
    if len(shapes) > 1:
        (shape,) = [s for s, values in shapes.items() if len(values) * 2 > len(seen)] or [None]
        if shape is None:
            return Typed(FieldType(JSON_TEXT), f"json, as no shape is in more than half: {_kinds_said(kinds)}")
        if shape == "scalar":  # the scalar rule names the objects and arrays among them as rejects
            return _scalar(name, seen)
        typed = (_objects if shape == "object" else _arrays)(name, path, shapes[shape])
        odd = {kind: wheres for kind, wheres in kinds.items() if kind != shape}
        others = len(seen) - len(shapes[shape])
        listed = _kinds_listed(odd)
        if typed.type is not None and typed.type.name == JSON_TEXT:
            return Typed(typed.type, f"{typed.note}; json keeps its {_count(others, 'other value')} too: {listed}")
        rejects = f"{others:,} of {len(seen):,} sampled values are not {shape}s and will be "
        rejects += f"{'a reject' if others == 1 else 'rejects'}: {listed}"
        return Typed(typed.type, f"{typed.note}; {rejects}" if typed.note else rejects, typed.parts)
    if "object" in kinds:
        return _objects(name, path, seen)
    if "array" in kinds:
        return _arrays(name, path, seen)
    return _scalar(name, seen)


def _kinds_said(kinds: Mapping[str, Sequence[str]]) -> str:
    """``480 objects, 20 arrays (lines 3, 9, 12 and 17 more)``: each kind counted, the rarer ones placed."""
    ranked = sorted(kinds.items(), key=lambda kv: -len(kv[1]))
    said = [f"{len(ranked[0][1]):,} {_KIND_NOUNS[ranked[0][0]]}"]
    said += [f"{len(wheres):,} {_KIND_NOUNS[kind]} ({_places(_distinct(wheres))})" for kind, wheres in ranked[1:]]
    return ", ".join(said)


def _kinds_listed(kinds: Mapping[str, Sequence[str]]) -> str:
    """``4 numbers with a fraction (lines 34, 175, 349 and 1 more), 1 string (line 9)``: each kind counted, placed."""
    ranked = sorted(kinds.items(), key=lambda kv: -len(kv[1]))
    return ", ".join(f"{_kind_count(kind, len(w))} ({_places(_distinct(w))})" for kind, w in ranked)


def _kind_count(kind: str, n: int) -> str:
    return f"{n:,} {_KIND_NOUNS[kind] if n != 1 else _KIND_NOUN[kind]}"


_KIND_NOUNS = {
    "object": "objects",
    "array": "arrays",
    "string": "strings",
    "integer": "integers",
    "number": "numbers with a fraction",
    "boolean": "booleans",
}
_KIND_NOUN = {
    "object": "object",
    "array": "array",
    "string": "string",
    "integer": "integer",
    "number": "number with a fraction",
    "boolean": "boolean",
}


def _objects(name: str, path: str, seen: Seen) -> Typed:
    docs = [({k: bytes(v) for k, v in _RAW_OBJECT.decode(token).items()}, where) for token, where in seen]
    n = len(docs)
    holding: dict[str, int] = {}  # each key (first seen first): how many objects hold it
    for doc, _ in docs:
        for key in doc:
            holding[key] = holding.get(key, 0) + 1
    if not holding:
        return Typed(FieldType(JSON_TEXT), f"json: all {_count(n, 'sampled object')} were empty, no key to type")
    per_object = sum(holding.values()) / n
    odd = [key for key in holding if not _NAME.match(key)]
    if odd or (len(holding) > MAP_KEYS and per_object * 2 <= len(holding)):
        why = (
            f"keys such as {json.dumps(odd[0], ensure_ascii=False)[:40]} are no field names"
            if odd
            else f"{len(holding):,} distinct keys in {_count(n, 'object')}, {per_object:.1f} in one on average"
        )
        values = [(token, where) for doc, where in docs for token in doc.values()]
        value = _part(name, f"{path}[*]", values, VALUE)
        return Typed(FieldType(MAP, key=FieldType("string"), element=value.field), f"a map: {why}", value.notes)
    fields: list[EventField] = []
    notes: list[tuple[str, str]] = []
    some: list[str] = []
    for key in holding:
        here = f"{path}.{key}"
        present = [(doc[key], where) for doc, where in docs if key in doc and doc[key] != b"null"]
        typed = infer(key, here, present)
        if typed.type is None:
            notes.append((here, f"left out: null or missing in every one of the {_count(n, 'sampled object')}"))
            continue
        fields.append(EventField(key, typed.type, len(present) == n))
        if len(present) < n:
            some.append(f"{key} in {len(present):,}")
        notes += [(here, typed.note)] * bool(typed.note) + list(typed.parts)
    if not fields:
        return Typed(FieldType(JSON_TEXT), f"json: every key of the {_count(n, 'sampled object')} was null", ())
    free = _free_form(path, docs, holding, fields)
    if free:
        return Typed(FieldType(JSON_TEXT), free)
    in_all = len(fields) - len(some)
    shown = ", ".join(some[:_SHOWN]) + (f" and {len(some) - _SHOWN:,} more" if len(some) > _SHOWN else "")
    said = f"a struct: {_count(in_all, 'key')} in all {_count(n, 'object')}"
    if some and in_all:
        said += f", {len(some)} in some (optional): {shown}"
    elif some:
        said = f"a struct of {_count(len(some), 'optional key')}, none in all {_count(n, 'object')}: {shown}"
    return Typed(FieldType(STRUCT, fields=tuple(fields)), said, tuple(notes))


def _free_form(
    path: str, docs: Sequence[tuple[dict[str, bytes], str]], holding: Mapping[str, int], fields: Sequence[EventField]
) -> str | None:
    """Why objects are ``json`` rather than the struct ``fields``, or None: their keys vary (one is missing from some
    objects) and a field would reject more than ``FREE_FORM_REJECTS`` of its sampled values by the field rule."""
    n = len(docs)
    if all(count == n for count in holding.values()):
        return None
    worst: tuple[float, str] | None = None
    for f in fields:
        present = [doc[f.name] for doc, _ in docs if doc.get(f.name, b"null") != b"null"]
        rejected = sum(_rejected(token, f.type, f"{path}.{f.name}") for token in present)
        if rejected > FREE_FORM_REJECTS * len(present) and (worst is None or rejected / len(present) > worst[0]):
            said = f"{f.name} would be a {f.type} rejecting {rejected:,} of its {_count(len(present), 'sampled value')}"
            worst = (rejected / len(present), said)
    if worst is None:
        return None
    in_all = sum(count == n for count in holding.values())
    return (
        f"json, as the objects are free-form: their keys vary ({len(holding):,} distinct, {in_all or 'none'} in all "
        f"{_count(n, 'object')}), and as a struct {worst[1]}; json rejects none"
    )


def _rejected(token: bytes, t: FieldType, path: str) -> bool:
    """Whether the pipeline's rule rejects ``token`` (present, not null) as ``t``."""
    from spark_jobs.nested_json import Problems, read_part
    from spark_jobs.record_decoder import Malformed

    problems = Problems()
    try:
        read_part(token, t, path, problems)
    except Malformed:
        return True
    return bool(problems.mistyped or problems.absent)


def _arrays(name: str, path: str, seen: Seen) -> Typed:
    arrays = [([bytes(e) for e in _RAW_ARRAY.decode(token)], where) for token, where in seen]
    elements = [(token, where) for array, where in arrays for token in array]
    if not elements:
        return Typed(
            FieldType(JSON_TEXT),
            f"json: all {_count(len(arrays), 'sampled array')} were empty, no element to type (a list once you know)",
        )
    element = _part(name, f"{path}[*]", elements, ELEMENT)
    empty = sum(not array for array, _ in arrays)
    said = f"a list: {_count(len(elements), 'element')} in {_count(len(arrays), 'array')}"
    said += f", {empty:,} of them empty" if empty else ""
    return Typed(FieldType(LIST, element=element.field), said, element.notes)


@dataclass(frozen=True)
class _Part:
    field: EventField  # a list's element or a map's value
    notes: tuple[tuple[str, str], ...]


def _part(name: str, path: str, values: Seen, part: str) -> _Part:
    """A list's elements or a map's values, typed together: optional when one is null."""
    present = [(token, where) for token, where in values if token != b"null"]
    nulls = len(values) - len(present)
    if not present:
        note = f"json: all {_count(nulls, 'sampled ' + part)} were null, no type to infer"
        return _Part(EventField(part, FieldType(JSON_TEXT), False), ((path, note),))
    typed = infer(name, path, present)
    assert typed.type is not None
    notes = [typed.note] * bool(typed.note) + [f"{_count(nulls, 'null')} of {len(values):,} (optional)"] * bool(nulls)
    return _Part(EventField(part, typed.type, not nulls), (((path, "; ".join(notes)),) if notes else ()) + typed.parts)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _distinct(wheres: Sequence[str]) -> list[str]:
    """The places, each once (a record's several elements share one), in order."""
    return list(dict.fromkeys(wheres))


def _scalar(name: str, seen: Seen) -> Typed:
    """The candidate reading most of the scalar values, with the values it does not read named; json if none reads
    more than half."""
    n = len(seen)
    values = [_Value.of(token) for token, _ in seen]
    candidates = _candidates(name, values)
    best = max(candidates, key=lambda c: (c.count, -_ORDER.index(c.type.name)))
    if best.count * 2 <= n:
        kinds = ", ".join(sorted({v.kind for v in values}))
        return Typed(
            FieldType(JSON_TEXT),
            f"json: mixed types ({kinds}), no type reads more than half of its {_count(n, 'sampled value')}",
        )
    notes = [best.note] if best.note else []
    if best.count < n:
        notes.append(_rejects(seen, best, n, [v.too_long for v in values]))
    elif best.type.name == "string":
        typed = [c for c in candidates if c.type.name != "string" and c.count * 2 > n]
        if typed:
            c = max(typed, key=lambda c: (c.count, -_ORDER.index(c.type.name)))
            notes.append(
                f'{c.count:,} of {n:,} sampled values are a {c.type}; declared "{c.type}", the others would be '
                f"rejects: {_outliers(seen, c)}"
            )
    return Typed(best.type, "; ".join(notes))


def _rejects(seen: Seen, chosen: Candidate, n: int, too_long: Sequence[bool]) -> str:
    missed = n - chosen.count
    said = f"{missed:,} of {n:,} sampled values will be {'a reject' if missed == 1 else 'rejects'}: "
    said += _outliers(seen, chosen)
    if chosen.type.is_numeric and any(t and not r for t, r in zip(too_long, chosen.reads, strict=True)):
        said += f'; a number of more than {DECIMAL_DIGITS} digits fits no decimal: "double" reads it approximately'
    return said


def _outliers(seen: Seen, chosen: Candidate) -> str:
    """The values ``chosen`` does not read: a few, each with where it was sampled."""
    places: dict[bytes, list[str]] = {}
    for (token, where), read in zip(seen, chosen.reads, strict=True):
        if not read:
            wheres = places.setdefault(token, [])
            if where not in wheres[-1:]:
                wheres.append(where)
    shown = [f"{_said(token)} ({_places(wheres)})" for token, wheres in list(places.items())[:_SHOWN]]
    return ", ".join(shown) + (", …" if len(places) > _SHOWN else "")


@dataclass
class FieldGuess:
    """A top-level key of the sampled records: its non-null values, each with where it was sampled."""

    name: str
    seen: list[tuple[bytes, str]] = field(default_factory=list)  # (the JSON token, "line 17" or "partition 0 offset 9")
    missing_or_null: bool = False

    def spec_type(self) -> tuple[FieldType | None, str]:
        """(the field's type, a comment): None when the sample does not settle one."""
        return self._typed.type, self._typed.note

    @property
    def parts(self) -> tuple[tuple[str, str], ...]:
        """The notes of a nested field's parts, each with its path (``gps.alt``, ``tags[*]``, ``attrs[*].unit``)."""
        return self._typed.parts

    @cached_property
    def _typed(self) -> Typed:
        if not _NAME.match(self.name):
            return Typed(None, f"left out: {json.dumps(self.name, ensure_ascii=False)[:40]} is no field name")
        if not self.seen:
            return Typed(None, f"left out: {self.name} was null in every sampled record")
        return infer(self.name, self.name, self.seen)


def _said(token: bytes) -> str:
    """A sampled value as a comment names it: a string as its JSON text, any other with its kind (``the number 2``,
    ``the 40-digit number 1000000000…0009``, ``the boolean true``, ``an object {"a": 1}``), so no bare ``2`` reads
    as a count."""
    kind = json_kind(token)
    if kind == "string":
        return _shown(token)
    if kind in ("integer", "number"):
        text = token.decode("utf-8", "replace")
        digits = sum(c.isdigit() for c in text)
        if _PLAIN.fullmatch(text) and len(text) > 24:
            return f"the {digits}-digit number {text[:10]}…{text[-4:]}"
        return f"the number {_shown(token)}"
    return f"{'an' if kind in ('object', 'array') else 'the'} {kind} {_shown(token)}"


def _shown(token: bytes) -> str:
    """A token as a TOML comment may hold it (no control characters), cut short (a long number says its length)."""
    text = re.sub(r"[\x00-\x1f\x7f]", "?", token.decode("utf-8", "replace"))
    if len(text) <= 24:
        return text
    if _PLAIN.fullmatch(text):
        return f"{text[:10]}…{text[-4:]} ({sum(c.isdigit() for c in text)} digits)"
    return text[:23] + "…"


def _places(wheres: Sequence[str]) -> str:
    """``line 3, 9`` style: the first few places, grouped by what precedes the number, and how many more."""
    groups: dict[str, list[str]] = {}
    for where in wheres[:_SHOWN]:
        prefix, _, number = where.rpartition(" ")
        groups.setdefault(prefix, []).append(number)
    said = "; ".join(f"{prefix}{'s' if len(ns) > 1 else ''} {', '.join(ns)}" for prefix, ns in groups.items())
    return said + (f" and {len(wheres) - _SHOWN:,} more" if len(wheres) > _SHOWN else "")
