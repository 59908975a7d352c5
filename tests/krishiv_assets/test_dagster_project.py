"""Krishiv inside a Dagster project of one's own, as docs/dagster.md tells a user to add it.

The wheel is built from this repository and installed, with create-dagster and dg, into a fresh virtualenv outside
it. ``create-dagster project`` makes the project; ``dg scaffold defs krishiv_assets.KrishivComponent ingest`` adds the
component; the downstream example of docs/dagster.md is written into the project as it stands there. Then ``dg check
defs`` and ``dg list defs`` run, a spec that does not load is refused in one line, and ``dg dev`` (webserver and
daemon, with the project's own Dagster home) drives the real broker, Spark and SQLite catalog: produced events are
staged by the Kafka sensor's run and committed by the outbox sensor's, the table's checks pass, and the user's asset
is materialized by declarative automation with the committed rows. Its report is compared with a fold of the
produced events; a second wave shows it follows the next commit too. The wheel's ``krishiv`` then verifies the
tables from the project's folder.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from krishiv.broker import LocalBroker, free_port
from krishiv.produce import OrderEvent, demo_orders, ensure_topic, produce
from tests.krishiv_assets.test_dagster_dev import STARTUP_TIMEOUT_S, wait_until
from tests.services.dagster_web import DagsterWeb
from tests.services.processes import stop_group

ROOT = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).with_name("uv")
DAGSTER = importlib.metadata.version("dagster")
#: The project's tools, at the Dagster release Krishiv is tested with (dg's CLI follows Dagster's numbering).
TOOLS = (
    f"dagster=={DAGSTER}",
    f"dagster-webserver=={DAGSTER}",
    f"create-dagster=={DAGSTER}",
    f"dagster-dg-cli=={DAGSTER}",
)
INSTALL_TIMEOUT_S = 900
PIPELINE_TIMEOUT_S = 300
TABLE_KEY = ["iceberg", "krishiv", "orders"]
REPORT_KEY = ["orders_by_customer"]
CHECKS = {"offsets_at_most_once", "lineage_linear", "ledger_agreement", "rejects_rate"}
#: What the build copies of the repository: everything but local state and build output.
NOT_BUILT = shutil.ignore_patterns(
    ".git", ".venv", "state", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "test-artifacts"
)

SPEC = """
[kafka]
bootstrap_servers = "{bootstrap}"
partitions = 2

[iceberg]
catalog_uri = "sqlite:///state/catalog.db"
warehouse = "state/warehouse"
namespace = "krishiv"

[storage]
ledger_path = "state/ledger.duckdb"
checkpoint_location = "state/checkpoints"

[spark]
master = "local[2]"
shuffle_partitions = 2

[[pipelines]]
name = "orders"
kind = "events"
topic = "{topic}"
table = "orders"
trigger_interval = "500ms"

