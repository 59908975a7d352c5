"""Every field type read exactly, by the one rule of docs/spec.md's "Field types", on generated values at the edges.

The expected reading of a JSON token is computed here from the rule, with Python's ``json`` (numbers as
``Decimal``) and ``Decimal`` arithmetic, never by the implementation; each property decodes its generated records
as the source's tasks do (:class:`spark_jobs.record_decoder.RecordDecoder`, one Arrow batch per partition), and the
last test reads edge values through the real broker, Spark's source and a catalog.
"""

from __future__ import annotations

import json
import re
from datetime import date, datetime
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from krishiv_core.spec import parse_spec
from spark_jobs.record_decoder import Decoding, RecordDecoder, read_record

FIELDS = {
    "s": "string",
    "l": "long",
    "i": "int",
    "x": "double",
    "b": "boolean",
    "ms": "timestamp_ms",
    "a": "decimal(12,2)",
    "c": "decimal(20,4)",
    "e": "decimal(30,12)",
    "g": "decimal(38,0)",
    "f": "decimal(4,4)",
}
PIPELINE = parse_spec(
    {
        "pipelines": [
            {
                "name": "p",
                "kind": "events",
                "topic": "t",
                "fields": {n: {"type": t, "required": False} for n, t in FIELDS.items()},
            }
        ]
    },
    env={},
).pipelines[0]
RANGES = {
    "long": (-(2**63), 2**63 - 1),
    "int": (-(2**31), 2**31 - 1),
    "timestamp_ms": (-62135596800000, 253402300799999),
}
PLAIN = re.compile(r"-?[0-9]+(\.[0-9]+)?")
EXPONENT = re.compile(r"-?[0-9]+(\.[0-9]+)?[eE][+-]?[0-9]+")


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _decimal_why(digits: str, p: int, s: int) -> str | None:
    """Why plain ``digits`` do not fit decimal(p,s) exactly (None when they do)."""
    whole, _, fraction = digits.lstrip("-").partition(".")
    whole, fraction = whole.lstrip("0"), fraction.rstrip("0")
    if len(fraction) > s:
        return f"{_plural(len(fraction), 'decimal place')}, the scale is {s}"
    if len(whole) > p - s:
        return f"{_plural(len(whole), 'integer digit')}, at most {p - s}"
    return None


def expected(token: str, type_name: str) -> tuple[object, str | None]:
    """(the stored value, None) or (None, the mistyped text) for a JSON ``token`` in a field of ``type_name``."""
    v = json.loads(token, parse_float=Decimal)
    if v is None:
        return None, None
    if isinstance(v, str):
        got = f"a JSON string {json.dumps(v)[:40]}"
    elif isinstance(v, bool):
        got = f"a JSON boolean {json.dumps(v)}"
    elif isinstance(v, list):
        got = "a JSON array"
    elif isinstance(v, dict):
        got = "a JSON object"
    else:
        got = f"a JSON number {token[:40]}"
    number = isinstance(v, (int, Decimal)) and not isinstance(v, bool)
    exponent = number and "e" in token.lower()
    why = None
    if type_name == "string" and isinstance(v, str):
        return v, None
    if type_name in RANGES and number:
        low, high = RANGES[type_name]
        if isinstance(v, int) and low <= v <= high:
            return v, None
        why = "exponent notation" if exponent else "not an integer" if "." in token else "out of range"
    if type_name == "double" and number:
        return float(token), None
    if type_name == "boolean" and isinstance(v, bool):
        return v, None
    if type_name.startswith("decimal"):
        p, s = (int(n) for n in type_name[len("decimal(") : -1].split(","))
        digits = token if number else v if isinstance(v, str) else None
        if digits is not None:
            if exponent or (isinstance(v, str) and EXPONENT.fullmatch(v)):
                why = "exponent notation, write it as plain digits"
            elif not PLAIN.fullmatch(digits):
                why = "not a number"
            else:
                why = _decimal_why(digits, p, s)
                if why is None:
                    return Decimal(digits), None
    return None, f"({type_name}, got {got}" + (f": {why})" if why else ")")


