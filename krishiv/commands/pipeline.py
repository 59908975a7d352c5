"""Running the pipelines: ``krishiv run`` (stage each batch, then commit it), ``krishiv commit`` (phase 2 on its
own) and ``krishiv demo``; the lines a batch and a commit print, and what a failed run says when its state folder
was removed while it ran."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from krishiv.commands.common import chosen_pipelines, console, counted, err_console, fail, say, show
from krishiv.ledger_outage import LedgerOutage, run_through_ledger_outages
from krishiv.operations import (
    CommitsStopped,
    RunInterrupted,
    TablesRefused,
    commit_pipelines,
    open_existing_ledger,
    open_writable_ledger,
    run_pipelines,
)
from krishiv.query_supervisor import RunClients
from krishiv_core.runbook import runbook
from krishiv_core.spec import KrishivSpec, PipelineSpec

if TYPE_CHECKING:
    from krishiv.metrics import Metrics
    from outbox.ledger import Ledger
    from outbox.relay import TableCommitReport
    from spark_jobs.job import RunningPipeline

#: What a batch's rows are, by kind: short, so a batch's line fits 80 columns with six-digit counts.
_ROWS_NAMED = {"windowed": "windows", "events": "rows", "upsert": "keys"}


def _batch_printer(spec: KrishivSpec):
    """The run's reporter: a line per batch, and a warning line for a batch whose rejects are alarming."""
    from krishiv.reject_storms import batch_warning
    from krishiv_core.catalog import qualified

    def for_pipeline(pipeline: str):
        rejects_table = qualified(spec, spec.pipeline(pipeline).rejects_table)

        def show(b) -> None:
            again = "" if b.recorded else " (already in the ledger)"
            console.print(
                f"[bold]{escape(pipeline)}[/] batch {b.batch_id}: {b.records_read} read, {b.rows} "
                f"{_ROWS_NAMED[b.kind]}, {b.rejects} rejected, {b.late_events} late{again}"
            )
            warning = batch_warning(b, rejects_table)
            if warning:
                err_console.print(f"[yellow]warning: {escape(pipeline)} {escape(warning)}[/]")

        return show

    return for_pipeline


def _metrics(spec: KrishivSpec, ledger: Ledger, pipelines: list[PipelineSpec], port: int | None) -> Metrics:
    """The command's metrics (exported as ``--metrics-port`` and the environment ask), the endpoint announced."""
    from krishiv.metrics import start_metrics

    metrics = start_metrics(spec, ledger, pipelines=pipelines, port=port)
    if metrics.address:
        say(f"metrics on http://{metrics.address[0]}:{metrics.address[1]}/metrics")
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
    pipelines, ledger = chosen_pipelines(spec, args.pipeline), open_writable_ledger(spec)
    if not ledger.on_server:
        _LEDGER_FOLDER_MADE.append(Path(ledger.path).parent)  # from here on, its absence means it was removed
    committed: dict[str, set[int]] = {}  # table -> the batches this run's committer committed to it

    def on_commit(report: TableCommitReport) -> None:
        committed.setdefault(report.table, set()).update(report.committed)
        metrics.record_commits([report])
        console.print(escape(_commit_line(spec, report)))

    failure = None
    attempts: list[list[RunningPipeline]] = []  # a continuous run starts its queries again after a ledger outage

    def run() -> list[RunningPipeline]:
        try:
            attempts.append(
                run_pipelines(
                    spec,
                    pipelines,
                    once=args.once,
                    clients=RunClients(ledger=ledger),
                    reporter=metrics.chain(_batch_printer(spec)),
                    progress=say,
                    stop_on_signals=True,
                    commit=not args.no_commit,
                    on_commit=on_commit,
                )
            )
        except LedgerOutage as exc:
            attempts.append(exc.running)
            raise
        return attempts[-1]

    try:
        with _metrics(spec, ledger, pipelines, args.metrics_port) as metrics:
            try:
                if args.once:
                    run()
                else:
                    run_through_ledger_outages(spec.ledger_location(), run, say)
            except CommitsStopped as exc:
                attempts.append(exc.running)
                failure = str(exc)
    except RunInterrupted as exc:
        err_console.print(f"krishiv run: {escape(str(exc))}")
        return 130 if exc.signal_name == "Ctrl-C" else 143
    from krishiv_core.catalog import qualified

    for p in pipelines:
        stagers = [r.stager for attempt in attempts for r in attempt if r.stager.pipeline.name == p.name]
        history = [b for stager in stagers for b in stager.history]
        staged = [b for b in history if b.recorded]
        line = (
            f"{escape(p.name)}: {counted(len(history), 'batch')}, {len(staged)} staged, "
            f"{counted(sum(b.records_read for b in history), 'record')} read"
        )
        if not (args.once or args.no_commit):
            batches = set().union(*(committed.get(qualified(spec, t), set()) for t in p.all_tables))
            line += f", {len(batches)} committed"
        console.print(line)
    if failure is not None:
        fail("run", f"stopped committing {failure}")
        return 1
    return 0


def cmd_commit(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from krishiv.views import commit_table

    pipelines, ledger = chosen_pipelines(spec, args.pipeline), open_existing_ledger(spec)
    refused: TablesRefused | None = None
    with _metrics(spec, ledger, pipelines, args.metrics_port) as metrics:
        try:  # without --pipeline, also the pending batches of pipelines removed from the spec
            reports = commit_pipelines(spec, pipelines, ledger=ledger, removed_pipelines=args.pipeline is None)
        except TablesRefused as exc:  # every other table was committed: shown, then each refusal in a line
            refused, reports = exc, exc.reports
        metrics.record_commits(reports)
    show(commit_table(spec, reports, wide=args.wide), args.wide)
    if refused is not None:
        for line in refused.lines():
            fail("commit", line)
        return 1
    return 0


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


#: The ledger folder ``krishiv run`` made (or found) when it began: if it is missing when the run fails, the state
#: (ledger, checkpoints, catalog, warehouse) was removed while it ran.
_LEDGER_FOLDER_MADE: list[Path] = []


def _state_paths(spec: KrishivSpec) -> list[tuple[str, Path]]:
    """The local state a run made before Spark started: the ledger, the checkpoints, a SQLite catalog, a local
    warehouse."""
    paths = [("checkpoints", spec.resolve(spec.storage.checkpoint_location))]
    if not spec.ledger_on_server:
        paths.insert(0, ("ledger", Path(spec.ledger_location())))
    uri = spec.catalog_uri()
    if uri.startswith("sqlite:///") and uri != "sqlite:///:memory:":
        paths.append(("catalog", Path(uri[len("sqlite:///") :])))
    if "://" not in spec.iceberg.warehouse or spec.iceberg.warehouse.startswith("file://"):
        paths.append(("warehouse", Path(spec.warehouse_uri().removeprefix("file://"))))
    return paths


def state_removed(command: str, spec: KrishivSpec | None) -> str:
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
