"""A spec that changes between runs, through the real broker, Spark, ledger and catalog.

Each test runs a pipeline, edits its spec file, produces more events and runs it again: the next start brings the
table to the spec (``krishiv_core.catalog.ensure_table``) or refuses with one line, and every Kafka offset still
lands exactly once (``_kafka_partition``/``_kafka_offset`` of every row against the topic's offsets).
"""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.expressions import EqualTo
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import DecimalType, IntegerType, LongType, StringType

from chaos.workspace import SETTINGS_TEMPLATE
from krishiv.operations import TablesRefused, commit_pipelines, open_ledger, run_pipelines
from krishiv.produce import OrderEvent, ensure_topic, produce
from krishiv_core.catalog import ensure_pipeline_tables, load_catalog, qualified
from krishiv_core.entries import PENDING
from krishiv_core.errors import KrishivError, SchemaConflict
from krishiv_core.spec import KrishivSpec, load_spec
from krishiv_core.table_purpose import SpecChangeRefused
from spark_jobs.checkpoint import Checkpoint
from spark_jobs.kafka_source import latest_offsets
from spark_jobs.window_state import WindowStateStore, mode_switch_refused
from tests.spark_jobs.pipeline_helpers import krishiv_cli

PARTITIONS = 2
SPEC_CHANGE_RUNBOOK = "(see docs/operations.md: Recovery runbook > A spec change the table cannot take)"
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z

SPEC = (
    SETTINGS_TEMPLATE
    + """
[[pipelines]]
name = "{name}"
topic = "{topic}"
max_records_per_batch = 150
{pipeline}
[pipelines.fields]
{fields}
"""
)

EVENTS = 'kind = "events"\nkafka_metadata = ["partition", "offset"]\n'
BASE_FIELDS = (
    'order_id = "string"\ncustomer_id = "string"\nqty = "int"\namount = "decimal(10,2)"\nevent_time = "timestamp_ms"'
)


def _spec(
    tmp_path: Path,
    bootstrap: str,
    topic: str,
    *,
    pipeline: str = EVENTS,
    fields: str = BASE_FIELDS,
    name: str = "orders",
) -> KrishivSpec:
    """(Re)write the test's spec file and load it."""
    path = tmp_path / "krishiv.toml"
    text = SPEC.format(
        name=name,
        bootstrap=bootstrap,
        partitions=PARTITIONS,
        catalog_uri="sqlite:///catalog.db",
        warehouse="warehouse",
        topic=topic,
        pipeline=pipeline,
        fields=fields,
    )
    path.write_text(text)
    return load_spec(path, env={})


def _order(seq: int, **extra: Any) -> dict[str, Any]:
    return {
        "order_id": f"o-{seq:06d}",
        "customer_id": f"c-{seq % 7:03d}",
        "qty": seq % 50,
        "amount": f"{seq % 1000}.{seq % 100:02d}",
        "event_time": START_MS + seq * 500,  # two events a second: a run of 400 spans several minutes
        **extra,
    }


def _produce(spec: KrishivSpec, orders: list[dict[str, Any]], first_seq: int) -> None:
    topic = spec.pipeline().topic
    ensure_topic(spec.kafka.bootstrap_servers, topic, PARTITIONS)
    events = [
        OrderEvent(seq, seq % PARTITIONS, str(o["customer_id"]).encode(), json.dumps(o).encode(), "valid")
        for seq, o in enumerate(orders, start=first_seq)
    ]
    produce(spec.kafka.bootstrap_servers, topic, events)


def _run(spec: KrishivSpec) -> None:
    pipeline = spec.pipeline()
    run_pipelines(spec, [pipeline], once=True)
    commit_pipelines(spec, [pipeline])
    assert not [
        e for t in pipeline.all_tables for e in open_ledger(spec).entries(table=qualified(spec, t), status=PENDING)
    ]


def _table(spec: KrishivSpec, name: str | None = None):
    return load_catalog(spec).load_table(qualified(spec, name or spec.pipeline().table))


def _topic_offsets(spec: KrishivSpec) -> set[tuple[int, int]]:
    ends = latest_offsets(spec.kafka.bootstrap_servers, spec.pipeline().topic, {})
    return {(int(p), o) for p, end in ends.items() for o in range(end)}


