"""``krishiv produce --file``: a user's own JSON lines, keyed by a field, into a table through the real pipeline."""

from __future__ import annotations

import json
import zlib

from chaos.workspace import SETTINGS_TEMPLATE
from krishiv.cli import main
from krishiv.operations import commit_pipelines, run_pipelines
from krishiv.produce import file_events
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.spec import load_spec

PIPELINE = """
[[pipelines]]
name = "payments"
kind = "events"
topic = "{topic}"
kafka_metadata = ["partition", "offset", "key"]

[pipelines.fields]
payment_id = "string"
amount = "decimal(10,2)"
"""


def test_lines_are_keyed_by_a_field_and_partitioned_as_librdkafka_puts_a_key() -> None:
    lines = ['{"payment_id": "p-1", "amount": 1}', "", '{"payment_id": 7, "amount": 2}', "not json\n"]
    keyed = file_events(lines[:3], 4, "payment_id", "f.jsonl")
    assert [(e.key, e.partition, e.value) for e in keyed] == [
        (b"p-1", zlib.crc32(b"p-1") % 4, lines[0].encode()),
        (b"7", zlib.crc32(b"7") % 4, lines[2].encode()),
    ]
    assert [(e.key, e.partition) for e in file_events(lines, 2, None, "f.jsonl")] == [(None, 0), (None, 1), (None, 0)]
    # A line with nothing to key by goes as it is, without a key (it becomes a reject, or an unkeyed event).
    odd = [*lines, '{"amount": 3}', '{"payment_id": null}', "[1]"]
    sent = file_events(odd, 2, "payment_id", "f.jsonl")
    assert [(e.key, e.value) for e in sent[2:]] == [(None, line.rstrip().encode()) for line in odd[3:]]
    assert [e.partition for e in sent[2:]] == [2 % 2, 3 % 2, 4 % 2, 5 % 2], "round the partitions, as without --key"


def test_a_users_own_file_lands_in_the_table_and_its_bad_lines_are_rejects(tmp_path, broker, spark, topic, capsys):
    path = tmp_path / "krishiv.toml"
    settings = SETTINGS_TEMPLATE.format(
        bootstrap=broker.bootstrap, partitions=3, catalog_uri="sqlite:///catalog.db", warehouse="w", topic=topic
    )
    path.write_text(settings + PIPELINE.format(topic=topic))
    rows = [{"payment_id": f"p-{n}", "amount": f"{n}.25"} for n in range(20)]
    events = tmp_path / "payments.jsonl"
    events.write_text("\n".join([*(json.dumps(r) for r in rows), '{"payment_id": "p-x", "amount": "lots"}']) + "\n")
    assert main(["--spec", str(path), "produce", "--file", str(events), "--key", "payment_id"]) == 0
    assert capsys.readouterr().out.strip() == f"produced 21 lines of {events} to {topic} (keyed by payment_id)"
    spec = load_spec(path, env={})
    run_pipelines(spec, list(spec.pipelines), once=True)
    commit_pipelines(spec, list(spec.pipelines))
    catalog = load_catalog(spec)
    table = catalog.load_table(qualified(spec, "payments")).scan().to_arrow().to_pylist()
    assert sorted((r["payment_id"], str(r["amount"])) for r in table) == sorted(
        (r["payment_id"], r["amount"]) for r in rows
    )
    assert all(r["_kafka_key"] == r["payment_id"].encode() for r in table)
    assert all(r["_kafka_partition"] == zlib.crc32(r["_kafka_key"]) % 3 for r in table)
    [reject] = catalog.load_table(qualified(spec, "payments_rejects")).scan().to_arrow().to_pylist()
    assert reject["reason"] == 'mistyped field: amount (decimal(10,2), got a JSON string "lots": not a number)'


def test_a_key_at_a_dotted_path_keys_the_line_and_a_key_no_line_holds_sends_nothing(tmp_path, capsys) -> None:
    lines = ['{"van": {"id": "v-1"}, "n": 1}', '{"van": {"id": 7}}', '{"van": "v-2"}', '{"n": 2}']
    sent = file_events(lines, 4, "van.id", "f.jsonl")
    assert [e.key for e in sent] == [b"v-1", b"7", None, None]
    assert sent[0].partition == zlib.crc32(b"v-1") % 4
    path = tmp_path / "krishiv.toml"
    settings = SETTINGS_TEMPLATE.format(
        bootstrap="127.0.0.1:1", partitions=3, catalog_uri="sqlite:///catalog.db", warehouse="w", topic="t"
    )
    path.write_text(settings + PIPELINE.format(topic="t"))
    events = tmp_path / "payments.jsonl"
    events.write_text('{"payment_id": "p-1", "amount": 1}\n')
    assert main(["--spec", str(path), "produce", "--file", str(events), "--key", "van.id"]) == 2
    out = capsys.readouterr()
    assert f"no line of {events} has van.id" in out.out + out.err and "nothing was sent" in out.out + out.err
