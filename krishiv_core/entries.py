"""What phase 1 hands phase 2: a batch's staged output for one table, and how the relay must commit it.

The Spark side builds these values and the ledger stores them; neither imports the other. An entry names its
files and, in :class:`CommitOperation`, the one choice phase 2 makes per output: register the files as a plain
append, or merge them (``MERGE INTO``: the table's rows with the entry's keys are replaced by the entry's rows,
keys staged as ``delete-keys`` are deleted, and keys staged as ``versioned-delete-keys`` are deleted unless the
table's row has a higher version). ``outbox.relay`` turns the operation into snapshots in one place.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

PENDING = "PENDING"
COMMITTED = "COMMITTED"

#: Per topic, per partition: ``[start, end)`` of the offsets a batch read.
OffsetRanges = dict[str, dict[str, list[int]]]

#: A staged file's content: rows the table receives; the key columns of rows the commit deletes whatever their
#: version (a tombstone); or the key and version columns of a delete that loses to a table row of a higher version
#: (a ``delete_field`` event).
DATA = "data"
DELETE_KEYS = "delete-keys"
VERSIONED_DELETE_KEYS = "versioned-delete-keys"

#: Commit operations.
APPEND = "append"
MERGE = "merge"


def new_snapshot_id() -> int:
    """A random positive 63-bit id, as Iceberg's Java and Python implementations draw them."""
    return secrets.randbits(63) or 1


@dataclass(frozen=True)
class StagedFile:
    path: str
    records: int
    bytes: int
    content: str = DATA

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "records": self.records, "bytes": self.bytes}
        if self.content != DATA:
            out["content"] = self.content
        return out


@dataclass(frozen=True)
class CommitOperation:
    """How phase 2 commits an entry: ``append`` its files, or ``merge`` them on ``key`` (latest ``version`` wins)."""

    kind: str = APPEND
    key: tuple[str, ...] = ()
    version: str | None = None  # a merge keeps the table's row where its version is higher than the entry's

    def __post_init__(self) -> None:
        if self.kind not in (APPEND, MERGE):
            raise ValueError(f"commit operation {self.kind!r}: expected {APPEND!r} or {MERGE!r}")
        if (self.kind == MERGE) != bool(self.key):
            raise ValueError("a merge needs key columns, and an append takes none")

    def to_json(self) -> dict[str, Any] | None:
        if self.kind == APPEND:
            return None
        return {"kind": self.kind, "key": list(self.key), "version": self.version}

    @classmethod
    def from_json(cls, doc: dict[str, Any] | None) -> CommitOperation:
        if not doc:
            return cls()
        return cls(doc["kind"], tuple(doc["key"]), doc.get("version"))


@dataclass(frozen=True)
class OutboxEntry:
    """One batch's output for one table, as staged by the Spark job."""

    query_id: str
    pipeline: str
    table: str
    batch_id: int
    offsets: OffsetRanges
    files: tuple[StagedFile, ...]
    intended_snapshot_id: int
    metrics: dict[str, int] = field(default_factory=dict)
    status: str = PENDING
    committed_snapshot_id: int | None = None
    created_at: datetime | None = None
    committed_at: datetime | None = None
    operation: CommitOperation = CommitOperation()
    #: The Iceberg schema id of the table schema the files were staged for (their field ids); None if unknown.
    schema_id: int | None = None
    #: The Kafka topic id (incarnation) the batch was read from, as pinned in the checkpoint; None if the broker
    #: reports none, or for entries staged before Krishiv recorded it.
    topic_id: str | None = None
    #: The Iceberg schema (its JSON) the files were staged for, when it changes the table's: phase 1 applies it right
    #: after recording the entry, and the relay brings the table to it before committing the batch if that did not
    #: happen (the stager died in between). None when the table already had it.
    schema_change: str | None = None

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.query_id, self.table, self.batch_id)

    @property
    def record_count(self) -> int:
        """Rows the table receives (delete-key files carry keys, not rows)."""
        return sum(f.records for f in self.files if f.content == DATA)

    @property
    def data_files(self) -> tuple[StagedFile, ...]:
        return tuple(f for f in self.files if f.content == DATA)

    @property
    def delete_key_files(self) -> tuple[StagedFile, ...]:
        return tuple(f for f in self.files if f.content == DELETE_KEYS)

    @property
    def versioned_delete_files(self) -> tuple[StagedFile, ...]:
        return tuple(f for f in self.files if f.content == VERSIONED_DELETE_KEYS)

    @property
    def changes_nothing(self) -> bool:
        """Nothing to publish: no rows to add and no keys to delete."""
        return not any(f.records for f in self.files)


@dataclass(frozen=True)
class OffsetSkip:
    """An operator's decision to move a query's partition from one offset to another, past what cannot be read."""

    pipeline: str
    query_id: str
    topic: str
    partition: str
    from_offset: int
    to_offset: int
    reason: str
    operator: str
    created_at: datetime
    applied_batch_id: int | None = None
