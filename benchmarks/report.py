"""The benchmark's output: a table on the console, a JSON document, and a PNG chart.

The JSON names the machine (CPUs, memory, load average, versions), the UTC date, the git commit it ran from and
whether the work tree was dirty, the options, every measurement, and each target with its value and whether it
was met. ``python -m benchmarks`` writes it to ``benchmarks/results/latest.json`` (committed), and
``benchmarks/docs_table.py`` renders docs/benchmark.md's table from it with :func:`table_rows`, the rows the console
shows, so the page, the console and the JSON come from one run.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable

from benchmarks import percentile
from benchmarks.raw_consume import RawConsumeResult
from benchmarks.relay_latency import LAST_COMMITS, RelayResult
from benchmarks.runner import BenchResults, checkout, machine
from benchmarks.throughput import EventsRun, PipelineRun
from krishiv_core.catalog import redact

RELAY_P99_TARGET_MS = 250.0  # without maintenance, over a run to 1,000 snapshots
MAINTAINED_P99_TARGET_MS = 100.0  # with maintenance beside the relay, over the last 1,000 of 2,000 batches
KRISHIV_VS_BASELINE_TARGET = 0.95
KRISHIV_VS_LIMIT_TARGET = 0.3
EVENTS_VS_LIMIT_TARGET = 0.4
UPSERT_VS_LIMIT_TARGET = 0.2
MERGE_GROWTH_TARGET = 2.0  # a 10k-key batch into a 10M-row table against a 1M-row one


def _run(run: PipelineRun) -> dict[str, Any]:
    rounded = {"seconds": round(run.seconds, 2), "commit_s": round(run.commit_s, 2)}
    return {**asdict(run), **rounded, "events_per_s": round(run.events_per_s)}


def _relay(r: RelayResult, depths: tuple[int, ...]) -> dict[str, Any]:
    maintenance = None
    if r.maintenance is not None:
        maintenance = {**asdict(r.maintenance), **(asdict(r.maintained) if r.maintained else {})}
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
        "last_commits": min(LAST_COMMITS, len(r.latencies_ms)),
        "last_p50_ms": round(r.last_percentile(0.50), 1),
        "last_p99_ms": round(r.last_percentile(0.99), 1),
        "conflicts": r.conflicts,
        "maintenance": maintenance,
    }


def _kind(run: EventsRun | None, limit: RawConsumeResult) -> dict[str, Any] | None:
    if run is None:
        return None
    return {
        **{k: v for k, v in asdict(run).items() if k != "peak_rss"},
        "seconds": round(run.seconds, 2),
        "commit_s": round(run.commit_s, 2),
        "events_per_s": round(run.events_per_s),
        "vs_limit": round(run.events_per_s / limit.events_per_s, 3),
    }


NESTED_SHAPE = "customer a struct of a struct, 2 lines (a list of structs), a map of decimals, event time in a struct"


def nested_kind(run: EventsRun, flat_events_per_s: float | None, limit: RawConsumeResult | None) -> dict[str, Any]:
    """The events kind over the nested orders, beside the flat events kind measured on the same run (its ratio)."""
    return {
        **{k: v for k, v in asdict(run).items() if k != "peak_rss"},
        "seconds": round(run.seconds, 2),
        "commit_s": round(run.commit_s, 2),
        "events_per_s": round(run.events_per_s),
        "vs_limit": None if limit is None else round(run.events_per_s / limit.events_per_s, 3),
        "vs_flat_events": None if not flat_events_per_s else round(run.events_per_s / flat_events_per_s, 3),
        "shape": NESTED_SHAPE,
    }


def _target(name: str, value: float | None, op: str, target: float, unit: str = "") -> dict[str, Any]:
    met = value is not None and value == value and (value <= target if op == "<=" else value >= target)
    return {"name": name, "value": _round(value, 3), "target": f"{op} {target:g}{unit}", "met": met}


def _targets(res: BenchResults) -> list[dict[str, Any]]:
    f = res.freshness
    limit = res.limit.events_per_s
    targets = [
        _target("freshness p50 (event -> visible, s)", percentile(f.reject_latencies_s, 0.5), "<=", f.target_s, " s"),
        _target(
            "freshness p99 (event -> visible, s)", percentile(f.reject_latencies_s, 0.99), "<=", f.p99_target_s, " s"
        ),
    ]
    for r in res.relay:
        if not r.error:
            targets.append(_target(f"relay p99 on {r.catalog} (ms)", r.percentile(0.99), "<=", RELAY_P99_TARGET_MS))
    for r in res.relay_maintained:
        if not r.error:
            name = f"relay p99 on {r.catalog} with maintenance, last {min(LAST_COMMITS, len(r.latencies_ms))} (ms)"
            targets.append(_target(name, r.last_percentile(0.99), "<=", MAINTAINED_P99_TARGET_MS))
    targets += [
        _target(
            "Krishiv vs baseline",
            res.krishiv.events_per_s / res.baseline.events_per_s,
            ">=",
            KRISHIV_VS_BASELINE_TARGET,
            "x",
        ),
        _target("Krishiv vs limit", res.krishiv.events_per_s / limit, ">=", KRISHIV_VS_LIMIT_TARGET, "x"),
    ]
    d = res.dagster_freshness
    if d is not None:
        targets.append(_target("freshness under Dagster's sensors alone p50 (s)", d.p50_s, "<=", 15.0, " s"))
    if res.events is not None:
        targets.append(
            _target("events kind vs limit", res.events.events_per_s / limit, ">=", EVENTS_VS_LIMIT_TARGET, "x")
        )
    if res.upserts is not None:
        targets.append(
            _target("upsert kind vs limit", res.upserts.events_per_s / limit, ">=", UPSERT_VS_LIMIT_TARGET, "x")
        )
    if res.merge_cost is not None:
        growth = res.merge_cost["growth"]["uniform"]
        sizes = res.merge_cost["sizes"]
        name = f"merge cost per batch, {sizes[1]:,} vs {sizes[0]:,} rows, keys uniform (x)"
        targets.append(_target(name, growth, "<=", MERGE_GROWTH_TARGET, "x"))
    return targets


def _round(v: float | None, digits: int = 1) -> float | None:
    return None if v is None or v != v else round(v, digits)  # NaN (nothing measured) is null in the JSON


def to_json(res: BenchResults) -> dict[str, Any]:
    f = res.freshness
    window_p50 = percentile(f.window_latencies_s, 0.5)
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "checkout": checkout(),
        "machine": machine(),
        "options": {**asdict(res.options), "postgres_uri": redact(res.options.postgres_uri or "")},
        "seconds": round(res.seconds, 1),
        "produce_s": round(res.produce_s, 2),
        "limit": {**asdict(res.limit), "events_per_s": round(res.limit.events_per_s)},
        "limit_default_settings": {**asdict(res.limit_default), "events_per_s": round(res.limit_default.events_per_s)},
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
        "relay_maintained": [_relay(r, res.options.relay_depths) for r in res.relay_maintained],
        "events": _kind(res.events, res.limit),
        "upsert": _kind(res.upserts, res.limit),
        "events_nested": None
        if res.nested_events is None
        else nested_kind(res.nested_events, res.events.events_per_s if res.events else None, res.limit),
        "merge_cost": res.merge_cost,
        "freshness": {
            "rate": f.rate,
            "seconds": f.seconds,
            "trigger_interval_s": f.trigger_interval_s,
            "target_s": f.target_s,
            "p99_target_s": f.p99_target_s,
            "breakdown_p50_s": {k: _round(v, 2) for k, v in f.breakdown.items()},
            "windows": len(f.window_latencies_s),
            "window_p50_s": _round(window_p50, 2),
            "window_p99_s": _round(percentile(f.window_latencies_s, 0.99), 2),
            "rejects": len(f.reject_latencies_s),
            "reject_p50_s": _round(percentile(f.reject_latencies_s, 0.5), 2),
            "reject_p99_s": _round(percentile(f.reject_latencies_s, 0.99), 2),
            "unseen": f.unseen,
            "relay_errors": f.relay_errors,
        },
        "dagster_freshness": None
        if res.dagster_freshness is None
        else {k: v for k, v in res.dagster_freshness.to_json().items() if k != "latencies_s"},
        "memory": [{"factor": k, "events": run.events, **asdict(run.peak_rss)} for k, run in res.scaling],
        "scaling": [
            {"factor": k, **{key: v for key, v in _run(run).items() if key in ("events", "seconds", "events_per_s")}}
            for k, run in res.scaling
        ],
        "targets": _targets(res),
    }


def write_json(doc: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")


def table_rows(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The results table, ``(measurement, result, detail)`` per row: the console's and docs/benchmark.md's."""
    rows: list[tuple[str, str, str]] = []
    lim, k, b = doc["limit"], doc["krishiv"], doc["baseline"]
    rows.append(("1 limit (raw confluent-kafka)", f"{lim['events_per_s']:,} ev/s", f"{lim['readers']} readers"))
    if "limit_default_settings" in doc:
        default = doc["limit_default_settings"]
        rows.append(("  with librdkafka's defaults", f"{default['events_per_s']:,} ev/s", "queued.min.messages 100k"))
    rows.append(
        (
            "2 Krishiv exactly-once",
            f"{k['events_per_s']:,} ev/s",
            f"{k['seconds']} s ({k['commit_s']} s of it the relay), {k['batches']} batches, {k['snapshots']} "
            f"snapshots; Spark start-up {doc['spark_startup_s']} s apart",
        )
    )
    scan = doc["spark_scan_only"]
    rows.append(("  profile: Spark source scan alone", f"{scan['events_per_s']:,} ev/s", "read + decode + count"))
    ev = doc.get("events")
    if ev:
        rows.append(
            (
                "2 events kind (raw ingestion)",
                f"{ev['events_per_s']:,} ev/s",
                f"{ev['rows_written']:,} rows in {ev['seconds']} s ({ev['commit_s']} s the relay), "
                f"{ev['vs_limit']} x limit",
            )
        )
    nested = doc.get("events_nested")
    if nested:
        rows.append(("2 events kind, nested orders", f"{nested['events_per_s']:,} ev/s", _nested_detail(nested)))
    up = doc.get("upsert")
    if up:
        rows.append(
            (
                "2 upsert kind (every row of a full table)",
                f"{up['events_per_s']:,} ev/s",
                f"{up['rows_written']:,} rows in {up['seconds']} s ({up['commit_s']} s the relay), "
                f"{up['vs_limit']} x limit",
            )
        )
    merge = doc.get("merge_cost")
    if merge:
        for c in merge["costs"]:
            rows.append(
                (
                    f"  merge, {c['table_rows']:,}-row table, keys {c['layout']}",
                    f"{c['median_s']} s per batch",
                    f"{c['batch_keys']:,} keys; {c['delete_rows_written']:,} position deletes, "
                    f"{c['table_bytes_rewritten']:,} table bytes rewritten"
                    + (f", {c['files_skipped']} table files skipped by Bloom filters" if "files_skipped" in c else ""),
                )
            )
    rows.append(
        ("3 baseline at-least-once", f"{b['events_per_s']:,} ev/s", f"{b['seconds']} s, {b['batches']} batches")
    )
    r = doc["ratios"]
    rows.append(("  ratios", f"{r['krishiv_vs_limit']} x limit", f"{r['krishiv_vs_baseline']} x baseline"))
    rows.append(("  same table", str(doc["results_agree"]), f"{k['windows']} windows, {k['orders_counted']:,} orders"))
    for rel in doc["relay"]:
        if rel["error"]:
            rows.append((f"4 relay on {rel['catalog']}", "not measured", rel["error"]))
            continue
        depth = ", ".join(f"{v} ms at {d}" for d, v in rel["p50_ms_at_depth"].items() if v is not None)
        rows.append(
            (
                f"4 relay on {rel['catalog']}",
                f"p50 {rel['p50_ms']} ms, p99 {rel['p99_ms']} ms",
                f"{rel['snapshots']} snapshots, {rel['snapshots_per_s']} snapshots/s; p50 by snapshots in table: "
                f"{depth}",
            )
        )
    for rel in doc.get("relay_maintained", []):
        name = f"4 relay on {rel['catalog']}, maintained"
        if rel["error"]:
            rows.append((name, "not measured", rel["error"]))
            continue
        m = rel["maintenance"] or {}
        rows.append(
            (
                name,
                f"last {rel['last_commits']:,}: p50 {rel['last_p50_ms']} ms, p99 {rel['last_p99_ms']} ms",
                f"{rel['snapshots']:,} batches (all: p50 {rel['p50_ms']} ms, p99 {rel['p99_ms']} ms); expiry keeping "
                f"{m.get('keep_last')} and compaction every {m.get('every_s')} s: {m.get('runs', 0)} runs, "
                f"{m.get('expired', 0)} snapshots expired, {m.get('compactions', 0)} compactions; "
                f"{rel['conflicts']} relay commits retried after a conflict",
            )
        )
    f = doc["freshness"]
    rows.append(
        (
            "5 freshness",
            f"per event p50 {f['reject_p50_s']} s, p99 {f['reject_p99_s']} s",
            f"event produced -> visible ({f['rejects']} events), {f['rate']:g} ev/s, trigger "
            f"{f['trigger_interval_s']:g} s; closing event -> window visible p50 {f['window_p50_s']} s, "
            f"p99 {f['window_p99_s']} s",
        )
    )
    d = doc.get("dagster_freshness")
    if d:
        steps = ", ".join(f"{k} {v} s" for k, v in d["breakdown_s"].items())
        rows.append(
            (
                "5 freshness, Dagster sensors alone",
                f"per event p50 {d['p50_s']} s, p99 {d['p99_s']} s",
                f"dagster-daemon, {d['rate']:g} ev/s, {d['events']} events, {d['staging_runs']} staging runs "
                f"(lingering), {d['commit_runs']} commit runs; cold start {round(d['cold_start_s'], 1)} s; "
                f"medians: {steps}",
            )
        )
    for mem in doc["memory"]:
        rows.append(
            (
                f"6 peak RSS at {mem['factor']}x",
                f"JVM {mem['jvm_mb']:.0f} MB",
                f"Python workers {mem['python_workers_mb']:.0f} MB, driver Python {mem['driver_python_mb']:.0f} MB",
            )
        )
    for sc in doc["scaling"]:
        rows.append(
            (
                f"7 scaling {sc['factor']}x",
                f"{sc['events_per_s']:,} ev/s",
                f"{sc['events']:,} orders in {sc['seconds']} s",
            )
        )
    return rows


