"""The contract, checked after every scenario; each breach is a named violation, never an exception.

- the table equals the oracle's windows (no loss, no duplicate, closed windows only);
- the rejects table holds each malformed event once, and late events are counted per batch as expected;
- every produced offset is staged exactly once (ranges chain from the pinned start to the topic's end, moving
  only where an operator's recorded skip moved them: a re-created topic's records are checked against a copy
  of the old topic's);
- lineage is linear with one snapshot per batch, and the ledger agrees with the table (``krishiv verify``);
- nothing is left PENDING, and no staged file of a PENDING or COMMITTED entry was deleted.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from chaos.oracle import Expected, Records, expected_output, read_topic
from krishiv.lineage import lineage
from krishiv.operations import open_ledger, verify_pipelines
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.entries import PENDING, OffsetSkip, OutboxEntry
from krishiv_core.spec import KrishivSpec
from outbox.ledger import Ledger
from spark_jobs.checkpoint import Checkpoint


@dataclass
class ContractCheck:
    expected: Expected
    violations: list[str] = field(default_factory=list)

    @property
    def events_checked(self) -> int:
        return self.expected.valid_events + len(self.expected.rejects)


def _applied_skips(ledger: Ledger, entries: list[OutboxEntry], topic: str) -> list[OffsetSkip]:
    """The operators' skips the entries' queries applied (``krishiv skip-offsets``), in batch order."""
    skips = [s for q in sorted({e.query_id for e in entries}) for s in ledger.skips(q, topic)]
    return sorted((s for s in skips if s.applied_batch_id is not None), key=lambda s: s.applied_batch_id or 0)


def _generation_starts(skips: list[OffsetSkip]) -> list[int]:
    """The batches that moved onto a new generation of the topic: the ones that applied a skip backwards."""
    return sorted({s.applied_batch_id for s in skips if s.applied_batch_id is not None and s.to_offset < s.from_offset})


def _coverage(spec: KrishivSpec, ledger: Ledger, latest: dict[str, int]) -> list[str]:
    """Each partition's ranges, in batch order, chain from the pinned start to ``latest``; a recorded skip applied
    by a batch moves the chain from where the partition stood to the operator's offset."""
    pipeline = spec.pipeline()
    problems = []
    start = Checkpoint(spec.checkpoint_dir(pipeline)).starting_offsets() or {}
    entries = sorted(ledger.entries(table=qualified(spec, pipeline.table)), key=lambda e: e.batch_id)
    skips = _applied_skips(ledger, entries, pipeline.topic)
    for partition, end in sorted(latest.items(), key=lambda kv: int(kv[0])):
        moves = {s.applied_batch_id: s for s in skips if s.partition == partition}
        position = start.get(partition, 0)
        for e in entries:
            skip = moves.pop(e.batch_id, None)
            if skip is not None:
                if skip.from_offset != position:
                    problems.append(
                        f"partition {partition}: batch {e.batch_id} applied the skip from offset {skip.from_offset}, "
                        f"but the partition stood at {position}"
                    )
                position = skip.to_offset
            lo, hi = e.offsets.get(pipeline.topic, {}).get(partition, (position, position))
            if hi <= lo:
                continue
            if lo != position:
                what = "staged twice" if lo < position else "never staged"
                problems.append(f"partition {partition}: offsets [{min(lo, position)}, {max(lo, position)}) {what}")
            position = max(position, hi)
        problems += [
            f"partition {partition}: the skip from {s.from_offset} to {s.to_offset} names batch {b}, which the "
            "ledger does not hold"
            for b, s in moves.items()
        ]
        if position != end:
            problems.append(f"partition {partition}: staged up to {position}, the topic ends at {end}")
    return problems


