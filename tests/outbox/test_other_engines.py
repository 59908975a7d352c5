"""Krishiv's tables read by engines written by others, each applying the position delete files itself.

Spark stages an upsert pipeline (the latest order per customer, partitioned by bucket) and per-customer hopping
windows in update mode from one topic, both merged on read; the tables are compacted, and one more run merges into
them again, in two batches (so a merge deletes rows of several files of one partition: the compacted file and the
last batch's). polars' native reader (its scan planned by its plugin, and by pyiceberg) and DuckDB then read both
tables in a virtualenv of their own (``tests/services/other_engines.py``), and each must equal the oracle folded
from the topic (``chaos.kinds_oracle``: the upsert rule and the windowed rule of docs/spec.md).
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from pathlib import Path

import pyarrow as pa

from chaos.kinds_oracle import expected_grouped_windows, expected_upsert
from chaos.oracle import read_topic
from chaos.workspace import ORDER_FIELDS, SETTINGS_TEMPLATE
from krishiv.operations import commit_pipelines, open_ledger, run_pipelines
from krishiv.produce import DEFAULT_SPACING_MS, DEFAULT_START_MS
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.spec import load_spec
from outbox.compaction import compact_table
from spark_jobs.kafka_source import latest_offsets
from tests.outbox.test_compaction import MB
from tests.services.other_engines import OtherEngines
from tests.spark_jobs.test_kinds import _produce

SPEC = (
    SETTINGS_TEMPLATE
    + """
[[pipelines]]
name = "customer_minutes"
topic = "{topic}"
event_time_field = "event_time"
window = "1m"
slide = "30s"
group_by = ["customer_id"]
output_mode = "update"
max_records_per_batch = 150
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
partition_by = ["bucket(4, customer_id)"]
max_records_per_batch = 150
{fields}
"""
)
FIRST_RUN, SECOND_RUN = 300, 300


def test_polars_and_duckdb_read_merged_and_compacted_tables_equal_to_the_oracle(
    tmp_path: Path, broker, spark, topic, other_engines: OtherEngines
) -> None:
    spec_file = tmp_path / "krishiv.toml"
    spec_file.write_text(
        SPEC.format(
            bootstrap=broker.bootstrap,
            partitions=3,
            catalog_uri="sqlite:///catalog.db",
            warehouse="warehouse",
            topic=topic,
            fields=ORDER_FIELDS,
        )
    )
    spec = load_spec(spec_file, env={})
    windowed, upsert = spec.pipelines
    _produce(spec, FIRST_RUN, seed=7)
    run_pipelines(spec, spec.pipelines, once=True)
    commit_pipelines(spec, spec.pipelines)
    catalog = load_catalog(spec)
    for p in spec.pipelines:
        report = compact_table(catalog.load_table(qualified(spec, p.table)), target_file_size=MB, min_files=2)
        assert report.snapshot_id is not None, report
    # One more run, in two batches: orders of the same customers, in the windows the first run left open.
    _produce(spec, SECOND_RUN, seed=8, start_ms=DEFAULT_START_MS + FIRST_RUN * DEFAULT_SPACING_MS)
    run_pipelines(spec, spec.pipelines, once=True)
    commit_pipelines(spec, spec.pipelines)

    tables = {p.name: catalog.load_table(qualified(spec, p.table)) for p in spec.pipelines}
    for name, table in tables.items():
        deleted_from = Counter(str(t.file.partition) for t in table.scan().plan_files() if t.delete_files)
        assert max(deleted_from.values(), default=0) >= 2, f"{name}: no partition with deletes in several files"
    read = other_engines.read({name: t.metadata_location for name, t in tables.items()}, tmp_path / "read")

    ends = {int(p): o for p, o in latest_offsets(spec.kafka.bootstrap_servers, topic, {}).items()}
    keys: dict = {}
    records = read_topic(spec.kafka.bootstrap_servers, topic, spec.kafka.partitions, ends, keys)
    ledger = open_ledger(spec)
    batches = {p.name: ledger.entries(table=qualified(spec, p.rejects_table)) for p in spec.pipelines}
    want_windows = expected_grouped_windows(records, batches[windowed.name], windowed)
    want_orders = {
        customer: (o.order_id, o.event_time, o.amount)
        for customer, o in expected_upsert(records, keys, batches[upsert.name], topic).items()
    }
    for engine, rows in read[windowed.name].items():
        assert _windows(rows) == want_windows, engine
    for engine, rows in read[upsert.name].items():
        assert _orders(rows) == want_orders, engine


def _ms(value) -> int:
    return int(value.timestamp() * 1000)


def _windows(rows: pa.Table) -> dict:
    """(window start ms, window end ms, customer) -> (orders, amount total); a row there twice fails."""
    got = {
        (_ms(r["window_start"]), _ms(r["window_end"]), r["customer_id"]): (r["orders"], Decimal(r["amount_total"]))
        for r in rows.to_pylist()
    }
    assert len(got) == rows.num_rows, "a window row is there twice"
    return got


def _orders(rows: pa.Table) -> dict:
    """customer -> (order id, event time ms, amount); a customer there twice fails."""
    got = {r["customer_id"]: (r["order_id"], _ms(r["event_time"]), Decimal(r["amount"])) for r in rows.to_pylist()}
    assert len(got) == rows.num_rows, "a key is there twice"
    return got
