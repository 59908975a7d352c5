"""``krishiv init``: a spec whose inferred fields read every sampled record, through broker, Spark and catalog."""

from __future__ import annotations

import json
import random
import re
from datetime import datetime
from decimal import Decimal

import pytest

from krishiv.cli import main
from krishiv.operations import commit_pipelines, run_pipelines
from krishiv.produce import OrderEvent, ensure_topic, produce
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.spec import load_spec
from tests.docs.pages import DOCS, blocks_under


def _records(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        row = {
            "order_id": f"o-{i}",
            "amount": f"{i}.{i % 100:02d}",
            "price": float(f"{i % 7}.25"),
            "qty": i * 1000,
            "placed_at": f"2026-11-26T10:{i % 60:02d}:00Z",
            "event_time_ms": 1_764_151_200_000 + i,
            "day": "2026-11-26",
            "paid": i % 2 == 0,
            "meta": {"a": 1},
            "tags": ["x"],
            "mixed": i if i % 2 else str(i),
            "reading": "N/A" if i % 84 == 57 else float(f"{i % 40}.{i % 10}"),  # a sensor's bad readings
            "serial": 123456789012345678901234567890 if i == 11 else i,  # one beyond long
        }
        if i % 3:
            row["coupon"] = "SPRING"
        rows.append(row)
    return rows


def test_init_infers_fields_that_read_every_sampled_record(tmp_path, broker, spark, topic, capsys):
    """Each field typed by what most of its values fit: the run rejects exactly the records init named, and keeps
    every other value exactly (a 30-digit integer in a decimal)."""
    rows = _records(200)
    bad = {r["order_id"] for r in rows if not isinstance(r["reading"], float)}
    assert len(bad) == 2  # 1% of the sample
    ensure_topic(broker.bootstrap, topic, 2)
    produce(
        broker.bootstrap,
        topic,
        [OrderEvent(i, i % 2, None, json.dumps(r).encode(), "valid") for i, r in enumerate(rows)],
    )
    path = tmp_path / "krishiv.toml"
    assert main(["init", "--topic", topic, "--bootstrap", broker.bootstrap, "--output", str(path)]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"wrote {path} from all 200 records of topic {topic}; its fields:")
    spec = load_spec(path, env={})
    assert [(f.name, str(f.type), f.required) for f in spec.pipeline().fields] == [
        ("order_id", "string", True),
        ("amount", "decimal(9,2)", True),  # 3 integer digits, 2 decimal places, room for 4 more integer digits
        ("price", "decimal(7,2)", True),
        ("qty", "long", True),
        ("placed_at", "timestamp", True),
        ("event_time_ms", "timestamp_ms", True),
        ("day", "date", True),
        ("paid", "boolean", True),
        ("meta", "struct<a: long>", True),
        ("tags", "list<string>", True),
        ("mixed", "json", True),  # integers and strings half and half: no type reads more than half
        ("reading", "decimal(7,1)", True),
        ("serial", "decimal(34,0)", True),  # 30 digits and 4
        ("coupon", "string", False),
    ]
    text = path.read_text()
    assert "# meta: a struct: 1 key in all 200 objects" in text and "# tags: a list: 200 elements in 200 arrays" in text
    assert 'mixed = "json"  # json: mixed types (integer, string), no type reads more than half' in text
    (reading,) = [line for line in text.splitlines() if line.startswith("reading = ")]
    exact = '# numbers with a fraction, kept exact (or declare "double"); '
    assert f'{exact}{len(bad)} of 200 sampled values will be rejects: "N/A" (partition' in reading
    assert reading in said
    named = {
        (int(p), int(o))
        for p, offsets in re.findall(r"partition (\d+) offsets? ([\d, ]+)", reading)
        for o in offsets.split(", ")
    }

    run_pipelines(spec, list(spec.pipelines), once=True)
    commit_pipelines(spec, list(spec.pipelines))
    catalog = load_catalog(spec)
    rejects = catalog.load_table(qualified(spec, spec.pipeline().rejects_table)).scan().to_arrow().to_pylist()
    assert {json.loads(r["value"])["order_id"] for r in rejects} == bad
    assert {(r["partition"], r["offset"]) for r in rejects} == named
    assert all(r["reason"].startswith("mistyped field: reading (decimal(7,1)") for r in rejects)
    table = {
        r["order_id"]: r
        for r in catalog.load_table(qualified(spec, spec.pipeline().table)).scan().to_arrow().to_pylist()
    }
    assert set(table) == {r["order_id"] for r in rows} - bad
    for row in rows:
        if row["order_id"] in bad:
            continue
        got = table[row["order_id"]]
        assert got["amount"] == Decimal(row["amount"]) and got["qty"] == row["qty"] and got["paid"] == row["paid"]
        assert got["coupon"] == row.get("coupon")
        assert got["reading"] == Decimal(str(row["reading"])) and got["serial"] == Decimal(row["serial"])
        assert (got["meta"], got["tags"], got["mixed"]) == (row["meta"], row["tags"], json.dumps(row["mixed"]))

    assert main(["init", "--topic", topic, "--bootstrap", broker.bootstrap, "--output", str(path)]) == 2
    assert f"--output: {path} exists: choose another --output" in capsys.readouterr().err
    part = ["init", "--topic", topic, "--bootstrap", broker.bootstrap, "--sample", "150"]
    assert main([*part, "--output", str(tmp_path / "part.toml")]) == 0
    assert f"from the first 150 of about 200 records of topic {topic} (--sample N reads more" in capsys.readouterr().out


def test_each_kind_says_what_it_needs(tmp_path, broker, topic, capsys):
    ensure_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, [OrderEvent(0, 0, b"k", json.dumps(_records(1)[0]).encode(), "valid")])
    base = ["init", "--topic", topic, "--bootstrap", broker.bootstrap]
    assert main([*base, "--kind", "upsert", "--output", str(tmp_path / "u.toml")]) == 2
    assert "--key: an upsert pipeline needs --key FIELD[,FIELD]" in capsys.readouterr().err
    assert main([*base, "--kind", "upsert", "--key", "order_id", "--output", str(tmp_path / "u.toml")]) == 0
    assert load_spec(tmp_path / "u.toml", env={}).pipeline().key == ("order_id",)
    assert main([*base, "--kind", "windowed", "--output", str(tmp_path / "w.toml")]) == 0
    assert load_spec(tmp_path / "w.toml", env={}).pipeline().event_time_field == "placed_at"
    assert (
        main(
            ["init", "--topic", f"{topic}-none", "--bootstrap", broker.bootstrap, "--output", str(tmp_path / "n.toml")]
        )
        == 2
    )
    assert f"no topic '{topic}-none' on {broker.bootstrap}" in capsys.readouterr().err


