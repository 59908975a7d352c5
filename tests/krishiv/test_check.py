"""``krishiv check``: what a run would check before Spark starts, on the real broker and catalog, changing nothing."""

from __future__ import annotations

import json

from chaos.workspace import SETTINGS_TEMPLATE
from krishiv.cli import main
from krishiv.operations import commit_pipelines, run_pipelines
from krishiv.produce import OrderEvent, ensure_topic, produce
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.spec import load_spec
from tests.krishiv.test_offsets import recreate_topic

PIPELINE = """
[[pipelines]]
name = "payments"
kind = "events"
topic = "{topic}"

[pipelines.fields]
payment_id = "string"
amount = "decimal(10,2)"
{extra}
"""


def _write(tmp_path, broker, topic, extra: str = "") -> str:
    path = tmp_path / "krishiv.toml"
    settings = SETTINGS_TEMPLATE.format(
        bootstrap=broker.bootstrap, partitions=2, catalog_uri="sqlite:///catalog.db", warehouse="w", topic=topic
    )
    path.write_text(settings + PIPELINE.format(topic=topic, extra=extra))
    return str(path)


def _check(path: str, capsys) -> tuple[int, dict]:
    code = main(["--spec", path, "check", "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_a_new_pipeline_checks_clean_and_nothing_is_created(tmp_path, broker, topic, capsys):
    path = _write(tmp_path, broker, topic)
    code, doc = _check(path, capsys)
    assert code == 1 and doc["checks"][0]["check"] == "broker" and not doc["checks"][0]["ok"]
    assert f"topic {topic!r} of pipeline 'payments' does not exist" in doc["checks"][0]["detail"]
    ensure_topic(broker.bootstrap, topic, 2)
    code, doc = _check(path, capsys)
    assert (code, doc["version"], doc["command"], doc["ok"]) == (0, 1, "check", True)
    assert [(c["check"], c["detail"]) for c in doc["checks"]] == [
        ("broker", f"topic {topic} on {broker.bootstrap}: 2 partitions"),
        ("offsets", "nothing read yet: the first run starts at the topic's first offsets"),
        ("catalog", f"no catalog at sqlite:///{tmp_path}/catalog.db yet: the first run creates it"),
        ("table payments", "new: created at the first run"),
        ("table payments_rejects", "new: created at the first run"),
        ("history", f"no ledger yet at {tmp_path}/ledger.duckdb: the first run starts one"),
        ("rejects", "nothing read yet"),
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["krishiv.toml"], "nothing was created"


def test_a_spec_change_is_said_before_a_run_makes_it_or_refuses_it(tmp_path, broker, spark, topic, capsys):
    path = _write(tmp_path, broker, topic)
    ensure_topic(broker.bootstrap, topic, 2)
    produce(broker.bootstrap, topic, [OrderEvent(0, 0, b"k", b'{"payment_id": "p", "amount": 1}', "valid")])
    spec = load_spec(path, env={})
    run_pipelines(spec, list(spec.pipelines), once=True)
    commit_pipelines(spec, list(spec.pipelines))
    code, doc = _check(path, capsys)
    assert code == 0
    assert [c["detail"] for c in doc["checks"][1:2] + doc["checks"][3:]] == [
        "the next batch's offsets are on the broker",
        "takes the spec as it is",
        "takes the spec as it is",
        "the ledger, the checkpoint and the tables tell one history",
        "0 of 1 records rejected (0%) in its last batch (it warns above 50%, KRISHIV_REJECT_RATE_WARN)",
    ]
    _write(tmp_path, broker, topic, extra='coupon = { type = "string", required = false }')
    code, doc = _check(path, capsys)
    assert code == 0 and doc["checks"][3]["detail"] == "the next run adds coupon"
    spec_file = tmp_path / "krishiv.toml"
    spec_file.write_text(spec_file.read_text().replace('payment_id = "string"', 'payment_id = "long"'))
    assert main(["--spec", path, "check"]) == 1
    out = capsys.readouterr().out
    assert "FAIL payments: table payments: table krishiv.payments: column 'payment_id' is string in the table" in out
    table = load_catalog(spec).load_table(qualified(spec, "payments"))
    assert [f.name for f in table.schema().fields] == ["payment_id", "amount"], "nothing was changed"

    # The pipeline's topic changed in the spec: refused by check and by run, both topics named, nothing read.
    _write(tmp_path, broker, topic)
    spec_file.write_text(spec_file.read_text().replace(f'topic = "{topic}"', f'topic = "{topic}-other"'))
    ensure_topic(broker.bootstrap, f"{topic}-other", 2)
    code, doc = _check(path, capsys)
    history = next(c for c in doc["checks"] if c["check"] == "history")
    assert code == 1 and not history["ok"], doc
    refusal = (
        f"pipeline 'payments' has read topic '{topic}' (its batches are in the ledger and its checkpoint) and the spec "
        f"now says topic '{topic}-other'"
    )
    assert history["detail"].startswith(refusal) and "A spec change the table cannot take)" in history["detail"]
    assert main(["--spec", path, "run", "--once"]) == 2
    assert refusal in capsys.readouterr().err
    assert load_spec(path, env={}).pipeline().topic == f"{topic}-other"
    table = load_catalog(spec).load_table(qualified(spec, "payments"))
    assert len(table.snapshots()) == 1, "nothing was staged or committed from the other topic"

    # The topic deleted and re-created since the last batch: check says what run would stop on, with the way out.
    spec_file.write_text(spec_file.read_text().replace(f'topic = "{topic}-other"', f'topic = "{topic}"'))
    recreate_topic(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, [OrderEvent(0, 0, b"k", b'{"payment_id": "q", "amount": 2}', "valid")])
    code, doc = _check(path, capsys)
    offsets = next(c for c in doc["checks"] if c["check"] == "offsets")
    assert code == 1 and not offsets["ok"] and offsets["detail"].startswith("topic re-created: its id is "), doc
    assert "krishiv skip-offsets" in offsets["detail"]
