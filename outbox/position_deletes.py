"""Merge-on-read: Iceberg v2 position delete files, written from Python and read back as every reader applies them.

A merge whose keys are spread over a table would rewrite nearly every file it touches (copy-on-write): the cost of
a batch grows with the table. With merge-on-read the relay instead writes, per table file it touches, one Parquet
*position delete* file naming ``(file_path, pos)`` of each row of that file the batch replaces or deletes, and
commits them with the batch's data files in one snapshot: nothing of the table is rewritten, and compaction
(``outbox/compaction.py``) later folds the deletes into rewritten data files.

pyiceberg 0.12 reads position deletes (its scans apply them) but writes none, so this module is the one place that
does, following the spec: the delete file's columns are ``file_path`` (field id 2147483546) and ``pos``
(2147483545), rows sorted by position; its ``DataFile`` has content ``POSITION_DELETES``, the partition of the data
file it names, and that file's path as both bounds of ``file_path``; it goes in a manifest of content ``DELETES``
(:class:`DeleteManifestWriter`), which also records that path as the entry's ``referenced_data_file`` (field 143, which
pyiceberg 0.12 knows for v3 tables only). ``tests/outbox/test_position_deletes.py`` reads the result back with
pyiceberg and breaks if pyiceberg's manifest or delete-file API moves (the canary).

What keeps the files readable by every engine (``tests/outbox/test_other_engines.py`` reads them with polars' own
reader and DuckDB's): each delete file names ONE data file, so a reader applies it to that file without reading it
first (polars' native reader refuses a delete file whose ``file_path`` bounds differ, and Iceberg Java's
``referenced_data_file`` says the same); and ``file_path`` is a plain string column. pyarrow would record a
dictionary-typed column as such in the Arrow schema it stores in the footer (``ARROW:schema``), which polars reads
back as Categorical and then refuses to compare with the path; the footer here has no Arrow schema, only Parquet's,
as Iceberg Java writes it, while the column is still dictionary-encoded in the file and in memory.

A table's mode follows Iceberg's own property ``write.merge.mode`` (as Spark's does): ``merge-on-read``, Krishiv's
default, or ``copy-on-write``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties
from pyiceberg.typedef import TableVersion
from pyiceberg.types import NestedField, StructType

from krishiv_core.file_cache import FileCache

#: Iceberg's reserved field ids of a position delete file's columns.
PATH_FIELD_ID = 2147483546
POS_FIELD_ID = 2147483545
#: A delete file's columns. ``file_path`` is given dictionary-encoded (one path, its index per row) and written
#: without pyarrow's Arrow schema in the footer, so every reader sees the Parquet string column it is.
DELETE_SCHEMA = pa.schema(
    [
        pa.field(
            "file_path",
            pa.dictionary(pa.int32(), pa.string()),
            nullable=False,
            metadata={b"PARQUET:field_id": str(PATH_FIELD_ID)},
        ),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_FIELD_ID)}),
    ]
)
#: The manifest field naming the one data file a delete file applies to (Iceberg spec, ``data_file`` field 143,
#: optional in v2). pyiceberg 0.12 defines it in its v3 data file type only.
REFERENCED_DATA_FILE_ID = 143
#: The field id of a manifest entry's ``data_file``.
DATA_FILE_FIELD_ID = 2
#: Iceberg's table property choosing how merges are written, and its values.
MERGE_MODE = "write.merge.mode"
MERGE_ON_READ = "merge-on-read"
COPY_ON_WRITE = "copy-on-write"


def merge_on_read(table: Table) -> bool:
    """Whether merges into ``table`` write position deletes (``write.merge.mode``, merge-on-read unless set to
    copy-on-write); a v1 table has no delete files."""
    return table.metadata.format_version >= 2 and table.properties.get(MERGE_MODE, MERGE_ON_READ) != COPY_ON_WRITE


class DeleteManifestWriter(ManifestWriterV2):
    """pyiceberg's v2 manifest writer for a manifest of delete files (content ``DELETES``), whose entries also carry
    ``referenced_data_file``: the path of the one data file a delete file names, known from its ``file_path``
    bounds, so entries pyiceberg read back (without the field) keep it when a compaction rewrites their manifest."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}

    def _with_partition(self, format_version: TableVersion) -> Schema:
        """pyiceberg's manifest entry schema (the file's and the record's), with field 143 last in ``data_file``."""
        schema = super()._with_partition(format_version)
        (referenced,) = [f for f in DATA_FILE_TYPE[3].fields if f.field_id == REFERENCED_DATA_FILE_ID]
        fields = []
        for f in schema.fields:
            if f.field_id == DATA_FILE_FIELD_ID and isinstance(f.field_type, StructType):
                f = NestedField(f.field_id, f.name, StructType(*f.field_type.fields, referenced), required=f.required)
            fields.append(f)
        return Schema(*fields)

    def prepare_entry(self, entry: ManifestEntry) -> ManifestEntry:
        """The entry, its data file with the v2 fields and ``referenced_data_file`` (the record the schema above
        reads by position)."""
        entry = super().prepare_entry(entry)
        data_file = entry.data_file
        v2_fields = [data_file[i] for i in range(len(DATA_FILE_TYPE[2].fields))]
        entry.data_file = DataFile(*v2_fields, _referenced_data_file(data_file))
        return entry


