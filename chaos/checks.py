"""The contract, checked after every scenario; each breach is a named violation, never an exception.

- the table equals the oracle's windows (no loss, no duplicate, closed windows only);
- the rejects table holds each malformed and each late event once (a late one with its value and the reason
  naming its window and the watermark), and late events are counted per batch as expected;
- every produced offset is staged exactly once (ranges chain from the pinned start to the topic's end, moving
  only where an operator's recorded skip moved them: a re-created topic's records are checked against a copy
  of the old topic's);
- lineage is linear with one snapshot per batch, and the ledger agrees with the table (``krishiv verify``);
- nothing is left PENDING, and no staged file of a PENDING entry, nor one a retained snapshot reads, was deleted.

Both stay right across table maintenance (``krishiv maintain``, or another tool): expiry removes the snapshots of
old batches, compaction adds ``replace`` snapshots that name no batch, and orphan removal may then delete the
staged files of COMMITTED entries no retained snapshot reads. So the surviving batch snapshots must be an ordered
subsequence of the committed batches (none twice, none the ledger does not hold COMMITTED), and a committed batch
without its snapshot must be at or below its query's high-water mark in the table's properties.

A spec of the newer kinds (the kinds scenarios' three pipelines on one topic) is checked per kind instead
(:func:`check_kinds_contract`), against ``chaos.kinds_oracle``: each table's rows, each rejects table, no row key
twice, every offset staged once per pipeline, lineage linear with every committed batch in its table once (or
expired at or below the high-water mark), and ``krishiv verify``'s ledger agreement.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlparse

from chaos.kinds_oracle import (
    expected_events,
    expected_grouped_late,
    expected_grouped_windows,
    expected_rejects,
    expected_upsert,
    order,
)
from chaos.oracle import Expected, LateEvent, Records, expected_output, read_topic
from krishiv.lineage import lineage
from krishiv.operations import open_ledger, verify_pipelines
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.entries import COMMITTED, PENDING, OffsetSkip, OutboxEntry
from krishiv_core.spec import EVENTS, UPSERT, WINDOWED, KrishivSpec, PipelineSpec
from outbox.ledger import Ledger
from outbox.relay import high_water_marks
from spark_jobs.checkpoint import Checkpoint


@dataclass
class ContractCheck:
    expected: Expected
    violations: list[str] = field(default_factory=list)
    events: int | None = None  # records checked, when not counted by ``expected`` (the kinds check)

    @property
    def events_checked(self) -> int:
        if self.events is not None:
            return self.events
        return self.expected.valid_events + len(self.expected.rejects)


def _applied_skips(ledger: Ledger, entries: list[OutboxEntry], topic: str) -> list[OffsetSkip]:
    """The operators' skips the entries' queries applied (``krishiv skip-offsets``), in batch order."""
    skips = [s for q in sorted({e.query_id for e in entries}) for s in ledger.skips(q, topic)]
    return sorted((s for s in skips if s.applied_batch_id is not None), key=lambda s: s.applied_batch_id or 0)


def _generation_starts(skips: list[OffsetSkip]) -> list[int]:
    """The batches that moved onto a new generation of the topic: the ones that applied a skip backwards."""
    return sorted({s.applied_batch_id for s in skips if s.applied_batch_id is not None and s.to_offset < s.from_offset})


def _coverage(
    spec: KrishivSpec,
    ledger: Ledger,
    latest: dict[str, int],
    pipeline: PipelineSpec | None = None,
    table: str | None = None,
) -> list[str]:
    """Each partition's ranges, in batch order, chain from the pinned start to ``latest``; a recorded skip applied
    by a batch moves the chain from where the partition stood to the operator's offset. For ``pipeline`` (the
    spec's first by default), by the entries of its ``table`` (its own table by default)."""
    pipeline = pipeline or spec.pipeline()
    problems = []
    start = Checkpoint(spec.checkpoint_dir(pipeline)).starting_offsets() or {}
    entries = sorted(ledger.entries(table=qualified(spec, table or pipeline.table)), key=lambda e: e.batch_id)
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


def _local(path: str) -> str:
    """A file's path as the local filesystem names it (a ``file:`` URI or a plain path alike)."""
    return urlparse(path).path if path.startswith("file:") else path


def live_files(table) -> set[str]:
    """Every file a retained snapshot of ``table`` reads (live entries of its manifests: added or existing), local
    paths: a staged file outside this set may be gone once its entry is COMMITTED (expired or compacted away, then
    removed as an orphan)."""
    out: set[str] = set()
    for snapshot in table.snapshots():
        for manifest in snapshot.manifests(table.io):
            out |= {_local(e.data_file.file_path) for e in manifest.fetch_manifest_entry(table.io)}
    return out