def test_a_debezium_topic_is_recognised_and_its_rows_fields_and_key_are_taken() -> None:
    from krishiv.init_spec import analyse, check_kind, spec_text

    key_schema = {"type": "struct", "fields": [{"field": "id", "type": "int32"}]}
    events = [
        {"op": "c", "before": None, "after": {"id": 1, "name": "a", "born": "2001-02-03"}, "source": {"lsn": 5}},
        {"op": "u", "before": None, "after": {"id": 1, "name": None, "born": "2001-02-04"}, "source": {"lsn": 6}},
    ]
    keys = [json.dumps({"schema": key_schema, "payload": {"id": 1}}).encode()] * 2
    sample = analyse([json.dumps(e).encode() for e in events], keys)
    assert (sample.debezium, sample.key_fields) == (2, ["id"])
    check_kind(sample, "upsert", sample.key_fields)
    text = spec_text(sample, "shop.public.customers", "upsert", "127.0.0.1:9092", sample.key_fields)
    assert 'envelope = "debezium"' in text and 'key = ["id"]' in text
    assert 'name = { type = "string", required = false }' in text and 'born = "date"' in text


def _page_payments() -> tuple[list[str], str]:
    """The quickstart's own-topic file: the lines its first block writes, and the one line a later block appends."""
    shell = "".join(b.text for b in blocks_under(DOCS / "quickstart.md", "Your own topic") if b.language == "bash")
    written = shell.split("cat > payments.jsonl <<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0].splitlines()
    (appended,) = re.findall(r"^echo '(\{.*\})' >> payments.jsonl$", shell, flags=re.MULTILINE)
    return written, appended


def _folded(line: str) -> dict | None:
    """A payment's row by docs/spec.md's rule for the types init gives the page's file (decimal(10,2), timestamp, a
    struct of brand, last4 and an optional wallet, a list of structs of sku and qty), or None for a reject."""
    event = json.loads(line)
    amount = event["amount"]
    if not re.fullmatch(r"-?\d{1,8}(\.\d{1,2})?", amount):
        return None
    card = event["card"]
    return {
        "payment_id": event["payment_id"],
        "customer": event["customer"],
        "amount": Decimal(amount),
        "paid_at": datetime.fromisoformat(event["paid_at"].replace("Z", "+00:00")),
        "card": {"brand": card["brand"], "last4": card["last4"], "wallet": card.get("wallet")},
        "items": [{"sku": item["sku"], "qty": item["qty"]} for item in event["items"]],
        "note": event.get("note"),
    }


def test_the_first_hour_from_a_users_own_nested_file(tmp_path, broker, spark, topic, capsys, monkeypatch):
    """The quickstart's own-topic path with its nested file: init from the file, produce it, check, run, commit,
    verify; the table holds each valid line once, its card a struct and its items a list of structs, equal to the
    rule's fold of the file, and the line the rule rejects is the reject."""
    monkeypatch.chdir(tmp_path)
    written, appended = _page_payments()
    lines = tmp_path / "payments.jsonl"
    lines.write_text("".join(line + "\n" for line in written))
    assert main(["init", "--topic", topic, "--file", str(lines), "--bootstrap", broker.bootstrap]) == 0
    assert f"from all {len(written)} lines of {lines}; its fields:" in capsys.readouterr().out
    spec = load_spec(tmp_path / "krishiv.toml", env={})
    assert {f.name: f.shown_type for f in spec.pipeline().fields if f.type.is_nested} == {
        "card": "struct<brand: string, last4: string, wallet: string?>",
        "items": "list<struct<sku: string, qty: long>>",
    }
    lines.write_text(lines.read_text() + appended + "\n")
    assert main(["produce", "--file", str(lines), "--key", "payment_id"]) == 0
    assert main(["check"]) == 0
    run_pipelines(spec, list(spec.pipelines), once=True)
    for command in ("commit", "verify"):
        assert main([command]) == 0
    catalog = load_catalog(spec)
    folded = {line: _folded(line) for line in [*written, appended]}
    expected = sorted((row for row in folded.values() if row), key=lambda r: r["payment_id"])
    table = catalog.load_table(qualified(spec, spec.pipeline().table)).scan().to_arrow()
    rows = sorted(table.drop_columns(["_kafka_partition", "_kafka_offset"]).to_pylist(), key=lambda r: r["payment_id"])
    assert rows == expected
    rejects = catalog.load_table(qualified(spec, spec.pipeline().rejects_table)).scan().to_arrow().to_pylist()
    assert [r["value"].decode() for r in rejects] == [line for line, row in folded.items() if row is None]


def test_a_sample_with_a_stray_value_says_what_it_could_not_decide(tmp_path, capsys) -> None:
    """Numbers sent some as JSON numbers, some as strings, are one decimal (the field rule reads both); a time that is
    not one in a single record leaves the field a string (the type that reads every value), its comment naming the
    timestamp most values are, and --kind windowed names it and the way out."""
    lines = [
        json.dumps({"id": n, "weight": n + 0.5 if n % 2 else f"{n}.25", "at": f"2026-11-26T10:{n:02d}:00Z"})
        for n in range(20)
    ]
    lines.append(json.dumps({"id": 20, "weight": 3, "at": "yesterday"}))
    events = tmp_path / "e.jsonl"
    events.write_text("\n".join(lines) + "\n")
    base = ["init", "--topic", "t", "--file", str(events)]
    assert main([*base, "--kind", "windowed", "--output", str(tmp_path / "w.toml")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "no field of the sample is a time in every sampled record (at is one in 20 of 21 sampled values)" in err
    assert 'declare it "timestamp" in [pipelines.fields] and event_time_field' in err
    assert main([*base, "--output", str(tmp_path / "e.toml")]) == 0
    written = (tmp_path / "e.toml").read_text()
    assert written.startswith(f"# Written by krishiv init from all 21 lines of {events}.")
    assert 'weight = "decimal(' in written
    assert (
        'at = "string"  # 20 of 21 sampled values are a timestamp; declared "timestamp", the others would be rejects: '
        '"yesterday" (line 21)' in written
    )
    fields = {f.name: f for f in load_spec(tmp_path / "e.toml", env={}).pipeline().fields}
    assert fields["weight"].type.is_decimal


def _readings(n: int, seed: int) -> tuple[list[str], dict[str, dict[int, object]]]:
    """``n`` JSON lines of sensor readings with about 1% of some fields' values bad, and each such field's bad values
    by line number: what its type cannot read ("N/A" and the like, a string among integers, "yes" for a boolean, a
    number of 40 digits, which no decimal holds)."""
    r = random.Random(seed)
    lines: list[str] = []
    bad: dict[str, dict[int, object]] = {"temp_c": {}, "count": {}, "ok": {}, "huge": {}}
    for line in range(1, n + 1):
        row = {
            "sensor": f"s-{r.randrange(17)}",
            "temp_c": round(r.uniform(-20, 45), 1),
            "count": r.randrange(1000),
            "ok": r.random() < 0.5,
            "serial": 123456789012345678901234567890 if line == 8 else line,
            "huge": 10**39 + line if line in (9, 4321) else r.randrange(10**6),
        }
        for name, wrong in (("temp_c", ("N/A", "", "err")), ("count", ("12",)), ("ok", ("yes",))):
            if r.random() < 0.01:
                row[name] = r.choice(wrong)
        for name in bad:
            if isinstance(row[name], str) or (name == "huge" and row[name] >= 10**38):
                bad[name][line] = row[name]
        lines.append(json.dumps(row))
    return lines, bad


def _named(bad: dict[int, object]) -> str:
    """How init's comment names bad values: each distinct one (the first three) with its first three lines."""
    lines: dict[str, list[int]] = {}
    for line, value in bad.items():
        shown = (
            f"the 40-digit number {str(value)[:10]}…{str(value)[-4:]}" if isinstance(value, int) else json.dumps(value)
        )
        lines.setdefault(shown, []).append(line)
    return ", ".join(
        f"{value} (line{'s' if len(at) > 1 else ''} {', '.join(map(str, at[:3]))}"
        + (f" and {len(at) - 3} more)" if len(at) > 3 else ")")
        for value, at in list(lines.items())[:3]
    )


def test_a_field_with_a_few_bad_values_keeps_its_type_and_names_them(tmp_path, capsys) -> None:
    """About 1% bad values in a field: every field is kept with the type most values fit, its comment counts and
    places the bad values (the lines the pipeline's rule then rejects), and the sample's size is said and settable."""
    from spark_jobs.record_decoder import Decoding, read_record

    lines, bad = _readings(5000, seed=35)
    events = tmp_path / "readings.jsonl"
    events.write_text("\n".join(lines) + "\nnot json\n")
    assert all(len([n for n in bad[f] if n <= 500]) >= 2 for f in ("temp_c", "count", "ok")), "a sample too clean"

    for n, (options, sampled) in enumerate((((), 500), (("--sample", "all"), 5001))):
        output = tmp_path / f"{n}.toml"
        assert main(["init", "--topic", "readings", "--file", str(events), "--output", str(output), *options]) == 0
        said, text = capsys.readouterr().out, output.read_text()
        if sampled == 500:
            assert (
                f"from the first 500 of 5,001 lines of {events} (--sample N reads more, --sample all every one)" in said
            )
        else:
            assert f"from all 5,001 lines of {events}; its fields:" in said
            assert "1 of 5,001 sampled records is not a JSON object and will be a reject: line 5001" in said
        fields = {line.split(" = ")[0]: line for line in text.split("[pipelines.fields]\n")[1].splitlines()}
        assert fields["sensor"] == 'sensor = "string"'
        assert fields["serial"] == 'serial = "decimal(34,0)"  # integers beyond long'  # 30 digits, room for 4 more
        exact = 'numbers with a fraction, kept exact (or declare "double"); '
        assert fields["temp_c"].startswith(f'temp_c = "decimal(7,1)"  # {exact}')  # 2 digits, 1 place, 4 more
        assert fields["count"].startswith('count = "long"  # ') and fields["ok"].startswith('ok = "boolean"  # ')
        assert fields["huge"].startswith('huge = "long"  # ')
        for name, values in bad.items():
            seen = {line: value for line, value in values.items() if line <= sampled}
            plural = "a reject" if len(seen) == 1 else "rejects"
            said_of = f"{len(seen):,} of {min(sampled, 5000):,} sampled values will be {plural}: {_named(seen)}"
            assert said_of in fields[name] and fields[name] in said
        assert "a number of more than 38 digits fits no decimal" in fields["huge"]

        # The pipeline's own rule reads the spec init wrote: it rejects exactly the lines with a bad value.
        decoding = Decoding.of(load_spec(output, env={}).pipeline())
        rejected = {n for n, line in enumerate(lines, 1) if read_record(line.encode(), decoding).reason}
        assert rejected == {line for values in bad.values() for line in values}


def test_init_sample_takes_a_whole_number_or_all(tmp_path, capsys) -> None:
    events = tmp_path / "e.jsonl"
    events.write_text("".join(json.dumps({"id": n}) + "\n" for n in range(3)))
    base = ["init", "--topic", "t", "--file", str(events)]
    for wrong in ("0", "-3", "some"):
        with pytest.raises(SystemExit) as done:
            main([*base, "--sample", wrong])
        assert done.value.code == 2
        assert (
            f"argument --sample: expected a whole number of at least 1, or all, got '{wrong}'"
            in capsys.readouterr().err
        )
    assert main([*base, "--sample", "2", "--output", str(tmp_path / "two.toml")]) == 0
    assert f"from the first 2 of 3 lines of {events} (--sample N" in capsys.readouterr().out
