"""The nested field rule for values a deserializer already decoded (``spark_jobs.value_reading``), against
docs/spec.md "Nested fields": the expected values and reasons are written here from the rule, by the generator that
makes each value, never by the code under test."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from krishiv_core.spec_types import EventField, FieldType
from spark_jobs.value_reading import canonical_json, read_row, read_value

DOUBLE, LONG, STRING = FieldType("double"), FieldType("long"), FieldType("string")


def _struct(**fields: Any) -> FieldType:
    return FieldType(
        "struct", fields=tuple(f if isinstance(f, EventField) else EventField(n, f) for n, f in fields.items())
    )


def _list(element: FieldType, required: bool = True) -> FieldType:
    return FieldType("list", element=EventField("element", element, required))


def _map(key: FieldType, value: FieldType, required: bool = True) -> FieldType:
    return FieldType("map", key=key, element=EventField("value", value, required))


GPS = FieldType(
    "struct",
    fields=(EventField("lat", DOUBLE), EventField("lon", DOUBLE), EventField("alt", DOUBLE, required=False)),
)


def _problems(value: Any, t: FieldType, path: str) -> list[tuple[str, str, str]]:
    return [(p.kind, p.path, p.why) for p in read_value(value, t, path)[1]]


def test_a_struct_is_read_from_a_mapping_unknown_keys_ignored_an_optional_field_null() -> None:
    read, problems = read_value({"lat": 52.1, "lon": 4, "speed": "x"}, GPS, "gps")
    assert (read, problems) == ({"lat": 52.1, "lon": 4.0, "alt": None}, [])
    assert _problems({}, GPS, "gps") == [("missing", "gps.lat", ""), ("missing", "gps.lon", "")]
    assert _problems({"lat": None, "lon": 1.0}, GPS, "gps") == [("null", "gps.lat", "")]
    assert _problems({"lat": "52.1", "lon": 1.0}, GPS, "gps") == [("mistyped", "gps.lat", "(double, got string 52.1)")]
    assert _problems("52.1,4.3", GPS, "gps") == [
        ("mistyped", "gps", "(struct<lat: double, lon: double, alt: double?>, got string 52.1,4.3)")
    ]


def test_a_list_keeps_its_order_an_empty_list_is_not_null_a_null_element_only_where_optional() -> None:
    assert read_value([], _list(STRING), "tags") == ([], [])
    assert read_value(("a", "b"), _list(STRING), "tags") == (["a", "b"], [])
    assert _problems(["a", None, 3], _list(STRING), "tags") == [
        ("null", "tags[1]", ""),
        ("mistyped", "tags[2]", "(string, got integer 3)"),
    ]
    assert read_value(["a", None], _list(STRING, required=False), "tags") == (["a", None], [])
    assert _problems({"a": 1}, _list(STRING), "tags")[0][:2] == ("mistyped", "tags")


def test_a_map_reads_each_key_by_the_key_type_and_each_value_by_the_value_type() -> None:
    decimals = _map(STRING, FieldType("decimal", 38, 10), required=False)
    read, problems = read_value({"speed": Decimal("1.5"), "fuel": 7, "none": None}, decimals, "attrs")
    assert problems == []
    assert read == [("speed", Decimal("1.5000000000")), ("fuel", Decimal("7.0000000000")), ("none", None)]
    assert _problems({"speed": Decimal("0.00000000001")}, decimals, "attrs") == [
        ("mistyped", 'attrs["speed"]', "(decimal(38,10), got decimal 1E-11: 11 decimal places, the scale is 10)")
    ]
    assert _problems({"speed": None}, _map(STRING, DOUBLE), "attrs") == [("null", 'attrs["speed"]', "")]
    longs = _map(LONG, STRING)
    assert read_value({"1": "a", 2: "b"}, longs, "m") == ([(1, "a"), (2, "b")], [])
    assert _problems({"x": "a"}, longs, "m") == [("mistyped", 'm["x"]', '(map key long, got "x")')]
    assert _problems({"1.5": "a"}, longs, "m")[0][:2] == ("mistyped", 'm["1.5"]')
    # a key given twice (two texts of one long) counts once, the last
    assert read_value({"1": "a", "01": "b"}, longs, "m") == ([(1, "b")], [])
    assert read_value({"2024-01-02": 1}, _map(FieldType("date"), LONG), "d")[0][0][0].isoformat() == "2024-01-02"


JSON_TEXTS = [
    ({"b": 1, "a": [True, None, 'é\n"\\']}, '{"a":[true,null,"é\\n\\"\\\\"],"b":1}'),
    ('{ "b" : 1.000 , "a" : 1e400 }', '{"a":1e400,"b":1.000}'),  # numbers as written, never through a double
    ('{"k": 1, "k": 2}', '{"k":2}'),  # a key given twice keeps the last
    ("[]", "[]"),
    ('"text"', '"text"'),
    (Decimal("123456789012345678901234567890.123456789"), "123456789012345678901234567890.123456789"),
    (Decimal("1E+2"), "100"),
    ({"z": {"y": [1, {"b": 2, "a": 1}]}}, '{"z":{"y":[1,{"a":1,"b":2}]}}'),
    ({"\u00e9": 1, "e": 2, "\U0001f600": 3}, '{"e":2,"\u00e9":1,"\U0001f600":3}'),  # keys by code point
    ({"ctl": "\x01\x7f\u2028"}, '{"ctl":"\\u0001\x7f\u2028"}'),  # only control characters escaped
]


def test_json_is_kept_as_its_canonical_text() -> None:
    for value, text in JSON_TEXTS:
        assert canonical_json(value) == (text, None), value
        assert read_value(value, FieldType("json"), "extra") == (text, [])
    for bad in ("not json", '{"a": NaN}', float("nan"), {1: "a"}, b"bytes", '{"a": 1'):
        _, problems = read_value(bad, FieldType("json"), "extra")
        assert len(problems) == 1 and problems[0].path == "extra" and problems[0].why.startswith("(json, got ")


def test_binary_is_bytes_or_their_base64() -> None:
    binary = FieldType("binary")
    assert read_value(b"\x00\xff", binary, "b") == (b"\x00\xff", [])
    assert read_value(bytearray(b"ab"), binary, "b") == (b"ab", [])
    assert read_value("AP8=", binary, "b") == (b"\x00\xff", [])
    assert _problems("not base64!", binary, "b") == [("mistyped", "b", "(binary, got string not base64!: not base64)")]


def test_a_row_reason_is_every_mistyped_part_else_the_first_missing_or_null_one() -> None:
    fields = [EventField("gps", GPS), EventField("tags", _list(STRING)), EventField("n", LONG, required=False)]
    required = {"gps", "tags"}
    assert read_row({"gps": {"lon": 1.0}, "tags": [None]}, fields, required).reason == "missing field: gps.lat"
    bad = {"gps": {"lat": "x", "lon": 1.0}, "tags": [None, 1], "n": "7"}
    assert read_row(bad, fields, required).reason == (
        "mistyped field: gps.lat (double, got string x), tags[1] (string, got integer 1), n (long, got string 7)"
    )
    assert read_row({"tags": []}, fields, required).reason == "missing field: gps"
    optional_gps = [EventField("gps", GPS, required=False), fields[1]]
    reading = read_row({"gps": None, "tags": []}, optional_gps, {"tags"})
    assert (reading.reason, reading.values) == (None, {"gps": None, "tags": []})
    # a dotted path named required (a nested event time) is required even where the type says optional
    assert (
        read_row({"gps": {"lat": 1.0, "lon": 2.0}, "tags": []}, fields, {"gps.alt"}).reason == "missing field: gps.alt"
    )


# --- generated values at depth: each valid one reads back as the rule says, one defect is named by its path --------


_DECIMAL = FieldType("decimal", 38, 6)


def _type(data: st.DataObject, depth: int) -> FieldType:
    kinds = ["long", "decimal", "string", "json"] + (["struct", "list", "map"] if depth > 0 else [])
    kind = data.draw(st.sampled_from(kinds))
    if kind == "struct":
        n = data.draw(st.integers(1, 3))
        optional = data.draw(st.integers(0, n))  # field f<optional>, if any, is optional
        return FieldType(
            "struct", fields=tuple(EventField(f"f{i}", _type(data, depth - 1), i != optional) for i in range(n))
        )
    if kind == "list":
        return _list(_type(data, depth - 1), required=data.draw(st.booleans()))
    if kind == "map":
        return _map(STRING, _type(data, depth - 1), required=data.draw(st.booleans()))
    return {"long": LONG, "decimal": _DECIMAL, "string": STRING, "json": FieldType("json")}[kind]


def _value(
    data: st.DataObject, t: FieldType, path: str, defects: list[tuple[str, str]], inject: bool
) -> tuple[Any, Any]:
    """(a decoded value of ``t``, what the rule gives for it); where ``inject`` and no defect yet, perhaps one defect,
    recorded as (kind, path)."""

    def defect_here() -> bool:
        return inject and not defects and data.draw(st.integers(0, 3)) == 0

    if t == LONG:
        if defect_here():
            defects.append(("mistyped", path))
            return data.draw(st.sampled_from([2**63, -(2**63) - 1, "7", 1.5, True])), None
        n = data.draw(st.sampled_from([0, -1, 2**63 - 1, -(2**63), 42]))
        return n, n
    if t == _DECIMAL:
        whole = data.draw(st.sampled_from([0, 1, 10**32 - 1, 10**31]))
        frac = data.draw(st.sampled_from([0, 1, 999_999, 500_000]))
        sign = data.draw(st.sampled_from(["", "-"]))
        digits = f"{sign}{whole}.{frac:06d}"
        if defect_here():
            defects.append(("mistyped", path))
            return data.draw(st.sampled_from([Decimal(f"{digits}1"), Decimal(f"1{whole:032d}"), "1.5", 1.5])), None
        shown = data.draw(st.sampled_from(["as is", "trailing zeros", "integer"]))
        if shown == "integer":
            return int(f"{sign}{whole}"), Decimal(f"{sign}{whole}.000000")
        return Decimal(digits + ("000" if shown == "trailing zeros" else "")), Decimal(digits)
    if t == STRING:
        if defect_here():
            defects.append(("mistyped", path))
            return b"bytes", None
        s = data.draw(st.text(max_size=5))
        return s, s
    if t.name == "json":
        items = data.draw(st.dictionaries(st.sampled_from(["b", "a", "\u00e9", "A"]), st.integers(-5, 5), max_size=3))
        text = "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{v}" for k, v in sorted(items.items())) + "}"
        return dict(reversed(list(items.items()))), text
    if t.name == "struct":
        value: dict[str, Any] = {"unknown": object()}  # keys the struct does not declare are ignored
        expected: dict[str, Any] = {}
        for f in t.fields:
            if not f.required and data.draw(st.booleans()):
                expected[f.name] = None  # an optional field left out, or null
                if data.draw(st.booleans()):
                    value[f.name] = None
                continue
            if f.required and inject and not defects and data.draw(st.integers(0, 5)) == 0:
                defects.append(("missing", f"{path}.{f.name}"))
                expected[f.name] = None
                continue
            value[f.name], expected[f.name] = _value(data, f.type, f"{path}.{f.name}", defects, inject)
        return value, expected
    assert t.element is not None
    if t.name == "list":
        items, read = [], []
        for i in range(data.draw(st.integers(0, 3))):
            if not t.element.required and data.draw(st.booleans()):
                items.append(None)
                read.append(None)
            elif t.element.required and inject and not defects and data.draw(st.integers(0, 5)) == 0:
                defects.append(("null", f"{path}[{i}]"))
                items.append(None)
            else:
                v, e = _value(data, t.element.type, f"{path}[{i}]", defects, inject)
                items.append(v)
                read.append(e)
        return data.draw(st.sampled_from([list, tuple]))(items), read
    keys = data.draw(st.lists(st.sampled_from(["k", "\u00e9", 'q"', "speed", ""]), max_size=3, unique=True))
    entries, pairs = {}, []
    for k in keys:
        here = f"{path}[{json.dumps(k, ensure_ascii=False)}]"
        if not t.element.required and data.draw(st.booleans()):
            entries[k] = None
            pairs.append((k, None))
        else:
            entries[k], e = _value(data, t.element.type, here, defects, inject)
            pairs.append((k, e))
    return entries, pairs


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_generated_nested_values_read_as_the_rule_says_and_one_defect_is_named_by_its_path(data: st.DataObject) -> None:
    from spark_jobs.record_decoder import arrow_type

    t = _type(data, 3)
    defects: list[tuple[str, str]] = []
    value, expected = _value(data, t, "top", defects, data.draw(st.booleans()))
    read, problems = read_value(value, t, "top")
    if not defects:
        assert problems == []
        assert read == expected
        pa.array([read], arrow_type(t))  # Arrow takes what the rule gives
    else:
        assert [(p.kind, p.path) for p in problems] == defects
