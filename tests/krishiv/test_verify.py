"""``krishiv verify`` on every kind, through the real broker, Spark and a real catalog.

One topic feeds four pipelines: raw events without Kafka metadata, raw events routed by customer to three
tables with ``_kafka_partition`` and ``_kafka_offset``, per-customer hopping windows in update mode (merged),
and the latest order per customer (an upsert, merged). After a clean run every table verifies; then a second
writer appends, with pyiceberg, rows that are already there, and verify names each one.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.table import Table

from chaos.workspace import ORDER_FIELDS, SETTINGS_TEMPLATE
from krishiv.operations import commit_pipelines, run_pipelines, verify_pipelines
from krishiv.produce import demo_orders, ensure_topic, produce
from krishiv.verify import OFFSET_KEY
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.spec import KrishivSpec, load_spec

#: Every kind from one topic; ``{fields}`` is :data:`chaos.workspace.ORDER_FIELDS`.
KINDS_SPEC = (
    SETTINGS_TEMPLATE
    + """
[[pipelines]]
name = "orders_plain"
kind = "events"
topic = "{topic}"
max_records_per_batch = 1000
{fields}
[[pipelines]]
name = "orders_routed"
kind = "events"
topic = "{topic}"
route_by = "customer_id"
routes = {{ "c-001" = "orders_c001", "c-002" = "orders_c002" }}
unrouted = "orders_other"
kafka_metadata = ["partition", "offset"]
max_records_per_batch = 1000
{fields}
[[pipelines]]
name = "customer_minutes"
topic = "{topic}"
event_time_field = "event_time"
window = "1m"
slide = "30s"
group_by = ["customer_id"]
output_mode = "update"
max_records_per_batch = 1000
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
max_records_per_batch = 1000
{fields}
"""
)

#: The row key each table is verified by.
EXPECTED_KEYS = {
    "orders_plain": (),
    "orders_c001": OFFSET_KEY,
    "orders_c002": OFFSET_KEY,
    "orders_other": OFFSET_KEY,
    "customer_minutes": ("window_start", "window_end", "customer_id"),
    "latest_order": ("customer_id",),
}


def kinds_spec(folder: Path, bootstrap: str, topic: str, catalog_uri: str = "sqlite:///catalog.db") -> KrishivSpec:
    path = folder / "krishiv.toml"
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


def produce_kinds(spec: KrishivSpec, records: int = 2_000) -> None:
    topic = spec.pipelines[0].topic
    partitions = ensure_topic(spec.kafka.bootstrap_servers, topic, spec.kafka.partitions)
    produce(spec.kafka.bootstrap_servers, topic, demo_orders(records, seed=11, partitions=partitions, malformed=20))


def load(spec: KrishivSpec, table: str) -> Table:
    return load_catalog(spec).load_table(qualified(spec, table))


def append(spec: KrishivSpec, table: str, rows: pa.Table) -> dict:
    """A second writer appends ``rows`` to ``table``; returns the first of them."""
    load(spec, table).append(rows.cast(pa.schema(list(rows.schema))))
    return rows.to_pylist()[0]


def first_row(spec: KrishivSpec, table: str) -> pa.Table:
    return load(spec, table).scan().to_arrow().slice(0, 1)


def show(value) -> str:
    return repr(value) if isinstance(value, str) else str(value)


@pytest.mark.parametrize("catalog", ["sqlite", "postgresql"])
def test_verify_passes_every_kind_and_names_each_duplicate_a_second_writer_adds(
    catalog, tmp_path, broker, spark, topic, request
):
    uri = request.getfixturevalue("postgres_uri") if catalog == "postgresql" else "sqlite:///catalog.db"
    spec = kinds_spec(tmp_path, broker.bootstrap, topic, uri)
    produce_kinds(spec)
    run_pipelines(spec, list(spec.pipelines), once=True)
    commit_pipelines(spec, list(spec.pipelines))

    results = {r.table: r for r in verify_pipelines(spec, list(spec.pipelines))}
    assert set(results) == {qualified(spec, t) for p in spec.pipelines for t in p.all_tables}
    assert all(r.ok for r in results.values()), {t: r.violations for t, r in results.items() if not r.ok}
    for name, key in EXPECTED_KEYS.items():
        assert results[qualified(spec, name)].key == key, name
    for name in ("orders_plain", "orders_other", "customer_minutes", "latest_order"):  # few orders of c-001, c-002
        assert results[qualified(spec, name)].rows > 0, name
    assert all(r.key == () for t, r in results.items() if t.endswith("_rejects"))

    # A window row, an upserted key and a routed event appended again, and an event copied into another route.
    window = append(spec, "customer_minutes", first_row(spec, "customer_minutes"))
    key = append(spec, "latest_order", first_row(spec, "latest_order"))["customer_id"]
    routed = load(spec, "orders_other").scan().to_arrow()
    event = append(spec, "orders_other", routed.slice(0, 1))
    moved = append(spec, "orders_c001", routed.slice(1, 1))
    plain_rows = load(spec, "orders_plain").scan().to_arrow().num_rows
    append(spec, "orders_plain", first_row(spec, "orders_plain"))  # no Kafka coordinates: only the ledger's count

    results = {r.table: r for r in verify_pipelines(spec, list(spec.pipelines))}
    bad = {t for t, r in results.items() if not r.ok}
    names = ("customer_minutes", "latest_order", "orders_other", "orders_c001", "orders_plain")
    assert bad == {qualified(spec, t) for t in names}
    plain = qualified(spec, "orders_plain")
    foreign = load(spec, "orders_plain").current_snapshot().snapshot_id
    assert results[plain].violations == [
        f"snapshot {foreign} (append by another writer, not a Krishiv batch) added 1 rows to {plain}, which has no "
        "per-row key to tell them from Krishiv's",
        f"{plain} holds {plain_rows + 1} rows but the ledger committed {plain_rows}",
    ]

    (line,) = results[qualified(spec, "customer_minutes")].violations
    assert line.startswith(
        f"window {window['window_start']} to {window['window_end']}, customer_id={show(window['customer_id'])} "
        "appears more than once (2 rows, added by snapshots ["
    )
    (line,) = results[qualified(spec, "latest_order")].violations
    assert line.startswith(f"key customer_id={show(key)} appears more than once (2 rows, added by snapshots [")

    other = qualified(spec, "orders_other")
    c001 = qualified(spec, "orders_c001")
    partition, offset = event["_kafka_partition"], event["_kafka_offset"]
    moved_at = f"Kafka partition {moved['_kafka_partition']} offset {moved['_kafka_offset']}"
    assert (
        results[other]
        .violations[0]
        .startswith(f"Kafka partition {partition} offset {offset} appears more than once (2 rows, added by snapshots [")
    )
    assert f"{moved_at} is in more than one table: {c001} (1 row), {other} (1 row)" in results[other].violations
    assert results[c001].violations == [f"{moved_at} is in more than one table: {c001} (1 row), {other} (1 row)"]
    # The duplicated rows are named, and nothing else is: lineage and the ledger still agree.
    assert len(results[other].violations) == 2
