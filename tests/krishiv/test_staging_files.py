"""Staged files survive Iceberg's standard orphan-file removal; a PENDING batch whose files are gone is staged
again; files nothing refers to are removed after a grace period. Real broker, Spark, ledger and catalog."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.table import Table

from chaos.workspace import ORDER_FIELDS, SETTINGS_TEMPLATE
from krishiv.cli import main
from krishiv.operations import TablesRefused, commit_pipelines, open_ledger, run_pipelines
from krishiv.produce import demo_orders, ensure_topic, produce
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.entries import PENDING
from krishiv_core.runbook import runbook
from krishiv_core.spec import load_spec
from spark_jobs.staging import staging_root
from tests.spark_jobs.pipeline_helpers import assert_exactly_once, produce_orders


def local(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


def remove_orphan_files_as_iceberg_does(table: Table) -> list[Path]:
    """Iceberg's RemoveOrphanFiles: every file under the table location that no metadata of the table refers to
    (metadata files, manifest lists, manifests, data files of any snapshot) is deleted; here with no grace."""
    referenced = {table.metadata_location, *(m.metadata_file for m in table.metadata.metadata_log)}
    for snapshot in table.snapshots():
        referenced.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            referenced.add(manifest.manifest_path)
            referenced.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io, False))
    removed = []
    for path in local(table.location()).rglob("*"):
        if path.is_file() and f"file://{path}" not in referenced and str(path) not in referenced:
            path.unlink()
            removed.append(path)
    return removed


def test_orphan_removal_leaves_pending_files_and_restage_brings_back_deleted_ones(make_spec, spec_file, spark, capsys):
    spec = make_spec(max_records=1_000)
    produce_orders(spec, 3_000, late=5, malformed=6)
    run_pipelines(spec, list(spec.pipelines), once=True)
    catalog, ledger = load_catalog(spec), open_ledger(spec)
    table_name = qualified(spec, spec.pipeline().table)
    commit_pipelines(spec, list(spec.pipelines))  # some history in the table, so orphan removal has work
    produce_orders(spec, 2_000, seed=8, start_ms=1_767_225_600_000 + 3_000 * 50)
    run_pipelines(spec, list(spec.pipelines), once=True)
    pending = [e for e in ledger.pending(table_name) if e.files]
    assert len(pending) >= 2

    table = catalog.load_table(table_name)
    stray = local(table.location()) / "data" / "stray.parquet"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"an orphan inside the table location")
    removed = remove_orphan_files_as_iceberg_does(table)
    assert [p.name for p in removed] == ["stray.parquet"], "the removal ran, and found no staged file to remove"
    assert all(local(f.path).exists() for e in ledger.entries() for f in e.files)

    # Files of a PENDING batch deleted anyway (by hand): the relay stops, restage writes them again.
    victim = pending[1]
    for f in victim.files:
        local(f.path).unlink()
    with pytest.raises(TablesRefused, match=victim.files[0].path) as refused:  # StagedFileMissing, that table only
        commit_pipelines(spec, list(spec.pipelines))
    assert str(refused.value).endswith("(see docs/operations.md: Recovery runbook > A staged file that is gone)")
    assert main(["--spec", str(spec_file), "restage"]) == 0
    assert f"staged batches [{victim.batch_id}] again" in capsys.readouterr().out
    again = ledger.get(victim.query_id, table_name, victim.batch_id)
    assert again.status == PENDING and again.intended_snapshot_id == victim.intended_snapshot_id
    assert again.offsets == victim.offsets and again.files != victim.files
    assert main(["--spec", str(spec_file), "restage"]) == 0
    assert "nothing to restage" in capsys.readouterr().out
    assert_exactly_once(spec)


def test_clean_staging_removes_only_old_files_nothing_refers_to(make_spec, spec_file, spark, capsys):
    spec = make_spec(max_records=1_000)
    produce_orders(spec, 2_000, malformed=3)
    run_pipelines(spec, list(spec.pipelines), once=True)
    commit_pipelines(spec, list(spec.pipelines))
    table = load_catalog(spec).load_table(qualified(spec, spec.pipeline().table))
    root = local(staging_root(table))
    kept = sorted(p for p in root.rglob("*.parquet"))
    old, young = root / "query=dead" / "batch=000000000007" / "part-old.parquet", root / "part-young.parquet"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"left by a stager killed before its ledger write")
    young.write_bytes(b"a stager may be about to record this")
    an_hour_ago = time.time() - 7_200
    os.utime(old, (an_hour_ago, an_hour_ago))

    assert main(["--spec", str(spec_file), "clean-staging", "--dry-run"]) == 0
    assert old.exists() and "would remove 1 staged files" in capsys.readouterr().out
    assert main(["--spec", str(spec_file), "clean-staging", "--grace", "1h"]) == 0
    out = capsys.readouterr().out
    assert f"removed 1 staged files ({len(b'left by a stager killed before its ledger write')} bytes)" in out
    assert f"kept {len(kept)} referenced and 1 younger than 1h" in out
    assert not old.exists() and young.exists() and all(p.exists() for p in kept)
    assert_exactly_once(spec)


UPSERT_SPEC = (
    SETTINGS_TEMPLATE
    + """
[[pipelines]]
name = "latest_order"
kind = "upsert"
topic = "{topic}"
key = ["customer_id"]
"""
    + ORDER_FIELDS
)


def test_a_merge_refused_for_a_damaged_staged_file_goes_on_after_the_runbook_restage(
    tmp_path, broker, topic, spark, capsys
):
    """The runbook's "A merge the relay refuses": a staged file not as phase 1 writes it (here its rows twice) is
    refused; its batch's staged files removed and ``krishiv restage`` run, the batch commits, each key's latest event
    once."""
    spec_file = tmp_path / "krishiv.toml"
    spec_file.write_text(
        UPSERT_SPEC.format(
            bootstrap=broker.bootstrap,
            partitions=1,
            catalog_uri="sqlite:///catalog.db",
            warehouse="warehouse",
            topic=topic,
        )
    )
    spec = load_spec(spec_file, env={})
    events = demo_orders(8, partitions=1)
    ensure_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, events)
    run_pipelines(spec, [spec.pipeline()], once=True)
    table_name = qualified(spec, spec.pipeline().table)
    (entry,) = [e for e in open_ledger(spec).pending(table_name) if e.files]
    damaged = local(entry.files[0].path)
    rows = pq.read_table(damaged)
    pq.write_table(pa.concat_tables([rows, rows]), damaged)

    with pytest.raises(TablesRefused) as refused:
        commit_pipelines(spec, [spec.pipeline()])
    assert "more than one row" in str(refused.value)
    assert str(refused.value).endswith(runbook("A merge the relay refuses")), refused.value

    for f in entry.files:  # the runbook's steps
        local(f.path).unlink()
    assert main(["--spec", str(spec_file), "restage"]) == 0
    assert f"staged batches [{entry.batch_id}] again" in capsys.readouterr().out
    commit_pipelines(spec, [spec.pipeline()])

    latest = {e.key.decode(): e.value for e in events}  # one partition: offset order is the order produced
    table = load_catalog(spec).load_table(table_name)
    got = {r["customer_id"]: r["order_id"] for r in table.scan().to_arrow().to_pylist()}
    assert got == {k: json.loads(v)["order_id"] for k, v in latest.items()}
