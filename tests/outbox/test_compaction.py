"""Compaction through real catalogs (SQLite, and PostgreSQL once) and ledger entries committed by CommitRelay:
the rows stay the same, the relay commits nothing twice afterwards (also after expiry and a lost ledger mark),
verify's checks stay clean, a relay commit or a merge between plan and commit is handled, a merge planned
before a compaction (whose replaced files were then removed) re-plans, and a compaction that does not commit
leaves no file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType
from rich.console import Console

from krishiv.lineage import lineage, maintenance_of
from krishiv.verify import check_ledger_agreement, check_lineage, duplicate_rows, duplicate_sources
from krishiv.views import lineage_table
from krishiv_core import faults
from krishiv_core.catalog import TABLE_PROPERTIES
from krishiv_core.entries import (
    COMMITTED,
    DATA,
    MERGE,
    PENDING,
    CommitOperation,
    OutboxEntry,
    StagedFile,
    new_snapshot_id,
)
from krishiv_core.faults import FAULTS_ENV, InjectedFault
from outbox.compaction import (
    COMPACTION,
    SUMMARY_FOLDED_DELETES,
    SUMMARY_MAINTENANCE,
    SUMMARY_MAINTENANCE_RUN,
    SUMMARY_REWRITTEN_FILES,
    CompactionError,
    compact_table,
    live_data_files,
)
from outbox.ledger import Ledger
from outbox.merge import TableFileMissing, merge_commit
from outbox.position_deletes import COPY_ON_WRITE, MERGE_MODE, MERGE_ON_READ, write_position_deletes
from outbox.relay import (
    SUMMARY_BATCH_ID,
    SUMMARY_HIGH_WATER,
    SUMMARY_QUERY_ID,
    CommitRelay,
    high_water_marks,
    high_water_property,
    snapshot_summary,
)
from outbox.replace_files import ReplaceFiles
from outbox.snapshot_producer import row_delta
from tests.outbox.test_relay import TABLE, DiesBeforeMarking, stage

MB = 1 << 20


@pytest.fixture(autouse=True)
def fresh_faults(monkeypatch) -> None:
    monkeypatch.setattr(faults, "_fired", set())
    monkeypatch.delenv(FAULTS_ENV, raising=False)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Catalog:
    uri = request.getfixturevalue("postgres_uri") if request.param == "postgresql" else f"sqlite:///{tmp_path}/c.db"
    return SqlCatalog("t", uri=uri, warehouse=tmp_path.as_uri())


@pytest.fixture
def sqlite(tmp_path: Path) -> Catalog:
    return SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=tmp_path.as_uri())


def rows_of(table: Table) -> list[dict[str, Any]]:
    return sorted(table.scan().to_arrow().to_pylist(), key=repr)


def data_folder_files(table: Table) -> set[str]:
    folder = Path(table.location().removeprefix("file://")) / "data"
    return {p.name for p in folder.rglob("*.parquet")}


def assert_checks_clean(table: Table, ledger: Ledger, merge: bool = False) -> None:
    assert check_lineage(table) == []
    assert check_ledger_agreement(table, table.name()[0] + "." + table.name()[1], ledger, merge=merge) == []


# ------------------------------------------------------------------------------------------ appends


def test_compaction_of_relay_batches_keeps_rows_checks_and_the_relays_marks(catalog: Catalog, ledger: Ledger):
    for b in range(8):
        stage(catalog, ledger, b, b)
    assert CommitRelay(ledger, catalog).commit_table(TABLE).committed == list(range(8))
    table = catalog.load_table(TABLE)
    before, marks, properties = rows_of(table), high_water_marks(table), dict(table.properties)
    manifests_before = len(table.current_snapshot().manifests(table.io))
    assert len(live_data_files(table)) == 8 and manifests_before == 8

    planned = compact_table(table, target_file_size=MB, min_files=4, dry_run=True)
    assert (planned.files_rewritten, planned.files_written, planned.snapshot_id) == (8, 0, None)
    assert catalog.load_table(TABLE).current_snapshot().snapshot_id == table.current_snapshot().snapshot_id

    report = compact_table(table, target_file_size=MB, min_files=4, run_id="run-1")
    assert (report.groups, report.files_rewritten, report.files_written, report.rows) == (1, 8, 1, 8)
    table = catalog.load_table(TABLE)
    head = table.current_snapshot()
    assert head.snapshot_id == report.snapshot_id and head.summary.operation == Operation.REPLACE
    summary = head.summary.additional_properties
    assert summary[SUMMARY_MAINTENANCE] == COMPACTION and summary[SUMMARY_MAINTENANCE_RUN] == "run-1"
    assert summary[SUMMARY_REWRITTEN_FILES] == "8"
    assert summary["added-records"] == summary["deleted-records"] == "8"
    assert not {SUMMARY_QUERY_ID, SUMMARY_BATCH_ID, SUMMARY_HIGH_WATER} & summary.keys()
    assert dict(table.properties) == properties and high_water_marks(table) == marks, "no property moves"
    assert rows_of(table) == before
    assert len(live_data_files(table)) == 1 and len(head.manifests(table.io)) < manifests_before
    assert [r.writer for r in lineage(table)][-1] == "maintenance"
    console = Console(width=120, record=True)
    console.print(lineage_table("lineage", lineage(table)))
    assert COMPACTION in console.export_text().splitlines()[-1].split(), "krishiv lineage names the compaction"
    assert_checks_clean(table, ledger)

    # The relay after a compaction: nothing committed twice, the next batches on top, every check clean.
    assert CommitRelay(ledger, catalog).commit_table(TABLE).committed == []
    for b in range(8, 10):
        stage(catalog, ledger, b, b)
    assert CommitRelay(ledger, catalog).commit_table(TABLE).committed == [8, 9]
    table = catalog.load_table(TABLE)
    assert len(rows_of(table)) == 10
    assert_checks_clean(table, ledger)
    assert compact_table(table, target_file_size=MB, min_files=4).snapshot_id is None, "3 files: below min_files"


def test_a_snapshot_that_claims_to_be_a_compaction_but_drops_rows_is_named(sqlite: Catalog, ledger: Ledger):
    for b in range(3):
        stage(sqlite, ledger, b, b)
    CommitRelay(ledger, sqlite).commit_table(TABLE)
    compact_table(sqlite.load_table(TABLE), target_file_size=MB, min_files=2)
    table = sqlite.load_table(TABLE)
    assert [r.writer for r in lineage(table)] == ["batch"] * 3 + ["maintenance"], "so the totals are compared"
    assert_checks_clean(table, ledger)
    (compacted,) = live_data_files(table)
    with table.transaction() as tx:
        producer = tx.update_snapshot(snapshot_properties={SUMMARY_MAINTENANCE: COMPACTION}).overwrite()
        producer.delete_by_predicate(AlwaysTrue())
        producer.delete_data_file(compacted)
        producer.commit()
    table = sqlite.load_table(TABLE)
    assert lineage(table)[-1].writer == "other"
    (problem,) = check_lineage(table)
    assert "says it is Krishiv's compaction but is a overwrite adding 0 rows and deleting 3" in problem


def test_a_relay_commit_between_plan_and_commit_is_rebased_on(sqlite: Catalog, ledger: Ledger):
    for b in range(6):
        stage(sqlite, ledger, b, b)
    CommitRelay(ledger, sqlite).commit_table(TABLE)
    stale = sqlite.load_table(TABLE)  # the compaction plans on this head
    stage(sqlite, ledger, 6, 6)
    assert CommitRelay(ledger, sqlite).commit_table(TABLE).committed == [6]

    report = compact_table(stale, target_file_size=MB, min_files=2)
    assert report.attempts == 2 and report.files_rewritten == 6 and report.snapshot_id is not None
    table = sqlite.load_table(TABLE)
    head = table.current_snapshot()
    assert head.snapshot_id == report.snapshot_id
    assert table.metadata.snapshot_by_id(head.parent_snapshot_id).summary[SUMMARY_BATCH_ID] == "6"
    assert len(rows_of(table)) == 7 and len(live_data_files(table)) == 2, "the batch after the plan is kept"
    assert_checks_clean(table, ledger)


def metadata_manifests(table: Table) -> set[str]:
    folder = Path(table.location().removeprefix("file://")) / "metadata"
    return {p.as_uri() for p in folder.glob("*.avro")}


def test_relay_commits_during_every_attempt_are_rebased_on_without_rewriting_its_manifests(
    sqlite: Catalog, ledger: Ledger, monkeypatch
):
    """Two relay commits land while the compaction is about to commit (a real race on the catalog): the third
    attempt commits, its manifests are those the first one wrote, and no manifest or list of the lost attempts is
    left in the metadata folder."""
    for b in range(6):
        stage(sqlite, ledger, b, b)
    CommitRelay(ledger, sqlite).commit_table(TABLE)
    written: list[str] = []
    real_output = ReplaceFiles.new_manifest_output

    def counted_output(self: ReplaceFiles) -> Any:
        out = real_output(self)
        written.append(out.location)
        return out

    def relay_commits_first(point: str, *args: Any) -> None:
        nonlocal batch
        if point == "maintenance.before_catalog_commit" and batch < 8:
            stage(sqlite, ledger, batch, batch)
            assert CommitRelay(ledger, sqlite).commit_table(TABLE).committed == [batch]
            batch += 1

    batch = 6
    monkeypatch.setattr(ReplaceFiles, "new_manifest_output", counted_output)
    monkeypatch.setattr("outbox.compaction.fault_point", relay_commits_first)
    report = compact_table(sqlite.load_table(TABLE), target_file_size=MB, min_files=2)

    assert report.attempts == 3 and report.files_rewritten == 6
    table = sqlite.load_table(TABLE)
    assert table.current_snapshot().snapshot_id == report.snapshot_id
    assert len(rows_of(table)) == 8 and len(live_data_files(table)) == 3, "both batches after the plan are kept"
    own = {m.manifest_path for m in table.current_snapshot().manifests(table.io)} & set(written)
    assert own == set(written) and len(written) == 2, "the added and the deleted entries' manifests, written once"
    listed = {m.manifest_path for s in table.snapshots() for m in s.manifests(table.io)}
    listed |= {s.manifest_list for s in table.snapshots()}
    assert metadata_manifests(table) == listed, "nothing of the lost attempts is left"
    assert_checks_clean(table, ledger)


def test_compaction_then_expiry_then_a_lost_ledger_mark_commits_nothing_twice(sqlite: Catalog, ledger: Ledger):
    for b in range(5):
        stage(sqlite, ledger, b, b)
    with pytest.raises(KeyboardInterrupt):
        CommitRelay(DiesBeforeMarking(ledger.path, victim=4), sqlite).commit_table(TABLE)
    assert ledger.get("q1", TABLE, 4).status == PENDING
    table = sqlite.load_table(TABLE)
    compact_table(table, target_file_size=MB, min_files=2)
    table = sqlite.load_table(TABLE)
    table.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in table.snapshots()[:-1]]).commit()
    table = sqlite.load_table(TABLE)
    assert [r.writer for r in lineage(table)] == ["maintenance"]

    stage(sqlite, ledger, 5, 5)
    report = CommitRelay(ledger, sqlite).commit_table(TABLE)
    assert (report.recovered, report.committed) == ([4], [5])
    assert ledger.get("q1", TABLE, 4).status == COMMITTED
    table = sqlite.load_table(TABLE)
    assert len(rows_of(table)) == 6
    assert_checks_clean(table, ledger)


def test_a_compaction_that_does_not_commit_leaves_no_file(sqlite: Catalog, ledger: Ledger, monkeypatch):
    for b in range(4):
        stage(sqlite, ledger, b, b)
    CommitRelay(ledger, sqlite).commit_table(TABLE)
    table = sqlite.load_table(TABLE)
    head, files = table.current_snapshot().snapshot_id, data_folder_files(table)
    for point in ("maintenance.after_rewrite", "maintenance.before_catalog_commit"):
        monkeypatch.setenv(FAULTS_ENV, f"{point}:raise")
        with pytest.raises(InjectedFault):
            compact_table(sqlite.load_table(TABLE), target_file_size=MB, min_files=2)
        assert sqlite.load_table(TABLE).current_snapshot().snapshot_id == head
        assert data_folder_files(table) == files, point


# ------------------------------------------------------------------------------------------ merges

MERGE_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "value", DoubleType(), required=False),
)
MERGE_TABLE = "krishiv.merged"
BY_ID = CommitOperation(MERGE, key=("id",))


def merge_table(catalog: Catalog, mode: str = MERGE_ON_READ) -> Table:
    catalog.create_namespace_if_not_exists("krishiv")
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))
    properties = {**TABLE_PROPERTIES, MERGE_MODE: mode}
    return catalog.create_table(MERGE_TABLE, MERGE_SCHEMA, partition_spec=spec, properties=properties)


def stage_merge(ledger: Ledger, folder: Path, batch_id: int, rows: list[dict[str, Any]]) -> OutboxEntry:
    """One merge batch (one staged file per region, as phase 1 writes them), recorded in the ledger."""
    files = []
    for region in sorted({r["region"] for r in rows}):
        path = folder / f"batch={batch_id}" / f"part-{region}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        part = [r for r in rows if r["region"] == region]
        pq.write_table(pa.Table.from_pylist(part, schema=schema_to_pyarrow(MERGE_SCHEMA)), path)
        files.append(StagedFile(str(path), len(part), path.stat().st_size, DATA))
    entry = OutboxEntry(
        "qm",
        "p",
        MERGE_TABLE,
        batch_id,
        {"t": {"0": [batch_id, batch_id + 1]}},
        tuple(files),
        new_snapshot_id(),
        operation=BY_ID,
    )
    assert ledger.record_batch([entry]) == [True]
    return entry


def row(key: int, value: float, region: str) -> dict[str, Any]:
    return {"id": key, "region": region, "value": value}


@pytest.mark.parametrize("mode", [MERGE_ON_READ, COPY_ON_WRITE])
def test_a_merge_between_plan_and_commit_drops_the_groups_it_rewrote(sqlite: Catalog, ledger: Ledger, tmp_path, mode):
    """A merge lands between a compaction's plan and its commit: copy-on-write, it rewrote one of the eu files; merge
    on read, it deleted a row of one by position. Either way the eu group is dropped and the us group committed."""
    merge_table(sqlite, mode)
    folder = tmp_path / "_krishiv_staging"
    for b in range(4):  # keys 0..3 in eu, 100..103 in us: four files per region
        stage_merge(ledger, folder, b, [row(b, b, "eu"), row(100 + b, b, "us")])
    CommitRelay(ledger, sqlite).commit_table(MERGE_TABLE)
    stale = sqlite.load_table(MERGE_TABLE)
    stage_merge(ledger, folder, 4, [row(1, 99.0, "eu")])  # rewrites, or deletes a row of, one eu file
    assert CommitRelay(ledger, sqlite).commit_table(MERGE_TABLE).committed == [4]
    expected = rows_of(sqlite.load_table(MERGE_TABLE))
    files = data_folder_files(stale)

    report = compact_table(stale, target_file_size=MB, min_files=2)
    assert (report.files_rewritten, report.files_written, report.attempts) == (4, 1, 2), report
    why = "rewritten by a concurrent commit" if mode == COPY_ON_WRITE else "position deletes of 4 files changed"
    assert any(why in s for s in report.skipped), report.skipped
    table = sqlite.load_table(MERGE_TABLE)
    assert rows_of(table) == expected
    new = {f for f in data_folder_files(table) - files if "deletes" not in f}
    live = {Path(f.file_path).name for f in live_data_files(table)}
    assert len(new) == 1 and new <= live, "the rewrite of the dropped group was deleted"
    assert_checks_clean(table, ledger, merge=True)
    assert duplicate_rows(table, ("id",)) == []

    stage_merge(ledger, folder, 5, [row(100, -1.0, "us"), row(7, 7.0, "eu")])
    assert CommitRelay(ledger, sqlite).commit_table(MERGE_TABLE).committed == [5]
    table = sqlite.load_table(MERGE_TABLE)
    assert {r["id"]: r["value"] for r in rows_of(table)}[100] == -1.0 and len(rows_of(table)) == 9
    assert_checks_clean(table, ledger, merge=True)


def test_a_merge_planned_before_a_compaction_whose_files_were_removed_re_plans(
    sqlite: Catalog, ledger: Ledger, tmp_path
):
    merge_table(sqlite)
    folder = tmp_path / "_krishiv_staging"
    for b in range(3):
        stage_merge(ledger, folder, b, [row(b, b, "eu")])
    CommitRelay(ledger, sqlite).commit_table(MERGE_TABLE)
    stale = sqlite.load_table(MERGE_TABLE)  # the relay loaded the table, then a compaction, expiry, orphan removal
    replaced = live_data_files(stale)
    compact_table(sqlite.load_table(MERGE_TABLE), target_file_size=MB, min_files=2)
    table = sqlite.load_table(MERGE_TABLE)
    table.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in table.snapshots()[:-1]]).commit()
    for f in replaced:
        stale.io.delete(f.file_path)

    entry = stage_merge(ledger, folder, 3, [row(1, 50.0, "eu")])
    summary, marks = snapshot_summary(entry), {high_water_property(entry.query_id): "3"}
    with pytest.raises(CommitFailedException, match="re-planning on the new head"):
        merge_commit(stale, entry, summary, marks)
    assert CommitRelay(ledger, sqlite).commit_table(MERGE_TABLE).committed == [3]
    table = sqlite.load_table(MERGE_TABLE)
    assert {r["id"]: r["value"] for r in rows_of(table)} == {0: 0.0, 1: 50.0, 2: 2.0}
    assert_checks_clean(table, ledger, merge=True)

    # With the head where it is, a missing file is damage, not a race: refused, nothing committed.
    (rewritten,) = [f for f in live_data_files(table) if "_krishiv_staging" not in f.file_path]
    table.io.delete(rewritten.file_path)
    entry = stage_merge(ledger, folder, 4, [row(2, 60.0, "eu")])
    with pytest.raises(TableFileMissing, match="missing") as info:
        merge_commit(table, entry, snapshot_summary(entry), {high_water_property(entry.query_id): "4"})
    assert str(info.value).endswith(
        "Restore the file or the table (see docs/operations.md: Recovery runbook > A merge the relay refuses)"
    )


def test_a_duplicate_in_a_compacted_file_is_traced_to_the_batches_that_added_it(sqlite: Catalog, ledger: Ledger):
    for b in range(3):
        stage(sqlite, ledger, b, b)
    CommitRelay(ledger, sqlite).commit_table(TABLE)
    table = sqlite.load_table(TABLE)
    batch_snapshots = [s.snapshot_id for s in table.snapshots()]
    table.append(table.scan().to_arrow().filter(pa.compute.equal(table.scan().to_arrow()["order_count"], 2)))
    table = sqlite.load_table(TABLE)
    backfill = table.current_snapshot().snapshot_id
    compact_table(table, target_file_size=MB, min_files=2)
    table = sqlite.load_table(TABLE)
    key = ("window_start", "window_end")
    duplicates = duplicate_rows(table, key)
    assert len(duplicates) == 1 and duplicates[0].rows == 2
    (sources,) = duplicate_sources(table, key, duplicates).values()
    assert sources == sorted([batch_snapshots[1], backfill]), "the batch and the second writer, not the compaction"


def test_a_wrong_setting_is_one_line_naming_it(sqlite: Catalog, ledger: Ledger):
    stage(sqlite, ledger, 0, 0)
    table = sqlite.load_table(TABLE)
    with pytest.raises(CompactionError, match="target_file_size must be a positive number of bytes, not 0"):
        compact_table(table, target_file_size=0, min_files=2)
    with pytest.raises(CompactionError, match="min_files must be at least 2"):
        compact_table(table, target_file_size=MB, min_files=1)
    report = compact_table(table, target_file_size=MB, min_files=2)
    assert (report.snapshot_id, report.skipped) == (None, ["the table has no snapshot"])


# ------------------------------------------------------------------------------------------ foreign delete files


def delete_rows_merge_on_read(table: Table, data_file: DataFile, positions: list[int]) -> None:
    """Another writer deletes rows ``positions`` of ``data_file`` with a position delete file (merge-on-read, as
    Spark or Flink do with ``write.delete.mode=merge-on-read``)."""
    deletes = pa.table({"file_path": [data_file.file_path] * len(positions), "pos": positions})
    files = write_position_deletes(table, deletes, {data_file.file_path: data_file})
    row_delta(table, [], files, new_snapshot_id(), {})


def test_rows_another_writer_deleted_by_position_stay_deleted_and_are_folded(sqlite: Catalog, ledger: Ledger):
    """Position deletes that land between a compaction's plan and its commit drop the group of the files they apply
    to (its rewrite was read without them); planned with them there, the compaction folds them: the rows they delete
    are not rewritten, and the delete file goes with the files it named, in the same snapshot."""
    for b in range(6):
        stage(sqlite, ledger, b, b)
    CommitRelay(ledger, sqlite).commit_table(TABLE)
    stale = sqlite.load_table(TABLE)  # a compaction plans on this head, then another writer deletes a row
    victim = live_data_files(stale)[2]
    delete_rows_merge_on_read(sqlite.load_table(TABLE), victim, [0])
    table = sqlite.load_table(TABLE)
    kept = rows_of(table)
    assert len(kept) == 5, "the scan applies the delete file"
    files = data_folder_files(table)

    report = compact_table(stale, target_file_size=MB, min_files=2)
    assert report.snapshot_id is None and report.attempts == 1
    assert report.skipped == ["position deletes of 6 files changed during the compaction; 1 of their groups were left"]
    table = sqlite.load_table(TABLE)
    assert rows_of(table) == kept and data_folder_files(table) == files, "no rewrite committed or left behind"

    report = compact_table(table, target_file_size=MB, min_files=2)  # planned with the delete file there
    assert report.snapshot_id is not None and report.files_rewritten == 6 and report.files_written == 1
    table = sqlite.load_table(TABLE)
    assert rows_of(table) == kept
    head = table.current_snapshot()
    assert head.summary[SUMMARY_FOLDED_DELETES] == "1" and head.summary["removed-position-deletes"] == "1"
    assert [t.delete_files for t in table.scan().plan_files()] == [set()], "the delete file went with its file"
    assert maintenance_of(head) == "compaction"
    assert_checks_clean(table, ledger)
