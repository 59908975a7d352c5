"""Position delete files written from Python (``outbox/position_deletes.py``) and committed by ``row_delta``, read
back by pyiceberg as any Iceberg v2 reader applies them; and the canary on the pyiceberg API they rely on."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.avro.file import AvroFile
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    POSITIONAL_DELETE_SCHEMA,
    DataFileContent,
    ManifestContent,
    ManifestEntryStatus,
    ManifestWriter,
    ManifestWriterV2,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.delete_file_index import PATH_FIELD_ID as PYICEBERG_PATH_FIELD_ID
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles, _SnapshotProducer
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from krishiv.verify import table_rows
from krishiv_core.catalog import TABLE_PROPERTIES
from krishiv_core.entries import new_snapshot_id
from outbox.compaction import live_data_files
from outbox.position_deletes import (
    COPY_ON_WRITE,
    MERGE_MODE,
    PATH_FIELD_ID,
    POS_FIELD_ID,
    REFERENCED_DATA_FILE_ID,
    DeletedPositions,
    DeleteManifestWriter,
    merge_on_read,
    referenced_paths,
    write_position_deletes,
)
from outbox.snapshot_producer import row_delta

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False), NestedField(2, "region", StringType(), required=False)
)
BY_REGION = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region"))


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=(tmp_path / "w").as_uri())
    catalog.create_namespace("krishiv")
    return catalog


def _table(catalog: SqlCatalog, name: str = "deletes", **properties: str) -> Table:
    table = catalog.create_table(
        ("krishiv", name), SCHEMA, partition_spec=BY_REGION, properties={**TABLE_PROPERTIES, **properties}
    )
    for region, first in (("eu", 0), ("us", 100), ("eu", 10)):  # three files, two of them in eu
        table.append(pa.table({"id": pa.array(range(first, first + 5), pa.int64()), "region": [region] * 5}))
    return catalog.load_table(("krishiv", name))


def test_position_deletes_in_two_partitions_are_read_back_by_pyiceberg(catalog: SqlCatalog) -> None:
    table = _table(catalog)
    files = {f.file_path: f for f in live_data_files(table)}
    first_id = {}
    for path in files:
        with table.io.new_input(path).open() as stream:
            first_id[pq.read_table(stream)["id"][0].as_py()] = path
    eu_0, us, eu_10 = first_id[0], first_id[100], first_id[10]
    doomed = {eu_0: [1, 3], us: [0], eu_10: [4]}  # ids 1, 3, 100 and 14
    deletes = pa.table(
        {"file_path": [p for p, ps in doomed.items() for _ in ps], "pos": [x for ps in doomed.values() for x in ps]}
    )
    written = write_position_deletes(table, deletes, files)
    assert sorted((str(f.partition), f.record_count) for f in written) == [
        ("Record[eu]", 1),
        ("Record[eu]", 2),
        ("Record[us]", 1),
    ], "one delete file per data file, in its partition"
    before = table.current_snapshot().snapshot_id
    snapshot_id = new_snapshot_id()
    row_delta(table, [], written, snapshot_id, {"krishiv.batch-id": "7"})

    reloaded = catalog.load_table(("krishiv", "deletes"))
    ids = sorted(reloaded.scan().to_arrow()["id"].to_pylist())
    assert ids == [0, 2, 4, 10, 11, 12, 13, 101, 102, 103, 104]
    assert table_rows(reloaded) == len(ids), "Krishiv's own count (verify, status, the Dagster checks) agrees"
    head = reloaded.current_snapshot()
    assert head.snapshot_id == snapshot_id and head.summary.operation == Operation.OVERWRITE
    assert head.summary["added-position-deletes"] == "4" and head.summary["added-position-delete-files"] == "3"
    assert head.summary["krishiv.batch-id"] == "7"
    contents = sorted(m.content for m in head.manifests(reloaded.io))
    assert contents == [ManifestContent.DATA] * 3 + [ManifestContent.DELETES]
    # Each delete file applies to the files of its partition within its path bounds, and only its rows of them.
    deletes = DeletedPositions(reloaded.io)
    for task in reloaded.scan().plan_files():
        assert {f.partition for f in task.delete_files} <= {task.file.partition}
        dead = deletes.of(task.delete_files, task.file.file_path).to_pylist()
        assert sorted(dead) == doomed[task.file.file_path]
    assert {p for f in written for p in referenced_paths(reloaded.io, f)} == set(doomed)
    # pyiceberg's metadata tables list them (verify reads entries).
    entries = reloaded.inspect.entries().to_pylist()
    assert sorted(e["data_file"]["record_count"] for e in entries if e["data_file"]["content"] == 1) == [1, 1, 2]
    assert reloaded.inspect.delete_files().num_rows == 3
    # Time travel: the snapshot before reads every row.
    assert reloaded.scan(snapshot_id=before).to_arrow().num_rows == 15


def referenced_in_manifest(io: FileIO, location: str) -> dict[str, str | None]:
    """The live position delete files of a delete manifest with their ``referenced_data_file`` (field 143), read by
    field id in the schema the file was written with (pyiceberg's manifest reader, with its v2 schema, drops it)."""
    with AvroFile[Record](io.new_input(location)) as entries:
        fields = [f.field_id for f in entries.schema.fields]
        data_file = [f.field_id for f in entries.schema.find_field(2).field_type.fields]
        status, entry_file, path, named = fields.index(0), fields.index(2), data_file.index(100), data_file.index(143)
        return {e[entry_file][path]: e[entry_file][named] for e in entries if e[status] != ManifestEntryStatus.DELETED}


def referenced_in_manifests(table: Table) -> dict[str, str | None]:
    """:func:`referenced_in_manifest` over the delete manifests of the table's current snapshot."""
    found: dict[str, str | None] = {}
    for manifest in table.current_snapshot().manifests(table.io):
        if manifest.content == ManifestContent.DELETES:
            found |= referenced_in_manifest(table.io, manifest.manifest_path)
    return found


def test_each_delete_file_names_one_data_file_in_a_plain_string_column_and_the_manifest_says_which(
    catalog: SqlCatalog, tmp_path: Path
) -> None:
    """What other engines need to apply the deletes themselves (polars' reader refuses a ``file_path`` read back as a
    dictionary, and a delete file whose path bounds differ): no Arrow schema with a dictionary in the footer, one data
    file per delete file, named by its bounds and by ``referenced_data_file``, which a compaction that rewrites the
    delete manifest keeps."""
    table = _table(catalog)
    files = {f.file_path: f for f in live_data_files(table)}
    deletes = pa.table({"file_path": [p for p in files for _ in range(2)], "pos": [3, 1] * len(files)})
    written = write_position_deletes(table, deletes, files)
    row_delta(table, [], written, new_snapshot_id(), {})
    for f in written:
        (named,) = referenced_paths(table.io, f)
        assert f.lower_bounds[PATH_FIELD_ID] == f.upper_bounds[PATH_FIELD_ID] == named.encode()
        local = f.file_path.removeprefix("file://")
        assert pq.read_schema(local).field("file_path").type == pa.string()
        footer = pq.read_metadata(local).metadata or {}
        assert b"ARROW:schema" not in footer, "pyarrow's schema would tell readers the column is a dictionary"
        column = pq.ParquetFile(local).schema.column(0)
        assert (column.name, column.logical_type.type, column.physical_type) == ("file_path", "STRING", "BYTE_ARRAY")
        assert pq.read_table(local).to_pylist() == [{"file_path": named, "pos": 1}, {"file_path": named, "pos": 3}]
    table = catalog.load_table(("krishiv", "deletes"))
    by_delete_file = {f.file_path: next(iter(referenced_paths(table.io, f))) for f in written}
    assert referenced_in_manifests(table) == by_delete_file and set(by_delete_file.values()) == set(files)
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [0, 2, 4, 10, 12, 14, 100, 102, 104]

    # A compaction that removes some delete files rewrites their manifest with the others as existing entries, read
    # back by pyiceberg (without field 143): the writer names the data file again from the bounds.
    (manifest,) = [m for m in table.current_snapshot().manifests(table.io) if m.content == ManifestContent.DELETES]
    kept = manifest.fetch_manifest_entry(table.io)[1:]
    location = str(tmp_path / "rewritten.avro")
    with DeleteManifestWriter(table.spec(), table.schema(), table.io.new_output(location), 1, "null") as rewritten:
        for e in kept:
            rewritten.existing(e)
    assert referenced_in_manifest(table.io, location) == {
        e.data_file.file_path: by_delete_file[e.data_file.file_path] for e in kept
    }


def test_the_merge_mode_is_icebergs_table_property() -> None:
    assert MERGE_MODE == "write.merge.mode" and COPY_ON_WRITE == "copy-on-write"


def test_merge_on_read_is_the_default_and_copy_on_write_is_honoured(catalog: SqlCatalog) -> None:
    assert merge_on_read(_table(catalog, "default"))
    assert not merge_on_read(_table(catalog, "cow", **{MERGE_MODE: COPY_ON_WRITE}))
    v1 = catalog.create_table(("krishiv", "v1"), SCHEMA, properties={"format-version": "1"})
    assert not merge_on_read(v1), "a v1 table has no delete files"


def test_canary_pyicebergs_api_for_delete_files_is_where_krishiv_reaches_for_it() -> None:
    """Breaks when pyiceberg moves what ``position_deletes`` and ``row_delta`` rely on: the reserved field ids, the
    v2 manifest writer's content and metadata hooks, and the snapshot producer's hooks and attributes."""
    assert POSITIONAL_DELETE_SCHEMA.find_field("file_path").field_id == PATH_FIELD_ID == PYICEBERG_PATH_FIELD_ID
    assert POSITIONAL_DELETE_SCHEMA.find_field("pos").field_id == POS_FIELD_ID
    assert callable(ManifestWriterV2.content) and isinstance(ManifestWriterV2._meta, property)
    assert callable(ManifestWriter._with_partition) and callable(ManifestWriterV2.prepare_entry)
    # referenced_data_file: pyiceberg's v3 data file type has it, its v2 type (the manifests it reads and writes for
    # a v2 table) not yet; when it does, DeleteManifestWriter must stop adding its own.
    assert [f.name for f in DATA_FILE_TYPE[3].fields if f.field_id == REFERENCED_DATA_FILE_ID] == [
        "referenced_data_file"
    ]
    assert REFERENCED_DATA_FILE_ID not in {f.field_id for f in DATA_FILE_TYPE[2].fields}
    for hook in ("_process_manifests", "_summary", "_manifests", "new_manifest_output", "spec", "schema"):
        assert callable(getattr(_SnapshotProducer, hook)), hook
    assert issubclass(_FastAppendFiles, _SnapshotProducer)
    assert "_added_data_files" in _SnapshotProducer.__annotations__
    assert DataFileContent.POSITION_DELETES.value == 1
