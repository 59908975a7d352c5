"""Nested fields read by docs/spec.md's "Nested fields" rule, on generated records three levels deep.

The oracle here is a separate fold of the generated record, written from the docs: a struct's fields by key
(unknown keys ignored), a list's elements in order (``[i]``), a map's entries (``["key"]``), a scalar leaf by the
top-level rule (``expected`` of test_record_decoder, itself written from the docs), and ``json`` as its canonical
text. The record's reason: every part that does not fit, in order, else the first required part missing or null.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from krishiv_core.spec import parse_spec
from spark_jobs.record_decoder import Decoding, RecordDecoder, read_record
from tests.spark_jobs.test_record_decoder import expected, number_tokens, tokens

#: The fields, as docs/spec.md writes them; the oracle walks ``TYPES`` below (the same, by hand).
FIELDS = {
    "id": "string",
    "r": {
        "type": "list",
        "required": False,
        "element": {
            "type": "struct",
            "fields": {
                "at": "timestamp_ms",
                "v": {"type": "decimal(38,10)", "required": False},
                "n": {"type": "list", "element": {"type": "long", "required": False}},
            },
        },
    },
    "m": {"type": "map", "key": "string", "value": "decimal(20,6)", "required": False},
    "s": {
        "type": "struct",
        "required": False,
        "fields": {
            "a": {
                "type": "struct",
                "fields": {
                    "b": {
                        "type": "struct",
                        "fields": {"c": "decimal(12,2)", "d": {"type": "string", "required": False}},
                    }
                },
            },
            "k": {"type": "int", "required": False},
        },
    },
    "j": {"type": "json", "required": False},
}
# The oracle's view: ("struct", {name: (type, required)}), ("list", (type, required)), ("map", (type, required)),
# "json", or a scalar's name.
LEAF_C = ("decimal(12,2)", True)
TYPES: dict[str, tuple[Any, bool]] = {
    "id": ("string", True),
    "r": (
        (
            "list",
            (
                (
                    "struct",
                    {
                        "at": ("timestamp_ms", True),
                        "v": ("decimal(38,10)", False),
                        "n": (("list", ("long", False)), True),
                    },
                ),
                True,
            ),
        ),
        False,
    ),
    "m": (("map", ("decimal(20,6)", True)), False),
    "s": (
        (
            "struct",
            {
                "a": (("struct", {"b": (("struct", {"c": LEAF_C, "d": ("string", False)}), True)}), True),
                "k": ("int", False),
            },
        ),
        False,
    ),
    "j": ("json", False),
}
PIPELINE = parse_spec(
    {"pipelines": [{"name": "p", "kind": "events", "topic": "t", "fields": FIELDS}]}, env={}
).pipelines[0]
MISSING = object()


class Raw(str):
    """A JSON token written as it is into the record."""


def render(tree: Any) -> str:
    """A generated tree as JSON text: dicts as objects (in their order), lists as arrays, ``Raw`` leaves as is."""
    if isinstance(tree, Raw):
        return str(tree)
    if isinstance(tree, list):
        return "[" + ", ".join(render(t) for t in tree) + "]"
    return "{" + ", ".join(f"{json.dumps(k)}: {render(v)}" for k, v in tree.items() if v is not MISSING) + "}"


def _kind_of(tree: Any) -> str:
    if isinstance(tree, Raw):
        v = json.loads(tree, parse_float=Decimal)
        return {str: "string", bool: "boolean", list: "array", dict: "object"}.get(type(v), "number")
    return "array" if isinstance(tree, list) else "object"


def canonical(tree: Any) -> str:
    """docs: no whitespace, keys sorted by code point (the last of a repeated key), numbers as written."""
    if isinstance(tree, Raw):
        v = json.loads(tree, parse_float=Decimal)
        return json.dumps(v, ensure_ascii=False) if isinstance(v, str) else str(tree).strip()
    if isinstance(tree, list):
        return "[" + ",".join(canonical(t) for t in tree) + "]"
    kept = {k: v for k, v in tree.items() if v is not MISSING}
    return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + canonical(kept[k]) for k in sorted(kept)) + "}"


def _shown_type(t: Any) -> str:
    if isinstance(t, str):
        return t
    kind, parts = t
    if kind == "struct":
        return (
            "struct<" + ", ".join(f"{n}: {_shown_type(pt)}" + ("" if r else "?") for n, (pt, r) in parts.items()) + ">"
        )
    pt, r = parts
    inner = _shown_type(pt) + ("" if r else "?")
    return f"list<{inner}>" if kind == "list" else f"map<string, {inner}>"


def fold(tree: Any, t: Any, path: str, mistyped: list[str], absent: list[str]) -> Any:
    """The docs' reading of a present, non-null part."""
    if t == "json":
        return canonical(tree)
    if isinstance(t, str):
        value, why = expected(str(tree), t)
        if why:
            mistyped.append(f"{path} {why}")
        if t == "timestamp_ms" and value is not None:
            value = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=value)
        return value
    kind, parts = t
    want = "array" if kind == "list" else "object"
    if _kind_of(tree) != want:
        got = {
            "string": f"a JSON string {str(tree)[:40]}",
            "boolean": f"a JSON boolean {tree}",
            "number": f"a JSON number {str(tree)[:40]}",
            "array": "a JSON array",
            "object": "a JSON object",
        }[_kind_of(tree)]
        mistyped.append(f"{path} ({_shown_type(t)}, got {got})")
        return None
    if kind == "struct":
        return fold_fields(tree, parts, path + ".", mistyped, absent)
    pt, required = parts
    items = list(enumerate(tree)) if kind == "list" else list(tree.items())
    out = []
    for k, sub in items:
        where = f"{path}[{k}]" if kind == "list" else f"{path}[{json.dumps(k, ensure_ascii=False)}]"
        if isinstance(sub, Raw) and sub == "null":
            if required:
                absent.append(f"null field: {where}")
            value = None
        else:
            value = fold(sub, pt, where, mistyped, absent)
        out.append(value if kind == "list" else (k, value))
    return out


