"""An oracle of the nested pipelines (``chaos.nested``), written from docs/spec.md alone: "Field types", "Nested
fields" and each kind's section. It imports nothing of Krishiv's to decide a value.

- :func:`read_nested` reads one Kafka value by the documented rule, at every depth: a struct is a JSON object
  (undeclared keys ignored, a key given twice counts once, the last), a list a JSON array (``[]`` empty, a null
  element a null only where the element is optional), a map a JSON object (each key read as the key's type from its
  text, each value by the value's type), ``json`` any value as its canonical text; each part's place named by its
  path (``gps.lat``, ``tags[3]``, ``attrs["speed"]``). The record's reason is every part that does not fit (in the
  spec's order, a list's elements and a map's entries in the record's order), else the first required part missing
  or null; a value that is not one JSON object is ``malformed JSON``.
- :func:`fold_events`, :func:`fold_upsert`, :func:`fold_windows`, :func:`fold_rejects`: what each table holds after
  the batches the ledger recorded (a valid record one row of ``events``; the greatest (version, position) per key
  since its last tombstone in ``upsert``; per (window, group) the count and exact sum of every event that was not
  late in update-mode ``windowed``; every other record in the rejects table with its reason).

Values are compared as plain Python: a struct a dict of its declared fields, a list a list, a map a dict, a
timestamp its epoch microseconds, a decimal a ``Decimal`` (exact), ``json`` its canonical text.

Where the documentation does not fix a reason's text, the oracle says what it assumed: the token of a JSON object or
array is shown as ``a JSON object`` / ``a JSON array`` (docs/spec.md shows a string's and a number's); a tombstone
outside an upsert is a reject whose reason is not stated (not compared, :data:`UNSTATED`).
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Context, Decimal
from typing import Any

from chaos.kinds_oracle import UpsertEvent, fold_upserts
from chaos.oracle import LateEvent, Records, late_reason

# ---------------------------------------------------------------------------------------------- the declared types


@dataclass(frozen=True)
class Type:
    name: str
    precision: int = 0
    scale: int = 0
    fields: tuple[Part, ...] = ()
    element: Part | None = None  # a list's element, a map's value
    key: Type | None = None  # a map's key


@dataclass(frozen=True)
class Part:
    name: str
    type: Type
    required: bool = True


_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")


def declared(decl: Any, name: str = "") -> Part:
    """A field as docs/spec.md declares it: a type name, or a table with ``type``, ``required`` (default true) and
    ``fields`` (struct), ``element`` (list), ``key`` and ``value`` (map)."""
    if isinstance(decl, str):
        return Part(name, _scalar(decl))
    kind, required = decl["type"], decl.get("required", True)
    if kind == "struct":
        return Part(name, Type("struct", fields=tuple(declared(d, n) for n, d in decl["fields"].items())), required)
    if kind == "list":
        return Part(name, Type("list", element=declared(decl["element"], "element")), required)
    if kind == "map":
        key = _scalar(decl["key"])
        return Part(name, Type("map", element=declared(decl["value"], "value"), key=key), required)
    return Part(name, _scalar(kind), required)


def _scalar(text: str) -> Type:
    m = _DECIMAL.fullmatch(text)
    return Type("decimal", int(m.group(1)), int(m.group(2))) if m else Type(text)


def fields_of(toml_text: str) -> tuple[Part, ...]:
    """The declared fields of a ``[pipelines.fields]`` table's TOML text."""
    return tuple(declared(d, n) for n, d in tomllib.loads(toml_text)["pipelines"]["fields"].items())


def shown(t: Type) -> str:
    """A type as a reason shows it (docs/spec.md: ``struct<lat: double, lon: double>``, ``?`` after a part that may
    be null; a list's and a map's by the same pattern)."""
    if t.name == "decimal":
        return f"decimal({t.precision},{t.scale})"
    if t.name == "struct":
        return "struct<" + ", ".join(f"{f.name}: {_part(f)}" for f in t.fields) + ">"
    if t.name == "list":
        assert t.element is not None
        return f"list<{_part(t.element)}>"
    if t.name == "map":
        assert t.element is not None and t.key is not None
        return f"map<{shown(t.key)}, {_part(t.element)}>"
    return t.name


def _part(p: Part) -> str:
    return shown(p.type) + ("" if p.required else "?")


# -------------------------------------------------------------------------------------------------- JSON, as written


@dataclass(frozen=True)
class Number:
    """A JSON number token, as spelled."""

    text: str


