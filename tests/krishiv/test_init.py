"""``krishiv init``: a spec whose inferred fields read every sampled record, through broker, Spark and catalog."""

from __future__ import annotations

import json
from decimal import Decimal

from krishiv.cli import main
from krishiv.operations import commit_pipelines, run_pipelines
from krishiv.produce import OrderEvent, ensure_topic, produce
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.spec import load_spec


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
        }
        if i % 3:
            row["coupon"] = "SPRING"
        rows.append(row)
    return rows


def test_init_infers_fields_that_read_every_sampled_record(tmp_path, broker, spark, topic, capsys):
    rows = _records(40)
    ensure_topic(broker.bootstrap, topic, 2)
    produce(
        broker.bootstrap,
        topic,
        [OrderEvent(i, i % 2, None, json.dumps(r).encode(), "valid") for i, r in enumerate(rows)],
    )
    path = tmp_path / "krishiv.toml"
    assert main(["init", "--topic", topic, "--bootstrap", broker.bootstrap, "--output", str(path)]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"wrote {path} from 40 sampled records of {topic}; its fields:")
    spec = load_spec(path, env={})
    assert [(f.name, str(f.type), f.required) for f in spec.pipeline().fields] == [
        ("order_id", "string", True),
        ("amount", "decimal(8,2)", True),
        ("price", "decimal(7,2)", True),
        ("qty", "long", True),
        ("placed_at", "timestamp", True),
        ("event_time_ms", "timestamp_ms", True),
        ("day", "date", True),
        ("paid", "boolean", True),
        ("coupon", "string", False),
    ]
    text = path.read_text()
    assert "# left out: meta holds JSON objects" in text and "# left out: tags holds JSON arrays" in text
    assert "# left out: mixed holds mixed types (integer, string)" in text

    run_pipelines(spec, list(spec.pipelines), once=True)
    commit_pipelines(spec, list(spec.pipelines))
    catalog = load_catalog(spec)
    assert len(catalog.load_table(qualified(spec, spec.pipeline().rejects_table)).scan().to_arrow()) == 0
    table = {
        r["order_id"]: r
        for r in catalog.load_table(qualified(spec, spec.pipeline().table)).scan().to_arrow().to_pylist()
    }
    for row in rows:
        got = table[row["order_id"]]
        assert got["amount"] == Decimal(row["amount"]) and got["qty"] == row["qty"] and got["paid"] == row["paid"]
        assert got["coupon"] == row.get("coupon")

    assert main(["init", "--topic", topic, "--bootstrap", broker.bootstrap, "--output", str(path)]) == 2
    assert f"--output: {path} exists: choose another --output" in capsys.readouterr().err


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


def test_the_first_hour_from_a_users_own_file(tmp_path, broker, spark, topic, capsys, monkeypatch):
    """init from the file, produce the file, check, run, commit, verify: the table holds every line once."""
    monkeypatch.chdir(tmp_path)
    lines = tmp_path / "payments.jsonl"
    lines.write_text("".join(json.dumps({"payment_id": f"p-{i}", "amount": f"{i}.5"}) + "\n" for i in range(30)))
    assert main(["init", "--topic", topic, "--file", str(lines), "--bootstrap", broker.bootstrap]) == 0
    assert "from 30 lines of" in capsys.readouterr().out
    assert main(["produce", "--file", str(lines), "--key", "payment_id"]) == 0
    assert main(["check"]) == 0
    spec = load_spec(tmp_path / "krishiv.toml", env={})
    run_pipelines(spec, list(spec.pipelines), once=True)
    for command in ("commit", "verify"):
        assert main([command]) == 0
    table = load_catalog(spec).load_table(qualified(spec, spec.pipeline().table)).scan().to_arrow()
    assert sorted(table.column("payment_id").to_pylist()) == sorted(f"p-{i}" for i in range(30))


def test_a_sample_with_a_stray_value_says_what_it_could_not_decide(tmp_path, capsys) -> None:
    """Numbers sent some as JSON numbers, some as strings, are one decimal (the field rule reads both); a time that is
    not one in a single record leaves the field a string, and --kind windowed names it and the way out."""
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
    assert written.startswith(f"# Written by krishiv init from 21 lines of {events}.")
    assert 'weight = "decimal(' in written and 'at = "string"' in written
    fields = {f.name: f for f in load_spec(tmp_path / "e.toml", env={}).pipeline().fields}
    assert fields["weight"].type.is_decimal
