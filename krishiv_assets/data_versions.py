"""Data versions, so that Dagster's "Unsynced" badge on a table means it lags what was staged from its topic.

Dagster marks an asset stale when the data version of one of its dependencies differs from the version that
dependency had when the asset was last materialized (the ``dagster/input_data_version/<key>`` tag of that
materialization). Without data versions, a table whose commits a sensor reported (a lingering staging run's
committer, ``krishiv run``) showed "Unsynced" as soon as the staging asset was materialized after them, caught up or
not. Every version here names Kafka offsets, so equal offsets are equal versions:

- ``kafka/<topic>``: its end offsets, observed by the Kafka sensor when they change (:func:`topic_observation`);
- ``<pipeline>/staged_batches``: the end offsets the ledger has staged, set by a staging run and reported by the
  outbox sensor whenever the ledger has staged beyond them (:func:`staged_report`);
- each table: the end offsets of its committed batches, which is also the staging version it is in sync with
  (:func:`table_tags`). A table is therefore in sync once it has committed everything staged, and "Unsynced" while
  batches staged from its topic wait for their commit.

A staging run's materialization records the topic's observed version as its input (Dagster's own provenance), so
the staging asset shows "Unsynced" once the topic holds records beyond what that run staged.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

import dagster as dg
from dagster._core.definitions.data_version import (
    CODE_VERSION_TAG,
    DATA_VERSION_IS_USER_PROVIDED_TAG,
    DATA_VERSION_TAG,
    NULL_EVENT_POINTER,
    get_input_data_version_tag,
    get_input_event_pointer_tag,
)

#: The code version recorded with a reported table materialization (Dagster needs one to read its provenance).
REPORTED_CODE_VERSION = "krishiv"


def offsets_version(offsets: Mapping[str, int]) -> dg.DataVersion:
    """The version of ``offsets`` (partition, or ``topic/partition``, to end offset): equal offsets, equal versions."""
    text = json.dumps(sorted(offsets.items()))
    return dg.DataVersion(f"offsets-{hashlib.sha256(text.encode()).hexdigest()[:16]}")


def version_tags(version: dg.DataVersion) -> dict[str, str]:
    """The tags of an event carrying ``version`` as a user-provided data version."""
    return {DATA_VERSION_TAG: version.value, DATA_VERSION_IS_USER_PROVIDED_TAG: "true"}


def input_tag(staged: dg.AssetKey, committed: Mapping[str, int]) -> dict[str, str]:
    """A table materialization's input version: the staging version it is in sync with (its committed offsets)."""
    return {get_input_data_version_tag(staged): offsets_version(committed).value}


def table_tags(staged: dg.AssetKey, committed: Mapping[str, int]) -> dict[str, str]:
    """The whole provenance of a table materialization reported outside a run: its version and its input's, both
    the offsets it has committed through."""
    return {
        CODE_VERSION_TAG: REPORTED_CODE_VERSION,
        get_input_event_pointer_tag(staged): NULL_EVENT_POINTER,
        **input_tag(staged, committed),
        **version_tags(offsets_version(committed)),
    }


def _latest_version(records: list) -> str | None:
    for record in records:
        tags = record.event_log_entry.tags or {}
        return tags.get(DATA_VERSION_TAG)
    return None


def staged_report(
    instance: dg.DagsterInstance, staged: dg.AssetKey, offsets: Mapping[str, int]
) -> dg.AssetMaterialization | None:
    """A materialization of the staging asset at ``offsets`` (what the ledger has staged), unless its latest
    materialization already stands for them or nothing is staged yet."""
    if not offsets:
        return None
    version = offsets_version(offsets)
    if _latest_version(instance.fetch_materializations(staged, limit=1).records) == version.value:
        return None
    return dg.AssetMaterialization(
        asset_key=staged,
        description="the ledger has staged batches through these offsets (reported by the outbox sensor)",
        metadata={"staged_through_offsets": dg.MetadataValue.json(dict(offsets))},
        tags=version_tags(version),
    )


def topic_observation(
    instance: dg.DagsterInstance, topic: dg.AssetKey, offsets: Mapping[str, int]
) -> dg.AssetObservation | None:
    """An observation of the topic at its end ``offsets``, unless its latest observation already saw them."""
    version = offsets_version(offsets)
    if _latest_version(instance.fetch_observations(topic, limit=1).records) == version.value:
        return None
    return dg.AssetObservation(
        asset_key=topic, metadata={"end_offsets": dg.MetadataValue.json(dict(offsets))}, tags=version_tags(version)
    )
