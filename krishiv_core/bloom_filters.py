"""Parquet Bloom filters on an upsert table's key columns: written with the files Krishiv writes, probed by the merge.

A merge must find the table rows holding a batch's keys (``outbox/merge.py``). Column statistics rule out a file
only when its keys' [min, max] misses the batch's, which random keys (UUIDs, hashes) or new keys spread over the
key space never do. A Bloom filter per row group and key column answers "may this row group hold any of these
keys?" with no false negatives: the merge skips every file whose filters say no, and reads the key columns of
the others as before.

Writing is pyarrow's (``bloom_filter_options``, pyarrow ≥ 24). pyarrow does not read the filters back, and no
maintained Python library does, so the probe is here: Parquet's split-block Bloom filter (parquet-format's
BloomFilter.md) over xxHash64 (seed 0) of each value's plain encoding: 8 little-endian bytes for INT64, 4 for INT32,
the bytes themselves for a string. Filters are read from the file's footer offsets and kept per file path (data
files never change: :mod:`krishiv_core.file_cache`), bounded by :data:`CACHE_BYTES`. The canary test
(tests/krishiv_core/test_bloom_filters.py) checks the probe against DuckDB's own reading of the same filters.

Only top-level key columns of ``int``/``long``/``string``/``date``/``timestamp`` types get a filter; any other key
(a path inside a struct, a decimal) keeps the merge's statistics pruning only.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash
from pyiceberg.io import FileIO

from krishiv_core.file_cache import FileCache

#: The false-positive rate each filter is sized for (pyarrow sizes it for the row group's rows at most: about
#: 2.5 bytes a key here). A merge asks a file's filter about every key of its batch, so a file holding none of
#: them is read anyway with a probability of about keys × FPP: 3% for a continuous batch of 300 keys, most files
#: for a catch-up batch of 10,000 keys spread over the table (the merge then costs what it cost without filters).
FPP = 0.0001
#: Filters kept in memory by a process, in bytes (least recently used first out).
CACHE_BYTES = 256 * 1024 * 1024
_SALT = np.array(
    [0x47B6137B, 0x44974D91, 0x8824AD5B, 0xA2B7289D, 0x705495C7, 0x2DF1424B, 0x9EFC4947, 0x5C6BFB31], dtype=np.uint32
)


def filtered(arrow_type: pa.DataType) -> bool:
    """Whether a key column of this Arrow type gets a Bloom filter."""
    return (
        arrow_type in (pa.int64(), pa.int32(), pa.date32())
        or pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)  # how pyiceberg's schemas give a string column
        or pa.types.is_timestamp(arrow_type)
    )


def writer_options(schema: pa.Schema, key_columns: Sequence[str], rows: int) -> dict[str, dict[str, float]] | None:
    """pyarrow's ``bloom_filter_options`` for a file of ``rows`` rows: a filter on each key column that gets one."""
    columns = {
        name: {"ndv": max(rows, 1), "fpp": FPP}
        for name in key_columns
        if name in schema.names and filtered(schema.field(name).type)
    }
    return columns or None


def key_hashes(values: pa.Array | pa.ChunkedArray, physical: str) -> np.ndarray | None:
    """xxHash64 of each value's plain Parquet encoding as a column of ``physical`` type holds it (no nulls), or None
    where the values are not of that physical type (a column widened since the file was written: ``int`` keys in
    an INT32 file, the table's ``long`` now), which the filter cannot answer for."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if values.null_count:
        raise ValueError("key values hold a null")
    t = values.type
    if (pa.types.is_string(t) or pa.types.is_large_string(t)) and physical == "BYTE_ARRAY":
        encoded = [v.encode() for v in values.to_pylist()]
    elif (t == pa.int64() or pa.types.is_timestamp(t)) and physical == "INT64":
        encoded = [struct.pack("<q", v) for v in values.cast(pa.int64()).to_pylist()]
    elif t in (pa.int32(), pa.date32()) and physical == "INT32":
        encoded = [struct.pack("<i", v) for v in values.cast(pa.int32()).to_pylist()]
    else:
        return None
    return np.fromiter((xxhash.xxh64_intdigest(b) for b in encoded), dtype=np.uint64, count=len(encoded))


class KeyHashes:
    """A batch's keys hashed for the filters, per key column and physical type, each computed once."""

    def __init__(self, keys: pa.Table) -> None:
        self.keys = keys
        self._hashes: dict[tuple[str, str], np.ndarray | None] = {}

    def of(self, column: str, physical: str) -> np.ndarray | None:
        if (column, physical) not in self._hashes:
            self._hashes[column, physical] = key_hashes(self.keys.column(column), physical)
        return self._hashes[column, physical]


