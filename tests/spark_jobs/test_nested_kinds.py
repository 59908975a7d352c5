"""Keys, groups, routes and partitions at paths inside structs (docs/spec.md "Paths in keys"), end to end through
the real broker, Spark and a SQLite catalog: one topic of device readings read by

- ``events`` partitioned by ``day(meta.ts)`` and routed by ``meta.kind``;
- ``upsert`` keyed by ``device.id`` with version ``meta.seq``, partitioned by ``bucket(4, device.id)``, with
  tombstones whose Kafka key is the key's value itself (a one-field key);
- ``windowed`` per ``meta.site``, the exact sum of ``reading.value`` (a decimal) by event time ``meta.ts``, in
  update mode.

The oracles fold the records as the generator wrote them (it knows which ones the rule refuses) by each kind's
documented rule, in the batches the ledger recorded; nothing of Krishiv's computes an expected value.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from pyiceberg.expressions import GreaterThanOrEqual

from chaos.kinds_oracle import UpsertEvent, fold_upserts
from chaos.oracle import read_topic
from chaos.workspace import SETTINGS_TEMPLATE
from krishiv.operations import commit_pipelines, open_ledger, run_pipelines, verify_pipelines
from krishiv.produce import ensure_topic
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.spec import KrishivSpec, load_spec
from spark_jobs.kafka_source import latest_offsets

PARTITIONS = 3
FIELDS = """
[pipelines.fields]
id = "string"
device = { type = "struct", fields = { id = "long", name = { type = "string", required = false } } }
reading = { type = "struct", fields = { value = "decimal(12,3)" } }

