"""The code location loads a spec whose property tables name secrets by ``${VARIABLE}``, as Dagster loads it.

``defs()`` keeps the address overrides (``KRISHIV_KAFKA_BOOTSTRAP``…) out of the spec so that they reach the resources
as ``EnvVar``s; it used to load the spec with no environment at all, so a spec with a ``${VARIABLE}`` in
``[iceberg.properties]`` (a REST catalog's token, an S3 secret key) failed to load in the daemon, the webserver and
every run with "environment variable … is not set" although the variable was set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from chaos.workspace import SPEC_TEMPLATE
from tests.spark_jobs.pipeline_helpers import ROOT

LOAD = """
import json
import dagster as dg
from krishiv_assets.definitions import defs
resources = defs().resources
print(json.dumps({
    "token": resources["iceberg"].spec.iceberg.properties["token"],
    "bootstrap_is_env_var": isinstance(resources["kafka"].bootstrap_servers, dg.EnvVar),
}))
"""


def test_the_code_location_loads_a_spec_that_names_its_secrets_by_variable(tmp_path):
    spec = tmp_path / "krishiv.toml"
    text = SPEC_TEMPLATE.format(
        bootstrap="127.0.0.1:9",
        partitions=1,
        catalog_uri="http://127.0.0.1:9",  # a REST catalog: nothing connects while the definitions load
        warehouse=(tmp_path / "warehouse").as_uri(),
        topic="orders",
        max_records=100,
    )
    spec.write_text(text + '\n[iceberg.properties]\ntoken = "${KRISHIV_TEST_DEFS_TOKEN}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KRISHIV_", "DAGSTER_"))}
    env |= {
        "KRISHIV_SPEC": str(spec),
        "KRISHIV_TEST_DEFS_TOKEN": "not-shown",
        "KRISHIV_KAFKA_BOOTSTRAP": "127.0.0.1:19092",
        "DAGSTER_HOME": str(tmp_path),
    }
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    shown = json.loads(loaded.stdout.strip().splitlines()[-1])
    # The reference stays a reference (resolved when a client is built), and an override is still an EnvVar.
    assert shown == {"token": "${KRISHIV_TEST_DEFS_TOKEN}", "bootstrap_is_env_var": True}
