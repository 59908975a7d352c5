"""A seeded topic of nested records (issue 36's "done when"), and the spec of the three pipelines that read it.

Each record is a JSON object whose fields are nested to four levels (``meta.origin.rack.slot``), with lists of
structs holding lists of structs (``items[1].parts[0].weight``), maps of decimals with string and long keys, empty,
null and missing lists, a ``json`` field, edge decimals at every depth (precision 38, long fractions with trailing
zeros, leading zeros in strings, negative zero), timestamps with offsets (and digits past microseconds), unknown
nested keys and keys given twice. About 1% of the records are malformed, one fault each, of every nested kind; a few
are late (ten minutes behind) and a few are tombstones (a null value keyed by the device).

The generator writes its own JSON text (numbers exactly as spelled, keys given twice, whitespace varied) and keeps,
for each malformed record, the reason it meant (``NestedRecord.meant``): the oracle (``chaos.nested_oracle``) reads
the bytes by the rule on its own, and a test checks that both agree.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from krishiv.produce import DEFAULT_START_MS, OrderEvent

#: The fields every nested pipeline declares (TOML inline tables, one field a line), in the spec's order.
NESTED_FIELDS = """
[pipelines.fields]
device = { type = "struct", fields = { id = "string", model = { type = "string", required = false }, tags = { type = "list", element = "string" } } }
meta = { type = "struct", fields = { seq = "long", site = "string", ts = "timestamp", origin = { type = "struct", required = false, fields = { host = "string", seen = { type = "timestamp", required = false }, rack = { type = "struct", fields = { row = "int", slot = { type = "decimal(38,0)", required = false } } } } } } }
reading = { type = "struct", fields = { value = "decimal(28,8)", unit = { type = "string", required = false } } }
items = { type = "list", required = false, element = { type = "struct", fields = { sku = "string", qty = "int", price = "decimal(38,10)", parts = { type = "list", required = false, element = { type = "struct", fields = { code = "string", weight = { type = "decimal(10,3)", required = false } } } } } } }
attrs = { type = "map", key = "string", value = { type = "decimal(38,18)", required = false } }
limits = { type = "map", required = false, key = "long", value = "decimal(12,4)" }
notes = { type = "list", required = false, element = { type = "string", required = false } }
extra = { type = "json", required = false }
"""  # noqa: E501  (a TOML inline table is one line)

#: The three pipelines on the one topic: every valid record (with its Kafka coordinates), the latest record per
#: ``device.id`` by ``meta.seq``, and per-minute windows per ``meta.site`` of ``reading.value`` by ``meta.ts``.
NESTED_PIPELINES_TEMPLATE = """
[[pipelines]]
name = "nested_events"
kind = "events"
topic = "{topic}"
kafka_metadata = ["partition", "offset"]
partition_by = ["day(meta.ts)"]
trigger_interval = "500ms"
max_records_per_batch = {max_records}
{fields}
[[pipelines]]
name = "nested_latest"
kind = "upsert"
topic = "{topic}"
key = ["device.id"]
version_field = "meta.seq"
partition_by = ["bucket(4, device.id)"]
trigger_interval = "500ms"
max_records_per_batch = {max_records}
{fields}
[[pipelines]]
name = "nested_sites"
topic = "{topic}"
event_time_field = "meta.ts"
watermark_delay = "5s"
window = "1m"
group_by = ["meta.site"]
output_mode = "update"
trigger_interval = "500ms"
max_records_per_batch = {max_records}
{fields}
[[pipelines.aggregations]]
name = "readings"
function = "count"

