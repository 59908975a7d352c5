"""Keys, versions and partition sources inside structs (docs/spec.md "Paths in keys"), on a real SQLite catalog.

An upsert table keyed by ``device.id`` (and a top-level ``site``) with its version at ``meta.seq`` and its files
partitioned by ``day(meta.ts)``: random batches of rows, tombstones and versioned deletes merged by the relay in
each merge mode equal a fold of the same batches by the documented merge rule, written here from the rule; and
staged files registered with the partition values their nested sources hold, pruned by a filter on the path.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import GreaterThanOrEqual
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, StructType, TimestamptzType

from krishiv_core.catalog import TABLE_PROPERTIES, ensure_table
from krishiv_core.entries import (
    DELETE_KEYS,
    MERGE,
    VERSIONED_DELETE_KEYS,
    CommitOperation,
    OutboxEntry,
    StagedFile,
    new_snapshot_id,
)
from krishiv_core.errors import ConfigError, SchemaConflict
from krishiv_core.parquet_files import partition_keys, write_staged_files
from krishiv_core.partitioning import parse_partition_by, partition_spec
from krishiv_core.spec import PipelineSpec, load_spec
from krishiv_core.table_purpose import KEY as KEY_PROPERTY
from krishiv_core.table_purpose import VERSION_FIELD, SpecChangeRefused, check_purpose, purpose_properties
from outbox.data_files import data_file
from outbox.errors import MergeKeyNull, MergeRefused
from outbox.merge import merge_commit
from outbox.position_deletes import COPY_ON_WRITE, MERGE_MODE, MERGE_ON_READ
from outbox.relay import high_water_property, snapshot_summary

T0 = datetime(2026, 3, 1, 22, 0, tzinfo=UTC)
DAY_MS = 86_400_000
SCHEMA = Schema(
    NestedField(
        1,
        "device",
        StructType(
            NestedField(5, "id", LongType(), required=True),
            NestedField(6, "name", StringType(), required=False),
        ),
        required=True,
    ),
    NestedField(2, "site", StringType(), required=True),
    NestedField(
        3,
        "meta",
        StructType(
            NestedField(7, "seq", LongType(), required=False),
            NestedField(8, "ts", TimestamptzType(), required=True),
        ),
        required=True,
    ),
    NestedField(4, "value", DoubleType(), required=False),
    identifier_field_ids=[5, 2],
)
#: The spec's output columns of such a pipeline, paths included (what ``partition_by`` is checked against).
COLUMNS = {
    "device": "struct",
    "device.id": "long",
    "device.name": "string",
    "site": "string",
    "meta": "struct",
    "meta.seq": "long",
    "meta.ts": "timestamp_ms",
    "value": "double",
}
KEY = ("device.id", "site")
OPERATION = CommitOperation(MERGE, key=KEY, version="meta.seq")
PARTITION_BY = parse_partition_by(["day(meta.ts)"], "partition_by", COLUMNS)


def event(device: int, site: str, seq: int | None, value: float, hours: int = 0) -> dict[str, Any]:
    return {
        "device": {"id": device, "name": f"d{device}"},
        "site": site,
        "meta": {"seq": seq, "ts": T0 + timedelta(hours=hours)},
        "value": value,
    }


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("krishiv")
    return catalog


@pytest.fixture(params=[MERGE_ON_READ, COPY_ON_WRITE])
def table(catalog: SqlCatalog, request: pytest.FixtureRequest) -> Table:
    return ensure_table(
        catalog,
        ("krishiv", "devices"),
        SCHEMA,
        partition_by=PARTITION_BY,
        properties={**TABLE_PROPERTIES, MERGE_MODE: request.param},
    )


class Batches:
    """Stages each batch as phase 1 does: data rows per partition (``write_staged_files``), the delete keys and the
    versioned delete keys as files of the key (and version) paths' pruned structs."""

    def __init__(self, table: Table, folder: Path) -> None:
        self.table, self.folder, self.batch_id = table, folder, 0

    def entry(
        self, rows: list[dict[str, Any]], deletes: list[dict[str, Any]], versioned: list[dict[str, Any]]
    ) -> OutboxEntry:
        batch_id, self.batch_id = self.batch_id, self.batch_id + 1
        folder = self.folder / f"batch={batch_id}"
        schema, spec, io = self.table.schema(), self.table.spec(), self.table.io
        arrow = schema_to_pyarrow(schema, include_field_ids=False)
        files = []
        if rows:
            files += write_staged_files(io, schema, spec, pa.Table.from_pylist(rows, schema=arrow), str(folder))
        for content, these, paths in (
            (DELETE_KEYS, deletes, KEY),
            (VERSIONED_DELETE_KEYS, versioned, (*KEY, "meta.seq")),
        ):
            if these:
                pruned = schema.select(*paths)
                path = folder / f"{content}.parquet"
                table = pa.Table.from_pylist(these, schema=schema_to_pyarrow(pruned, include_field_ids=True))
                pq.write_table(table, path)
                files.append(StagedFile(str(path), len(these), path.stat().st_size, content))
        return OutboxEntry(
            query_id="q",
            pipeline="p",
            table="krishiv.devices",
            batch_id=batch_id,
            offsets={"t": {"0": [batch_id * 10, batch_id * 10 + 10]}},
            files=tuple(files),
            intended_snapshot_id=new_snapshot_id(),
            operation=OPERATION,
        )


