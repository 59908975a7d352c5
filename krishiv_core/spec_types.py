"""A pipeline's event fields and their declared types (shared by the spec and the schemas read from a registry)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FieldType:
    """A JSON field's declared type: a scalar name or a decimal with precision and scale."""

    name: str
    precision: int = 0
    scale: int = 0

    @property
    def is_decimal(self) -> bool:
        return self.name == "decimal"

    @property
    def is_numeric(self) -> bool:
        return self.name in ("long", "int", "double", "decimal")

    def __str__(self) -> str:
        return f"decimal({self.precision},{self.scale})" if self.is_decimal else self.name


@dataclass(frozen=True)
class EventField:
    name: str
    type: FieldType
    required: bool = True
