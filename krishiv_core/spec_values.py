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
from krishiv_core.spec_types import EventField, FieldType

_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
_SCALAR_TYPES = ("string", "long", "int", "double", "boolean", "timestamp_ms", "timestamp", "date")
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
    text = expect(value, str, field_name, f"a type ({', '.join(_SCALAR_TYPES)} or decimal(p,s))").strip()
    if text in _SCALAR_TYPES:
        return FieldType(text)
    m = _DECIMAL.match(text)
    if m:
        precision, scale = int(m.group(1)), int(m.group(2))
        if not (1 <= precision <= 38 and 0 <= scale <= precision):
            raise ConfigError(field_name, f"decimal precision must be 1..38 and scale 0..precision, got {text}")
        return FieldType("decimal", precision, scale)
    raise ConfigError(field_name, f"expected one of {', '.join(_SCALAR_TYPES)} or decimal(p,s), got {text!r}")


def parse_fields(raw: Any, where: str) -> tuple[EventField, ...]:
    """``[pipelines.fields]``: ``name = "type"`` or ``name = { type = "…", required = false }``."""
    expect(raw, dict, where, "a table of field = type")
    fields = []
    for name, decl in raw.items():
        fname = f"{where}.{name}"
        identifier(name, fname)
        if isinstance(decl, dict):
            unknown = set(decl) - {"type", "required"}
            if unknown:
                raise ConfigError(fname, f"unknown keys {sorted(unknown)}; expected 'type' and 'required'")
            ftype = parse_field_type(decl.get("type"), f"{fname}.type")
            required = expect(decl.get("required", True), bool, f"{fname}.required", "true or false")
        else:
            ftype, required = parse_field_type(decl, fname), True
        fields.append(EventField(name, ftype, required))
    if not fields:
        raise ConfigError(where, "expected at least one field")
    return tuple(fields)


def field_names(raw: Any, where: str, by_name: Mapping[str, EventField], what: str) -> tuple[str, ...]:
    """A key naming event fields: one name or a list of distinct ones."""
    names = [raw] if isinstance(raw, str) else expect(raw, list, where, f"a list of {what}")
    for i, name in enumerate(names):
        if not isinstance(name, str) or name not in by_name:
            raise ConfigError(f"{where}[{i}]", f"expected one of the event fields {sorted(by_name)}, got {name!r}")
    if len(set(names)) != len(names):
        raise ConfigError(where, f"a field is named twice: {names}")
    return tuple(names)


def one_field(raw: Any, where: str, by_name: Mapping[str, EventField], types: tuple[str, ...], what: str) -> str:
    """A key naming one event field of one of ``types``."""
    if not isinstance(raw, str) or raw not in by_name:
        raise ConfigError(where, f"expected one of the event fields {sorted(by_name)}, got {raw!r}")
    if by_name[raw].type.name not in types:
        raise ConfigError(where, f"{what} must be of type {' or '.join(types)}; {raw} is {by_name[raw].type}")
    return raw


def did_you_mean(unknown: AbstractSet[str], known: AbstractSet[str]) -> str:
    """``; did you mean 'format' (for 'formt')?`` for each unknown key close to a known one, else nothing."""
    guesses = []
    for key in sorted(unknown):
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
        if close:
            guesses.append(f"{close[0]!r} (for {key!r})")
    return f"; did you mean {', '.join(guesses)}?" if guesses else ""