[[pipelines.aggregations]]
name = "value_total"
function = "sum"
field = "reading.value"
"""

NESTED_PIPELINE_NAMES = ("nested_events", "nested_latest", "nested_sites")
DEVICES = [f"d-{n:03d}" for n in range(40)]
SITES = ("north", "south", "east", "west", "zürich")
LATE_BY_MS = 10 * 60_000
SPACING_MS = 200  # mean event-time distance between records: 5,000 records span about 17 one-minute windows


# ----------------------------------------------------------------------------------- the JSON the generator writes


@dataclass(frozen=True)
class Raw:
    """A token written exactly as spelled (a number, or a broken fragment)."""

    text: str


@dataclass
class Obj:
    """A JSON object as written: its pairs in order (a key may be given twice)."""

    pairs: list[tuple[str, Any]] = field(default_factory=list)

    def get(self, key: str) -> Any:
        return next(v for k, v in reversed(self.pairs) if k == key)

    def set(self, key: str, value: Any) -> None:
        """Replace the key's (last) value, or add it."""
        for n in range(len(self.pairs) - 1, -1, -1):
            if self.pairs[n][0] == key:
                self.pairs[n] = (key, value)
                return
        self.pairs.append((key, value))

    def drop(self, key: str) -> None:
        self.pairs = [(k, v) for k, v in self.pairs if k != key]


def dump(node: Any, rng: random.Random, compact: bool) -> str:
    sep, colon = (",", ":") if compact else (", ", ": ")
    if isinstance(node, Raw):
        return node.text
    if isinstance(node, Obj):
        return "{" + sep.join(f"{_string(k, rng)}{colon}{dump(v, rng, compact)}" for k, v in node.pairs) + "}"
    if isinstance(node, list):
        return "[" + sep.join(dump(v, rng, compact) for v in node) + "]"
    if isinstance(node, str):
        return _string(node, rng)
    return json.dumps(node)  # true, false, null


def _string(text: str, rng: random.Random) -> str:
    return json.dumps(text, ensure_ascii=rng.random() < 0.5)  # \u00fc or ü: the same string


# ------------------------------------------------------------------------------------------------------- values


def decimal_token(rng: random.Random, precision: int, scale: int) -> Any:
    """A JSON token that fits ``decimal(precision,scale)``: an edge one about half the time."""
    whole = precision - scale
    edges = [
        "9" * whole + ("." + "9" * scale if scale else ""),  # the largest
        "-" + "9" * whole + ("." + "9" * scale if scale else ""),
        "0",
        "-0",
        "-0." + "0" * max(scale, 1) if scale else "-0",
        ("0." + "0" * (scale - 1) + "1") if scale else "1",  # the smallest step
        "1." + "0" * (scale + rng.randint(1, 12)),  # trailing zeros past the scale: still fits
    ]
    if rng.random() < 0.5:
        text = rng.choice(edges)
    else:
        digits = str(rng.randrange(10 ** rng.randint(1, whole)))
        fraction = str(rng.randrange(10**scale)).rjust(scale, "0")[: rng.randint(0, scale)] if scale else ""
        text = ("-" if rng.random() < 0.3 else "") + digits + ("." + fraction if fraction else "")
    if rng.random() < 0.4:  # a string holding it, sometimes with leading zeros
        return ("-" + "00" + text[1:] if text.startswith("-") else "000" + text) if rng.random() < 0.3 else text
    return Raw(text)


def timestamp_text(rng: random.Random, ms: int, sub_ms: bool = False) -> str:
    """The instant ``ms`` in ISO 8601 as producers write it: an offset (or none, which is UTC), 'T' or a space,
    milliseconds, microseconds or nine digits (past microseconds cut); with ``sub_ms``, now and then digits past the
    millisecond (an event time has none, so a watermark is a whole millisecond)."""
    offset = rng.choice((0, 0, 330, -180, 60, -600, 345))
    local = datetime.fromtimestamp(ms / 1000, tz=UTC) + timedelta(minutes=offset)
    text = local.strftime("%Y-%m-%d") + rng.choice("T ") + local.strftime("%H:%M:%S")
    fraction = f"{ms % 1000:03d}"
    shapes = ["." + fraction, "." + fraction + "000", "." + fraction + "000999"]
    if sub_ms:
        shapes += ["." + fraction + "017", "." + fraction + "250999"]
    text += rng.choice(shapes)
    if offset == 0:
        return text + rng.choice(("Z", "+00:00", ""))
    sign, minutes = ("+" if offset > 0 else "-"), abs(offset)
    return text + f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def _maybe(rng: random.Random, value: Callable[[], Any], present: float = 0.6) -> Any:
    """A value, a null or nothing (:data:`ABSENT`)."""
    r = rng.random()
    return value() if r < present else None if r < present + (1 - present) / 2 else ABSENT


