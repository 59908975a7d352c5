"""Krishiv's tables read by engines written by others, each applying the position delete files itself.

Spark stages an upsert pipeline (the latest order per customer, partitioned by bucket) and per-customer hopping
windows in update mode from one topic, both merged on read; the tables are compacted, and one more run merges into
them again, in two batches (so a merge deletes rows of several files of one partition: the compacted file and the
last batch's). polars' native reader (its scan planned by its plugin, and by pyiceberg), DuckDB and daft then read
both tables in a virtualenv of their own (``tests/services/other_engines.py``), and each must equal the oracle folded
from the topic (``chaos.kinds_oracle``: the upsert rule and the windowed rule of docs/spec.md).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pyarrow as pa

from chaos.kinds_oracle import expected_grouped_windows, expected_upsert
from chaos.oracle import read_topic
from chaos.workspace import ORDER_FIELDS, SETTINGS_TEMPLATE
from krishiv.operations import commit_pipelines, open_ledger, run_pipelines
from krishiv.produce import DEFAULT_SPACING_MS, DEFAULT_START_MS
from krishiv_core.catalog import ensure_table, load_catalog, qualified
from krishiv_core.entries import OutboxEntry, new_snapshot_id
from krishiv_core.spec import load_spec
from krishiv_core.tables import event_table_schema
from outbox.compaction import compact_table
from outbox.ledger import Ledger
from outbox.position_deletes import write_position_deletes
from outbox.relay import CommitRelay
from outbox.snapshot_producer import row_delta
from spark_jobs.kafka_source import latest_offsets
from spark_jobs.staging import staging_folder, write_parquet
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


NESTED_PIPELINE = """
[[pipelines]]
name = "vans"
kind = "events"
topic = "vans"

[pipelines.fields]
id = "long"
ts = "timestamp"
tags = { type = "list", element = "string", required = false }
readings = { type = "list", element = { type = "struct", fields = { at = "timestamp", value = "decimal(20,6)" } } }
attrs = { type = "map", key = "string", value = { type = "decimal(38,10)", required = false }, required = false }
extra = { type = "json", required = false }

[pipelines.fields.gps]
type = "struct"
required = false

[pipelines.fields.gps.fields]
lat = "double"
lon = { type = "double", required = false }

