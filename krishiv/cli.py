"""krishiv: exactly-once Kafka -> Spark -> Iceberg through a DuckDB outbox ledger.
broker, produce, run, commit, status, lineage, verify, demo, the operator's
tools (ledger-compact, skip-offsets, restage, clean-staging) and table
maintenance (compact, expire-snapshots, remove-orphans, maintain)."""

from __future__ import annotations

import argparse
import io
import logging
import sys
import textwrap
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, RenderableType
from rich.markup import escape

from krishiv.inputs import read_spec
from krishiv.operations import (
    LEDGER_LOCK_TIMEOUT_ENV,
    STAGER_LEASE_TTL_ENV,
    CommitsStopped,
    RunInterrupted,
    TablesRefused,
    commit_pipelines,
    open_existing_ledger,
    open_writable_ledger,
    removed_pipelines_pending,
    run_pipelines,
    verify_pipelines,
)
from krishiv_core.errors import BrokerUnavailable, ConfigError, KrishivError
from krishiv_core.runbook import runbook
from krishiv_core.spec import ENV_OVERRIDES, SPEC_FILE_ENV, KrishivSpec, PipelineSpec

if TYPE_CHECKING:
    from krishiv.metrics import Metrics
    from outbox.ledger import Ledger
    from outbox.relay import TableCommitReport

console = Console(highlight=False, soft_wrap=True)  # a line per message, whatever the width
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


# ------------------------------------------------------------------------------------------ helpers


def _pipelines(spec: KrishivSpec, name: str | None) -> list[PipelineSpec]:
    return [spec.pipeline(name)] if name else list(spec.pipelines)


#: What a batch's rows are, by kind: short, so a batch's line fits 80 columns with six-digit counts.
_ROWS_NAMED = {"windowed": "windows", "events": "rows", "upsert": "keys"}


def _print_batch(pipeline: str):
    def show(b) -> None:
        again = "" if b.recorded else " (already in the ledger)"
        console.print(
            f"[bold]{escape(pipeline)}[/] batch {b.batch_id}: {b.records_read} read, {b.rows} {_ROWS_NAMED[b.kind]}, "
            f"{b.rejects} rejected, {b.late_events} late{again}"
        )

    return show


def _say(line: str) -> None:
    console.print(escape(line))


#: How wide ``--wide`` lets a table be: whole ids are never folded to fit the terminal.
WIDE_COLUMNS = 1_000


def _show(table: RenderableType, wide: bool) -> None:
    """A table: fitted to the terminal (80 columns, or ``$COLUMNS``), or as wide as it is with ``--wide``."""
    (Console(highlight=False, width=WIDE_COLUMNS) if wide else console).print(table)


# ------------------------------------------------------------------------------------------ commands


def cmd_broker(args: argparse.Namespace) -> int:
    from krishiv.broker import serve

    return serve(args.host, args.port, _say)


def cmd_produce(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from rich.progress import Progress

    from krishiv.preflight import check_broker
    from krishiv.produce import demo_orders, ensure_topic, file_events, produce

    if args.file is None and args.key is not None:
        raise ConfigError("--key", "keys the lines of --file; the demo orders are keyed by customer already")
    if args.late + args.malformed > args.records:
        raise ConfigError("--late, --malformed", f"{args.late} + {args.malformed} exceed --records {args.records}")
    lines = None
    if args.file is not None:
        try:
            lines = sys.stdin.readlines() if args.file == "-" else Path(args.file).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError("--file", f"cannot read {args.file}: {exc}") from None
    check_broker(spec)  # one line naming the address, not librdkafka's retries
    pipeline = spec.pipeline(args.pipeline)
    settings = spec.kafka.client_settings()  # [kafka.properties]: security, secrets resolved
    partitions = ensure_topic(spec.kafka.bootstrap_servers, pipeline.topic, spec.kafka.partitions, settings=settings)
    extra = {}
    if args.rate:
        extra = {"start_ms": int(time.time() * 1000), "spacing_ms": max(1, int(1000 / args.rate)), "jitter_ms": 0}
    if lines is not None:
        where = "standard input" if args.file == "-" else args.file
        events = file_events(lines, partitions, args.key, where)
    else:
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
            settings=settings,
        )
    if lines is not None:
        keyed = f"keyed by {args.key}" if args.key else "without keys, round the partitions"
        console.print(f"produced {len(events)} lines of {where} to {pipeline.topic} ({keyed})")
        return 0
    console.print(
        f"produced {len(events)} events to {pipeline.topic} on {spec.kafka.bootstrap_servers} "
        f"({args.late} late, {args.malformed} malformed, seed {args.seed})"
    )
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    import os
    import tomllib

    from krishiv.init_spec import analyse, check_kind, sample_topic, spec_text, write_spec
    from krishiv_core.spec import KafkaSettings, parse_spec

    output = Path(args.output)
    write_spec(output, "", check_only=True)  # an existing file is refused before the sample is read
    bootstrap = args.bootstrap or os.environ.get("KRISHIV_KAFKA_BOOTSTRAP") or KafkaSettings.bootstrap_servers
    key = [k.strip() for k in args.key.split(",")] if args.key else []
    if args.file:  # your own JSON lines, before they are on the broker
        try:
            lines = [line for line in Path(args.file).read_text().splitlines() if line.strip()][: args.sample]
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError("--file", f"cannot read {args.file}: {exc}") from None
        values, keys = [line.encode() for line in lines], [None] * len(lines)
    else:
        values, keys = sample_topic(bootstrap, args.topic, {}, args.sample)
    sample = analyse(values, keys)
    if args.kind == "upsert" and not key and sample.key_fields:
        key = sample.key_fields  # the Kafka key's fields (Debezium's key is the primary key)
    check_kind(sample, args.kind, key)
    text = spec_text(sample, args.topic, args.kind, bootstrap, key)
    parse_spec(tomllib.loads(text), env={})  # what init writes, the spec reader takes
    write_spec(output, text)
    source = f"lines of {args.file}" if args.file else f"sampled records of {args.topic}"
    console.print(f"wrote {output} from {len(values)} {source}; its fields:")
    for line in text.split("[pipelines.fields]\n", 1)[1].splitlines():
        console.print(f"  {escape(line)}")
    console.print(f"correct what the sample could not know, then: krishiv --spec {output} check")
    return 0


