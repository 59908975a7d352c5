"""What ``krishiv verify`` (and the Dagster ``ledger_agreement`` check, the same function) used to miss: rows another
writer appends to an ``events`` table without Kafka metadata columns, and a committed merge batch that only
deletes. Real SQLite catalog and ledger; batches staged directly, committed by the relay."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField

from krishiv.cli import main
from krishiv.operations import open_ledger
from krishiv.verify import check_ledger_agreement
from krishiv_core.catalog import TABLE_PROPERTIES, load_catalog, qualified
from krishiv_core.entries import DATA, DELETE_KEYS, MERGE, CommitOperation, OutboxEntry, StagedFile, new_snapshot_id
from krishiv_core.spec import load_spec
from outbox.ledger import Ledger
from outbox.relay import CommitRelay
from tests.krishiv.test_commit_paths import rows_for, stage_batch, write_spec


def test_rows_another_writer_appends_to_an_events_table_without_metadata_are_named(tmp_path: Path, capsys) -> None:
    spec_file = write_spec(tmp_path)  # an events fan-out without _kafka_partition and _kafka_offset
    spec = load_spec(spec_file, env={})
    catalog, ledger = load_catalog(spec), open_ledger(spec)
    for b in range(2):
        stage_batch(spec, spec.pipeline(), catalog, ledger, b)
    assert main(["--spec", str(spec_file), "commit"]) == 0
    assert main(["--spec", str(spec_file), "verify"]) == 0
    assert "VIOLATIONS" not in capsys.readouterr().out

    name = qualified(spec, "orders_c001")
    table = catalog.load_table(name)
    table.append(rows_for(name, 0).slice(0, 1).cast(table.schema().as_arrow()))  # an event a second time
    foreign = catalog.load_table(name).current_snapshot().snapshot_id
    assert main(["--spec", str(spec_file), "verify"]) == 1
    out = capsys.readouterr().out
    assert f"snapshot {foreign} (append by another writer, not a Krishiv batch) added 1 rows to {name}" in out
    assert f"{name} holds 5 rows but the ledger committed 4" in out
    assert out.count("VIOLATIONS") == 1, "the other tables are fine"


SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "value", DoubleType(), required=False))
TABLE = "krishiv.latest"
BY_ID = CommitOperation(MERGE, key=("id",))


def merge_batch(folder: Path, batch_id: int, rows: list[dict], deletes: list[dict] = ()) -> OutboxEntry:  # type: ignore[assignment]
    """A merge batch as phase 1 stages it: winners as a data file, deleted keys as a delete-key file."""
    files = []
    for content, part, schema in ((DATA, rows, SCHEMA), (DELETE_KEYS, deletes, SCHEMA.select("id"))):
        if part:
            path = folder / f"batch={batch_id}" / f"{content}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist(part, schema=schema_to_pyarrow(schema, include_field_ids=True)), path)
            files.append(StagedFile(str(path), len(part), path.stat().st_size, content))
    offsets = {"t": {"0": [batch_id * 10, batch_id * 10 + 10]}}
    return OutboxEntry("q", "p", TABLE, batch_id, offsets, tuple(files), new_snapshot_id(), operation=BY_ID)


def test_a_committed_merge_batch_that_only_deletes_is_accounted_for(tmp_path: Path) -> None:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=tmp_path.as_uri())
    catalog.create_namespace("krishiv")
    catalog.create_table(TABLE, SCHEMA, properties=TABLE_PROPERTIES)
    ledger = Ledger(tmp_path / "ledger.duckdb")
    folder = tmp_path / "_krishiv_staging"
    ledger.record_batch([merge_batch(folder, 0, [{"id": k, "value": float(k)} for k in range(3)])])
    assert CommitRelay(ledger, catalog).commit_table(TABLE).committed == [0]
    before = catalog.load_table(TABLE).metadata_location  # a copy of the table taken now
    deletes = merge_batch(folder, 1, [], deletes=[{"id": 0}, {"id": 1}])
    assert deletes.record_count == 0 and not deletes.changes_nothing
    ledger.record_batch([deletes])
    assert CommitRelay(ledger, catalog).commit_table(TABLE).committed == [1]
    table = catalog.load_table(TABLE)
    assert table.scan().to_arrow().num_rows == 1
    assert check_ledger_agreement(table, TABLE, ledger, merge=True) == [], "its snapshot is the ledger's batch 1"

    # The table restored from the copy taken before the delete: the deleted rows are back, and verify says why.
    catalog.drop_table(TABLE)
    restored = catalog.register_table(TABLE, before)
    assert restored.scan().to_arrow().num_rows == 3
    assert check_ledger_agreement(restored, TABLE, ledger, merge=True) == [
        f"ledger says batch 1 of query q is COMMITTED but {TABLE} has no snapshot for it"
    ]
