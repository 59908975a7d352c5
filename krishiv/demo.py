"""``krishiv demo``: the whole pipeline on embedded defaults, in a state folder of its own.

Starts a Tansu broker on a free loopback port, produces seeded orders (some late, some malformed), stages
them with Spark in several micro-batches, commits them with the relay, then prints the table, its lineage
and the verification, and stops the broker.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table as RichTable

from krishiv.state_folder import DEMO_MARKER, reset_folder
from krishiv_core.spec import IcebergSettings, KafkaSettings, KrishivSpec, StorageSettings


def embedded_spec(spec: KrishivSpec, state: Path, bootstrap: str) -> KrishivSpec:
    """The spec pointed at ``bootstrap``, with a SQLite catalog, warehouse, ledger and checkpoints in ``state``."""
    state = state.resolve()
    return replace(
        spec,
        kafka=KafkaSettings(bootstrap, spec.kafka.partitions, spec.kafka.consumer),
        iceberg=IcebergSettings(
            f"sqlite:///{state}/catalog.db", str(state / "warehouse"), spec.iceberg.namespace, spec.iceberg.catalog_name
        ),
        storage=StorageSettings(str(state / "ledger.duckdb"), str(state / "checkpoints")),
    )


def demo_spec(spec: KrishivSpec, state: Path, bootstrap: str, records: int) -> KrishivSpec:
    """The repository's spec, pointed at the demo's broker and state folder, in about five batches."""
    spec = embedded_spec(spec, state, bootstrap)
    return replace(
        spec, pipelines=tuple(replace(p, max_records_per_batch=max(1, records // 5)) for p in spec.pipelines)
    )


def run_demo(
    spec: KrishivSpec, state: Path, *, records: int, late: int, malformed: int, seed: int, console: Console
) -> int:
    from krishiv.broker import start_broker
    from krishiv.lineage import lineage
    from krishiv.operations import commit_pipelines, run_pipelines, verify_pipelines
    from krishiv.produce import demo_orders, ensure_topic, produce
    from krishiv_core.catalog import load_catalog, qualified

    # Before anything starts: the folder is wiped, so it must be one an earlier demo made (or new, or empty).
    reset_folder(state, DEMO_MARKER, command="krishiv demo", label=f"--state {state}")
    started = time.monotonic()
    with start_broker(log_path=state / "broker.log") as broker:
        console.print(f"[bold]1/5[/] Tansu broker on {broker.bootstrap} (pid {broker.pid})")
        spec = demo_spec(spec, state, broker.bootstrap, records)
        pipeline = spec.pipeline()
        partitions = ensure_topic(broker.bootstrap, pipeline.topic, spec.kafka.partitions)
        events = demo_orders(records, seed=seed, partitions=partitions, late=late, malformed=malformed)
        produce(broker.bootstrap, pipeline.topic, events)
        console.print(
            f"[bold]2/5[/] produced {records} orders to {pipeline.topic!r} over {partitions} partitions "
            f"({late} late, {malformed} malformed)"
        )
        t0 = time.monotonic()
        console.print("[bold]3/5[/] Spark stages micro-batches (phase 1: Parquet + outbox entry)")
        running = run_pipelines(spec, [pipeline], once=True)
        staged_s = time.monotonic() - t0
        t0 = time.monotonic()
        reports = commit_pipelines(spec, [pipeline])
        commit_s = time.monotonic() - t0
        snapshots = sum(len(r.committed) for r in reports)
        console.print(f"[bold]4/5[/] relay committed {snapshots} snapshots (phase 2) in {commit_s:.2f}s")

        catalog = load_catalog(spec)
        table = catalog.load_table(qualified(spec, pipeline.table))
        rows = table.scan().to_arrow().sort_by("window_start")
        out = RichTable(title=f"{qualified(spec, pipeline.table)} ({rows.num_rows} closed windows)")
        for name in rows.column_names:
            out.add_column(name)
        for row in rows.to_pylist():
            out.add_row(*[str(v) for v in row.values()])
        console.print(out)
        lin = RichTable(title="lineage (newest last)")
        for col in ("snapshot", "parent", "batch", "rows added"):
            lin.add_column(col)
        for row in lineage(table):
            lin.add_row(str(row.snapshot_id), str(row.parent_id), str(row.batch_id), str(row.added_records))
        console.print(lin)
        rejects = catalog.load_table(qualified(spec, pipeline.rejects_table)).scan().to_arrow()
        history = running[0].stager.history
        results = verify_pipelines(spec, [pipeline])
        ok = all(r.ok for r in results)
        console.print(f"[bold]5/5[/] verify: {'[green]ok[/]' if ok else '[red]violations[/]'}")
        for r in results:
            for v in r.violations:
                console.print(f"  - {v}")
        counted = sum(r["order_count"] for r in rows.to_pylist()) if "order_count" in rows.column_names else None
        console.print(
            f"events {records}, batches {len(history)}, snapshots {snapshots}, windows {rows.num_rows}, "
            f"orders counted {counted}, rejects {rejects.num_rows}, late dropped "
            f"{sum(b.late_events for b in history)}, staging {staged_s:.1f}s, total {time.monotonic() - started:.1f}s"
        )
        return 0 if ok else 1