ABSENT = object()


def _obj(rng: random.Random, pairs: list[tuple[str, Any]], unknown: float = 0.05) -> Obj:
    """An object of the pairs that are not :data:`ABSENT`, in a shuffled order, now and then with a key it does not
    declare or a key given twice (first a value that would not fit: the last counts)."""
    kept = [(k, v) for k, v in pairs if v is not ABSENT]
    rng.shuffle(kept)
    out = Obj(kept)
    if rng.random() < unknown:
        out.pairs.insert(rng.randrange(len(out.pairs) + 1), ("colour", rng.choice(["red", Raw("7"), [], Obj()])))
    if kept and rng.random() < unknown:
        k, v = rng.choice(kept)
        out.pairs.insert(0, (k, Raw("{}") if not isinstance(v, Obj) else "twice"))
    return out


def valid_record(rng: random.Random, device: str, seq: int, ts_ms: int, site: str) -> Obj:
    def rack() -> Obj:
        row = rng.choice((0, -(2**31), 2**31 - 1, rng.randint(-50, 50)))
        return _obj(rng, [("row", Raw(str(row))), ("slot", _maybe(rng, lambda: decimal_token(rng, 38, 0)))])

    def origin() -> Obj:
        seen = _maybe(rng, lambda: rng.choice((timestamp_text(rng, ts_ms - 3_600_000, sub_ms=True), "2025-12-31")))
        return _obj(rng, [("host", f"h{rng.randrange(9)}"), ("seen", seen), ("rack", rack())])

    def part() -> Obj:
        return _obj(
            rng, [("code", f"p{rng.randrange(99)}"), ("weight", _maybe(rng, lambda: decimal_token(rng, 10, 3)))]
        )

    def item() -> Obj:
        parts = _maybe(rng, lambda: [part() for _ in range(rng.choice((0, 1, 2, 3)))], 0.7)
        qty = Raw(str(rng.choice((0, 1, -(2**31), 2**31 - 1, rng.randint(1, 9)))))
        return _obj(
            rng,
            [("sku", f"s-{rng.randrange(999)}"), ("qty", qty), ("price", decimal_token(rng, 38, 10)), ("parts", parts)],
        )

    attrs = Obj()
    for key in rng.sample(("speed", "temp", "load", "a.b", "volt"), rng.choice((0, 1, 2, 3))):
        attrs.pairs.append((key, None if rng.random() < 0.15 else decimal_token(rng, 38, 18)))
    limits = _maybe(
        rng,
        lambda: Obj(
            [
                (k, decimal_token(rng, 12, 4))
                for k in rng.sample(("0", "-5", "42", "9223372036854775807"), rng.randint(0, 3))
            ]
        ),
    )
    extra = _maybe(rng, lambda: json_value(rng, 3), 0.5)
    return _obj(
        rng,
        [
            (
                "device",
                _obj(
                    rng,
                    [
                        ("id", device),
                        ("model", _maybe(rng, lambda: rng.choice(("m1", "m2", "Ünit")))),
                        ("tags", [rng.choice(("cold", "late", "ok", "")) for _ in range(rng.choice((0, 0, 1, 2, 3)))]),
                    ],
                ),
            ),
            (
                "meta",
                _obj(
                    rng,
                    [
                        ("seq", Raw(str(seq))),
                        ("site", site),
                        ("ts", timestamp_text(rng, ts_ms)),
                        ("origin", _maybe(rng, origin)),
                    ],
                ),
            ),
            ("reading", _obj(rng, [("value", decimal_token(rng, 28, 8)), ("unit", _maybe(rng, lambda: "kW"))])),
            ("items", _maybe(rng, lambda: [item() for _ in range(rng.choice((0, 1, 2, 3)))], 0.7)),
            ("attrs", attrs),
            ("limits", limits),
            ("notes", _maybe(rng, lambda: [rng.choice((None, "n", "ñ")) for _ in range(rng.choice((0, 1, 2)))])),
            ("extra", extra),
        ],
        unknown=0.0,
    )


