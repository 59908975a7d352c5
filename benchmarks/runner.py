"""Runs the measurements in one process, on one broker and one warm SparkSession, in order."""

from __future__ import annotations

import os
import platform
import subprocess
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks import DEFAULT_POSTGRES_URI
from benchmarks.dagster_freshness import DagsterFreshnessResult, measure_dagster_freshness
from benchmarks.freshness import FreshnessResult, measure_freshness
from benchmarks.raw_consume import RawConsumeResult, raw_consume
from benchmarks.relay_latency import Maintenance, RelayResult, bench_relay
from benchmarks.throughput import (
    EventsRun,
    PipelineRun,
    bench_spec,
    events_spec,
    nested_events_spec,
    run_baseline,
    run_events,
    run_krishiv,
    run_nested_events,
    run_scan_only,
    run_upserts,
)
from benchmarks.upsert_merge import merge_costs
from benchmarks.workload import produce_nested_orders, produce_orders
from krishiv.state_folder import BENCH_MARKER, reset_folder
from krishiv_core.spec import KrishivSpec


@dataclass(frozen=True)
class BenchOptions:
    events: int = 1_000_000
    partitions: int = 4
    batch_records: int = 200_000
    catch_up_records: int = 1_000_000
    seed: int = 7
    scaling: tuple[int, ...] = (1, 2, 4)
    relay_snapshots: int = 1_010
    relay_depths: tuple[int, ...] = (100, 1_000)
    relay_maintained_batches: int = 2_000  # 0 skips the relay with maintenance beside it
    maintenance_every_s: float = 5.0
    maintenance_keep_last: int = 100
    postgres_uri: str | None = DEFAULT_POSTGRES_URI
    freshness_seconds: float = 60.0
    rate: float = 1_000.0
    dagster_freshness_seconds: float = 60.0  # 0 skips freshness under Dagster's sensors alone
    dagster_rate: float = 200.0
    warmup_events: int = 20_000
    merge_sizes: tuple[int, ...] = (1_000_000, 10_000_000)  # table sizes the merge cost is measured at
    merge_batch_keys: int = 10_000
    merge_batches: int = 3
    nested: bool = True  # the events kind over the nested orders too (benchmarks.workload.NESTED_FIELDS)


@dataclass
class BenchResults:
    options: BenchOptions
    produce_s: float
    limit: RawConsumeResult
    limit_default: RawConsumeResult
    spark_startup_s: float
    scan_only_s: float
    baseline: PipelineRun
    krishiv: PipelineRun
    scaling: list[tuple[int, PipelineRun]]
    relay: list[RelayResult]
    freshness: FreshnessResult
    seconds: float
    events: EventsRun | None = None
    relay_maintained: list[RelayResult] = field(default_factory=list)
    dagster_freshness: DagsterFreshnessResult | None = None
    upserts: EventsRun | None = None
    merge_cost: dict[str, Any] | None = None  # :func:`benchmarks.upsert_merge.merge_costs`
    nested_events: EventsRun | None = None  # the events kind over the nested orders


def machine() -> dict[str, Any]:
    import psutil
    import pyiceberg
    import pyspark

    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "pyiceberg": pyiceberg.__version__,
        "broker": "Tansu (memory storage)",
        "load_average": [round(v, 2) for v in os.getloadavg()],  # other work on the machine when it was written
    }


REPO = Path(__file__).resolve().parents[1]