def merge(table: Table, entry: OutboxEntry) -> Table:
    table, ids = merge_commit(table, entry, snapshot_summary(entry), {high_water_property("q"): str(entry.batch_id)})
    assert ids == [entry.intended_snapshot_id]
    return table


def table_wins(table_seq: int | None, entry_seq: int | None) -> bool:
    """The merge rule (docs/spec.md, the upsert rule's phase 2): the table's row survives when its version is not
    null and the entry's is null or lower; a tie goes to the entry."""
    return table_seq is not None and (entry_seq is None or table_seq > entry_seq)


def fold(state: dict[tuple, dict[str, Any]], actions: dict[tuple, tuple[str, dict[str, Any]]]) -> None:
    """One batch into ``state`` by the rule: a tombstone deletes whatever the version, then its row (if any) is
    added; a row or a versioned delete replaces the key's row unless the table's row wins."""
    for key, (kind, ev) in actions.items():
        current = state.get(key)
        if kind.startswith("tombstone"):
            current = None
            if kind == "tombstone":
                state.pop(key, None)
                continue
        if current is not None and table_wins(current["meta"]["seq"], ev["meta"]["seq"]):
            continue
        if kind == "delete":
            state.pop(key, None)
        else:
            state[key] = ev


def key_of(row: dict[str, Any]) -> tuple:
    return (row["device"]["id"], row["site"])


def test_random_batches_merged_on_a_nested_key_and_version_equal_the_fold(table: Table, tmp_path: Path) -> None:
    rng = random.Random(36)
    batches = Batches(table, tmp_path / "staging")
    want: dict[tuple, dict[str, Any]] = {}
    for _ in range(8):
        actions: dict[tuple, tuple[str, dict[str, Any]]] = {}
        for device in rng.sample(range(-3, 12), 9):
            site = rng.choice(["north", "south"])
            seq = rng.choice([None, 0, 1, 2, 3, 5, 2**62, -(2**62)])
            ev = event(device, site, seq, rng.random(), hours=rng.randrange(-30, 30))
            actions[(device, site)] = (rng.choice(["row", "row", "delete", "tombstone", "tombstone+row"]), ev)
        rows = [ev for kind, ev in actions.values() if kind in ("row", "tombstone+row")]
        deletes = [
            {"device": {"id": k[0]}, "site": k[1]} for k, (kind, _) in actions.items() if kind.startswith("tombstone")
        ]
        versioned = [
            {"device": {"id": ev["device"]["id"]}, "site": ev["site"], "meta": {"seq": ev["meta"]["seq"]}}
            for kind, ev in actions.values()
            if kind == "delete"
        ]
        table = merge(table, batches.entry(rows, deletes, versioned))
        fold(want, actions)
        got = table.scan().to_arrow().to_pylist()
        assert len({key_of(r) for r in got}) == len(got), "a key is there twice"
        assert {key_of(r): r for r in got} == want


def test_a_null_struct_holding_the_key_is_refused(table: Table, tmp_path: Path) -> None:
    path = tmp_path / "keys.parquet"
    pruned = table.schema().select(*KEY)
    arrow = schema_to_pyarrow(pruned, include_field_ids=True)
    nullable = pa.schema([f.with_nullable(True) for f in arrow])  # what another writer might have left
    pq.write_table(pa.Table.from_pylist([{"device": None, "site": "north"}], schema=nullable), path)
    entry = Batches(table, tmp_path).entry([], [], [])
    entry = OutboxEntry(**{**entry.__dict__, "files": (StagedFile(str(path), 1, path.stat().st_size, DELETE_KEYS),)})
    with pytest.raises(MergeKeyNull) as refused:
        merge(table, entry)
    assert refused.value.column == "device.id"


def test_a_key_path_missing_from_the_table_is_refused_before_anything(table: Table, tmp_path: Path) -> None:
    entry = Batches(table, tmp_path).entry([event(1, "north", 1, 1.0)], [], [])
    entry = OutboxEntry(**{**entry.__dict__, "operation": CommitOperation(MERGE, key=("device.serial",))})
    with pytest.raises(MergeRefused, match=r"merge column .device\.serial. is not in the table.s schema"):
        merge(table, entry)


# ------------------------------------------------------------------------------------------- partition sources


