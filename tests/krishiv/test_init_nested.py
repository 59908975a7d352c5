"""``krishiv init`` on nested JSON: structs, maps, lists and ``json`` inferred at any depth from generated samples.

The expected types are written here from the rule (krishiv/init_types.py's docstring, docs/operations.md's init
row): a struct's key is required when every sampled object holds it non-null; objects are a map when more than 16
distinct keys appear and an object holds at most half of them on average, or a key is no field name; a list's
element and a map's value are typed from all of them together, optional when one is null; a shape of more than
half a place's values is typed from those, the others named as rejects; ``json`` where no shape has a majority,
scalars mix, every sampled array or object is empty, or objects are free-form (keys vary and a struct's field would
reject more than 5% of its values). A decimal holds the widest sampled integer part plus four digits and the longest
sampled fraction, as at the top level.
"""

from __future__ import annotations

import json
import random
import tomllib
from decimal import Decimal
from pathlib import Path

import pytest

from krishiv.cli import main
from krishiv_core.spec import load_spec


def _decimal(texts: list[str]) -> str:
    """The rule's decimal for plain-digit texts: the widest integer part (leading zeros aside) plus four, and the
    longest fraction as written."""
    whole = max(len(t.lstrip("-").split(".")[0].lstrip("0")) for t in texts)
    scale = max(len(t.split(".")[1]) if "." in t else 0 for t in texts)
    return f"decimal({whole + scale + 4},{scale})"


def _vans(n: int, seed: int) -> tuple[list[dict], dict[str, str], dict[int, str]]:
    """``n`` van records (3 levels of structs, lists of structs with lists inside, a map of decimals, empty and null
    lists, conflicting shapes), the type each field must get, and the lines (1-based) holding a value their field's
    type cannot read, with the path of that value as the pipeline's rule names it."""
    r = random.Random(seed)
    temps: list[str] = []
    fuels: list[str] = []
    bad: dict[int, str] = {}
    rows = []
    for i in range(n):
        line = i + 1
        readings = []
        for k in range(max(r.randrange(4), line in (1, 40, 211))):
            temp: float | str = float(f"{r.randint(-30, 45)}.{r.randrange(100):02d}") if line > 1 or k else -0.05
            if line in (40, 211) and k == 0:
                temp = "N/A"  # a sensor's bad reading: the record is a reject, the list stays a list of structs
                bad[line] = "readings[0].temp"
            else:
                temps.append(json.dumps(temp))  # the JSON number's text, as the sample holds it
            flags = [r.choice(["door", "cold", "late"]) for _ in range(r.randrange(3))]
            readings.append({"at": f"2026-11-26T10:{r.randrange(60):02d}:00Z", "temp": temp, "flags": flags})
        fuel = {}
        for _ in range(r.randint(1, 3)):
            value = f"{r.randrange(500)}.{r.randrange(10)}"
            if line == 7 and not fuel:
                value = "123456789012345678901234.000001"  # 30 digits: the map's values are decimal(34,6)
            fuel[f"tank_{r.randrange(40)}"] = value
        fuels += list(fuel.values())  # a key drawn twice keeps one value, as JSON does
        row = {
            "van": f"v-{i % 20}",
            "trip": {
                "id": i,
                "route": {
                    "origin": {"site": f"depot-{i % 3}", "dock": i % 9},
                    "stops": r.randrange(9),
                    "spare": None,  # null in every record: left out of the struct
                },
                **({"driver": {"name": f"d-{i % 5}", "since": "2020-01-0" + str(1 + i % 9)}} if i % 4 else {}),
            },
            "readings": readings,
            "fuel": fuel,
            "doors": {"front": i % 2 == 0, "rear": i % 3 == 0, **({"side": True} if i % 2 else {})},
            "tags": None if i % 7 == 0 else [f"t{j}" for j in range(i % 3)],
            "notes": [r.choice(["ok", "check"]) for _ in range(1 + i % 3)] + ([None] if i % 5 == 0 else []),
            "extra": {"k": i} if i % 3 == 0 else ([i] if i % 3 == 1 else 5),  # no shape in more than half
            "nothing": [],
            "cells": [i, {"a": i}],
        }
        if i % 11 == 5:
            del row["doors"]  # missing from some records: optional
        rows.append(row)
    types = {
        "van": "string",
        "trip": "struct<id: long, route: struct<origin: struct<site: string, dock: long>, stops: long>, "
        "driver: struct<name: string, since: date>?>",
        "readings": f"list<struct<at: timestamp, temp: {_decimal(temps)}, flags: list<string>>>",
        "fuel": f"map<string, {_decimal(fuels)}>",
        "doors": "struct<front: boolean, rear: boolean, side: boolean?>?",
        "tags": "list<string>?",
        "notes": "list<string?>",
        "extra": "json",
        "nothing": "json",
        "cells": "list<json>",
    }
    return rows, types, bad


