"""``krishiv ledger-copy``: a DuckDB ledger moved onto PostgreSQL, on a real pipeline, and the copies it refuses."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from krishiv.cli import main
from krishiv.operations import run_pipelines
from krishiv_core.catalog import qualified
from outbox.errors import LedgerMoved
from outbox.ledger import Ledger
from tests.spark_jobs.pipeline_helpers import produce_orders

#: The copies' target: a PostgreSQL ledger in a schema of its own (``ledger_location``'s PostgreSQL case).
pytestmark = [pytest.mark.postgres, pytest.mark.parametrize("ledger_location", ["postgresql"], indirect=True)]


@pytest.fixture
def pg_ledger(ledger_location: str) -> str:
    return ledger_location


def _words(text: str) -> str:
    return " ".join(text.split())


def test_a_duckdb_ledger_moved_to_postgresql_carries_on_exactly_once(
    make_spec, spec_file: Path, broker, spark, pg_ledger: str, capsys, monkeypatch
) -> None:
    spec = make_spec(max_records=1_000)
    produce_orders(spec, 2_000)
    run_pipelines(spec, list(spec.pipelines), once=True)
    assert main(["--spec", str(spec_file), "commit"]) == 0
    produce_orders(spec, 1_500, seed=8)
    run_pipelines(spec, list(spec.pipelines), once=True)  # staged, left pending for the new ledger to commit
    source = Ledger(spec.ledger_location())
    source.compact(retention_s=0)  # some committed entries folded into the archive: they must move too
    table = qualified(spec, spec.pipeline().table)
    before = source.table_summary(table, topic=spec.pipeline().topic)
    entries, seq = source.entries(), source.last_commit_seq()
    assert before.pending and before.archived, "the copy is tested with pending and archived entries"
    capsys.readouterr()

    assert main(["--spec", str(spec_file), "ledger-copy", "--to", pg_ledger]) == 0
    said = _words(capsys.readouterr().out)
    assert f"copied ledger {source.path} to {pg_ledger}" in said and "The old ledger now refuses every use" in said

    target = Ledger(pg_ledger)
    assert target.entries() == entries
    assert replace(target.table_summary(table, topic=spec.pipeline().topic), last_commit_at=None) == replace(
        before, last_commit_at=None
    )
    assert target.last_commit_seq() == seq

    # The old ledger refuses every use, naming the new one; nothing can be staged into it any more.
    with pytest.raises(LedgerMoved, match="was moved to"):
        source.entries()
    assert main(["--spec", str(spec_file), "status"]) == 2
    assert f"was moved to {pg_ledger} by krishiv ledger-copy" in _words(capsys.readouterr().err)

    monkeypatch.setenv("KRISHIV_LEDGER_PATH", pg_ledger)
    assert main(["--spec", str(spec_file), "commit"]) == 0
    assert main(["--spec", str(spec_file), "verify"]) == 0
    after = target.table_summary(table)
    assert after.pending == 0 and after.committed == before.pending + before.committed
    assert min(r.commit_seq for r in target.commits_since(seq)) == seq + 1, "commits numbered on from the old ones"


def _spec_file(tmp_path: Path) -> Path:
    from chaos.workspace import SPEC_TEMPLATE

    path = tmp_path / "krishiv.toml"
    path.write_text(
        SPEC_TEMPLATE.format(
            bootstrap="127.0.0.1:1",
            partitions=4,
            catalog_uri="sqlite:///catalog.db",
            warehouse="warehouse",
            topic="orders",
            max_records=100,
        )
    )
    return path


def test_a_copy_is_refused_while_a_stager_holds_the_ledger(tmp_path: Path, pg_ledger: str, capsys) -> None:
    spec_file = _spec_file(tmp_path)
    source = Ledger(tmp_path / "ledger.duckdb")
    lease = source.acquire_lease("orders_per_minute", "krishiv run", ttl_s=60)

    assert main(["--spec", str(spec_file), "ledger-copy", "--to", pg_ledger]) == 2
    said = _words(capsys.readouterr().err)
    assert "is in use: 'orders_per_minute' is held by krishiv run" in said and "stop it" in said
    assert not _schema_made(pg_ledger), "a refused copy leaves the target as it was"
    assert source.current_lease("orders_per_minute") is not None

    source.release_lease(lease)
    assert main(["--spec", str(spec_file), "ledger-copy", "--to", pg_ledger]) == 0
    # The lease's fencing token moved with the ledger: the next holder's is greater, there too.
    assert Ledger(pg_ledger).acquire_lease("orders_per_minute", "krishiv run", ttl_s=60).epoch == lease.epoch + 1


def _schema_made(location: str) -> bool:
    """Whether the PostgreSQL schema a ledger location names exists (made by a write, never by a read)."""
    import psycopg

    base, schema = location.rsplit("schema=", 1)
    with psycopg.connect(base.rstrip("?&"), autocommit=True, connect_timeout=10) as con:
        return con.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [schema]).fetchone() is not None


def test_a_copy_from_a_ledger_moved_already_leaves_the_target_untouched(tmp_path: Path, pg_ledger: str, capsys) -> None:
    from tests.outbox.test_ledger import _entry

    spec_file = _spec_file(tmp_path)
    Ledger(tmp_path / "ledger.duckdb").record_batch([_entry("q-source", 0)])
    assert main(["--spec", str(spec_file), "ledger-copy", "--to", "moved.duckdb"]) == 0
    capsys.readouterr()

    assert main(["--spec", str(spec_file), "ledger-copy", "--to", pg_ledger]) == 2
    said = _words(capsys.readouterr().err)
    assert f"was moved to {tmp_path / 'moved.duckdb'} by krishiv ledger-copy" in said
    assert not _schema_made(pg_ledger), "a refused copy leaves the target as it was"
    assert [e.query_id for e in Ledger(tmp_path / "moved.duckdb").entries()] == ["q-source"]


def test_a_copy_into_a_ledger_holding_entries_or_onto_itself_is_refused(tmp_path: Path, pg_ledger: str, capsys) -> None:
    from tests.outbox.test_ledger import _entry

    spec_file = _spec_file(tmp_path)
    Ledger(tmp_path / "ledger.duckdb").record_batch([_entry("q-source", 0)])
    Ledger(pg_ledger).record_batch([_entry("q-other", 0)])

    assert main(["--spec", str(spec_file), "ledger-copy", "--to", pg_ledger]) == 2
    assert "already holds 1 entries; copy only into a new, empty ledger" in _words(capsys.readouterr().err)
    assert main(["--spec", str(spec_file), "ledger-copy", "--to", "ledger.duckdb"]) == 2
    assert "cannot be copied onto itself" in capsys.readouterr().err
    assert [e.query_id for e in Ledger(tmp_path / "ledger.duckdb").entries()] == ["q-source"], "still in use"
