"""``krishiv demo`` end to end, as a user first runs it: one pipeline of each kind from one topic, all verified."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from krishiv.cli import main
from krishiv.demo import TOMBSTONED, WIDTH, demo_spec
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.spec import EVENTS, KINDS, UPSERT, WINDOWED, load_spec

REPO_SPEC = Path(__file__).resolve().parents[2] / "krishiv.toml"
RECORDS = 4_000
MALFORMED = 12
LATE = 5


@pytest.mark.timeout(540)
def test_the_demo_writes_every_kind_and_verifies(tmp_path, spark, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(WIDTH))  # what rich prints to when the output is not a terminal
    state = tmp_path / "demo"
    args = ["--spec", str(REPO_SPEC), "demo", "--state", str(state), "--records", str(RECORDS)]
    code = main([*args, "--late", str(LATE), "--malformed", str(MALFORMED)])
    out = capsys.readouterr().out
    assert code == 0, out

    repo = load_spec(REPO_SPEC, env={})
    spec = demo_spec(repo, state, "127.0.0.1:9092", RECORDS)
    sizes = {k: getattr(repo.pipeline(), k) for k in ("max_records_per_batch", "catch_up_records_per_batch")}
    first = replace(spec.pipeline(), **sizes)
    assert first == repo.pipeline(), "the repository's pipeline is the demo's first"
    assert {p.kind for p in spec.pipelines} == set(KINDS)
    assert any(p.kind == EVENTS and p.routes for p in spec.pipelines), "a fan-out"
    assert any(p.kind == EVENTS and p.kafka_metadata and p.partition_by for p in spec.pipelines), "raw events"
    assert any(p.kind == WINDOWED and p.output_mode == "update" and p.group_by for p in spec.pipelines)

    catalog = load_catalog(spec)
    for p in spec.pipelines:
        for name in p.tables:
            rows = catalog.load_table(qualified(spec, name)).scan().to_arrow()
            assert rows.num_rows > 0, name
            assert f"  {name}: {rows.num_rows:,} rows" in out, name
            if p.kind == UPSERT:
                customers = rows.column("customer_id").to_pylist()
                assert len(customers) == len(set(customers)), "one row per key"
                assert not set(TOMBSTONED) & set(customers), "tombstoned keys are deleted"
        # the malformed orders, and for all but the upsert the tombstones (a null value is no event); a windowed
        # pipeline's late events too: the 5 late orders are in a batch after the first, whose watermark closed them
        reasons = catalog.load_table(qualified(spec, p.rejects_table)).scan().to_arrow().column("reason").to_pylist()
        late = [r for r in reasons if r.startswith("late: window [")]
        assert len(reasons) - len(late) == MALFORMED + (0 if p.kind == UPSERT else len(TOMBSTONED)), p.rejects_table
        assert len(late) == (LATE if p.kind == WINDOWED else 0), p.rejects_table

    raw = next(p for p in spec.pipelines if p.kind == EVENTS and not p.routes)
    assert catalog.load_table(qualified(spec, raw.table)).scan().to_arrow().num_rows == RECORDS - MALFORMED
    assert "5/5 verify: ok" in out
    assert f"late events left out of the windows, kept in {first.rejects_table}: {LATE}" in out
    for p in spec.pipelines:
        assert any(line.split()[:2] == [p.kind, p.name] for line in out.splitlines() if line.strip()), p.name
    too_wide = [line for line in out.splitlines() if len(line) > WIDTH]
    assert not too_wide, too_wide

    # docs/quickstart.md's way to look at the tables: pyiceberg's own CLI, told the catalog's name and URI.
    pyiceberg = Path(sys.executable).with_name("pyiceberg")
    listed = subprocess.run(
        [str(pyiceberg), "--catalog", "krishiv", "--uri", spec.catalog_uri(), "list", spec.iceberg.namespace],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYICEBERG_")},
    )
    assert listed.returncode == 0, listed.stderr
    for p in spec.pipelines:
        for name in p.all_tables:
            assert f"{spec.iceberg.namespace}.{name}" in listed.stdout, name


def test_without_a_spec_the_demo_runs_the_repositorys_pipeline(tmp_path, monkeypatch):
    """Installed from its wheel, Krishiv has no repository spec beside it: `krishiv demo` in an empty folder runs the
    same classic pipeline."""
    from krishiv.commands.parser import build_parser
    from krishiv.inputs import command_spec

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KRISHIV_SPEC", raising=False)
    spec = command_spec(build_parser().parse_args(["demo"]))
    assert spec.pipelines == load_spec(REPO_SPEC, env={}).pipelines