def test_init_infers_nested_types_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from spark_jobs.record_decoder import Decoding, read_record

    rows, types, bad = _vans(300, seed=36)
    lines = tmp_path / "vans.jsonl"
    lines.write_text("".join(json.dumps(row) + "\n" for row in rows))
    output = tmp_path / "vans.toml"
    assert main(["init", "--topic", "vans", "--file", str(lines), "--output", str(output), "--sample", "all"]) == 0
    said = capsys.readouterr().out
    text = output.read_text()

    fields = load_spec(output, env={}).pipeline().fields
    assert {f.name: f.shown_type for f in fields} == types
    assert [f.name for f in fields] == list(types), "the fields in the records' order"

    # The spec's own declarations round-trip: each reads back as the table the loaded type declares.
    written = tomllib.loads(text)["pipelines"][0]["fields"]
    assert written == {f.name: f.declaration() for f in fields}

    # Readable: one field, or one part of a long one, a line; each nested part with a comment saying why.
    declared = text.split("[pipelines.fields]\n")[1].splitlines()
    assert all(len(line.split("  # ")[0]) <= 100 for line in declared if not line.startswith("#")), declared
    assert any(line.startswith("readings.element.fields.temp = ") for line in declared), "a long one split"
    comments = [line for line in declared if line.startswith("#")]
    assert "# trip: a struct: 2 keys in all 300 objects, 1 in some (optional): driver in 225" in comments
    assert "# trip.route.spare: left out: null or missing in every one of the 300 sampled objects" in comments
    fuel_keys = {k for row in rows for k in row["fuel"]}
    per_object = sum(len(row["fuel"]) for row in rows) / len(rows)
    assert f"# fuel: a map: {len(fuel_keys)} distinct keys in 300 objects, {per_object:.1f} in one on average" in (
        comments
    )
    assert any(c.startswith("# fuel[*]: numbers sent as strings") for c in comments)
    doors = [row["doors"] for row in rows if "doors" in row]
    sides = sum("side" in d for d in doors)
    assert f"# doors: a struct: 2 keys in all {len(doors)} objects, 1 in some (optional): side in {sides}" in comments
    assert "# notes[*]: 60 nulls of" in "\n".join(comments)
    elements = sum(len(row["readings"]) for row in rows)
    empty = sum(not row["readings"] for row in rows)
    assert f"# readings: a list: {elements} elements in 300 arrays, {empty} of them empty" in comments
    assert (
        'extra = "json"  # json, as no shape is in more than half: 100 objects, 100 arrays (lines 2, 5, 8 and 97 '
        "more), 100 integers (lines 3, 6, 9 and 97 more)" in declared
    )
    assert any(line.startswith('nothing = "json"  # json: all 300 sampled arrays were empty') for line in declared)
    assert (
        "# cells[*]: json, as no shape is in more than half: 300 integers, 300 objects (lines 1, 2, 3 and 297 more)"
        in (comments)
    )
    (temp,) = [c for c in comments if c.startswith("# readings[*].temp: ")]
    assert "2 of " in temp and '"N/A" (lines 40, 211)' in temp
    assert all(line in said for line in declared), "init prints what it wrote"

    # The pipeline's own rule reads the spec init wrote: only the records with a bad nested value are rejects,
    # their reasons naming its path.
    decoding = Decoding.of(load_spec(output, env={}).pipeline())
    rejected = {}
    for n, row in enumerate(rows, 1):
        reading = read_record(json.dumps(row).encode(), decoding)
        if reading.reason:
            rejected[n] = reading.reason
    assert set(rejected) == set(bad)
    assert all(f"mistyped field: {bad[n]} (" in reason for n, reason in rejected.items()), rejected
    one = read_record(json.dumps(rows[6]).encode(), decoding).values
    assert Decimal("123456789012345678901234.000001") in dict(one["fuel"]).values()


