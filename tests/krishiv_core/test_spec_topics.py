"""A pipeline over several topics in the spec: one member per topic, tables by the template, and one clear line for
each mistake."""

from __future__ import annotations

from typing import Any

import pytest

from krishiv_core.errors import ConfigError
from krishiv_core.spec import parse_spec
from krishiv_core.spec_topics import table_of
from krishiv_core.tables import output_tables

TOPICS = ["shop.public.customers", "shop.public.orders"]


def _doc(**overrides: Any) -> dict[str, Any]:
    pipeline: dict[str, Any] = {
        "name": "shop",
        "kind": "upsert",
        "envelope": "debezium",
        "topics": TOPICS,
        "tables": {
            "customers": {"key": ["id"], "fields": {"id": "int", "name": {"type": "string", "required": False}}},
            "orders": {"key": ["id"], "fields": {"id": "int", "total": "decimal(12,2)"}},
        },
    }
    for k, v in overrides.items():
        if v is None:
            pipeline.pop(k, None)
        else:
            pipeline[k] = v
    return {"kafka": {"bootstrap_servers": "localhost:9092"}, "pipelines": [pipeline]}


def test_each_topic_is_a_member_with_its_own_table_key_and_fields() -> None:
    spec = parse_spec(_doc(transaction_topic="shop.transaction", max_records_per_batch=50))
    p = spec.pipeline()
    assert p.topics == (*TOPICS, "shop.transaction")
    assert p.tables == ("customers", "orders") and p.all_tables == ("customers", "orders", "shop_rejects")
    customers, orders = p.members
    assert (customers.topic, customers.table, customers.key) == (TOPICS[0], "customers", ("id",))
    assert [f.name for f in orders.fields] == ["id", "total", "_cdc_lsn", "_cdc_tx"]  # each event's transaction
    assert orders.version_field == "_cdc_lsn" and orders.max_records_per_batch == 50
    assert [t.name for t in output_tables(p)] == ["customers", "orders", "shop_rejects"]
    assert p.writer_of("orders") is orders and p.writer_of("shop_rejects") is p


def test_without_a_transaction_topic_the_tables_have_no_transaction_column() -> None:
    assert [f.name for f in parse_spec(_doc()).pipeline().members[1].fields] == ["id", "total", "_cdc_lsn"]


@pytest.mark.parametrize(
    ("template", "topic", "table"),
    [
        ("{table}", "shop.public.orders", "orders"),
        ("{schema}_{table}", "shop.sales.orders", "sales_orders"),
        ("cdc_{topic}", "shop.public.order-lines", "cdc_shop_public_order_lines"),
        ("{schema}{table}", "orders", "orders"),
    ],
)
def test_the_table_template(template: str, topic: str, table: str) -> None:
    assert table_of(template, topic) == table


@pytest.mark.parametrize(
    ("overrides", "where", "says"),
    [
        ({"topic": "shop.public.orders"}, "pipelines[0].topic", "topic = ... or topics = [...], not both"),
        ({"envelope": None}, "pipelines[0].topics", 'envelope = "debezium"'),
        ({"topics": []}, "pipelines[0].topics", "expected a list of Kafka topic names"),
        ({"topics": [TOPICS[0], TOPICS[0]]}, "pipelines[0].topics", "lists shop.public.customers twice"),
        ({"table": "orders"}, "pipelines[0].table", "names one table for every topic"),
        ({"table": "{name}"}, "pipelines[0].table", "unknown placeholder {name}"),
        ({"topics": ["a.public.orders", "b.public.orders"]}, "pipelines[0].table", "{schema}_{table}"),
        ({"tables": {"orders": {"key": ["id"]}, "refunds": {}}}, "pipelines[0].tables.refunds", "no topic's table"),
        ({"tables": {"orders": {"window": "1m"}}}, "pipelines[0].tables.orders", "unknown keys ['window']"),
        ({"transaction_topic": TOPICS[0]}, "pipelines[0].transaction_topic", "one of the topics of change events"),
        ({"route_by": "x"}, "pipelines[0]", "unknown keys ['route_by']"),
    ],
)
def test_mistakes_are_named_with_the_way_out(overrides: dict[str, Any], where: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_spec(_doc(**overrides))
    assert caught.value.field == where and says in str(caught.value), str(caught.value)


def test_a_table_without_its_key_is_named_by_its_section() -> None:
    doc = _doc()
    del doc["pipelines"][0]["tables"]["orders"]["key"]
    with pytest.raises(ConfigError) as caught:
        parse_spec(doc)
    assert caught.value.field == "pipelines[0].tables.orders.key"
