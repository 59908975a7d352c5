"""End to end through a real Iceberg REST catalog (``lakana-server``): the broker, Spark, the relay, the CLI and the
Dagster definitions reach it with nothing but spec settings, ``catalog_uri`` and ``[iceberg.properties]`` (a token by
reference, a prefix), and the token is never shown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from chaos.workspace import SPEC_TEMPLATE
from krishiv.operations import run_pipelines
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.spec import KrishivSpec, load_spec
from tests.services.rest_catalog import NAMESPACE, RestCatalogServer
from tests.spark_jobs.pipeline_helpers import ROOT, assert_exactly_once, produce_orders


def rest_spec(folder: Path, rest_catalog: RestCatalogServer, bootstrap: str, topic: str) -> Path:
    """The tests' usual spec with the REST catalog: its URI, Lakana's namespace and the ``[iceberg.properties]``
    naming the token's variable and a fresh prefix (whose warehouse folder is the spec's warehouse)."""
    prefix, warehouse = rest_catalog.new_environment()
    text = SPEC_TEMPLATE.format(
        bootstrap=bootstrap,
        partitions=3,
        catalog_uri=rest_catalog.uri,
        warehouse=warehouse.as_uri(),
        topic=topic,
        max_records=500,
    ).replace('namespace = "krishiv"', f'namespace = "{NAMESPACE}"')
    path = folder / "krishiv.toml"
    path.write_text(text + rest_catalog.iceberg_properties(prefix))
    return path


def cli(spec_file: Path, *args: str, token_variable: str) -> subprocess.CompletedProcess[str]:
    """``krishiv`` in its own process with the environment a user has: the token's variable, no other KRISHIV_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KRISHIV_") or k == token_variable}
    return subprocess.run(
        [sys.executable, "-m", "krishiv.cli", "--spec", str(spec_file), *args],
        cwd=ROOT,
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def _shown_to_the_ui(spec: KrishivSpec) -> str:
    """Everything the Dagster code location sends the webserver: resources' config, jobs' config schemas, assets…"""
    from dagster._core.remote_representation.external_data import RepositorySnap
    from dagster._serdes import serialize_value

    from krishiv_assets.definitions import build_definitions

    return serialize_value(RepositorySnap.from_def(build_definitions(spec).get_repository_def()))


def test_seeded_orders_are_counted_exactly_once_through_a_rest_catalog(
    tmp_path, rest_catalog, broker, topic, spark
) -> None:
    spec_file = rest_spec(tmp_path, rest_catalog, broker.bootstrap, topic)
    token = os.environ[rest_catalog.token_variable]
    assert token not in spec_file.read_text(), "the spec file holds the variable's name only"
    spec = load_spec(spec_file)
    produce_orders(spec, 1_500, late=10, malformed=6)

    running = run_pipelines(spec, list(spec.pipelines), once=True)
    history = running[0].stager.history
    assert len([b for b in history if b.records_read]) >= 3, "the read limit splits the topic into batches"
    assert sum(b.records_read for b in history) == 1_500

    # The relay of the command line commits what Spark staged, through the REST catalog.
    committed = cli(spec_file, "commit", token_variable=rest_catalog.token_variable)
    assert committed.returncode == 0, committed.stdout + committed.stderr
    status = cli(spec_file, "status", token_variable=rest_catalog.token_variable)
    assert status.returncode == 0, status.stdout + status.stderr
    for shown in (committed, status):
        assert token not in shown.stdout + shown.stderr

    expected = assert_exactly_once(spec)  # tables = the oracle, linear lineage, verify, the ledger agrees
    assert len(expected.rejects) == 6
    table = load_catalog(spec).load_table(qualified(spec, spec.pipeline().table))
    assert len(table.snapshots()) == len([b for b in history if b.rows]), "one snapshot per batch with rows"
    assert table.location().startswith(spec.warehouse_uri()), "the server placed the table in the prefix's folder"

    # Dagster: the repository the UI is sent names the variable at most, never the token, and its catalog
    # resource reaches the REST catalog with the token resolved from the environment.
    from krishiv_assets.definitions import build_resources

    assert token not in _shown_to_the_ui(spec)
    iceberg = build_resources(spec)["iceberg"]
    assert token not in str(iceberg.model_dump()) and token not in repr(iceberg)
    reached = iceberg.catalog().load_table(qualified(spec, spec.pipeline().table))
    assert reached.current_snapshot().snapshot_id == table.current_snapshot().snapshot_id