@pytest.mark.parametrize(
    ("distinct", "per_object", "kind"),
    [(16, 1, "struct"), (17, 8, "map"), (17, 9, "struct"), (40, 3, "map")],
)
def test_objects_are_a_map_past_16_distinct_keys_each_holding_at_most_half(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], distinct: int, per_object: int, kind: str
) -> None:
    """The threshold's edges: more than 16 distinct keys, an object holding at most half of them on average."""
    rows = [{"id": i, "by": {f"k{(i + j) % distinct}": j for j in range(per_object)}} for i in range(distinct * 3)]
    lines = tmp_path / "e.jsonl"
    lines.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["init", "--topic", "t", "--file", str(lines), "--output", str(tmp_path / "e.toml")]) == 0
    by = load_spec(tmp_path / "e.toml", env={}).pipeline().fields[1].type
    assert by.name == kind
    if kind == "map":
        assert str(by) == "map<string, long>"
    else:
        optional = per_object < distinct
        assert [(f.name, str(f.type), f.required) for f in by.fields] == [
            (f"k{j}", "long", not optional) for j in range(distinct)
        ]


def test_keys_that_are_no_field_names_are_a_map_and_top_level_ones_are_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        {"id": i, "Content-Type": "x", "daily": {"2026-11-2" + str(d): f"{d}.5" for d in range(1 + i % 3)}}
        for i in range(10)
    ]
    lines = tmp_path / "e.jsonl"
    lines.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["init", "--topic", "t", "--file", str(lines), "--output", str(tmp_path / "e.toml")]) == 0
    text = (tmp_path / "e.toml").read_text()
    fields = load_spec(tmp_path / "e.toml", env={}).pipeline().fields
    assert [(f.name, str(f.type)) for f in fields] == [("id", "long"), ("daily", "map<string, decimal(6,1)>")]
    assert '# left out: "Content-Type" is no field name' in text
    assert '# daily: a map: keys such as "2026-11-20" are no field names' in text


