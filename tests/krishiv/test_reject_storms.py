"""A reject storm is loud: a pipeline whose spec reads none of what its topic holds (a field declared ``string`` that
arrives as a JSON object) makes ``krishiv run`` warn of each batch, ``status`` warn, ``check`` fail and ``verify``
say how many records were read and rejected; a pipeline with a few rejects stays quiet. Through the real broker,
Spark and a SQLite catalog, with the CLI run in this process (the rule itself: ``tests/krishiv_core/
test_reject_rate.py``)."""

from __future__ import annotations

import json
import re

from chaos.workspace import SETTINGS_TEMPLATE
from krishiv.cli import main
from krishiv.produce import OrderEvent, ensure_topic, produce

PIPELINES = """
[[pipelines]]
name = "payments"
kind = "events"
topic = "{topic}"
max_records_per_batch = 20

[pipelines.fields]
payment_id = "string"
note = "string"

[[pipelines]]
name = "quiet"
kind = "events"
topic = "{topic}-quiet"

[pipelines.fields]
payment_id = "string"
note = "string"
"""

#: The reason the field rule gives a record whose ``note`` is a JSON object (docs/spec.md, "Field types").
OBJECT_NOTE = "mistyped field: note (string, got a JSON object)"
RUNBOOK = "(see docs/operations.md: Recovery runbook > A pipeline that rejects most records)"


def _payment(n: int, note: object) -> bytes:
    return json.dumps({"payment_id": f"p-{n}", "note": note}).encode()


def _send(bootstrap: str, topic: str, values: list[bytes]) -> None:
    ensure_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, [OrderEvent(n, n % 2, None, v, "valid") for n, v in enumerate(values)])


def _json(args: list[str], capsys) -> tuple[int, dict]:
    code = main(args)
    return code, json.loads(capsys.readouterr().out)


def test_a_pipeline_that_rejects_everything_is_said_by_run_status_check_and_verify(
    tmp_path, broker, spark, topic, capsys, monkeypatch
):
    path = tmp_path / "krishiv.toml"
    settings = SETTINGS_TEMPLATE.format(
        bootstrap=broker.bootstrap, partitions=2, catalog_uri="sqlite:///catalog.db", warehouse="w", topic=topic
    )
    path.write_text(settings + PIPELINES.format(topic=topic))
    spec = ["--spec", str(path)]
    storm = [_payment(n, {"text": "paid"}) for n in range(60)]  # every note an object: every record a reject
    quiet = [_payment(n, {"text": "paid"} if n % 10 == 0 else "paid") for n in range(20)]  # 2 of 20 rejected
    _send(broker.bootstrap, topic, storm)
    _send(broker.bootstrap, f"{topic}-quiet", quiet)
    stormy = sum(1 for v in storm if isinstance(json.loads(v)["note"], dict))
    few = sum(1 for v in quiet if isinstance(json.loads(v)["note"], dict))
    rejects_table = "krishiv.payments_rejects"

    # run: the batch lines as ever, and for each batch of the storm one warning line with its most common reason.
    assert main([*spec, "run", "--once"]) == 0
    out, err = capsys.readouterr()
    batches = re.findall(r"^payments batch (\d+): (\d+) read, 0 rows, (\d+) rejected", out, re.MULTILINE)
    assert sum(int(read) for _, read, _ in batches) == stormy and all(r == j for _, r, j in batches), out
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        f"warning: payments batch {b}: {r} of {r} records rejected (100%), {r} of them for: {OBJECT_NOTE}; each "
        f"rejected record and its reason is in {rejects_table} {RUNBOOK}"
        for b, r, _ in batches
    ], err
    assert re.search(rf"^quiet batch \d+: {len(quiet)} read, {len(quiet) - few} rows, {few} rejected", out, re.M)

    # status: a warning naming the rate of the last batches, which --json carries; none for the quiet pipeline.
    assert main([*spec, "status"]) == 0
    err = capsys.readouterr().err
    line = (
        f"warning: payments: {stormy} of {stormy} records rejected (100%) in its last {len(batches)} batches (it warns "
        f"above 50%, KRISHIV_REJECT_RATE_WARN): the spec does not read what the topic holds; each rejected record and "
        f"its reason is in {rejects_table} {RUNBOOK}"
    )
    assert line in err.splitlines() and "warning: quiet" not in err, err
    code, doc = _json([*spec, "status", "--json"], capsys)
    by_name = {p["name"]: p for p in doc["pipelines"]}
    assert code == 0 and by_name["payments"]["recent_rejects"] == {
        "batches": len(batches),
        "read": stormy,
        "rejected": stormy,
        "rate": 1.0,
        "warn_above": 0.5,
        "alarming": True,
    }
    assert by_name["payments"]["warnings"] == [line.removeprefix("warning: payments: ")]
    assert by_name["quiet"]["recent_rejects"]["rate"] == few / len(quiet) and by_name["quiet"]["warnings"] == []

    # check: fails on the storm, with the same line; the quiet pipeline's rejects check passes, saying its rate.
    code, doc = _json([*spec, "check", "--json"], capsys)
    rejects = {c["pipeline"]: c for c in doc["checks"] if c["check"] == "rejects"}
    assert code == 1 and [c["pipeline"] for c in doc["checks"] if not c["ok"]] == ["payments"], doc
    assert rejects["payments"]["detail"] == line.removeprefix("warning: payments: ")
    assert rejects["quiet"] == {
        "pipeline": "quiet",
        "check": "rejects",
        "ok": True,
        "detail": f"{few} of {len(quiet)} records rejected (10%) in its last batch (it warns above 50%, "
        "KRISHIV_REJECT_RATE_WARN)",
    }

    # verify: the tables are exactly-once (exit 0), and it says what the batches read and rejected, and the storm.
    assert main([*spec, "commit"]) == 0
    capsys.readouterr()
    assert main([*spec, "verify"]) == 0
    out = capsys.readouterr().out
    assert f"krishiv.payments: ok (0 rows, 0 snapshots; its batches read {stormy} records, rejected {stormy})" in out
    assert f"  warning: {line.removeprefix('warning: payments: ')}" in out.splitlines()
    assert f"krishiv.quiet: ok ({len(quiet) - few} rows, 1 snapshot; its batches read {len(quiet)} records, " in out
    code, doc = _json([*spec, "verify", "--json"], capsys)
    tables = {t["table"]: t for t in doc["tables"]}
    assert code == 0 and doc["ok"]
    assert (tables["krishiv.payments"]["records_read"], tables["krishiv.payments"]["rejects"]) == (stormy, stormy)
    assert (tables["krishiv.quiet"]["records_read"], tables["krishiv.quiet"]["rejects"]) == (len(quiet), few)
    assert tables["krishiv.quiet"]["warnings"] == [] and tables[rejects_table]["rejects"] is None

    # The share is the user's: at 5% the quiet pipeline's 10% warns too; a share that is not one is one line.
    monkeypatch.setenv("KRISHIV_REJECT_RATE_WARN", "5%")
    code, doc = _json([*spec, "status", "--json", "--pipeline", "quiet"], capsys)
    assert doc["pipelines"][0]["warnings"][0].startswith(f"{few} of {len(quiet)} records rejected (10%) in its last")
    monkeypatch.setenv("KRISHIV_REJECT_RATE_WARN", "lots")
    assert main([*spec, "status"]) == 2
    refusal = "KRISHIV_REJECT_RATE_WARN: expected a share from 0 to 1 (such as 0.5, or 50%), got 'lots'"
    assert capsys.readouterr().err.strip() == f"krishiv status: {refusal}"
