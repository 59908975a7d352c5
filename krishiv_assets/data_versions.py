"""Data versions, so that Dagster's "Unsynced" badge means a table or its staging lags what its topic holds.

Dagster marks an asset stale when the data version of one of its dependencies differs from the version that
dependency had when the asset was last materialized (the ``dagster/input_data_version/<key>`` tag of that
materialization). Without data versions, a table whose commits a sensor reported (a lingering staging run's
committer, ``krishiv run``) showed "Unsynced" as soon as the staging asset was materialized after them, caught up or
not. Every version here names Kafka offsets (partitions at offset 0 left out), so equal offsets are equal versions:

- ``kafka/<topic>``: the offsets it holds, reported by the Kafka sensor when they change (:func:`topic_report`):
  per partition its end offset, or the offset staged beyond it (Tansu reports the last batch's base offset + 1 as a
  partition's end, short of what a consumer reads);
- ``<pipeline>/staged_batches``: the end offsets the ledger has staged, set by a staging run and reported by the
  outbox sensor whenever the ledger has staged beyond them (:func:`staged_report`); its input versions are the same
  offsets, topic by topic (:func:`staged_inputs`): it is in sync with a topic once it has staged all the topic held
  when last reported;
- each table: the end offsets of its committed batches, which is also the staging version it is in sync with
  (:func:`table_tags`): it is in sync once it has committed everything staged, and "Unsynced" while staged batches
  wait for their commit.
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

from krishiv_core.spec import PipelineSpec
from outbox.ledger import Ledger

#: The code version recorded with a reported table materialization (Dagster needs one to read its provenance).
REPORTED_CODE_VERSION = "krishiv"


def offsets_version(offsets: Mapping[str, int]) -> dg.DataVersion:
    """The version of ``offsets`` (partition, or ``topic/partition``, to end offset): equal offsets, equal versions;
    a partition at 0 (empty, or not staged from yet) is the same as one not named."""
    text = json.dumps(sorted((p, o) for p, o in offsets.items() if o))
    return dg.DataVersion(f"offsets-{hashlib.sha256(text.encode()).hexdigest()[:16]}")


def version_tags(version: dg.DataVersion) -> dict[str, str]:
    """The tags of an event carrying ``version`` as a user-provided data version."""
    return {DATA_VERSION_TAG: version.value, DATA_VERSION_IS_USER_PROVIDED_TAG: "true"}


#: Offsets by topic: the topic's asset key -> partition -> end offset (what the ledger staged or committed from it).
ByTopic = Mapping[dg.AssetKey, Mapping[str, int]]


def ledger_offsets(
    ledger: Ledger, table: str, pipeline: PipelineSpec, status: str | None = None
) -> dict[dg.AssetKey, dict[str, int]]:
    """The end offsets of ``table``'s batches in the ledger (with ``status``, only its entries in that status), by
    topic of the pipeline."""
    return {dg.AssetKey(["kafka", t]): ledger.end_offsets(table, t, status) for t in pipeline.topics}


def staged_version(offsets: ByTopic) -> dg.DataVersion:
    """The version of offsets by topic: the staging asset's (what was staged), and a table's (what it committed)."""
    return offsets_version({f"{key.path[-1]}/{p}": o for key, ends in offsets.items() for p, o in ends.items()})


def input_tag(staged: dg.AssetKey, committed: ByTopic) -> dict[str, str]:
    """A table materialization's input version: the staging version it is in sync with (its committed offsets)."""
    return {get_input_data_version_tag(staged): staged_version(committed).value}


def table_tags(staged: dg.AssetKey, committed: ByTopic) -> dict[str, str]:
    """The whole provenance of a table materialization reported outside a run: its version and its input's, both
    the offsets it has committed through."""
    return {
        CODE_VERSION_TAG: REPORTED_CODE_VERSION,
        get_input_event_pointer_tag(staged): NULL_EVENT_POINTER,
        **input_tag(staged, committed),
        **version_tags(staged_version(committed)),
    }


def _latest_version(records: list) -> str | None:
    """The data version of the newest of ``records`` (an event log query's, newest first)."""
    return (records[0].event_log_entry.tags or {}).get(DATA_VERSION_TAG) if records else None


def topic_held(latest: Mapping[str, int], staged: Mapping[str, int]) -> dict[str, int]:
    """What a topic holds, per partition: its end offset, or the offset staged beyond that end."""
    return {p: max(latest.get(p, 0), staged.get(p, 0)) for p in {*latest, *staged}}


def staged_inputs(staged: ByTopic) -> dict[str, str]:
    """A staging materialization's input versions: the offsets staged from each topic, so it is in sync with a topic
    whose latest report holds no more than that (:func:`topic_held`)."""
    tags = {}
    for key, offsets in staged.items():
        tags[get_input_data_version_tag(key)] = offsets_version(offsets).value
        tags[get_input_event_pointer_tag(key)] = NULL_EVENT_POINTER
    return tags


def staged_report(instance: dg.DagsterInstance, key: dg.AssetKey, staged: ByTopic) -> dg.AssetMaterialization | None:
    """A materialization of the staging asset ``key`` at what the ledger has staged, unless its latest
    materialization already stands for it or nothing is staged yet."""
    version = staged_version(staged)
    if not any(o for ends in staged.values() for o in ends.values()):
        return None
    if _latest_version(instance.fetch_materializations(key, limit=1).records) == version.value:
        return None
    return dg.AssetMaterialization(
        asset_key=key,
        description="the ledger has staged batches through these offsets (reported by the outbox sensor)",
        metadata={"staged_through_offsets": dg.MetadataValue.json({k.path[-1]: dict(v) for k, v in staged.items()})},
        tags={CODE_VERSION_TAG: REPORTED_CODE_VERSION, **staged_inputs(staged), **version_tags(version)},
    )


def topic_report(
    instance: dg.DagsterInstance, topic: dg.AssetKey, held: Mapping[str, int]
) -> dg.AssetMaterialization | None:
    """The topic holding ``held`` (:func:`topic_held`), as a materialization of its external asset, unless its latest
    one says that already.

    A materialization, not an observation: Dagster reads an external asset's data version from its latest
    materialization, and from observations only for an asset with an observation function (a beta API in Dagster
    1.13). The topic is written by its producers, not by Krishiv; the event says what it holds.
    """
    version = offsets_version(held)
    if _latest_version(instance.fetch_materializations(topic, limit=1).records) == version.value:
        return None
    return dg.AssetMaterialization(
        asset_key=topic,
        description="the topic holds records up to these offsets (reported by the Kafka sensor)",
        metadata={"end_offsets": dg.MetadataValue.json(dict(held))},
        tags=version_tags(version),
    )