def _exactly_once(spec: KrishivSpec, rows: pa.Table) -> None:
    """Every offset of the topic is one row (every event produced here is valid), none twice."""
    seen = list(zip(rows.column("_kafka_partition").to_pylist(), rows.column("_kafka_offset").to_pylist(), strict=True))
    assert len(seen) == len(set(seen)), "an offset was written twice"
    assert set(seen) == _topic_offsets(spec), "an offset is missing"
    assert _table(spec, spec.pipeline().rejects_table).scan().to_arrow().num_rows == 0


def _by_order(rows: pa.Table) -> dict[str, dict[str, Any]]:
    return {r["order_id"]: r for r in rows.to_pylist()}


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


# ------------------------------------------------------------------------------------------- schema evolution


def test_a_new_optional_field_becomes_a_nullable_column(tmp_path, broker, spark, topic):
    spec = _spec(tmp_path, broker.bootstrap, topic)
    _produce(spec, [_order(s) for s in range(300)], 0)
    _run(spec)
    assert "channel" not in _table(spec).schema().column_names

    fields = BASE_FIELDS + '\nchannel = { type = "string", required = false }'
    spec = _spec(tmp_path, broker.bootstrap, topic, fields=fields)
    _produce(spec, [_order(s, channel=f"ch-{s % 3}") for s in range(300, 600)], 300)
    _run(spec)

    table = _table(spec)
    channel = table.schema().find_field("channel")
    assert (channel.field_type, channel.required) == (StringType(), False)
    rows = table.scan().to_arrow()
    assert rows.num_rows == 600
    _exactly_once(spec, rows)
    by_order = _by_order(rows)
    assert all(by_order[f"o-{s:06d}"]["channel"] is None for s in range(300)), "an old row reads a value"
    assert all(by_order[f"o-{s:06d}"]["channel"] == f"ch-{s % 3}" for s in range(300, 600))
    assert all(r["qty"] == int(o[2:]) % 50 for o, r in by_order.items()), "old values moved"


def test_int_to_long_and_wider_decimal_are_applied_on_the_next_start(tmp_path, broker, spark, topic):
    spec = _spec(tmp_path, broker.bootstrap, topic)
    _produce(spec, [_order(s) for s in range(300)], 0)
    _run(spec)
    schema = _table(spec).schema()
    assert (schema.find_field("qty").field_type, schema.find_field("amount").field_type) == (
        IntegerType(),
        DecimalType(10, 2),
    )

    fields = BASE_FIELDS.replace('qty = "int"', 'qty = "long"').replace("decimal(10,2)", "decimal(12,2)")
    spec = _spec(tmp_path, broker.bootstrap, topic, fields=fields)
    big = [_order(s, qty=2**40 + s, amount="9999999999.99") for s in range(300, 450)]  # fit only the wider types
    _produce(spec, big, 300)
    _run(spec)

    table = _table(spec)
    schema = table.schema()
    assert (schema.find_field("qty").field_type, schema.find_field("amount").field_type) == (
        LongType(),
        DecimalType(12, 2),
    )
    rows = table.scan().to_arrow()
    assert rows.num_rows == 450
    _exactly_once(spec, rows)
    by_order = _by_order(rows)
    for s in range(300):
        row, want = by_order[f"o-{s:06d}"], _order(s)
        assert (row["qty"], row["amount"]) == (want["qty"], Decimal(want["amount"])), s
    for s in range(300, 450):
        row = by_order[f"o-{s:06d}"]
        assert (row["qty"], row["amount"]) == (2**40 + s, Decimal("9999999999.99")), s


