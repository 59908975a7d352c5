"""Merge-on-read: Iceberg v2 position delete files, written from Python and read back as every reader applies them.

A merge whose keys are spread over a table would rewrite nearly every file it touches (copy-on-write): the cost of
a batch grows with the table. With merge-on-read the relay instead writes, per partition, one Parquet *position
delete* file naming ``(file_path, pos)`` of each table row the batch replaces or deletes, and commits it with the
batch's data files in one snapshot: nothing of the table is rewritten, and compaction (``outbox/compaction.py``)
later folds the deletes into rewritten data files.

pyiceberg 0.12 reads position deletes (its scans apply them) but writes none, so this module is the one place that
does, following the spec: the delete file's columns are ``file_path`` (field id 2147483546) and ``pos``
(2147483545), rows sorted by path then position; its ``DataFile`` has content ``POSITION_DELETES``, the partition
of the data files it names (one delete file per partition), and bounds on ``file_path`` so a reader applies it only
to the files in its range; it goes in a manifest of content ``DELETES`` (:class:`DeleteManifestWriter`).
``tests/outbox/test_position_deletes.py`` reads the result back with pyiceberg and breaks if pyiceberg's manifest
or delete-file API moves (the canary).

A table's mode follows Iceberg's own property ``write.merge.mode`` (as Spark's does): ``merge-on-read``, Krishiv's
default, or ``copy-on-write``.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestContent, ManifestWriterV2
from pyiceberg.table import Table, TableProperties
from pyiceberg.typedef import Record

#: Iceberg's reserved field ids of a position delete file's columns.
PATH_FIELD_ID = 2147483546
POS_FIELD_ID = 2147483545
DELETE_SCHEMA = pa.schema(
    [
        pa.field(
            "file_path",
            pa.dictionary(pa.int32(), pa.string()),  # a string column in Parquet, dictionary-encoded
            nullable=False,
            metadata={b"PARQUET:field_id": str(PATH_FIELD_ID)},
        ),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_FIELD_ID)}),
    ]
)
#: Iceberg's table property choosing how merges are written, and its values.
MERGE_MODE = "write.merge.mode"
MERGE_ON_READ = "merge-on-read"
COPY_ON_WRITE = "copy-on-write"


def merge_on_read(table: Table) -> bool:
    """Whether merges into ``table`` write position deletes (``write.merge.mode``, merge-on-read unless set to
    copy-on-write); a v1 table has no delete files."""
    return table.metadata.format_version >= 2 and table.properties.get(MERGE_MODE, MERGE_ON_READ) != COPY_ON_WRITE


class DeleteManifestWriter(ManifestWriterV2):
    """pyiceberg's v2 manifest writer for a manifest of delete files (content ``DELETES``)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


def write_position_deletes(table: Table, deletes: pa.Table, files: Mapping[str, DataFile]) -> list[DataFile]:
    """Write ``deletes`` (``file_path``, plain or dictionary-encoded, and ``pos``: rows of the data files ``files``
    maps by path) as one position delete file per partition of those files; returns their ``DataFile``s, nothing
    committed. Paths stay dictionary-encoded and rows are sorted by each path's rank, so a million deletes cost no
    million strings."""
    if deletes.num_rows == 0:
        return []
    column = deletes["file_path"].combine_chunks()
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    paths: list[str] = column.dictionary.to_pylist()
    rank_of = _ranks(paths)
    indices = column.indices.cast(pa.int32())
    groups: dict[tuple[int, Record], list[int]] = defaultdict(list)
    for i in pc.unique(indices).to_pylist():
        f = files[paths[i]]
        groups[(f.spec_id, f.partition)].append(i)
    codec = table.properties.get(TableProperties.PARQUET_COMPRESSION, TableProperties.PARQUET_COMPRESSION_DEFAULT)
    dictionary = pa.array(paths, pa.string())
    written: list[DataFile] = []
    for (spec_id, partition), members in groups.items():
        rows = pa.table({"i": indices, "pos": deletes["pos"].combine_chunks().cast(pa.int64())})
        rows = rows.filter(pc.is_in(rows["i"], pa.array(members, pa.int32())))
        rows = rows.append_column("rank", rank_of.take(rows["i"])).sort_by(
            [("rank", "ascending"), ("pos", "ascending")]
        )
        out = pa.table(
            [pa.DictionaryArray.from_arrays(rows["i"].combine_chunks(), dictionary), rows["pos"]],
            schema=DELETE_SCHEMA,
        )
        location = table.location_provider().new_data_location(f"{uuid.uuid4()}-deletes.parquet")
        output = table.io.new_output(location)
        written_metadata: list[pq.FileMetaData] = []
        with output.create(overwrite=False) as stream:
            pq.write_table(out, stream, compression=codec, metadata_collector=written_metadata)
        (metadata,) = written_metadata
        sizes = [
            sum(metadata.row_group(g).column(c).total_compressed_size for g in range(metadata.num_row_groups))
            for c in range(2)
        ]
        size = len(table.io.new_input(location))
        named = [paths[i] for i in members]
        first, last = min(named), max(named)
        positions = pc.min_max(out["pos"])
        delete_file = DataFile.from_args(
            content=DataFileContent.POSITION_DELETES,
            file_path=location,
            file_format=FileFormat.PARQUET,
            partition=partition,
            record_count=out.num_rows,
            file_size_in_bytes=size,
            column_sizes={PATH_FIELD_ID: sizes[0], POS_FIELD_ID: sizes[1]},
            value_counts={PATH_FIELD_ID: out.num_rows, POS_FIELD_ID: out.num_rows},
            null_value_counts={PATH_FIELD_ID: 0, POS_FIELD_ID: 0},
            lower_bounds={PATH_FIELD_ID: first.encode(), POS_FIELD_ID: _long(positions["min"].as_py())},
            upper_bounds={PATH_FIELD_ID: last.encode(), POS_FIELD_ID: _long(positions["max"].as_py())},
            sort_order_id=None,
            equality_ids=None,
            key_metadata=None,
        )
        delete_file.spec_id = spec_id  # not a field of the struct: from_args would drop it
        written.append(delete_file)
    return written