def _decode(pipeline, values: list[bytes | None], keys: list[bytes | None] | None = None) -> list[dict]:
    """The rows the source hands Spark for these Kafka values (one partition, offsets from 0)."""
    n = len(values)
    batch = RecordDecoder(Decoding.of(pipeline)).decode(keys or [None] * n, values, "t", 0, list(range(n)), [0] * n)
    assert batch.schema == Decoding.of(pipeline).arrow_schema()
    return batch.to_pylist()


def _millis(value: object) -> object:
    return int(value.timestamp() * 1000) if isinstance(value, datetime) else value


def _read(records: list[tuple[str, str]]) -> list[tuple[object, str | None]]:
    """Decode ``{"<field>": <token>}`` records in one batch: (the field's value, the reason) of each."""
    rows = _decode(PIPELINE, [f'{{"{name}": {token}}}'.encode() for name, token in records])
    return [(_millis(row[name]), row["reason"]) for (name, _), row in zip(records, rows, strict=True)]


def _check(records: list[tuple[str, str]]) -> list[tuple[object, str | None]]:
    got = _read(records)
    for (name, token), (value, reason) in zip(records, got, strict=True):
        want_value, why = expected(token, FIELDS[name])
        want_reason = f"mistyped field: {name} {why}" if why else None
        assert (reason, value) == (want_reason, want_value), f"{name} = {token}"
        if isinstance(want_value, Decimal):
            assert value.as_tuple().exponent == -int(FIELDS[name].split(",")[1][:-1]), "stored at the column's scale"
    return got


def _digits(draw, most: int) -> str:
    return draw(st.text("0123456789", min_size=1, max_size=most))


@st.composite
def number_tokens(draw) -> str:
    """JSON numbers around the edges: integers at the ranges' ends, plain decimals of 1-45 digits with trailing
    zeros, exponent notation."""
    sign = draw(st.sampled_from(["", "-"]))
    kind = draw(st.sampled_from(["edge", "integer", "plain", "exponent"]))
    if kind == "edge":
        edge = draw(st.sampled_from([b for r in RANGES.values() for b in r] + [10**k for k in (10, 18, 19, 38, 39)]))
        return str(edge + draw(st.integers(-2, 2)))
    whole = str(int(_digits(draw, draw(st.sampled_from([1, 3, 10, 11, 19, 26, 38, 40])))))  # no leading zeros
    if kind == "integer":
        return sign + whole
    fraction = _digits(draw, draw(st.sampled_from([1, 2, 4, 5, 12, 13, 40]))) + "0" * draw(st.integers(0, 3))
    if kind == "plain":
        return f"{sign}{whole}.{fraction}"
    mantissa = whole[:3] + draw(st.sampled_from(["", "." + fraction[:3]]))
    return f"{sign}{mantissa}{draw(st.sampled_from(['e', 'E', 'e+', 'e-']))}{draw(st.integers(0, 20))}"


def tokens() -> st.SearchStrategy[str]:
    return st.one_of(
        number_tokens(),
        number_tokens().map(lambda t: json.dumps(t)),  # a number sent as a string
        st.text("abcxyz .-_019", max_size=12).map(json.dumps),
        st.sampled_from(["true", "false", "null", "[1, 2]", '{"k": 1}', "[]", '""']),
    )


@settings(max_examples=200, deadline=None)
@given(records=st.lists(st.tuples(st.sampled_from(sorted(FIELDS)), tokens()), min_size=1, max_size=60))
def test_generated_values_of_every_type_are_read_by_the_rule(records):
    _check(records)


