"""Looking without changing: ``krishiv status`` (the outbox, events and lag of each pipeline), ``krishiv lineage``
(the snapshots of its tables), ``krishiv verify`` (the exactly-once invariants) and ``krishiv check`` (what a run
checks before Spark starts)."""

from __future__ import annotations

import argparse
import contextlib

from rich.markup import escape

from krishiv.commands.common import chosen_pipelines, console, counted, err_console, fail, show
from krishiv.operations import open_existing_ledger, removed_pipelines_pending, verify_pipelines
from krishiv_core.errors import BrokerUnavailable
from krishiv_core.runbook import runbook
from krishiv_core.spec import KrishivSpec


def cmd_status(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from datetime import UTC, datetime

    from krishiv.json_output import reject_rate_document, status_document, status_pipeline
    from krishiv.preflight import check_broker
    from krishiv.reject_storms import pipeline_warning
    from krishiv.status import (
        DEFAULT_PENDING_AGE_S,
        PENDING_AGE_ENV,
        BrokerSide,
        pipeline_status,
        read_broker_side,
        status_warnings,
    )
    from krishiv.views import lag_table, lease_text, short_id, table_name, when
    from krishiv_core.catalog import BATCH_COMMITS_SAID, multi_table_commits_at, qualified
    from krishiv_core.entries import MERGE
    from krishiv_core.env_settings import seconds_from_env
    from krishiv_core.reject_rate import reject_rate_warn
    from krishiv_core.tables import output_tables
    from spark_jobs.errors import KafkaSourceError

    warn_above = reject_rate_warn()
    ledger = open_existing_ledger(spec)
    try:
        check_broker(spec)  # quietly, in seconds: the ledger's side is shown either way, the lag only if it answers
        broker_down = None
    except BrokerUnavailable as exc:
        broker_down = str(exc)
    batch_commits = multi_table_commits_at(spec.catalog_uri())
    if not args.json:
        console.print(f"commits: {BATCH_COMMITS_SAID[batch_commits]}")  # the catalog's address is in `krishiv check`
    documents: list[dict] = []
    topics_unread = 0  # pipelines whose topic the broker could not describe (missing, say): exit 1 as for the broker
    for p in chosen_pipelines(spec, args.pipeline):
        latest, broker_error = None, broker_down
        side = BrokerSide()
        of_topics: dict[str, dict[str, int] | None] | None = None
        if p.members:  # every topic's lag; a topic Debezium has not made yet has none
            of_topics = {t: None for t in p.topics}
            for t in p.topics if broker_down is None else ():
                with contextlib.suppress(KafkaSourceError):
                    of_topics[t] = read_broker_side(spec, t)[0]
        elif broker_down is None:
            try:
                latest, side = read_broker_side(spec, p.topic)
            except KafkaSourceError as exc:
                broker_error = str(exc)
                topics_unread += 1
        merged = {qualified(spec, o.name) for o in output_tables(p) if o.operation.kind == MERGE}
        names = [qualified(spec, t) for t in p.all_tables]  # the first table's entries carry the batch counts
        names += [t for t in ledger.pending_tables([p.name]) if t not in names]  # a route removed with batches pending
        s = pipeline_status(
            ledger, p.name, names[0], p.topic, latest, broker_error, other_tables=names[1:], topics=of_topics
        )
        warnings = status_warnings(
            s,
            side,
            ledger.newest_topic_id(names[0]),
            ledger.pending_batches(names, pipeline=p.name),
            next((lease for lease in s.leases if lease.pipeline == p.name), None),  # read by pipeline_status
            datetime.now(UTC),
            seconds_from_env(PENDING_AGE_ENV, DEFAULT_PENDING_AGE_S),
        )
        recent = ledger.recent_rejects(names[0], pipeline=p.name)  # a reject storm: most of what it reads
        storm = pipeline_warning(recent, warn_above, qualified(spec, p.rejects_table))
        warnings += [storm] if storm else []
        # change events waiting for the rest of their source transactions (a pipeline over several topics)
        held = ledger.newest_metrics(names[0], p.name).get("held_events", 0) if p.transaction_topic else None
        if args.json:
            rates = {"recent_rejects": reject_rate_document(recent, warn_above)}
            waiting = {} if held is None else {"held_events": held}
            pattern = {} if p.topic_pattern is None else {"topic_pattern": p.topic_pattern}
            document = status_pipeline(s, p.kind, p.topics, merged) | pattern | {"warnings": warnings}
            documents.append(document | rates | waiting)
            continue
        for line in warnings:
            err_console.print(f"[yellow]warning: {escape(p.name)}: {escape(line)}[/]")
        matching = f" (matching {p.topic_pattern})" if p.topic_pattern is not None else ""
        console.print(
            f"[bold]{escape(p.name)}[/] ({p.kind}) reads {escape(', '.join(p.topics) + matching)} into "
            f"{len(names)} tables"
        )
        console.print(f"  events: {s.records_read} read, {s.rejects} rejected, {s.late_events} late")
        if held:
            console.print(
                f"  waiting: {counted(held, 'change event')} of source transactions not yet whole, staged with the "
                f"batch that completes them {escape(runbook('A source transaction that waits'))}"
            )
        if s.late_batches:  # the recent batches' late events, kept beside the rejects
            rejects_table = escape(table_name(spec, qualified(spec, p.rejects_table), args.wide))
            counts = ", ".join(f"batch {b}: {n}" for b, n in s.late_batches)
            console.print(
                f"  late events by batch, kept in {rejects_table} (reason late: …): {counts} "
                f"{escape(runbook('Late events'))}"
            )
        for t in s.tables:
            console.print(
                f"  {escape(table_name(spec, t.table, args.wide))}: {t.pending} pending, {t.committed} committed, "
                f"{counted(t.rows_staged, 'row')} {'merged' if t.table in merged else 'appended'}"
            )
            if t.last_commit_at is None:
                console.print("    no commit yet")
            else:
                snapshot = (
                    f" (snapshot {short_id(t.last_snapshot_id, args.wide)})" if t.last_snapshot_id is not None else ""
                )
                console.print(f"    last commit {when(t.last_commit_at, args.wide)} UTC{snapshot}")
        for lease in s.leases:  # who runs it, or maintains its tables, and the fencing token
            console.print(f"  {escape(lease_text(lease, spec, args.wide))}")
        if broker_error and broker_error != broker_down:
            err_console.print(f"  [red]broker: {escape(broker_error)}[/]")
        show(lag_table(s), args.wide)
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
        print(status_document(documents, removed, broker_down, batch_commits))
        return 1 if broker_down or topics_unread else 0
    if broker_down:
        fail("status", f"{broker_down}; lag unknown")
        return 1
    return 1 if topics_unread else 0


def cmd_lineage(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from krishiv.inputs import load_table
    from krishiv.lineage import lineage
    from krishiv.views import lineage_table, table_name
    from krishiv_core.catalog import load_catalog, qualified, redact

    open_existing_ledger(spec)  # a ledger path with a typo is named, as in status, verify and commit
    catalog = load_catalog(spec)
    address = redact(spec.catalog_uri())
    found = []
    for p in chosen_pipelines(spec, args.pipeline):
        for name in p.all_tables:  # the row tables (each route of a fan-out), then the rejects table
            table = load_table(catalog, qualified(spec, name), address)
            if args.json:
                found.append((qualified(spec, name), lineage(table)))
                continue
            title = f"lineage of {table_name(spec, qualified(spec, name), args.wide)} (newest last)"
            show(lineage_table(escape(title), lineage(table), wide=args.wide), args.wide)
    if args.json:
        from krishiv.json_output import lineage_document

        print(lineage_document(found))
    return 0


def cmd_cut(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from krishiv.cut import Cut, cut_at, default_cut
    from krishiv.inputs import load_table
    from krishiv.views import short_id, table_name
    from krishiv_core.catalog import load_catalog, qualified, redact

    ledger = open_existing_ledger(spec)
    catalog = load_catalog(spec)
    address = redact(spec.catalog_uri())
    cuts = []
    for p in chosen_pipelines(spec, args.pipeline):
        current = default_cut(ledger, p.name, qualified(spec, p.all_tables[0]))
        if current is None:
            cuts.append(Cut(p.name, None, None, []))
            continue
        query, batch = current[0], current[1] if args.batch is None else args.batch
        if batch > current[1]:
            fail("cut", f"{p.name}: batch {batch} is not committed to every table yet (the newest is {current[1]})")
            return 1
        tables = {qualified(spec, t): load_table(catalog, qualified(spec, t), address) for t in p.all_tables}
        cuts.append(Cut(p.name, query, batch, cut_at(tables, ledger, query, batch)))
    if args.json:
        from krishiv.json_output import cut_document

        print(cut_document(cuts))
        return 0
    for c in cuts:
        if c.batch_id is None:
            console.print(f"[bold]{escape(c.pipeline)}[/]: no batch committed yet")
            continue
        console.print(
            f"[bold]{escape(c.pipeline)}[/] as of batch {c.batch_id} (query {short_id(c.query_id, args.wide)})"
        )
        for t in c.tables:
            name = escape(table_name(spec, t.table, args.wide))
            if t.snapshot_id is not None:
                console.print(f"  {name}: snapshot {t.snapshot_id} (batch {t.batch_id})")
            elif t.expired:
                console.print(f"  {name}: its snapshot of batch {t.batch_id} has expired; no time travel to this cut")
            else:
                console.print(f"  {name}: no rows of this query up to batch {c.batch_id}")
    return 0


def cmd_verify(args: argparse.Namespace, spec: KrishivSpec) -> int:
    results = verify_pipelines(spec, chosen_pipelines(spec, args.pipeline), ledger=open_existing_ledger(spec))
    if args.json:
        from krishiv.json_output import verify_document

        print(verify_document(results))
        return 0 if all(r.ok for r in results) else 1
    for r in results:
        mark = "[green]ok[/]" if r.ok else "[red]VIOLATIONS[/]"
        read = "" if r.records_read is None else f"; its batches read {counted(r.records_read, 'record')}"
        rejected = "" if r.rejects is None else f", rejected {r.rejects:,}"
        console.print(
            f"{escape(r.table)}: {mark} ({counted(r.rows, 'row')}, {counted(r.snapshots, 'snapshot')}{read}{rejected})"
        )
        console.print(f"  unique by {', '.join(r.key)}" if r.key else "  no per-row key")
        for v in r.violations:
            console.print(f"  - {escape(v)}")
        for w in r.warnings:  # not a violation: the exit status stays the tables'
            console.print(f"  [yellow]warning: {escape(w)}[/]")
    return 0 if all(r.ok for r in results) else 1


def cmd_check(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from krishiv.check import check_pipelines

    findings = check_pipelines(spec, chosen_pipelines(spec, args.pipeline))
    ok = all(f.ok for f in findings)
    if args.json:
        from krishiv.json_output import check_document

        print(check_document(findings))
        return 0 if ok else 1
    for f in findings:
        mark = "[green]ok[/]  " if f.ok else "[red]FAIL[/]"
        console.print(f"{mark} {escape(f.pipeline)}: {escape(f.check)}: {escape(f.detail)}")
    return 0 if ok else 1