def _ranks(paths: list[str]) -> pa.Array:
    """Each path's place in sorted order (the spec sorts a delete file's rows by path, then position)."""
    ranks = [0] * len(paths)
    for place, i in enumerate(sorted(range(len(paths)), key=paths.__getitem__)):
        ranks[i] = place
    return pa.array(ranks, pa.int32())


def _long(value: int) -> bytes:
    return int(value).to_bytes(8, "little", signed=True)


class DeletedPositions:
    """The positions position delete files delete, each delete file read once (a merge's plan asks for every file
    a delete file names)."""

    def __init__(self, io: FileIO) -> None:
        self._io = io
        self._read: dict[str, dict[str, pa.Array]] = {}

    def of(self, delete_files: Iterable[DataFile], path: str) -> pa.Array:
        """The positions of data file ``path`` that ``delete_files`` delete."""
        found = []
        for f in delete_files:
            if f.file_path not in self._read:
                self._read[f.file_path] = _by_data_file(self._io, f)
            if path in self._read[f.file_path]:
                found.append(self._read[f.file_path][path])
        return pa.concat_arrays(found) if found else pa.array([], pa.int64())


def _by_data_file(io: FileIO, delete_file: DataFile) -> dict[str, pa.Array]:
    if delete_file.content != DataFileContent.POSITION_DELETES:
        raise ValueError(f"{delete_file.file_path}: equality deletes are not supported (content {delete_file.content})")
    with io.new_input(delete_file.file_path).open() as stream:
        rows = pq.read_table(stream, columns=["file_path", "pos"])
    paths = rows["file_path"].combine_chunks()
    positions = rows["pos"].combine_chunks().cast(pa.int64())
    return {path: positions.filter(pc.equal(paths, path)) for path in pc.unique(paths).to_pylist()}


def delete_files_by_data_file(table: Table, snapshot_id: int | None = None) -> dict[str, frozenset[DataFile]]:
    """The delete files that apply to each data file of a snapshot (the current one by default), as pyiceberg's scan
    matches them (partition, sequence number, path bounds); empty, without planning a scan, when it has none."""
    snapshot = table.current_snapshot() if snapshot_id is None else table.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None or not any(m.content == ManifestContent.DELETES for m in snapshot.manifests(table.io)):
        return {}
    tasks = table.scan(snapshot_id=snapshot.snapshot_id).plan_files()
    return {t.file.file_path: frozenset(t.delete_files) for t in tasks if t.delete_files}


def referenced_paths(io: FileIO, delete_file: DataFile) -> set[str]:
    """The data files a position delete file names."""
    with io.new_input(delete_file.file_path).open() as stream:
        return set(pc.unique(pq.read_table(stream, columns=["file_path"])["file_path"]).to_pylist())
