"""The contract of the nested pipelines (``chaos.nested``) after a scenario: each table against
``chaos.nested_oracle`` (folded from the topic and the batches the ledger recorded), each difference named by the
row and the first path where it differs, then the checks every kinds scenario has (every offset staged once per
pipeline, lineage linear with each committed batch once, ``krishiv verify``, nothing left pending)."""

from __future__ import annotations

from collections.abc import Hashable
from datetime import datetime
from decimal import Decimal
from typing import Any

from chaos.checks import ContractCheck, _ledger_leftovers, compare_kinds_with_oracle, late_rows_differ
from chaos.nested import NESTED_FIELDS, NESTED_PIPELINE_NAMES
from chaos.nested_oracle import (
    UNSTATED,
    Part,
    Type,
    batches_of,
    fields_of,
    fold_events,
    fold_rejects,
    fold_upsert,
    fold_windows,
    micros,
)
from chaos.oracle import Expected, Records
from krishiv.operations import open_ledger
from krishiv_core.catalog import qualified
from krishiv_core.spec import EVENTS, UPSERT, KrishivSpec, PipelineSpec

#: At most this many rows are named per kind of difference.
NAMED = 5


def is_nested_spec(spec: KrishivSpec) -> bool:
    return bool(spec.pipelines) and all(p.name in NESTED_PIPELINE_NAMES for p in spec.pipelines)


def as_python(value: Any, t: Type) -> Any:
    """A value read back from the table in the oracle's terms: a struct a dict of its declared fields, a map a dict,
    a timestamp its epoch microseconds, a decimal a ``Decimal``."""
    if value is None:
        return None
    if t.name == "struct":
        return {f.name: as_python(value.get(f.name), f.type) for f in t.fields}
    if t.name == "list":
        assert t.element is not None
        return [as_python(v, t.element.type) for v in value]
    if t.name == "map":
        assert t.element is not None and t.key is not None
        pairs = value.items() if isinstance(value, dict) else value
        return {as_python(k, t.key): as_python(v, t.element.type) for k, v in pairs}
    if t.name == "timestamp" and isinstance(value, datetime):
        return micros(value)
    if t.name == "decimal":
        return Decimal(value)
    return value


def row_of(row: dict[str, Any], fields: tuple[Part, ...]) -> dict[str, Any]:
    return {f.name: as_python(row.get(f.name), f.type) for f in fields}


def first_difference(got: Any, want: Any, path: str = "") -> str:
    """Where two values first differ, e.g. ``items[1].price: table 1.5 != expected 1.50000001``."""
    if isinstance(got, dict) and isinstance(want, dict):
        for k in list(want) + [k for k in got if k not in want]:
            if k not in got or k not in want or got[k] != want[k]:
                if k not in got or k not in want:
                    return f"{path}[{k!r}]: table {got.get(k, '(none)')!r} != expected {want.get(k, '(none)')!r}"
                return first_difference(got[k], want[k], f"{path}.{k}" if path else str(k))
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        for n, (g, w) in enumerate(zip(got, want, strict=True)):
            if g != w:
                return first_difference(g, w, f"{path}[{n}]")
    return f"{path or '(row)'}: table {got!r} != expected {want!r}"


def differences(what: str, got: dict[Hashable, Any], want: dict[Hashable, Any]) -> list[str]:
    out = []
    missing, extra = sorted(set(want) - set(got), key=str), sorted(set(got) - set(want), key=str)
    changed = sorted((k for k in set(got) & set(want) if got[k] != want[k]), key=str)
    if missing:
        out.append(f"{what}: {len(missing)} missing, e.g. {missing[:NAMED]}")
    if extra:
        out.append(f"{what}: {len(extra)} that should not be there, e.g. {extra[:NAMED]}")
    if changed:
        named = "; ".join(f"{k}: {first_difference(got[k], want[k])}" for k in changed[:NAMED])
        out.append(f"{what}: {len(changed)} differ, e.g. {named}")
    return out


def _keyed(name: str, rows: list[dict], key) -> tuple[dict, list[str]]:
    out: dict = {}
    twice = []
    for row in rows:
        k = key(row)
        if k in out:
            twice.append(k)
        out[k] = row
    return out, [f"{name}: {len(twice)} keys held by more than one row, e.g. {twice[:NAMED]}"] if twice else []