def _ledger_leftovers(spec: KrishivSpec, ledger: Ledger) -> list[str]:
    """Entries still PENDING; staged files of PENDING entries that are gone; and staged files of COMMITTED entries
    that are gone while a retained snapshot of their table still reads them."""
    entries = ledger.entries()
    pending = [e for e in entries if e.status == PENDING]
    shown = [(e.table, e.batch_id) for e in pending][:10]
    found = [f"{len(pending)} entries still PENDING: {shown}"] if pending else []
    catalog = load_catalog(spec)
    io = catalog.load_table(qualified(spec, spec.pipeline().rejects_table)).io
    read: dict[str, set[str]] = {}  # per table, the files its retained snapshots read (when one is needed)
    for e in entries:
        for f in e.files:
            if io.new_input(f.path).exists():
                continue
            if e.status == COMMITTED:
                if e.table not in read:
                    read[e.table] = live_files(catalog.load_table(e.table))
                if _local(f.path) not in read[e.table]:
                    continue  # its snapshots expired or it was compacted away; then removed as an orphan
            found.append(f"staged file {f.path} of {e.table} batch {e.batch_id} ({e.status}) was deleted")
    return found


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
    once, nothing left pending and no staged file gone (``earlier``: see :func:`compare_with_oracle`). A spec of
    the newer kinds is checked per kind (:func:`check_kinds_contract`), the nested pipelines' by
    ``chaos.nested_checks``."""
    from chaos.nested_checks import check_nested_contract, is_nested_spec  # it builds on this module

    if is_nested_spec(spec):
        return check_nested_contract(spec, latest)
    if is_kinds_spec(spec):
        if earlier:
            raise ValueError("the kinds check reads one topic generation")
        return check_kinds_contract(spec, latest)
    result = compare_with_oracle(spec, earlier)
    v = result.violations
    ledger = open_ledger(spec)
    v += _coverage(spec, ledger, latest)
    v += _ledger_leftovers(spec, ledger)
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
        v.append(f"{len(coords) - len(set(coords))} events are in the rejects table more than once")
    want = expected.rejects | set(expected.late)
    if set(coords) != want:
        v.append(
            f"rejects (malformed and late) differ: missing {sorted(want - set(coords))[:10]}, "
            f"extra {sorted(set(coords) - want)[:10]}"
        )
    v += late_rows_differ(rejects, expected.late, "rejects table")
    late = {e.batch_id: e.metrics.get("late_events") for e in entries}
    if late != expected.late_by_batch:
        v.append(f"late events per batch {late} != expected {expected.late_by_batch}")

    for verification in verify_pipelines(spec, [pipeline]):
        v += [f"{verification.table}: {problem}" for problem in verification.violations]
    ledger = open_ledger(spec)
    for name in (pipeline.table, pipeline.rejects_table):
        v += _batches_once(spec, catalog, ledger, name)


def late_rows_differ(rejects, late: dict[tuple[int, int, int], LateEvent], name: str) -> list[str]:
    """Each late event's row of the rejects table carries its reason and its Kafka value; a malformed record's
    reason is never a late one."""
    got = {}
    for row in rejects.select(["batch_id", "partition", "offset", "reason", "value"]).to_pylist():
        coords = (row["batch_id"], row["partition"], row["offset"])
        if coords in late or str(row["reason"]).startswith("late:"):
            got[coords] = LateEvent(row["reason"], row["value"])
    wrong = sorted(k for k, row in got.items() if late.get(k) != row)
    if not wrong:
        return []
    return [f"{name}: {len(wrong)} late rows differ, e.g. (row, expected) {[(got[k], late.get(k)) for k in wrong[:3]]}"]


# ------------------------------------------------------------------------------------------- the newer kinds

#: At most this many keys are named per kind of difference (the rest are counted).
NAMED = 10


def is_kinds_spec(spec: KrishivSpec) -> bool:
    """Whether the spec is not the one windowed pipeline the oracle of :func:`compare_with_oracle` models."""
    return len(spec.pipelines) > 1 or spec.pipeline().kind != WINDOWED


def _differences(what: str, got: dict, want: dict) -> list[str]:
    """Missing, extra and different keys of two maps, a few of each named."""
    out = []
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    changed = sorted(k for k in set(got) & set(want) if got[k] != want[k])
    if missing:
        out.append(f"{what}: {len(missing)} missing, e.g. {[(k, want[k]) for k in missing[:NAMED]]}")
    if extra:
        out.append(f"{what}: {len(extra)} that should not be there, e.g. {[(k, got[k]) for k in extra[:NAMED]]}")
    if changed:
        out.append(
            f"{what}: {len(changed)} differ (table, expected), e.g. {[(k, got[k], want[k]) for k in changed[:NAMED]]}"
        )
    return out


def _keyed(name: str, rows: list[dict], key) -> tuple[dict, list[str]]:
    """``rows`` by ``key(row)`` -> row, and a violation for each key more than one row holds."""
    out: dict = {}
    repeated: dict = {}
    for row in rows:
        k = key(row)
        if k in out:
            repeated[k] = repeated.get(k, 1) + 1
        out[k] = row
    problems = [f"{name}: {len(repeated)} row keys are held by more than one row, e.g. {sorted(repeated)[:NAMED]}"]
    return out, problems if repeated else []


def _ms(value: datetime) -> int:
    """Epoch milliseconds of a timestamp read back (a naive one is UTC: Iceberg's ``timestamp``)."""
    return int((value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp() * 1000)


def _events_rows(spec: KrishivSpec, catalog, p: PipelineSpec, records: Records, keys: Records) -> list[str]:
    """Every valid event once, in the table of its route (or the default table), as the record holds it."""
    v = []
    expected = expected_events(records, p)
    for name in p.tables:
        rows = catalog.load_table(qualified(spec, name)).scan().to_arrow().to_pylist()
        got, repeated = _keyed(name, rows, lambda r: (r["_kafka_partition"], r["_kafka_offset"]))
        v += repeated
        want = {}
        for coords in expected.rows[name]:
            o = order(records, *coords)
            assert o is not None
            want[coords] = (o.order_id, o.customer_id, o.amount, o.event_time, keys.get(coords))
        shown = {
            k: (r["order_id"], r["customer_id"], r["amount"], _ms(r["event_time"]), r["_kafka_key"])
            for k, r in got.items()
        }
        v += _differences(f"{name} events (partition, offset)", shown, want)
        topics = {r["_kafka_topic"] for r in rows}
        if topics - {p.topic}:
            v.append(f"{name}: rows name topics {sorted(topics)}, expected only {p.topic}")
    return v


def _upsert_rows(spec: KrishivSpec, catalog, p: PipelineSpec, records: Records, keys: Records, entries) -> list[str]:
    """Each key's order by the upsert rule of docs/spec.md (``fold_upserts``): the latest version since its last
    tombstone."""
    want = {
        k: (o.order_id, o.amount, o.event_time) for k, o in expected_upsert(records, keys, entries, p.topic).items()
    }
    rows = catalog.load_table(qualified(spec, p.table)).scan().to_arrow().to_pylist()
    got, repeated = _keyed(p.table, rows, lambda r: tuple(r[c] for c in p.key))
    shown = {k[0]: (r["order_id"], r["amount"], _ms(r["event_time"])) for k, r in got.items()}
    return repeated + _differences(f"{p.table} keys", shown, want)


def _windowed_rows(spec: KrishivSpec, catalog, p: PipelineSpec, records: Records, entries) -> list[str]:
    """Per (window, group) of the hopping grid, the aggregates of every event that was not late (update mode)."""
    want = expected_grouped_windows(records, entries, p)
    rows = catalog.load_table(qualified(spec, p.table)).scan().to_arrow().to_pylist()
    got, repeated = _keyed(
        p.table, rows, lambda r: (_ms(r["window_start"]), _ms(r["window_end"]), *(r[g] for g in p.group_by))
    )
    shown = {k: (r["orders"], r["amount_total"]) for k, r in got.items()}
    return repeated + _differences(f"{p.table} (window start, end, group)", shown, want)


def _rejects_rows(spec: KrishivSpec, catalog, p: PipelineSpec, records: Records, keys: Records, entries) -> list[str]:
    rows = catalog.load_table(qualified(spec, p.rejects_table)).scan().to_arrow()
    coords = list(
        zip(
            rows.column("batch_id").to_pylist(),
            rows.column("partition").to_pylist(),
            rows.column("offset").to_pylist(),
            strict=True,
        )
    )
    v = []
    if len(coords) != len(set(coords)):
        v.append(f"{p.rejects_table}: {len(coords) - len(set(coords))} rejects are there more than once")
    want = expected_rejects(records, keys, entries, p)
    if set(coords) != want:
        v.append(
            f"{p.rejects_table}: rejects (batch, partition, offset) differ: "
            f"missing {sorted(want - set(coords))[:NAMED]}, extra {sorted(set(coords) - want)[:NAMED]}"
        )
    late = expected_grouped_late(records, entries, p) if p.kind == WINDOWED else {}
    return v + late_rows_differ(rows, late, p.rejects_table)


def _batches_once(spec: KrishivSpec, catalog, ledger: Ledger, name: str) -> list[str]:
    """Lineage linear, each batch in at most one snapshot, in batch order, and only batches the ledger holds as
    COMMITTED with something to publish; every such batch has its snapshot or, its snapshot expired, is at or
    below its query's high-water mark in the table's properties (moved with each commit, so it survives expiry,
    and compaction's ``replace`` snapshots, which name no batch, leave it as it was)."""
    qualified_name = qualified(spec, name)
    table = catalog.load_table(qualified_name)
    rows = lineage(table)
    v = [
        f"{name}: snapshot {after.snapshot_id} has parent {after.parent_id}, not {before.snapshot_id}"
        for before, after in itertools.pairwise(rows)
        if after.parent_id != before.snapshot_id
    ]
    snapshots: dict[tuple[str | None, int], list[int]] = {}
    for r in rows:
        if r.batch_id is not None:
            snapshots.setdefault((r.query_id, r.batch_id), []).append(r.snapshot_id)
    v += [
        f"{name}: batch {batch} of query {query} is in {len(ids)} snapshots {ids}"
        for (query, batch), ids in snapshots.items()
        if len(ids) > 1
    ]
    order = [(r.query_id, r.batch_id) for r in rows if r.batch_id is not None]
    for query in {q for q, _ in order}:
        batches = [b for q, b in order if q == query]
        if batches != sorted(set(batches)):
            v.append(f"{name}: the snapshots of query {query} hold batches {batches}, not rising one snapshot each")
    committed = {
        (e.query_id, e.batch_id)
        for e in ledger.entries(table=qualified_name, status=COMMITTED)
        if not e.changes_nothing
    }
    foreign = sorted((b, str(q)) for q, b in snapshots if (q, b) not in committed)
    if foreign:
        v.append(f"{name}: snapshots of batches {foreign} (batch, query), which the ledger does not hold as COMMITTED")
    marks = high_water_marks(table)
    missing = sorted((b, q) for q, b in committed if (q, b) not in snapshots and b > marks.get(q, -1))
    if missing:
        v.append(
            f"{name}: committed batches {missing} (batch, query) have no snapshot and are above their query's "
            f"high-water mark in the table's properties {marks}"
        )
    return v


def _kinds_rows(spec: KrishivSpec, catalog: Any, p: PipelineSpec, records: Records, keys: Records, entries) -> list:
    """One pipeline's tables (rows, then rejects) against ``chaos.kinds_oracle``."""
    if p.kind == EVENTS:
        v = _events_rows(spec, catalog, p, records, keys)
    elif p.kind == UPSERT:
        v = _upsert_rows(spec, catalog, p, records, keys, entries)
    else:
        v = _windowed_rows(spec, catalog, p, records, entries)
    return v + _rejects_rows(spec, catalog, p, records, keys, entries)


def compare_kinds_with_oracle(
    spec: KrishivSpec, latest: dict[str, int], rows: Callable[..., list[str]] = _kinds_rows
) -> tuple[list[str], int]:
    """Each pipeline's tables against an oracle over the topic up to ``latest`` and the batches its ledger entries
    recorded (``rows(spec, catalog, pipeline, records, keys, entries)``: ``chaos.kinds_oracle``'s by default), its
    batches once each, its offsets covered and ``krishiv verify``, each violation prefixed with the pipeline and its
    kind; and how many records were checked (each by every pipeline)."""
    topic = spec.pipelines[0].topic
    if any(p.topic != topic for p in spec.pipelines):
        raise ValueError("the kinds check reads one topic")
    keys: Records = {}
    ends = {int(p): o for p, o in latest.items()}
    records = read_topic(spec.kafka.bootstrap_servers, topic, spec.kafka.partitions, ends, keys)
    ledger, catalog = open_ledger(spec), load_catalog(spec)
    violations = []
    for p in spec.pipelines:
        v = []
        try:
            entries = ledger.entries(table=qualified(spec, p.rejects_table))  # one per batch, whatever its rows
            v += rows(spec, catalog, p, records, keys, entries)
            for name in p.all_tables:
                v += _batches_once(spec, catalog, ledger, name)
        except Exception as exc:  # a table that cannot be read back is a violation; the others still count
            v.append(f"the tables could not be read back: {exc!r}")
        v += _coverage(spec, ledger, latest, p, p.rejects_table)
        violations += [f"{p.name} ({p.kind}): {problem}" for problem in v]
    try:
        for verification in verify_pipelines(spec, list(spec.pipelines), catalog=catalog, ledger=ledger):
            violations += [f"{verification.table}: {problem}" for problem in verification.violations]
    except Exception as exc:
        violations.append(f"krishiv verify could not run: {exc!r}")
    return violations, len(records) * len(spec.pipelines)


def check_kinds_contract(spec: KrishivSpec, latest: dict[str, int]) -> ContractCheck:
    """The contract for a spec of the newer kinds: :func:`compare_kinds_with_oracle`, nothing left pending and no
    staged file of a pending or committed entry gone."""
    violations, events = compare_kinds_with_oracle(spec, latest)
    ledger = open_ledger(spec)
    violations += _ledger_leftovers(spec, ledger)
    return ContractCheck(Expected(), violations, events)