[pipelines.fields]
order_id = "string"
customer_id = "string"
amount = "decimal(12,2)"
event_time = "timestamp_ms"
"""

pytestmark = [pytest.mark.timeout(1200), pytest.mark.xdist_group("dagster_project")]


def _run(command: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def downstream_example() -> str:
    """The downstream asset of docs/dagster.md, as a user copies it."""
    text = (ROOT / "docs" / "dagster.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- downstream-example -->\n```python\n(.*?)```", text, re.DOTALL)
    assert block, "docs/dagster.md has no downstream example"
    return block.group(1)


@dataclass
class Project:
    folder: Path  # the project's root, made by create-dagster
    bin: Path  # the fresh virtualenv's scripts
    env: dict[str, str]  # the environment dg and krishiv run with there
    topic: str  # the spec's topic

    def dg(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return _run([str(self.bin / "dg"), *args], self.folder, self.env, timeout)


@pytest.fixture(scope="module")
def project(broker: LocalBroker, tmp_path_factory: pytest.TempPathFactory) -> Project:
    if not UV.exists():
        pytest.fail(f"no uv beside {sys.executable}: run `make setup`, which installs it into .venv")
    work = tmp_path_factory.mktemp("dagster-project")
    source = work / "krishiv-source"
    shutil.copytree(ROOT, source, ignore=NOT_BUILT)
    _run([str(UV), "build", "--wheel", "--quiet", "-o", str(work / "dist"), str(source)], work, dict(os.environ))
    (wheel,) = (work / "dist").glob("krishiv-*.whl")
    venv = work / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KRISHIV_", "DAGSTER_", "VIRTUAL_ENV"))}
    _run([str(UV), "venv", "--quiet", "--python", sys.executable, str(venv)], work, env)
    install = [str(UV), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python")]
    _run([*install, str(wheel), *TOOLS], work, env, INSTALL_TIMEOUT_S)
    env = {
        **env,
        "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        "VIRTUAL_ENV": str(venv),
        "DAGSTER_DG_UPDATE_CHECK_ENABLED": "0",  # no question to PyPI at each dg command
    }
    _run([str(venv / "bin" / "create-dagster"), "project", "shop", "--no-uv-sync"], work, env)
    folder = work / "shop"
    _run([*install, "--no-deps", "-e", str(folder)], work, env, INSTALL_TIMEOUT_S)
    topic = f"shop-{uuid.uuid4().hex[:8]}"
    (folder / "krishiv.toml").write_text(SPEC.format(bootstrap=broker.bootstrap, topic=topic))
    return Project(folder, venv / "bin", env, topic)


def test_the_component_is_listed_scaffolded_and_checked(project: Project) -> None:
    listed = json.loads(project.dg("list", "components", "--json").stdout)
    assert "krishiv_assets.KrishivComponent" in {c["key"] for c in listed["items"]}

    scaffolded = project.dg("scaffold", "defs", "krishiv_assets.KrishivComponent", "ingest")
    defs_yaml = project.folder / "src" / "shop" / "defs" / "ingest" / "defs.yaml"
    assert yaml.safe_load(defs_yaml.read_text()) == {
        "type": "krishiv_assets.KrishivComponent",
        "attributes": {"spec": "krishiv.toml"},
    }
    home = project.folder / ".dagster"
    assert f"DAGSTER_HOME={home}" in (project.folder / ".env").read_text().splitlines()
    assert (home / "dagster.yaml").read_text() == (ROOT / "krishiv_assets" / "instance.yaml").read_text()
    assert f"DAGSTER_HOME={home}" in scaffolded.stdout
    (project.folder / "src" / "shop" / "defs" / "reports.py").write_text(downstream_example())

    assert "All definitions loaded successfully" in project.dg("check", "defs").stdout
    defs = json.loads(project.dg("list", "defs", "--json").stdout)
    assets = {"/".join(a["asset_key_parts"]): a for a in defs["assets"]}
    topic = f"kafka/{project.topic}"
    # The lineage the UI draws: topic -> staging -> table -> the user's asset.
    assert assets["orders/staged_batches"]["dependency_keys"] == [topic]
    assert assets["iceberg/krishiv/orders"]["dependency_keys"] == ["orders/staged_batches"]
    assert assets["iceberg/krishiv/orders_rejects"]["dependency_keys"] == ["orders/staged_batches"]
    assert assets["orders_by_customer"]["dependency_keys"] == ["iceberg/krishiv/orders"]
    assert "orders/table_maintenance" in assets, sorted(assets)
    checks = {c["key"] for c in defs["asset_checks"]}
    assert {f"iceberg/krishiv/orders:{name}" for name in CHECKS} <= checks, checks
    assert {"orders_stage_job", "orders_commit_job", "orders_checks_job"} <= {j["name"] for j in defs["jobs"]}
    sensors = {s["name"] for s in defs["sensors"]}
    assert {"orders_kafka_sensor", "orders_outbox_sensor", "reports_automation"} <= sensors, sensors
    assert {s["name"] for s in defs["schedules"]} == {"orders_maintenance_schedule"}


def test_a_spec_that_does_not_load_is_refused_in_one_line(project: Project) -> None:
    """A wrong ``spec:`` and a misspelt key each fail ``dg check defs`` with the CLI's line, naming the file."""
    defs_yaml = project.folder / "src" / "shop" / "defs" / "ingest" / "defs.yaml"
    good = defs_yaml.read_text()
    typo = project.folder / "typo.toml"
    typo.write_text((project.folder / "krishiv.toml").read_text().replace("\ntopic = ", "\ntopik = "))
    said = {}
    try:
        for name in ("missing.toml", "typo.toml"):
            defs_yaml.write_text(good.replace("spec: krishiv.toml", f"spec: {name}"))
            done = subprocess.run(
                [str(project.bin / "dg"), "check", "defs"],
                cwd=project.folder,
                env=project.env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode != 0
            said[name] = done.stdout + done.stderr
    finally:
        defs_yaml.write_text(good)
        typo.unlink()
    assert f"no spec file at {project.folder / 'missing.toml'}" in said["missing.toml"], said["missing.toml"]
    assert "krishiv init --topic TOPIC" in said["missing.toml"]
    assert f"{typo}: pipelines[0]" in said["typo.toml"], said["typo.toml"]
    assert "did you mean 'topic'" in said["typo.toml"]
    assert "spec_values.py" not in said["typo.toml"]  # the parser's frames are not shown


@pytest.fixture(scope="module")
def dg_dev(project: Project, broker: LocalBroker) -> Iterator[DgDev]:
    port = free_port()
    log_path = project.folder / "dg-dev.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [str(project.bin / "dg"), "dev", "-h", "127.0.0.1", "-p", str(port)],
            cwd=project.folder,
            # A sensor's staging run stages once, and the checks of reported commits come at most every 10 s.
            env={**project.env, "KRISHIV_STAGING_LINGER_S": "0", "KRISHIV_CHECKS_INTERVAL_S": "10"},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        dev = DgDev(f"http://127.0.0.1:{port}", process)
        try:
            wait_until(dev.up, STARTUP_TIMEOUT_S, "dg dev's webserver", process)
            yield dev
        finally:
            stop_group(process)
            artifacts = ROOT / "test-artifacts"
            artifacts.mkdir(exist_ok=True)
            shutil.copy(log_path, artifacts / "dg-dev.log")


@dataclass
class DgDev(DagsterWeb):
    process: subprocess.Popen

    def materializations(self, key: list[str]) -> list[dict]:
        """The asset's materializations, newest first, each with its run id and metadata (label -> value)."""
        data = self.graphql(
            "query($k: [AssetKeyInput!]) { assetNodes(assetKeys: $k) { assetMaterializations(limit: 100) { runId"
            " metadataEntries { label ... on TextMetadataEntry { text } ... on IntMetadataEntry { intValue } } } } }",
            {"k": [{"path": key}]},
        )
        nodes = data["assetNodes"]
        return [
            {
                "runId": m["runId"],
                **{e["label"]: e.get("text", e.get("intValue")) for e in m["metadataEntries"]},
            }
            for m in (nodes[0]["assetMaterializations"] if nodes else [])
        ]

    def stale_status(self, key: list[str]) -> str:
        """FRESH, STALE ("Unsynced" in the UI) or MISSING."""
        data = self.graphql(
            "query($k: [AssetKeyInput!]) { assetNodes(assetKeys: $k) { staleStatus } }", {"k": [{"path": key}]}
        )
        (node,) = data["assetNodes"]
        return node["staleStatus"]

    def checks(self) -> dict[str, str | None]:
        """Each check of the table: the status of its execution for the table's latest materialization."""
        data = self.graphql(
            "query($k: [AssetKeyInput!]) { assetNodes(assetKeys: $k) { assetChecksOrError { ... on AssetChecks {"
            " checks { name executionForLatestMaterialization { status } } } } } }",
            {"k": [{"path": TABLE_KEY}]},
        )
        (node,) = data["assetNodes"]
        return {
            c["name"]: (c["executionForLatestMaterialization"] or {}).get("status")
            for c in node["assetChecksOrError"]["checks"]
        }


def oracle(events: list[OrderEvent]) -> dict[str, list]:
    """The report's documented content, folded from the produced events: every valid event is one row of the events
    table; per customer, the rows and the sum of their amounts."""
    totals: dict[str, list] = defaultdict(lambda: [0, Decimal(0)])
    for event in events:
        if event.kind == "malformed":
            continue
        record = json.loads(event.value)
        totals[record["customer_id"]][0] += 1
        totals[record["customer_id"]][1] += Decimal(str(record["amount"]))
    return {customer: [n, f"{amount:.2f}"] for customer, (n, amount) in totals.items()}


def _report_shows(project: Project, dev: DgDev, expected: dict[str, list]) -> dict | None:
    done = [m for m in dev.materializations(REPORT_KEY) if m.get("orders") == sum(n for n, _ in expected.values())]
    report = project.folder / "reports" / "orders_by_customer.json"
    return json.loads(report.read_text()) if done and report.exists() else None


def test_sensors_commit_checks_pass_and_the_users_asset_follows_each_commit(
    project: Project, dg_dev: DgDev, broker: LocalBroker
) -> None:
    topic = project.topic
    partitions = ensure_topic(broker.bootstrap, topic, 2)
    produced: list[OrderEvent] = []
    # Under 1 % rejects, so the rejects_rate check passes.
    for wave, (records, malformed, seed) in enumerate([(300, 2, 11), (200, 1, 12)], start=1):
        events = demo_orders(records, seed=seed, partitions=partitions, malformed=malformed)
        produce(broker.bootstrap, topic, events)
        produced += events
        expected = oracle(produced)
        report = wait_until(
            lambda expected=expected: _report_shows(project, dg_dev, expected),
            PIPELINE_TIMEOUT_S,
            f"wave {wave}: orders_by_customer materialized from the committed rows",
            dg_dev.process,
        )
        assert report == expected
        # The table's checks, evaluated on its latest materialization, all passed.
        checks = wait_until(
            lambda: (c := dg_dev.checks()) and all(s not in (None, "IN_PROGRESS") for s in c.values()) and c,
            PIPELINE_TIMEOUT_S,
            f"wave {wave}: the table's checks evaluated",
            dg_dev.process,
        )
        assert checks.keys() >= CHECKS and set(checks.values()) == {"SUCCEEDED"}, checks
        # Caught up: the staging, the table and the report carry no "Unsynced" badge (krishiv_assets/data_versions.py).
        assert dg_dev.stale_status(["orders", "staged_batches"]) == "FRESH"
        assert dg_dev.stale_status(TABLE_KEY) == "FRESH"
        assert dg_dev.stale_status(REPORT_KEY) == "FRESH"
    commits = dg_dev.materializations(TABLE_KEY)
    assert any(c["runId"] for c in commits), "no commit run of the outbox sensor materialized the table"
    assert sum(int(c.get("rows_committed") or 0) for c in commits) == sum(e.kind != "malformed" for e in produced)
    # The project's Dagster home is the one the scaffold set: its runs are kept there.
    assert (project.folder / ".dagster" / "history").is_dir()
    assert not list(project.folder.glob(".tmp_dagster_home_*"))


def test_the_wheels_cli_verifies_the_tables_from_the_projects_folder(project: Project, dg_dev: DgDev) -> None:
    os.killpg(dg_dev.process.pid, signal.SIGINT)  # Ctrl-C: the ledger is the CLI's alone once dg dev has stopped
    dg_dev.process.wait(timeout=60)
    status = _run([str(project.bin / "krishiv"), "status", "--json"], project.folder, project.env)
    (pipeline,) = json.loads(status.stdout)["pipelines"]
    assert pipeline["name"] == "orders"
    _run([str(project.bin / "krishiv"), "verify"], project.folder, project.env)  # exit 0: no invariant violated