def cmd_check(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from krishiv.check import check_pipelines

    findings = check_pipelines(spec, _pipelines(spec, args.pipeline))
    ok = all(f.ok for f in findings)
    if args.json:
        from krishiv.json_output import check_document

        print(check_document(findings))
        return 0 if ok else 1
    for f in findings:
        mark = "[green]ok[/]  " if f.ok else "[red]FAIL[/]"
        console.print(f"{mark} {escape(f.pipeline)}: {escape(f.check)}: {escape(f.detail)}")
    return 0 if ok else 1


def cmd_topic(args: argparse.Namespace, spec: KrishivSpec) -> int:
    import re

    from krishiv.topics import create_topic, describe_topic, topic_names

    if args.action == "list":
        reading = {p.topic: p.name for p in spec.pipelines}
        for name, partitions in topic_names(spec).items():
            pipeline = f"  (read by {reading[name]})" if name in reading else ""
            console.print(f"{escape(name)}  {_counted(partitions, 'partition')}{escape(pipeline)}")
        return 0
    if not args.name:
        raise ConfigError("topic", f"krishiv topic {args.action} needs the topic's name")
    if args.action == "create":
        if not re.match(r"^[A-Za-z0-9._-]{1,249}$", args.name):
            raise ConfigError("topic", f"not a valid Kafka topic name: {args.name!r}")
        count, created = create_topic(spec, args.name, args.partitions or spec.kafka.partitions)
        said = "created" if created else "exists already, with"
        console.print(f"topic {escape(args.name)} {said} {_counted(count, 'partition')}")
        return 0
    view = describe_topic(spec, args.name)
    readers = ", ".join(view.read_by) or "no pipeline of this spec"
    console.print(f"topic {escape(view.name)} (id {view.topic_id or 'unknown'}), read by {escape(readers)}")
    for p in view.partitions:
        offsets = _counted(p.records, "offset")
        console.print(f"  partition {p.partition}: offsets {p.earliest} to {p.latest} ({offsets})")
    return 0


def _metrics(spec: KrishivSpec, ledger: Ledger, pipelines: list[PipelineSpec], port: int | None) -> Metrics:
    """The command's metrics (exported as ``--metrics-port`` and the environment ask), the endpoint announced."""
    from krishiv.metrics import start_metrics

    metrics = start_metrics(spec, ledger, pipelines=pipelines, port=port)
    if metrics.address:
        _say(f"metrics on http://{metrics.address[0]}:{metrics.address[1]}/metrics")
    return metrics


def _batches(ids: list[int]) -> str:
    return f"batch {ids[0]}" if len(ids) == 1 else f"batches {ids[0]}-{ids[-1]}"


def _commit_line(spec: KrishivSpec, report: TableCommitReport) -> str:
    """``orders_per_minute: committed batch 5 (3 rows) as snapshot 1234567… in 84 ms``: within 80 columns."""
    from krishiv.views import short_id, table_name

    parts = []
    if report.committed:
        last = "as snapshot" if len(report.committed) == 1 else "up to snapshot"
        parts.append(
            f"committed {_batches(report.committed)} ({report.records} rows) {last} "
            f"{short_id(report.snapshot_ids[-1])} in {sum(report.commit_latencies_ms):.0f} ms"
        )
    if report.recovered:
        parts.append(f"{_batches(report.recovered)} already in the table")
    return f"{table_name(spec, report.table)}: {'; '.join(parts)}"


def cmd_run(args: argparse.Namespace, spec: KrishivSpec) -> int:
    pipelines, ledger = _pipelines(spec, args.pipeline), open_writable_ledger(spec)
    _LEDGER_FOLDER_MADE.append(Path(ledger.path).parent)  # from here on, its absence means it was removed
    committed: dict[str, set[int]] = {}  # table -> the batches this run's committer committed to it

    def on_commit(report: TableCommitReport) -> None:
        committed.setdefault(report.table, set()).update(report.committed)
        metrics.record_commits([report])
        console.print(escape(_commit_line(spec, report)))

    failure = None
    try:
        with _metrics(spec, ledger, pipelines, args.metrics_port) as metrics:
            try:
                running = run_pipelines(
                    spec,
                    pipelines,
                    once=args.once,
                    ledger=ledger,
                    reporter=metrics.chain(_print_batch),
                    progress=_say,
                    stop_on_signals=True,
                    commit=not args.no_commit,
                    on_commit=on_commit,
                )
            except CommitsStopped as exc:
                running, failure = exc.running, str(exc)
    except RunInterrupted as exc:
        err_console.print(f"krishiv run: {escape(str(exc))}")
        return 130 if exc.signal_name == "Ctrl-C" else 143
    from krishiv_core.catalog import qualified

    for r, p in zip(running, pipelines, strict=False):
        staged = [b for b in r.stager.history if b.recorded]
        line = (
            f"{escape(r.query.name)}: {len(r.stager.history)} batches, {len(staged)} staged, "
            f"{sum(b.records_read for b in r.stager.history)} records read"
        )
        if not (args.once or args.no_commit):
            batches = set().union(*(committed.get(qualified(spec, t), set()) for t in p.all_tables))
            line += f", {len(batches)} committed"
        console.print(line)
    if failure is not None:
        _fail("run", f"stopped committing {failure}")
        return 1
    return 0


def cmd_commit(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from krishiv.views import commit_table

    pipelines, ledger = _pipelines(spec, args.pipeline), open_existing_ledger(spec)
    refused: TablesRefused | None = None
    with _metrics(spec, ledger, pipelines, args.metrics_port) as metrics:
        try:  # without --pipeline, also the pending batches of pipelines removed from the spec
            reports = commit_pipelines(spec, pipelines, ledger=ledger, removed_pipelines=args.pipeline is None)
        except TablesRefused as exc:  # every other table was committed: shown, then each refusal in a line
            refused, reports = exc, exc.reports
        metrics.record_commits(reports)
    _show(commit_table(spec, reports, wide=args.wide), args.wide)
    if refused is not None:
        for line in refused.lines():
            _fail("commit", line)
        return 1
    return 0


def cmd_status(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from datetime import UTC, datetime

    from krishiv.json_output import status_document, status_pipeline
    from krishiv.preflight import check_broker
    from krishiv.status import (
        DEFAULT_PENDING_AGE_S,
        PENDING_AGE_ENV,
        BrokerSide,
        pipeline_status,
        status_warnings,
    )
    from krishiv.views import lag_table, short_id, table_name, when
    from krishiv_core.catalog import qualified
    from krishiv_core.entries import MERGE
    from krishiv_core.env_settings import seconds_from_env
    from krishiv_core.tables import output_tables
    from spark_jobs.errors import KafkaSourceError
    from spark_jobs.kafka_source import KafkaAdmin

    ledger = open_existing_ledger(spec)
    try:
        check_broker(spec)  # quietly, in seconds: the ledger's side is shown either way, the lag only if it answers
        broker_down = None
    except BrokerUnavailable as exc:
        broker_down = str(exc)
    documents: list[dict] = []
    for p in _pipelines(spec, args.pipeline):
        latest, broker_error = None, broker_down
        side = BrokerSide()
        if broker_down is None:
            try:
                with KafkaAdmin(spec.kafka.bootstrap_servers, p.topic, spec.kafka.consumer_settings()) as admin:
                    latest = admin.latest()
                    side = BrokerSide(admin.earliest(), admin.topic_id())
            except KafkaSourceError as exc:
                broker_error = str(exc)
        merged = {qualified(spec, o.name) for o in output_tables(p) if o.operation.kind == MERGE}
        names = [qualified(spec, t) for t in p.all_tables]  # the first table's entries carry the batch counts
        names += [t for t in ledger.pending_tables([p.name]) if t not in names]  # a route removed with batches pending
        s = pipeline_status(ledger, p.name, names[0], p.topic, latest, broker_error, other_tables=names[1:])
        warnings = status_warnings(
            s,
            side,
            ledger.newest_topic_id(names[0]),
            ledger.pending_batches(names, pipeline=p.name),
            ledger.current_lease(p.name),
            datetime.now(UTC),
            seconds_from_env(PENDING_AGE_ENV, DEFAULT_PENDING_AGE_S),
        )
        if args.json:
            documents.append(status_pipeline(s, p.kind, p.topic, merged) | {"warnings": warnings})
            continue
        for line in warnings:
            err_console.print(f"[yellow]warning: {escape(p.name)}: {escape(line)}[/]")
        console.print(f"[bold]{escape(p.name)}[/] ({p.kind}) reads {escape(p.topic)} into {len(names)} tables")
        console.print(f"  events: {s.records_read} read, {s.rejects} rejected, {s.late_events} dropped as late")
        for t in s.tables:
            console.print(
                f"  {escape(table_name(spec, t.table, args.wide))}: {t.pending} pending, {t.committed} committed, "
                f"{t.rows_staged} rows {'merged' if t.table in merged else 'appended'}"
            )
            if t.last_commit_at is None:
                console.print("    no commit yet")
            else:
                snapshot = (
                    f" (snapshot {short_id(t.last_snapshot_id, args.wide)})" if t.last_snapshot_id is not None else ""
                )
                console.print(f"    last commit {when(t.last_commit_at, args.wide)} UTC{snapshot}")
        if broker_error and broker_error != broker_down:
            err_console.print(f"  [red]broker: {escape(broker_error)}[/]")
        _show(lag_table(s), args.wide)
    removed: list[dict] = []
    if args.pipeline is None:  # a pipeline removed from the spec whose batches are still pending
        for name in removed_pipelines_pending(spec, ledger):
            if args.json:
                summaries = [(t, ledger.table_summary(t, pipeline=name)) for t in ledger.pending_tables([name])]
                tables = [{"table": t, "pending": x.pending, "committed": x.committed} for t, x in summaries]
                removed.append({"name": name, "tables": tables})
                continue
            console.print(f"[bold]{escape(name)}[/] (no longer in the spec; `krishiv commit` commits what it staged)")
            for table in ledger.pending_tables([name]):
                t = ledger.table_summary(table, pipeline=name)
                console.print(
                    f"  {escape(table_name(spec, table, args.wide))}: {t.pending} pending, {t.committed} committed"
                )
    if args.json:
        print(status_document(documents, removed, broker_down))
        return 1 if broker_down else 0
    if broker_down:
        _fail("status", f"{broker_down}; lag unknown")
        return 1
    return 0


def cmd_ledger_compact(args: argparse.Namespace, spec: KrishivSpec) -> int:
    ledger = open_existing_ledger(spec)
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
    from krishiv.inputs import require_ledger
    from krishiv.staging_files import restage

    pipeline = spec.pipeline(args.pipeline)
    require_ledger(spec)  # a mistyped ledger path is an error, not "nothing to restage"
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

    open_existing_ledger(spec)  # before a first run there is nothing to clean: said so, not a catalog's traceback
    grace = _format_duration(args.grace)
    for p in _pipelines(spec, args.pipeline):
        for c in clean_staging(spec, p, args.grace, dry_run=args.dry_run, force=args.force):
            verb = "would remove" if args.dry_run else "removed"
            console.print(
                f"{c.table}: {verb} {len(c.removed)} staged files ({c.removed_bytes} bytes) no ledger entry or "
                f"snapshot refers to; kept {c.kept} referenced and {c.young} younger than {grace}"
            )
    return 0


def _maintain(args: argparse.Namespace, spec: KrishivSpec, *, expire: bool, compact: bool, orphans: bool) -> int:
    """Run the asked maintenance steps with the spec's ``[maintenance]``, the command's options overriding it."""
    from dataclasses import replace

    from krishiv.maintenance import describe, maintain_pipelines
    from krishiv.views import table_name

    settings = spec.maintenance
    overrides = {
        "keep_last": getattr(args, "keep_last", None),
        "keep_younger_than_ms": None
        if getattr(args, "keep_younger_than", None) is None
        else int(args.keep_younger_than * 1000),
        "orphan_grace_ms": None if getattr(args, "grace", None) is None else int(args.grace * 1000),
        "target_file_size": getattr(args, "target_file_size", None),
        "min_files": getattr(args, "min_files", None),
    }
    settings = replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    results = maintain_pipelines(
        spec,
        _pipelines(spec, args.pipeline),
        expire=expire,
        compact=compact,
        orphans=orphans,
        dry_run=args.dry_run,
        settings=settings,
        force=getattr(args, "force", False),
    )
    grace = _format_duration(settings.orphan_grace_ms / 1000)
    for result in results:
        for line in describe(result, grace, table_name(spec, result.table)):
            console.print(escape(line))
    return 0


def cmd_expire_snapshots(args: argparse.Namespace, spec: KrishivSpec) -> int:
    return _maintain(args, spec, expire=True, compact=False, orphans=False)


def cmd_remove_orphans(args: argparse.Namespace, spec: KrishivSpec) -> int:
    return _maintain(args, spec, expire=False, compact=False, orphans=True)


def cmd_compact(args: argparse.Namespace, spec: KrishivSpec) -> int:
    return _maintain(args, spec, expire=False, compact=True, orphans=False)


def cmd_maintain(args: argparse.Namespace, spec: KrishivSpec) -> int:
    return _maintain(args, spec, expire=True, compact=True, orphans=True)


def _size(text: str) -> int:
    from krishiv_core.spec import parse_size_bytes

    try:
        return parse_size_bytes(int(text) if text.strip().isdigit() else text, "size")
    except ConfigError:
        raise argparse.ArgumentTypeError(f"expected a size such as 128MiB, 512KiB or 1GB, got {text!r}") from None


def _positive(text: str) -> int:
    count = _count(text)
    if count < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return count


def _min_files(text: str) -> int:
    count = _count(text)
    if count < 2:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of at least 2 (one file is not compacted), got {text!r}"
        )
    return count


def cmd_lineage(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from krishiv.inputs import load_table
    from krishiv.lineage import lineage
    from krishiv.views import lineage_table, table_name
    from krishiv_core.catalog import load_catalog, qualified, redact

    open_existing_ledger(spec)  # a ledger path with a typo is named, as in status, verify and commit
    catalog = load_catalog(spec)
    address = redact(spec.catalog_uri())
    found = []
    for p in _pipelines(spec, args.pipeline):
        for name in p.all_tables:  # the row tables (each route of a fan-out), then the rejects table
            table = load_table(catalog, qualified(spec, name), address)
            if args.json:
                found.append((qualified(spec, name), lineage(table)))
                continue
            title = f"lineage of {table_name(spec, qualified(spec, name), args.wide)} (newest last)"
            _show(lineage_table(escape(title), lineage(table), wide=args.wide), args.wide)
    if args.json:
        from krishiv.json_output import lineage_document

        print(lineage_document(found))
    return 0


def _counted(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def cmd_verify(args: argparse.Namespace, spec: KrishivSpec) -> int:
    results = verify_pipelines(spec, _pipelines(spec, args.pipeline), ledger=open_existing_ledger(spec))
    if args.json:
        from krishiv.json_output import verify_document

        print(verify_document(results))
        return 0 if all(r.ok for r in results) else 1
    for r in results:
        mark = "[green]ok[/]" if r.ok else "[red]VIOLATIONS[/]"
        console.print(f"{escape(r.table)}: {mark} ({_counted(r.rows, 'row')}, {_counted(r.snapshots, 'snapshot')})")
        console.print(f"  unique by {', '.join(r.key)}" if r.key else "  no per-row key")
        for v in r.violations:
            console.print(f"  - {escape(v)}")
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


def _count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 0, got {text!r}")
    return count


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text!r}")
    return port


def _format_duration(seconds: float) -> str:
    for unit in ("w", "d", "h", "m"):
        if seconds >= _DURATION_UNITS[unit] and seconds % _DURATION_UNITS[unit] == 0:
            return f"{int(seconds // _DURATION_UNITS[unit])}{unit}"
    return f"{seconds:g}s"


# ------------------------------------------------------------------------------------------ parser


def _version() -> str:
    try:
        return version("krishiv")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _environment() -> str:
    """The epilog of ``krishiv --help``: every environment variable Krishiv reads, within 80 columns."""
    variables = [
        (SPEC_FILE_ENV, "the spec file when --spec is not given"),
        *((var, f"overrides {field}") for var, field in ENV_OVERRIDES.items()),
        (LEDGER_LOCK_TIMEOUT_ENV, "seconds to wait for a ledger another process holds (default 30)"),
        (STAGER_LEASE_TTL_ENV, "seconds a stager's lease lasts unless renewed (default 30)"),
        ("KRISHIV_BROKER_OUTAGE_S", "seconds a running query waits for a broker that stopped answering (default 300)"),
        ("KRISHIV_STATUS_PENDING_S", "status warns of entries pending longer than this many seconds (600)"),
        ("KRISHIV_REGISTRY_OUTAGE_S", "seconds a query's tasks wait for a Schema Registry that stopped answering (60)"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "export metrics over OTLP/HTTP there (with the other OTEL_* variables)"),
        ("KRISHIV_METRICS_PORT", "serve Prometheus metrics on this port (0: any free port)"),
        ("KRISHIV_METRICS_HOST", "the address the metrics endpoint binds (default 127.0.0.1)"),
        ("KRISHIV_METRICS_REFRESH_S", "seconds a metrics reading is reused (default 5)"),
        ("PYICEBERG_CATALOG__KRISHIV__*", "pyiceberg's own catalog properties (the spec's [iceberg.properties] win)"),
        ("${NAME}", "any variable the spec's properties refer to: secrets, read when a client is built"),
        ("JAVA_HOME", "the Java 17+ Spark runs on (default: java on PATH)"),
        ("KRISHIV_FAULTS, KRISHIV_FAULTS_LOG", "fault injection, for the tests only"),
    ]
    lines = ["environment variables:"]
    for name, text in variables:
        wrapped = textwrap.wrap(text, 78 - 32)
        if len(name) > 29:
            lines.append(f"  {name}")
            lines += [" " * 32 + w for w in wrapped]
        else:
            lines.append(f"  {name:<30}{wrapped[0]}")
            lines += [" " * 32 + w for w in wrapped[1:]]
    lines += ["", f"krishiv {_version()}; README.md has the spec reference and a first session."]
    return "\n".join(lines)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's layout and adds ``(default: X)`` to an option whose help does not name its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.default not in (None, False, argparse.SUPPRESS) and action.option_strings
        if shown and "default" not in text:
            text += " (default: %(default)s)"
        return text


_SPEC_HELP = f"pipeline spec file (default: ${SPEC_FILE_ENV}, else ./krishiv.toml)"


def _json(c: argparse.ArgumentParser) -> None:
    c.add_argument(
        "--json", action="store_true", help="one JSON document on stdout, its shape versioned (README: Commands)"
    )


_VERBOSE_HELP = "log what the relay and stager do"


def _command(
    sub: argparse._SubParsersAction,
    name: str,
    text: str,
    *,
    pipeline: str | None = "the pipeline (default: every pipeline)",
    spec: bool = True,
) -> argparse.ArgumentParser:
    """A subcommand taking ``--spec`` (here too, so it may follow the command) and, unless None, ``--pipeline``."""
    c = sub.add_parser(name, help=text, description=textwrap.fill(text, 79), formatter_class=_HelpFormatter)
    if spec:
        c.add_argument("--spec", default=argparse.SUPPRESS, help=_SPEC_HELP)
    c.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=_VERBOSE_HELP)
    if pipeline:
        c.add_argument("--pipeline", help=pipeline)
    return c


def _wide(c: argparse.ArgumentParser) -> None:
    c.add_argument("--wide", action="store_true", help="whole ids, namespaces and offsets (wider than 80 columns)")


def _metrics_port(c: argparse.ArgumentParser) -> None:
    c.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on this port, on 127.0.0.1 unless $KRISHIV_METRICS_HOST "
        "(default: $KRISHIV_METRICS_PORT, else none)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="krishiv", description=__doc__, epilog=_environment(), formatter_class=_HelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"krishiv {_version()}")
    parser.add_argument("--spec", help=_SPEC_HELP)
    parser.add_argument("-v", "--verbose", action="store_true", help=_VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = _command(
        sub, "broker", "run a local Tansu Kafka broker in the foreground until Ctrl-C", pipeline=None, spec=False
    )
    b.add_argument("--port", type=_port, default=9092, help="the port it listens on")
    b.add_argument("--host", default="127.0.0.1", help="the address it listens on")

    text = "write a spec for a topic, its fields inferred from a sample of its records"
    i = _command(sub, "init", text, pipeline=None, spec=False)
    i.add_argument("--topic", required=True, help="the topic to read")
    i.add_argument("--kind", choices=("events", "upsert", "windowed"), default="events", help="what the table holds")
    i.add_argument("--key", help="upsert: the key field(s), comma-separated (default: the Kafka key's fields)")
    i.add_argument("--bootstrap", help="host:port (default: $KRISHIV_KAFKA_BOOTSTRAP, else 127.0.0.1:9092)")
    i.add_argument("--sample", type=_positive, default=500, help="how many records to infer the fields from")
    i.add_argument("--file", help="infer from your own JSON lines file instead of the topic's records")
    i.add_argument("--output", default="krishiv.toml", help="the spec file to write (never overwritten)")

    t = _command(sub, "topic", "list the broker's topics, describe one, or create one", pipeline=None)
    t.add_argument("action", choices=("list", "describe", "create"), help="what to do")
    t.add_argument("name", nargs="?", help="the topic (describe, create)")
    t.add_argument("--partitions", type=_positive, help="create: how many (default: the spec's kafka.partitions)")

    one = "the pipeline whose topic to write (default: the spec's first)"
    text = "produce seeded demo orders, or your own JSON lines, to a pipeline's topic"
    p = _command(sub, "produce", text, pipeline=one)
    p.add_argument("--file", help="a JSON lines file (- for standard input): one record per line, sent as it is")
    p.add_argument("--key", help="with --file: the field whose value is each record's Kafka key (default: no key)")
    p.add_argument("--records", type=_count, default=10_000, help="how many orders")
    p.add_argument("--rate", type=float, help="events per second (default: as fast as possible)")
    p.add_argument("--seed", type=int, default=7, help="the random seed: the same seed gives the same orders")
    p.add_argument("--late", type=_count, default=0, help="how many events arrive ten minutes late")
    p.add_argument("--malformed", type=_count, default=0, help="how many events are malformed")

    r = _command(
        sub,
        "run",
        "run the Spark streaming job: stage each batch and commit it as soon as it is staged (with --once or "
        "--no-commit, stage only); Ctrl-C stops it between batches",
    )
    r.add_argument(
        "--once", action="store_true", help="process what is in the topic now, stage it, then stop (default: run on)"
    )
    r.add_argument(
        "--no-commit",
        action="store_true",
        help="stage only; leave phase 2 to krishiv commit or Dagster (a run with --once never commits)",
    )
    _metrics_port(r)

    c = _command(sub, "commit", "commit pending batches to Iceberg (phase 2)")
    _wide(c)
    _metrics_port(c)
    c = _command(sub, "status", "outbox, events and lag per pipeline; exit 1 if the broker does not answer")
    _wide(c)
    _json(c)
    c = _command(sub, "lineage", "snapshot lineage of the tables, newest last")
    _wide(c)
    _json(c)
    _json(_command(sub, "verify", "check the exactly-once invariants; exit 1 on any violation"))
    text = "what krishiv run checks before Spark starts (broker, topic, catalog, tables, history), changing nothing"
    _json(_command(sub, "check", text + "; exit 1 if a check fails"))

    lc = _command(
        sub,
        "ledger-compact",
        "fold committed ledger entries older than the retention into per-query totals",
        pipeline=None,
    )
    lc.add_argument(
        "--retention", type=_duration, default=_duration("7d"), help="keep entries committed within this (default 7d)"
    )

    so = _command(
        sub,
        "skip-offsets",
        "move a stopped query past offsets it cannot read exactly (topic re-created, retention); recorded",
        pipeline="the pipeline (default: the spec's first)",
    )
    so.add_argument("--partition", type=int, required=True, help="the partition the query is stuck on (required)")
    so.add_argument(
        "--to", type=int, required=True, help="the offset to read on from, within the partition's log (required)"
    )
    so.add_argument(
        "--reason", required=True, help="why; kept in the ledger and the next snapshot's summary (required)"
    )

    _command(
        sub,
        "restage",
        "stage again the pending batches whose staged files are gone",
        pipeline="the pipeline (default: the spec's first)",
    )

    cs = _command(sub, "clean-staging", "remove staged files no ledger entry or snapshot refers to")
    cs.add_argument(
        "--grace", type=_duration, default=_duration("1h"), help="keep files younger than this (default 1h)"
    )
    cs.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    cs.add_argument("--force", action="store_true", help="allow a grace below 10m (only when nothing is staging)")

    m = "[maintenance]"  # the spec's section, which the options override
    es = _command(
        sub, "expire-snapshots", "expire old snapshots of the pipelines' tables (keeps files; see remove-orphans)"
    )
    es.add_argument(
        "--keep-last", type=_positive, metavar="N", help=f"always keep the newest N snapshots (default: {m}, 100)"
    )
    es.add_argument(
        "--keep-younger-than",
        type=_duration,
        metavar="D",
        help=f"also keep snapshots younger than this, e.g. 15m, 7d (default: {m}, 15m)",
    )
    es.add_argument("--dry-run", action="store_true", help="list what would be expired, expire nothing")

    ro = _command(
        sub, "remove-orphans", "remove files no retained snapshot, metadata or pending ledger entry refers to"
    )
    ro.add_argument(
        "--grace", type=_duration, metavar="D", help=f"keep files younger than this (default: {m}, 24h; at least 10m)"
    )
    ro.add_argument("--force", action="store_true", help="allow a grace below 10m (nothing may be writing the tables)")
    ro.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")

    co = _command(sub, "compact", "rewrite small data files into files of a target size, one replace snapshot")
    co.add_argument(
        "--target-file-size", type=_size, metavar="SIZE", help=f"size of the rewritten files (default: {m}, 128MiB)"
    )
    co.add_argument(
        "--min-files",
        type=_min_files,
        metavar="N",
        help=f"compact a partition with this many small files (default: {m}, 5)",
    )
    co.add_argument("--dry-run", action="store_true", help="list what would be rewritten, write nothing")

    mt = _command(sub, "maintain", "compact, expire snapshots and remove orphans with the spec's [maintenance]")
    mt.add_argument("--dry-run", action="store_true", help="list what each step would do, change nothing")

    d = _command(sub, "demo", "broker + produce + run + commit + show, on embedded defaults", pipeline=None)
    d.add_argument("--records", type=_count, default=20_000, help="how many orders")
    d.add_argument("--late", type=_count, default=25, help="how many events arrive ten minutes late")
    d.add_argument("--malformed", type=_count, default=30, help="how many events are malformed")
    d.add_argument("--seed", type=int, default=7, help="the random seed")
    d.add_argument(
        "--state",
        default="state/demo",
        help="folder for the demo's catalog, warehouse and ledger; emptied first, so it must be new, empty or "
        "one an earlier demo made (it holds .krishiv-demo-state) (default: state/demo)",
    )
    return parser


COMMANDS = {
    "produce": cmd_produce,
    "run": cmd_run,
    "commit": cmd_commit,
    "status": cmd_status,
    "check": cmd_check,
    "topic": cmd_topic,
    "ledger-compact": cmd_ledger_compact,
    "skip-offsets": cmd_skip_offsets,
    "restage": cmd_restage,
    "clean-staging": cmd_clean_staging,
    "expire-snapshots": cmd_expire_snapshots,
    "remove-orphans": cmd_remove_orphans,
    "compact": cmd_compact,
    "maintain": cmd_maintain,
    "lineage": cmd_lineage,
    "verify": cmd_verify,
    "demo": cmd_demo,
}


class _PipeSafe(io.TextIOBase):
    """stdout that stops writing, silently, once its reader has gone (``krishiv verify | head -1``): the command
    goes on to its end and exits with its own status, as the output it still had would have said."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self.stream.write(text)
            except BrokenPipeError:
                self.gone = True
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self.gone = True

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()


def main(argv: Sequence[str] | None = None) -> int:
    if not isinstance(sys.stdout, _PipeSafe):
        sys.stdout = _PipeSafe(sys.stdout)
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # A batch that fails in Krishiv's foreachBatch is reported in one line from the query's exception; py4j's own
    # ERROR for the callback repeats it as a Python traceback (and -v shows everything).
    logging.getLogger("py4j.clientserver").setLevel(logging.INFO if args.verbose else logging.CRITICAL)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_not_an_interrupted_py4j_call)
    spec: KrishivSpec | None = None
    try:
        if args.command == "broker":
            return cmd_broker(args)
        if args.command == "init":
            return cmd_init(args)
        spec = read_spec(args.spec)
        return COMMANDS[args.command](args, spec)
    except KrishivError as exc:
        _fail(args.command, str(exc) + _state_removed(args.command, spec))  # [brackets] in it are text
        return 2
    except OSError as exc:  # a path the user gave that the machine refused: named, without a traceback
        where = f" {exc.filename}" if exc.filename else ""
        first = _krishiv_cause(exc)
        said = str(first) if first is not None else f"{exc.strerror or exc}:{where}"
        _fail(args.command, said + _state_removed(args.command, spec))
        return 2
    except KeyboardInterrupt:
        _fail(args.command, "interrupted (Ctrl-C)")
        return 130
    except Exception as exc:
        removed = _state_removed(args.command, spec)
        if removed:  # whatever broke first, the cause is the folder that went away: one line, the first error
            first = _krishiv_cause(exc)
            _fail(args.command, (str(first) if first is not None else f"{type(exc).__name__}: {exc}") + removed)
            return 2
        if type(exc).__name__ not in ("NoSuchTableError", "NoSuchNamespaceError"):  # pyiceberg, deeper down
            raise
        _fail(args.command, f"{exc}; `krishiv run` creates the spec's tables and `krishiv commit` fills them")
        return 2


#: The ledger folder ``krishiv run`` made (or found) when it began: if it is missing when the run fails, the state
#: (ledger, checkpoints, catalog, warehouse) was removed while it ran.
_LEDGER_FOLDER_MADE: list[Path] = []


def _state_paths(spec: KrishivSpec) -> list[tuple[str, Path]]:
    """The local state a run made before Spark started: the ledger, the checkpoints, a SQLite catalog, a local
    warehouse."""
    paths = [
        ("ledger", spec.resolve(spec.storage.ledger_path)),
        ("checkpoints", spec.resolve(spec.storage.checkpoint_location)),
    ]
    uri = spec.catalog_uri()
    if uri.startswith("sqlite:///") and uri != "sqlite:///:memory:":
        paths.append(("catalog", Path(uri[len("sqlite:///") :])))
    if "://" not in spec.iceberg.warehouse or spec.iceberg.warehouse.startswith("file://"):
        paths.append(("warehouse", Path(spec.warehouse_uri().removeprefix("file://"))))
    return paths


def _state_removed(command: str, spec: KrishivSpec | None) -> str:
    """``; <what> was removed while krishiv run ran (...)`` when part of the spec's state is gone, else ''."""
    if spec is None or command != "run" or not _LEDGER_FOLDER_MADE or _LEDGER_FOLDER_MADE[-1].exists():
        return ""  # the run stopped before it made its state, or its state is still there
    gone = [(what, path) for what, path in _state_paths(spec) if not path.exists()]
    folders = sorted({str(_topmost_missing(path)) for _, path in gone})
    shown = ", ".join(what for what, _ in gone)
    return (
        f"; the {shown} ({', '.join(folders)}) disappeared while krishiv {command} ran: nothing more was written; "
        "restore them from a backup, or start over with a new state folder "
        + runbook("A state folder removed while running")
    )


def _topmost_missing(path: Path) -> Path:
    """The highest folder above ``path`` (or ``path``) that no longer exists: what was removed."""
    while not path.parent.exists() and path.parent != path:
        path = path.parent
    return path


def _krishiv_cause(exc: BaseException) -> KrishivError | None:
    """The first Krishiv error ``exc`` was raised while handling (a failure while cleaning up hides the cause)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    found = None
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, KrishivError):
            found = current
        current = current.__context__ or current.__cause__
    return found


def _not_an_interrupted_py4j_call(record: logging.LogRecord) -> bool:
    """False for the tracebacks py4j logs (on the root logger) when Ctrl-C lands while Spark starts, before Krishiv's
    own handler is in place: PySpark's handler then calls into the JVM from inside the call in flight. The command
    says ``interrupted`` in one line instead."""
    if "py4j" not in record.pathname:
        return True
    exc = record.exc_info[1] if record.exc_info else None
    while exc is not None:
        if isinstance(exc, KeyboardInterrupt) or "reentrant call" in str(exc):
            return False
        exc = exc.__cause__ or exc.__context__
    return "KeyboardInterrupt" not in record.getMessage()


def _fail(command: str, message: str) -> None:
    err_console.print(f"[red]krishiv {command}: {escape(message)}[/]")


if __name__ == "__main__":
    sys.exit(main())