def _referenced_data_file(delete_file: DataFile) -> str | None:
    """The one data file a position delete file names, when its ``file_path`` bounds say so (both are that path)."""
    lower = (delete_file.lower_bounds or {}).get(PATH_FIELD_ID)
    upper = (delete_file.upper_bounds or {}).get(PATH_FIELD_ID)
    if delete_file.content != DataFileContent.POSITION_DELETES or lower is None or lower != upper:
        return None
    return lower.decode()


def write_position_deletes(table: Table, deletes: pa.Table, files: Mapping[str, DataFile]) -> list[DataFile]:
    """Write ``deletes`` (``file_path``, plain or dictionary-encoded, and ``pos``: rows of the data files ``files``
    maps by path) as one position delete file per data file; returns their ``DataFile``s, nothing committed. Paths
    stay dictionary-encoded, so a million deletes cost no million strings."""
    if deletes.num_rows == 0:
        return []
    column = deletes["file_path"].combine_chunks()
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    paths: list[str] = column.dictionary.to_pylist()
    rows = pa.table(
        {"i": column.indices.cast(pa.int32()), "pos": deletes["pos"].combine_chunks().cast(pa.int64())}
    ).sort_by([("i", "ascending"), ("pos", "ascending")])
    runs = pc.run_end_encode(rows["i"].combine_chunks())  # one run of rows per data file
    codec = table.properties.get(TableProperties.PARQUET_COMPRESSION, TableProperties.PARQUET_COMPRESSION_DEFAULT)
    written: list[DataFile] = []
    start = 0
    for i, end in zip(runs.values.to_pylist(), runs.run_ends.to_pylist(), strict=True):
        path = paths[i]
        written.append(_delete_file(table, files[path], rows["pos"].slice(start, end - start), codec))
        start = end
    return written


