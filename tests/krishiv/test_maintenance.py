"""The maintenance commands (compact, expire-snapshots, remove-orphans, maintain) through the CLI, on a real
SQLite catalog and ledger: batches staged directly (each command's line per table, the relay, the ledger agreement
and the rows across all three), and once on tables Spark wrote from the real broker, checked against the oracle."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from krishiv.cli import main
from krishiv.maintenance import maintenance_lease_name
from krishiv.operations import commit_pipelines, open_ledger, run_pipelines
from krishiv.verify import check_ledger_agreement
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.entries import COMMITTED
from krishiv_core.spec import KrishivSpec, load_spec
from outbox.orphans import referenced_files
from tests.outbox.test_relay import ROOT, stage
from tests.spark_jobs.pipeline_helpers import assert_exactly_once, produce_orders


@pytest.fixture
def spec(tmp_path: Path) -> KrishivSpec:
    shutil.copy(ROOT / "krishiv.toml", tmp_path / "krishiv.toml")  # its state/ paths are relative to the copy
    return load_spec(tmp_path / "krishiv.toml", env={})


def local(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


def test_compact_expire_and_remove_orphans_keep_exactly_once(spec: KrishivSpec, capsys) -> None:
    spec_file = str(spec.base_dir / "krishiv.toml")
    catalog, ledger = load_catalog(spec), open_ledger(spec)
    table_name = qualified(spec, spec.pipeline().table)
    shown = spec.pipeline().table  # the CLI names a table of the spec's namespace by its short name
    committed = [stage(catalog, ledger, b, b, pipeline=spec.pipeline()) for b in range(6)]
    commit_pipelines(spec, list(spec.pipelines), catalog=catalog, ledger=ledger)
    pending = stage(catalog, ledger, 6, 6, pipeline=spec.pipeline())

    def krishiv(*args: str) -> tuple[int, str, str]:
        code = main(["--spec", spec_file, *args])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = krishiv("compact", "--min-files", "2", "--dry-run")
    assert code == 0 and f"{shown}: would rewrite 6 files" in out and "in 1 partitions" in out
    assert len(catalog.load_table(table_name).snapshots()) == 6, "a dry run commits nothing"
    code, out, _ = krishiv("compact", "--min-files", "2", "--target-file-size", "64MiB")
    assert code == 0 and f"{shown}: rewrote 6 files" in out and "-> 1 (" in out
    assert f"{spec.pipeline().rejects_table}: skipped: no such table yet (krishiv run makes it)" in out

    code, out, _ = krishiv("expire-snapshots", "--keep-last", "1", "--keep-younger-than", "0", "--dry-run")
    assert code == 0 and f"{shown}: would expire 6 snapshots, kept 1" in out
    code, out, _ = krishiv("expire-snapshots", "--keep-last", "1", "--keep-younger-than", "0")
    assert code == 0 and f"{shown}: expired 6 snapshots, kept 1" in out

    code, out, err = krishiv("remove-orphans", "--grace", "0")
    assert code == 2 and out == "" and err.strip().startswith("krishiv remove-orphans: grace period 0s is below 10m")
    assert len(err.strip().splitlines()) == 1
    assert err.strip().endswith("(see docs/operations.md: Recovery runbook > Files a command will not delete)"), err
    code, out, _ = krishiv("remove-orphans", "--grace", "0", "--force")  # the runbook's way, nothing writing
    assert code == 0 and f"{shown}: removed " in out and " orphans (" in out and "< 0s" in out
    assert not any(local(f.path).exists() for e in committed for f in e.files), "compacted away, then orphans"
    assert all(local(f.path).exists() for f in pending.files), "the PENDING batch keeps its staged files"
    table = catalog.load_table(table_name)
    assert all(local(p).exists() for p in referenced_files(table))

    assert commit_pipelines(spec, list(spec.pipelines))[0].committed == [6]
    assert ledger.get("q1", table_name, 6).status == COMMITTED
    table = catalog.load_table(table_name)
    assert table.scan().to_arrow().num_rows == 7, "every batch once, the compacted ones included"
    assert check_ledger_agreement(table, table_name, ledger) == []

    code, out, _ = krishiv("maintain", "--dry-run")  # the spec's settings: 15m keeps every snapshot so far
    assert code == 0 and f"{shown}: would expire 0 snapshots, kept 2" in out
    assert f"{shown}: would remove 0 orphans (0 B); " in out and " in use, " in out and "< 1d" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    code, out, _ = krishiv("maintain")
    assert code == 0 and f"{shown}: expired 0 snapshots, kept 2" in out


def test_a_bad_option_is_one_line(spec: KrishivSpec, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--spec", str(spec.base_dir / "krishiv.toml"), "compact", "--min-files", "1"])
    assert exit_.value.code == 2
    assert "argument --min-files: expected a whole number of at least 2" in capsys.readouterr().err


def test_maintenance_of_tables_spark_wrote_keeps_them_equal_to_the_oracle(make_spec, spec_file, spark, capsys):
    """The one end-to-end run: Spark stages the batches from the real broker, the relay commits them, every
    maintenance step runs through the CLI, and the tables still equal the oracle (a PENDING batch's files are left
    alone: shown above, below Spark)."""
    spec = make_spec(max_records=500)
    produce_orders(spec, 1_500, malformed=3)
    run_pipelines(spec, list(spec.pipelines), once=True)
    commit_pipelines(spec, list(spec.pipelines))

    def krishiv(*args: str) -> str:
        assert main(["--spec", str(spec_file), *args]) == 0
        return capsys.readouterr().out

    assert "rewrote" in krishiv("compact", "--min-files", "2")
    assert "expired" in krishiv("expire-snapshots", "--keep-last", "1", "--keep-younger-than", "0")
    assert "removed" in krishiv("remove-orphans", "--grace", "0", "--force")
    assert_exactly_once(spec)  # the tables against the oracle, lineage and the ledger


def test_a_table_another_maintenance_run_holds_is_skipped(spec: KrishivSpec, capsys) -> None:
    catalog, ledger = load_catalog(spec), open_ledger(spec)
    stage(catalog, ledger, 0, 0, pipeline=spec.pipeline())
    table_name = qualified(spec, spec.pipeline().table)
    holder = subprocess.Popen(  # another process holds the table's maintenance lease until its stdin closes
        [
            sys.executable,
            "-c",
            "import sys; from outbox.ledger import Ledger; "
            f"Ledger({str(ledger.path)!r}).acquire_lease({maintenance_lease_name(table_name)!r}, 'other', 300); "
            "print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["--spec", str(spec.base_dir / "krishiv.toml"), "expire-snapshots"]) == 0
        out = capsys.readouterr().out
        assert f"{spec.pipeline().table}: skipped: another maintenance run holds it" in out
    finally:
        holder.communicate("", timeout=30)
    assert main(["--spec", str(spec.base_dir / "krishiv.toml"), "expire-snapshots"]) == 0
    assert f"{spec.pipeline().table}: expired 0 snapshots, kept 0" in capsys.readouterr().out
