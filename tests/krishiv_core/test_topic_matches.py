"""A pipeline's ``topic_pattern``: the topics it matches on the broker, kept in the checkpoint so that a topic once
matched stays a member in the order it came, and a load without the broker still knows them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from krishiv_core import spec as spec_module
from krishiv_core.errors import ConfigError
from krishiv_core.spec import parse_spec
from krishiv_core.spec_topics import MEMBERS_DIR
from krishiv_core.topic_matches import MATCHED_TOPICS_FILE, BrokerSilent, matched_topics, matching, pattern_of


class Broker:
    """The broker's list of topics, as a spec load asks for it; ``None`` is a broker that does not answer."""

    bootstrap = "broker:9092"

    def __init__(self, names: set[str] | None) -> None:
        self.listed = names

    def names(self) -> frozenset[str]:
        if self.listed is None:
            raise BrokerSilent("timed out")
        return frozenset(self.listed)


def test_a_whole_name_matches_never_an_internal_or_the_transaction_topic() -> None:
    pattern = pattern_of(r"shop\.public\..*", "p")
    names = ["shop.public.orders", "shop.public", "xshop.public.a", "__consumer_offsets", "shop.public.tx", "shop.b"]
    assert matching(pattern, names, exclude=["shop.public.tx"]) == ["shop.public.orders"]
    assert matching(pattern_of("shop", "p"), ["shop.public.orders", "shop"]) == ["shop"]  # not a prefix search


def test_matches_keep_their_order_and_a_silent_broker_leaves_the_kept_ones(tmp_path: Path) -> None:
    kept = tmp_path / "matched.json"
    pattern = re.compile(r"db\..*")
    assert matched_topics(pattern, Broker({"db.b", "db.a", "other"}), kept, [], "p") == ("db.a", "db.b")
    kept.write_text(json.dumps({"pattern": pattern.pattern, "topics": ["db.b", "db.a"]}))
    # a new topic joins at the end, whatever its name: a running query's columns follow this order
    assert matched_topics(pattern, Broker({"db.a", "db.b", "db.0"}), kept, [], "p") == ("db.b", "db.a", "db.0")
    # a topic matched before stays a member while the broker no longer lists it
    assert matched_topics(pattern, Broker({"db.a"}), kept, [], "p") == ("db.b", "db.a")
    assert matched_topics(pattern, Broker(None), kept, [], "p") == ("db.b", "db.a")
    # a pattern changed in the spec matches afresh
    assert matched_topics(re.compile(r"db\.a"), Broker({"db.a", "db.b"}), kept, [], "p") == ("db.a",)