def compare_with_oracle(spec: KrishivSpec, earlier: Sequence[Records] = ()) -> ContractCheck:
    """The tables against the oracle over the ledger's batches: windows, rejects, late counts, ``verify``
    and one snapshot per batch in a linear lineage (for the spec's first pipeline).

    ``earlier`` holds the records of the topic's former generations (deleted and re-created), oldest first: the
    batches before each backward skip an operator recorded read those.
    """
    pipeline = spec.pipeline()
    ledger = open_ledger(spec)
    entries = ledger.entries(table=qualified(spec, pipeline.table))
    starts = _generation_starts(_applied_skips(ledger, entries, pipeline.topic))
    problems = []
    if len(starts) != len(earlier):
        problems.append(
            f"the topic had {len(earlier) + 1} generations, but the ledger holds backward skips applied by batches "
            f"{starts}; the batches' records cannot be told apart"
        )
        starts, earlier = [], []
    current_from = starts[-1] if starts else 0
    ends: dict[int, int] = {}
    for e in entries:
        if e.batch_id >= current_from:
            for p, (_lo, hi) in e.offsets[pipeline.topic].items():
                ends[int(p)] = max(ends.get(int(p), 0), hi)
    records = read_topic(spec.kafka.bootstrap_servers, pipeline.topic, spec.kafka.partitions, ends)
    expected = expected_output(
        records,
        entries,
        pipeline.topic,
        pipeline.window_ms,
        pipeline.watermark_delay_ms,
        list(zip(starts, earlier, strict=True)),
    )
    result = ContractCheck(expected, problems)
    try:
        _compare_tables(spec, load_catalog(spec), entries, expected, result.violations)
    except Exception as exc:  # a table that cannot be read back is a violation; the others still count
        result.violations.append(f"the tables could not be read back: {exc!r}")
    return result


def check_contract(spec: KrishivSpec, latest: dict[str, int], earlier: Sequence[Records] = ()) -> ContractCheck:
    """The whole contract after a scenario: the oracle comparison, plus every offset up to ``latest`` staged
    once, nothing left pending and no staged file gone (``earlier``: see :func:`compare_with_oracle`)."""
    result = compare_with_oracle(spec, earlier)
    v = result.violations
    ledger = open_ledger(spec)
    v += _coverage(spec, ledger, latest)
    pending = [e for e in ledger.entries() if e.status == PENDING]
    if pending:
        v.append(f"{len(pending)} entries still PENDING: {[(e.table, e.batch_id) for e in pending][:10]}")
    io = load_catalog(spec).load_table(qualified(spec, spec.pipeline().table)).io
    for e in ledger.entries():
        v += [
            f"staged file {f.path} of {e.table} batch {e.batch_id} ({e.status}) was deleted"
            for f in e.files
            if not io.new_input(f.path).exists()
        ]
    return result


def _compare_tables(spec: KrishivSpec, catalog, entries: list, expected: Expected, v: list[str]) -> None:
    pipeline = spec.pipeline()
    table_name = qualified(spec, pipeline.table)
    actual: dict[int, dict[str, object]] = {}
    for row in catalog.load_table(table_name).scan().to_arrow().to_pylist():
        start = int(row.pop("window_start").timestamp() * 1000)
        row.pop("window_end")
        if start in actual:
            v.append(f"window {start} appears twice")
        actual[start] = {k: (Decimal(x) if isinstance(x, Decimal) else x) for k, x in row.items()}
    for start in sorted(set(expected.windows) - set(actual)):
        v.append(f"window {start} is missing (expected {expected.windows[start]})")
    for start in sorted(set(actual) - set(expected.windows)):
        v.append(f"window {start} should not be there (open, or from nowhere): {actual[start]}")
    for start in sorted(set(actual) & set(expected.windows)):
        if actual[start] != expected.windows[start]:
            v.append(f"window {start}: table {actual[start]} != expected {expected.windows[start]}")

    rejects = catalog.load_table(qualified(spec, pipeline.rejects_table)).scan().to_arrow()
    coords = list(
        zip(
            rejects.column("batch_id").to_pylist(),
            rejects.column("partition").to_pylist(),
            rejects.column("offset").to_pylist(),
            strict=True,
        )
    )
    if len(coords) != len(set(coords)):
        v.append(f"{len(coords) - len(set(coords))} malformed events are in the rejects table more than once")
    if set(coords) != expected.rejects:
        v.append(
            f"rejects differ: missing {sorted(expected.rejects - set(coords))[:10]}, "
            f"extra {sorted(set(coords) - expected.rejects)[:10]}"
        )
    late = {e.batch_id: e.metrics.get("late_events") for e in entries}
    if late != expected.late_by_batch:
        v.append(f"late events per batch {late} != expected {expected.late_by_batch}")

    for verification in verify_pipelines(spec, [pipeline]):
        v += [f"{verification.table}: {problem}" for problem in verification.violations]
    for name in (pipeline.table, pipeline.rejects_table):
        rows = lineage(catalog.load_table(qualified(spec, name)))
        batches = [r.batch_id for r in rows if r.batch_id is not None]
        if batches != sorted(set(batches)):
            v.append(f"{name}: batches {batches} are not one snapshot each, in order")
        v += [
            f"{name}: snapshot {after.snapshot_id} has parent {after.parent_id}, not {before.snapshot_id}"
            for before, after in itertools.pairwise(rows)
            if after.parent_id != before.snapshot_id
        ]