def checkout(repo: Path = REPO) -> dict[str, Any]:
    """The git commit the bench ran from, and whether the work tree had uncommitted changes (None: not a checkout)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def run_bench(spec: KrishivSpec, options: BenchOptions, folder: Path, console: Console) -> BenchResults:
    from krishiv.broker import start_broker
    from spark_jobs.session import build_session

    # Emptied before anything starts, and only if it is new, empty or an earlier bench's work folder.
    reset_folder(folder, BENCH_MARKER, command="make bench", label=str(folder))
    base = replace(spec, kafka=replace(spec.kafka, partitions=options.partitions))
    started = time.perf_counter()

    def step(text: str) -> None:
        console.print(f"[bold]{time.perf_counter() - started:7.1f}s[/] {text}")

    with start_broker(log_path=folder / "broker.log") as broker:

        def spec_for(name: str, topic: str) -> KrishivSpec:
            return bench_spec(
                base, folder / name, broker.bootstrap, topic, options.batch_records, options.catch_up_records
            )

        step(f"Tansu on {broker.bootstrap}; producing {options.events:,} orders over {options.partitions} partitions")
        produce_s = produce_orders(
            broker.bootstrap, "orders-1x", options.events, seed=options.seed, partitions=options.partitions
        )
        step("1/7 the limit: confluent-kafka, one reader process per partition (tuned, then librdkafka's defaults)")
        limit = raw_consume(broker.bootstrap, "orders-1x")
        limit_default = raw_consume(broker.bootstrap, "orders-1x", tuned=False)

        step("Spark start-up: session, then a warm-up run over its own small topic")
        t0 = time.perf_counter()
        warmup = spec_for("warmup", "warmup")
        spark = build_session(warmup, "krishiv-bench")
        produce_orders(broker.bootstrap, "warmup", options.warmup_events, seed=1, partitions=options.partitions)
        run_baseline(spark, warmup, options.warmup_events)
        spark_startup_s = time.perf_counter() - t0

        step("profile: Spark reading the topic through Krishiv's source, nothing else (count)")
        scan_only_s = run_scan_only(spark, spec_for("scan-only", "orders-1x"), options.events)
        step("3/7 the at-least-once baseline: foreachBatch + pyiceberg append")
        baseline = run_baseline(spark, spec_for("baseline", "orders-1x"), options.events)
        step("2/7 Krishiv exactly-once: staging + ledger, then the relay until drained")
        krishiv = run_krishiv(spark, spec_for("krishiv-1x", "orders-1x"), options.events)

        step("the events kind: raw ingestion of the same orders, one row each")
        events_run = run_events(spark, events_spec(spec_for("events-1x", "orders-1x")), options.events)
        nested_run = None
        if options.nested:
            step(f"the events kind over {options.events:,} nested orders (structs, lists of structs, maps)")
            produce_nested_orders(
                broker.bootstrap, "orders-nested-1x", options.events, seed=options.seed, partitions=options.partitions
            )
            nested = nested_events_spec(spec_for("events-nested-1x", "orders-nested-1x"), "orders-nested-1x")
            nested_run = run_nested_events(spark, nested, options.events)
        step("the upsert kind: the same orders merged again into a full table (one row per order), merge-on-read")
        upsert_run = run_upserts(spark, spec_for("upserts-1x", "orders-1x"), options.events)
        step(f"the relay's merge cost per {options.merge_batch_keys:,}-key batch at each table size")
        merge_cost = merge_costs(options.merge_sizes, options.merge_batch_keys, options.merge_batches)

        scaling = [(1, krishiv)]
        for factor in (f for f in options.scaling if f != 1):
            events = options.events * factor
            topic = f"orders-{factor}x"
            step(f"7/7 scaling: Krishiv over {events:,} orders ({factor}x)")
            produce_orders(broker.bootstrap, topic, events, seed=options.seed * factor, partitions=options.partitions)
            scaling.append((factor, run_krishiv(spark, spec_for(f"krishiv-{factor}x", topic), events)))

        step(f"4/7 the commit relay: {options.relay_snapshots} snapshots on SQLite and PostgreSQL")
        relay = [bench_relay(spec_for("relay-sqlite", "relay"), "sqlite", options.relay_snapshots, folder)]
        if options.postgres_uri:
            pg = _on_postgres(spec_for("relay-postgresql", "relay"), options.postgres_uri)
            relay.append(bench_relay(pg, "postgresql", options.relay_snapshots, folder))

        maintained: list[RelayResult] = []
        if options.relay_maintained_batches:
            maintenance = Maintenance(every_s=options.maintenance_every_s, keep_last=options.maintenance_keep_last)
            step(
                f"4/7 the commit relay with maintenance beside it: {options.relay_maintained_batches} batches, expiry "
                f"(keep {maintenance.keep_last}) and compaction every {maintenance.every_s:.0f}s"
            )
            for label, relay_spec in [("sqlite", spec_for("relay-sqlite-maintained", "relay"))] + (
                [("postgresql", _on_postgres(spec_for("relay-postgresql-maintained", "relay"), options.postgres_uri))]
                if options.postgres_uri
                else []
            ):
                maintained.append(bench_relay(relay_spec, label, options.relay_maintained_batches, folder, maintenance))

        step(
            f"5/7 freshness: {options.rate:.0f} orders/s for {options.freshness_seconds:.0f}s, "
            "krishiv run committing each batch"
        )
        freshness = measure_freshness(
            spark, spec_for("freshness", "orders-live"), rate=options.rate, seconds=options.freshness_seconds
        )
        spark.stop()  # the Dagster runs below start their own Spark drivers

        dagster_freshness = None
        if options.dagster_freshness_seconds:
            step(
                f"5/7 freshness under Dagster's sensors alone: dagster-daemon, {options.dagster_rate:.0f} orders/s "
                f"for {options.dagster_freshness_seconds:.0f}s"
            )
            dagster_freshness = measure_dagster_freshness(
                broker.bootstrap,
                folder / "dagster-freshness",
                rate=options.dagster_rate,
                seconds=options.dagster_freshness_seconds,
                partitions=options.partitions,
                say=step,
            )
    return BenchResults(
        options,
        produce_s,
        limit,
        limit_default,
        spark_startup_s,
        scan_only_s,
        baseline,
        krishiv,
        scaling,
        relay,
        freshness,
        time.perf_counter() - started,
        events_run,
        maintained,
        dagster_freshness,
        upsert_run,
        merge_cost,
        nested_run,
    )


def _on_postgres(spec: KrishivSpec, uri: str) -> KrishivSpec:
    """``spec`` with the PostgreSQL catalog at ``uri``, under a catalog name of its own (nothing shared)."""
    name = f"krishiv_bench_{uuid.uuid4().hex[:8]}"
    return replace(spec, iceberg=replace(spec.iceberg, catalog_uri=uri, catalog_name=name))
