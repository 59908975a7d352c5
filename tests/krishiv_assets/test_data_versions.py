"""Data versions make Dagster's staleness mean what docs/dagster.md says: a table is in sync once it has committed
everything staged from its topic, and "Unsynced" while staged batches wait for their commit.

Dagster's own stale-status resolver (what the UI's badge shows) judges the events Krishiv reports, on a real
instance, in the order a lingering staging run and its committer produce them; likewise the staging asset against
what the Kafka sensor reports the topic holds. The same events without data versions show the badge the issue
reported on a healthy table.
"""

from __future__ import annotations

import dagster as dg
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
from dagster._core.loader import LoadingContextForTest

from krishiv_assets.data_versions import (
    offsets_version,
    staged_report,
    staged_version,
    table_tags,
    topic_held,
    topic_report,
    version_tags,
)

TOPIC = dg.AssetKey(["kafka", "orders"])
STAGED = dg.AssetKey(["orders", "staged_batches"])
TABLE = dg.AssetKey(["iceberg", "krishiv", "orders"])


@dg.asset(key=STAGED, deps=[TOPIC])
def staged_batches() -> None: ...


@dg.asset(key=TABLE, deps=[STAGED])
def table() -> None: ...


GRAPH = dg.Definitions(assets=[dg.AssetSpec(TOPIC), staged_batches, table]).resolve_asset_graph()


def status(instance: dg.DagsterInstance, key: dg.AssetKey) -> StaleStatus:
    return CachingStaleStatusResolver(instance, GRAPH, LoadingContextForTest(instance)).get_status(key)


def report(instance: dg.DagsterInstance, event: dg.AssetMaterialization | dg.AssetMaterialization | None) -> None:
    assert event is not None
    instance.report_runless_asset_event(event)


def committed(offsets: dict[str, int]) -> dg.AssetMaterialization:
    return dg.AssetMaterialization(TABLE, tags=table_tags(STAGED, {TOPIC: offsets}))


def staged(instance: dg.DagsterInstance, offsets: dict[str, int]) -> dg.AssetMaterialization | None:
    return staged_report(instance, STAGED, {TOPIC: offsets})


def test_a_table_is_unsynced_exactly_while_staged_batches_wait_for_their_commit() -> None:
    with dg.instance_for_test() as instance:
        report(instance, staged(instance, {"0": 10, "1": 4}))
        report(instance, committed({"0": 10, "1": 4}))
        assert status(instance, TABLE) == StaleStatus.FRESH

        report(instance, staged(instance, {"0": 25, "1": 4}))  # a batch staged, not committed yet
        assert status(instance, TABLE) == StaleStatus.STALE
        report(instance, committed({"0": 18, "1": 4}))  # one of two batches committed: it still lags
        assert status(instance, TABLE) == StaleStatus.STALE
        report(instance, committed({"0": 25, "1": 4}))
        assert status(instance, TABLE) == StaleStatus.FRESH

        # The staging run ends after its committer caught up: its materialization has the same version, so the
        # outbox sensor reports nothing more and the table stays in sync.
        assert staged(instance, {"1": 4, "0": 25}) is None
        instance.report_runless_asset_event(
            dg.AssetMaterialization(STAGED, tags=version_tags(staged_version({TOPIC: {"0": 25, "1": 4}})))
        )
        assert status(instance, TABLE) == StaleStatus.FRESH


def test_the_staging_is_unsynced_exactly_while_the_topic_holds_records_it_has_not_staged() -> None:
    with dg.instance_for_test() as instance:
        report(instance, topic_report(instance, TOPIC, topic_held({"0": 10, "1": 0}, {})))
        report(instance, staged(instance, {"0": 10}))  # partition 1 is empty: nothing staged from it
        assert status(instance, STAGED) == StaleStatus.FRESH

        report(instance, topic_report(instance, TOPIC, topic_held({"0": 15, "1": 3}, {"0": 10})))
        assert status(instance, STAGED) == StaleStatus.STALE
        report(instance, staged(instance, {"0": 15, "1": 3}))
        assert status(instance, STAGED) == StaleStatus.FRESH

        # Tansu reports a partition's end as its last batch's base offset + 1, short of what was staged: the topic
        # holds what was staged, and the staging stays in sync.
        assert topic_report(instance, TOPIC, topic_held({"0": 13, "1": 3}, {"0": 15, "1": 3})) is None
        assert status(instance, STAGED) == StaleStatus.FRESH


def test_without_data_versions_a_caught_up_table_showed_unsynced() -> None:
    """What the issue saw: commits reported while a lingering run staged, then the run's own materialization."""
    with dg.instance_for_test() as instance:
        instance.report_runless_asset_event(dg.AssetMaterialization(TABLE))
        instance.report_runless_asset_event(dg.AssetMaterialization(STAGED))
        assert status(instance, TABLE) == StaleStatus.STALE


def test_the_topic_is_reported_only_when_what_it_holds_changes() -> None:
    with dg.instance_for_test() as instance:
        report(instance, topic_report(instance, TOPIC, {"0": 5}))
        assert topic_report(instance, TOPIC, {"0": 5, "1": 0}) is None  # an empty partition changes nothing
        report(instance, topic_report(instance, TOPIC, {"0": 6}))
        (latest,) = instance.fetch_materializations(TOPIC, limit=1).records
        assert latest.event_log_entry.tags["dagster/data_version"] == offsets_version({"0": 6}).value
        assert offsets_version({"0": 6, "1": 2}) == offsets_version({"1": 2, "0": 6})