def test_string_to_long_is_refused_by_the_cli_in_one_line_and_nothing_is_staged(tmp_path, broker, spark, topic):
    spec = _spec(tmp_path, broker.bootstrap, topic)
    _produce(spec, [_order(s) for s in range(200)], 0)
    _run(spec)
    table_name = qualified(spec, spec.pipeline().table)
    snapshots = len(_table(spec).snapshots())
    entries = open_ledger(spec).entries()

    spec = _spec(
        tmp_path, broker.bootstrap, topic, fields=BASE_FIELDS.replace('customer_id = "string"', 'customer_id = "long"')
    )
    _produce(spec, [_order(s, customer_id=s) for s in range(200, 300)], 200)
    warehouse, checkpoints = _files(tmp_path / "warehouse"), _files(tmp_path / "checkpoints")

    refused = krishiv_cli(tmp_path / "krishiv.toml", "run", "--once")

    assert refused.returncode != 0, refused.stdout[-2000:]
    assert "Traceback" not in refused.stderr + refused.stdout, refused.stderr[-4000:]
    krishiv_lines = [line for line in refused.stderr.splitlines() if line.startswith("krishiv run:")]
    assert len(krishiv_lines) == 1, refused.stderr[-4000:]
    line = krishiv_lines[0]
    for fragment in (table_name, "'customer_id'", "string", "long", "nothing was changed"):
        assert fragment in line, line
    assert line.endswith(SPEC_CHANGE_RUNBOOK), line
    assert line.index("string") < line.index("long"), "the table's type, then the spec's"
    # Nothing staged, recorded or checkpointed; the table untouched.
    assert open_ledger(spec).entries() == entries
    assert _files(tmp_path / "warehouse") == warehouse
    assert _files(tmp_path / "checkpoints") == checkpoints
    table = _table(spec)
    assert len(table.snapshots()) == snapshots
    assert table.schema().find_field("customer_id").field_type == StringType()


WINDOWED = """event_time_field = "event_time"
window = "1m"
watermark_delay = "5s"
{extra}
[[pipelines.aggregations]]
name = "orders"
function = "count"

[[pipelines.aggregations]]
name = "amount_total"
function = "sum"
field = "amount"
"""


def test_windowed_pipeline_gaining_a_group_by_field_is_refused_in_one_line(tmp_path, broker, spark, topic):
    """A group-by field is part of a windowed table's key: the rows already written have no value for it (each is
    the total over every customer), so an existing table cannot gain one; the start must say so and change nothing."""
    spec = _spec(tmp_path, broker.bootstrap, topic, pipeline=WINDOWED.format(extra=""))
    _produce(spec, [_order(s) for s in range(300)], 0)
    _run(spec)
    table_name = qualified(spec, spec.pipeline().table)
    schema, entries = _table(spec).schema(), open_ledger(spec).entries()
    assert entries, "the first run wrote windows"

    spec = _spec(tmp_path, broker.bootstrap, topic, pipeline=WINDOWED.format(extra='group_by = ["customer_id"]'))
    _produce(spec, [_order(s) for s in range(300, 600)], 300)
    with pytest.raises(SchemaConflict) as info:
        run_pipelines(spec, [spec.pipeline()], once=True)

    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message, message
    for fragment in (table_name, "'customer_id'", "nothing was changed"):
        assert fragment in message, message
    assert _table(spec).schema() == schema
    assert open_ledger(spec).entries() == entries


def test_partition_by_changed_between_runs(tmp_path, broker, spark, topic):
    bucketed = EVENTS + 'partition_by = ["bucket(4, customer_id)"]\n'
    spec = _spec(tmp_path, broker.bootstrap, topic, pipeline=bucketed)
    _produce(spec, [_order(s) for s in range(300)], 0)
    _run(spec)
    first_spec = _table(spec).spec()

    by_day = EVENTS + 'partition_by = ["day(event_time)", "customer_id"]\n'
    spec = _spec(tmp_path, broker.bootstrap, topic, pipeline=by_day)
    _produce(spec, [_order(s) for s in range(300, 600)], 300)
    _run(spec)

    table = _table(spec)
    assert [str(f.transform) for f in table.spec().fields] == ["day", "identity"]
    assert table.spec().spec_id != first_spec.spec_id
    files = list(table.scan().plan_files())
    assert {f.file.spec_id for f in files} == {first_spec.spec_id, table.spec().spec_id}, "old and new files"
    rows = table.scan().to_arrow()
    assert rows.num_rows == 600
    _exactly_once(spec, rows)
    by_order = _by_order(rows)
    assert all(by_order[f"o-{s:06d}"]["customer_id"] == f"c-{s % 7:03d}" for s in range(600))
    # A filter on the partition column reads the right rows from files of either partitioning.
    one = table.scan(row_filter=EqualTo("customer_id", "c-003")).to_arrow()
    assert sorted(one.column("order_id").to_pylist()) == [f"o-{s:06d}" for s in range(600) if s % 7 == 3]
    assert len(list(table.scan(row_filter=EqualTo("customer_id", "c-003")).plan_files())) < len(files)


