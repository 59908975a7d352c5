"""``krishiv skip-offsets``: an operator's explicit move past offsets the query cannot read exactly.

The Kafka source stops a query when offsets would move backwards (a topic deleted and re-created, a
fail-over to a mirror), when a batch's start was deleted by retention, or when the topic or cluster is not
the one the checkpoint began on. Nothing moves past that by itself. This command records, in the ledger,
that partition P of the query moves from the offset it is stuck at to the offset the operator names, with
the reason and who decided; the next batch starting there reads from the new offset (the ledger names
that batch, so a replay reads the same), and the snapshot that publishes that batch lists the skip in its
summary (``krishiv.skipped-offsets``). It holds the pipeline's stager lease while it records, so no query
runs meanwhile, and it re-pins the checkpoint's source identity when the topic was re-created.
"""

from __future__ import annotations

import getpass
import socket

from krishiv_core.errors import ConfigError, KrishivError
from krishiv_core.spec import KrishivSpec, PipelineSpec
from outbox.ledger import Ledger


def _operator() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def stuck_offsets(spec: KrishivSpec, pipeline: PipelineSpec, ledger: Ledger, source_changed: bool) -> dict[str, int]:
    """Where each partition of the query stands: the start of the first batch Spark has not finished.

    When the topic is not the one the checkpoint pinned (``source_changed``: re-created, another cluster), a batch
    Spark planned but did not finish that the ledger recorded (the driver stopped after recording it) is finished
    here: its entries stand, read from the old topic, and Spark must not read it again from one that cannot give it
    the same records; the skip applies to the batch after it. On the same topic the batch stays unfinished (a skip
    back from its end would read its offsets a second time)."""
    from spark_jobs.checkpoint import Checkpoint

    checkpoint = Checkpoint(spec.checkpoint_dir(pipeline))
    last = checkpoint.last_batch_id()
    if last < 0:
        return checkpoint.starting_offsets() or {}
    finished = checkpoint.committed_batch_ids()
    if not finished or finished[-1] < last:
        if not (source_changed and ledger.batch(checkpoint.query_id(), last)):
            return checkpoint.batch(last).start
        checkpoint.finish(last)
    return checkpoint.batch(last).end


def _topic(pipeline: PipelineSpec, topic: str | None) -> str:
    """The topic a skip names: ``--topic``, one of the pipeline's (needed when it reads several)."""
    if topic is None and pipeline.members:
        topics = list(pipeline.topics)
        raise ConfigError("--topic", f"pipeline {pipeline.name!r} reads several topics: name one of {topics}")
    if topic is not None and topic not in pipeline.topics:
        raise ConfigError("--topic", f"pipeline {pipeline.name!r} reads {list(pipeline.topics)}, not {topic!r}")
    return topic or pipeline.topic


def skip_offsets(
    spec: KrishivSpec, pipeline: PipelineSpec, partition: int, to_offset: int, reason: str, topic: str | None = None
):
    """Record the skip of ``partition`` (of ``topic``, for a pipeline over several) to ``to_offset``; returns the
    ledger's :class:`OffsetSkip`."""
    from krishiv.operations import open_ledger
    from outbox.lease import stager_lease
    from spark_jobs.checkpoint import Checkpoint
    from spark_jobs.kafka_source import KafkaAdmin

    if not reason.strip():
        raise ConfigError("--reason", "say why the offsets are skipped; it is kept in the ledger and the snapshot")
    checkpoint = Checkpoint(spec.checkpoint_dir(pipeline))
    if not (checkpoint.path / "metadata").exists():
        raise KrishivError(f"pipeline {pipeline.name!r} has no checkpoint at {checkpoint.path}: nothing to skip")
    topic = _topic(pipeline, topic)
    ledger = open_ledger(spec)
    with stager_lease(ledger, pipeline.name, "krishiv skip-offsets"):
        with KafkaAdmin(spec.kafka.bootstrap_servers, topic, spec.kafka.consumer_settings()) as admin:
            identity = admin.identity()
            pins = checkpoint.source_identity()
            pinned = (pins or {}).get(topic) if pipeline.members else pins
            stuck = stuck_offsets(spec, pipeline, ledger, source_changed=pinned is not None and pinned != identity)
            if pipeline.members:  # a source over several topics: its offsets by topic
                stuck = stuck.get(topic, {})
            key = str(partition)
            if key not in stuck:
                raise ConfigError(
                    "--partition", f"the query reads partitions {sorted(stuck, key=int)}, not {partition}"
                )
            low, high = admin.watermarks(partition)
        if not low <= to_offset <= high:
            raise ConfigError(
                "--to", f"{topic}/{partition} holds offsets [{low}, {high}) now; expected an offset in it"
            )
        if to_offset == stuck[key]:
            raise ConfigError("--to", f"{topic}/{partition} already stands at {to_offset}; nothing to skip")
        if pinned is not None and pinned != identity:
            was, now = (", ".join(f"{k} {v}" for k, v in sorted(i.items())) for i in (pinned, identity))
            reason = f"{reason} (source identity {was} -> {now})"
            checkpoint.pin_source_identity({**(pins or {}), topic: identity} if pipeline.members else identity)
        return ledger.record_skip(
            pipeline.name,
            checkpoint.query_id(),
            topic,
            key,
            stuck[key],
            to_offset,
            reason,
            _operator(),
        )