@settings(max_examples=200, deadline=None)
@given(
    records=st.lists(
        st.dictionaries(st.sampled_from(sorted(FIELDS)), number_tokens().map(json.dumps) | tokens(), max_size=6),
        min_size=1,
        max_size=40,
    )
)
def test_the_fast_path_reads_every_record_as_the_rule_does(records):
    """Records of several fields, most of them valid: whichever path decodes a record, it is read as the rule alone
    reads it (:func:`read_record`), and a batch of them reads as each record alone."""
    values = [("{" + ", ".join(f'"{k}": {v}' for k, v in r.items()) + "}").encode() for r in records]
    decoding = Decoding.of(PIPELINE)
    rows = _decode(PIPELINE, values)
    for value, row in zip(values, rows, strict=True):
        rule = read_record(value, decoding)
        assert row["reason"] == rule.reason
        assert {k: _millis(row[k]) for k in FIELDS if row[k] is not None} == (
            {k: v for k, v in rule.values.items() if v is not None} if rule.reason is None else {}
        )
        assert _decode(PIPELINE, [value]) == [{**row, "offset": 0}]


def test_the_issues_examples_are_exact():
    records = [
        ("a", "9999999999.99"),
        ("c", "10000000.5"),
        ("c", "0.0001"),
        ("e", "123456.123456789012"),
        ("s", "5"),
        ("a", "1.005"),
        ("a", "99999999999"),
        ("a", "1e5"),
        ("a", '"1.50"'),
        ("i", "3000000000"),
        ("i", "1.0"),
        ("l", '"12"'),
        ("x", '"NaN"'),
        ("b", "1"),
        ("ms", "1767225600000"),
        ("ms", "253402300800000"),
    ]
    got = dict(enumerate(_check(records)))
    assert got[3] == (Decimal("123456.123456789012"), None)
    assert got[4] == (None, "mistyped field: s (string, got a JSON number 5)")
    assert got[5][1] == "mistyped field: a (decimal(12,2), got a JSON number 1.005: 3 decimal places, the scale is 2)"
    assert (
        got[6][1] == "mistyped field: a (decimal(12,2), got a JSON number 99999999999: 11 integer digits, at most 10)"
    )
    assert got[9][1] == "mistyped field: i (int, got a JSON number 3000000000: out of range)"


@pytest.mark.parametrize(
    ("token", "reason", "millis"),
    [
        ('"2026-01-01T00:00:00Z"', None, 1_767_225_600_000),
        ('"2026-01-01T05:30:00+05:30"', None, 1_767_225_600_000),
        ('"2026-01-01 00:00:00.250"', None, 1_767_225_600_250),  # no offset: UTC
        ('"2026-01-01"', None, 1_767_225_600_000),
        ('"yesterday"', 'mistyped field: t (timestamp, got a JSON string "yesterday": not an ISO-8601 time)', None),
        ("1767225600000", "mistyped field: t (timestamp, got a JSON number 1767225600000)", None),
    ],
)
def test_timestamps_are_iso_8601_strings(token, reason, millis):
    pipeline = parse_spec(
        {"pipelines": [{"name": "p", "kind": "events", "topic": "t", "fields": {"t": "timestamp"}}]}, env={}
    ).pipelines[0]
    row = _decode(pipeline, [f'{{"t": {token}}}'.encode()])[0]
    assert (row["reason"], _millis(row["t"])) == (reason, millis)


@pytest.mark.parametrize(
    ("tokens", "reasons", "days"),
    [
        (['"2026-11-26"', "null"], [None, None], [date(2026, 11, 26), None]),  # the fast path
        (
            ['"2026-11-26"', '"2026-13-01"'],
            [None, 'mistyped field: d (date, got a JSON string "2026-13-01": not an ISO-8601 date)'],
            [date(2026, 11, 26), None],
        ),
        (['"0001-01-01"', "20000"], [None, "mistyped field: d (date, got a JSON number 20000)"], [date(1, 1, 1), None]),
    ],
)
def test_dates_are_iso_8601_date_strings(tokens, reasons, days):
    pipeline = parse_spec(
        {
            "pipelines": [
                {"name": "p", "kind": "events", "topic": "t", "fields": {"d": {"type": "date", "required": False}}}
            ]
        },
        env={},
    ).pipelines[0]
    rows = _decode(pipeline, [f'{{"d": {token}}}'.encode() for token in tokens])
    assert [(r["reason"], r["d"]) for r in rows] == list(zip(reasons, days, strict=True))


