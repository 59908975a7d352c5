"""The commit paths never wedge: a table that refuses stops only itself (``krishiv commit``, a Dagster commit run),
and what was staged for a table the spec no longer names (a removed route, a removed pipeline) is still seen by
``krishiv status`` and committed by ``krishiv commit``. Real ledger and SQLite catalog; batches are staged as the
stager stages them (one entry per table of the batch, in one ledger transaction), without Spark."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import dagster as dg
import pyarrow as pa
from pyiceberg.catalog import Catalog

from krishiv.cli import main
from krishiv.operations import open_ledger
from krishiv.produce import ensure_topic
from krishiv_assets.assets import PipelineKeys
from krishiv_assets.definitions import build_definitions, build_resources, pipeline_definitions
from krishiv_core.catalog import ensure_pipeline_tables, load_catalog, qualified
from krishiv_core.entries import COMMITTED, PENDING, OutboxEntry, new_snapshot_id
from krishiv_core.spec import KrishivSpec, PipelineSpec, load_spec
from outbox.ledger import Ledger
from outbox.relay import CommitRelay
from spark_jobs.staging import staging_folder, write_parquet

QUERY = "q-commit-paths"

SPEC = """
[kafka]
bootstrap_servers = "{bootstrap}"

[iceberg]
catalog_uri = "sqlite:///catalog.db"
warehouse = "warehouse"

[storage]
ledger_path = "ledger.duckdb"
checkpoint_location = "checkpoints"

[[pipelines]]
name = "orders_routed"
kind = "events"
topic = "orders"
route_by = "customer_id"
routes = {{ {routes} }}
unrouted = "orders_other"

[pipelines.fields]
order_id = "string"
customer_id = "string"
amount = "decimal(12,2)"
event_time = "timestamp_ms"
{more}"""

ROUTES = '"c-001" = "orders_c001", "c-002" = "orders_c002"'

SECOND_PIPELINE = """
[[pipelines]]
name = "payments"
kind = "events"
topic = "payments"

