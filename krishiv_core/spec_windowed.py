"""The options of a ``kind = "windowed"`` pipeline (docs/spec.md ``kind = "windowed"``) and their validation.

``window`` and ``slide`` (tumbling or hopping windows), ``watermark_delay``, ``group_by``, ``output_mode``
(``append`` or ``update``) and the ``aggregations``, each an :class:`Aggregation`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from krishiv_core.errors import ConfigError
from krishiv_core.spec_types import EventField, field_paths
from krishiv_core.spec_values import expect, field_names, field_path, identifier, parse_duration_ms

#: The keys a windowed pipeline has besides every pipeline's.
KEYS = {"event_time_field", "watermark_delay", "window", "slide", "group_by", "output_mode", "aggregations"}
_AGG_FUNCTIONS = ("count", "sum", "min", "max", "avg")
_OUTPUT_MODES = ("append", "update")


@dataclass(frozen=True)
class Aggregation:
    """One output column: ``function(field)`` named ``name``; ``count`` takes no field."""

    name: str
    function: str
    field: str | None = None


def _parse_aggregations(raw: Any, where: str, fields: tuple[EventField, ...]) -> tuple[Aggregation, ...]:
    expect(raw, list, where, "a list of {name, function, field}")
    paths = field_paths(fields)
    out: list[Aggregation] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        expect(item, dict, at, "a table with name, function and field")
        unknown = set(item) - {"name", "function", "field"}
        if unknown:
            raise ConfigError(at, f"unknown keys {sorted(unknown)}; expected name, function, field")
        name = identifier(item.get("name"), f"{at}.name")
        function = item.get("function")
        if function not in _AGG_FUNCTIONS:
            raise ConfigError(f"{at}.function", f"expected one of {', '.join(_AGG_FUNCTIONS)}, got {function!r}")
        source = item.get("field")
        if source is not None or function != "count":
            ftype = field_path(source, f"{at}.field", paths).type
            if function in ("sum", "avg") and not ftype.is_numeric:
                raise ConfigError(f"{at}.field", f"{function} needs a numeric field; {source} is {ftype}")
            if function in ("min", "max") and not ftype.is_scalar:
                raise ConfigError(f"{at}.field", f"{function} needs a field of one value; {source} is {ftype}")
        if name in {a.name for a in out} or name in ("window_start", "window_end"):
            raise ConfigError(f"{at}.name", f"output column {name!r} is used twice")
        out.append(Aggregation(name, function, source))
    if not out:
        raise ConfigError(where, "expected at least one aggregation")
    return tuple(out)


def parse_windowed(raw: Mapping[str, Any], where: str, fields: tuple[EventField, ...]) -> dict[str, Any]:
    """A windowed pipeline's own ``PipelineSpec`` arguments."""
    by_name = field_paths(fields)
    window_ms = parse_duration_ms(raw.get("window", "1m"), f"{where}.window")
    slide_ms = None
    if "slide" in raw:
        slide_ms = parse_duration_ms(raw["slide"], f"{where}.slide")
        if slide_ms > window_ms or window_ms % slide_ms:
            raise ConfigError(
                f"{where}.slide", f"expected a slide that divides the window ({window_ms} ms), got {slide_ms} ms"
            )
        slide_ms = None if slide_ms == window_ms else slide_ms
    group_by = field_names(raw.get("group_by", []), f"{where}.group_by", by_name, "event fields")
    for i, name in enumerate(group_by):
        f = by_name[name]
        if not f.required or f.type.name == "double" or not f.type.is_scalar:
            raise ConfigError(
                f"{where}.group_by[{i}]",
                "a group-by field must be required (and so every struct it is in), one value and not a double (its "
                f"rows are a window's key); {name} is {'optional' if not f.required else f.type}",
            )
    columns = [by_name[g].column for g in group_by]
    if len(set(columns)) != len(columns) or set(columns) & {"window_start", "window_end"}:
        raise ConfigError(f"{where}.group_by", f"the group-by columns {columns} (a path's dots become _) clash")
    output_mode = raw.get("output_mode", "append")
    if output_mode not in _OUTPUT_MODES:
        raise ConfigError(f"{where}.output_mode", f"expected one of {list(_OUTPUT_MODES)}, got {output_mode!r}")
    aggregations = _parse_aggregations(raw.get("aggregations"), f"{where}.aggregations", fields)
    clash = set(group_by) & {a.name for a in aggregations}
    if clash:
        raise ConfigError(f"{where}.aggregations", f"output columns {sorted(clash)} are also group-by fields")
    return {
        "aggregations": aggregations,
        "watermark_delay_ms": parse_duration_ms(raw.get("watermark_delay", "5s"), f"{where}.watermark_delay"),
        "window_ms": window_ms,
        "slide_ms": slide_ms,
        "group_by": group_by,
        "output_mode": output_mode,
    }
