"""How an output table is partitioned: the spec's ``partition_by`` list, parsed, checked and turned into Iceberg.

``partition_by = ["day(window_start)", "bucket(16, customer_id)", "truncate(4, name)", "region"]`` names Iceberg's
partition transforms in Iceberg's own syntax (a bare column is ``identity``). Each entry is checked against the
output column's type here, so a wrong one is a :class:`~krishiv_core.errors.ConfigError` naming the entry, never
a catalog error at commit time. This module must not import ``krishiv_core.spec`` (the spec imports it): columns
arrive as a mapping of name to spec type name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from krishiv_core.errors import ConfigError

if TYPE_CHECKING:
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import Transform

IDENTITY = "identity"
YEAR, MONTH, DAY, HOUR = "year", "month", "day", "hour"
BUCKET = "bucket"
TRUNCATE = "truncate"
TIME_TRANSFORMS = (YEAR, MONTH, DAY, HOUR)
TRANSFORMS = (IDENTITY, *TIME_TRANSFORMS, BUCKET, TRUNCATE)
_WITH_WIDTH = (BUCKET, TRUNCATE)

_TIMESTAMPS = ("timestamp_ms", "timestamp")
#: Which spec column types each transform applies to (Iceberg's rules, minus double and boolean partitioning:
#: a partition per floating-point value is never what one wants, and a boolean has two values, so only identity).
_APPLIES_TO: dict[str, tuple[str, ...]] = {
    IDENTITY: ("string", "long", "int", "decimal", "boolean", *_TIMESTAMPS),
    YEAR: _TIMESTAMPS,
    MONTH: _TIMESTAMPS,
    DAY: _TIMESTAMPS,
    HOUR: _TIMESTAMPS,
    BUCKET: ("string", "long", "int", "decimal", *_TIMESTAMPS),
    TRUNCATE: ("string", "long", "int", "decimal"),
}

#: The first partition field id, as Iceberg assigns them.
FIRST_PARTITION_FIELD_ID = 1000

_COLUMN = r"[A-Za-z_][A-Za-z0-9_]*"
#: A column, or a field inside struct columns by its dotted path (``meta.ts``), as Iceberg names a nested source.
_PATH = rf"{_COLUMN}(?:\.{_COLUMN})*"
_BARE = re.compile(rf"^\s*(?P<column>{_PATH})\s*$")
_CALL = re.compile(rf"^\s*(?P<transform>{_COLUMN})\s*\(\s*(?:(?P<width>[^,()]*?)\s*,\s*)?(?P<column>[^,()]*?)\s*\)\s*$")
_EXAMPLES = '"customer_id", "day(ts)", "bucket(16, customer_id)" or "truncate(4, name)"'


@dataclass(frozen=True)
class PartitionField:
    """One partition transform of one output column, or of a field inside struct columns named by its dotted path
    (``meta.ts``); ``width`` is the bucket count or the truncation width."""

    column: str
    transform: str
    width: int | None = None

    def __str__(self) -> str:
        if self.transform == IDENTITY:
            return self.column
        if self.width is not None:
            return f"{self.transform}({self.width}, {self.column})"
        return f"{self.transform}({self.column})"

    @property
    def name(self) -> str:
        """The partition field's name, as Iceberg names it by default: ``ts_day``, ``id_bucket``, ``name_trunc``; a
        nested source keeps its path (``meta.ts_day``), as Iceberg's Java and Python builders name it."""
        if self.transform == IDENTITY:
            return self.column
        if self.transform == TRUNCATE:
            return f"{self.column}_trunc"
        return f"{self.column}_{self.transform}"

    def iceberg_transform(self) -> Transform[Any, Any]:
        from pyiceberg.transforms import (
            BucketTransform,
            DayTransform,
            HourTransform,
            IdentityTransform,
            MonthTransform,
            TruncateTransform,
            YearTransform,
        )

        if self.transform == BUCKET:
            assert self.width is not None
            return BucketTransform(self.width)
        if self.transform == TRUNCATE:
            assert self.width is not None
            return TruncateTransform(self.width)
        return {
            IDENTITY: IdentityTransform,
            YEAR: YearTransform,
            MONTH: MonthTransform,
            DAY: DayTransform,
            HOUR: HourTransform,
        }[self.transform]()


def _type_name(spec_type: str) -> str:
    """``decimal(10,2)`` and ``decimal`` are both ``decimal``."""
    return spec_type.split("(", 1)[0].strip()