[pipelines.fields]
payment_id = "string"
event_time = "timestamp_ms"
"""


def write_spec(folder: Path, *, routes: str = ROUTES, second: bool = False, bootstrap: str = "127.0.0.1:1") -> Path:
    path = folder / "krishiv.toml"
    path.write_text(SPEC.format(bootstrap=bootstrap, routes=routes, more=SECOND_PIPELINE if second else ""))
    return path


def rows_for(table_name: str, batch_id: int) -> pa.Table:
    """Two rows a batch of the pipeline stages for ``table_name`` (a rejects table gets rejects)."""
    at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=batch_id)
    if table_name.endswith("_rejects"):
        return pa.table(
            {
                "topic": ["orders"],
                "partition": pa.array([0], pa.int32()),
                "offset": pa.array([batch_id * 10], pa.int64()),
                "reason": ["malformed JSON"],
                "batch_id": pa.array([batch_id], pa.int64()),
            }
        )
    ids = [f"{table_name}-{batch_id}-{n}" for n in range(2)]
    if "payments" in table_name:
        return pa.table({"payment_id": ids, "event_time": pa.array([at, at], pa.timestamp("us", tz="UTC"))})
    return pa.table(
        {
            "order_id": ids,
            "customer_id": ["c-x", "c-x"],
            "amount": pa.array([Decimal("1.50"), Decimal("2.25")], pa.decimal128(12, 2)),
            "event_time": pa.array([at, at], pa.timestamp("us", tz="UTC")),
        }
    )


def stage_batch(spec: KrishivSpec, pipeline: PipelineSpec, catalog: Catalog, ledger: Ledger, batch_id: int) -> None:
    """One batch of ``pipeline``: files staged beside each of its tables and one entry per table, recorded at once."""
    tables = ensure_pipeline_tables(catalog, spec, pipeline)
    entries = []
    for name, table in tables.items():
        files = write_parquet(table, rows_for(name, batch_id), staging_folder(table, QUERY + pipeline.name, batch_id))
        offsets = {pipeline.topic: {"0": [batch_id * 10, batch_id * 10 + 10]}}
        entries.append(
            OutboxEntry(
                QUERY + pipeline.name,
                pipeline.name,
                qualified(spec, name),
                batch_id,
                offsets,
                files,
                new_snapshot_id(),
                {},
            )
        )
    assert ledger.record_batch(entries) == [True] * len(entries)


def rows_in(catalog: Catalog, table: str) -> int:
    return catalog.load_table(table).scan().to_arrow().num_rows


def pending_line(out: str, name: str) -> str:
    return next(line.strip() for line in out.splitlines() if line.strip().startswith(f"{name}:"))


def test_a_refused_table_holds_back_its_batch_and_every_other_pipeline_commits(tmp_path: Path, capsys) -> None:
    spec_file = write_spec(tmp_path, second=True)
    spec = load_spec(spec_file, env={})
    catalog, ledger = load_catalog(spec), open_ledger(spec)
    for b in range(2):
        for p in spec.pipelines:
            stage_batch(spec, p, catalog, ledger, b)
    broken = qualified(spec, "orders_c002")  # the tables after it in the spec are committed after it
    (gone,) = next(e for e in ledger.pending(broken) if e.batch_id == 1).files
    Path(gone.path.removeprefix("file://")).unlink()  # committing batch 1 would lose its rows

    assert main(["--spec", str(spec_file), "commit"]) == 1
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err, "one line: the tables held back, why, and the way out"
    routed = [qualified(spec, t) for t in spec.pipeline("orders_routed").all_tables]
    held = {t for t in routed if any(e.batch_id == 1 and not e.changes_nothing for e in ledger.entries(t))}
    assert broken in held and len(held) > 1, "batch 1 has rows for several tables of the fan-out"
    named = err.removeprefix("krishiv commit: ").split(": ", 1)[0]
    assert set(named.split(", ")) == held, "each table of the batch is held back, in one line"
    assert gone.path in err and "stay pending" in err
    assert "`krishiv restage` stages the batch again" in err, "the way out"
    assert err.rstrip("\n").endswith("(see docs/operations.md: Recovery runbook > A staged file that is gone)"), err
    assert "payments " in out, "the other pipeline's commits are shown"
    for table in [qualified(spec, t) for p in spec.pipelines for t in p.all_tables]:
        statuses = [e.status for e in sorted(ledger.entries(table), key=lambda e: e.batch_id)]
        assert statuses == ([COMMITTED, PENDING] if table in held else [COMMITTED, COMMITTED]), table
    assert rows_in(catalog, broken) == 2, "its batch 0 went in before the refusal, batch 1 waits"
    assert rows_in(catalog, qualified(spec, "payments")) == 4

    # The same in a Dagster commit run of the pipeline: the other tables are committed and materialized, the run fails.
    stage_batch(spec, spec.pipeline("orders_routed"), catalog, ledger, 2)
    pipeline = spec.pipeline("orders_routed")
    parts, keys = pipeline_definitions(spec, pipeline), PipelineKeys.of(spec, pipeline)
    result = dg.materialize(
        [*parts.assets, *parts.checks],
        resources=build_resources(spec),
        selection=dg.AssetSelection.assets(*keys.tables.values()).without_checks(),
        raise_on_error=False,
    )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    message = failure.step_failure_data.user_failure_data.description
    assert "TablesRefused" in message and broken in message and gone.path in message
    materialized = {e.asset_key for e in result.get_asset_materialization_events()}
    assert materialized == {k for n, k in keys.tables.items() if qualified(spec, n) not in held}
    for name in pipeline.all_tables:  # batch 2 waits behind batch 1 in the tables batch 1 holds back
        table = qualified(spec, name)
        statuses = [e.status for e in sorted(ledger.entries(table), key=lambda e: e.batch_id)]
        assert statuses == ([COMMITTED, PENDING, PENDING] if table in held else [COMMITTED] * 3), table


def test_a_route_removed_with_pending_batches_is_still_seen_and_committed(tmp_path: Path, broker, capsys) -> None:
    spec_file = write_spec(tmp_path, second=True, bootstrap=broker.bootstrap)
    spec = load_spec(spec_file, env={})
    catalog, ledger = load_catalog(spec), open_ledger(spec)
    for b in range(2):
        for p in spec.pipelines:
            stage_batch(spec, p, catalog, ledger, b)
    route, payments = qualified(spec, "orders_c002"), qualified(spec, "payments")

    # The route c-002 and the whole payments pipeline leave the spec while their batches are pending.
    write_spec(tmp_path, routes='"c-001" = "orders_c001"', bootstrap=broker.bootstrap)
    ensure_topic(broker.bootstrap, "orders", 1)  # status exits 1 for a pipeline whose topic is missing
    assert main(["--spec", str(spec_file), "status"]) == 0
    out = capsys.readouterr().out
    assert pending_line(out, "orders_c002") == "orders_c002: 2 pending, 0 committed, 0 rows appended"
    assert "payments (no longer in the spec" in out
    assert pending_line(out, "payments") == "payments: 2 pending, 0 committed"

    # The Dagster outbox sensor still sees the route's batches; committing the tables the spec still names commits
    # the route's too, since each batch is committed to all of its tables at once (PROTOCOL.md, invariant 19).
    spec = load_spec(spec_file, env={})
    tables = [qualified(spec, t) for t in spec.pipeline().all_tables]
    assert route not in tables
    defs = build_definitions(spec)
    sensor = defs.resolve_sensor_def("orders_routed_outbox_sensor")
    with (
        dg.DagsterInstance.ephemeral() as instance,
        dg.build_sensor_context(instance=instance, resources=build_resources(spec), definitions=defs) as context,
    ):
        (request,) = sensor.evaluate_tick(context).run_requests
    assert request.run_key == f"orders_routed:commit:{(QUERY + 'orders_routed')[:8]}:0-1"
    reports = CommitRelay(ledger, catalog).run(tables)
    assert {r.table: r.committed for r in reports}[route] == [0, 1]
    assert {b.table for b in ledger.pending_batches()} == {payments, payments + "_rejects"}

    assert main(["--spec", str(spec_file), "commit"]) == 0
    out = capsys.readouterr().out
    assert "payments " in out
    assert rows_in(catalog, route) == 4 and rows_in(catalog, payments) == 4, "each batch where it was staged for"
    assert ledger.pending_batches() == []
    assert main(["--spec", str(spec_file), "status"]) == 0
    out = capsys.readouterr().out
    assert "orders_c002" not in out and "payments" not in out, "nothing pending is left anywhere to show"
    assert "0 pending" in pending_line(out, "orders_c001")


def test_commit_of_one_pipeline_takes_its_removed_routes_only(tmp_path: Path, capsys) -> None:
    spec_file = write_spec(tmp_path, second=True)
    spec = load_spec(spec_file, env={})
    catalog, ledger = load_catalog(spec), open_ledger(spec)
    for p in spec.pipelines:
        stage_batch(spec, p, catalog, ledger, 0)
    write_spec(tmp_path, routes='"c-001" = "orders_c001"', second=True)
    assert main(["--spec", str(spec_file), "commit", "--pipeline", "orders_routed"]) == 0
    capsys.readouterr()
    assert ledger.get(QUERY + "orders_routed", qualified(spec, "orders_c002"), 0).status == COMMITTED
    assert ledger.get(QUERY + "payments", qualified(spec, "payments"), 0).status == PENDING
