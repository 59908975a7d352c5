"""What a pipeline's table was created for, recorded in the table's properties, and the spec changes refused.

A row table records the kind of the pipeline that writes it, its key (an upsert's ``key``; a windowed
pipeline's ``group_by``), its ``version_field`` and its ``output_mode`` (``krishiv.*`` properties: set when the
table is created, and on an older table with the first batch staged under this rule). On start the spec is
compared with them, before any work: a change whose old rows cannot be read under the new rule (another kind,
another key, another version field) is refused in one line naming the pipeline, the change and what to do.
An output mode switch is refused only while windows are open (``spark_jobs.window_state.check_output_mode``):
it is recorded with the next batch.
"""

from __future__ import annotations

from collections.abc import Mapping

from krishiv_core.errors import SchemaConflict
from krishiv_core.runbook import runbook
from krishiv_core.spec import UPSERT, WINDOWED, PipelineSpec

KIND = "krishiv.kind"
KEY = "krishiv.key"
VERSION_FIELD = "krishiv.version-field"
OUTPUT_MODE = "krishiv.output-mode"


#: The runbook section of every spec change a table cannot take (this module's, the schema's, the partitioning's).
SPEC_CHANGE = runbook("A spec change the table cannot take")


class SpecChangeRefused(SchemaConflict):
    """A spec change that cannot be applied to a pipeline's existing table safely; nothing was changed."""


def _key(pipeline: PipelineSpec) -> tuple[str, ...]:
    if pipeline.kind == UPSERT:
        return tuple(pipeline.key)
    if pipeline.kind == WINDOWED:
        return tuple(pipeline.group_by)
    return ()


def purpose_properties(pipeline: PipelineSpec) -> dict[str, str]:
    """The ``krishiv.*`` properties of a row table of ``pipeline``."""
    properties = {KIND: pipeline.kind, KEY: ",".join(_key(pipeline))}
    if pipeline.kind == UPSERT:
        properties[VERSION_FIELD] = pipeline.version_field or ""
    if pipeline.kind == WINDOWED:
        properties[OUTPUT_MODE] = pipeline.output_mode
    return properties


def _shown(key: str) -> str:
    return "(" + ", ".join(repr(k) for k in key.split(",") if k) + ")" if key else "(nothing)"


def check_purpose(pipeline: PipelineSpec, table: str, properties: Mapping[str, str]) -> None:
    """Refuse ``pipeline``'s spec if ``table`` (its properties) was created for another kind, key or version field.

    A table without the properties (created before they were recorded) is not compared; its schema still is.
    """
    where = f"pipeline {pipeline.name!r}: table {table}"
    kind = properties.get(KIND)
    if kind is not None and kind != pipeline.kind:
        raise SpecChangeRefused(
            f"{where} was created for kind {kind!r} and the spec now says kind {pipeline.kind!r}; a table's kind "
            f"cannot change, so nothing was changed: set kind back to {kind!r}, or start over in a new table under a "
            f"new pipeline name {SPEC_CHANGE}"
        )
    key = properties.get(KEY)
    want = ",".join(_key(pipeline))
    if kind is not None and key is not None and key != want:
        name = "key" if pipeline.kind == UPSERT else "group_by"
        raise SpecChangeRefused(
            f"{where} is keyed by {_shown(key)} and the spec's {name} is {_shown(want)}; a table's key cannot change "
            f"(its rows were merged by the old one), so nothing was changed: set {name} back, or start over in a new "
            f"table under a new pipeline name {SPEC_CHANGE}"
        )
    version = properties.get(VERSION_FIELD)
    if pipeline.kind == UPSERT and version is not None and version != (pipeline.version_field or ""):
        old = repr(version) if version else "none (Kafka offset order)"
        new = repr(pipeline.version_field) if pipeline.version_field else "none (Kafka offset order)"
        raise SpecChangeRefused(
            f"{where} keeps the row of the highest version_field {old} and the spec now says {new}; the rows already "
            "merged were compared by the old one, so nothing was changed: set version_field back, or start over in a "
            f"new table under a new pipeline name {SPEC_CHANGE}"
        )
