"""``python -m benchmarks`` (``make bench``): throughput, commit latency, freshness and memory of the exactly-once
pipeline beside the raw Kafka limit and an at-least-once baseline.

It lives beside the runtime packages, not in them, with its plotting dependency in the ``bench`` extra.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from benchmarks import DEFAULT_POSTGRES_URI
from benchmarks.report import print_tables, to_json, write_chart, write_json
from benchmarks.runner import REPO, BenchOptions, run_bench
from krishiv.state_folder import BENCH_MARKER, check_folder
from krishiv_core.errors import ConfigError, KrishivError
from krishiv_core.spec import KrishivSpec, load_spec

console = Console(highlight=False, soft_wrap=True)
LATEST = REPO / "benchmarks" / "results" / "latest.json"  # committed; docs/benchmark.md's table is rendered from it


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected numbers of at least 1, got {text!r}")
    return values


def run(args: argparse.Namespace, spec: KrishivSpec) -> int:

    out = Path(args.out)
    work = out / "work"
    check_folder(work, BENCH_MARKER, command="make bench", label=f"--out {args.out}", what=f"its work folder {work}")

    if max(args.relay_depths) >= args.relay_snapshots:
        raise ConfigError("--relay-depths", f"every depth must be below --relay-snapshots ({args.relay_snapshots})")
    options = BenchOptions(
        events=args.events,
        partitions=args.partitions,
        batch_records=args.batch_records,
        catch_up_records=args.catch_up_records,
        seed=args.seed,
        scaling=args.scaling,
        relay_snapshots=args.relay_snapshots,
        relay_depths=args.relay_depths,
        relay_maintained_batches=args.relay_maintained_batches,
        maintenance_every_s=args.maintenance_every,
        maintenance_keep_last=args.maintenance_keep_last,
        postgres_uri=args.postgres_uri or None,
        freshness_seconds=args.freshness_seconds,
        rate=args.rate,
        dagster_freshness_seconds=args.dagster_freshness_seconds,
        warmup_events=args.warmup_events,
        merge_sizes=args.merge_sizes,
        merge_batch_keys=args.merge_batch_keys,
    )
    results = run_bench(spec, options, work, console)
    doc = to_json(results)
    write_json(doc, out / "bench.json")
    write_chart(doc, out / "bench.png")
    print_tables(doc, console)
    written = [out / "bench.json", out / "bench.png"]
    if args.results:
        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
        write_json(doc, Path(args.results))
        written.append(Path(args.results))
    console.print(f"written: {', '.join(map(str, written))}")
    if args.results:
        console.print("docs/benchmark.md's table: python -m benchmarks.docs_table (from the results just written)")
    return 0 if doc["results_agree"] else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--spec", help="pipeline spec file (default: $KRISHIV_SPEC or ./krishiv.toml)")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch-records", type=int, default=200_000, help="records per micro-batch")
    parser.add_argument(
        "--catch-up-records",
        type=int,
        default=1_000_000,
        help="records per micro-batch while more than one batch behind (catch_up_records_per_batch; 0: off), "
        "for Krishiv and the baseline alike",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--scaling", type=_int_list, default=(1, 2, 4), help="event-count factors (default 1,2,4)")
    parser.add_argument("--relay-snapshots", type=int, default=1_010, help="snapshots the relay benchmark commits")
    parser.add_argument(
        "--relay-depths", type=_int_list, default=(100, 1_000), help="table sizes to report commit time at"
    )
    parser.add_argument(
        "--relay-maintained-batches",
        type=int,
        default=2_000,
        help="batches the relay commits with maintenance beside it (0 skips)",
    )
    parser.add_argument(
        "--maintenance-every", type=float, default=5.0, help="seconds between maintenance runs (expiry, compaction)"
    )
    parser.add_argument("--maintenance-keep-last", type=int, default=100, help="snapshots expiry keeps")
    parser.add_argument(
        "--postgres-uri", default=DEFAULT_POSTGRES_URI, help="PostgreSQL catalog for the relay ('' skips)"
    )
    parser.add_argument("--freshness-seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=1_000.0, help="events/s of the freshness producer")
    parser.add_argument(
        "--dagster-freshness-seconds",
        type=float,
        default=60.0,
        help="seconds of freshness measured under dagster-daemon with the sensors alone (0 skips it)",
    )
    parser.add_argument("--warmup-events", type=int, default=20_000)
    parser.add_argument(
        "--merge-sizes",
        type=_int_list,
        default=(1_000_000, 10_000_000),
        help="table sizes (rows) the upsert merge cost per batch is measured at (default 1M,10M)",
    )
    parser.add_argument("--merge-batch-keys", type=int, default=10_000, help="keys per merged batch")
    parser.add_argument(
        "--results",
        default=str(LATEST),
        help="also write the JSON here (default: the committed benchmarks/results/latest.json; '' skips)",
    )
    parser.add_argument(
        "--out",
        default="state/bench",
        help="folder for bench.json, bench.png and the working state in OUT/work, which is emptied first, so it "
        "must be new, empty or one an earlier bench made (it holds .krishiv-bench-state)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return run(args, load_spec(args.spec))
    except KrishivError as exc:
        Console(stderr=True, highlight=False, soft_wrap=True).print(f"[red]bench: {exc}[/]")
        return 2


if __name__ == "__main__":
    sys.exit(main())
