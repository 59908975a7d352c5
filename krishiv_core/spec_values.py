"""The values a spec's keys take, each read with the key's name in its error (docs/spec.md).

The checks every section and every kind shares: a value of the expected TOML type, a positive whole number, a
name; the grammars of durations (``"5s"``), sizes (``"128MiB"``) and cron strings; the field types and a
pipeline's ``[pipelines.fields]`` table (docs/spec.md "Field types"), and keys naming those fields; the
``did you mean`` hint for a misspelt key. :mod:`krishiv_core.spec` re-exports the public ones.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from krishiv_core.errors import ConfigError
from krishiv_core.spec_types import (
    ELEMENT,
    JSON_TEXT,
    KEY,
    LIST,
    MAP,
    NESTED,
    STRUCT,
    VALUE,
    EventField,
    FieldPath,
    FieldType,
    inside_collection,
)

_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
_SCALAR_TYPES = ("string", "long", "int", "double", "boolean", "timestamp_ms", "timestamp", "date", "binary")
_DURATION = re.compile(r"^(\d+)\s*(ms|s|m|h|d)$")
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_SIZE = re.compile(r"^(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?$")
_SIZE_BYTES = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}
_CRON_FIELD = re.compile(r"^[0-9A-Za-z*/,?-]+$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def expect(value: Any, kind: type | tuple[type, ...], field_name: str, what: str) -> Any:
    if isinstance(value, bool) and kind in (int, (int,)):
        raise ConfigError(field_name, f"expected {what}, got {value!r}")
    if not isinstance(value, kind):
        raise ConfigError(field_name, f"expected {what}, got {value!r}")
    return value


def positive_int(value: Any, field_name: str) -> int:
    number = expect(value, int, field_name, "a whole number")
    if number <= 0:
        raise ConfigError(field_name, f"expected a positive whole number, got {number}")
    return number


def identifier(value: Any, field_name: str) -> str:
    text = expect(value, str, field_name, "a name")
    if not _IDENTIFIER.match(text):
        raise ConfigError(field_name, f"expected a name of letters, digits and underscores, got {text!r}")
    return text


def parse_duration_ms(value: Any, field_name: str) -> int:
    """``"5s"``, ``"1m"``, ``"250ms"``, ``"1h"``, ``"7d"`` or a whole number of milliseconds."""
    if isinstance(value, int) and not isinstance(value, bool):
        ms = value
    elif isinstance(value, str) and (m := _DURATION.match(value.strip())):
        ms = int(m.group(1)) * _DURATION_MS[m.group(2)]
    else:
        raise ConfigError(field_name, f"expected a duration like '5s', '1m' or '250ms', got {value!r}")
    if ms <= 0:
        raise ConfigError(field_name, f"expected a positive duration, got {value!r}")
    return ms


def parse_size_bytes(value: Any, field_name: str) -> int:
    """``"128MiB"``, ``"512KiB"``, ``"1GB"`` or a whole number of bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (m := _SIZE.match(value.strip())):
        size = int(m.group(1)) * _SIZE_BYTES[m.group(2) or "B"]
    else:
        raise ConfigError(field_name, f"expected a size like '128MiB', '512KiB' or a number of bytes, got {value!r}")
    if size <= 0:
        raise ConfigError(field_name, f"expected a positive size, got {value!r}")
    return size


def parse_cron(value: Any, field_name: str) -> str:
    """A cron string of five fields (minute hour day-of-month month day-of-week), as Dagster's schedules take."""
    fields = value.split() if isinstance(value, str) else []
    if len(fields) != 5 or not all(_CRON_FIELD.match(f) for f in fields):
        raise ConfigError(field_name, f"expected a cron string of five fields such as '0 * * * *', got {value!r}")
    return " ".join(fields)


def parse_field_type(value: Any, field_name: str) -> FieldType:
    """A type: a scalar's name, ``decimal(p,s)``, ``json``, or a nested type's table (docs/spec.md, "Nested
    fields"): ``{ type = "struct", fields = {...} }``, ``{ type = "list", element = ... }``,
    ``{ type = "map", key = "string", value = ... }``."""
    if isinstance(value, dict):
        return _declaration(value, field_name, allow_required=False)[0]
    text = expect(value, str, field_name, f"a type ({_TYPES_SHOWN})").strip()
    if text in _SCALAR_TYPES or text == JSON_TEXT:
        return FieldType(text)
    m = _DECIMAL.match(text)
    if m:
        precision, scale = int(m.group(1)), int(m.group(2))
        if not (1 <= precision <= 38 and 0 <= scale <= precision):
            raise ConfigError(field_name, f"decimal precision must be 1..38 and scale 0..precision, got {text}")
        return FieldType("decimal", precision, scale)
    if text in NESTED:
        raise ConfigError(field_name, f"a {text} is declared as a table: {_NESTED_SHAPES[text]}")
    raise ConfigError(field_name, f"expected one of {_TYPES_SHOWN}, got {text!r}")


_TYPES_SHOWN = ", ".join(_SCALAR_TYPES) + ", decimal(p,s), json, or a struct, list or map table"
_NESTED_SHAPES = {
    STRUCT: '{ type = "struct", fields = { name = "type", ... } }',
    LIST: '{ type = "list", element = "type" }',
    MAP: '{ type = "map", key = "string", value = "type" }',
}
_NESTED_KEYS = {STRUCT: {"fields"}, LIST: {ELEMENT}, MAP: {KEY, VALUE}}


