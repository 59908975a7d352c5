"""Table and ledger upkeep: ``krishiv compact``, ``expire-snapshots``, ``remove-orphans`` and ``maintain`` (the
three with the spec's ``[maintenance]``), ``krishiv clean-staging`` (staged files nothing refers to) and
``krishiv ledger-compact`` (old committed entries folded into totals) and ``krishiv ledger-copy`` (the ledger moved
to another database)."""

from __future__ import annotations

import argparse

from rich.markup import escape

from krishiv.commands.common import chosen_pipelines, console
from krishiv.commands.parser import format_duration
from krishiv.operations import open_existing_ledger
from krishiv_core.spec import KrishivSpec


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
        chosen_pipelines(spec, args.pipeline),
        expire=expire,
        compact=compact,
        orphans=orphans,
        dry_run=args.dry_run,
        settings=settings,
        force=getattr(args, "force", False),
    )
    grace = format_duration(settings.orphan_grace_ms / 1000)
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


def cmd_clean_staging(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from krishiv.staging_files import clean_staging

    open_existing_ledger(spec)  # before a first run there is nothing to clean: said so, not a catalog's traceback
    grace = format_duration(args.grace)
    for p in chosen_pipelines(spec, args.pipeline):
        for c in clean_staging(spec, p, args.grace, dry_run=args.dry_run, force=args.force):
            verb = "would remove" if args.dry_run else "removed"
            console.print(
                f"{c.table}: {verb} {len(c.removed)} staged files ({c.removed_bytes} bytes) no ledger entry or "
                f"snapshot refers to; kept {c.kept} referenced and {c.young} younger than {grace}"
            )
    return 0


def cmd_ledger_compact(args: argparse.Namespace, spec: KrishivSpec) -> int:
    ledger = open_existing_ledger(spec)
    report = ledger.compact(args.retention)
    console.print(
        f"ledger {ledger.path}: {report.entries_archived} committed entries older than "
        f"{format_duration(args.retention)} folded into the archive of {report.groups} query/table pairs; "
        f"{report.entries_kept} entries kept"
    )
    return 0


def cmd_ledger_copy(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from krishiv.operations import ledger_lock_timeout_s
    from outbox.ledger import Ledger

    source = open_existing_ledger(spec)
    report = source.copy_to(Ledger(spec.ledger_location(args.to), ledger_lock_timeout_s()))
    rows = report.rows
    console.print(
        escape(
            f"copied ledger {report.source} to {report.target}: {rows['outbox']} entries, "
            f"{rows['outbox_archive']} archived query/table totals, {rows['offset_skips']} offset skips; commits "
            f"numbered on from {report.commit_seq}. The old ledger now refuses every use: point storage.ledger_path "
            "(or $KRISHIV_LEDGER_PATH) at the new one"
        )
    )
    return 0
