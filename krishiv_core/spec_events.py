"""The options of a ``kind = "events"`` pipeline (docs/spec.md ``kind = "events"``) and their validation.

``kafka_metadata``: the ``_kafka_*`` columns an events (or upsert) table adds; ``route_by``, ``routes`` and
``unrouted``: fan-out, each event to the table of its field's value's :class:`Route`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from krishiv_core.errors import ConfigError
from krishiv_core.spec_types import EventField, field_paths
from krishiv_core.spec_values import expect, identifier, one_field

#: The keys an events pipeline has besides every pipeline's.
KEYS = {"event_time_field", "kafka_metadata", "route_by", "routes", "unrouted"}
#: Kafka metadata columns an ``events`` or ``upsert`` pipeline may add, by the name used in ``kafka_metadata``.
KAFKA_METADATA = ("topic", "partition", "offset", "timestamp", "key")
KAFKA_METADATA_PREFIX = "_kafka_"
REJECTS = "rejects"


@dataclass(frozen=True)
class Route:
    """Events whose ``route_by`` field equals ``value`` go to ``table``."""

    value: str
    table: str


def parse_metadata(raw: Any, where: str, fields: tuple[EventField, ...]) -> tuple[str, ...]:
    """``kafka_metadata`` (events and upsert pipelines): true, false or a list of :data:`KAFKA_METADATA`."""
    if raw is True:
        chosen: tuple[str, ...] = KAFKA_METADATA
    elif raw is False or raw is None:
        return ()
    else:
        expect(raw, list, where, f"true or a list of {list(KAFKA_METADATA)}")
        for i, name in enumerate(raw):
            if name not in KAFKA_METADATA:
                raise ConfigError(f"{where}[{i}]", f"expected one of {list(KAFKA_METADATA)}, got {name!r}")
        chosen = tuple(m for m in KAFKA_METADATA if m in raw)
    clash = {KAFKA_METADATA_PREFIX + m for m in chosen} & {f.name for f in fields}
    if clash:
        raise ConfigError(where, f"event fields {sorted(clash)} clash with the Kafka metadata columns")
    return chosen


def _route_value(value: str, field_type: str, where: str) -> str:
    """A route's value as the event's field reads as text (``"1"``, ``"true"``): one it can hold, written so."""
    if field_type in ("long", "int"):
        if not re.match(r"^-?(0|[1-9][0-9]*)$", value):
            raise ConfigError(where, f"the route_by field is a whole number; expected a value like 42, got {value!r}")
    elif field_type == "boolean" and value not in ("true", "false"):
        raise ConfigError(where, f"the route_by field is a boolean; expected 'true' or 'false', got {value!r}")
    return value


def parse_routes(raw: Mapping[str, Any], where: str, fields: tuple[EventField, ...]) -> dict[str, Any]:
    """An events pipeline's ``route_by``, ``routes`` and ``unrouted`` as ``PipelineSpec`` arguments (none without
    ``route_by``)."""
    paths = field_paths(fields)
    if "route_by" not in raw:
        for key in ("routes", "unrouted"):
            if key in raw:
                raise ConfigError(f"{where}.{key}", "only a pipeline with route_by has routes")
        return {}
    route_by = one_field(raw["route_by"], f"{where}.route_by", paths, ("string", "long", "int", "boolean"), "route_by")
    routes_raw = expect(raw.get("routes"), dict, f"{where}.routes", "a table of field value = table name")
    if not routes_raw:
        raise ConfigError(f"{where}.routes", "expected at least one route")
    kind = paths[route_by].type.name
    routes = tuple(
        Route(_route_value(v, kind, f"{where}.routes.{v}"), identifier(t, f"{where}.routes.{v}"))
        for v, t in routes_raw.items()
    )
    unrouted = raw.get("unrouted", REJECTS)
    if unrouted != REJECTS:
        unrouted = identifier(unrouted, f"{where}.unrouted")
    return {"route_by": route_by, "routes": routes, "unrouted": unrouted}
