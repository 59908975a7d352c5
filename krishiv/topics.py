"""``krishiv topic list|describe|create``: the broker's topics as a user starting a pipeline needs to see them,
through the spec's Kafka settings (``[kafka.properties]``: security, secrets resolved)."""

from __future__ import annotations

from dataclasses import dataclass

from krishiv.produce import ensure_topic
from krishiv_core.errors import ConfigError
from krishiv_core.spec import KrishivSpec
from spark_jobs.kafka_source import KafkaAdmin

METADATA_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class PartitionView:
    partition: int
    earliest: int
    latest: int

    @property
    def records(self) -> int:
        """Offsets between the watermarks (transaction markers and compacted gaps count too)."""
        return self.latest - self.earliest


@dataclass(frozen=True)
class TopicView:
    name: str
    topic_id: str | None
    partitions: tuple[PartitionView, ...]
    read_by: tuple[str, ...]  # the spec's pipelines that read it


def topic_names(spec: KrishivSpec) -> dict[str, int]:
    """Every topic on the broker but its internal ones, with its partition count."""
    from confluent_kafka.admin import AdminClient

    from spark_jobs.kafka_clients import KafkaProblems, build, list_topics

    config = spec.kafka.client_settings()
    problems = KafkaProblems(config)
    admin = build(AdminClient, config, problems)
    metadata = list_topics(admin, problems, spec.kafka.bootstrap_servers, METADATA_TIMEOUT_S)
    return {name: len(t.partitions) for name, t in sorted(metadata.topics.items()) if not name.startswith("__")}


def describe_topic(spec: KrishivSpec, name: str) -> TopicView:
    """The topic's id and each partition's watermarks; one line when the broker does not have it."""
    if name not in topic_names(spec):
        raise ConfigError("topic", f"no topic {name!r} on {spec.kafka.bootstrap_servers}: krishiv topic create {name}")
    with KafkaAdmin(spec.kafka.bootstrap_servers, name, spec.kafka.consumer_settings()) as admin:
        partitions = tuple(PartitionView(p, *admin.watermarks(p)) for p in admin.partitions())
        topic_id = admin.topic_id()
    return TopicView(name, topic_id, partitions, tuple(p.name for p in spec.pipelines if name in p.topics))


def create_topic(spec: KrishivSpec, name: str, partitions: int) -> tuple[int, bool]:
    """(the topic's partition count, whether this call created it)."""
    existing = topic_names(spec)
    if name in existing:
        return existing[name], False
    count = ensure_topic(spec.kafka.bootstrap_servers, name, partitions, settings=spec.kafka.client_settings())
    return count, True
