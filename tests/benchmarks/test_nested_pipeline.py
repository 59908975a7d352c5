"""The bench's nested pipeline figure, small: nested orders produced by the bench's producer, landed by the ``events``
kind as ``make bench`` times it, and the table read back equal to the records as docs/spec.md's nested rule reads
them (a struct a struct, a list in order, a map's entries, decimals exact, the ISO-8601 time in UTC), folded here
from the produced JSON without the decoder."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from benchmarks.runner import REPO
from benchmarks.throughput import NESTED_EVENTS_TABLE, bench_spec, nested_events_spec, run_nested_events
from benchmarks.workload import nested_orders, produce_nested_orders
from krishiv_core.spec import load_spec

RECORDS = 3_000


def _expected(value: dict[str, Any]) -> dict[str, Any]:
    """A valid nested order's row by the rule: what each JSON part becomes in its column."""
    return {
        "order_id": value["order_id"],
        "customer": {"id": value["customer"]["id"], "address": {"city": value["customer"]["address"]["city"]}},
        "amount": Decimal(value["amount"]).quantize(Decimal("0.01")),
        "lines": [
            {"sku": line["sku"], "qty": line["qty"], "price": Decimal(line["price"]).quantize(Decimal("0.01"))}
            for line in value["lines"]
        ],
        "attrs": sorted((k, Decimal(v).quantize(Decimal("0.000001"))) for k, v in value["attrs"].items()),
        "meta": {"event_time": datetime.fromisoformat(value["meta"]["event_time"]).astimezone(UTC)},
    }


def test_the_generated_nested_orders_are_the_flat_orders_values_nested():
    events = nested_orders(40, seed=3, partitions=4)
    assert [e.partition for e in events] == [i % 4 for i in range(40)]
    first = json.loads(events[0].value or b"")
    assert set(first) == {"order_id", "customer", "amount", "lines", "attrs", "meta"}
    assert first["customer"]["id"] == events[0].key.decode() if events[0].key else False
    assert first["lines"][0]["price"] == first["amount"] and len(first["lines"]) == 2
    assert first["meta"]["event_time"].endswith("+00:00")
    assert len({json.loads(e.value or b"")["order_id"] for e in events}) == 40


@pytest.mark.heavy  # a minute or more of its own; make test-heavy (docs/testing.md)
@pytest.mark.timeout(300)
def test_the_nested_events_pipeline_lands_every_order_as_the_rule_reads_it(tmp_path: Path, broker, spark):
    topic = f"orders-nested-{tmp_path.name[-12:]}"
    assert produce_nested_orders(broker.bootstrap, topic, RECORDS, seed=11, partitions=4) > 0
    base = load_spec(REPO / "krishiv.toml", env={})
    spec = nested_events_spec(bench_spec(base, tmp_path / "work", broker.bootstrap, topic, 1_500), topic)

    run = run_nested_events(spark, spec, RECORDS)

    assert run.rows_written == RECORDS and run.rejects == 0 and run.batches == 2 and run.snapshots >= 1
    assert 0 < run.commit_s < run.seconds and run.events_per_s > 0
    from krishiv_core.catalog import load_catalog, qualified

    table = load_catalog(spec).load_table(qualified(spec, NESTED_EVENTS_TABLE))
    names = ["order_id", "customer", "amount", "lines", "attrs", "meta"]
    rows = table.scan(selected_fields=tuple(names)).to_arrow().select(names).to_pylist()
    got = sorted(({**r, "attrs": sorted(r["attrs"])} for r in rows), key=lambda r: r["order_id"])
    produced = [json.loads(e.value or b"") for e in nested_orders(RECORDS, seed=11, partitions=4)]
    assert got == sorted((_expected(v) for v in produced), key=lambda r: r["order_id"])