def test_a_nested_key_and_event_time_by_their_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--key device.id`` names a field inside a struct; a windowed spec takes a time inside one."""
    rows = [
        {"device": {"id": f"d-{i % 4}", "meta": {"at": f"2026-11-26T10:00:0{i}Z"}, "opt": 1 if i else None}}
        for i in range(8)
    ]
    lines = tmp_path / "e.jsonl"
    lines.write_text("".join(json.dumps(row) + "\n" for row in rows))
    base = ["init", "--topic", "t", "--file", str(lines)]
    assert main([*base, "--kind", "upsert", "--key", "device.id", "--output", str(tmp_path / "u.toml")]) == 0
    assert load_spec(tmp_path / "u.toml", env={}).pipeline().key == ("device.id",)
    for key in ("device.opt", "device.meta", "device.nope"):
        assert main([*base, "--kind", "upsert", "--key", key, "--output", str(tmp_path / "x.toml")]) == 2
        assert (
            f"fields every sampled record has, each one value (a dotted path names one inside a struct: "
            f"device.id); not {key}" in " ".join(capsys.readouterr().err.split())
        )
    assert main([*base, "--kind", "windowed", "--output", str(tmp_path / "w.toml")]) == 0
    assert load_spec(tmp_path / "w.toml", env={}).pipeline().event_time_field == "device.meta.at"


def _shape(r: random.Random, depth: int) -> tuple:
    """A random nested shape: ("struct", {key: (shape, how often present, how often null)}), ("list", element shape,
    how often an element is null), ("map", value shape), or a scalar's generator's name."""
    pick = r.choice(["struct", "list", "map", "scalar", "scalar"] if depth < 4 else ["scalar"])
    if pick == "struct":
        keys = {
            f"f{n}_{r.choice(['x', 'at', 'n'])}": (_shape(r, depth + 1), r.choice([1, 1, 0.7]), r.choice([0, 0, 0.2]))
            for n in range(r.randint(1, 4))
        }
        return ("struct", keys)
    if pick == "list":
        return ("list", _shape(r, depth + 1), r.choice([0, 0, 0.1]))
    if pick == "map":
        return ("map", _shape(r, depth + 1))
    return (r.choice(["string", "long", "decimal", "number", "boolean", "timestamp", "date", "huge", "exp"]),)


def _value(r: random.Random, shape: tuple) -> object:
    kind = shape[0]
    if kind == "struct":
        out = {}
        for key, (inner, present, null) in shape[1].items():
            if r.random() < present:
                out[key] = None if r.random() < null else _value(r, inner)
        return out
    if kind == "list":
        return [None if r.random() < shape[2] else _value(r, shape[1]) for _ in range(r.choice([0, 1, 3]))]
    if kind == "map":
        return {f"id-{r.randrange(50)}": _value(r, shape[1]) for _ in range(r.randint(0, 3))}
    return {
        "string": lambda: r.choice(["a", "b c", "ünï", "12", ""]),
        "long": lambda: r.randint(-(2**63), 2**63 - 1),
        "decimal": lambda: f"{r.randint(-999999, 999999)}.{r.randrange(10**6):06d}"[: r.randint(3, 12)].rstrip("."),
        "number": lambda: Decimal(f"{r.randint(-99, 99)}.{r.randrange(1000):03d}"),
        "boolean": lambda: r.random() < 0.5,
        "timestamp": lambda: f"2026-11-{r.randint(10, 28)}T10:00:00.{r.randrange(1000):03d}+05:30",
        "date": lambda: f"2026-11-{r.randint(10, 28)}",
        "huge": lambda: r.randint(10**20, 10**30),
        "exp": lambda: float(f"{r.randint(1, 9)}e{r.randint(-30, 30)}"),
    }[kind]()


def _dumps(value: object) -> str:
    """JSON with Decimals written as plain numbers."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_dumps(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


@pytest.mark.parametrize("seed", range(25))
def test_a_clean_random_nested_sample_is_read_whole_by_the_spec_init_writes(seed: int) -> None:
    """Random nested shapes 4 levels deep, each place's values of one kind (keys missing or null at random, empty
    lists, null elements): the spec init writes loads, round-trips, and the pipeline's rule reads every sampled
    record (a type that reads every value of a place is the one init takes)."""
    from krishiv.init_spec import analyse, spec_text
    from krishiv_core.spec import parse_spec
    from spark_jobs.record_decoder import Decoding, read_record

    r = random.Random(seed)
    top = _shape(r, 0)
    fields = {"id": (("long",), 1, 0), **(top[1] if top[0] == "struct" else {"v": (top, 0.9, 0.1)})}
    shape = ("struct", fields)
    records = [_dumps(_value(r, shape)).encode() for _ in range(120)]
    text = spec_text(analyse(records, [None] * len(records)), "t", "events", "127.0.0.1:9092")
    pipeline = parse_spec(tomllib.loads(text), env={}).pipelines[0]
    assert tomllib.loads(text)["pipelines"][0]["fields"] == {f.name: f.declaration() for f in pipeline.fields}
    decoding = Decoding.of(pipeline)
    reasons = {n: read_record(v, decoding).reason for n, v in enumerate(records, 1)}
    assert not any(reasons.values()), (text, {n: why for n, why in reasons.items() if why})


def _placed(lines: list[int]) -> str:
    """How a comment places values: the first three lines, and how many more."""
    said = f"line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines[:3]))}"
    return said + (f" and {len(lines) - 3} more" if len(lines) > 3 else "")


