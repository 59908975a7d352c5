"""``python -m benchmarks.nested``: the nested pipeline figure alone, added to a results JSON without touching the rest.

``make bench`` measures the events kind over the nested orders (:func:`benchmarks.workload.produce_nested_orders`)
beside the flat one in its full run. This measures the same two on their own, on one broker and one warm
SparkSession: the flat orders and the nested orders (the same ids, customers, amounts and event times), each
landed by the ``events`` kind timed as ``make bench`` times it (staging and the relay until the last snapshot is
visible), each table checked, the best of ``--repeat`` runs of each. It then sets ``events_nested`` of the results
JSON (``benchmarks/results/latest.json`` by default) to the nested figure, with the flat figure of this run, the
ratio between them, the date, the commit and the load average, and keeps every other figure of that file: a
nested figure measured on a loaded machine does not replace the full run's idle ones.

    .venv/bin/python -m benchmarks.nested [--events 1000000] [--repeat 1] [--results benchmarks/results/latest.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.report import nested_kind, write_json
from benchmarks.runner import checkout
from benchmarks.throughput import (
    EventsRun,
    bench_spec,
    events_spec,
    nested_events_spec,
    run_events,
    run_nested_events,
)
from benchmarks.workload import produce_nested_orders, produce_orders
from krishiv.state_folder import BENCH_MARKER, reset_folder
from krishiv_core.errors import KrishivError
from krishiv_core.spec import KrishivSpec, load_spec

console = Console(highlight=False, soft_wrap=True)
LATEST = Path(__file__).resolve().parent / "results" / "latest.json"


def measure(
    spec: KrishivSpec, events: int, partitions: int, batch_records: int, catch_up_records: int, repeat: int, work: Path
) -> tuple[EventsRun, EventsRun]:
    """(flat, nested): the best of ``repeat`` timed events-kind runs over ``events`` orders of each."""
    from krishiv.broker import start_broker
    from spark_jobs.session import build_session

    reset_folder(work, BENCH_MARKER, command="python -m benchmarks.nested", label=str(work))
    base = replace(spec, kafka=replace(spec.kafka, partitions=partitions))
    started = time.perf_counter()

    def step(text: str) -> None:
        console.print(f"[bold]{time.perf_counter() - started:7.1f}s[/] {text} (load {os.getloadavg()[0]:.1f})")

    with start_broker(log_path=work / "broker.log") as broker:

        def spec_for(name: str, topic: str) -> KrishivSpec:
            return bench_spec(base, work / name, broker.bootstrap, topic, batch_records, catch_up_records)

        step(f"producing {events:,} flat and {events:,} nested orders over {partitions} partitions")
        produce_orders(broker.bootstrap, "orders-1x", events, seed=7, partitions=partitions)
        produce_nested_orders(broker.bootstrap, "orders-nested-1x", events, seed=7, partitions=partitions)
        step("Spark start-up and a warm-up run of each over small topics")
        warm = min(events, 20_000)
        spark = build_session(spec_for("warmup", "warmup"), "krishiv-bench-nested")
        produce_orders(broker.bootstrap, "warmup", warm, seed=1, partitions=partitions)
        produce_nested_orders(broker.bootstrap, "warmup-nested", warm, seed=1, partitions=partitions)
        run_events(spark, events_spec(spec_for("warmup-flat", "warmup")), warm)
        run_nested_events(spark, nested_events_spec(spec_for("warmup-nested", "warmup-nested"), "warmup-nested"), warm)
        flat: list[EventsRun] = []
        nested: list[EventsRun] = []
        for i in range(repeat):
            step(f"run {i + 1}/{repeat}: the events kind over the flat orders")
            flat.append(run_events(spark, events_spec(spec_for(f"events-{i}", "orders-1x")), events))
            if flat[-1].rows_written + flat[-1].rejects != events:
                raise RuntimeError(f"the flat events table holds {flat[-1].rows_written:,} rows of {events:,} orders")
            console.print(f"         {flat[-1].events_per_s:,.0f} ev/s, {flat[-1].rows_written:,} rows")
            step(f"run {i + 1}/{repeat}: the events kind over the nested orders")
            nested_spec = nested_events_spec(spec_for(f"events-nested-{i}", "orders-nested-1x"), "orders-nested-1x")
            nested.append(run_nested_events(spark, nested_spec, events))
            console.print(f"         {nested[-1].events_per_s:,.0f} ev/s, {nested[-1].rows_written:,} rows")
        spark.stop()
    return min(flat, key=lambda r: r.seconds), min(nested, key=lambda r: r.seconds)


def merged(doc: dict[str, Any], flat: EventsRun, nested: EventsRun, repeat: int) -> dict[str, Any]:
    """``doc`` (a results JSON) with ``events_nested`` set to this run's nested figure; nothing else changed."""
    figure = nested_kind(nested, flat.events_per_s, None)
    commit = checkout()
    figure["measured_apart"] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit["commit"],
        "dirty": commit["dirty"],
        "load_average": [round(v, 2) for v in os.getloadavg()],
        "cpus": os.cpu_count(),
        "repeat": repeat,
        "flat_events_per_s": round(flat.events_per_s),
        "flat_rows_written": flat.rows_written,
        "flat_seconds": round(flat.seconds, 2),
    }
    return {**doc, "events_nested": figure}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.nested", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", help="pipeline spec file (default: $KRISHIV_SPEC or ./krishiv.toml)")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch-records", type=int, default=200_000)
    parser.add_argument("--catch-up-records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=1, help="timed runs of each; the fastest is kept")
    parser.add_argument("--results", default=str(LATEST), help="the results JSON to add events_nested to")
    parser.add_argument("--out", default="state/bench-nested", help="working folder (emptied first)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    results = Path(args.results)
    try:
        doc = json.loads(results.read_text())
        spec = load_spec(args.spec)
        flat, nested = measure(
            spec,
            args.events,
            args.partitions,
            args.batch_records,
            args.catch_up_records,
            max(1, args.repeat),
            Path(args.out) / "work",
        )
    except (KrishivError, OSError, json.JSONDecodeError) as exc:
        Console(stderr=True, highlight=False, soft_wrap=True).print(f"[red]bench nested: {exc}[/]")
        return 2
    doc = merged(doc, flat, nested, max(1, args.repeat))
    write_json(doc, results)
    figure = doc["events_nested"]
    console.print(
        f"nested {figure['events_per_s']:,} ev/s, flat {figure['measured_apart']['flat_events_per_s']:,} ev/s: "
        f"{figure['vs_flat_events']} x; written: {results} (then python -m benchmarks.docs_table)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
