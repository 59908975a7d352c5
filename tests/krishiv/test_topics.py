"""``krishiv topic list|describe|create`` on the real broker, through the CLI's one-line errors."""

from __future__ import annotations

import json

from krishiv.cli import main
from krishiv.produce import OrderEvent, produce
from outbox.ledger import Ledger


def test_create_describe_and_list_a_topic(make_spec, spec_file, broker, topic, capsys) -> None:
    spec = make_spec(partitions=3)
    own = f"{topic}-own"
    assert main(["--spec", str(spec_file), "topic", "create", own]) == 0
    assert capsys.readouterr().out.strip() == f"topic {own} created 3 partitions"
    assert main(["--spec", str(spec_file), "topic", "create", own, "--partitions", "5"]) == 0
    assert capsys.readouterr().out.strip() == f"topic {own} exists already, with 3 partitions"
    produce(broker.bootstrap, own, [OrderEvent(n, 1, b"k", b"{}", "valid") for n in range(4)])

    assert main(["--spec", str(spec_file), "topic", "describe", own]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"topic {own} (id ") and lines[0].endswith("read by no pipeline of this spec")
    assert lines[1:] == [
        "  partition 0: offsets 0 to 0 (0 offsets)",
        "  partition 1: offsets 0 to 4 (4 offsets)",
        "  partition 2: offsets 0 to 0 (0 offsets)",
    ]
    assert main(["--spec", str(spec_file), "topic", "create", spec.pipeline().topic]) == 0
    capsys.readouterr()
    assert main(["--spec", str(spec_file), "topic", "list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert f"{own}  3 partitions" in listed
    assert f"{spec.pipeline().topic}  3 partitions  (read by {spec.pipeline().name})" in listed


def test_a_topic_is_made_before_any_spec_exists(broker, topic, tmp_path, monkeypatch, capsys) -> None:
    """In a folder with no spec, `krishiv topic` reaches the broker of --bootstrap or $KRISHIV_KAFKA_BOOTSTRAP: the
    first topic is made before `krishiv init --topic` (which needs it) writes the spec."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KRISHIV_SPEC", raising=False)
    assert main(["topic", "create", topic, "--bootstrap", broker.bootstrap, "--partitions", "2"]) == 0
    assert capsys.readouterr().out.strip() == f"topic {topic} created 2 partitions"
    monkeypatch.setenv("KRISHIV_KAFKA_BOOTSTRAP", broker.bootstrap)
    assert main(["topic", "list"]) == 0
    assert f"{topic}  2 partitions" in capsys.readouterr().out.splitlines()
    assert not list(tmp_path.iterdir())  # nothing written: no spec, no state


def test_a_topic_the_broker_does_not_have_or_a_bad_name_is_one_line(make_spec, spec_file, topic, capsys) -> None:
    make_spec()
    assert main(["--spec", str(spec_file), "topic", "describe", f"{topic}-none"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        f"no topic '{topic}-none' on {make_spec().kafka.bootstrap_servers}: krishiv topic create {topic}-none"
    )
    assert len(err.splitlines()) == 1
    assert main(["--spec", str(spec_file), "topic", "create", "a topic"]) == 2
    assert "not a valid Kafka topic name: 'a topic'" in capsys.readouterr().err


def test_status_of_a_pipeline_whose_topic_is_missing_names_the_way_out_and_exits_1(
    make_spec, spec_file, topic, capsys
) -> None:
    spec = make_spec(topic=f"{topic}-never-made")
    Ledger(spec.resolve(spec.storage.ledger_path)).migrate()  # a pipeline that ran once, its topic gone since
    assert main(["--spec", str(spec_file), "status"]) == 1
    err = capsys.readouterr().err
    assert f"topic '{topic}-never-made' does not exist on " in err
    assert f"krishiv topic create {topic}-never-made" in err and "A topic that does not exist)" in err
    assert main(["--spec", str(spec_file), "status", "--json"]) == 1
    (pipeline,) = json.loads(capsys.readouterr().out)["pipelines"]
    assert "does not exist" in pipeline["broker_error"]