def _init(tmp_path: Path, rows: list[object], *options: str) -> tuple[str, list[str]]:
    """init on ``rows`` as JSON lines: the spec's text and the rule's reason for each row (None: read)."""
    from spark_jobs.record_decoder import Decoding, read_record

    lines = tmp_path / "s.jsonl"
    lines.write_text("".join(_dumps(row) + "\n" for row in rows))
    output = tmp_path / "s.toml"
    output.unlink(missing_ok=True)
    assert main(["init", "--topic", "t", "--file", str(lines), "--output", str(output), *options]) == 0
    text = output.read_text()
    pipeline = load_spec(output, env={}).pipeline()
    assert tomllib.loads(text)["pipelines"][0]["fields"] == {f.name: f.declaration() for f in pipeline.fields}
    decoding = Decoding.of(pipeline)
    return text, [read_record(_dumps(row).encode(), decoding).reason for row in rows]


def test_a_shape_of_more_than_half_the_values_is_typed_and_the_others_are_rejects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """About 1% of a struct's values a number, of a list's a string, of a number's an object, and inside a list of
    structs 1% of the elements a string: each keeps the majority's shape, its comment counting and placing the
    others as rejects, which are exactly the records the pipeline's rule rejects, each naming that path."""
    r = random.Random(8)
    n = 400
    odd: dict[str, list[int]] = {"gps": [], "tags": [], "count": [], "legs[*]": []}
    rows = []
    for line in range(1, n + 1):
        gps: object = {"lat": r.randint(-90, 90), "site": f"s{r.randrange(9)}"}
        tags: object = [f"t{j}" for j in range(r.randrange(3))]
        count: object = r.randrange(1000)
        legs: list[object] = [{"km": r.randrange(99)} for _ in range(1 + r.randrange(2))]
        pick = r.random()
        if line in (3, 250) or pick < 0.01:
            gps, where = r.choice([52.1, 7, "52.1,4.3"]), "gps"
        elif line == 5 or pick < 0.02:
            tags, where = "urgent", "tags"
        elif line == 9 or pick < 0.03:
            count, where = {"n": 1}, "count"
        elif line == 11 or pick < 0.04:
            legs[0], where = "n/a", "legs[*]"
        else:
            where = ""
        if where:
            odd[where].append(line)
        rows.append({"id": line, "gps": gps, "tags": tags, "count": count, "legs": legs})
    assert all(len(lines) >= 2 for lines in odd.values()), "a sample too clean"
    text, reasons = _init(tmp_path, rows, "--sample", "all")
    fields = {f.name: str(f.type) for f in load_spec(tmp_path / "s.toml", env={}).pipeline().fields}
    assert fields == {
        "id": "long",
        "gps": "struct<lat: long, site: string>",
        "tags": "list<string>",
        "count": "long",
        "legs": "list<struct<km: long>>",
    }

    def kinds(path: str) -> dict[str, list[int]]:
        """The odd values at ``path`` by their JSON kind's name, in the order the sample first shows each."""
        out: dict[str, list[int]] = {}
        for line in odd[path]:
            row = rows[line - 1]
            value = row["legs"][0] if path == "legs[*]" else row[path]
            kind = {str: "string", int: "integer", float: "number with a fraction", dict: "object"}[type(value)]
            out.setdefault(kind, []).append(line)
        return out

    def listed(path: str) -> str:
        plural = {"number with a fraction": "numbers with a fraction"}
        ranked = sorted(kinds(path).items(), key=lambda kv: -len(kv[1]))
        return ", ".join(
            f"{len(at)} {kind if len(at) == 1 else plural.get(kind, kind + 's')} ({_placed(at)})" for kind, at in ranked
        )

    gps = len(odd["gps"])
    assert (
        f"# gps: a struct: 2 keys in all {n - gps} objects; {gps} of {n} sampled values are not objects and will be "
        f"rejects: {listed('gps')}\n" in text
    )
    tags = len(odd["tags"])
    assert f"; {tags} of {n} sampled values are not arrays and will be rejects: {listed('tags')}\n" in text
    elements = sum(len(row["legs"]) for row in rows)
    legs = len(odd["legs[*]"])
    assert (
        f"# legs[*]: a struct: 1 key in all {elements - legs} objects; {legs} of {elements} sampled values are not "
        f"objects and will be rejects: {listed('legs[*]')}\n" in text
    )
    counts = len(odd["count"])
    assert (
        f'count = "long"  # {counts} of {n} sampled values will be rejects: an object {{"n": 1}} '
        f"({_placed(odd['count'])})\n" in text
    )
    # The rule rejects exactly the records named, each for the path named.
    rejected = {line: why for line, why in enumerate(reasons, 1) if why}
    named = {line: path for path, lines in odd.items() for line in lines}
    assert set(rejected) == set(named)
    for line, why in rejected.items():
        at = {"gps": "gps (struct<", "tags": "tags (list<", "count": "count (long", "legs[*]": "legs[0] (struct<"}
        assert why.startswith(f"mistyped field: {at[named[line]]}"), (line, why)