def _delete_file(table: Table, data_file: DataFile, positions: pa.ChunkedArray, codec: str) -> DataFile:
    """Write the position delete file of ``data_file``'s rows at ``positions`` (sorted)."""
    path = data_file.file_path
    count = len(positions)
    named = pa.DictionaryArray.from_arrays(np.zeros(count, np.int32), pa.array([path], pa.string()))
    out = pa.table([named, positions.combine_chunks()], schema=DELETE_SCHEMA)
    location = table.location_provider().new_data_location(f"{uuid.uuid4()}-deletes.parquet")
    written_metadata: list[pq.FileMetaData] = []
    with table.io.new_output(location).create(overwrite=False) as stream:
        pq.write_table(out, stream, compression=codec, store_schema=False, metadata_collector=written_metadata)
    (metadata,) = written_metadata
    sizes = [
        sum(metadata.row_group(g).column(c).total_compressed_size for g in range(metadata.num_row_groups))
        for c in range(2)
    ]
    bounds = pc.min_max(out["pos"])
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=data_file.partition,
        record_count=count,
        file_size_in_bytes=len(table.io.new_input(location)),
        column_sizes={PATH_FIELD_ID: sizes[0], POS_FIELD_ID: sizes[1]},
        value_counts={PATH_FIELD_ID: count, POS_FIELD_ID: count},
        null_value_counts={PATH_FIELD_ID: 0, POS_FIELD_ID: 0},
        lower_bounds={PATH_FIELD_ID: path.encode(), POS_FIELD_ID: _long(bounds["min"].as_py())},
        upper_bounds={PATH_FIELD_ID: path.encode(), POS_FIELD_ID: _long(bounds["max"].as_py())},
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
    )
    delete_file.spec_id = data_file.spec_id  # not a field of the struct: from_args would drop it
    return delete_file


def _long(value: int) -> bytes:
    return int(value).to_bytes(8, "little", signed=True)


class DeletedPositions:
    """The positions position delete files delete, each delete file read once by the process (a merge's plan asks
    for every file a delete file names, and the next merge for most of them again: :data:`_DELETED`)."""

    def __init__(self, io: FileIO) -> None:
        self._io = io

    def of(self, delete_files: Iterable[DataFile], path: str) -> pa.Array:
        """The positions of data file ``path`` that ``delete_files`` delete."""
        found = []
        for f in delete_files:
            by_file = _DELETED.get(f.file_path, lambda f=f: _by_data_file(self._io, f))
            if path in by_file:
                found.append(by_file[path])
        return pa.concat_arrays(found) if found else pa.array([], pa.int64())


#: Delete files' positions by data file, kept by the process (a delete file never changes).
_DELETED: FileCache[dict[str, pa.Array]] = FileCache(
    128 * 1024 * 1024, lambda by_file: sum(a.nbytes for a in by_file.values())
)


def _by_data_file(io: FileIO, delete_file: DataFile) -> dict[str, pa.Array]:
    if delete_file.content != DataFileContent.POSITION_DELETES:
        raise ValueError(f"{delete_file.file_path}: equality deletes are not supported (content {delete_file.content})")
    with io.new_input(delete_file.file_path).open() as stream:
        rows = pq.read_table(stream, columns=["file_path", "pos"])
    paths = rows["file_path"].combine_chunks()
    positions = rows["pos"].combine_chunks().cast(pa.int64())
    return {path: positions.filter(pc.equal(paths, path)) for path in pc.unique(paths).to_pylist()}


def delete_files_by_data_file(
    table: Table, snapshot_id: int | None = None, manifests: Iterable[ManifestFile] | None = None
) -> dict[str, frozenset[DataFile]]:
    """The delete files that apply to each data file of a snapshot (the current one by default), as pyiceberg's scan
    matches them (partition, sequence number, path bounds); empty, without planning a scan, when it has none (its
    ``manifests``, when the caller has read them already)."""
    snapshot = table.current_snapshot() if snapshot_id is None else table.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None:
        return {}
    manifests = snapshot.manifests(table.io) if manifests is None else manifests
    if not any(m.content == ManifestContent.DELETES for m in manifests):
        return {}
    tasks = table.scan(snapshot_id=snapshot.snapshot_id).plan_files()
    return {t.file.file_path: frozenset(t.delete_files) for t in tasks if t.delete_files}


def referenced_paths(io: FileIO, delete_file: DataFile) -> set[str]:
    """The data files a position delete file names."""
    with io.new_input(delete_file.file_path).open() as stream:
        return set(pc.unique(pq.read_table(stream, columns=["file_path"])["file_path"]).to_pylist())
