"""The Dagster asset checks across a compaction: batches committed by the relay into the spec's real catalog and
ledger, a compaction, then the checks materialized in-process (no Spark): they pass, count the compaction as
maintenance, and a duplicate a second writer adds is traced through the compacted file to the snapshots that
added its rows, not to the compaction."""

from __future__ import annotations

import dagster as dg

from krishiv.operations import open_ledger
from krishiv_assets.assets import PipelineKeys
from krishiv_assets.definitions import build_resources, pipeline_definitions
from krishiv_core.catalog import load_catalog, qualified
from outbox.compaction import compact_table
from outbox.relay import CommitRelay
from tests.outbox.test_relay import stage

CHECKS = ("no_duplicate_windows", "lineage_linear", "ledger_agreement")


def _run_checks(spec) -> dict[str, dg.AssetCheckEvaluation]:
    pipeline = spec.pipeline()
    keys = PipelineKeys.of(spec, pipeline)
    parts = pipeline_definitions(spec, pipeline)
    selection = dg.AssetSelection.checks(*(dg.AssetCheckKey(keys.table, name) for name in CHECKS))
    result = dg.materialize(
        [*parts.assets, *parts.checks], resources=build_resources(spec), selection=selection, raise_on_error=False
    )
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_checks_pass_across_a_compaction_and_trace_a_duplicate_through_it(make_spec):
    spec = make_spec()
    pipeline = spec.pipeline()
    name = qualified(spec, pipeline.table)
    catalog, ledger = load_catalog(spec), open_ledger(spec)
    namespace = name.rsplit(".", 1)[0]
    for b in range(4):
        stage(catalog, ledger, b, b, pipeline=pipeline, namespace=namespace)
    assert CommitRelay(ledger, catalog).commit_table(name).committed == [0, 1, 2, 3]
    batch_snapshots = [s.snapshot_id for s in catalog.load_table(name).snapshots()]
    assert compact_table(catalog.load_table(name), target_file_size=1 << 20, min_files=2).files_rewritten == 4

    checks = _run_checks(spec)
    assert set(checks) == set(CHECKS)
    assert all(e.passed for e in checks.values()), {n: e.description for n, e in checks.items()}
    lineage = checks["lineage_linear"].metadata
    assert (lineage["krishiv_snapshots"].value, lineage["maintenance_snapshots"].value) == (4, 1)
    assert lineage["other_snapshots"].value == 0

    # A second writer appends batch 2's window again; a compaction folds both copies into one file.
    table = catalog.load_table(name)
    rows = table.scan().to_arrow()
    table.append(rows.filter(rows["order_count"].to_numpy() == 3))
    backfill = catalog.load_table(name).current_snapshot().snapshot_id
    assert compact_table(catalog.load_table(name), target_file_size=1 << 20, min_files=2).files_rewritten == 2
    checks = _run_checks(spec)
    duplicates = checks["no_duplicate_windows"]
    assert not duplicates.passed
    assert duplicates.metadata["offending_windows"].value == {
        "window 2026-01-01 00:02:00+00:00 to 2026-01-01 00:03:00+00:00": sorted([batch_snapshots[2], backfill])
    }
    assert checks["lineage_linear"].passed