def test_required_fields_and_whole_records_are_named_in_spec_order():
    pipeline = parse_spec(
        {
            "pipelines": [
                {
                    "name": "p",
                    "kind": "events",
                    "topic": "t",
                    "fields": {"a": "decimal(4,2)", "b": "long", "c": {"type": "string", "required": False}},
                }
            ]
        },
        env={},
    ).pipelines[0]
    values = {
        b'{"a": "1.5", "b": 2}': None,
        b'{"a": 1.5, "b": 2, "c": null}': None,
        b'  {"b": 2, "a": 1.5}\n': None,
        b'{"b": 2}': "missing field: a",
        b'{"a": null, "b": null}': "null field: a",
        b'{"a": 1, "b": null}': "null field: b",
        b'{"a": 1, "b": 1, "b": "x"}': 'mistyped field: b (long, got a JSON string "x")',  # the last of a key wins
        b'{"a": 1e2, "c": 5}': (
            "mistyped field: a (decimal(4,2), got a JSON number 1e2: exponent notation, write it as plain digits), "
            "c (string, got a JSON number 5)"
        ),
        b'{"a": 1, "b": 2} {"a": 1}': "malformed JSON",
        b"[1, 2]": "malformed JSON",
        b'{"a": "\xff", "b": 1}': "malformed JSON",
        b"": "malformed JSON",
        None: "null value",
    }
    rows = _decode(pipeline, list(values))
    assert [r["reason"] for r in rows] == list(values.values())
    assert [r["value"] for r in rows] == [None if why is None else v for v, why in values.items()], "rejects only"
    assert [(r["a"], r["b"]) for r in rows[:3]] == [(Decimal("1.50"), 2)] * 3


def test_every_batch_has_the_declared_schema_even_empty():
    decoder = RecordDecoder(Decoding.of(PIPELINE))
    empty = decoder.decode([], [], "t", 0, [], [])
    assert empty.num_rows == 0 and empty.schema == decoder.schema
    option = Decoding.of(PIPELINE).to_option()
    assert Decoding.from_option(option) == Decoding.of(PIPELINE)


def test_a_tombstone_key_is_read_by_the_same_rule():
    from spark_jobs.record_decoder import TOMBSTONE

    pipeline = parse_spec(
        {
            "pipelines": [
                {"name": "p", "kind": "upsert", "topic": "t", "key": ["id"], "fields": {"id": "long", "v": "string"}}
            ]
        },
        env={},
    ).pipelines[0]
    keys = [b"7", b"1.5", b'"7"', b"9223372036854775808", b"seven", None]
    rows = _decode(pipeline, [None] * len(keys), keys)
    without = "tombstone without a key: expected the Kafka key to hold id"
    assert [(r["id"], r[TOMBSTONE], r["reason"]) for r in rows] == [
        (7, True, None),
        (None, True, "mistyped field: id (long, got a JSON number 1.5: not an integer)"),
        (None, True, 'mistyped field: id (long, got a JSON string "7")'),
        (None, True, "mistyped field: id (long, got a JSON number 9223372036854775808: out of range)"),
        (None, True, without),
        (None, True, without),
    ]


E2E_SPEC = """
[[pipelines]]
name = "orders"
kind = "events"
topic = "{topic}"
kafka_metadata = ["partition", "offset"]
max_records_per_batch = 1000

[pipelines.fields]
id = "string"
region = "string"
amount = "decimal(12,2)"
big = "decimal(20,4)"
fine = "decimal(30,12)"
n = "int"
"""


