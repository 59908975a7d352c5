"""Position delete files written from Python (``outbox/position_deletes.py``) and committed by ``row_delta``, read
back by pyiceberg as any Iceberg v2 reader applies them; and the canary on the pyiceberg API they rely on."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import POSITIONAL_DELETE_SCHEMA, DataFileContent, ManifestContent, ManifestWriterV2
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.delete_file_index import PATH_FIELD_ID as PYICEBERG_PATH_FIELD_ID
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles, _SnapshotProducer
from pyiceberg.transforms import IdentityTransform
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
    DeletedPositions,
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
    assert sorted((str(f.partition), f.record_count) for f in written) == [("Record[eu]", 3), ("Record[us]", 1)]
    before = table.current_snapshot().snapshot_id
    snapshot_id = new_snapshot_id()
    row_delta(table, [], written, snapshot_id, {"krishiv.batch-id": "7"})

    reloaded = catalog.load_table(("krishiv", "deletes"))
    ids = sorted(reloaded.scan().to_arrow()["id"].to_pylist())
    assert ids == [0, 2, 4, 10, 11, 12, 13, 101, 102, 103, 104]
    assert table_rows(reloaded) == len(ids), "Krishiv's own count (verify, status, the Dagster checks) agrees"
    head = reloaded.current_snapshot()
    assert head.snapshot_id == snapshot_id and head.summary.operation == Operation.OVERWRITE
    assert head.summary["added-position-deletes"] == "4" and head.summary["added-position-delete-files"] == "2"
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
    assert sorted(e["data_file"]["record_count"] for e in entries if e["data_file"]["content"] == 1) == [1, 3]
    assert reloaded.inspect.delete_files().num_rows == 2
    # Time travel: the snapshot before reads every row.
    assert reloaded.scan(snapshot_id=before).to_arrow().num_rows == 15


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
    for hook in ("_process_manifests", "_summary", "_manifests", "new_manifest_output", "spec", "schema"):
        assert callable(getattr(_SnapshotProducer, hook)), hook
    assert issubclass(_FastAppendFiles, _SnapshotProducer)
    assert "_added_data_files" in _SnapshotProducer.__annotations__
    assert DataFileContent.POSITION_DELETES.value == 1