[pipelines.fields.meta]
type = "struct"
fields = { ts = "timestamp_ms", kind = "string", site = "string", seq = { type = "long", required = false } }
"""
PIPELINES = """
[[pipelines]]
name = "readings"
kind = "events"
topic = "{topic}"
partition_by = ["day(meta.ts)"]
route_by = "meta.kind"
routes = {{ "a" = "readings_a", "b" = "readings_b" }}
unrouted = "readings_other"
max_records_per_batch = 150
{fields}
[[pipelines]]
name = "latest_reading"
kind = "upsert"
topic = "{topic}"
key = ["device.id"]
version_field = "meta.seq"
partition_by = ["bucket(4, device.id)"]
max_records_per_batch = 150
{fields}
[[pipelines]]
name = "site_minutes"
topic = "{topic}"
event_time_field = "meta.ts"
group_by = ["meta.site"]
window = "1m"
watermark_delay = "5s"
output_mode = "update"
max_records_per_batch = 150
aggregations = [
  {{ name = "readings", function = "count" }},
  {{ name = "total", function = "sum", field = "reading.value" }},
]
{fields}
"""
T0 = 1_772_409_000_000  # 2026-03-01T23:50:00Z: the readings cross midnight, so day(meta.ts) makes two partitions
DAY_MS = 86_400_000
TOMBSTONED = (3, 8)


def _spec(tmp_path: Path, bootstrap: str, topic: str) -> KrishivSpec:
    path = tmp_path / "krishiv.toml"
    settings = SETTINGS_TEMPLATE.format(
        bootstrap=bootstrap, partitions=PARTITIONS, catalog_uri="sqlite:///catalog.db", warehouse="warehouse"
    )
    path.write_text(settings + PIPELINES.format(topic=topic, fields=FIELDS))
    return load_spec(path, env={})


def _readings(rng: random.Random, n: int) -> list[tuple[int, bytes, dict[str, Any] | None]]:
    """(device, the JSON value, the event the rule reads from it, or None for one it refuses)."""
    out = []
    for i in range(n):
        device = rng.randrange(10)
        ts = T0 + i * 1_500 - (rng.randrange(120_000, 600_000) if rng.random() < 0.04 else 0)  # some arrive late
        value = rng.choice(["12.345", "0.001", "-7.5", "999999999.999", "0", "42"])
        seq = rng.randrange(5) if rng.random() < 0.8 else None  # ties and a missing (null) version are common
        meta = {"ts": ts, "kind": rng.choice("aabc"), "site": rng.choice(["north", "south", "east"])}
        doc: dict[str, Any] = {
            "id": f"r{i}",
            "meta": {**meta, **({"seq": seq} if seq is not None else {}), "extra": [1]},  # an unknown key: ignored
            "device": {"id": device, "name": rng.choice([None, f"van-{device}"])},
            "reading": {"value": rng.choice([value, json.loads(value)])},  # a JSON string or a plain JSON number
        }
        read: dict[str, Any] | None = {
            "id": f"r{i}",
            "meta": {**meta, "seq": seq},
            "device": {"id": device},
            "reading": {"value": Decimal(value)},
        }
        broken = rng.random()
        if broken < 0.01:
            text = b'{"id": "r", "meta": {'  # malformed JSON
        else:
            if broken < 0.02:
                doc["reading"]["value"] = "1.0005"  # four decimal places: the scale is 3
            elif broken < 0.03:
                del doc["meta"]["ts"]  # missing field: meta.ts
            elif broken < 0.04:
                doc["device"] = "van"  # a string for a struct
            text = json.dumps(doc).encode()
        out.append((device, text, read if broken >= 0.04 else None))
    return out


def _produce(spec: KrishivSpec, records: list[tuple[int, bytes | None]]) -> None:
    topic = spec.pipelines[0].topic
    ensure_topic(spec.kafka.bootstrap_servers, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": spec.kafka.bootstrap_servers, "linger.ms": 0})
    for device, value in records:  # a device's records in one partition, keyed by the key's value (device.id)
        producer.produce(topic, key=str(device).encode(), value=value, partition=device % PARTITIONS)
        producer.flush(30)


def _batches(spec: KrishivSpec, table: str) -> list[tuple[int, list[tuple[int, int]]]]:
    topic = spec.pipelines[0].topic
    entries = sorted(open_ledger(spec).entries(table=qualified(spec, table)), key=lambda e: e.batch_id)
    return [
        (e.batch_id, [(int(p), o) for p, (start, end) in sorted(e.offsets[topic].items()) for o in range(start, end)])
        for e in entries
    ]


def _rows(spec: KrishivSpec, table: str) -> list[dict[str, Any]]:
    return load_catalog(spec).load_table(qualified(spec, table)).scan().to_arrow().to_pylist()


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


# heavy: three pipelines through Spark (4 minutes on two busy cores); make test has the nested chaos scenario's
# compact run (tests/chaos/test_nested.py: partitions by day(meta.ts) and bucket(4, device.id), device.id, meta.site)
@pytest.mark.heavy
def test_paths_into_structs_key_group_route_and_partition_every_kind(tmp_path, broker, spark, topic) -> None:
    spec = _spec(tmp_path, broker.bootstrap, topic)
    readings = _readings(random.Random(36), 600)
    by_value = {text: read for _device, text, read in readings}
    _produce(spec, [(device, text) for device, text, _ in readings[:450]])
    _produce(spec, [(d, None) for d in TOMBSTONED])  # each key's row goes, and its version is forgotten
    _produce(spec, [(device, text) for device, text, _ in readings[450:]])
    run_pipelines(spec, list(spec.pipelines), once=True)
    commit_pipelines(spec, list(spec.pipelines))

    ends = {int(p): o for p, o in latest_offsets(spec.kafka.bootstrap_servers, topic, {}).items()}
    keys: dict = {}
    records = read_topic(spec.kafka.bootstrap_servers, topic, PARTITIONS, ends, keys)
    assert len(records) == len(readings) + len(TOMBSTONED)
    events, upsert, windowed = spec.pipelines

    # events: each valid reading once in its route's table (meta.kind: a, b, else the unrouted table), each file
    # of one day of meta.ts, and a filter on meta.ts planning only the files of the days it may match
    valid = {(p, o): by_value[v] for (p, o), v in records.items() if v is not None and by_value[v] is not None}
    tables = {"a": "readings_a", "b": "readings_b"}
    for table in events.tables:
        want = sorted(e["id"] for e in valid.values() if tables.get(e["meta"]["kind"], "readings_other") == table)
        rows = _rows(spec, table)
        assert sorted(r["id"] for r in rows) == want, table
        iceberg = load_catalog(spec).load_table(qualified(spec, table))
        days = set()
        for task in iceberg.scan().plan_files():
            in_file = {_ms(m["ts"]) // DAY_MS for m in pq.read_table(task.file.file_path).column("meta").to_pylist()}
            assert in_file == {task.file.partition[0]}, task.file.file_path
            days |= in_file
        assert len(days) == 2, "the readings cross midnight"
        midnight = datetime.fromtimestamp((max(days) * DAY_MS) / 1000, UTC).isoformat()
        late = iceberg.scan(row_filter=GreaterThanOrEqual("meta.ts", midnight))
        assert len(list(late.plan_files())) < len(list(iceberg.scan().plan_files()))
    refused = sorted((p, o) for (p, o), v in records.items() if v is not None and by_value[v] is None)
    tombstones = sorted((p, o) for (p, o), v in records.items() if v is None)  # outside an upsert, rejects
    got = sorted((r["partition"], r["offset"]) for r in _rows(spec, events.rejects_table))
    assert got == sorted([*refused, *tombstones])

    # upsert: the greatest (meta.seq, position) per device.id since its last tombstone, folded in the order the
    # batches read the records (offset, then partition within a batch)
    folded = []
    for _batch, coordinates in _batches(spec, upsert.table):
        for p, o in sorted(coordinates, key=lambda c: (c[1], c[0])):
            value = records.get((p, o), b"")
            if value is None:
                folded.append(UpsertEvent(int(keys[(p, o)].decode()), tombstone=True))
            elif by_value.get(value) is not None:
                e = by_value[value]
                folded.append(UpsertEvent(e["device"]["id"], e["meta"]["seq"], e["id"]))
    want_rows = fold_upserts(folded)
    rows = _rows(spec, upsert.table)
    assert Counter(r["device"]["id"] for r in rows).most_common(1)[0][1] == 1, "a key is there twice"
    assert {r["device"]["id"]: r["id"] for r in rows} == want_rows
    assert sorted((r["partition"], r["offset"]) for r in _rows(spec, upsert.rejects_table)) == refused

    # windowed: per (1-minute window, meta.site) the count and exact sum of reading.value of the events that were
    # not late: an event is late when its window ended at or before the watermark the batch before left (the
    # latest meta.ts so far less 5 s); late events are rows of the rejects table
    state: dict[tuple[int, int, str], list] = {}
    late = []
    watermark = 0
    for _batch, coordinates in _batches(spec, windowed.rejects_table):
        latest = None
        for p, o in coordinates:
            e = by_value.get(records.get((p, o), b""))
            if e is None:
                continue
            t = e["meta"]["ts"]
            latest = t if latest is None else max(latest, t)
            start = t - t % 60_000
            if watermark > 0 and start + 60_000 <= watermark:
                late.append((p, o))
                continue
            agg = state.setdefault((start, start + 60_000, e["meta"]["site"]), [0, Decimal(0)])
            agg[0] += 1
            agg[1] += e["reading"]["value"]
        if latest is not None:
            watermark = max(watermark, latest - 5_000)
    assert late, "the generator sends some readings late"
    rows = _rows(spec, windowed.table)
    got_windows = {
        (_ms(r["window_start"]), _ms(r["window_end"]), r["meta_site"]): [r["readings"], r["total"]] for r in rows
    }
    assert len(got_windows) == len(rows), "a window row is there twice"
    assert got_windows == state
    rejects = _rows(spec, windowed.rejects_table)
    assert sorted((r["partition"], r["offset"]) for r in rejects) == sorted([*refused, *tombstones, *late])
    assert sum(r["reason"].startswith("late: ") for r in rejects) == len(late)

    # verify: no two rows share a key (device.id; a window and meta_site), and the tables agree with the ledger
    results = verify_pipelines(spec, list(spec.pipelines))
    assert all(r.ok for r in results), {r.table: r.violations for r in results if not r.ok}
    keys_checked = {r.table: r.key for r in results}
    assert keys_checked[qualified(spec, upsert.table)] == ("device.id",)
    assert keys_checked[qualified(spec, windowed.table)] == ("window_start", "window_end", "meta_site")