def fold_fields(tree: dict, parts: dict, prefix: str, mistyped: list[str], absent: list[str]) -> dict:
    values = {}
    for name, (pt, required) in parts.items():
        sub = tree.get(name, MISSING)
        if sub is MISSING or (isinstance(sub, Raw) and sub == "null"):
            if required:
                absent.append(f"{'missing' if sub is MISSING else 'null'} field: {prefix}{name}")
            values[name] = None
            continue
        values[name] = fold(sub, pt, prefix + name, mistyped, absent)
    return values


def oracle(tree: dict) -> tuple[str | None, dict]:
    mistyped: list[str] = []
    absent: list[str] = []
    values = fold_fields(tree, TYPES, "", mistyped, absent)
    if mistyped:
        return "mistyped field: " + ", ".join(mistyped), {}
    if absent:
        return absent[0], {}
    return None, values


# --- generated records: mostly valid, every kind of mistake somewhere ------------------------------------------

decimal_tokens = st.one_of(
    number_tokens(), number_tokens().map(json.dumps), st.sampled_from(['"-0.00"', "0.5", '"007.10"'])
)
json_values = st.recursive(
    st.one_of(
        st.sampled_from(["1", "2.50", "1e5", "-0", '"é\\n"', "true", "null", '"\\u00e9"']).map(Raw),
        number_tokens().map(Raw),
    ),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["b", "a", "é", "A", "aa"]), inner, max_size=3)
    ),
    max_leaves=8,
)


def maybe(strategy: st.SearchStrategy, *odd: str, missing: bool = True) -> st.SearchStrategy:
    """Mostly ``strategy``; sometimes null, missing (in an object), or another JSON kind."""
    others = [Raw("null"), *([MISSING] if missing else []), *map(Raw, odd)]
    return st.one_of(*[strategy] * 40, st.sampled_from(others))


def leaf(kind: str, missing: bool = True) -> st.SearchStrategy:
    if kind == "decimal":
        return maybe(decimal_tokens.map(Raw), '"x"', "true")
    if kind == "long":
        return maybe(
            st.one_of(number_tokens(), *[st.integers(-(2**31), 2**31).map(str)] * 4).map(Raw), '"5"', missing=missing
        )
    if kind == "ms":
        return maybe(st.integers(-62135596800000, 253402300799999).map(str).map(Raw), "1.5", '"2026-01-01"')
    if kind == "string":
        return maybe(st.text('abé"\\', max_size=4).map(json.dumps).map(Raw), "5")
    return maybe(tokens().map(Raw))  # pragma: no cover - every leaf kind is named