def _declaration(decl: Any, where: str, allow_required: bool = True) -> tuple[FieldType, bool]:
    """A field's (or an element's, a value's) declaration: ``"type"`` or a table with ``type``, the nested type's
    parts and ``required``; (its type, whether it is required: true unless it says otherwise)."""
    if not isinstance(decl, dict):
        return parse_field_type(decl, where), True
    kind = decl.get("type")
    parts = _NESTED_KEYS.get(kind, set()) if isinstance(kind, str) else set()
    nested_keys = set(decl) & (_NESTED_KEYS[STRUCT] | _NESTED_KEYS[LIST] | _NESTED_KEYS[MAP])
    if nested_keys and not parts:  # {type = "strcut", fields = ...}: the type word is what is wrong
        kinds = [k for k, keys in _NESTED_KEYS.items() if nested_keys <= keys]
        raise ConfigError(
            f"{where}.type",
            f"expected {' or '.join(map(repr, kinds or NESTED))} beside {', '.join(sorted(nested_keys))}, got {kind!r}",
        )
    allowed = {"type"} | parts | ({"required"} if allow_required else set())
    unknown = set(decl) - allowed
    if unknown:
        raise ConfigError(where, f"unknown keys {sorted(unknown)}; expected {', '.join(map(repr, sorted(allowed)))}")
    required = expect(decl.get("required", True), bool, f"{where}.required", "true or false")
    if kind == STRUCT:
        return FieldType(STRUCT, fields=parse_fields(decl.get("fields"), f"{where}.fields")), required
    if kind == LIST:
        if ELEMENT not in decl:
            raise ConfigError(where, f"a list names its element's type: {_NESTED_SHAPES[LIST]}")
        element_type, element_required = _declaration(decl[ELEMENT], f"{where}.{ELEMENT}")
        return FieldType(LIST, element=EventField(ELEMENT, element_type, element_required)), required
    if kind == MAP:
        if KEY not in decl or VALUE not in decl:
            raise ConfigError(where, f"a map names its key's and its value's types: {_NESTED_SHAPES[MAP]}")
        key_type = parse_field_type(decl[KEY], f"{where}.{KEY}")
        if not key_type.is_scalar or key_type.name == "double":
            raise ConfigError(
                f"{where}.{KEY}",
                f"a map's key is a string, a whole number, a decimal, a boolean, a date or a time; got {key_type}",
            )
        value_type, value_required = _declaration(decl[VALUE], f"{where}.{VALUE}")
        return FieldType(MAP, element=EventField(VALUE, value_type, value_required), key=key_type), required
    return parse_field_type(kind, f"{where}.type"), required


def parse_fields(raw: Any, where: str) -> tuple[EventField, ...]:
    """``[pipelines.fields]`` (or a struct's ``fields``): ``name = "type"`` or ``name = { type = …, required = false
    }``, a nested type's table holding its parts beside ``type`` and ``required``."""
    expect(raw, dict, where, "a table of field = type")
    fields = []
    for name, decl in raw.items():
        fname = f"{where}.{name}"
        identifier(name, fname)
        ftype, required = _declaration(decl, fname)
        fields.append(EventField(name, ftype, required))
    if not fields:
        raise ConfigError(where, "expected at least one field")
    return tuple(fields)


def field_path(raw: Any, where: str, paths: Mapping[str, FieldPath], what: str = "event fields") -> FieldPath:
    """A key naming one event field, top-level or by a dotted path through structs (``meta.ts``)."""
    if isinstance(raw, str) and raw in paths:
        return paths[raw]
    through = inside_collection(raw, paths) if isinstance(raw, str) else None
    if through is not None:
        raise ConfigError(
            where,
            f"{raw!r} goes through {through}, a {paths[through].type.name}: a path can name a field inside a struct, "
            "not inside a list or map",
        )
    top = sorted(p for p in paths if "." not in p)
    raise ConfigError(where, f"expected one of the {what} {top} (or a dotted path into a struct), got {raw!r}")


def field_names(raw: Any, where: str, paths: Mapping[str, FieldPath], what: str) -> tuple[str, ...]:
    """A key naming event fields: one name or a list of distinct ones (each a dotted path into structs or not)."""
    names = [raw] if isinstance(raw, str) else expect(raw, list, where, f"a list of {what}")
    for i, name in enumerate(names):
        field_path(name, f"{where}[{i}]", paths, what)
    if len(set(names)) != len(names):
        raise ConfigError(where, f"a field is named twice: {names}")
    return tuple(names)


def one_field(raw: Any, where: str, paths: Mapping[str, FieldPath], types: tuple[str, ...], what: str) -> str:
    """A key naming one event field (or a dotted path into structs) of one of ``types``."""
    found = field_path(raw, where, paths)
    if found.type.name not in types:
        raise ConfigError(where, f"{what} must be of type {' or '.join(types)}; {raw} is {found.type}")
    return found.path


def did_you_mean(unknown: AbstractSet[str], known: AbstractSet[str]) -> str:
    """``; did you mean 'format' (for 'formt')?`` for each unknown key close to a known one, else nothing."""
    guesses = []
    for key in sorted(unknown):
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
        if close:
            guesses.append(f"{close[0]!r} (for {key!r})")
    return f"; did you mean {', '.join(guesses)}?" if guesses else ""
