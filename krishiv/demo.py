"""``krishiv demo``: one pipeline of each kind from one topic, on embedded defaults, in a state folder of its own.

Starts a Tansu broker on a free loopback port, produces seeded orders (some late, some malformed) and a few
tombstones, stages them with Spark in several micro-batches, commits them with the relay, then prints every
table, the verification and a line of figures per pipeline, and stops the broker.

The pipelines are the spec's first (in the repository's ``krishiv.toml``: windowed orders per minute; where no spec
is found, the same pipeline from :data:`CLASSIC_PIPELINE`) and the four of :data:`DEMO_PIPELINES`, which read the
same topic: raw events with Kafka metadata, a fan-out by customer, per-customer hopping windows in update mode and
the latest order per customer (an upsert). They are the demo's own, not the repository spec's, so ``krishiv run``
and the Dagster code location keep the one classic pipeline.
"""

from __future__ import annotations

import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.table import Table as RichTable

from krishiv.state_folder import DEMO_MARKER, reset_folder
from krishiv_core.spec import (
    EVENTS,
    UPSERT,
    WINDOWED,
    IcebergSettings,
    KrishivSpec,
    PipelineSpec,
    StorageSettings,
    parse_spec,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table

    from outbox.relay import TableCommitReport
    from spark_jobs.job import RunningPipeline

#: The demo's pipelines beside the spec's first; each reads that pipeline's topic (filled in by :func:`demo_spec`).
DEMO_PIPELINES = """
[[pipelines]]                       # every order as a row, with where it was in Kafka
name = "orders_raw"
kind = "events"
kafka_metadata = true               # _kafka_topic, _kafka_partition, _kafka_offset, _kafka_timestamp, _kafka_key
partition_by = ["day(event_time)"]

[[pipelines]]                       # fan-out: two customers' orders to tables of their own, the rest to a third
name = "orders_by_customer"
kind = "events"
route_by = "customer_id"
routes = { "c-001" = "orders_c001", "c-002" = "orders_c002" }
unrouted = "orders_other_customers"

[[pipelines]]                       # per customer, 10-minute windows every 5 minutes, updated as orders arrive
name = "orders_per_customer"
event_time_field = "event_time"
window = "10m"
slide = "5m"
group_by = ["customer_id"]
output_mode = "update"
aggregations = [
  { name = "orders", function = "count" },
  { name = "amount_total", function = "sum", field = "amount" },
]

[[pipelines]]                       # the latest order per customer; a tombstone (null value) deletes its key
name = "latest_order"
kind = "upsert"
key = ["customer_id"]
version_field = "event_time"
partition_by = ["bucket(8, customer_id)"]
"""

#: The demo's first pipeline where no spec is found (``krishiv demo`` in an empty folder, Krishiv installed from its
#: wheel): the repository's ``krishiv.toml`` pipeline, windowed orders per minute (a test keeps the two the same).
CLASSIC_PIPELINE = """
[[pipelines]]
name = "orders_per_minute"
topic = "orders"
table = "orders_per_minute"
event_time_field = "event_time"
watermark_delay = "5s"
window = "1m"
trigger_interval = "2s"
max_records_per_batch = 200000
catch_up_records_per_batch = 1000000
aggregations = [
  { name = "order_count", function = "count" },
  { name = "amount_total", function = "sum", field = "amount" },
]
"""

#: The fields of the orders ``krishiv produce`` and the demo write.
ORDER_FIELDS = {"order_id": "string", "customer_id": "string", "amount": "decimal(12,2)", "event_time": "timestamp_ms"}

#: Customers whose Kafka key the demo sends a tombstone for, after the orders.
TOMBSTONED = ("c-003", "c-004", "c-005")

BATCHES = 5  # micro-batches per pipeline, about
WIDTH = 80  # what every printed table fits in


def classic_spec() -> KrishivSpec:
    """A spec of :data:`CLASSIC_PIPELINE` alone, on the embedded defaults (the demo moves its state to ``--state``)."""
    raw = tomllib.loads(CLASSIC_PIPELINE)["pipelines"]
    return parse_spec({"pipelines": [{**p, "fields": ORDER_FIELDS} for p in raw]}, env={})


def embedded_spec(spec: KrishivSpec, state: Path, bootstrap: str) -> KrishivSpec:
    """The spec pointed at ``bootstrap``, with a SQLite catalog, warehouse, ledger and checkpoints in ``state``."""
    state = state.resolve()
    return replace(
        spec,
        kafka=replace(spec.kafka, bootstrap_servers=bootstrap),
        iceberg=IcebergSettings(
            f"sqlite:///{state}/catalog.db", str(state / "warehouse"), spec.iceberg.namespace, spec.iceberg.catalog_name
        ),
        storage=StorageSettings(str(state / "ledger.duckdb"), str(state / "checkpoints")),
    )


def demo_pipelines(topic: str) -> tuple[PipelineSpec, ...]:
    """:data:`DEMO_PIPELINES`, reading ``topic``, parsed and checked as any spec's pipelines are."""
    raw = tomllib.loads(DEMO_PIPELINES)["pipelines"]
    return parse_spec({"pipelines": [{**p, "topic": topic, "fields": ORDER_FIELDS} for p in raw]}, env={}).pipelines


def demo_spec(spec: KrishivSpec, state: Path, bootstrap: str, records: int) -> KrishivSpec:
    """The spec's first pipeline and the demo's, on the demo's broker and state folder, in :data:`BATCHES` batches."""
    spec = embedded_spec(spec, state, bootstrap)
    first = spec.pipeline()
    pipelines = (first, *demo_pipelines(first.topic))
    taken = [t for p in pipelines for t in p.all_tables]
    if len(set(taken)) != len(taken) or len({p.name for p in pipelines}) != len(pipelines):
        raise ValueError(f"the spec's first pipeline {first.name!r} shares a name or table with the demo's")
    per_batch = max(1, -(-(records + len(TOMBSTONED)) // BATCHES))
    # The demo shows several batches: no catch-up batch takes the whole topic at once.
    sized = [replace(p, max_records_per_batch=per_batch, catch_up_records_per_batch=0) for p in pipelines]
    return replace(spec, pipelines=tuple(sized))


def produce_tombstones(bootstrap: str, topic: str, keys: Sequence[str]) -> None:
    """A null value per key, one produce request each: Tansu's high watermark counts batches, not records."""
    from confluent_kafka import Producer

    from spark_jobs.kafka_clients import KafkaProblems

    producer = Producer(KafkaProblems().settings({"bootstrap.servers": bootstrap}))
    for key in keys:
        producer.produce(topic, key=key.encode(), value=None, partition=0)
        if producer.flush(30):
            raise RuntimeError(f"a tombstone for {key} was not delivered to {topic!r}")


# ------------------------------------------------------------------------------------------------- printing


def _cell(value: Any) -> str:
    if isinstance(value, datetime):
        return value.strftime("%H:%M:%S.%f")[:-3] if value.microsecond else value.strftime("%H:%M:%S")
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _fits(console: Console, table: RichTable) -> bool:
    """Whether ``table`` prints in :data:`WIDTH` columns without squeezing (``measure`` alone stops at the console's
    width)."""
    return console.measure(table, options=console.options.update_width(10 * WIDTH)).maximum <= WIDTH


def _table(title: str | None = None) -> RichTable:
    return RichTable(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0))


def sample_table(console: Console, title: str, rows: pa.Table, limit: int = 3) -> RichTable:
    """Up to ``limit`` rows: one line each if that fits in 80 columns, else one line per column."""
    sample = rows.slice(0, limit).to_pylist()
    wide = _table(title)
    for name in rows.column_names:
        wide.add_column(name, no_wrap=True)
    for row in sample:
        wide.add_row(*[_cell(v) for v in row.values()])
    if _fits(console, wide):
        return wide
    tall = _table(title)
    tall.add_column("column", no_wrap=True)
    for n in range(len(sample)):
        tall.add_column(f"row {n + 1}", no_wrap=True, overflow="ellipsis", max_width=20)
    for name in rows.column_names:
        tall.add_row(name, *[_cell(row[name]) for row in sample])
    return tall


def _sorted(pipeline: PipelineSpec, rows: pa.Table) -> pa.Table:
    if pipeline.kind == WINDOWED:
        keys = [*pipeline.group_by, "window_start"]  # one group's windows first: hopping ones overlap
    elif "_kafka_offset" in rows.column_names:
        keys = ["_kafka_partition", "_kafka_offset"]
    else:
        keys = [*pipeline.key] or ["event_time"]
    return rows.sort_by([(k, "ascending") for k in keys]) if rows.num_rows else rows


def _partitions(table: Table) -> str | None:
    """``by event_time_day: 2025-12-31 (5), 2026-01-01 (19,965)`` or ``by customer_id_bucket: 8 partitions``."""
    if table.spec().is_unpartitioned():
        return None
    names = ", ".join(f.name for f in table.spec().fields)
    parts = sorted(table.inspect.partitions().to_pylist(), key=lambda p: str(p["partition"]))
    if len(parts) > 2:
        return f"partitioned by {names}: {len(parts)} partitions"
    values = ", ".join(f"{'/'.join(map(str, p['partition'].values()))} ({p['record_count']:,})" for p in parts)
    return f"partitioned by {names}: {values}"


def _what(pipeline: PipelineSpec) -> str:
    if pipeline.kind == WINDOWED:
        size = f"{pipeline.window_ms // 60_000}m"
        hop = f" every {pipeline.window_slide_ms // 60_000}m" if pipeline.slide_ms else ""
        by = f" per {', '.join(pipeline.group_by)}" if pipeline.group_by else ""
        return f"windowed, {size} windows{hop}{by}, {pipeline.output_mode} mode"
    if pipeline.kind == EVENTS:
        if pipeline.routes:
            return f"events, fan-out by {pipeline.route_by}"
        return "events, with Kafka metadata" if pipeline.kafka_metadata else "events"
    return f"upsert, latest per {', '.join(pipeline.key)} by {pipeline.version_field}; tombstones delete"


@dataclass
class Figures:
    """One line of the summary: what a pipeline read, wrote and took."""

    pipeline: PipelineSpec
    events_in: int = 0
    rows_out: int = 0
    batches: int = 0
    snapshots: int = 0
    staging_s: float = 0.0
    commit_ms_per_batch: float = 0.0


def _staging_seconds(running: RunningPipeline) -> float:
    """The query's own time in its batches (Spark's ``triggerExecution``), not the wait for the others."""
    return sum(p.durationMs.get("triggerExecution", 0) for p in running.query.recentProgress) / 1000


def _commit_ms_per_batch(pipeline: PipelineSpec, spec: KrishivSpec, reports: list[TableCommitReport]) -> float:
    """Mean commit time of a batch's row tables (for a merge table, the merge commit), summed over the tables."""
    from krishiv_core.catalog import qualified

    by_table = {r.table: r.commit_latencies_ms for r in reports}
    total = 0.0
    for name in pipeline.tables:
        latencies = by_table.get(qualified(spec, name), [])
        total += sum(latencies) / len(latencies) if latencies else 0.0
    return total


def run_demo(
    spec: KrishivSpec, state: Path, *, records: int, late: int, malformed: int, seed: int, console: Console
) -> int:
    from krishiv.broker import start_broker
    from krishiv.lineage import lineage
    from krishiv.operations import commit_pipelines, run_pipelines, verify_pipelines
    from krishiv.produce import demo_orders, ensure_topic, produce
    from krishiv_core.catalog import load_catalog, qualified
    from krishiv_core.tables import output_tables

    # Before anything starts: the folder is wiped, so it must be one an earlier demo made (or new, or empty).
    reset_folder(state, DEMO_MARKER, command="krishiv demo", label=f"--state {state}")
    started = time.monotonic()
    with start_broker(log_path=state / "broker.log") as broker:
        console.print(f"[bold]1/5[/] Tansu broker on {broker.bootstrap} (pid {broker.pid})")
        spec = demo_spec(spec, state, broker.bootstrap, records)
        pipelines = list(spec.pipelines)
        topic = pipelines[0].topic
        partitions = ensure_topic(broker.bootstrap, topic, spec.kafka.partitions)
        events = demo_orders(records, seed=seed, partitions=partitions, late=late, malformed=malformed)
        produce(broker.bootstrap, topic, events)
        produce_tombstones(broker.bootstrap, topic, TOMBSTONED)
        console.print(
            f"[bold]2/5[/] produced {records:,} orders to {topic!r} over {partitions} partitions "
            f"({late} late, {malformed} malformed)"
        )
        console.print(f"    then a tombstone (null value) for each of {', '.join(TOMBSTONED)}")
        console.print(f"[bold]3/5[/] Spark stages {len(pipelines)} pipelines in one run (phase 1: Parquet + outbox)")
        t0 = time.monotonic()
        running = run_pipelines(spec, pipelines, once=True, holder="krishiv demo")
        staged_s = time.monotonic() - t0
        t0 = time.monotonic()
        reports = commit_pipelines(spec, pipelines)
        commit_s = time.monotonic() - t0
        committed = sum(len(r.committed) for r in reports)
        batches = sum(len(r.stager.history) for r in running)
        console.print(f"    staged {batches} batches in {staged_s:.1f}s")
        console.print(
            f"[bold]4/5[/] relay committed {committed} snapshots to {len(reports)} tables (phase 2) in {commit_s:.1f}s"
        )

        catalog = load_catalog(spec)
        figures = []
        for p, run in zip(pipelines, running, strict=True):
            history = run.stager.history
            fig = Figures(p, events_in=sum(b.records_read for b in history), batches=len(history))
            fig.staging_s = _staging_seconds(run)
            fig.commit_ms_per_batch = _commit_ms_per_batch(p, spec, reports)
            console.print()
            console.print(f"[bold]{p.name}[/]: {_what(p)}")
            for name in p.all_tables:
                table = catalog.load_table(qualified(spec, name))
                rows = table.scan().to_arrow()
                snapshots = len(table.snapshots())
                fig.snapshots += snapshots
                if name == p.rejects_table:
                    console.print(f"  {name}: {rows.num_rows:,} rows, {snapshots} snapshots")
                    continue
                fig.rows_out += rows.num_rows
                console.print(f"  {name}: {rows.num_rows:,} rows, {snapshots} snapshots")
                if layout := _partitions(table):
                    console.print(f"  {layout}")
                if p.kind == UPSERT and p.key == ("customer_id",):
                    gone = set(TOMBSTONED) - set(rows.column("customer_id").to_pylist())
                    console.print(f"  tombstoned and gone: {', '.join(sorted(gone)) or 'none'}")
                console.print(sample_table(console, f"  {name}, first rows", _sorted(p, rows)))
            if p is pipelines[0] and p.kind == WINDOWED:
                late = sum(b.late_events for b in history)
                console.print(f"  late events left out of the windows, kept in {p.rejects_table}: {late}")
                lin = _table(f"  {p.table} lineage (newest last)")
                for col in ("snapshot", "parent", "batch", "rows added"):
                    lin.add_column(col)
                for row in lineage(catalog.load_table(qualified(spec, p.table))):
                    lin.add_row(str(row.snapshot_id), str(row.parent_id), str(row.batch_id), str(row.added_records))
                console.print(lin)
            figures.append(fig)

        console.print()
        ok = True
        for p in pipelines:
            try:
                results = verify_pipelines(spec, [p], catalog=catalog)
            except Exception as exc:  # the demo reports what verify could not check, and fails
                ok = False
                console.print(f"[red]verify {p.name} failed[/]: {type(exc).__name__}: {exc}")
                continue
            for r in results:
                ok = ok and r.ok
                mark = "[green]ok[/]" if r.ok else "[red]VIOLATIONS[/]"
                console.print(f"verify {r.table}: {mark} ({r.rows:,} rows, {r.snapshots} snapshots)")
                for v in r.violations:
                    console.print(f"  - {v}")
        console.print(f"[bold]5/5[/] verify: {'[green]ok[/]' if ok else '[red]violations[/]'}")

        out = _table("figures per pipeline")
        for col in ("kind", "pipeline", "events", "rows", "batch", "snaps", "stage", "ms/batch"):
            out.add_column(col, justify="left" if col in ("kind", "pipeline") else "right", no_wrap=True)
        for f in figures:
            out.add_row(
                f.pipeline.kind,
                f.pipeline.name,
                f"{f.events_in:,}",
                f"{f.rows_out:,}",
                str(f.batches),
                str(f.snapshots),
                f"{f.staging_s:.1f}s",
                f"{f.commit_ms_per_batch:.0f} {output_tables(f.pipeline)[0].operation.kind}",
            )
        console.print(out)
        console.print("snaps: its tables', rejects included; stage: Spark's time in its batches (the")
        console.print("queries share the cores); ms/batch: the relay's commit of a batch, row tables")
        console.print(f"total {time.monotonic() - started:.1f}s")
        return 0 if ok else 1
