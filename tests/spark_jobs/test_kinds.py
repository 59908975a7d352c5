"""Every pipeline kind from one topic, end to end through the real broker, Spark and both SQL catalogs.

Four pipelines read the same orders: raw events into a partitioned table with Kafka metadata, raw events
routed by customer to three tables, per-customer hopping windows in update mode, and the latest order per
customer (an upsert with tombstones). Each table is compared with an independent oracle (``chaos.kinds_oracle``)
after a run, and again after a checkpoint rewind replays batches (nothing may change).
"""

from __future__ import annotations

import shutil
from decimal import Decimal
from pathlib import Path

import pytest
from confluent_kafka import Producer
from pyiceberg.expressions import EqualTo

from chaos.kinds_oracle import expected_events, expected_grouped_windows, expected_upsert
from chaos.oracle import read_topic
from chaos.workspace import ORDER_FIELDS, SETTINGS_TEMPLATE
from krishiv.operations import commit_pipelines, open_ledger, run_pipelines
from krishiv.produce import demo_orders, ensure_topic, produce
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.spec import KrishivSpec, load_spec
from spark_jobs.checkpoint import Checkpoint
from spark_jobs.kafka_source import latest_offsets

KINDS_SPEC = (
    SETTINGS_TEMPLATE
    + """
[[pipelines]]
name = "orders_raw"
kind = "events"
topic = "{topic}"
kafka_metadata = true
partition_by = ["day(event_time)", "bucket(4, customer_id)"]
max_records_per_batch = 700
{fields}
[[pipelines]]
name = "orders_routed"
kind = "events"
topic = "{topic}"
route_by = "customer_id"
routes = {{ "c-001" = "orders_c001", "c-002" = "orders_c002" }}
unrouted = "orders_other"
max_records_per_batch = 700
{fields}
[[pipelines]]
name = "customer_minutes"
topic = "{topic}"
event_time_field = "event_time"
window = "1m"
slide = "30s"
group_by = ["customer_id"]
output_mode = "update"
max_records_per_batch = 700
{fields}
[[pipelines.aggregations]]
name = "orders"
function = "count"

[[pipelines.aggregations]]
name = "amount_total"
function = "sum"
field = "amount"

[[pipelines]]
name = "latest_order"
kind = "upsert"
topic = "{topic}"
key = ["customer_id"]
version_field = "event_time"
partition_by = ["bucket(8, customer_id)"]
max_records_per_batch = 700
{fields}
"""
)

TOMBSTONED = [b"c-003", b"c-004", b"c-005"]


def _spec(tmp_path: Path, bootstrap: str, topic: str, catalog_uri: str) -> KrishivSpec:
    path = tmp_path / "krishiv.toml"
    path.write_text(
        KINDS_SPEC.format(
            bootstrap=bootstrap,
            partitions=3,
            catalog_uri=catalog_uri,
            warehouse="warehouse",
            topic=topic,
            fields=ORDER_FIELDS,
        )
    )
    return load_spec(path, env={})