def test_a_conflicting_spec_is_refused_before_spark_starts(tmp_path, broker):
    """``krishiv run`` with a spec its table cannot take prints one line and nothing else (no JVM started)."""
    spec = _spec(tmp_path, broker.bootstrap, "orders-unused")
    ensure_topic(broker.bootstrap, "orders-unused", PARTITIONS)  # krishiv run refuses a missing topic first
    ensure_pipeline_tables(load_catalog(spec), spec, spec.pipeline())
    _spec(tmp_path, broker.bootstrap, "orders-unused", fields=BASE_FIELDS.replace('qty = "int"', 'qty = "string"'))

    refused = krishiv_cli(tmp_path / "krishiv.toml", "run", "--once")

    assert refused.returncode != 0
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("krishiv run: table krishiv.orders: column 'qty'"), lines


def test_partition_by_changed_while_batches_are_pending(tmp_path, broker, spark, topic):
    """Files staged for the old partitioning wait in the outbox: the start refuses to change the partitioning under
    them and says to commit first; following that commits every batch exactly once. If another engine changes the
    partitioning anyway, the relay refuses to register such a file under the new one and says how to get out."""
    bucketed = EVENTS + 'partition_by = ["bucket(4, customer_id)"]\n'
    spec = _spec(tmp_path, broker.bootstrap, topic, pipeline=bucketed)
    _produce(spec, [_order(s) for s in range(300)], 0)
    run_pipelines(spec, [spec.pipeline()], once=True)  # staged, not committed
    before = _table(spec).spec()

    spec = _spec(tmp_path, broker.bootstrap, topic, pipeline=EVENTS + 'partition_by = ["customer_id"]\n')
    _produce(spec, [_order(s) for s in range(300, 600)], 300)
    refused = krishiv_cli(tmp_path / "krishiv.toml", "run", "--once")
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr, refused.stderr[-3000:]
    line = refused.stderr.strip().splitlines()[-1]
    for fragment in ("not committed yet", "nothing was changed", "run krishiv commit first"):
        assert fragment in line, line
    assert line.endswith(SPEC_CHANGE_RUNBOOK), line
    assert _table(spec).spec() == before, "the partitioning did not change"

    commit_pipelines(spec, [spec.pipeline()])  # as the message says: commit, then start again
    run_pipelines(spec, [spec.pipeline()], once=True)
    assert [str(f.transform) for f in _table(spec).spec().fields] == ["identity"]
    commit_pipelines(spec, [spec.pipeline()])
    rows = _table(spec).scan().to_arrow()
    assert rows.num_rows == 600
    _exactly_once(spec, rows)

    # Another engine repartitions the table while a batch is pending: the relay refuses that batch's file.
    _produce(spec, [_order(s) for s in range(600, 700)], 600)
    run_pipelines(spec, [spec.pipeline()], once=True)
    table = _table(spec)
    with table.update_spec() as update:
        update.remove_field("customer_id")
        update.add_field("order_id", BucketTransform(4), "order_id_bucket")  # a customer's file holds several
    pending = open_ledger(spec).entries(status=PENDING)
    with pytest.raises(TablesRefused) as info:  # the table refused; any other table would still be committed
        commit_pipelines(spec, [spec.pipeline()])
    assert "holds rows of" in str(info.value) and "set partition_by back" in str(info.value), str(info.value)
    assert str(info.value).endswith(SPEC_CHANGE_RUNBOOK), str(info.value)
    table_name = qualified(spec, spec.pipeline().table)
    still = [e for e in pending if e.table == table_name]
    assert still and open_ledger(spec).entries(status=PENDING) == still, "the refused table's batches stay pending"
    assert info.value.refused.keys() == {table_name}, "its rejects table was committed"


