"""An upsert pipeline over several topics (docs/spec.md, "Several topics, one pipeline"): a whole database's CDC.

``topics = [...]`` (or ``topic_pattern``, :mod:`krishiv_core.topic_matches`) in place of ``topic``, for
``kind = "upsert"`` with ``envelope = "debezium"``: one query reads every topic, one table per topic, and each batch
is committed to all its tables at once. Each topic's table is named by ``table`` as a template
(:data:`TABLE_TEMPLATE_DEFAULT`): ``{table}`` and ``{schema}`` are the last two dot-separated parts of the topic
(Debezium names a table's topic ``<prefix>.<schema>.<table>``), ``{topic}`` the whole topic with every character
that is not a letter, digit or ``_`` as ``_``. A table's own settings (``key``, ``fields``, ``partition_by``,
``subject``) go under ``[pipelines.tables.<table>]``; every other setting of the pipeline applies to each table.
``transaction_topic`` names Debezium's transaction metadata topic (``provide.transaction.metadata``): batches then
make each source transaction visible whole (``spark_jobs.transaction_gate``).

Each table is parsed as the single-topic pipeline it would be (its own fields, from the spec or the registry's
``<topic>-value`` subject, its key, its Debezium columns): a *member* of the pipeline.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from krishiv_core.errors import ConfigError
from krishiv_core.spec_values import expect

#: The keys only a pipeline over several topics has.
KEYS = {"topics", "topic_pattern", "topic_discovery_interval", "tables", "transaction_topic", "transaction_timeout"}
#: The settings that belong to one table, under ``[pipelines.tables.<table>]``.
TABLE_KEYS = {"key", "fields", "partition_by", "subject", "kafka_metadata"}
TABLE_TEMPLATE_DEFAULT = "{table}"
#: Where in a pipeline's checkpoint each table keeps its state (``<MEMBERS_DIR>/<table>/``): what it reads of the
#: registry, and the batch state of its staging (``spark_jobs.topics_shape``).
MEMBERS_DIR = "krishiv/tables"
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TOKENS = re.compile(r"\{(\w*)\}")


def topic_name(value: Any, where: str) -> str:
    topic = expect(value, str, where, "a Kafka topic name")
    if not _TOPIC.match(topic):
        raise ConfigError(where, f"not a valid Kafka topic name: {topic!r}")
    return topic


def table_of(template: str, topic: str) -> str:
    """The table ``template`` names for ``topic``: ``{table}``, ``{schema}`` (the topic's last two dot-separated
    parts; ``{schema}`` is empty for a topic of one part) and ``{topic}`` (every other character as ``_``)."""
    parts = topic.split(".")
    values = {
        "table": parts[-1],
        "schema": parts[-2] if len(parts) > 1 else "",
        "topic": re.sub(r"[^A-Za-z0-9_]", "_", topic),
    }
    return _TOKENS.sub(lambda m: values[m.group(1)], template)


def _template(value: Any, where: str) -> str:
    template = expect(value, str, where, "a table name template such as {table}")
    unknown = sorted({t for t in _TOKENS.findall(template) if t not in ("table", "schema", "topic")})
    if unknown:
        raise ConfigError(
            where, f"unknown placeholder {{{unknown[0]}}}: a template may use {{table}}, {{schema}}, {{topic}}"
        )
    if not _TOKENS.search(template):
        raise ConfigError(
            where, f"{template!r} names one table for every topic: use {{table}}, {{schema}} or {{topic}}"
        )
    return template


def transaction_topic(raw: Mapping[str, Any], where: str) -> str | None:
    """The pipeline's ``transaction_topic``, if it has one."""
    value = raw.get("transaction_topic")
    return None if value is None else topic_name(value, f"{where}.transaction_topic")


