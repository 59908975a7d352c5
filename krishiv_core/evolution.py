"""Bringing an existing output table to the schema and partitioning the spec now asks for, or refusing to.

Columns are matched by name, never by id (the spec's schema numbers its columns afresh each time). The changes
made are the ones every reader of the table can follow and that lose nothing:

* a column the spec adds becomes a new optional column (Iceberg cannot add a required column to a table with
  rows; Krishiv remembers such a column in the table property :data:`RELAXED_PROPERTY`, so the spec calling it
  required later is not mistaken for an optional -> required change);
* a type Iceberg may widen is widened: int -> long, float -> double, decimal(P,S) -> decimal(P2,S) with P2 > P;
* a required column the spec makes optional, or no longer has, becomes optional (new rows may then leave it out);
* a column the spec no longer has is kept, never dropped: its old values stay readable.

The same rules hold inside nested columns, matched by name at every depth (a struct's fields, a list's element, a
map's value, so also a struct inside a list or map): a field added inside a struct is added there, optional; a
nested type is widened; a nested part is made optional; a nested field the spec no longer has is kept, optional.
pyiceberg's UpdateSchema takes each by its path (``("gps", "alt")``). A map's key never changes, and a part that
changes kind (a struct becoming a scalar, a list a map) is a conflict, named by its dotted path (``gps.lat``,
``readings.element.value``, ``attrs.value``).

Anything else (string -> long, long -> int, a decimal's scale, optional -> required…) raises
:class:`SchemaConflict` naming the table, the column, both types and what is allowed, and changes nothing.
All schema changes of one call are one metadata commit.

Partitioning is evolved too (:func:`evolve_partitioning`), not refused: Iceberg keeps each data file under the
partition spec it was written with and scans plan every spec, so changing ``partition_by`` is a metadata-only
change that rewrites nothing. Partition fields the spec dropped are removed, new ones added, and fields both have
keep their ids; an order-only difference is no change. A new field whose default name is taken (pyiceberg cannot
reuse a removed field's name in the same update, as in ``bucket(16, c)`` -> ``bucket(8, c)``) gets pyiceberg's
generated name, ``c_bucket_8``. Whatever pyiceberg still refuses (day(ts) beside a field another engine named
``ts_day``, say) raises :class:`SchemaConflict` naming the table and both partitionings, and changes
nothing. Staged files wait in the outbox across such a change: the relay registers each under the table's
current spec from the values its rows hold (``outbox.data_files``), and refuses a file whose rows span several
partitions of the new spec rather than registering it under a wrong value.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.exceptions import ValidationError
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StructType,
)

from krishiv_core.errors import SchemaConflict
from krishiv_core.partitioning import IDENTITY, PartitionField, describe_spec, from_iceberg
from krishiv_core.runbook import runbook

#: Field ids of the columns Krishiv added as optional although the spec declared them required.
RELAXED_PROPERTY = "krishiv.optional-by-evolution"

ALLOWED_CHANGES = (
    "Krishiv evolves a table only by adding optional columns, widening int to long, float to double and "
    "decimal(P,S) to a larger precision with the same scale, and making a required column optional; it never "
    "drops a column"
)


def widens(table_type: IcebergType, spec_type: IcebergType) -> bool:
    """Whether Iceberg may promote ``table_type`` to ``spec_type`` (a true widening, not equality)."""
    if isinstance(table_type, IntegerType) and isinstance(spec_type, LongType):
        return True
    if isinstance(table_type, FloatType) and isinstance(spec_type, DoubleType):
        return True
    return (
        isinstance(table_type, DecimalType)
        and isinstance(spec_type, DecimalType)
        and spec_type.scale == table_type.scale
        and spec_type.precision > table_type.precision
    )


@dataclass
class SchemaChanges:
    """What :func:`schema_changes` found to do; empty when the table already fits the spec.

    Each change names its column by its Iceberg path: a top-level column's name, or the dotted path of a part of a
    nested column (``gps.alt``, ``readings.element.value``, ``attrs.value``); an added field is a NestedField so
    named.
    """

    add: list[NestedField] = field(default_factory=list)
    widen: list[tuple[str, IcebergType]] = field(default_factory=list)
    make_optional: list[str] = field(default_factory=list)
    relax: list[str] = field(default_factory=list)  # added optional though the spec requires them

    def __bool__(self) -> bool:
        return bool(self.add or self.widen or self.make_optional)


def _relaxed_ids(table: Table) -> set[int]:
    raw = table.properties.get(RELAXED_PROPERTY, "")
    return {int(part) for part in raw.split(",") if part.strip()}


def _conflict(table_name: str, column: str, detail: str) -> SchemaConflict:
    return SchemaConflict(
        f"table {table_name}: column {column!r} {detail}; nothing was changed. {ALLOWED_CHANGES}: set the field back, "
        f"or start over in a new table under a new pipeline name {runbook('A spec change the table cannot take')}"
    )


@dataclass
class _Comparison:
    """One walk of the table's columns beside the spec's, at every depth (structs by field name; a list's element
    and a map's key and value as the parts named ``element``, ``key`` and ``value``)."""

    table_name: str
    identifiers: set[int]
    relaxed_ids: Collection[int]
    changes: SchemaChanges = field(default_factory=SchemaChanges)

    def fields(self, prefix: str, have: Sequence[NestedField], wanted: Sequence[NestedField]) -> None:
        by_name = {f.name: f for f in have}
        for spec_field in wanted:
            path = prefix + spec_field.name
            existing = by_name.get(spec_field.name)
            if existing is None:
                self.changes.add.append(
                    NestedField(spec_field.field_id, path, spec_field.field_type, spec_field.required, spec_field.doc)
                )
                if spec_field.required:
                    self.changes.relax.append(path)
            else:
                self.field(path, existing, spec_field)
        wanted_names = {f.name for f in wanted}
        for existing in have:
            if existing.name not in wanted_names and existing.required:  # kept, and new rows will not have it
                if existing.field_id in self.identifiers:
                    raise _conflict(
                        self.table_name,
                        prefix + existing.name,
                        "is a required identifier field of the table, and the spec no longer has it",
                    )
                self.changes.make_optional.append(prefix + existing.name)

    def field(self, path: str, have: NestedField, wanted: NestedField) -> None:
        self.type(path, have.field_type, wanted.field_type)
        if have.required and not wanted.required:
            if have.field_id in self.identifiers:
                raise _conflict(
                    self.table_name,
                    path,
                    "is an identifier field of the table, so it must stay required, and the spec makes it optional",
                )
            self.changes.make_optional.append(path)
        elif wanted.required and not have.required and have.field_id not in self.relaxed_ids:
            raise _conflict(
                self.table_name, path, "is optional in the table and required in the spec (optional -> required)"
            )

    def type(self, path: str, have: IcebergType, wanted: IcebergType) -> None:
        if isinstance(have, StructType) and isinstance(wanted, StructType):
            self.fields(path + ".", have.fields, wanted.fields)
        elif isinstance(have, ListType) and isinstance(wanted, ListType):
            self.field(f"{path}.element", have.element_field, wanted.element_field)
        elif isinstance(have, MapType) and isinstance(wanted, MapType):
            if have.key_type != wanted.key_type:  # Iceberg changes no map key, widened or not
                raise _conflict(
                    self.table_name,
                    f"{path}.key",
                    f"is {have.key_type} in the table and {wanted.key_type} in the spec (a map's key cannot change)",
                )
            self.field(f"{path}.value", have.value_field, wanted.value_field)
        elif have.is_primitive and wanted.is_primitive and (have == wanted or widens(have, wanted)):
            if have != wanted:
                self.changes.widen.append((path, wanted))
        else:
            raise _conflict(self.table_name, path, f"is {_shown(have)} in the table and {_shown(wanted)} in the spec")


def _shown(t: IcebergType) -> str:
    """A type without the field ids Iceberg's own text puts in nested types (they differ between table and spec)."""
    if isinstance(t, StructType):
        return (
            "struct<"
            + ", ".join(f"{f.name}: {_shown(f.field_type)}{'' if f.required else '?'}" for f in t.fields)
            + ">"
        )
    if isinstance(t, ListType):
        return f"list<{_shown(t.element_type)}{'' if t.element_required else '?'}>"
    if isinstance(t, MapType):
        return f"map<{_shown(t.key_type)}, {_shown(t.value_type)}{'' if t.value_required else '?'}>"
    return str(t)


def schema_changes(
    table_name: str, current: Schema, wanted: Schema, relaxed_ids: Collection[int] = frozenset()
) -> SchemaChanges:
    """The changes that bring ``current`` to ``wanted`` (matched by column name, at every depth), or
    SchemaConflict naming the column's path."""
    identifiers = set(current.identifier_field_ids)
    have_key = sorted(current.find_column_name(i) or str(i) for i in identifiers)
    want_key = sorted(wanted.find_column_name(i) or str(i) for i in wanted.identifier_field_ids)
    if have_key != want_key:
        raise SchemaConflict(
            f"table {table_name}: its rows are keyed by ({', '.join(map(repr, have_key)) or 'nothing'}) and the spec "
            f"keys them by ({', '.join(map(repr, want_key)) or 'nothing'}) (an upsert's key, or a window's group_by); "
            "a table's key cannot change, so nothing was changed: set it back, or start over in a new table under a "
            f"new pipeline name {runbook('A spec change the table cannot take')}"
        )
    comparison = _Comparison(table_name, identifiers, relaxed_ids)
    comparison.fields("", current.fields, wanted.fields)
    return comparison.changes


def _stage_changes(tx: Any, table: Table, changes: SchemaChanges) -> None:
    """Stage ``changes`` in the transaction ``tx`` (one schema update, and the relaxed columns' property).

    A column the spec no longer has is made optional and remembered as relaxed too, so that putting the field back
    as required (a reverted spec) is not taken for an optional -> required change.
    """
    with tx.update_schema() as update:
        for f in changes.add:  # a nested field's name is its dotted path: a tuple path for pyiceberg
            update.add_column(tuple(f.name.split(".")), f.field_type, doc=f.doc, required=False)
        for name, field_type in changes.widen:
            update.update_column(tuple(name.split(".")), field_type=field_type)
        for name in changes.make_optional:
            update.make_column_optional(tuple(name.split(".")))
    if changes.relax or changes.make_optional:
        schema = tx.table_metadata.schema()
        relaxed = _relaxed_ids(table) | {
            schema.find_field(name).field_id for name in (*changes.relax, *changes.make_optional)
        }
        tx.set_properties({RELAXED_PROPERTY: ",".join(str(i) for i in sorted(relaxed))})


def table_changes(table: Table, wanted: Schema, table_name: str) -> SchemaChanges:
    """The changes that bring ``table`` to ``wanted``, its relaxed columns considered; or SchemaConflict."""
    return schema_changes(table_name, table.schema(), wanted, _relaxed_ids(table))


def planned_schema(table: Table, wanted: Schema, table_name: str) -> Schema:
    """The schema :func:`evolve_schema` would give ``table`` (with the field ids it would assign), computed in a
    transaction that is never committed: the table is not changed. Raises SchemaConflict as evolve_schema does."""
    changes = table_changes(table, wanted, table_name)
    if not changes:
        return table.schema()
    tx = table.transaction()  # never committed
    _stage_changes(tx, table, changes)
    return tx.table_metadata.schema()


def evolve_schema(table: Table, wanted: Schema, table_name: str, properties: Mapping[str, str] | None = None) -> Table:
    """Apply :func:`schema_changes` to ``table``, and set ``properties`` it lacks or holds otherwise, in one
    metadata commit; returns the table (unchanged if nothing to do).

    A concurrent change surfaces as pyiceberg's ``CommitFailedException``: reload the table and call again.
    """
    changes = schema_changes(table_name, table.schema(), wanted, _relaxed_ids(table))
    changed = {k: v for k, v in (properties or {}).items() if table.properties.get(k) != v}
    if not changes and not changed:
        return table
    with table.transaction() as tx:
        if changes:
            _stage_changes(tx, table, changes)
        if changed:
            tx.set_properties(changed)
    return table


def _columns(schema: Schema) -> set[tuple[int, str, str, bool]]:
    return {(f.field_id, f.name, str(f.field_type), f.required) for f in schema.fields}


def holds_schema_of(schema: Schema, staged_for: Schema) -> bool:
    """Whether ``schema`` has every column of ``staged_for`` as it is there: same id, name, type and optionality
    (the columns files staged for ``staged_for`` carry)."""
    return _columns(staged_for) <= _columns(schema)


def holds_schema(table: Table, staged_for: Schema) -> bool:
    """:func:`holds_schema_of` the table's current schema."""
    return holds_schema_of(table.schema(), staged_for)


@dataclass(frozen=True)
class SchemaChange:
    """The schema change a batch's files need, as its ledger entry records it: the spec's schema (what
    :func:`evolve_schema` is asked for, so the change is the one phase 1 makes, relaxed columns remembered), the
    schema the files were staged for (:func:`planned_schema`'s, with the field ids they carry) and the ``krishiv.*``
    properties set in the same metadata commit."""

    spec: Schema
    staged: Schema
    properties: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "spec": json.loads(self.spec.model_dump_json()),
                "staged": json.loads(self.staged.model_dump_json()),
                "properties": dict(self.properties),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> SchemaChange:
        doc = json.loads(text)
        return cls(Schema.model_validate(doc["spec"]), Schema.model_validate(doc["staged"]), doc.get("properties", {}))


def bring_to_staged_schema(table: Table, change: SchemaChange, table_name: str, what: str) -> Table:
    """Make ``change`` on ``table`` (one metadata commit) unless the table holds the staged schema already; raises
    :class:`SchemaConflict` naming ``what`` (the batch) if the table then still lacks a column as staged (another
    writer changed the schema meanwhile, so the ids the files carry now name other columns). A concurrent commit
    raises pyiceberg's CommitFailedException."""
    if holds_schema(table, change.staged):
        return table
    evolve_schema(table, change.spec, table_name, change.properties)
    have = table.schema()
    lacking = _columns(change.staged) - _columns(have)
    for f in change.staged.fields:
        if (f.field_id, f.name, str(f.field_type), f.required) in lacking:
            shown = have.find_column_name(f.field_id)
            raise SchemaConflict(
                f"table {table_name}'s schema was changed by another writer after {what} was staged for it: the "
                f"files' column {f.name!r} ({f.field_type}, id {f.field_id}) is "
                + (f"{shown!r} in the table now" if shown else "not in the table")
                + "; the batch stays pending until the table's column is back as it was "
                + runbook("A spec change the table cannot take")
            )
    return table


def _current_partitioning(table: Table) -> dict[PartitionField, Any]:
    schema = table.schema()
    return {from_iceberg(f, schema): f for f in table.spec().fields if str(f.transform) != "void"}


def partitioning_differs(table: Table, partition_by: Sequence[PartitionField]) -> bool:
    """Whether ``partition_by`` would change the table's partitioning (the order of fields aside)."""
    return set(_current_partitioning(table)) != set(partition_by)


def evolve_partitioning(table: Table, partition_by: Sequence[PartitionField], table_name: str) -> Table:
    """Bring the table's partition spec to ``partition_by`` with one ``update_spec()`` commit (see the module's
    docstring), or raise SchemaConflict naming both partitionings; returns the table.

    A concurrent change surfaces as pyiceberg's ``CommitFailedException``: reload the table and call again.
    """
    schema, spec = table.schema(), table.spec()
    current = _current_partitioning(table)
    wanted = list(dict.fromkeys(partition_by))
    if set(current) == set(wanted):
        return table
    removed = [f for p, f in current.items() if p not in wanted]
    added = [p for p in wanted if p not in current]
    # Names pyiceberg would refuse for a new field: a removed or kept field's (Iceberg cannot reuse one in the
    # update that removes it) and a column's (unless identity of that column); pyiceberg then names it
    # ``column_bucket_8``, ``column_trunc_4``, as Iceberg's own spec evolution does.
    taken = {f.name for f in spec.fields} | {f.name for f in schema.fields}
    try:
        with table.update_spec() as update:
            for f in removed:
                update.remove_field(f.name)
            for p in added:
                clash = p.name in taken and not (p.transform == IDENTITY and p.name == p.column)
                update.add_field(p.column, p.iceberg_transform(), None if clash else p.name)
    except (ValueError, ValidationError) as exc:
        shown = "[" + ", ".join(str(p) for p in wanted) + "]" if wanted else "unpartitioned"
        raise SchemaConflict(
            f"table {table_name} is partitioned by {describe_spec(spec, schema)} and the spec asks for {shown}, "
            f"which pyiceberg cannot evolve the table to ({exc}); nothing was changed: set partition_by back, change "
            "it with an engine that can (Spark's ALTER TABLE … PARTITION FIELD), or start over in a new table under a "
            f"new pipeline name {runbook('A spec change the table cannot take')}"
        ) from exc
    return table
