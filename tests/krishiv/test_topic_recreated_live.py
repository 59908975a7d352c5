"""A topic re-created under a live run: the broker (in-memory, as ``krishiv broker`` runs it) is killed and started
again empty on the same port, and the topic is re-created and filled with new events. The continuous ``krishiv
run`` must not read the new topic from the old one's offsets under the old one's identity: it stops at the first
batch of the new topic with one line holding the ``krishiv skip-offsets`` commands; following them, every event of
both incarnations is in the table once, ``verify`` is clean before and after, and what arrives next shows as lag.

The real ``krishiv run`` process, Tansu, Spark, ledger and catalog; the oracle is the set of order ids produced.
"""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from pathlib import Path

import pytest

from chaos.workspace import EVENTS_SPEC_TEMPLATE
from krishiv.broker import LocalBroker, free_port, start_broker
from krishiv.produce import demo_orders, ensure_topic, produce
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.spec import load_spec
from tests.services.processes import stop
from tests.spark_jobs.pipeline_helpers import all_committed, krishiv_cli, start_krishiv, wait_for

TIMEOUT_S = 240.0  # a bound, not a target: Spark starts in a process of its own on a loaded 2-core machine
PARTITIONS = 2


def _orders(seed: int, records: int) -> list:
    return demo_orders(records, seed=seed, partitions=PARTITIONS, start_ms=1_767_225_600_000 + seed * 3_600_000)


def _order_ids(events: list) -> list[str]:
    return [json.loads(e.value)["order_id"] for e in events if e.kind == "valid"]


@pytest.mark.heavy  # make test: tests/krishiv/test_offsets.py (re-created with a batch in flight, skip, verify)
def test_a_topic_re_created_under_a_live_run_stops_it_at_the_new_topics_first_batch(tmp_path: Path) -> None:
    port = free_port("127.0.0.1")
    broker: LocalBroker = start_broker(port=port, log_path=tmp_path / "tansu.log")
    spec_file = tmp_path / "krishiv.toml"
    spec_file.write_text(
        EVENTS_SPEC_TEMPLATE.format(
            bootstrap=broker.bootstrap,
            partitions=PARTITIONS,
            catalog_uri="sqlite:///catalog.db",
            warehouse="warehouse",
            topic="readings",
            max_records=10,
        )
    )
    spec = load_spec(spec_file, env={})
    # The old topic's offsets end above the new one's, as a busy topic re-created would: lag must not hide behind them.
    first, second = _orders(1, 60), _orders(2, 40)
    output = tmp_path / "run.log"
    run = None
    try:
        ensure_topic(broker.bootstrap, "readings", PARTITIONS)
        produce(broker.bootstrap, "readings", first)
        run = start_krishiv(spec_file, "run", output=output)
        wait_for(lambda: all_committed(spec), "the first topic's events were not committed", output, TIMEOUT_S)

        # The broker dies and comes back empty on the same port; the topic is re-created and filled.
        broker.process.kill()
        broker.process.wait(30)
        broker = start_broker(port=port, log_path=tmp_path / "tansu-again.log")
        ensure_topic(broker.bootstrap, "readings", PARTITIONS)
        produce(broker.bootstrap, "readings", second)

        # Without the per-batch identity check the run would read the new topic from the old offsets on and commit
        # it as the old one: wait for whichever comes first.
        wait_for(
            lambda: run.poll() is not None or all_committed(spec),
            "the run did not stop, nor commit the new topic,",
            output,
            TIMEOUT_S,
        )
        code = run.wait(TIMEOUT_S)
    finally:
        if run is not None:
            stop(run)
    said = output.read_text()
    assert code == 2, said
    failures = [line for line in said.splitlines() if line.startswith("krishiv run:")]
    assert len(failures) == 1 and "is not the one this query began on" in failures[0], said
    assert "Traceback" not in said, said

    try:
        verified = krishiv_cli(spec_file, "verify")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        # Nothing of the new topic was staged under the old one's identity: the table holds the first topic only.
        assert Counter(_rows(spec)) == Counter(_order_ids(first))

        commands = re.findall(r"krishiv skip-offsets [^;]*?--reason \"[^\"]*\"", failures[0])
        assert len(commands) == PARTITIONS, failures[0]
        for command in commands:
            skipped = krishiv_cli(spec_file, *shlex.split(command)[1:])
            assert skipped.returncode == 0, skipped.stdout + skipped.stderr
        for step in (("run", "--once"), ("commit",), ("verify",)):
            done = krishiv_cli(spec_file, *step)
            assert done.returncode == 0, (step, done.stdout + done.stderr)
        # What arrives next is lag, counted from the new topic's offsets (the old one's were higher).
        produce(broker.bootstrap, "readings", _orders(3, 20))
        status = krishiv_cli(spec_file, "status", "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        (pipeline,) = json.loads(status.stdout)["pipelines"]
        assert sum(p["lag"] for p in pipeline["partitions"]) == 20, pipeline["partitions"]
    finally:
        broker.stop()
    rows = Counter(_rows(spec))
    expected = Counter(_order_ids(first) + _order_ids(second))
    assert rows == expected, {
        k: (rows[k], expected[k]) for k in rows.keys() | expected.keys() if rows[k] != expected[k]
    }


def _rows(spec) -> list[str]:
    table = load_catalog(spec).load_table(qualified(spec, spec.pipeline().table))
    return table.scan(selected_fields=("order_id",)).to_arrow().column("order_id").to_pylist()
