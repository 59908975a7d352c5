"""The ``krishiv`` command: broker, produce, run, commit, status, lineage, verify, demo and the operator's tools
(ledger-compact, skip-offsets, restage, clean-staging)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from krishiv.operations import commit_pipelines, open_ledger, run_pipelines, verify_pipelines
from krishiv_core.errors import KrishivError
from krishiv_core.spec import KrishivSpec, PipelineSpec, load_spec

console = Console(highlight=False, soft_wrap=True)  # a line per message, whatever the width
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


# ------------------------------------------------------------------------------------------ helpers


def _pipelines(spec: KrishivSpec, name: str | None) -> list[PipelineSpec]:
    return [spec.pipeline(name)] if name else list(spec.pipelines)


_ROWS_NAMED = {"windowed": "windows written", "events": "rows staged", "upsert": "keys upserted"}


def _print_batch(pipeline: str):
    def show(b) -> None:
        console.print(
            f"[bold]{pipeline}[/] batch {b.batch_id}: {b.records_read} records read, {b.rows} {_ROWS_NAMED[b.kind]}, "
            f"{b.rejects} rejects, {b.late_events} late, {'staged' if b.recorded else 'already in the ledger'}"
        )

    return show


# ------------------------------------------------------------------------------------------ commands


def cmd_broker(args: argparse.Namespace) -> int:
    import subprocess

    from krishiv.broker import broker_command, wait_until_ready

    process = subprocess.Popen(broker_command(args.host, args.port))
    try:
        wait_until_ready(f"{args.host}:{args.port}", process=process)
        console.print(f"Tansu broker listening on {args.host}:{args.port} (pid {process.pid}); Ctrl-C stops it")
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        return process.wait()


def cmd_produce(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from rich.progress import Progress

    from krishiv.produce import demo_orders, ensure_topic, produce

    pipeline = spec.pipeline(args.pipeline)
    partitions = ensure_topic(spec.kafka.bootstrap_servers, pipeline.topic, spec.kafka.partitions)
    extra = {}
    if args.rate:
        extra = {"start_ms": int(time.time() * 1000), "spacing_ms": max(1, int(1000 / args.rate)), "jitter_ms": 0}
    events = demo_orders(
        args.records, seed=args.seed, partitions=partitions, late=args.late, malformed=args.malformed, **extra
    )
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"producing to {pipeline.topic}", total=len(events))
        produce(
            spec.kafka.bootstrap_servers,
            pipeline.topic,
            events,
            rate=args.rate,
            on_progress=lambda n: progress.update(task, completed=n),
        )
    console.print(
        f"produced {len(events)} events to {pipeline.topic} on {spec.kafka.bootstrap_servers} "
        f"({args.late} late, {args.malformed} malformed, seed {args.seed})"
    )
    return 0


def cmd_run(args: argparse.Namespace, spec: KrishivSpec) -> int:
    running = run_pipelines(spec, _pipelines(spec, args.pipeline), once=args.once, reporter=_print_batch)
    for r in running:
        staged = [b for b in r.stager.history if b.recorded]
        console.print(
            f"{r.query.name}: {len(r.stager.history)} batches, {len(staged)} staged, "
            f"{sum(b.records_read for b in r.stager.history)} records read"
        )
    return 0


def cmd_commit(args: argparse.Namespace, spec: KrishivSpec) -> int:
    reports = commit_pipelines(spec, _pipelines(spec, args.pipeline))
    out = RichTable(title="commit relay")
    for col in ("table", "committed", "already there", "empty", "rows", "p50 ms"):
        out.add_column(col)
    for r in reports:
        lat = sorted(r.commit_latencies_ms)
        out.add_row(
            r.table,
            str(len(r.committed)),
            str(len(r.recovered)),
            str(len(r.empty)),
            str(r.records),
            f"{lat[len(lat) // 2]:.1f}" if lat else "-",
        )
    console.print(out)
    return 0


def cmd_status(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from krishiv.status import pipeline_status
    from krishiv_core.catalog import qualified
    from krishiv_core.entries import MERGE
    from krishiv_core.tables import output_tables
    from spark_jobs.errors import KafkaSourceError
    from spark_jobs.kafka_source import latest_offsets

    ledger = open_ledger(spec)
    for p in _pipelines(spec, args.pipeline):
        latest, broker_error = None, None
        try:
            latest = latest_offsets(spec.kafka.bootstrap_servers, p.topic, spec.kafka.consumer_settings())
        except KafkaSourceError as exc:
            broker_error = str(exc)
        merged = {qualified(spec, o.name) for o in output_tables(p) if o.operation.kind == MERGE}
        names = [qualified(spec, t) for t in p.all_tables]  # the first table's entries carry the batch counts
        s = pipeline_status(ledger, p.name, names[0], p.topic, latest, broker_error, other_tables=names[1:])
        console.print(f"[bold]{p.name}[/] ({p.kind}) reads {p.topic} into {len(names)} tables")
        console.print(f"  events: {s.records_read} read, {s.rejects} rejected, {s.late_events} dropped as late")
        for t in s.tables:
            console.print(
                f"  {t.table}: {t.pending} pending, {t.committed} committed, "
                f"{t.rows_staged} rows {'merged' if t.table in merged else 'appended'}"
            )
            if t.last_commit_at is None:
                console.print("    no commit yet")
            else:
                snapshot = f" (snapshot {t.last_snapshot_id})" if t.last_snapshot_id is not None else ""
                console.print(f"    last commit {t.last_commit_at.isoformat(timespec='seconds')}{snapshot}")
        if broker_error:
            console.print(f"  [red]broker: {broker_error}[/]")
        lag = RichTable("partition", "latest", "staged", "committed", "lag")
        for part in s.partitions:
            lag.add_row(
                part.partition,
                str(part.latest if part.latest is not None else "?"),
                str(part.staged),
                str(part.committed),
                str(part.lag if part.lag is not None else "?"),
            )
        console.print(lag)
    return 0


def cmd_ledger_compact(args: argparse.Namespace, spec: KrishivSpec) -> int:
    ledger = open_ledger(spec)
    report = ledger.compact(args.retention)
    console.print(
        f"ledger {ledger.path}: {report.entries_archived} committed entries older than "
        f"{_format_duration(args.retention)} folded into the archive of {report.groups} query/table pairs; "
        f"{report.entries_kept} entries kept"
    )
    return 0


def cmd_skip_offsets(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from krishiv.offsets import skip_offsets

    skip = skip_offsets(spec, spec.pipeline(args.pipeline), args.partition, args.to, args.reason)
    console.print(
        f"recorded in the ledger: {skip.topic} partition {skip.partition} of query {skip.query_id} moves from offset "
        f"{skip.from_offset} to {skip.to_offset} ({skip.reason}; by {skip.operator}); the next batch reads from "
        "there, and the snapshot that publishes it names the skip"
    )
    return 0


def cmd_restage(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from krishiv.staging_files import restage

    pipeline = spec.pipeline(args.pipeline)
    result = restage(spec, pipeline)
    if not result.batches:
        console.print(f"{pipeline.name}: every pending batch still has its staged files; nothing to restage")
    else:
        console.print(
            f"{pipeline.name}: staged batches {result.batches} again (Spark replayed from batch {result.rewound_to} "
            "with the offsets the ledger recorded); `krishiv commit` publishes them"
        )
    return 0


def cmd_clean_staging(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from krishiv.staging_files import clean_staging

    grace = _format_duration(args.grace)
    for p in _pipelines(spec, args.pipeline):
        for c in clean_staging(spec, p, args.grace, dry_run=args.dry_run):
            verb = "would remove" if args.dry_run else "removed"
            console.print(
                f"{c.table}: {verb} {len(c.removed)} staged files ({c.removed_bytes} bytes) no ledger entry or "
                f"snapshot refers to; kept {c.kept} referenced and {c.young} younger than {grace}"
            )
    return 0


def cmd_lineage(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from krishiv.lineage import lineage
    from krishiv_core.catalog import load_catalog, qualified

    catalog = load_catalog(spec)
    for p in _pipelines(spec, args.pipeline):
        for name in p.all_tables:  # the row tables (each route of a fan-out), then the rejects table
            table = catalog.load_table(qualified(spec, name))
            out = RichTable(title=f"lineage of {qualified(spec, name)} (newest last)")
            for col in ("snapshot", "parent", "committed at", "batch", "rows added", "offsets"):
                out.add_column(col)
            for row in lineage(table):
                out.add_row(
                    str(row.snapshot_id),
                    str(row.parent_id),
                    row.committed_at.isoformat(timespec="seconds"),
                    str(row.batch_id),
                    str(row.added_records),
                    str(row.offsets or ""),
                )
            console.print(out)
    return 0


def cmd_verify(args: argparse.Namespace, spec: KrishivSpec) -> int:
    results = verify_pipelines(spec, _pipelines(spec, args.pipeline))
    for r in results:
        mark = "[green]ok[/]" if r.ok else "[red]VIOLATIONS[/]"
        console.print(f"{r.table}: {mark} ({r.rows} rows, {r.snapshots} snapshots)")
        console.print(f"  unique by {', '.join(r.key)}" if r.key else "  no per-row key")
        for v in r.violations:
            console.print(f"  - {v}")
    return 0 if all(r.ok for r in results) else 1


def cmd_demo(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from krishiv.demo import run_demo
    from krishiv.state_folder import DEMO_MARKER, check_folder

    state = Path(args.state)
    check_folder(state, DEMO_MARKER, command="krishiv demo", label=f"--state {args.state}")
    return run_demo(
        spec,
        state,
        records=args.records,
        late=args.late,
        malformed=args.malformed,
        seed=args.seed,
        console=console,
    )


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _duration(text: str) -> float:
    """Seconds from ``7d``, ``12h``, ``30m``, ``45s`` or a plain number of seconds."""
    raw = text.strip().lower()
    unit = _DURATION_UNITS.get(raw[-1:])
    try:
        value = float(raw[:-1] if unit else raw) * (unit or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a duration such as 7d, 12h, 30m or 3600, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite duration of at least 0, got {text!r}")
    return value


def _format_duration(seconds: float) -> str:
    for unit in ("w", "d", "h", "m"):
        if seconds >= _DURATION_UNITS[unit] and seconds % _DURATION_UNITS[unit] == 0:
            return f"{int(seconds // _DURATION_UNITS[unit])}{unit}"
    return f"{seconds:g}s"


# ------------------------------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="krishiv", description=__doc__)
    parser.add_argument("--spec", help="pipeline spec file (default: $KRISHIV_SPEC or ./krishiv.toml)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the relay and stager do")
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("broker", help="run the local Tansu broker in the foreground")
    b.add_argument("--port", type=int, default=9092)
    b.add_argument("--host", default="127.0.0.1")

    p = sub.add_parser("produce", help="produce seeded demo orders")
    p.add_argument("--records", type=int, default=10_000)
    p.add_argument("--rate", type=float, help="events per second (default: as fast as possible)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--late", type=int, default=0, help="how many events arrive ten minutes late")
    p.add_argument("--malformed", type=int, default=0, help="how many events are malformed")
    p.add_argument("--pipeline")

    r = sub.add_parser("run", help="run the Spark streaming job (phase 1: stage batches)")
    r.add_argument("--once", action="store_true", help="process what is in the topic now, then stop")
    r.add_argument("--pipeline")

    for name, text in (
        ("commit", "commit pending batches to Iceberg (phase 2)"),
        ("status", "outbox and lag"),
        ("lineage", "snapshot lineage of the tables"),
        ("verify", "check exactly-once invariants"),
    ):
        c = sub.add_parser(name, help=text)
        c.add_argument("--pipeline")

    lc = sub.add_parser(
        "ledger-compact", help="fold committed ledger entries older than the retention into per-query totals"
    )
    lc.add_argument(
        "--retention", type=_duration, default=_duration("7d"), help="keep entries committed within this (default 7d)"
    )

    so = sub.add_parser(
        "skip-offsets",
        help="move a stopped query past offsets it cannot read exactly (topic re-created, retention); recorded",
    )
    so.add_argument("--pipeline", help="the pipeline (default: the spec's first)")
    so.add_argument("--partition", type=int, required=True, help="the partition the query is stuck on")
    so.add_argument("--to", type=int, required=True, help="the offset to read on from (within the partition's log)")
    so.add_argument("--reason", required=True, help="why; kept in the ledger and the next snapshot's summary")

    rs = sub.add_parser("restage", help="stage again the pending batches whose staged files are gone")
    rs.add_argument("--pipeline", help="the pipeline (default: the spec's first)")

    cs = sub.add_parser("clean-staging", help="remove staged files no ledger entry or snapshot refers to")
    cs.add_argument("--pipeline", help="the pipeline (default: all)")
    cs.add_argument(
        "--grace", type=_duration, default=_duration("1h"), help="keep files younger than this (default 1h)"
    )
    cs.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")

    d = sub.add_parser("demo", help="broker + produce + run + commit + show, on embedded defaults")
    d.add_argument("--records", type=int, default=20_000)
    d.add_argument("--late", type=int, default=25)
    d.add_argument("--malformed", type=int, default=30)
    d.add_argument("--seed", type=int, default=7)
    d.add_argument(
        "--state",
        default="state/demo",
        help="folder for the demo's catalog, warehouse and ledger; emptied first, so it must be new, empty or "
        "one an earlier demo made (it holds .krishiv-demo-state)",
    )
    return parser


COMMANDS = {
    "produce": cmd_produce,
    "run": cmd_run,
    "commit": cmd_commit,
    "status": cmd_status,
    "ledger-compact": cmd_ledger_compact,
    "skip-offsets": cmd_skip_offsets,
    "restage": cmd_restage,
    "clean-staging": cmd_clean_staging,
    "lineage": cmd_lineage,
    "verify": cmd_verify,
    "demo": cmd_demo,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        if args.command == "broker":
            return cmd_broker(args)
        return COMMANDS[args.command](args, load_spec(args.spec))
    except KrishivError as exc:
        err_console.print(f"[red]krishiv {args.command}: {escape(str(exc))}[/]")  # [brackets] in it are text
        return 2


if __name__ == "__main__":
    sys.exit(main())
