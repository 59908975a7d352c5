"""A pipeline's event fields and their declared types (shared by the spec and the schemas read from a registry).

A type is a scalar (``string``, ``long``, ``decimal(p,s)``…), ``json`` (any JSON value, kept as its canonical
text), or nested: a ``struct`` of named fields, a ``list`` of elements, a ``map`` of keys to values, each part
itself any type and each field, element or value required or not (docs/spec.md, "Nested fields").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

STRUCT = "struct"
LIST = "list"
MAP = "map"
JSON_TEXT = "json"
NESTED = (STRUCT, LIST, MAP)
#: The part names of a list's element and a map's key and value, as Iceberg and Parquet name them.
ELEMENT, KEY, VALUE = "element", "key", "value"


@dataclass(frozen=True)
class FieldType:
    """A field's declared type: a scalar name, a decimal with precision and scale, or a nested type.

    ``fields`` are a struct's; ``element`` is a list's element or a map's value (an :class:`EventField` named
    ``element`` or ``value``, so that it says whether it may be null); ``key`` is a map's key type (never null).
    """

    name: str
    precision: int = 0
    scale: int = 0
    fields: tuple[EventField, ...] = ()
    element: EventField | None = None
    key: FieldType | None = None

    @property
    def is_decimal(self) -> bool:
        return self.name == "decimal"

    @property
    def is_numeric(self) -> bool:
        return self.name in ("long", "int", "double", "decimal")

    @property
    def is_nested(self) -> bool:
        return self.name in NESTED

    @property
    def is_scalar(self) -> bool:
        """A single value a key, a group or a partition can be made of (not nested, not ``json``)."""
        return self.name not in NESTED and self.name != JSON_TEXT

    def __str__(self) -> str:
        if self.is_decimal:
            return f"decimal({self.precision},{self.scale})"
        if self.name == STRUCT:
            return "struct<" + ", ".join(f"{f.name}: {f.shown_type}" for f in self.fields) + ">"
        if self.name == LIST:
            assert self.element is not None
            return f"list<{self.element.shown_type}>"
        if self.name == MAP:
            assert self.element is not None
            return f"map<{self.key}, {self.element.shown_type}>"
        return self.name

    def declaration(self) -> Any:
        """The type as the spec writes it: a scalar's name, else a table (parsed back by ``parse_field_type``)."""
        if self.name == STRUCT:
            return {"type": STRUCT, "fields": {f.name: f.declaration() for f in self.fields}}
        if self.name == LIST:
            assert self.element is not None
            return {"type": LIST, ELEMENT: self.element.declaration()}
        if self.name == MAP:
            assert self.element is not None and self.key is not None
            return {"type": MAP, KEY: self.key.declaration(), VALUE: self.element.declaration()}
        return str(self)


@dataclass(frozen=True)
class EventField:
    name: str
    type: FieldType
    required: bool = True

    @property
    def shown_type(self) -> str:
        """The type, with ``?`` after a part that may be null (inside a nested type's text)."""
        return f"{self.type}" + ("" if self.required else "?")

    def declaration(self) -> Any:
        """The field's declaration as the spec writes it (``required = false`` only where it is optional)."""
        decl = self.type.declaration()
        if self.required:
            return decl
        return {**(decl if isinstance(decl, dict) else {"type": decl}), "required": False}


@dataclass(frozen=True)
class FieldPath:
    """A field reached by a dotted path through structs (``meta.ts``): the field, and whether every struct on the
    way and the field itself are required (a row then always has a value there)."""

    path: str
    field: EventField
    required: bool

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.path.split("."))

    @property
    def type(self) -> FieldType:
        return self.field.type

    @property
    def column(self) -> str:
        """The name of a column holding this field's value on its own (a windowed table's group): ``meta_site``."""
        return self.path.replace(".", "_")


def field_paths(fields: tuple[EventField, ...]) -> dict[str, FieldPath]:
    """Every field a dotted path reaches, top-level fields first: ``gps``, ``gps.lat``… (not through lists or
    maps, whose elements a path cannot name)."""

    def walk(prefix: str, parts: tuple[EventField, ...], required: bool) -> Iterator[FieldPath]:
        for f in parts:
            here = FieldPath(prefix + f.name, f, required and f.required)
            yield here
            if f.type.name == STRUCT:
                yield from walk(here.path + ".", f.type.fields, here.required)

    return {p.path: p for p in walk("", fields, True)}


def inside_collection(path: str, paths: Mapping[str, FieldPath]) -> str | None:
    """The list or map a path that names no field goes through (``tags`` of ``tags.x``), if any."""
    parts = path.split(".")
    for end in range(1, len(parts)):
        there = paths.get(".".join(parts[:end]))
        if there is not None and there.type.name in (LIST, MAP):
            return there.path
    return None