def _parse_one(raw: Any, field_name: str, columns: Mapping[str, str]) -> PartitionField:
    if not isinstance(raw, str):
        raise ConfigError(field_name, f"expected a string such as {_EXAMPLES}, got {raw!r}")
    bare = _BARE.match(raw)
    call = None if bare else _CALL.match(raw)
    if bare:
        transform, width_text, column = IDENTITY, None, bare["column"]
    elif call:
        transform, width_text, column = call["transform"].lower(), call["width"], call["column"]
    else:
        raise ConfigError(field_name, f"expected a column or transform(column), such as {_EXAMPLES}; got {raw!r}")
    if transform not in TRANSFORMS:
        raise ConfigError(
            field_name, f"unknown transform {transform!r} in {raw!r}; expected one of {', '.join(TRANSFORMS)}"
        )
    width: int | None = None
    if transform in _WITH_WIDTH:
        what = "number of buckets" if transform == BUCKET else "width"
        if width_text is None:
            raise ConfigError(field_name, f"{transform} needs a {what}: {transform}(N, column), got {raw!r}")
        try:
            width = int(width_text)
        except ValueError:
            width = None
        if width is None or width <= 0:
            raise ConfigError(field_name, f"the {what} of {transform} must be a positive integer, got {raw!r}")
    elif width_text is not None:
        raise ConfigError(field_name, f"{transform} takes only a column: {transform}(column), got {raw!r}")
    if not re.fullmatch(_PATH, column):
        raise ConfigError(field_name, f"expected a column name in {raw!r}, got {column!r}")
    if column not in columns:
        parts = column.split(".")
        for through in (".".join(parts[:end]) for end in range(1, len(parts))):
            if columns.get(through) in ("list", "map"):
                raise ConfigError(
                    field_name,
                    f"{column!r} in {raw!r} goes through {through}, a {columns[through]}: a path can name a field "
                    "inside a struct, not inside a list or map",
                )
        raise ConfigError(
            field_name, f"unknown column {column!r} in {raw!r}; the table's columns are {', '.join(columns)}"
        )
    type_name = _type_name(columns[column])
    if type_name not in _APPLIES_TO[transform]:
        raise ConfigError(
            field_name,
            f"{raw!r}: column {column!r} is {columns[column]}, and {transform} applies only to "
            f"{' or '.join(_APPLIES_TO[transform])} columns",
        )
    return PartitionField(column, transform, width)


def parse_partition_by(raw: Any, where: str, columns: Mapping[str, str]) -> tuple[PartitionField, ...]:
    """The partition fields of a spec's ``partition_by`` list (``where`` is its field name in messages).

    ``columns`` maps each output column to its spec type name (``string``, ``long``, ``int``, ``double``,
    ``boolean``, ``timestamp_ms``, ``timestamp``, ``decimal`` or ``decimal(p,s)``).
    """
    if raw is None:
        return ()
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise ConfigError(where, f"expected a list of strings such as [{_EXAMPLES}], got {raw!r}")
    fields: list[PartitionField] = []
    for i, item in enumerate(raw):
        field_name = f"{where}[{i}]"
        field = _parse_one(item, field_name, columns)
        for j, earlier in enumerate(fields):
            if (earlier.column, earlier.transform) == (field.column, field.transform):
                raise ConfigError(
                    field_name, f"{item!r} repeats {where}[{j}] ({earlier}): one {field.transform} per column"
                )
            if (
                earlier.transform in TIME_TRANSFORMS
                and field.transform in TIME_TRANSFORMS
                and earlier.column == field.column
            ):
                raise ConfigError(
                    field_name,
                    f"{item!r} and {where}[{j}] ({earlier}) both partition {field.column!r} by time; "
                    "Iceberg allows one of year, month, day and hour per column",
                )
        if field.transform != IDENTITY and field.name in columns:
            raise ConfigError(
                field_name,
                f"{item!r} would be named {field.name!r}, which is also an output column; rename that column",
            )
        fields.append(field)
    return tuple(fields)


def partition_spec(schema: Schema, fields: Sequence[PartitionField]) -> PartitionSpec:
    """The Iceberg partition spec of ``fields`` over ``schema``: field ids from 1000 up, unpartitioned if empty."""
    from pyiceberg.partitioning import PartitionField as IcebergPartitionField
    from pyiceberg.partitioning import PartitionSpec

    return PartitionSpec(
        *(
            IcebergPartitionField(
                source_id=schema.find_field(f.column).field_id,
                field_id=FIRST_PARTITION_FIELD_ID + pos,
                transform=f.iceberg_transform(),
                name=f.name,
            )
            for pos, f in enumerate(fields)
        )
    )


def describe_spec(spec: PartitionSpec, schema: Schema) -> str:
    """A partition spec in the ``partition_by`` syntax: ``[day(ts), bucket(16, id)]``, or ``unpartitioned``."""
    shown = [str(from_iceberg(f, schema)) for f in spec.fields if str(f.transform) != "void"]
    return f"[{', '.join(shown)}]" if shown else "unpartitioned"


def from_iceberg(field: Any, schema: Schema) -> PartitionField:
    """The :class:`PartitionField` of an Iceberg partition field (its source column named as in ``schema``)."""
    text = str(field.transform)  # identity, day, bucket[16], truncate[4]
    transform, _, rest = text.partition("[")
    width = int(rest.rstrip("]")) if rest else None
    return PartitionField(schema.find_column_name(field.source_id) or f"<field {field.source_id}>", transform, width)
