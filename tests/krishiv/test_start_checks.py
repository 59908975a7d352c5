"""Mistakes found before Spark starts: a topic that does not exist, a catalog URI that names no catalog, a ledger
lost while the table keeps its batches. Each is one line naming the input and the runbook section with the way out,
exit 2, and nothing created or written. Through the real broker, catalog, ledger and (for the history) Spark."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from krishiv.cli import main
from krishiv.inputs import read_spec
from krishiv.operations import commit_pipelines, open_ledger, run_pipelines
from krishiv.query_supervisor import RunClients
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.runbook import RUNBOOK
from krishiv_core.spec import KrishivSpec
from tests.spark_jobs.pipeline_helpers import produce_orders


def _refused(capsys: pytest.CaptureFixture[str], spec_file: Path, *args: str) -> str:
    """``krishiv run --once`` in this process (it stops before Spark would start): exit 2 and one line on stderr."""
    assert main(["--spec", str(spec_file), "run", "--once", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


def test_a_topic_that_does_not_exist_is_refused_before_spark(make_spec, spec_file, capsys) -> None:
    spec = make_spec()  # the topic fixture names a topic nobody created
    err = _refused(capsys, spec_file)
    topic = spec.pipeline().topic
    assert f"topic {topic!r} of pipeline 'orders_per_minute' does not exist on Kafka broker" in err
    assert spec.kafka.bootstrap_servers in err and f"{RUNBOOK} > A topic that does not exist" in err
    assert not (spec_file.parent / "checkpoints").exists(), "nothing was started"


@pytest.fixture
def committed(make_spec, spec_file, spark) -> KrishivSpec:
    """A pipeline that staged and committed 600 orders, its catalog created by the run (which said so)."""
    spec = make_spec()
    produce_orders(spec, 600)
    said: list[str] = []
    run_pipelines(spec, list(spec.pipelines), once=True, clients=RunClients(spark=spark), progress=said.append)
    assert "created a new catalog at sqlite:///catalog.db" in said
    commit_pipelines(spec, list(spec.pipelines))
    return spec


def test_a_mistyped_catalog_is_not_created_when_the_ledger_holds_committed_batches(
    committed, spec_file, capsys
) -> None:
    capsys.readouterr()
    text = spec_file.read_text()
    spec_file.write_text(text.replace('catalog_uri = "sqlite:///catalog.db"', 'catalog_uri = "sqlite:///catalgo.db"'))
    err = _refused(capsys, spec_file)
    assert f"there is no Iceberg catalog at sqlite:///{spec_file.parent}/catalgo.db" in err
    assert str(open_ledger(committed).path) in err and f"{RUNBOOK} > A catalog that is missing" in err
    assert not (spec_file.parent / "catalgo.db").exists(), "the mistyped catalog was not created"

    # An existing catalog that lacks the table (another catalog, or the table dropped) is refused too.
    spec_file.write_text(text.replace('catalog_uri = "sqlite:///catalog.db"', 'catalog_uri = "sqlite:///other.db"'))
    load_catalog(read_spec(str(spec_file))).list_namespaces()  # creates the empty catalog
    err = _refused(capsys, spec_file)
    table = qualified(committed, committed.pipeline().table)
    assert f"table {table} in the catalog at sqlite:///{spec_file.parent}/other.db does not exist" in err
    assert "as committed" in err and f"{RUNBOOK} > A catalog that is missing" in err


def test_a_lost_ledger_is_refused_while_the_table_holds_the_pipelines_batches(committed, spec_file, capsys) -> None:
    capsys.readouterr()
    ledger = open_ledger(committed).path
    before = {t: len(load_catalog(committed).load_table(("krishiv", t)).snapshots()) for t in ("orders_per_minute",)}
    Path(ledger).unlink()
    shutil.rmtree(spec_file.parent / "checkpoints")
    err = _refused(capsys, spec_file)
    assert "holds batches of pipeline 'orders_per_minute'" in err and str(ledger) in err
    assert "write every event a second time" in err and f"{RUNBOOK} > A ledger that was lost" in err
    after = {t: len(load_catalog(committed).load_table(("krishiv", t)).snapshots()) for t in before}
    assert after == before and not (spec_file.parent / "checkpoints").exists()
