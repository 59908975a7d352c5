"""How the CLI shows its tables: within 80 columns by default, every detail with ``--wide``.

By default an id is cut to its first digits (enough to tell a table's snapshots apart; ``--wide`` shows it whole),
a table in the spec's namespace is named without it, and a batch's offsets are summed up; nothing is cut in the
middle of a word, and a name too long for the column folds onto the next line rather than losing its end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from rich import box
from rich.table import Table as RichTable

if TYPE_CHECKING:
    from krishiv.lineage import LineageRow
    from krishiv.status import PipelineStatus
    from krishiv_core.spec import KrishivSpec
    from outbox.ledger.leases import StagerLease
    from outbox.relay import TableCommitReport

#: Digits of an id shown by default (a snapshot id has 19).
ID_DIGITS = 7


def short_id(value: int | str | None, wide: bool = False) -> str:
    """``9189804…`` for ``9189804183285000154`` (all of it when ``wide``); ``-`` for none."""
    if value is None:
        return "-"
    text = str(value)
    return text if wide or len(text) <= ID_DIGITS + 1 else text[:ID_DIGITS] + "…"


def table_name(spec: KrishivSpec, qualified_name: str, wide: bool = False) -> str:
    """``orders_per_minute`` for ``krishiv.orders_per_minute`` when ``krishiv`` is the spec's namespace."""
    prefix = f"{spec.iceberg.namespace}."
    return qualified_name[len(prefix) :] if not wide and qualified_name.startswith(prefix) else qualified_name


def when(moment: datetime, wide: bool = False) -> str:
    """``11-22 17:44:40`` (UTC); the ISO timestamp when ``wide``."""
    return moment.isoformat(timespec="seconds") if wide else moment.strftime("%m-%d %H:%M:%S")


def lease_text(lease: StagerLease, spec: KrishivSpec, wide: bool = False) -> str:
    """``stager lease: krishiv run (pid 4242 on host-a), epoch 3, until 11-22 17:44:40 UTC``; ``expired`` past it."""
    from krishiv.maintenance import LEASE_PREFIX

    what = "stager lease"
    if lease.pipeline.startswith(LEASE_PREFIX):
        what = f"maintenance lease of {table_name(spec, lease.pipeline.removeprefix(LEASE_PREFIX), wide)}"
    state = "until" if lease.alive() else "expired"
    epoch = f"epoch {lease.epoch}" if lease.epoch is not None else "no epoch"
    return (
        f"{what}: {lease.holder} (pid {lease.pid} on {lease.host}), {epoch}, {state} {when(lease.expires_at, wide)} UTC"
    )


def offsets_text(offsets: Mapping[str, Mapping[str, list[int]]] | None, wide: bool = False) -> str:
    """A batch's Kafka ranges: ``3000 offsets, 4 parts``, or each ``topic p:[start, end)`` when ``wide``."""
    if not offsets:
        return ""
    if wide:
        return "; ".join(
            f"{topic} " + " ".join(f"{p}:[{s}, {e})" for p, (s, e) in sorted(parts.items(), key=lambda i: int(i[0])))
            for topic, parts in offsets.items()
        )
    ranges = [r for parts in offsets.values() for r in parts.values()]
    return f"{sum(e - s for s, e in ranges)} offsets, {len(ranges)} parts"


def compact_table(*columns: str, title: str | None = None, numeric: Iterable[str] = ()) -> RichTable:
    """A table without side borders or cell padding on the left: a column costs its width plus one space."""
    out = RichTable(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0))
    right = set(numeric)
    for c in columns:
        out.add_column(c, justify="right" if c in right else "left", overflow="fold")
    return out


def commit_table(spec: KrishivSpec, reports: Iterable[TableCommitReport], wide: bool = False) -> RichTable:
    numbers = ("committed", "already there", "empty", "rows", "p50 ms")
    out = compact_table("table", *numbers, title="commit relay", numeric=numbers)
    for r in reports:
        lat = sorted(r.commit_latencies_ms)
        out.add_row(
            table_name(spec, r.table, wide),
            str(len(r.committed)),
            str(len(r.recovered)),
            str(len(r.empty)),
            str(r.records),
            f"{lat[len(lat) // 2]:.1f}" if lat else "-",
        )
    return out


def lineage_table(title: str, rows: Iterable[LineageRow], wide: bool = False) -> RichTable:
    columns = ["snapshot", "parent", "committed (UTC)", "batch", "rows added", "offsets"]
    if wide:
        columns.insert(3, "query")
    out = compact_table(*columns, title=title, numeric=("batch", "rows added"))
    for row in rows:
        cells = [
            short_id(row.snapshot_id, wide),
            short_id(row.parent_id, wide),
            when(row.committed_at, wide),
            row.maintenance or ("-" if row.batch_id is None else str(row.batch_id)),  # a compaction is named
            str(row.added_records),
            offsets_text(row.offsets, wide),
        ]
        if wide:
            cells.insert(3, row.query_id or "-")
        out.add_row(*cells)
    return out


def lag_table(status: PipelineStatus) -> RichTable:
    numbers = ("latest", "staged", "committed", "lag")
    out = compact_table("partition", *numbers, numeric=numbers)
    for part in status.partitions:
        out.add_row(
            part.partition if part.topic is None else f"{part.topic}/{part.partition}",
            str(part.latest if part.latest is not None else "?"),
            str(part.staged),
            str(part.committed),
            str(part.lag if part.lag is not None else "?"),
        )
    return out
