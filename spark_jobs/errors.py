"""Domain exceptions of the Spark side."""

from __future__ import annotations

from krishiv_core.errors import KrishivError


class KafkaSourceError(KrishivError):
    """The Kafka source cannot deliver a batch's exact offsets (data deleted, broker gone, bad options)."""


class TopicMissing(KafkaSourceError):
    """The broker answers and does not have the topic (deleted; or lost with a restart of a broker that keeps its
    topics in memory, as ``krishiv broker`` does)."""


class OffsetsDeleted(KafkaSourceError):
    """Offsets a batch must read were removed by retention: reading on would silently lose data."""


class OffsetsMovedBackwards(KafkaSourceError):
    """A partition's high watermark is below the offset a batch starts from (topic re-created, a fail-over to a
    mirror): reading on from the broker's offsets would silently skip or re-read records."""


class SourceChanged(KafkaSourceError):
    """The topic or cluster is not the one the query's checkpoint began on (its topic id or cluster id differs)."""


class CheckpointMismatch(KrishivError):
    """The Spark checkpoint and the ledger describe different histories of the same pipeline."""


class WindowStateMissing(CheckpointMismatch):
    """The open windows a batch starts from are not in the checkpoint (a partial copy, or older than kept)."""


class DeleteMemoryMissing(CheckpointMismatch):
    """The deletes an upsert batch must remember are not in the checkpoint (a partial copy, or older than kept)."""


class HeldRowsMissing(CheckpointMismatch):
    """The change events waiting for their source transactions after the previous batch are not in the checkpoint."""


class NewWriterSchema(KafkaSourceError):
    """A batch holds records of a schema version registered after the one the pipeline's fields were taken from, with
    fields the query does not read: the batch stops before anything is staged, and ``krishiv run`` starts the query
    again with the subject's latest fields (``krishiv_core.spec.with_latest_fields``), from its checkpoint."""


class TopicsAppeared(KafkaSourceError):
    """New topics match a running pipeline's ``topic_pattern``: the query stops before it plans a batch, and ``krishiv
    run`` starts it again with their tables (``krishiv_core.spec.with_latest_fields``), from its checkpoint."""
