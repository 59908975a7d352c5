"""A commit run loads no Spark: the code location and a commit job executed in a fresh process leave ``pyspark``
out of ``sys.modules``. Loading PySpark costs a commit run seconds before its relay starts; this fails as soon as
someone imports it at the top of a module the code location loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from krishiv.operations import open_ledger
from krishiv_core.catalog import ensure_pipeline_tables, load_catalog
from krishiv_core.spec import load_spec
from tests.outbox.test_relay import stage

RUN_TIMEOUT_S = 300.0

COMMIT_RUN = """
import json, sys
from krishiv_assets.definitions import commit_job_name, defs
from krishiv_core.spec import load_spec

spec = load_spec(sys.argv[1], env={})
result = defs().resolve_job_def(commit_job_name(spec.pipeline())).execute_in_process(raise_on_error=False)
spark = sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j", "dagster_pyspark"))
print(json.dumps({"success": result.success, "spark": spark}))
"""


def test_a_commit_run_imports_no_spark(tmp_path: Path) -> None:
    from chaos.workspace import SPEC_TEMPLATE

    path = tmp_path / "krishiv.toml"
    path.write_text(
        SPEC_TEMPLATE.format(
            bootstrap="127.0.0.1:9",  # never contacted: a commit run reads no topic
            partitions=1,
            catalog_uri="sqlite:///catalog.db",
            warehouse="warehouse",
            topic="orders",
            max_records=100,
        )
    )
    spec = load_spec(path, env={})
    ledger, catalog = open_ledger(spec), load_catalog(spec)
    ensure_pipeline_tables(catalog, spec, spec.pipeline())
    stage(catalog, ledger, 0, 0, pipeline=spec.pipeline(), namespace=spec.iceberg.namespace)

    done = subprocess.run(
        [sys.executable, "-c", COMMIT_RUN, str(path)],
        cwd=tmp_path,
        env={**os.environ, "KRISHIV_SPEC": str(path), "DAGSTER_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome == {"success": True, "spark": []}, done.stderr[-3000:]
    (commit,) = ledger.commits_since(0)
    assert commit.batch_id == 0 and commit.committed_snapshot_id is not None
    assert commit.committed_by is not None and commit.committed_by.startswith("dagster run ")