def test_edge_values_reach_the_table_exactly_and_rejects_say_why(tmp_path, broker, spark, topic):
    """Through the real broker, Spark and a SQLite catalog: decimals stored digit for digit, rejects' reasons."""
    from chaos.workspace import SETTINGS_TEMPLATE
    from krishiv.operations import commit_pipelines, run_pipelines
    from krishiv.produce import OrderEvent, ensure_topic, produce
    from krishiv_core.catalog import load_catalog, qualified
    from krishiv_core.spec import load_spec

    path = tmp_path / "krishiv.toml"
    path.write_text(
        (SETTINGS_TEMPLATE + E2E_SPEC).format(
            bootstrap=broker.bootstrap, partitions=1, catalog_uri="sqlite:///catalog.db", warehouse="w", topic=topic
        )
    )
    spec = load_spec(path, env={})
    good = {"region": '"eu"', "amount": "1.00", "big": "1", "fine": "1", "n": "1"}
    records = [  # (id, the fields that differ from ``good``)
        ("max", {"amount": "9999999999.99", "big": "10000000.5", "fine": "123456.123456789012", "n": "2147483647"}),
        ("small", {"amount": '"0.10"', "big": "0.0001", "fine": '"-0.000000000001"', "n": "-2147483648"}),
        (
            "wide",
            {"amount": "-9999999999.99", "big": "9999999999999999.9999", "fine": "999999999999999999.999999999999"},
        ),
        ("zeros", {"amount": "12.3000000", "big": "0.00000", "fine": "-0"}),
        ("region", {"region": "5"}),
        ("scale", {"amount": "1.005"}),
        ("digits", {"amount": "99999999999"}),
        ("exponent", {"big": "1e5"}),
        ("range", {"n": "3000000000"}),
        ("fraction", {"n": "1.0"}),
    ]
    values = []
    for record_id, fields in records:
        doc = {**good, **fields}
        values.append("{" + ", ".join([f'"id": "{record_id}"'] + [f'"{k}": {v}' for k, v in doc.items()]) + "}")
    ensure_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, [OrderEvent(n, 0, b"k", v.encode(), "valid") for n, v in enumerate(values)])
    run_pipelines(spec, list(spec.pipelines), once=True)
    commit_pipelines(spec, list(spec.pipelines))

    catalog = load_catalog(spec)
    table = catalog.load_table(qualified(spec, "orders")).scan().to_arrow().to_pylist()
    rejects = catalog.load_table(qualified(spec, "orders_rejects")).scan().to_arrow().to_pylist()
    want_rows, want_rejects = {}, {}
    for offset, (record_id, fields) in enumerate(records):
        doc = {**good, **fields}
        read = {k: expected(v, FIELDS_OF_E2E[k]) for k, v in doc.items()}
        whys = [f"{k} {why}" for k, (_, why) in read.items() if why]
        if whys:
            want_rejects[offset] = "mistyped field: " + ", ".join(whys)
        else:
            want_rows[record_id] = {k: value for k, (value, _) in read.items()}
    assert {r["offset"]: r["reason"] for r in rejects} == want_rejects
    got = {r["id"]: {k: r[k] for k in FIELDS_OF_E2E} for r in table}
    assert got == want_rows
    for r in table:  # stored at the column's scale
        assert [r[k].as_tuple().exponent for k in ("amount", "big", "fine")] == [-2, -4, -12]
    assert str(got["max"]["fine"]) == "123456.123456789012"
    assert str(got["max"]["amount"]) == "9999999999.99"
    assert str(got["small"]["big"]) == "0.0001"
    assert str(got["max"]["big"]) == "10000000.5000"
    assert str(got["wide"]["fine"]) == "999999999999999999.999999999999"


FIELDS_OF_E2E = {
    "region": "string",
    "amount": "decimal(12,2)",
    "big": "decimal(20,4)",
    "fine": "decimal(30,12)",
    "n": "int",
}