def json_value(rng: random.Random, depth: int) -> Any:
    """Free-form JSON for the ``json`` field: objects with shuffled and repeated keys, numbers spelled many ways."""
    kinds = ["number", "string", "bool", "null"] + (["object", "array"] * 2 if depth > 0 else [])
    kind = rng.choice(kinds)
    if kind == "number":
        return Raw(rng.choice(("1", "-0", "1.0", "2.50", "1E5", "-3e-2", "12345678901234567890123", "0.1")))
    if kind == "string":
        return rng.choice(("a", "é", "x y", 'q"uote', "back\\slash", "ünï", "/"))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "array":
        return [json_value(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    keys = rng.sample(("b", "a", "Z", "é", "aa", "_"), rng.randint(0, 4))
    pairs = [(k, json_value(rng, depth - 1)) for k in keys]
    if pairs and rng.random() < 0.3:
        pairs.insert(0, (pairs[-1][0], "first"))  # a key given twice: the last counts
    return Obj(pairs)


# ------------------------------------------------------------------------------------------------- malformed ones


def _ensure_items(rng: random.Random, record: Obj, n: int, parts: bool = False) -> list[Obj]:
    """Make ``items`` a list of at least ``n`` items (each with at least one part when ``parts``); return it."""
    items = record.get("items") if any(k == "items" for k, _ in record.pairs) else None
    if not isinstance(items, list):
        items = []
        record.set("items", items)
    while len(items) < n:
        items.append(
            Obj([("sku", "s-1"), ("qty", Raw("1")), ("price", Raw("1.5")), ("parts", [Obj([("code", "p1")])])])
        )
    if parts:
        for item in items:
            current = item.get("parts") if any(k == "parts" for k, _ in item.pairs) else None
            if not isinstance(current, list) or not current:
                item.set("parts", [Obj([("code", "p1"), ("weight", Raw("0.5"))])])
    return items


def _origin(record: Obj) -> Obj:
    meta = record.get("meta")
    origin = meta.get("origin") if any(k == "origin" for k, _ in meta.pairs) else None
    if not isinstance(origin, Obj):
        origin = Obj([("host", "h1"), ("rack", Obj([("row", Raw("1"))]))])
        meta.set("origin", origin)
    return origin


READING = "struct<value: decimal(28,8), unit: string?>"
RACK = "struct<row: int, slot: decimal(38,0)?>"


def _wrong_struct(rng: random.Random, r: Obj) -> str:
    r.set("reading", "12.5")
    return f'mistyped field: reading ({READING}, got a JSON string "12.5")'


def _wrong_nested_struct(rng: random.Random, r: Obj) -> str:
    _origin(r).set("rack", Raw("7"))
    return f"mistyped field: meta.origin.rack ({RACK}, got a JSON number 7)"


def _wrong_list(rng: random.Random, r: Obj) -> str:
    r.get("device").set("tags", "cold")
    return 'mistyped field: device.tags (list<string>, got a JSON string "cold")'


def _object_for_list(rng: random.Random, r: Obj) -> str:
    r.set("notes", Obj([("a", Raw("1"))]))
    return "mistyped field: notes (list<string?>, got a JSON object)"


def _wrong_map(rng: random.Random, r: Obj) -> str:
    r.set("limits", Raw("5"))
    return "mistyped field: limits (map<long, decimal(12,4)>, got a JSON number 5)"


def _array_for_map(rng: random.Random, r: Obj) -> str:
    r.set("attrs", [Raw("1")])
    return "mistyped field: attrs (map<string, decimal(38,18)?>, got a JSON array)"


def _bad_deep_element(rng: random.Random, r: Obj) -> str:
    items = _ensure_items(rng, r, 2, parts=True)
    i = rng.randrange(len(items))
    parts = items[i].get("parts")
    j = rng.randrange(len(parts))
    parts[j].set("weight", "1.2345")
    return f'mistyped field: items[{i}].parts[{j}].weight (decimal(10,3), got a JSON string "1.2345": 4 decimal places, the scale is 3)'  # noqa: E501


def _fraction_in_list_int(rng: random.Random, r: Obj) -> str:
    items = _ensure_items(rng, r, 1)
    i = rng.randrange(len(items))
    items[i].set("qty", Raw("2.50"))
    return f"mistyped field: items[{i}].qty (int, got a JSON number 2.50: not an integer)"


def _price_not_a_number(rng: random.Random, r: Obj) -> str:
    items = _ensure_items(rng, r, 1)
    i = rng.randrange(len(items))
    items[i].set("price", "12,5")
    return f'mistyped field: items[{i}].price (decimal(38,10), got a JSON string "12,5": not a number)'


def _map_decimal_places(rng: random.Random, r: Obj) -> str:
    token = "0." + "0" * 18 + "1"
    r.get("attrs").set("speed", Raw(token))
    return f'mistyped field: attrs["speed"] (decimal(38,18), got a JSON number {token}: 19 decimal places, the scale is 18)'  # noqa: E501


def _map_integer_digits(rng: random.Random, r: Obj) -> str:
    token = "1" + "0" * 20
    r.get("attrs").set("load", token)
    return f'mistyped field: attrs["load"] (decimal(38,18), got a JSON string "{token}": 21 integer digits, at most 20)'


def _map_exponent(rng: random.Random, r: Obj) -> str:
    limits = Obj([("42", Raw("1E5"))])
    r.set("limits", limits)
    return 'mistyped field: limits["42"] (decimal(12,4), got a JSON number 1E5: exponent notation, write it as plain digits)'  # noqa: E501


def _map_bad_key(rng: random.Random, r: Obj) -> str:
    r.set("limits", Obj([("7", Raw("1.5")), ("x", Raw("2"))]))
    return 'mistyped field: limits["x"] (map key long, got "x")'


def _null_required_element(rng: random.Random, r: Obj) -> str:
    tags = ["ok", None, "cold"]
    r.get("device").set("tags", tags)
    return "null field: device.tags[1]"


def _null_item(rng: random.Random, r: Obj) -> str:
    items = _ensure_items(rng, r, 1)
    i = rng.randrange(len(items) + 1)
    items.insert(i, None)
    return f"null field: items[{i}]"


def _null_required_map_value(rng: random.Random, r: Obj) -> str:
    r.set("limits", Obj([("-5", Raw("1")), ("9223372036854775807", None)]))
    return 'null field: limits["9223372036854775807"]'


def _missing_nested(rng: random.Random, r: Obj) -> str:
    _origin(r).drop("host")
    return "missing field: meta.origin.host"


def _missing_in_list(rng: random.Random, r: Obj) -> str:
    items = _ensure_items(rng, r, 2)
    i = rng.randrange(len(items))
    items[i].drop("sku")
    return f"missing field: items[{i}].sku"


def _null_required_struct(rng: random.Random, r: Obj) -> str:
    r.set("reading", None)
    return "null field: reading"


def _missing_deep(rng: random.Random, r: Obj) -> str:
    _origin(r).get("rack").drop("row")
    return "missing field: meta.origin.rack.row"


def _out_of_range(rng: random.Random, r: Obj) -> str:
    _origin(r).get("rack").set("row", Raw("3000000000"))
    return "mistyped field: meta.origin.rack.row (int, got a JSON number 3000000000: out of range)"


def _slot_too_wide(rng: random.Random, r: Obj) -> str:
    token = "9" * 39
    _origin(r).get("rack").set("slot", token)
    shown = f'"{token}"'[:40]  # a reason shows a token's first 40 characters (docs/spec.md, "Field types")
    return f"mistyped field: meta.origin.rack.slot (decimal(38,0), got a JSON string {shown}: 39 integer digits, at most 38)"  # noqa: E501


def _bad_time(rng: random.Random, r: Obj) -> str:
    _origin(r).set("seen", "yesterday")
    return 'mistyped field: meta.origin.seen (timestamp, got a JSON string "yesterday": not an ISO-8601 time)'


def _broken_json(rng: random.Random, r: Obj) -> str:
    r.pairs.append(("meta", Raw('{"seq": ')))
    return "malformed JSON"


#: One fault each, of every nested kind, with the reason docs/spec.md's rule gives it.
MALFORMED: tuple[Callable[[random.Random, Obj], str], ...] = (
    _wrong_struct,
    _wrong_nested_struct,
    _wrong_list,
    _object_for_list,
    _wrong_map,
    _array_for_map,
    _bad_deep_element,
    _fraction_in_list_int,
    _price_not_a_number,
    _map_decimal_places,
    _map_integer_digits,
    _map_exponent,
    _map_bad_key,
    _null_required_element,
    _null_item,
    _null_required_map_value,
    _missing_nested,
    _missing_in_list,
    _null_required_struct,
    _missing_deep,
    _out_of_range,
    _slot_too_wide,
    _bad_time,
    _broken_json,
)


# ---------------------------------------------------------------------------------------------------- the stream


@dataclass(frozen=True)
class NestedRecord(OrderEvent):
    """A record of the nested topic: ``kind`` valid, late, malformed or tombstone; ``meant`` the reason the generator
    meant a malformed record to get (None for the others)."""

    meant: str | None = None


def nested_records(
    records: int,
    *,
    seed: int,
    partitions: int = 4,
    start_ms: int = DEFAULT_START_MS,
    malformed: float = 0.01,
    late: float = 0.005,
    tombstones: float = 0.003,
) -> list[NestedRecord]:
    """``records`` seeded records, keyed by device (so a device's records are in one partition, in order), event
    times rising by about :data:`SPACING_MS` each; every kind of :data:`MALFORMED` at least once when there are
    enough records. The next call should start after the last event time (``start_ms``)."""
    rng = random.Random(seed)
    seqs = dict.fromkeys(DEVICES, 0)
    out: list[NestedRecord] = []
    faults = list(MALFORMED)
    rng.shuffle(faults)
    now = start_ms
    for n in range(records):
        now += rng.randint(0, 2 * SPACING_MS)
        device = rng.choice(DEVICES)
        partition = zlib.crc32(device.encode()) % partitions
        key = device.encode()
        r = rng.random()
        if r < tombstones:
            out.append(NestedRecord(n, partition, key, None, "tombstone"))
            continue
        roll = rng.random()
        if roll < 0.1:
            seq = seqs[device] - rng.randint(1, 5)  # older than the device's latest: ignored once that applied
        elif roll < 0.2:
            seq = seqs[device]  # a tie: the later record wins
        else:
            seqs[device] += rng.randint(1, 3)
            seq = seqs[device]
        if rng.random() < 0.01 and seqs[device] < 2**62:
            seqs[device] += 2**62  # a huge version (once per device): the device's later ones go on from it
            seq = seqs[device]
        kind = "late" if n > records // 4 and rng.random() < late else "valid"
        ts = now - LATE_BY_MS if kind == "late" else now
        record = valid_record(rng, device, seq, ts, rng.choice(SITES))
        meant = None
        if r < tombstones + malformed or (faults and n >= records - len(faults) and records >= 4 * len(MALFORMED)):
            fault = faults.pop() if faults else rng.choice(MALFORMED)
            meant = fault(rng, record)
            kind = "malformed"
        value = dump(record, rng, compact=rng.random() < 0.5).encode()
        out.append(NestedRecord(n, partition, key, value, kind, ts, meant=meant))
    return out