def _produce(spec: KrishivSpec, records: int, seed: int, start_ms: int | None = None) -> None:
    topic = spec.pipelines[0].topic
    partitions = ensure_topic(spec.kafka.bootstrap_servers, topic, spec.kafka.partitions)
    extra = {} if start_ms is None else {"start_ms": start_ms}
    produce(
        spec.kafka.bootstrap_servers,
        topic,
        demo_orders(records, seed=seed, partitions=partitions, malformed=records // 100, **extra),
    )


def _tombstones(spec: KrishivSpec) -> None:
    producer = Producer({"bootstrap.servers": spec.kafka.bootstrap_servers})
    for key in TOMBSTONED:  # one record per produce request: Tansu's high watermark counts batches, not records
        producer.produce(spec.pipelines[0].topic, key=key, value=None, partition=0)
        producer.flush(30)


def _rows(spec: KrishivSpec, table: str):
    return load_catalog(spec).load_table(qualified(spec, table)).scan().to_arrow()


def _check(spec: KrishivSpec, *, tombstoned: bool = False) -> None:
    topic = spec.pipelines[0].topic
    ends = {int(p): o for p, o in latest_offsets(spec.kafka.bootstrap_servers, topic, {}).items()}
    keys: dict = {}
    records = read_topic(spec.kafka.bootstrap_servers, topic, spec.kafka.partitions, ends, keys)
    ledger = open_ledger(spec)
    raw, routed, windowed, upsert = spec.pipelines

    # events: every valid order exactly once, with its Kafka coordinates; files pruned by partition
    expected = expected_events(records, raw)
    rows = _rows(spec, raw.table)
    seen = list(zip(rows.column("_kafka_partition").to_pylist(), rows.column("_kafka_offset").to_pylist(), strict=True))
    assert len(seen) == len(set(seen)), "an event was written twice"
    assert set(seen) == expected.rows[raw.table]
    assert set(rows.column("_kafka_topic").to_pylist()) == {topic}
    table = load_catalog(spec).load_table(qualified(spec, raw.table))
    one_customer = table.scan(row_filter=EqualTo("customer_id", "c-010"))
    assert 0 < len(list(one_customer.plan_files())) < len(list(table.scan().plan_files())), "bucket pruning"
    assert _rows(spec, raw.rejects_table).num_rows == len(expected.rejects)

    # fan-out: each route's table holds exactly its customers' orders
    expected = expected_events(records, routed)
    for name in routed.tables:
        rows = _rows(spec, name)
        seen = set(zip(rows.column("order_id").to_pylist(), rows.column("customer_id").to_pylist(), strict=True))
        assert rows.num_rows == len(seen) == len(expected.rows[name]), name
    assert {r for r in _rows(spec, "orders_c001").column("customer_id").to_pylist()} <= {"c-001"}

    # windowed, per customer, hopping, update mode
    batches = ledger.entries(table=qualified(spec, windowed.rejects_table))
    want = expected_grouped_windows(records, batches, windowed)
    rows = _rows(spec, windowed.table).to_pylist()
    got = {
        (int(r["window_start"].timestamp() * 1000), int(r["window_end"].timestamp() * 1000), r["customer_id"]): (
            r["orders"],
            r["amount_total"],
        )
        for r in rows
    }
    assert len(got) == len(rows), "a window row is there twice"
    assert got == want

    # upsert: the latest order per customer; tombstoned customers gone
    batches = ledger.entries(table=qualified(spec, upsert.rejects_table))
    want_rows = expected_upsert(records, keys, batches, topic)
    rows = _rows(spec, upsert.table).to_pylist()
    got_rows = {r["customer_id"]: (r["order_id"], r["amount"], r["event_time"]) for r in rows}
    assert len(got_rows) == len(rows), "a key is there twice"
    assert got_rows.keys() == want_rows.keys()
    for key, (order_id, amount, event_time) in got_rows.items():
        w = want_rows[key]
        assert (order_id, int(event_time.timestamp() * 1000), Decimal(amount)) == (w.order_id, w.event_time, w.amount)
    if tombstoned:
        assert not {k.decode() for k in TOMBSTONED} & got_rows.keys()


# heavy: make test checks every kind against the same oracle in the matrix's kinds-driver-killed and kinds-relay-killed
@pytest.mark.heavy
@pytest.mark.parametrize("catalog", ["sqlite", "postgresql"])
def test_every_kind_from_one_topic_is_exactly_once(catalog, tmp_path, broker, spark, topic, request):
    uri = request.getfixturevalue("postgres_uri") if catalog == "postgresql" else "sqlite:///catalog.db"
    spec = _spec(tmp_path, broker.bootstrap, topic, uri)
    _produce(spec, 2_000, seed=7)
    run_pipelines(spec, list(spec.pipelines), once=True)
    commit_pipelines(spec, list(spec.pipelines))
    _check(spec)

    # More orders, then tombstones; and a rewound checkpoint replays two batches of every pipeline.
    _produce(spec, 1_000, seed=8, start_ms=1_767_225_600_000 + 2_000 * 50)
    _tombstones(spec)
    copies = {}
    for p in spec.pipelines:
        copies[p.name] = tmp_path / f"copy-{p.name}"
        shutil.copytree(spec.checkpoint_dir(p), copies[p.name])
    run_pipelines(spec, list(spec.pipelines), once=True)
    commit_pipelines(spec, list(spec.pipelines))
    _check(spec, tombstoned=True)
    snapshots = {
        t: len(load_catalog(spec).load_table(qualified(spec, t)).snapshots()) for p in spec.pipelines for t in p.tables
    }

    for p in spec.pipelines:
        shutil.rmtree(spec.checkpoint_dir(p))
        shutil.copytree(copies[p.name], spec.checkpoint_dir(p))
        assert Checkpoint(spec.checkpoint_dir(p)).has_batches()
    replay = run_pipelines(spec, list(spec.pipelines), once=True)
    assert not any(b.recorded for r in replay for b in r.stager.history)
    commit_pipelines(spec, list(spec.pipelines))
    _check(spec, tombstoned=True)
    assert snapshots == {
        t: len(load_catalog(spec).load_table(qualified(spec, t)).snapshots()) for p in spec.pipelines for t in p.tables
    }