def _nested_detail(nested: dict[str, Any]) -> str:
    text = f"{nested['rows_written']:,} rows in {nested['seconds']} s ({nested['commit_s']} s the relay)"
    apart = nested.get("measured_apart")
    if nested.get("vs_flat_events") is not None:
        text += f", {nested['vs_flat_events']} x the flat events kind" + (" of the same run" if apart else "")
    text += f"; {nested['shape']}"
    if apart:
        load = ", ".join(str(v) for v in apart["load_average"])
        sha = (apart.get("commit") or "unknown")[:12] + (" (uncommitted changes)" if apart.get("dirty") else "")
        text += (
            f"; measured apart on {apart['date']} from commit {sha}, best of {apart['repeat']}, load average "
            f"{load} at the end, the flat events kind {apart['flat_events_per_s']:,} ev/s there"
        )
    return text


def target_lines(doc: dict[str, Any]) -> list[str]:
    return [
        f"{t['name']}: {t['value']} (target {t['target']}): {'met' if t['met'] else 'missed'}" for t in doc["targets"]
    ]


def print_tables(doc: dict[str, Any], console: Console) -> None:
    m = doc["machine"]
    t = RichTable(title=f"make bench: {doc['options']['events']:,} orders, {m['cpus']} CPUs, {m['memory_gib']} GiB")
    for col in ("measurement", "result", "detail"):
        t.add_column(col)
    for row in table_rows(doc):
        t.add_row(*row)
    console.print(t)
    for t_ in doc["targets"]:
        status = "[green]met[/]" if t_["met"] else "[red]missed[/]"
        console.print(f"target {t_['name']}: {t_['value']} (target {t_['target']}): {status}")


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