reading = st.fixed_dictionaries(
    {"at": leaf("ms"), "v": leaf("decimal"), "n": maybe(st.lists(leaf("long", missing=False), max_size=3), "{}")},
    optional={"zz": st.just(Raw("1"))},  # an unknown key: ignored
)
records = st.fixed_dictionaries(
    {
        "id": maybe(st.text("abc", min_size=1, max_size=3).map(json.dumps).map(Raw), "7"),
        "r": maybe(st.lists(maybe(reading, '"r"', missing=False), max_size=3), '{"at": 1}'),
        "m": maybe(
            st.dictionaries(st.sampled_from(["speed", "é", "a b", ""]), leaf("decimal"), max_size=3).map(
                lambda d: {k: v for k, v in d.items() if v is not MISSING}
            ),
            "[]",
        ),
        "s": maybe(
            st.fixed_dictionaries(
                {
                    "a": maybe(
                        st.fixed_dictionaries(
                            {"b": maybe(st.fixed_dictionaries({"c": leaf("decimal"), "d": leaf("string")}), "[1]")}
                        ),
                        '"a"',
                    ),
                    "k": maybe(st.integers(-(2**31), 2**31 - 1).map(str).map(Raw), "2147483648", "1.0"),
                }
            ),
            "3",
        ),
        "j": maybe(json_values),
    }
)


def _rows(values: list[bytes]) -> list[dict]:
    n = len(values)
    decoding = Decoding.of(PIPELINE)
    batch = RecordDecoder(decoding).decode([None] * n, values, "t", 0, list(range(n)), [0] * n)
    assert batch.schema == decoding.arrow_schema()
    return batch.to_pylist()


def _comparable(value: Any) -> Any:
    """Arrow's values as the oracle writes them (a map as its (key, value) pairs, times in UTC)."""
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_comparable(v) for v in value)
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return value


@settings(max_examples=300, deadline=None)
@given(batch=st.lists(records, min_size=1, max_size=30))
def test_generated_nested_records_are_read_by_the_documented_rule(batch):
    values = [render(r).encode() for r in batch]
    rows = _rows(values)
    for tree, value, row in zip(batch, values, rows, strict=True):
        reason, want = oracle(tree)
        assert row["reason"] == reason, value
        if reason is None:
            got = {k: _comparable(row[k]) for k in TYPES}
            assert got == _comparable(want), value
        rule = read_record(value, Decoding.of(PIPELINE))
        assert rule.reason == reason, "the rule alone reads it as a batch does"


def test_the_docs_examples():
    fields = {
        "gps": {"type": "struct", "fields": {"lat": "double", "lon": "double"}},
        "tags": {"type": "list", "element": "string"},
        "readings": {
            "type": "list",
            "required": False,
            "element": {"type": "struct", "fields": {"value": "decimal(20,6)"}},
        },
        "attrs": {"type": "map", "key": "long", "value": {"type": "long", "required": False}, "required": False},
        "extra": {"type": "json", "required": False},
    }
    pipeline = parse_spec(
        {"pipelines": [{"name": "p", "kind": "events", "topic": "t", "fields": fields}]}, env={}
    ).pipelines[0]
    records = [
        b'{"gps": {"lat": 52.1, "lon": 4.3}, "tags": [], '
        b'"readings": [{"value": "1"}, {"value": 2}, {"value": 1.0000001}]}',
        b'{"gps": {"lat": 52.1, "lon": 4.3}, "tags": [null]}',
        b'{"gps": {"lon": 4.3}, "tags": []}',
        b'{"gps": "52.1,4.3", "tags": {}}',
        b'{"gps": {}, "tags": [], "attrs": {"1": null, "x": 2, "-3": 4}}',
        b'{"gps": {"lat": 1, "lon": 2}, "tags": [], "attrs": {"1": null, "x": 2, "-3": 4}}',  # the key alone
        b'{"gps": {"lat": 1, "lon": 2, "alt": 3}, "tags": ["a"], "attrs": {}, '
        b'"extra": {"b": [1, 2.50, 1e5], "a": "\xc3\xa9\\n", "a": {"z": null}}}',
    ]
    n = len(records)
    rows = RecordDecoder(Decoding.of(pipeline)).decode([None] * n, records, "t", 0, list(range(n)), [0] * n).to_pylist()
    assert [r["reason"] for r in rows] == [
        "mistyped field: readings[2].value (decimal(20,6), got a JSON number 1.0000001: "
        "7 decimal places, the scale is 6)",
        "null field: tags[0]",
        "missing field: gps.lat",
        'mistyped field: gps (struct<lat: double, lon: double>, got a JSON string "52.1,4.3"), '
        "tags (list<string>, got a JSON object)",
        'mistyped field: attrs["x"] (map key long, got "x")',
        'mistyped field: attrs["x"] (map key long, got "x")',
        None,
    ]
    last = rows[-1]
    assert last["gps"] == {"lat": 1.0, "lon": 2.0} and last["tags"] == ["a"] and last["attrs"] == []
    assert last["extra"] == '{"a":{"z":null},"b":[1,2.50,1e5]}'