def as_pyiceberg_reads(value: Any, t: Type) -> Any:
    """An expected value as pyiceberg 0.12 reads it back: a null list of structs as an empty list (its reader
    rebuilds such a list without the null mask, apache/iceberg-python#3833; the file holds the null, which DuckDB
    and Spark read; ``tests/outbox/test_pyiceberg_null_lists.py`` is the canary that says when this can go)."""
    if t.name == "list":
        assert t.element is not None
        if value is None:
            return [] if t.element.type.name == "struct" else None
        return [as_pyiceberg_reads(v, t.element.type) for v in value]
    if value is None:
        return None
    if t.name == "struct":
        return {f.name: as_pyiceberg_reads(value.get(f.name), f.type) for f in t.fields}
    if t.name == "map":
        assert t.element is not None
        return {k: as_pyiceberg_reads(v, t.element.type) for k, v in value.items()}
    return value


def _as_read(rows: dict[Hashable, Any], fields: tuple[Part, ...]) -> dict[Hashable, Any]:
    return {k: {f.name: as_pyiceberg_reads(row.get(f.name), f.type) for f in fields} for k, row in rows.items()}


def _scan(spec: KrishivSpec, catalog, table: str) -> list[dict]:
    return catalog.load_table(qualified(spec, table)).scan().to_arrow().to_pylist()


def _compare(
    spec: KrishivSpec, catalog, p: PipelineSpec, records: Records, keys: Records, entries, fields
) -> list[str]:
    batches = batches_of(entries, p.topic)
    v: list[str] = []
    late = {}
    if p.kind == EVENTS:
        rows, v = _keyed(p.table, _scan(spec, catalog, p.table), lambda r: (r["_kafka_partition"], r["_kafka_offset"]))
        got = {k: row_of(r, fields) for k, r in rows.items()}
        v += differences(f"{p.table} rows (partition, offset)", got, _as_read(fold_events(records, fields), fields))
    elif p.kind == UPSERT:
        (key,) = p.key
        first, _, rest = key.partition(".")
        rows, v = _keyed(p.table, _scan(spec, catalog, p.table), lambda r: r[first][rest] if rest else r[first])
        got = {k: row_of(r, fields) for k, r in rows.items()}
        assert p.version_field is not None
        want = fold_upsert(records, keys, batches, fields, key, p.version_field)
        v += differences(f"{p.table} rows by {key}", got, _as_read(want, fields))
    else:
        (group,) = p.group_by
        column = group.replace(".", "_")
        (count,) = [a.name for a in p.aggregations if a.function == "count"]
        (total,) = [a for a in p.aggregations if a.function == "sum"]
        assert p.event_time_field is not None and total.field is not None

        def window(r: dict) -> tuple:
            return (micros(r["window_start"]) // 1000, micros(r["window_end"]) // 1000, r[column])

        rows, v = _keyed(p.table, _scan(spec, catalog, p.table), window)
        got = {k: (r[count], Decimal(r[total.name])) for k, r in rows.items()}
        want, late = fold_windows(
            records,
            batches,
            fields,
            event_time=p.event_time_field,
            group=group,
            field=total.field,
            window_ms=p.window_ms,
            delay_ms=p.watermark_delay_ms,
        )
        v += differences(f"{p.table} (window start, end, {column}) -> ({count}, {total.name})", got, want)
    rejects = catalog.load_table(qualified(spec, p.rejects_table)).scan().to_arrow()
    got_rejects, twice = _keyed(
        p.rejects_table, rejects.to_pylist(), lambda r: (r["batch_id"], r["partition"], r["offset"])
    )
    want_rejects = fold_rejects(records, keys, batches, fields, p.kind)
    want_rejects.update({k: e.reason for k, e in late.items()})
    shown = {k: UNSTATED if want_rejects.get(k) == UNSTATED else r["reason"] for k, r in got_rejects.items()}
    v += twice + differences(f"{p.rejects_table} reasons (batch, partition, offset)", shown, want_rejects)
    return v + late_rows_differ(rejects, late, p.rejects_table)


def check_nested_contract(spec: KrishivSpec, latest: dict[str, int]) -> ContractCheck:
    """Every nested pipeline's tables against the oracle, plus coverage, lineage, ``krishiv verify`` and leftovers
    (the kinds' contract, :func:`chaos.checks.compare_kinds_with_oracle`, with this module's comparison)."""
    fields = fields_of(NESTED_FIELDS)

    def rows(spec: KrishivSpec, catalog: Any, p: PipelineSpec, records: Records, keys: Records, entries) -> list:
        return _compare(spec, catalog, p, records, keys, entries, fields)

    violations, events = compare_kinds_with_oracle(spec, latest, rows)
    violations += _ledger_leftovers(spec, open_ledger(spec))
    return ContractCheck(Expected(), violations, events)
