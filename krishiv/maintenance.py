"""Table maintenance of the pipelines' tables: compaction, then snapshot expiry, then orphan-file removal.

The order matters: compaction makes a ``replace`` snapshot that leaves the small files to the snapshots before
it; expiry then lets those snapshots go; orphan removal finally deletes what no retained snapshot (nor a PENDING
ledger entry) refers to, once past the grace period. Each step is ``outbox``'s (``compaction``, ``expiry``,
``orphans``); this module picks the tables, the settings (``[maintenance]``, options override) and the lease.

Each table is maintained under a lease of its own in the ledger (``maintenance:<table>``, the stager lease table
keyed by that name), so two maintenance runs (a schedule and a command, say) do not work on one table at once;
a table another run holds is skipped and said so. Beside the stager and the relay no lease is needed: expiry and
compaction conflict like any other writer and retry, and orphan removal reads the ledger and the table after
listing (see ``outbox.orphans``). A dry run takes no lease and changes nothing.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from krishiv_core.spec import KrishivSpec, MaintenanceSettings, PipelineSpec

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

    from outbox.compaction import CompactionReport
    from outbox.expiry import ExpiryReport
    from outbox.ledger import Ledger
    from outbox.orphans import OrphanReport

LEASE_PREFIX = "maintenance:"


@dataclass
class TableMaintenance:
    table: str
    compaction: CompactionReport | None = None
    expiry: ExpiryReport | None = None
    orphans: OrphanReport | None = None
    skipped: str | None = None  # why nothing was done to the table
    dry_run: bool = False


def maintenance_lease_name(table: str) -> str:
    return LEASE_PREFIX + table


def maintain_pipelines(
    spec: KrishivSpec,
    pipelines: list[PipelineSpec],
    *,
    expire: bool = True,
    compact: bool = True,
    orphans: bool = True,
    dry_run: bool = False,
    settings: MaintenanceSettings | None = None,
    force: bool = False,
    catalog: Catalog | None = None,
    ledger: Ledger | None = None,
    run_id: str | None = None,
    holder: str = "krishiv maintain",
) -> list[TableMaintenance]:
    """Compact, expire and remove orphans (each if asked) in every table of ``pipelines``, with ``settings``
    (default: the spec's ``[maintenance]``). ``force`` allows an orphan grace below the floor. A table not
    created yet, or held by another maintenance run, is skipped with the reason."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    from krishiv.operations import open_existing_ledger
    from krishiv_core.catalog import load_catalog, qualified
    from outbox.errors import StagerBusy
    from outbox.lease import stager_lease
    from outbox.orphans import check_grace

    settings = settings or spec.maintenance
    if orphans:
        check_grace(settings.orphan_grace_ms / 1000, force=force)  # before any table is touched
    ledger = open_existing_ledger(spec) if ledger is None else ledger
    catalog = load_catalog(spec) if catalog is None else catalog
    run_id = run_id or uuid.uuid4().hex
    results = []
    for pipeline, name in [(p.name, qualified(spec, t)) for p in pipelines for t in p.all_tables]:
        result = TableMaintenance(name, dry_run=dry_run)
        results.append(result)
        try:
            catalog.load_table(name)
        except (NoSuchTableError, NoSuchNamespaceError):
            result.skipped = "no such table yet (krishiv run makes it)"
            continue
        steps = dict(expire=expire, compact=compact, orphans=orphans)
        if dry_run:
            _maintain(catalog, ledger, pipeline, result, settings, steps, dry_run=True, force=force, run_id=run_id)
            continue
        try:
            with stager_lease(ledger, maintenance_lease_name(name), holder):
                _maintain(catalog, ledger, pipeline, result, settings, steps, dry_run=False, force=force, run_id=run_id)
        except StagerBusy as exc:
            result.skipped = f"another maintenance run holds it ({exc})"
    return results


def _maintain(
    catalog: Catalog,
    ledger: Ledger,
    pipeline: str,
    result: TableMaintenance,
    settings: MaintenanceSettings,
    steps: dict[str, bool],
    *,
    dry_run: bool,
    force: bool,
    run_id: str,
) -> None:
    from outbox.compaction import compact_table
    from outbox.expiry import expire_snapshots
    from outbox.orphans import in_flight_files, remove_orphans

    name = result.table

    def load():
        return catalog.load_table(name)

    if steps["compact"]:
        result.compaction = compact_table(
            load(),
            target_file_size=settings.target_file_size,
            min_files=settings.min_files,
            dry_run=dry_run,
            run_id=run_id,
        )
    if steps["expire"]:
        result.expiry = expire_snapshots(
            load, keep_last=settings.keep_last, keep_younger_than_ms=settings.keep_younger_than_ms, dry_run=dry_run
        )
    if steps["orphans"]:
        result.orphans = remove_orphans(
            load,
            lambda: [f.path for e in ledger.pending(name) for f in e.files],
            grace_s=settings.orphan_grace_ms / 1000,
            dry_run=dry_run,
            force=force,
            in_flight=lambda: in_flight_files(ledger, pipeline, name),  # a live stager's batch in progress stays
        )


# ------------------------------------------------------------------------------------------ reporting


def size_text(size: int) -> str:
    """Bytes as a person reads them: ``812 B``, ``3.4 KiB``, ``128.0 MiB``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def describe(result: TableMaintenance, grace: str, name: str | None = None) -> list[str]:
    """One short line per step, for the table shown as ``name`` (default: its qualified name); with the short
    name (``krishiv.views.table_name``) a line fits 80 columns for tables of up to ~25 characters."""
    name = name or result.table
    if result.skipped:
        return [f"{name}: skipped: {result.skipped}"]
    would = result.dry_run
    lines = []
    if (c := result.compaction) is not None:
        if c.files_rewritten and would:
            lines.append(
                f"{name}: would rewrite {c.files_rewritten} files ({size_text(c.bytes_rewritten)}) "
                f"in {c.groups} partitions"
            )
        elif c.files_rewritten:
            lines.append(
                f"{name}: rewrote {c.files_rewritten} files ({size_text(c.bytes_rewritten)}) -> "
                f"{c.files_written} ({size_text(c.bytes_written)})"
            )
        else:
            refused = [s for s in c.skipped if "delete files" in s]  # equality deletes: compaction cannot fold them
            lines.append(f"{name}: not compacted: {refused[0]}" if refused else f"{name}: nothing to compact")
    if (e := result.expiry) is not None:
        lines.append(f"{name}: {'would expire' if would else 'expired'} {len(e.expired)} snapshots, kept {e.kept}")
    if (o := result.orphans) is not None:
        lines.append(
            f"{name}: {'would remove' if would else 'removed'} {len(o.removed)} orphans "
            f"({size_text(o.removed_bytes)}); {o.referenced} in use, {o.young} < {grace}"
        )
    return lines
