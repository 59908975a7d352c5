"""Reads of Spark's streaming checkpoint: the query id and each batch's offsets and watermarks.

Spark writes ``offsets/<batch>`` before it runs a batch: a version line, a JSON line of batch metadata
(including ``batchWatermarkMs``, the watermark the batch runs with) and one line per source with the end
offsets. Since SPARK-40925 a stateful operator drops input rows as late with the watermark of the batch
before (and evicts state with the batch's own), so both are read. The start of batch N is the end of
batch N-1; batch 0 starts at the offsets Krishiv pins in ``krishiv/starting_offsets.json`` before the
query first starts, so a batch id always means the same range.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

STARTING_OFFSETS_FILE = "krishiv/starting_offsets.json"


@dataclass(frozen=True)
class BatchOffsets:
    batch_id: int
    start: dict[str, int]
    end: dict[str, int]
    watermark_ms: int
    late_watermark_ms: int  # the previous batch's watermark: rows at or behind it are dropped as late

    def ranges(self) -> dict[str, list[int]]:
        """``{partition: [start, end]}``. A partition missing from ``start`` is new in this batch: the source ends it
        at its low watermark and reads nothing from it, so its range is ``[end, end]``."""
        return {p: [self.start.get(p, end), end] for p, end in sorted(self.end.items(), key=lambda kv: int(kv[0]))}

    @property
    def records(self) -> int:
        """The offsets the batch spans: an upper bound on its records, not their count (transaction markers,
        aborted and compacted-away records take offsets and hold no record). Count rows for metrics."""
        return sum(end - start for start, end in self.ranges().values())


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

    def rewind(self, batches: int) -> int:
        """Forget the last ``batches`` batches' offsets and commits (with Spark's checksum files), as a restore
        of an older checkpoint would; Spark then plans and runs them again. Returns the last batch before."""
        last = self.last_batch_id()
        for batch in range(last, max(-1, last - batches), -1):
            for log in ("offsets", "commits"):
                for name in (str(batch), f".{batch}.crc"):
                    (self.path / log / name).unlink(missing_ok=True)
        return last

    def starting_offsets(self) -> dict[str, int] | None:
        f = self.path / STARTING_OFFSETS_FILE
        return {k: int(v) for k, v in json.loads(f.read_text()).items()} if f.exists() else None

    def pin_starting_offsets(self, offsets: dict[str, int]) -> None:
        f = self.path / STARTING_OFFSETS_FILE
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_suffix(".tmp")
        tmp.write_text(json.dumps(offsets, sort_keys=True))
        tmp.replace(f)

    def _offset_log(self, batch_id: int) -> tuple[dict, dict[str, int]]:
        lines = (self.path / "offsets" / str(batch_id)).read_text().splitlines()
        metadata = json.loads(lines[1])
        source = lines[2] if len(lines) > 2 else "{}"
        return metadata, {str(k): int(v) for k, v in json.loads(source).items()}

    def batch(self, batch_id: int) -> BatchOffsets:
        metadata, end = self._offset_log(batch_id)
        if batch_id == 0:
            start, late_watermark = self.starting_offsets() or {}, 0
        else:
            previous, start = self._offset_log(batch_id - 1)
            late_watermark = int(previous.get("batchWatermarkMs", 0))
        return BatchOffsets(batch_id, start, end, int(metadata.get("batchWatermarkMs", 0)), late_watermark)
