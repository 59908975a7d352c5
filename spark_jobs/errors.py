"""Domain exceptions of the Spark side."""

from __future__ import annotations

from krishiv.errors import KrishivError


class KafkaSourceError(KrishivError):
    """The Kafka source cannot deliver a batch's exact offsets (data deleted, broker gone, bad options)."""


class OffsetsDeleted(KafkaSourceError):
    """Offsets a batch must read were removed by retention: reading on would silently lose data."""


class CheckpointMismatch(KrishivError):
    """The Spark checkpoint and the ledger describe different histories of the same pipeline."""


class WindowStateMissing(CheckpointMismatch):
    """The open windows a batch starts from are not in the checkpoint (a partial copy, or older than kept)."""