def member_sources(
    raw: Mapping[str, Any], where: str, matched: tuple[str, ...] = ()
) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
    """Each topic's table as the single-topic pipeline it is (its where, its spec table), and the transaction topic.

    The pipeline's settings apply to every table, the table's own (``[pipelines.tables.<table>]``) replace them. The
    topics are ``topics``, or ``matched``: those ``topic_pattern`` matches (``krishiv_core.topic_matches``).
    """
    key = "topic_pattern" if "topic_pattern" in raw else "topics"
    if "topic" in raw:
        shown = "topics = [...]" if key == "topics" else "topic_pattern = ..."
        raise ConfigError(f"{where}.topic", f"a pipeline reads topic = ... or {shown}, not both")
    if "topics" in raw and "topic_pattern" in raw:
        raise ConfigError(f"{where}.topic_pattern", "a pipeline reads topics = [...] or topic_pattern = ..., not both")
    if raw.get("kind") != "upsert" or raw.get("envelope") != "debezium":
        raise ConfigError(
            f"{where}.{key}",
            "several topics are read by an upsert pipeline of Debezium change events: set kind = "
            '"upsert" and envelope = "debezium"',
        )
    topics = list(matched) if key == "topic_pattern" else raw["topics"]
    if not isinstance(topics, list) or not topics:
        raise ConfigError(f"{where}.topics", f"expected a list of Kafka topic names, got {topics!r}")
    topics = [topic_name(t, f"{where}.{key}[{i}]") for i, t in enumerate(topics)]
    repeated = sorted({t for t in topics if topics.count(t) > 1})
    if repeated:
        raise ConfigError(f"{where}.topics", f"lists {repeated[0]} twice")
    template = _template(raw.get("table", TABLE_TEMPLATE_DEFAULT), f"{where}.table")
    tables = raw.get("tables", {})
    expect(tables, dict, f"{where}.tables", "a table of [pipelines.tables.<table>] sections")
    names = [table_of(template, t) for t in topics]
    for topic, name in zip(topics, names, strict=True):
        if not _IDENTIFIER.match(name):
            raise ConfigError(
                f"{where}.table", f"names topic {topic}'s table {name!r}, not a name of letters, digits and _"
            )
    same = sorted({n for n in names if names.count(n) > 1})
    if same:
        clash = [t for t, n in zip(topics, names, strict=True) if n == same[0]]
        raise ConfigError(
            f"{where}.table",
            f"names one table {same[0]} for topics {clash}: use a template that tells them apart, such as "
            "{schema}_{table}",
        )
    stray = sorted(set(tables) - set(names))
    if stray and key == "topics":  # a pattern's table may come with a topic made later
        raise ConfigError(f"{where}.tables.{stray[0]}", f"no topic's table is named {stray[0]}; the tables are {names}")
    shared = {k: v for k, v in raw.items() if k not in KEYS | {"table"} | TABLE_KEYS}
    transaction = transaction_topic(raw, where)
    if transaction is not None:
        if transaction in topics:
            raise ConfigError(f"{where}.transaction_topic", f"{transaction} is one of the topics of change events")
        # each event's transaction, which the transaction gate groups by, is a column of its table
        shared["cdc_columns"] = list(dict.fromkeys([*shared.get("cdc_columns", []), "tx"]))
    members = []
    for topic, name in zip(topics, names, strict=True):
        own = tables.get(name, {})
        expect(own, dict, f"{where}.tables.{name}", "a table")
        unknown = sorted(set(own) - TABLE_KEYS)
        if unknown:
            raise ConfigError(
                f"{where}.tables.{name}", f"unknown keys {unknown}; a table's own settings are {sorted(TABLE_KEYS)}"
            )
        members.append((f"{where}.tables.{name}", {**shared, "topic": topic, "table": name, **own}))
    return members, transaction


def parse_members(
    raw: Mapping[str, Any], where: str, parse: Callable[[dict[str, Any], str], Any], matched: tuple[str, ...] = ()
) -> tuple[tuple[Any, ...], str | None]:
    """The members (each parsed by ``parse(table's spec, where)``) and the transaction topic."""
    sources, transaction = member_sources(raw, where, matched)
    return tuple(parse(source, at) for at, source in sources), transaction


def tables_staged(checkpoint: Path | None) -> set[str]:
    """The tables a pipeline over several has staged batches of: those with batch state in its checkpoint."""
    folder = checkpoint / MEMBERS_DIR if checkpoint is not None else None
    if folder is None or not folder.is_dir():
        return set()
    return {d.name for d in folder.iterdir() if d.is_dir() and any(d.rglob("*.parquet"))}


def check_none_dropped(members: tuple[Any, ...], checkpoint: Path | None, where: str) -> None:
    """Refuse a spec whose topics (or pattern) leave out a table the pipeline has staged: it would be left behind
    without a word, and reading its topic again later would start where the checkpoint holds no state for it."""
    dropped = sorted(tables_staged(checkpoint) - {m.table for m in members})
    if dropped:
        raise ConfigError(
            where,
            f"no longer reads the topic of table {', '.join(dropped)}, which this pipeline has staged: a table "
            "once staged stays the pipeline's (its offsets, its state); read its topic still, or give the other "
            "topics a pipeline of their own (a new name)",
        )