[pipelines.fields.gps.fields.meta]
type = "struct"
required = false
fields = { site = "string", at = { type = "timestamp", required = false } }
"""
_TS = pa.timestamp("us", "UTC")
#: The rows as Spark hands them to the stager (Arrow's own part names: item, entries).
SPARK_VANS = pa.schema(
    [
        ("id", pa.int64()),
        ("ts", _TS),
        (
            "gps",
            pa.struct(
                [
                    ("lat", pa.float64()),
                    ("lon", pa.float64()),
                    ("meta", pa.struct([("site", pa.string()), ("at", _TS)])),
                ]
            ),
        ),
        ("tags", pa.list_(pa.string())),
        ("readings", pa.list_(pa.struct([("at", _TS), ("value", pa.decimal128(20, 6))]))),
        ("attrs", pa.map_(pa.string(), pa.decimal128(38, 10))),
        ("extra", pa.string()),
    ]
)
BATCH_ROWS, BATCHES_BEFORE, BATCHES_AFTER = 40, 4, 2


def _decimal(rng: random.Random, precision: int, scale: int) -> Decimal:
    """A decimal(precision, scale) value, built from its digits (Python's 28-digit context never rounds it)."""
    edges = ["9" * precision, "0", "1", "9" * scale]
    digits = rng.choice(edges) if rng.random() < 0.3 else str(rng.randrange(10 ** rng.randint(1, precision)))
    digits = digits.rjust(scale + 1, "0")
    return Decimal(f"{rng.choice(['', '-'])}{digits[:-scale]}.{digits[-scale:]}")


def _van_rows(rng: random.Random, first_id: int) -> list[dict]:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    rows = []
    for i in range(first_id, first_id + BATCH_ROWS):
        at = start + timedelta(microseconds=rng.randrange(10**12))
        gps = rng.choice(
            [
                None,
                {"lat": rng.uniform(-90, 90), "lon": None, "meta": None},
                {"lat": -0.0, "lon": 4.3, "meta": {"site": rng.choice(["ams", "", "Zürich"]), "at": None}},
                {"lat": 52.1, "lon": rng.uniform(-180, 180), "meta": {"site": "rtm", "at": at}},
            ]
        )
        keys = rng.sample(["speed", "load", "", "ключ", "temp"], rng.randint(0, 4))
        rows.append(
            {
                "id": i,
                "ts": at,
                "gps": gps,
                "tags": rng.choice([None, [], ["cold"], ["cold", "late", ""], [f"t{i}"] * 3]),
                "readings": [
                    {"at": at + timedelta(seconds=k), "value": _decimal(rng, 20, 6)} for k in range(rng.randint(0, 3))
                ],
                "attrs": rng.choice([None, [(k, rng.choice([None, _decimal(rng, 38, 10)])) for k in keys]]),
                "extra": rng.choice([None, '{"a":[1,2.50],"b":null}', '"x"', "[]", "0.1e5"]),
            }
        )
    return rows


def _normal(row: dict) -> dict:
    """A row as every engine gives it: a map as its (key, value) pairs (polars has no map: a list of key/value
    structs), every timestamp compared as an instant."""
    attrs = row["attrs"]
    if attrs is not None:
        attrs = [(e["key"], e["value"]) if isinstance(e, dict) else tuple(e) for e in attrs]
    return {**row, "attrs": attrs}


def _documented_queries() -> list[str]:
    """The SQL statements docs/formats.md shows under "Reading nested columns", as written there."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    section = text.split("## Reading nested columns", 1)[1]
    block = section.split("```sql\n", 1)[1].split("```", 1)[0]
    return [line.split(";")[0] for line in block.splitlines() if line.strip()]


def test_a_nested_table_the_relay_committed_reads_back_the_same_rows_in_every_engine(
    tmp_path: Path, other_engines: OtherEngines
) -> None:
    """Nested rows staged as Spark stages them and committed by the relay, some deleted by position (one delete file
    folded by a compaction, one left for the readers to apply), read by pyiceberg, DuckDB, polars and daft: each
    equal to the rows written less those deleted; and the DuckDB queries of docs/formats.md run as written."""
    spec_file = tmp_path / "krishiv.toml"
    spec_file.write_text(
        SETTINGS_TEMPLATE.format(
            bootstrap="127.0.0.1:9", partitions=1, catalog_uri="sqlite:///catalog.db", warehouse="wh"
        )
        + NESTED_PIPELINE
    )
    spec = load_spec(spec_file, env={})
    (pipeline,) = spec.pipelines
    catalog = load_catalog(spec)
    name = qualified(spec, pipeline.table)
    ensure_table(catalog, tuple(name.split(".")), event_table_schema(pipeline))
    ledger = Ledger(str(tmp_path / "ledger.duckdb"))
    rng = random.Random(36)
    written: dict[str, list[dict]] = {}  # staged file -> its rows, in order

    def commit_batches(batch_ids: range) -> None:
        table = catalog.load_table(name)
        for batch_id in batch_ids:
            rows = _van_rows(rng, batch_id * BATCH_ROWS)
            (staged,) = write_parquet(
                table, pa.Table.from_pylist(rows, SPARK_VANS), staging_folder(table, "q", batch_id)
            )
            written[staged.path] = rows
            entry = OutboxEntry(
                "q",
                pipeline.name,
                name,
                batch_id,
                {"vans": {"0": [batch_id, batch_id + 1]}},
                (staged,),
                new_snapshot_id(),
                {},
            )
            assert ledger.record_batch([entry]) == [True]
        assert CommitRelay(ledger, catalog).commit_table(name).committed == list(batch_ids)

    def delete_by_position(path: str, positions: list[int]) -> None:
        table = catalog.load_table(name)
        live = {t.file.file_path: t.file for t in table.scan().plan_files()}
        deletes = pa.table({"file_path": [path] * len(positions), "pos": positions})
        row_delta(table, [], write_position_deletes(table, deletes, {path: live[path]}), new_snapshot_id(), {})
        written[path] = [r for i, r in enumerate(written[path]) if i not in positions]

    commit_batches(range(BATCHES_BEFORE))
    first, *_ = written
    delete_by_position(first, [0, 7, BATCH_ROWS - 1])
    report = compact_table(catalog.load_table(name), target_file_size=MB, min_files=2)
    assert report.snapshot_id is not None, report
    commit_batches(range(BATCHES_BEFORE, BATCHES_BEFORE + BATCHES_AFTER))
    last = list(written)[-1]
    delete_by_position(last, [1, 2])
    table = catalog.load_table(name)
    assert [len(t.delete_files) for t in table.scan().plan_files() if t.file.file_path == last] == [1]

    want = sorted((_normal(r) for rows in written.values() for r in rows), key=lambda r: r["id"])
    assert len(want) == (BATCHES_BEFORE + BATCHES_AFTER) * BATCH_ROWS - 5
    by_engine = {"pyiceberg": table.scan().to_arrow()}
    by_engine |= other_engines.read({"vans": table.metadata_location}, tmp_path / "read")["vans"]
    for engine, rows in by_engine.items():
        assert sorted((_normal(r) for r in rows.to_pylist()), key=lambda r: r["id"]) == want, engine

    # The documented DuckDB queries, as written, over this table's metadata file.
    create, *queries = _documented_queries()
    create = re.sub(r"iceberg_scan\('[^']*'\)", f"iceberg_scan('{table.metadata_location}')", create)
    expected = [
        [
            (r["id"], r["gps"] and r["gps"]["lat"], r["gps"] and r["gps"]["meta"] and r["gps"]["meta"]["site"])
            for r in want
        ],
        [(r["id"], tag) for r in want for tag in r["tags"] or []],
        [(r["id"], x["at"], x["value"]) for r in want for x in r["readings"]],
        [(r["id"], dict(r["attrs"] or []).get("speed")) for r in want],
    ]
    assert len(queries) == len(expected)
    for i, (query, rows) in enumerate(zip(queries, expected, strict=True)):
        got = other_engines.duckdb_sql([create, query], tmp_path / f"query{i}.parquet")
        assert sorted((tuple(r.values()) for r in got.to_pylist()), key=_sortable) == sorted(rows, key=_sortable), query


def _sortable(row: tuple) -> tuple:
    """A row's sort key with nulls first (None does not compare with values)."""
    return tuple((v is not None, v if v is not None else 0) for v in row)