def _random_record(rng: random.Random) -> dict:
    """A record valid by construction but for one mistake in about every fifth (an edge value somewhere)."""

    def decimal(p: int, s: int) -> Raw:
        whole = str(rng.randrange(10 ** rng.randint(0, p - s)))
        text = whole + ("." + str(rng.randrange(10**s)).zfill(s) if s and rng.random() < 0.7 else "")
        text = ("-" if rng.random() < 0.3 else "") + text
        return Raw(json.dumps(text) if rng.random() < 0.3 else text)

    record: dict[str, Any] = {"id": Raw(json.dumps(rng.choice(["a", "é", 'x"y'])))}
    if rng.random() < 0.8:
        record["r"] = [
            {
                "at": Raw(str(rng.randint(-62135596800000, 253402300799999))),
                "v": decimal(38, 10) if rng.random() < 0.8 else Raw("null"),
                "n": [
                    Raw(str(rng.randint(-(2**63), 2**63 - 1))) if rng.random() < 0.9 else Raw("null")
                    for _ in range(rng.randint(0, 3))
                ],
            }
            for _ in range(rng.randint(0, 3))
        ]
    if rng.random() < 0.8:
        record["m"] = {rng.choice(["speed", "é", "", "a b"]): decimal(20, 6) for _ in range(rng.randint(0, 3))}
    if rng.random() < 0.8:
        record["s"] = {
            "a": {"b": {"c": decimal(12, 2), "d": Raw('"d"') if rng.random() < 0.5 else Raw("null")}},
            "k": Raw(str(rng.randint(-(2**31), 2**31 - 1))),
        }
    if rng.random() < 0.5:
        record["j"] = {"b": [Raw("1"), Raw("2.50")], "a": {"é": Raw("1e5")}}
    if rng.random() < 0.2:  # one mistake, somewhere
        mistake = rng.choice(["decimal", "kind", "null", "missing", "range"])
        if mistake == "decimal" and "s" in record:
            record["s"]["a"]["b"]["c"] = Raw("1.005")
        elif mistake == "kind" and record.get("r"):
            record["r"][0] = Raw('"r"')
        elif mistake == "null" and record.get("r") and record["r"][0] is not None:
            record["r"][0]["at"] = Raw("null")
        elif mistake == "missing" and "s" in record:
            del record["s"]["a"]["b"]["c"]
        elif mistake == "range" and "s" in record:
            record["s"]["k"] = Raw("2147483648")
    return record


def test_seeded_records_mostly_valid_take_the_fast_path_and_read_as_the_rule_says():
    rng = random.Random(36)
    trees = [_random_record(rng) for _ in range(3000)]
    values = [render(t).encode() for t in trees]
    rows = _rows(values)
    valid = 0
    for tree, value, row in zip(trees, values, rows, strict=True):
        reason, want = oracle(tree)
        assert row["reason"] == reason, value
        if reason is None:
            valid += 1
            assert {k: _comparable(row[k]) for k in TYPES} == _comparable(want), value
    assert 0.7 < valid / len(trees) < 0.95