@pytest.mark.parametrize(
    ("names", "says"),
    [({"other"}, "no topic on the Kafka broker at broker:9092 matches"), (None, "did not list its topics")],
)
def test_nothing_known_is_one_line_with_the_way_out(tmp_path: Path, names: set[str] | None, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        matched_topics(re.compile(r"db\..*"), Broker(names), tmp_path / "kept.json", [], "pipelines[0].topic_pattern")
    assert caught.value.field == "pipelines[0].topic_pattern" and says in str(caught.value)


def _doc(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    pipeline: dict[str, Any] = {
        "name": "shop",
        "kind": "upsert",
        "envelope": "debezium",
        "topic_pattern": r"shop\.public\..*",
        "tables": {
            "orders": {"key": ["id"], "fields": {"id": "int", "total": "decimal(12,2)"}},
            "refunds": {"key": ["id"], "fields": {"id": "int"}},  # a table whose topic is not there yet
        },
        **overrides,
    }
    return {
        "kafka": {"bootstrap_servers": "broker:9092"},
        "storage": {"checkpoint_location": str(tmp_path / "checkpoints")},
        "pipelines": [pipeline],
    }


def test_a_pattern_makes_a_member_of_each_topic_it_matches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on_broker = {"shop.public.orders", "shop.transaction", "other.public.orders"}
    monkeypatch.setattr(spec_module, "BrokerTopics", lambda settings: Broker(on_broker))
    doc = _doc(tmp_path, transaction_topic="shop.transaction", topic_discovery_interval="2s")
    pipeline = parse_spec(doc).pipeline()
    assert [(m.topic, m.table) for m in pipeline.members] == [("shop.public.orders", "orders")]
    assert pipeline.topics == ("shop.public.orders", "shop.transaction")
    assert (pipeline.topic_pattern, pipeline.topic_discovery_interval_ms) == (r"shop\.public\..*", 2000)
    kept = tmp_path / "checkpoints" / "shop" / MATCHED_TOPICS_FILE
    assert json.loads(kept.read_text())["topics"] == ["shop.public.orders"]

    # a topic without its fields is refused by its table's section, and is not kept: once the section is written
    # (or the topic removed), the pipeline loads
    on_broker.add("shop.public.lines")
    with pytest.raises(ConfigError) as caught:
        parse_spec(doc)
    assert caught.value.field == "pipelines[0].tables.lines", str(caught.value)
    assert "give it a [pipelines.tables.lines] section with key and fields" in str(caught.value)
    assert json.loads(kept.read_text())["topics"] == ["shop.public.orders"]
    doc["pipelines"][0]["tables"]["lines"] = {"key": ["id"], "fields": {"id": "int", "order_id": "int"}}
    assert parse_spec(doc).pipeline().tables == ("orders", "lines")
    assert json.loads(kept.read_text())["topics"] == ["shop.public.orders", "shop.public.lines"]


@pytest.mark.parametrize(
    ("overrides", "where", "says"),
    [
        ({"topics": ["shop.public.orders"]}, "pipelines[0].topic_pattern", "topics = [...] or topic_pattern"),
        ({"topic": "shop.public.orders"}, "pipelines[0].topic", "topic = ... or topic_pattern = ..., not both"),
        ({"topic_pattern": "shop.("}, "pipelines[0].topic_pattern", "not a regular expression"),
        ({"envelope": None}, "pipelines[0].topic_pattern", 'envelope = "debezium"'),
    ],
)
def test_pattern_mistakes_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: dict[str, Any], where: str, says: str
) -> None:
    monkeypatch.setattr(spec_module, "BrokerTopics", lambda settings: Broker({"shop.public.orders"}))
    doc = _doc(tmp_path, **overrides)
    doc["pipelines"][0] = {k: v for k, v in doc["pipelines"][0].items() if v is not None}
    with pytest.raises(ConfigError) as caught:
        parse_spec(doc)
    assert caught.value.field == where and says in str(caught.value), str(caught.value)


def test_a_spec_that_stops_reading_a_topic_the_pipeline_has_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Narrowing the pattern (or the list) would leave a table behind without a word, and widening it again later
    would start that topic where the checkpoint holds no state for it."""
    on_broker = {"shop.public.orders", "shop.public.refunds"}
    monkeypatch.setattr(spec_module, "BrokerTopics", lambda settings: Broker(on_broker))
    doc = _doc(tmp_path)
    assert parse_spec(doc).pipeline().tables == ("orders", "refunds")
    for table in ("orders", "refunds"):  # the batch state a staged table keeps (its remembered deletes)
        state = tmp_path / "checkpoints" / "shop" / MEMBERS_DIR / table / "krishiv" / "upsert-deletes"
        state.mkdir(parents=True)
        (state / "0.parquet").write_bytes(b"")
    doc["pipelines"][0]["topic_pattern"] = r"shop\.public\.orders"
    with pytest.raises(ConfigError) as caught:
        parse_spec(doc)
    assert caught.value.field == "pipelines[0].topic_pattern", str(caught.value)
    assert "no longer reads the topic of table refunds, which this pipeline has staged" in str(caught.value)
    listed = _doc(tmp_path, topics=["shop.public.orders"])
    del listed["pipelines"][0]["topic_pattern"]
    listed["pipelines"][0]["tables"].pop("refunds")
    with pytest.raises(ConfigError, match="no longer reads the topic of table refunds"):
        parse_spec(listed)