def test_the_cli_prints_a_partitioning_in_brackets_as_it_is(tmp_path, monkeypatch, capsys):
    """Partitionings are shown as ``[day(event_time), customer_id]`` (``partitioning.describe_spec``)."""
    from krishiv import cli

    message = "table krishiv.orders is partitioned by [bucket(4, customer_id)] and the spec asks for [customer_id]"

    def refuse(*_: object) -> int:
        raise SchemaConflict(message)

    _spec(tmp_path, "127.0.0.1:9092", "orders")
    monkeypatch.setitem(cli.COMMANDS, "commit", refuse)
    assert cli.main(["--spec", str(tmp_path / "krishiv.toml"), "commit"]) == 2
    assert capsys.readouterr().err.strip() == f"krishiv commit: {message}"


def test_an_upsert_key_changed_on_an_existing_table_is_refused(tmp_path):
    upsert = 'kind = "upsert"\nkey = ["{key}"]\n'
    spec = _spec(tmp_path, "127.0.0.1:9092", "orders", pipeline=upsert.format(key="customer_id"))
    ensure_pipeline_tables(load_catalog(spec), spec, spec.pipeline())

    spec = _spec(tmp_path, "127.0.0.1:9092", "orders", pipeline=upsert.format(key="order_id"))
    with pytest.raises(SchemaConflict) as info:
        ensure_pipeline_tables(load_catalog(spec), spec, spec.pipeline())
    assert "customer_id" in str(info.value) and "order_id" in str(info.value)
    assert _table(spec).schema().identifier_field_names() == {"customer_id"}


# ------------------------------------------------------------------------------- a field removed or renamed


UPSERT_BY_ORDER = 'kind = "upsert"\nkey = ["order_id"]\nkafka_metadata = ["partition", "offset"]\n'


@pytest.mark.parametrize(
    ("pipeline", "change"),
    [(EVENTS, "remove"), (EVENTS, "rename"), (UPSERT_BY_ORDER, "remove"), (UPSERT_BY_ORDER, "rename")],
    ids=["events-remove", "events-rename", "upsert-remove", "upsert-rename"],
)
def test_a_removed_or_renamed_field_keeps_its_column_and_new_rows_leave_it_null(
    tmp_path, broker, spark, topic, pipeline, change
):
    """docs/spec.md, changing a spec: a removed field's column is kept (old rows keep their values, new rows have
    null); a rename is a removal plus a new field. The oracle folds the produced events in offset order: an events table
    has every event, an upsert table the last event of each order id (the second run updates some old orders)."""
    with_plan = BASE_FIELDS + '\nplan = "string"'
    spec = _spec(tmp_path, broker.bootstrap, topic, pipeline=pipeline, fields=with_plan)
    first = [_order(s, plan=f"p{s % 3}") for s in range(60)]
    _produce(spec, first, 0)
    _run(spec)

    fields = BASE_FIELDS + ('\ntier = "string"' if change == "rename" else "")
    spec = _spec(tmp_path, broker.bootstrap, topic, pipeline=pipeline, fields=fields)
    updates = [{**_order(s), "qty": 49} for s in range(0, 60, 10)]  # orders 0, 10, ... again: an upsert replaces them
    second = [{**_order(s), **({"tier": f"t{s % 2}"} if change == "rename" else {})} for s in range(60, 120)]
    second += [{**u, **({"tier": "t9"} if change == "rename" else {})} for u in updates]
    _produce(spec, second, 60)
    _run(spec)

    table = _table(spec)
    assert not table.schema().find_field("plan").required, "the removed field's column is kept, optional"
    rows = table.scan().to_arrow()
    produced = first + second  # offset order within each partition is production order
    if pipeline == EVENTS:
        _exactly_once(spec, rows)
        want = [{"order_id": o["order_id"], "plan": o.get("plan"), "tier": o.get("tier")} for o in produced]
    else:
        latest: dict[str, dict[str, Any]] = {}
        for o in produced:
            latest[o["order_id"]] = o
        want = [{"order_id": o["order_id"], "plan": o.get("plan"), "tier": o.get("tier")} for o in latest.values()]
    columns = ["order_id", "plan", "tier"] if change == "rename" else ["order_id", "plan"]
    got = sorted((tuple(r[c] for c in columns) for r in rows.to_pylist()), key=str)
    assert got == sorted((tuple(w[c] for c in columns) for w in want), key=str)
    if change == "rename":
        assert not table.schema().find_field("tier").required


