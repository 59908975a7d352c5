"""The options of a ``kind = "upsert"`` pipeline (docs/spec.md ``kind = "upsert"``) and their validation.

``key``, ``version_field`` and ``delete_field``, and the columns a Debezium pipeline (``envelope = "debezium"``,
read by :mod:`krishiv_core.formats` with its ``cdc_*`` keys) adds to its fields and orders its keys by.
An upsert pipeline's ``kafka_metadata`` is an events pipeline's (:mod:`krishiv_core.spec_events`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from krishiv_core.errors import ConfigError
from krishiv_core.formats import CDC_COLUMNS, RecordFormat
from krishiv_core.spec_types import EventField, FieldType, field_paths
from krishiv_core.spec_values import field_names, one_field

#: The keys an upsert pipeline has besides every pipeline's.
KEYS = {"event_time_field", "kafka_metadata", "key", "version_field", "delete_field"}


def parse_upsert(raw: Mapping[str, Any], where: str, fields: tuple[EventField, ...]) -> dict[str, Any]:
    """An upsert pipeline's ``key``, ``version_field`` and ``delete_field`` as ``PipelineSpec`` arguments."""
    by_name = field_paths(fields)
    if "key" not in raw:
        raise ConfigError(f"{where}.key", "an upsert pipeline needs key = [field, ...]: the fields naming a row")
    key = field_names(raw["key"], f"{where}.key", by_name, "event fields")
    if not key:
        raise ConfigError(f"{where}.key", "expected at least one key field")
    for i, name in enumerate(key):
        f = by_name[name]
        if not f.required or f.type.name == "double" or not f.type.is_scalar:
            raise ConfigError(
                f"{where}.key[{i}]",
                "a key field must be required (and so every struct it is in), one value and not a double; "
                f"{name} is {'optional' if not f.required else f.type}",
            )
    version = raw.get("version_field")
    if version is not None:
        version = one_field(
            version,
            f"{where}.version_field",
            by_name,
            ("long", "int", "timestamp_ms", "timestamp", "decimal"),
            "version_field",
        )
    delete = raw.get("delete_field")
    if delete is not None:
        delete = one_field(delete, f"{where}.delete_field", by_name, ("boolean",), "delete_field")
    return {"key": key, "version_field": version, "delete_field": delete}


def with_cdc_fields(raw: dict[str, Any], where: str, fields: tuple[EventField, ...], fmt: RecordFormat) -> Any:
    """A Debezium pipeline's fields: the row's, then the change-event columns it keeps; its version is the position."""
    assert fmt.cdc is not None
    for name in ("version_field", "delete_field"):
        if name in raw:
            raise ConfigError(
                f"{where}.{name}",
                "a Debezium pipeline is ordered by the source position (cdc_position) and deletes by op = d; "
                f"remove {name}",
            )
    names = {f.name for f in fields}
    for short in fmt.cdc.columns:
        column, type_name = CDC_COLUMNS[short]
        if column in names:
            raise ConfigError(f"{where}.fields.{column}", "is the change events' own column: rename the field")
        fields += (EventField(column, FieldType(type_name), required=False),)
    raw["version_field"] = fmt.cdc.version_column
    return fields
