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

A field that no candidate reads more than half of (objects or arrays, or values of mixed types) is left out with a
comment saying why.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import msgspec

from krishiv_core.spec_types import FieldType
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
        out.append(judged(_decimal([v.plain or "" for v in plains]), "; ".join(notes) or "or double"))
    if any(v.kind == "number" and v.plain is None for v in values):
        out.append(judged(FieldType("double"), "exponent notation in the sample"))
    elif sum(v.too_long for v in values) * 2 > len(values):
        note = f"numbers of more than {DECIMAL_DIGITS} digits, beyond any decimal: a double keeps about 17 of them"
        out.append(judged(FieldType("double"), note))
    ten_long = lambda v: len(v.token) == 12  # noqa: E731  # "2026-11-26": a basic-format "20261126" is no date here
    out.append(judged(FieldType("date"), "", ten_long))
    out += [judged(FieldType("timestamp"), "ISO 8601"), judged(FieldType("string"))]
    return out


@dataclass
class FieldGuess:
    """A top-level key of the sampled records: its non-null values, each with where it was sampled."""

    name: str
    seen: list[tuple[bytes, str]] = field(default_factory=list)  # (the JSON token, "line 17" or "partition 0 offset 9")
    missing_or_null: bool = False

    @property
    def kinds(self) -> set[str]:
        return {json_kind(token) for token, _ in self.seen}

    def spec_type(self) -> tuple[str | None, str]:
        """(the field's type, a comment): None when the sample does not settle one."""
        return self._typed

    @cached_property
    def _typed(self) -> tuple[str | None, str]:
        n = len(self.seen)
        if not n:
            return None, f"left out: {self.name} was null in every sampled record"
        values = [_Value.of(token) for token, _ in self.seen]
        candidates = _candidates(self.name, values)
        best = max(candidates, key=lambda c: (c.count, -_ORDER.index(c.type.name)))
        nested = sorted(self.kinds & {"object", "array"})
        if best.count * 2 <= n:
            if nested and sum(v.kind in nested for v in values) >= best.count:
                return None, f"left out: {self.name} holds JSON {' and '.join(nested)}s"
            return None, (
                f"left out: {self.name} holds mixed types ({', '.join(sorted(self.kinds))}): "
                f"no type reads more than half of its {n:,} sampled values"
            )
        notes = [best.note] if best.note else []
        if best.count < n:
            notes.append(self._rejects(best, n, [v.too_long for v in values]))
        elif best.type.name == "string":
            typed = [c for c in candidates if c.type.name != "string" and c.count * 2 > n]
            if typed:
                c = max(typed, key=lambda c: (c.count, -_ORDER.index(c.type.name)))
                notes.append(
                    f'{c.count:,} of {n:,} sampled values are a {c.type}; declared "{c.type}", the others would be '
                    f"rejects: {self._outliers(c)}"
                )
        return str(best.type), "; ".join(notes)

    def _rejects(self, chosen: Candidate, n: int, too_long: Sequence[bool]) -> str:
        missed = n - chosen.count
        said = f"{missed:,} of {n:,} sampled values will be {'a reject' if missed == 1 else 'rejects'}: "
        said += self._outliers(chosen)
        if chosen.type.is_numeric and any(t and not r for t, r in zip(too_long, chosen.reads, strict=True)):
            said += f'; a number of more than {DECIMAL_DIGITS} digits fits no decimal: "double" reads it approximately'
        return said

    def _outliers(self, chosen: Candidate) -> str:
        """The values ``chosen`` does not read: a few, each with where it was sampled."""
        places: dict[bytes, list[str]] = {}
        for (token, where), read in zip(self.seen, chosen.reads, strict=True):
            if not read:
                places.setdefault(token, []).append(where)
        shown = [f"{_shown(token)} ({_places(wheres)})" for token, wheres in list(places.items())[:_SHOWN]]
        return ", ".join(shown) + (", …" if len(places) > _SHOWN else "")


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
