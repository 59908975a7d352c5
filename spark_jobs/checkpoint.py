"""Reads of Spark's streaming checkpoint: the query id, each batch's offsets, and what Krishiv pins in it.

Spark writes ``offsets/<batch>`` before it runs a batch: a version line, a JSON line of batch metadata and
one line per source with the end offsets; ``commits/<batch>`` once the batch's sink returned. The start of
batch N is the end of batch N-1; batch 0 starts at the offsets Krishiv pins in
``krishiv/starting_offsets.json`` before the query first starts, so a batch id always means the same
range. Beside them Krishiv pins the identity of the Kafka cluster and topic the query began on
(``krishiv/source_identity.json``), so a re-created topic or another cluster is noticed, not read as if it
were the same log.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

STARTING_OFFSETS_FILE = "krishiv/starting_offsets.json"
SOURCE_IDENTITY_FILE = "krishiv/source_identity.json"


def _offsets(doc: dict) -> dict:
    """Offsets from their JSON: ``{partition: offset}``, or ``{topic: {partition: offset}}`` for several topics."""
    return {str(k): _offsets(v) if isinstance(v, dict) else int(v) for k, v in doc.items()}


@dataclass(frozen=True)
class BatchOffsets:
    """A batch's start and end offsets: ``{partition: offset}`` for one topic, ``{topic: {partition: offset}}``
    for a source over several."""

    batch_id: int
    start: dict
    end: dict

    def ranges(self) -> dict[str, list[int]]:
        """``{partition: [start, end]}``. A partition missing from ``start`` is new in this batch: the source ends it
        at its low watermark and reads nothing from it, so its range is ``[end, end]``."""
        return {p: [self.start.get(p, end), end] for p, end in sorted(self.end.items(), key=lambda kv: int(kv[0]))}

    @property
    def by_topic(self) -> bool:
        """Whether the offsets are a source's over several topics: ``{topic: {partition: offset}}``."""
        return any(isinstance(v, dict) for v in self.end.values())

    def topic_ranges(self, topic: str) -> dict[str, dict[str, list[int]]]:
        """``{topic: {partition: [start, end]}}``, as the ledger records a batch's offsets: ``topic``'s alone, or
        each topic's of a source over several (a topic new in this batch starts where it ends)."""
        if not self.by_topic:
            return {topic: self.ranges()}
        return {
            t: BatchOffsets(self.batch_id, self.start.get(t, {}), end).ranges() for t, end in sorted(self.end.items())
        }


class Checkpoint:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def query_id(self) -> str:
        return json.loads((self.path / "metadata").read_text())["id"]

    def has_batches(self) -> bool:
        return self.last_batch_id() >= 0

    def last_batch_id(self) -> int:
        """The newest batch of the offset log (planned, maybe not yet run), -1 if none."""
        offsets = self.path / "offsets"
        return max((int(p.name) for p in offsets.iterdir() if p.name.isdigit()), default=-1) if offsets.is_dir() else -1

    def committed_batch_ids(self) -> list[int]:
        """The batches Spark's commit log says finished (their sink returned), oldest first."""
        commits = self.path / "commits"
        return sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit()) if commits.is_dir() else []

    def finish(self, batch_id: int) -> None:
        """Write batch ``batch_id`` into Spark's commit log, as Spark does once the batch's sink returned (the query
        is stateless: no watermark of Spark's own). For a batch the ledger recorded whose topic can no longer give
        it the same records (``krishiv skip-offsets``): Spark must not run it again, its entries stand."""
        commits = self.path / "commits"
        commits.mkdir(exist_ok=True)
        temporary = commits / f".{batch_id}.krishiv.tmp"
        temporary.write_text('v1\n{"nextBatchWatermarkMs":0}')
        temporary.replace(commits / str(batch_id))

    def rewind(self, batches: int) -> int:
        """Forget the last ``batches`` batches' offsets and commits (with Spark's checksum files), as a restore
        of an older checkpoint would; Spark then plans and runs them again. Returns the last batch before."""
        last = self.last_batch_id()
        for batch in range(last, max(-1, last - batches), -1):
            for log in ("offsets", "commits"):
                for name in (str(batch), f".{batch}.crc"):
                    (self.path / log / name).unlink(missing_ok=True)
        return last

    def starting_offsets(self) -> dict | None:
        f = self.path / STARTING_OFFSETS_FILE
        return _offsets(json.loads(f.read_text())) if f.exists() else None

    def pin_starting_offsets(self, offsets: dict) -> None:
        self._pin(STARTING_OFFSETS_FILE, offsets)

    def source_identity(self) -> dict | None:
        """``{"cluster_id", "topic_id"}``, or one such per topic for a source over several."""
        f = self.path / SOURCE_IDENTITY_FILE
        return json.loads(f.read_text()) if f.exists() else None

    def pin_source_identity(self, identity: dict) -> None:
        self._pin(SOURCE_IDENTITY_FILE, identity)

    def _pin(self, name: str, doc: dict) -> None:
        f = self.path / name
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_name(f".{f.name}.{uuid.uuid4().hex}.tmp")
        tmp.write_text(json.dumps(doc, sort_keys=True))
        tmp.replace(f)

    def _end_offsets(self, batch_id: int) -> dict:
        lines = (self.path / "offsets" / str(batch_id)).read_text().splitlines()
        source = lines[2] if len(lines) > 2 else "{}"
        return _offsets(json.loads(source))

    def batch(self, batch_id: int) -> BatchOffsets:
        start = (self.starting_offsets() or {}) if batch_id == 0 else self._end_offsets(batch_id - 1)
        return BatchOffsets(batch_id, start, self._end_offsets(batch_id))