def test_a_run_that_fails_before_its_first_batch_is_recorded_leaves_the_table_as_it_was(
    tmp_path, broker, spark, topic, monkeypatch
):
    """A schema change reaches the table only with the first batch staged for it: a run of the new spec that fails
    before (here: its first batch's files are written, then the stager fails) leaves the table's metadata as it was,
    so the old spec still runs; the new spec then applies the change with its first batch, recorded with the schema
    id the files were staged for; every offset lands once."""
    with_plan = BASE_FIELDS + '\nplan = "string"'
    spec = _spec(tmp_path, broker.bootstrap, topic, fields=with_plan)
    _produce(spec, [_order(s, plan="gold") for s in range(40)], 0)
    _run(spec)
    before = _table(spec)

    renamed = BASE_FIELDS + '\ntier = "string"'
    spec = _spec(tmp_path, broker.bootstrap, topic, fields=renamed)
    _produce(spec, [_order(s, plan="gold", tier="t") for s in range(40, 80)], 40)
    monkeypatch.setenv("KRISHIV_FAULTS", "stage.after_files:raise")
    with pytest.raises(KrishivError, match="query orders failed"):
        run_pipelines(spec, [spec.pipeline()], once=True)
    monkeypatch.delenv("KRISHIV_FAULTS")
    after = _table(spec)
    assert after.metadata_location == before.metadata_location, "the failed run changed the table"
    assert after.schema().find_field("plan").required and "tier" not in after.schema().column_names

    spec = _spec(tmp_path, broker.bootstrap, topic, fields=with_plan)  # the old spec still runs
    _produce(spec, [_order(s, plan="gold") for s in range(80, 100)], 80)
    _run(spec)
    assert _table(spec).schema().find_field("plan").required

    spec = _spec(tmp_path, broker.bootstrap, topic, fields=renamed)
    _produce(spec, [_order(s, tier="t") for s in range(100, 120)], 100)
    _run(spec)
    table = _table(spec)
    assert not table.schema().find_field("plan").required and "tier" in table.schema().column_names
    rows = table.scan().to_arrow()
    _exactly_once(spec, rows)
    by_order = _by_order(rows)
    # The failed run's events were staged again by the old spec's run (with their plan, no tier column then).
    assert all(by_order[f"o-{s:06d}"]["plan"] == "gold" for s in range(100)), "an old row lost its value"
    assert all(by_order[f"o-{s:06d}"]["tier"] is None for s in range(100))
    assert all((by_order[f"o-{s:06d}"]["plan"], by_order[f"o-{s:06d}"]["tier"]) == (None, "t") for s in range(100, 120))
    ledger = open_ledger(spec)
    last = max(ledger.entries(table=qualified(spec, spec.pipeline().table)), key=lambda e: e.created_at)
    assert last.schema_id == table.schema().schema_id


