"""The topics a pipeline's ``topic_pattern`` matches (docs/spec.md, "Several topics, one pipeline").

Read when the spec is loaded, from the broker's list of topics, as a registry pipeline's fields are read from its
subject: every command sees the pipeline's tables as they are now. What was matched is kept in the pipeline's
checkpoint folder (:data:`MATCHED_TOPICS_FILE`), so that

- a topic matched once stays a member of the pipeline (its table and its offsets are the pipeline's) even while the
  broker no longer lists it;
- the members keep the order in which they were first matched (a running query's columns follow it), a new topic
  joining at the end;
- commands that read no topic (``verify``, ``commit``…) still load the spec while the broker does not answer.

A running query looks for new matches every ``topic_discovery_interval`` (``spark_jobs.topics_source``) and starts
again with them (``krishiv run``), creating their tables: a table appears once its topic does, and Debezium makes a
table's topic with its first event.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from krishiv_core.errors import ConfigError

#: Where in a pipeline's checkpoint folder the topics its pattern matched are kept.
MATCHED_TOPICS_FILE = "krishiv/matched-topics.json"
#: How long a spec load waits for the broker's list of topics (seconds).
LIST_TIMEOUT_S = 5.0


class BrokerSilent(Exception):
    """The broker did not list its topics (a spec load then keeps the topics matched before)."""


def pattern_of(value: object, where: str) -> re.Pattern[str]:
    """``topic_pattern``: a regular expression a whole topic name must match (Kafka Connect's ``topics.regex``)."""
    if not isinstance(value, str) or not value:
        raise ConfigError(where, f"expected a regular expression of topic names, got {value!r}")
    try:
        return re.compile(value)
    except re.error as exc:
        raise ConfigError(where, f"not a regular expression: {value!r} ({exc})") from None


def matching(pattern: re.Pattern[str], names: Iterable[str], exclude: Iterable[str] = ()) -> list[str]:
    """The topics of ``names`` whose whole name ``pattern`` matches, sorted: never Kafka's internal topics (``__``)
    nor ``exclude`` (the transaction topic)."""
    left_out = set(exclude)
    return sorted(n for n in names if not n.startswith("__") and n not in left_out and pattern.fullmatch(n))


class BrokerTopics:
    """The names of every topic on a broker, asked once however often :meth:`names` is called."""

    def __init__(self, settings: Mapping[str, str], timeout_s: float = LIST_TIMEOUT_S) -> None:
        self.settings, self.timeout_s = dict(settings), timeout_s
        self.bootstrap = self.settings.get("bootstrap.servers", "?")
        self._names: frozenset[str] | None = None

    def names(self) -> frozenset[str]:
        """Raises :class:`BrokerSilent` when the broker does not answer within the timeout."""
        if self._names is None:
            from confluent_kafka import KafkaException
            from confluent_kafka.admin import AdminClient

            try:
                metadata = AdminClient({**self.settings, "log_level": 0}).list_topics(timeout=self.timeout_s)
            except KafkaException as exc:
                raise BrokerSilent(str(exc.args[0]) if exc.args else str(exc)) from None
            self._names = frozenset(metadata.topics)
        return self._names


def matched_topics(
    pattern: re.Pattern[str],
    broker: BrokerTopics | None,
    kept_in: Path | None,
    exclude: Iterable[str],
    where: str,
) -> tuple[str, ...]:
    """The pipeline's topics: those matched before (kept in ``kept_in``, in their order), then those the broker
    lists that match now. One :class:`ConfigError` line when none is known: none on the broker yet, or a broker that
    does not answer and nothing matched before."""
    kept: list[str] = []
    if kept_in is not None and kept_in.exists():
        doc = json.loads(kept_in.read_text())
        if doc.get("pattern") == pattern.pattern:  # a pattern changed in the spec matches afresh
            kept = [t for t in doc.get("topics", []) if t not in set(exclude)]
    if broker is None:
        found: list[str] = []
    else:
        try:
            found = matching(pattern, broker.names(), exclude)
        except BrokerSilent as exc:
            if kept:
                return tuple(kept)
            raise ConfigError(
                where,
                f"no topic matching '{pattern.pattern}' is known yet and the Kafka broker at {broker.bootstrap} did "
                f"not list its topics ({exc}): start the broker, then run the command again",
            ) from None
    topics = [*kept, *(t for t in found if t not in kept)]
    if not topics:
        on = f"on the Kafka broker at {broker.bootstrap} " if broker is not None else "known "
        raise ConfigError(
            where,
            f"no topic {on}matches '{pattern.pattern}' yet: start the connector that "
            "writes them, or correct topic_pattern (it must match a whole topic name)",
        )
    return tuple(topics)


def remember_matches(kept_in: Path | None, pattern: re.Pattern[str], topics: Iterable[str]) -> None:
    """Keep ``topics`` as the pattern's matches (once the pipeline they make has loaded without a mistake)."""
    if kept_in is None:
        return
    text = json.dumps({"pattern": pattern.pattern, "topics": list(topics)}, indent=1)
    if not kept_in.exists() or kept_in.read_text() != text:
        kept_in.parent.mkdir(parents=True, exist_ok=True)
        kept_in.write_text(text)