class Pairs(list):
    """A JSON object's pairs, in the record's order (a key may come twice)."""

    def last(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in self:
            out[k] = v  # a key given twice: its first place, the last value
        return out


class Malformed(Exception):
    pass


def _constant(text: str) -> Any:
    raise Malformed(text)  # NaN and Infinity are no JSON


def parse_json(value: bytes) -> Any:
    try:
        return json.loads(
            value.decode("utf-8"),
            object_pairs_hook=Pairs,
            parse_int=Number,
            parse_float=Number,
            parse_constant=_constant,
        )
    except (ValueError, Malformed):
        raise Malformed from None


# --------------------------------------------------------------------------------------------------------- the rule

INT_RANGES = {"long": (-(2**63), 2**63 - 1), "int": (-(2**31), 2**31 - 1)}
_PLAIN = re.compile(r"-?[0-9]+(\.[0-9]+)?")
_EXPONENT = re.compile(r"-?[0-9]+(\.[0-9]+)?[eE][-+]?[0-9]+")
_INTEGER = re.compile(r"-?[0-9]+")
_MISSING = object()
#: A shown token's most characters, and sums exactly (Python's default context keeps 28 digits; a sum of
#: decimal(28,8) values has up to 38).
SHOWN = 40
EXACT = Context(prec=100)


def got(token: Any) -> str:
    """The token as a reason shows it: ``a JSON string "…"``, ``a JSON number 1.005``, cut to its first 40
    characters (docs/spec.md, "Field types")."""
    if isinstance(token, str):
        return f"a JSON string {json.dumps(token, ensure_ascii=False)[:SHOWN]}"
    if isinstance(token, Number):
        return f"a JSON number {token.text[:SHOWN]}"
    if isinstance(token, bool):
        return f"a JSON boolean {'true' if token else 'false'}"
    if isinstance(token, Pairs):
        return "a JSON object"
    return "a JSON array"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def micros(moment: datetime) -> int:
    """Epoch microseconds of an instant (no offset is UTC)."""
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def scalar(token: Any, t: Type) -> tuple[Any, str | None]:
    """(value, None), or (None, why it does not fit) for one present, non-null token (docs/spec.md "Field types")."""
    why: str | None = None
    if t.name == "string" and isinstance(token, str):
        return token, None
    if t.name == "boolean" and isinstance(token, bool):
        return token, None
    if t.name == "double" and isinstance(token, Number):
        return float(token.text), None
    if t.name in ("long", "int", "timestamp_ms") and isinstance(token, Number):
        text = token.text
        if "e" in text or "E" in text:
            why = "exponent notation"
        elif not _INTEGER.fullmatch(text):
            why = "not an integer"
        else:
            low, high = INT_RANGES.get(t.name, (-62_135_596_800_000, 253_402_300_799_999))
            if low <= int(text) <= high:
                return int(text), None
            why = "out of range"
    elif t.name == "timestamp" and isinstance(token, str):
        try:
            return micros(datetime.fromisoformat(token)), None
        except ValueError:
            why = "not an ISO-8601 time"
    elif t.name == "date" and isinstance(token, str):
        try:
            return date.fromisoformat(token), None
        except ValueError:
            why = "not an ISO-8601 date"
    elif t.name == "decimal" and isinstance(token, Number | str) and not isinstance(token, bool):
        digits = token.text if isinstance(token, Number) else token
        if _EXPONENT.fullmatch(digits):
            why = "exponent notation, write it as plain digits"
        elif not _PLAIN.fullmatch(digits):
            why = "not a number"
        else:
            whole, _, fraction = digits.lstrip("-").partition(".")
            whole, fraction = whole.lstrip("0"), fraction.rstrip("0")
            if len(fraction) > t.scale:
                why = f"{_plural(len(fraction), 'decimal place')}, the scale is {t.scale}"
            elif len(whole) > t.precision - t.scale:
                why = f"{_plural(len(whole), 'integer digit')}, at most {t.precision - t.scale}"
            else:
                return Decimal(digits), None
    return None, f"({shown(t)}, got {got(token)}" + (f": {why})" if why else ")")


def canonical(token: Any) -> str:
    """A ``json`` value's canonical text: no whitespace outside strings, keys sorted by code point (a key given twice
    keeps the last), strings escaped only for ``"``, ``\\`` and control characters, numbers as written."""
    if isinstance(token, Number):
        return token.text
    if isinstance(token, bool):
        return "true" if token else "false"
    if token is None:
        return "null"
    if isinstance(token, str):
        out = []
        for ch in token:
            if ch in '"\\':
                out.append("\\" + ch)
            elif ord(ch) < 0x20:
                out.append(json.dumps(ch)[1:-1])  # the generator writes none: the doc does not fix their form
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'
    if isinstance(token, Pairs):
        pairs = sorted(token.last().items())
        return "{" + ",".join(f"{canonical(k)}:{canonical(v)}" for k, v in pairs) + "}"
    return "[" + ",".join(canonical(v) for v in token) + "]"


class _Reading:
    def __init__(self) -> None:
        self.mistyped: list[str] = []
        self.absent: list[str] = []

    def part(self, token: Any, p: Part, path: str) -> Any:
        """A field, element or value that is there (``token`` may be null or :data:`_MISSING`)."""
        if token is _MISSING or token is None:
            if p.required:
                self.absent.append(f"{'missing' if token is _MISSING else 'null'} field: {path}")
            return None
        return self.value(token, p.type, path)

    def value(self, token: Any, t: Type, path: str) -> Any:
        if t.name == "json":
            return canonical(token)
        if t.name == "struct":
            if not isinstance(token, Pairs):
                self.mistyped.append(f"{path} ({shown(t)}, got {got(token)})")
                return None
            return self.struct(token.last(), t.fields, path + ".")
        if t.name == "list":
            if not isinstance(token, list) or isinstance(token, Pairs):
                self.mistyped.append(f"{path} ({shown(t)}, got {got(token)})")
                return None
            assert t.element is not None
            return [self.part(e, t.element, f"{path}[{n}]") for n, e in enumerate(token)]
        if t.name == "map":
            if not isinstance(token, Pairs):
                self.mistyped.append(f"{path} ({shown(t)}, got {got(token)})")
                return None
            assert t.element is not None and t.key is not None
            out = {}
            for text, v in token.last().items():
                where = f"{path}[{json.dumps(text, ensure_ascii=False)}]"
                key = self.map_key(text, t.key, where)
                out[key] = self.part(v, t.element, where)
            return out
        value, why = scalar(token, t)
        if why is not None:
            self.mistyped.append(f"{path} {why}")
        return value

    def map_key(self, text: str, t: Type, where: str) -> Any:
        """A key read as the key's type from its text: a string as it is, any other as the JSON token or ISO-8601
        string the text would be."""
        if t.name == "string":
            return text
        token: Any = text
        if t.name not in ("timestamp", "date"):
            try:
                token = parse_json(text.encode())
            except Malformed:
                token = None
        value, why = scalar(token, t) if token is not None else (None, "x")
        if why is not None:
            self.mistyped.append(f"{where} (map key {shown(t)}, got {json.dumps(text, ensure_ascii=False)})")
        return value

    def struct(self, doc: Mapping[str, Any], fields: Iterable[Part], prefix: str) -> dict[str, Any]:
        return {f.name: self.part(doc.get(f.name, _MISSING), f, prefix + f.name) for f in fields}


def read_nested(value: bytes | None, fields: tuple[Part, ...]) -> tuple[str | None, dict[str, Any] | None]:
    """(reason, None) for a reject, (None, the row's fields) for a valid record; a null value is a tombstone, whose
    reason outside an upsert docs/spec.md does not state (:data:`UNSTATED`)."""
    if value is None:
        return UNSTATED, None
    try:
        doc = parse_json(value)
    except Malformed:
        return "malformed JSON", None
    if not isinstance(doc, Pairs):
        return "malformed JSON", None
    reading = _Reading()
    row = reading.struct(doc.last(), fields, "")
    if reading.mistyped:
        return "mistyped field: " + ", ".join(reading.mistyped), None
    if reading.absent:
        return reading.absent[0], None
    return None, row


#: The reason of a reject docs/spec.md does not state the text of (a null Kafka value outside an upsert).
UNSTATED = "(a null Kafka value: its reason is not stated)"


# ------------------------------------------------------------------------------------------------------- the folds

#: (partition, offset) of each record of the batches, by batch id: the ledger's ranges.
Batches = list[tuple[int, list[tuple[int, int]]]]


def batches_of(entries: Iterable[Any], topic: str) -> Batches:
    """Each batch's (partition, offset) pairs, in batch order, from ledger entries (anything with ``batch_id`` and
    ``offsets``: topic -> partition -> [start, end))."""
    out = []
    for e in sorted(entries, key=lambda e: e.batch_id):
        ranges = sorted(e.offsets.get(topic, {}).items(), key=lambda kv: int(kv[0]))
        out.append((e.batch_id, [(int(p), o) for p, (lo, hi) in ranges for o in range(lo, hi)]))
    return out


def _path(row: Mapping[str, Any], path: str) -> Any:
    for name in path.split("."):
        row = row[name]
    return row


@dataclass
class Folded:
    """What every table of the three nested pipelines must hold."""

    events: dict[tuple[int, int], dict[str, Any]]  # (partition, offset) -> the row's fields
    upsert: dict[Hashable, dict[str, Any]]  # key -> the row's fields
    windows: dict[tuple[int, int, Any], tuple[int, Decimal]]  # (window start ms, end ms, group) -> (count, sum)
    rejects: dict[str, dict[tuple[int, int, int], str]]  # kind -> (batch, partition, offset) -> reason
    late: dict[tuple[int, int, int], LateEvent]


def _readings(records: Records, fields: tuple[Part, ...]) -> Iterator[tuple[tuple[int, int], str | None, Any]]:
    for coords, value in records.items():
        reason, row = read_nested(value, fields)
        yield coords, reason, row


def fold_events(records: Records, fields: tuple[Part, ...]) -> dict[tuple[int, int], dict[str, Any]]:
    """``events``: every valid record one row."""
    return {coords: row for coords, reason, row in _readings(records, fields) if reason is None}


def fold_upsert(
    records: Records, keys: Records, batches: Batches, fields: tuple[Part, ...], key: str, version: str
) -> dict[Hashable, dict[str, Any]]:
    """``upsert`` keyed by the one dotted path ``key``, versioned by ``version``: the upsert rule, in the order the
    batches read the records (and by offset, then partition, within one); a tombstone's key is the Kafka key's text
    (a one-field string key)."""
    events = []
    for _batch, coords in batches:
        for p, o in sorted(coords, key=lambda c: (c[1], c[0])):
            if (p, o) not in records:
                continue
            value = records[(p, o)]
            if value is None:
                kafka_key = keys.get((p, o))
                if kafka_key:
                    events.append(UpsertEvent(kafka_key.decode(), tombstone=True))
                continue
            reason, row = read_nested(value, fields)
            if reason is None and row is not None:
                events.append(UpsertEvent(_path(row, key), _path(row, version), row))
    return fold_upserts(events)


def fold_windows(
    records: Records,
    batches: Batches,
    fields: tuple[Part, ...],
    *,
    event_time: str,
    group: str,
    field: str,
    window_ms: int,
    delay_ms: int,
) -> tuple[dict[tuple[int, int, Any], tuple[int, Decimal]], dict[tuple[int, int, int], LateEvent]]:
    """Update-mode tumbling windows per ``group`` of ``count`` and the exact ``sum`` of ``field``, event time at
    ``event_time`` (dotted paths): an event of batch N whose window ended at or before the watermark batch N-1 left
    (max event time of the batches so far minus the delay) is late, kept in the rejects table with the documented
    reason; the others count in their window."""
    state: dict[tuple[int, int, Any], list] = {}
    late: dict[tuple[int, int, int], LateEvent] = {}
    watermark: int | None = None
    for batch, coords in batches:
        latest = None
        for p, o in coords:
            if (p, o) not in records:
                continue
            reason, row = read_nested(records[(p, o)], fields)
            if reason is not None or row is None:
                continue
            t_us = _path(row, event_time)
            t = t_us // 1000
            latest = t if latest is None else max(latest, t)
            start = t - t % window_ms
            if watermark is not None and start + window_ms <= watermark:
                late[(batch, p, o)] = LateEvent(late_reason(start, start + window_ms, watermark), records[(p, o)])
                continue
            agg = state.setdefault((start, start + window_ms, _path(row, group)), [0, Decimal(0)])
            agg[0] += 1
            agg[1] = EXACT.add(agg[1], _path(row, field))
        if latest is not None:
            watermark = latest - delay_ms if watermark is None else max(watermark, latest - delay_ms)
    return {k: (v[0], v[1]) for k, v in state.items()}, late


def fold_rejects(
    records: Records, keys: Records, batches: Batches, fields: tuple[Part, ...], kind: str
) -> dict[tuple[int, int, int], str]:
    """A pipeline's rejects by (batch, partition, offset): every record that is not valid, by the batch that read it,
    except an upsert's tombstones with a key (they delete)."""
    out = {}
    for batch, coords in batches:
        for p, o in coords:
            if (p, o) not in records:
                continue
            value = records[(p, o)]
            if kind == "upsert" and value is None and keys.get((p, o)):
                continue
            reason, _row = read_nested(value, fields)
            if reason is not None:
                out[(batch, p, o)] = reason
    return out