def test_a_run_that_dies_after_recording_its_first_batch_leaves_the_schema_to_the_relay(
    tmp_path, broker, spark, topic, monkeypatch
):
    """The stager records a batch staged for a new schema, then dies before changing the table: the table is as it
    was, the entry carries the schema its files were staged for, and the relay brings the table to it in the commit
    of that batch, so the new column's values arrive with it; every offset lands once."""
    spec = _spec(tmp_path, broker.bootstrap, topic, fields=BASE_FIELDS)
    _produce(spec, [_order(s) for s in range(30)], 0)
    _run(spec)
    before = _table(spec)

    spec = _spec(tmp_path, broker.bootstrap, topic, fields=BASE_FIELDS + '\ntier = "string"')
    _produce(spec, [_order(s, tier="t") for s in range(30, 60)], 30)
    monkeypatch.setenv("KRISHIV_FAULTS", "stage.after_ledger:raise")
    with pytest.raises(KrishivError, match="query orders failed"):
        run_pipelines(spec, [spec.pipeline()], once=True)
    monkeypatch.delenv("KRISHIV_FAULTS")
    assert _table(spec).metadata_location == before.metadata_location, "the schema came before the relay"
    ledger = open_ledger(spec)
    (pending,) = ledger.pending(qualified(spec, spec.pipeline().table))
    assert pending.schema_change is not None and "tier" in pending.schema_change

    commit_pipelines(spec, [spec.pipeline()])
    table = _table(spec)
    assert "tier" in table.schema().column_names
    assert table.schema().schema_id == pending.schema_id
    _run(spec)  # the batch is replayed (recorded: nothing staged again) and the run goes on
    rows = _table(spec).scan().to_arrow()
    _exactly_once(spec, rows)
    by_order = _by_order(rows)
    assert all(by_order[f"o-{s:06d}"]["tier"] is None for s in range(30))
    assert all(by_order[f"o-{s:06d}"]["tier"] == "t" for s in range(30, 60)), "the batch's new column lost"


# ------------------------------------------------------------------------- changes refused before any work


def _refused_line(spec_file: Path) -> str:
    refused = krishiv_cli(spec_file, "run", "--once")
    assert refused.returncode != 0, refused.stdout[-2000:]
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    return lines[0]


def test_a_kind_change_is_refused_in_one_line_before_spark_starts_and_the_runbook_ways_out_go_on(
    tmp_path, broker, spark, topic
):
    """The refusal names the runbook's section; both of its ways out work: the spec set back goes on where it
    stopped, and a new pipeline name with a new table starts the new kind over from the topic's start."""
    spec = _spec(tmp_path, broker.bootstrap, topic)
    _produce(spec, [_order(s) for s in range(4)], 0)
    _run(spec)
    assert _table(spec).properties["krishiv.kind"] == "events", "the table records what it was created for"
    metadata = _table(spec).metadata_location
    upsert = 'kind = "upsert"\nkey = ["order_id"]\n'
    _spec(tmp_path, broker.bootstrap, topic, pipeline=upsert)

    line = _refused_line(tmp_path / "krishiv.toml")

    for fragment in ("pipeline 'orders'", "krishiv.orders", "kind 'events'", "kind 'upsert'", "new pipeline name"):
        assert fragment in line, line
    assert line.endswith(SPEC_CHANGE_RUNBOOK), line
    assert _table(spec).metadata_location == metadata

    spec = _spec(tmp_path, broker.bootstrap, topic)  # the kind set back: the pipeline goes on where it stopped
    _produce(spec, [_order(s) for s in range(4, 6)], 4)
    _run(spec)
    _exactly_once(spec, _table(spec).scan().to_arrow())

    metadata = _table(spec).metadata_location
    renamed = _spec(tmp_path, broker.bootstrap, topic, name="orders_v2", pipeline=upsert + 'table = "orders_v2"\n')
    _run(renamed)  # a new pipeline name and table: the new kind, from the topic's start
    assert sorted(_table(renamed).scan().to_arrow().column("order_id").to_pylist()) == [f"o-{s:06d}" for s in range(6)]
    assert _table(spec).metadata_location == metadata, "the old table stays as it was"


@pytest.mark.parametrize(
    ("before", "after", "fragments"),
    [
        ('key = ["order_id"]', 'key = ["customer_id"]', ("('order_id')", "key is ('customer_id')")),
        (
            'key = ["order_id"]\nversion_field = "qty"',
            'key = ["order_id"]',
            ("version_field 'qty'", "none (Kafka offset order)"),
        ),
        ('key = ["order_id"]\nversion_field = "qty"', 'key = ["order_id"]\nversion_field = "amount"', ("'amount'",)),
    ],
    ids=["key", "version-field-dropped", "version-field-changed"],
)
def test_an_upsert_key_or_version_field_change_is_refused_naming_the_pipeline(tmp_path, before, after, fragments):
    spec = _spec(tmp_path, "127.0.0.1:9092", "orders", pipeline=f'kind = "upsert"\n{before}\n')
    ensure_pipeline_tables(load_catalog(spec), spec, spec.pipeline())
    properties = _table(spec).properties

    spec = _spec(tmp_path, "127.0.0.1:9092", "orders", pipeline=f'kind = "upsert"\n{after}\n')
    with pytest.raises(SpecChangeRefused) as info:
        ensure_pipeline_tables(load_catalog(spec), spec, spec.pipeline())

    message = str(info.value)
    assert "\n" not in message and message.startswith("pipeline 'orders': table krishiv.orders"), message
    for fragment in (*fragments, "nothing was changed", "new table"):
        assert fragment in message, message
    assert message.endswith(SPEC_CHANGE_RUNBOOK), message
    assert _table(spec).properties == properties