def _extras(r: random.Random, n: int) -> list[dict]:
    """Free-form ``extra`` objects as a device sends them: keys vary, ``a`` a string in some and a number in
    others, some empty."""
    shapes = [
        lambda: {},
        lambda: {"fw": f"1.{r.randrange(9)}"},
        lambda: {"z": r.randrange(9), "a": "été"},
        lambda: {"a": r.randrange(9)},
        lambda: {"note": "line\nbreak", "ok": r.random() < 0.5, "nothing": None},
        lambda: {"n": Decimal("1.50"), "errors": [1, 2, {"code": "E7"}]},
    ]
    return [{"id": i, "extra": r.choice(shapes)()} for i in range(n)]


@pytest.mark.parametrize("sample", ["500", "all"])
def test_a_free_form_object_is_json_and_rejects_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sample: str
) -> None:
    rows = _extras(random.Random(36), 900)
    text, reasons = _init(tmp_path, rows, "--sample", sample)
    (extra,) = [line for line in text.splitlines() if line.startswith("extra = ")]
    assert extra.startswith('extra = "json"  # json, as the objects are free-form: their keys vary (')
    assert "in all " in extra and "; json rejects none" in extra
    assert not any(reasons), "json reads every sampled value"


@pytest.mark.parametrize(("strings", "kind"), [(38, "struct"), (37, "json")])
def test_a_varying_struct_is_json_past_5_percent_rejects_in_one_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], strings: int, kind: str
) -> None:
    """The threshold's edge: ``a`` in 40 of 100 objects (keys vary), a string in ``strings`` of them and a number in
    the others: 2 of 40 rejects (5%) keep the struct, 3 (7.5%) make it json."""
    rows = [{"id": i, "o": {"b": i, **({"a": f"x{i}" if i < strings else i} if i < 40 else {})}} for i in range(100)]
    text, reasons = _init(tmp_path, rows)
    o = load_spec(tmp_path / "s.toml", env={}).pipeline().fields[1].type
    assert o.name == kind
    if kind == "struct":
        assert str(o) == "struct<b: long, a: string?>"
        assert "# o: a struct: 1 key in all 100 objects, 1 in some (optional): a in 40\n" in text
        lines = list(range(strings + 1, 41))
        said = ", ".join(f"the number {line - 1} (line {line})" for line in lines)
        assert f"# o.a: {len(lines)} of 40 sampled values will be rejects: {said}\n" in text
        assert [n for n, why in enumerate(reasons, 1) if why] == lines
    else:
        assert "as a struct a would be a string rejecting 3 of its 40 sampled values; json rejects none" in text
        assert not any(reasons)


def test_a_struct_of_optional_keys_only_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"id": i, "o": {"a": i} if i % 2 else {"b": "x"}} for i in range(10)]
    text, reasons = _init(tmp_path, rows)
    assert "# o: a struct of 2 optional keys, none in all 10 objects: b in 5, a in 5\n" in text
    assert not any(reasons)