def test_a_nested_partition_source_is_parsed_and_named_by_its_path() -> None:
    fields = parse_partition_by(["day(meta.ts)", "bucket(4, device.id)", "site"], "partition_by", COLUMNS)
    assert [(f.column, f.transform, f.width, f.name) for f in fields] == [
        ("meta.ts", "day", None, "meta.ts_day"),
        ("device.id", "bucket", 4, "device.id_bucket"),
        ("site", "identity", None, "site"),
    ]
    assert [f.name for f in partition_spec(SCHEMA, fields).fields] == ["meta.ts_day", "device.id_bucket", "site"]
    with pytest.raises(ConfigError, match=r"unknown column .meta\.zone."):
        parse_partition_by(["day(meta.zone)"], "partition_by", COLUMNS)
    with pytest.raises(ConfigError, match="'meta' is struct, and identity applies only to"):
        parse_partition_by(["meta"], "partition_by", COLUMNS)
    with pytest.raises(ConfigError, match="expected a column name"):
        parse_partition_by(["day(meta..ts)"], "partition_by", COLUMNS)


def test_partition_values_of_a_nested_source_from_its_struct_or_its_path() -> None:
    spec = partition_spec(SCHEMA, PARTITION_BY)
    moments = [T0, T0 + timedelta(hours=2), datetime(1969, 12, 31, 23, 59, tzinfo=UTC), None]
    # by the rule: days since the epoch, floored (a moment before 1970 is day -1)
    days = [None if m is None else int(m.timestamp() * 1000) // DAY_MS for m in moments]
    meta = pa.array(
        [None if m is None else {"seq": 1, "ts": m} for m in moments],
        pa.struct([("seq", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))]),
    )
    (from_struct,) = partition_keys(spec, SCHEMA, pa.table({"meta": meta}))
    (from_path,) = partition_keys(spec, SCHEMA, pa.table({"meta.ts": pa.array(moments, pa.timestamp("us", "UTC"))}))
    assert from_struct.to_pylist() == from_path.to_pylist() == days


def test_staged_files_are_registered_with_their_nested_sources_values(table: Table, tmp_path: Path) -> None:
    rows = [event(d, "north", d, float(d), hours=h) for d, h in [(1, -25), (2, 0), (3, 1), (4, 2), (5, 26), (6, 30)]]
    entry = Batches(table, tmp_path / "staging").entry(rows, [], [])
    table = merge(table, entry)
    want_days = {int(r["meta"]["ts"].timestamp() * 1000) // DAY_MS for r in rows}
    records = {}
    for path, f in ((t.file.file_path, t.file) for t in table.scan().plan_files()):
        days = {int(m["ts"].timestamp() * 1000) // DAY_MS for m in pq.read_table(path).column("meta").to_pylist()}
        assert days == {f.partition[0]}, path
        records[path] = f.partition[0]
    assert set(records.values()) == want_days and len(records) == len(want_days)
    since = T0 + timedelta(hours=26)
    planned = list(table.scan(row_filter=GreaterThanOrEqual("meta.ts", since.isoformat())).plan_files())
    assert len(planned) == len({d for d in want_days if d >= int(since.timestamp() * 1000) // DAY_MS})


def test_a_file_spanning_days_of_a_nested_source_is_refused(table: Table, tmp_path: Path) -> None:
    path = tmp_path / "two-days.parquet"
    arrow = schema_to_pyarrow(table.schema(), include_field_ids=True)
    pq.write_table(pa.Table.from_pylist([event(1, "a", 1, 1.0), event(2, "a", 1, 1.0, hours=30)], schema=arrow), path)
    with pytest.raises(SchemaConflict, match=r"holds rows of 2 partitions \(meta.ts_day="):
        data_file(table, str(path))


# ------------------------------------------------------------------------------------------- a table's purpose

UPSERT_SPEC = """
[[pipelines]]
name = "devices"
kind = "upsert"
topic = "t"
key = {key}
version_field = "{version}"

[pipelines.fields]
site = "string"
device = {{ type = "struct", fields = {{ id = "long", serial = "string" }} }}
meta = {{ type = "struct", fields = {{ seq = "long", rev = "long" }} }}
"""


def _pipeline(tmp_path: Path, key: list[str], version: str) -> PipelineSpec:
    path = tmp_path / "krishiv.toml"
    path.write_text(UPSERT_SPEC.format(key=json.dumps(key), version=version))
    return load_spec(path, env={}).pipelines[0]


def test_a_tables_key_and_version_are_recorded_and_compared_by_their_paths(tmp_path: Path) -> None:
    created = purpose_properties(_pipeline(tmp_path, ["device.id", "site"], "meta.seq"))
    assert (created[KEY_PROPERTY], created[VERSION_FIELD]) == ("device.id,site", "meta.seq")
    check_purpose(_pipeline(tmp_path, ["device.id", "site"], "meta.seq"), "krishiv.devices", created)
    with pytest.raises(
        SpecChangeRefused, match=r"keyed by \('device\.id', 'site'\) and the spec's key is \('device\.serial', 'site'\)"
    ):
        check_purpose(_pipeline(tmp_path, ["device.serial", "site"], "meta.seq"), "krishiv.devices", created)
    with pytest.raises(SpecChangeRefused, match=r"version_field 'meta\.seq' and the spec now says 'meta\.rev'"):
        check_purpose(_pipeline(tmp_path, ["device.id", "site"], "meta.rev"), "krishiv.devices", created)
