"""The benchmark's output: a table on the console, a JSON document, and a PNG chart."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable

from benchmarks import percentile
from benchmarks.relay_latency import RelayResult
from benchmarks.runner import BenchResults, machine
from benchmarks.throughput import PipelineRun
from krishiv_core.catalog import redact

SQLITE_P99_TARGET_MS = 250.0


def _run(run: PipelineRun) -> dict[str, Any]:
    rounded = {"seconds": round(run.seconds, 2), "commit_s": round(run.commit_s, 2)}
    return {**asdict(run), **rounded, "events_per_s": round(run.events_per_s)}


def _relay(r: RelayResult, depths: tuple[int, ...]) -> dict[str, Any]:
    return {
        "catalog": r.catalog,
        "address": r.address,
        "error": r.error,
        "snapshots": r.snapshots,
        "seconds": round(r.seconds, 2),
        "snapshots_per_s": round(r.snapshots_per_s, 1),
        "p50_ms": round(r.percentile(0.50), 1),
        "p99_ms": round(r.percentile(0.99), 1),
        "p50_ms_at_depth": {str(d): _round(r.at_depth(d)) for d in depths},
    }


def _round(v: float | None, digits: int = 1) -> float | None:
    return None if v is None or v != v else round(v, digits)  # NaN (nothing measured) is null in the JSON


def to_json(res: BenchResults) -> dict[str, Any]:
    f = res.freshness
    sqlite = next(r for r in res.relay if r.catalog == "sqlite")
    window_p50 = percentile(f.window_latencies_s, 0.5)
    targets = {
        "krishiv_vs_limit >= 0.5": res.krishiv.events_per_s / res.limit.events_per_s >= 0.5,
        "krishiv_vs_baseline >= 0.9": res.krishiv.events_per_s / res.baseline.events_per_s >= 0.9,
        f"sqlite commit p99 < {SQLITE_P99_TARGET_MS:.0f} ms": sqlite.percentile(0.99) < SQLITE_P99_TARGET_MS,
        f"freshness p50 <= {f.target_s:.1f} s": window_p50 <= f.target_s,
    }
    return {
        "machine": machine(),
        "options": {**asdict(res.options), "postgres_uri": redact(res.options.postgres_uri or "")},
        "seconds": round(res.seconds, 1),
        "produce_s": round(res.produce_s, 2),
        "limit": {**asdict(res.limit), "events_per_s": round(res.limit.events_per_s)},
        "spark_startup_s": round(res.spark_startup_s, 2),
        "spark_scan_only": {
            "seconds": round(res.scan_only_s, 2),
            "events_per_s": round(res.options.events / res.scan_only_s),
        },
        "krishiv": _run(res.krishiv),
        "baseline": _run(res.baseline),
        "results_agree": (res.krishiv.windows, res.krishiv.orders_counted)
        == (res.baseline.windows, res.baseline.orders_counted),
        "ratios": {
            "krishiv_vs_limit": round(res.krishiv.events_per_s / res.limit.events_per_s, 3),
            "krishiv_vs_baseline": round(res.krishiv.events_per_s / res.baseline.events_per_s, 3),
        },
        "relay": [_relay(r, res.options.relay_depths) for r in res.relay],
        "freshness": {
            "rate": f.rate,
            "seconds": f.seconds,
            "trigger_interval_s": f.trigger_interval_s,
            "sensor_interval_s": f.sensor_interval_s,
            "target_s": f.target_s,
            "windows": len(f.window_latencies_s),
            "window_p50_s": _round(window_p50, 2),
            "window_p99_s": _round(percentile(f.window_latencies_s, 0.99), 2),
            "rejects": len(f.reject_latencies_s),
            "reject_p50_s": _round(percentile(f.reject_latencies_s, 0.5), 2),
            "reject_p99_s": _round(percentile(f.reject_latencies_s, 0.99), 2),
            "unseen": f.unseen,
            "relay_errors": f.relay_errors,
        },
        "memory": [{"factor": k, "events": run.events, **asdict(run.peak_rss)} for k, run in res.scaling],
        "scaling": [
            {"factor": k, **{key: v for key, v in _run(run).items() if key in ("events", "seconds", "events_per_s")}}
            for k, run in res.scaling
        ],
        "targets": targets,
    }


def write_json(doc: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")


def print_tables(doc: dict[str, Any], console: Console) -> None:
    m = doc["machine"]
    t = RichTable(title=f"krishiv bench: {doc['options']['events']:,} orders, {m['cpus']} CPUs, {m['memory_gib']} GiB")
    for col in ("measurement", "result", "detail"):
        t.add_column(col)
    lim, k, b = doc["limit"], doc["krishiv"], doc["baseline"]
    t.add_row("1 limit (raw confluent-kafka)", f"{lim['events_per_s']:,} ev/s", f"{lim['readers']} readers")
    t.add_row(
        "2 Krishiv exactly-once",
        f"{k['events_per_s']:,} ev/s",
        f"{k['seconds']} s ({k['commit_s']} s of it the relay), {k['batches']} batches, {k['snapshots']} snapshots; "
        f"Spark start-up {doc['spark_startup_s']} s apart",
    )
    scan = doc["spark_scan_only"]
    t.add_row("  profile: Spark source scan alone", f"{scan['events_per_s']:,} ev/s", "read + count, no parse")
    t.add_row("3 baseline at-least-once", f"{b['events_per_s']:,} ev/s", f"{b['seconds']} s, {b['batches']} batches")
    r = doc["ratios"]
    t.add_row("  ratios", f"{r['krishiv_vs_limit']} x limit", f"{r['krishiv_vs_baseline']} x baseline")
    t.add_row("  same table", str(doc["results_agree"]), f"{k['windows']} windows, {k['orders_counted']:,} orders")
    for rel in doc["relay"]:
        if rel["error"]:
            t.add_row(f"4 relay on {rel['catalog']}", "not measured", rel["error"])
            continue
        depth = ", ".join(f"{v} ms at {d}" for d, v in rel["p50_ms_at_depth"].items() if v is not None)
        t.add_row(
            f"4 relay on {rel['catalog']}",
            f"p50 {rel['p50_ms']} ms, p99 {rel['p99_ms']} ms",
            f"{rel['snapshots_per_s']} snapshots/s; p50 by snapshots in table: {depth}",
        )
    f = doc["freshness"]
    t.add_row(
        "5 freshness",
        f"p50 {f['window_p50_s']} s, p99 {f['window_p99_s']} s",
        f"closing event -> window visible ({f['windows']} windows); per event (rejects): p50 {f['reject_p50_s']} s, "
        f"p99 {f['reject_p99_s']} s; target {f['target_s']} s",
    )
    for mem in doc["memory"]:
        t.add_row(
            f"6 peak RSS at {mem['factor']}x",
            f"JVM {mem['jvm_mb']:.0f} MB",
            f"Python workers {mem['python_workers_mb']:.0f} MB, driver Python {mem['driver_python_mb']:.0f} MB",
        )
    for s in doc["scaling"]:
        detail = f"{s['events']:,} orders in {s['seconds']} s"
        t.add_row(f"7 scaling {s['factor']}x", f"{s['events_per_s']:,} ev/s", detail)
    console.print(t)
    for name, met in doc["targets"].items():
        console.print(f"target {name}: {'[green]met[/]' if met else '[red]missed[/]'}")


def write_chart(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.5))
    names = ["limit", "Spark scan", "baseline"] + [f"Krishiv {s['factor']}x" for s in doc["scaling"]]
    rates = [doc["limit"]["events_per_s"], doc["spark_scan_only"]["events_per_s"], doc["baseline"]["events_per_s"]]
    rates += [s["events_per_s"] for s in doc["scaling"]]
    a.bar(names, rates, color=["grey", "silver", "tab:orange"] + ["tab:blue"] * len(doc["scaling"]))
    a.set_title("throughput (events/s)")
    a.tick_params(axis="x", rotation=30)
    for rel in doc["relay"]:
        if not rel["error"]:
            depths = [(int(d), v) for d, v in rel["p50_ms_at_depth"].items() if v is not None]
            (line,) = b.plot([d for d, _ in depths], [v for _, v in depths], marker="o", label=f"{rel['catalog']} p50")
            b.axhline(rel["p99_ms"], color=line.get_color(), linestyle=":", label=f"{rel['catalog']} p99 (all)")
    b.set_title("relay commit latency (ms) by snapshots in table")
    b.set_xlabel("snapshots already in the table")
    b.legend()
    f = doc["freshness"]
    c.bar(
        ["window p50", "window p99", "event p50", "event p99"],
        [f["window_p50_s"], f["window_p99_s"], f["reject_p50_s"], f["reject_p99_s"]],
    )
    c.axhline(f["target_s"], color="red", linestyle="--", label=f"target {f['target_s']} s")
    c.set_title("freshness (s)")
    c.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