def test_an_output_mode_switch_with_open_windows_is_refused_before_spark_starts(tmp_path, broker, spark, topic):
    """Update mode wrote the open windows' rows already; append would write them again when they close. The mode
    is recorded with the window state (and the table), and the switch is refused in one line while windows are
    open, leaving checkpoint, ledger and table as they were."""
    update = WINDOWED.format(extra='group_by = ["customer_id"]\noutput_mode = "update"')
    spec = _spec(tmp_path, broker.bootstrap, topic, pipeline=update)
    _produce(spec, [_order(s) for s in range(200)], 0)
    _run(spec)
    table = _table(spec)
    assert table.properties["krishiv.output-mode"] == "update"
    store = WindowStateStore(spec.checkpoint_dir(spec.pipeline()))
    state = store.load_before(Checkpoint(spec.checkpoint_dir(spec.pipeline())).last_batch_id() + 1)
    assert state.output_mode == "update" and state.open_windows > 0

    _spec(tmp_path, broker.bootstrap, topic, pipeline=update.replace('"update"', '"append"'))
    _produce(spec, [_order(s) for s in range(200, 300)], 200)
    checkpoints, entries = _files(tmp_path / "checkpoints"), open_ledger(spec).entries()

    line = _refused_line(tmp_path / "krishiv.toml")

    for fragment in ("pipeline 'orders'", "from 'update' to 'append'", "window(s) are open", "set output_mode back"):
        assert fragment in line, line
    assert line.endswith(SPEC_CHANGE_RUNBOOK), line
    assert _files(tmp_path / "checkpoints") == checkpoints
    assert open_ledger(spec).entries() == entries
    assert _table(spec).metadata_location == table.metadata_location

    # The window of the newest event is always open (it ends after the watermark), so the switch cannot wait for
    # them to close: the runbook's way on is the mode set back, and the pipeline goes on where it stopped.
    _produce(spec, [_order(1000, event_time=START_MS + 3_600_000)], 300)  # an hour later: earlier windows close
    spec = _spec(tmp_path, broker.bootstrap, topic, pipeline=update)
    _run(spec)
    state = store.load_before(Checkpoint(spec.checkpoint_dir(spec.pipeline())).last_batch_id() + 1)
    assert state.open_windows == 1, "the newest event's window stays open"
    assert mode_switch_refused(replace(spec.pipeline(), output_mode="append"), state, "the checkpoint") is not None


def test_a_windowed_group_by_field_removed_is_refused_naming_the_pipeline(tmp_path):
    """A group_by field is part of a windowed table's key: removing it would merge rows of different groups."""
    spec = _spec(tmp_path, "127.0.0.1:9092", "orders", pipeline=WINDOWED.format(extra='group_by = ["customer_id"]'))
    ensure_pipeline_tables(load_catalog(spec), spec, spec.pipeline())
    schema = _table(spec).schema()

    spec = _spec(tmp_path, "127.0.0.1:9092", "orders", pipeline=WINDOWED.format(extra=""))
    with pytest.raises(SpecChangeRefused) as info:
        ensure_pipeline_tables(load_catalog(spec), spec, spec.pipeline())
    message = str(info.value)
    for fragment in ("pipeline 'orders'", "('customer_id')", "group_by is (nothing)", "new table"):
        assert fragment in message, message
    assert _table(spec).schema() == schema