def may_hold(bitset: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """Per hash, whether the split-block filter ``bitset`` (uint32 words, 8 per 32-byte block) may hold it."""
    blocks = bitset.reshape(-1, 8)
    high = (hashes >> np.uint64(32)).astype(np.uint64)
    index = ((high * np.uint64(len(blocks))) >> np.uint64(32)).astype(np.int64)
    key = (hashes & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    masks = np.left_shift(np.uint32(1), ((key[:, None] * _SALT[None, :]) >> np.uint32(27)).astype(np.uint32))
    return np.all((blocks[index] & masks) != 0, axis=1)


@dataclass(frozen=True)
class FileFilters:
    """A data file's Bloom filters: per row group, the filter of each key column that has one, with the column's
    Parquet physical type (what its values' hashes are of)."""

    row_groups: tuple[dict[str, tuple[str, np.ndarray]], ...]

    @property
    def bytes(self) -> int:
        return sum(bits.nbytes for g in self.row_groups for _, bits in g.values())

    def may_hold_any(self, keys: KeyHashes) -> bool:
        """Whether any row group may hold one of the keys: a key whose every key column's value its filter on that
        column may hold. A column without a filter, or whose values cannot be hashed as the file holds them, may
        hold any value."""
        for group in self.row_groups:
            possible: np.ndarray | None = None
            for name, (physical, bits) in group.items():
                hashes = keys.of(name, physical)
                if hashes is None:
                    continue
                found = may_hold(bits, hashes)
                possible = found if possible is None else possible & found
            if possible is None or bool(possible.any()):
                return True
        return False


def read_filters(io: FileIO, path: str, key_columns: Sequence[str]) -> FileFilters | None:
    """The file's filters on ``key_columns`` (top-level), or None when a row group has none on any of them."""
    with io.new_input(path).open() as stream:
        metadata = pq.ParquetFile(stream).metadata
        names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
        wanted = {i: n for i, n in enumerate(names) if n in key_columns}
        groups = []
        for g in range(metadata.num_row_groups):
            filters: dict[str, tuple[str, np.ndarray]] = {}
            for i, name in wanted.items():
                column = metadata.row_group(g).column(i)
                offset, length = column.bloom_filter_offset, column.bloom_filter_length
                if not offset or not length:
                    continue
                stream.seek(offset)
                try:
                    filters[name] = (column.physical_type, _bitset(stream.read(length)))
                except ValueError:  # a filter of a form this probe does not read (another writer's): none
                    continue
            if not filters:
                return None
            groups.append(filters)
    return FileFilters(tuple(groups))


def _bitset(data: bytes) -> np.ndarray:
    """The bitset of a serialized filter: a Thrift compact ``BloomFilterHeader`` whose first field is the bitset's
    size (``numBytes``), then the bitset."""
    if data[0] != 0x15:  # field 1, i32
        raise ValueError("not a Parquet Bloom filter header")
    size, shift, i = 0, 0, 1
    while True:
        byte = data[i]
        size |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            break
        shift += 7
    size = (size >> 1) ^ -(size & 1)  # zigzag
    if size <= 0 or size % 32 or size > len(data):
        raise ValueError("a Parquet Bloom filter of an unexpected size")
    return np.frombuffer(data[len(data) - size :], dtype="<u4")


#: The process's filters, by file path and key columns (the relay's merges).
FILTERS: FileCache[FileFilters | None] = FileCache(CACHE_BYTES, lambda filters: filters.bytes if filters else 0)
