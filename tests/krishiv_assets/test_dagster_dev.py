"""End to end through a real ``dagster dev`` (webserver + daemon on free loopback ports).

Before ``dagster dev`` starts, three batches are staged and committed with the CLI: its first tick shows them.
Then events are produced and nothing else is done: the Kafka sensor starts staging runs, the outbox sensor starts
commit runs. Then the table is read back and compared with the oracle, the webserver's GraphQL API is asked
for the asset checks' results, a continuous ``krishiv run`` takes over staging while the sensor keeps
committing, and a real browser opens the asset graph. The freshness seen (last event produced -> its batch
committed and visible) is written to ``test-artifacts/dagster-freshness.json`` with the screenshots.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from chaos.workspace import SPEC_TEMPLATE
from krishiv.broker import LocalBroker, free_port
from krishiv.operations import commit_pipelines, open_ledger
from krishiv.produce import DEFAULT_SPACING_MS, DEFAULT_START_MS
from krishiv.status import end_offsets
from krishiv_core.catalog import qualified
from krishiv_core.entries import COMMITTED
from krishiv_core.spec import KrishivSpec, load_spec
from outbox.ledger import Ledger
from spark_jobs.kafka_source import latest_offsets
from tests.services.dagster_web import DagsterWeb
from tests.services.processes import stop_group
from tests.spark_jobs.pipeline_helpers import assert_exactly_once, krishiv_cli, produce_orders

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Playwright

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
BIN = Path(sys.executable).parent
PIPELINE = "orders_per_minute"
TABLE_KEY = ["iceberg", "krishiv", PIPELINE]
CHECKS = {"no_duplicate_windows", "lineage_linear", "ledger_agreement", "rejects_rate", "late_events"}
STARTUP_TIMEOUT_S = 180
PIPELINE_TIMEOUT_S = 300
CHROMIUM = "/usr/bin/chromium"
#: Committed with the CLI before dagster dev starts: three batches of MAX_RECORDS (transaction markers take a few
#: offsets each), earlier in event time than the sensors' first wave, which then closes their windows.
MAX_RECORDS = 1_000
CLI_RECORDS = 2_500
CLI_START_MS = DEFAULT_START_MS - CLI_RECORDS * DEFAULT_SPACING_MS - 120_000

# The tests share one dagster dev and follow on from each other (the first wave's commits are what the later ones
# find): with `pytest -n`, the group keeps them on one worker, in order (`--dist loadgroup`, pyproject.toml).
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("dagster_dev")]


@dataclass
class DagsterDev(DagsterWeb):
    folder: Path
    spec: KrishivSpec
    process: subprocess.Popen
    freshness_s: dict[str, float] = field(default_factory=dict)

    def runs(self, job: str | None = None) -> list[dict]:
        data = self.graphql(
            "query($f: RunsFilter) { runsOrError(filter: $f) { ... on Runs { results {"
            " runId jobName status tags { key value } } } } }",
            {"f": {"pipelineName": job} if job else {}},
        )
        return data["runsOrError"]["results"]

    def ledger(self) -> Ledger:
        return open_ledger(self.spec)


def wait_until(condition: Callable[[], object], timeout_s: float, what: str, process: subprocess.Popen) -> object:
    """Poll ``condition`` until it is truthy; fail naming ``what`` on timeout or if ``process`` died."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert process.poll() is None, f"dagster dev exited with {process.returncode} while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f}s waiting for {what}"
        time.sleep(0.25)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KRISHIV_", "DAGSTER_"))}
    env.update(extra)
    return env


def _refuse_a_second_worker(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Fail at once, saying why, if this module's tests were split across pytest-xdist workers (each would start its
    own dagster dev, and a later test would wait out its timeout for what an earlier one did on the other worker)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return
    claim = tmp_path_factory.getbasetemp().parent / "dagster-dev-worker"  # shared by the session's workers
    try:
        with claim.open("x") as file:
            file.write(worker)
    except FileExistsError:
        pytest.fail(
            f"{Path(__file__).name}'s tests ran on {claim.read_text()} and {worker}: they must share one worker "
            "(xdist_group with --dist loadgroup, which pytest 9.2 breaks: pytest-xdist#1386)"
        )


@pytest.fixture(scope="module")
def dagster_dev(broker: LocalBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagsterDev]:
    _refuse_a_second_worker(tmp_path_factory)
    folder = tmp_path_factory.mktemp("dagster-dev")
    (folder / "krishiv.toml").write_text(
        SPEC_TEMPLATE.format(
            bootstrap=broker.bootstrap,
            partitions=4,
            catalog_uri="sqlite:///catalog.db",
            warehouse="warehouse",
            topic=f"orders-{uuid.uuid4().hex[:10]}",
            max_records=MAX_RECORDS,
        )
    )
    spec = load_spec(folder / "krishiv.toml", env={})
    produce_orders(spec, CLI_RECORDS, malformed=3, seed=5, start_ms=CLI_START_MS)
    for command in (["run", "--once"], ["commit"]):  # staged, then committed, by the CLI alone
        done = krishiv_cli(folder / "krishiv.toml", *command)
        assert done.returncode == 0, f"krishiv {' '.join(command)}:\n{done.stdout}{done.stderr}"
    # The repository's own instance and workspace files, with DAGSTER_HOME where dagster.yaml is.
    shutil.copy(ROOT / "dagster.yaml", folder)
    shutil.copy(ROOT / "workspace.yaml", folder)
    port = free_port()
    log = (folder / "dagster-dev.log").open("w")
    process = subprocess.Popen(
        [str(BIN / "dagster"), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=folder,
        # Sensor-started staging runs stage once (KRISHIV_STAGING_LINGER_S=0): these tests drive the sensors' own
        # path, staging run -> outbox sensor -> commit run -> checks, and the continuous krishiv run below gets the
        # stager lease as soon as the first wave is staged. A lingering run is tested in test_staging_run.py.
        # The outbox sensor's checks runs after reported commits come at most every 10 s here (60 s by default), and
        # Dagster's freshness daemon evaluates the tables every 5 s (30 s by default).
        env=_clean_env(
            DAGSTER_HOME=str(folder),
            KRISHIV_SPEC=str(folder / "krishiv.toml"),
            KRISHIV_STAGING_LINGER_S="0",
            KRISHIV_CHECKS_INTERVAL_S="10",
            FRESHNESS_DAEMON_INTERVAL_SECONDS="5",
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    dev = DagsterDev(f"http://127.0.0.1:{port}", folder, spec, process)
    try:
        wait_until(dev.up, STARTUP_TIMEOUT_S, "the webserver", process)
        yield dev
    finally:
        stop_group(process)
        log.close()
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copy(folder / "dagster-dev.log", ARTIFACTS / "dagster-dev.log")
        if dev.freshness_s:
            (ARTIFACTS / "dagster-freshness.json").write_text(json.dumps(dev.freshness_s, indent=2) + "\n")


def _committed_through(dev: DagsterDev, ends: dict[str, int]) -> bool:
    """True once COMMITTED entries of every table of the pipeline (its rejects table too: a commit run commits the
    tables one after the other) cover every partition's offsets up to ``ends``."""
    pipeline, ledger = dev.spec.pipeline(), dev.ledger()
    for name in pipeline.all_tables:
        committed = [e for e in ledger.entries(table=qualified(dev.spec, name)) if e.status == COMMITTED]
        done = end_offsets(committed, pipeline.topic)
        if not all(done.get(p, 0) >= end for p, end in ends.items()):
            return False
    return True


def _produce_and_wait(dev: DagsterDev, label: str, records: int, **kwargs: object) -> None:
    produce_orders(dev.spec, records, **kwargs)
    produced_at = time.monotonic()
    ends = latest_offsets(dev.spec.kafka.bootstrap_servers, dev.spec.pipeline().topic)
    wait_until(lambda: _committed_through(dev, ends), PIPELINE_TIMEOUT_S, f"{label}: commits up to {ends}", dev.process)
    dev.freshness_s[label] = round(time.monotonic() - produced_at, 2)


def _checks(dev: DagsterDev) -> dict[str, dict]:
    data = dev.graphql(
        "query($k: [AssetKeyInput!]) { assetNodes(assetKeys: $k) { assetChecksOrError { ... on AssetChecks {"
        " checks { name blocking executionForLatestMaterialization { status evaluation { success description"
        " metadataEntries { label } } } } } } } }",
        {"k": [{"path": TABLE_KEY}]},
    )
    (node,) = data["assetNodes"]
    return {c["name"]: c for c in node["assetChecksOrError"]["checks"]}


def _checks_done(dev: DagsterDev) -> dict[str, dict] | None:
    checks = _checks(dev)
    done = all(
        (c["executionForLatestMaterialization"] or {}).get("status") not in (None, "IN_PROGRESS")
        for c in checks.values()
    )
    return checks if done else None


def _materializations(dev: DagsterDev, limit: int = 50) -> list[dict]:
    """The table's newest materializations, each with its run id ("" for one a sensor reported) and its text
    metadata."""
    data = dev.graphql(
        "query($k: [AssetKeyInput!], $n: Int) { assetNodes(assetKeys: $k) { assetMaterializations(limit: $n) {"
        " runId metadataEntries { label ... on TextMetadataEntry { text } } } } }",
        {"k": [{"path": TABLE_KEY}], "n": limit},
    )
    (node,) = data["assetNodes"]
    return [
        {"runId": m["runId"], **{e["label"]: e.get("text") for e in m["metadataEntries"]}}
        for m in node["assetMaterializations"]
    ]


def _freshness(dev: DagsterDev) -> str | None:
    """The table's freshness as the UI shows it (the freshness daemon's last evaluation)."""
    data = dev.graphql(
        "query($k: [AssetKeyInput!]) { assetNodes(assetKeys: $k) { freshnessStatusInfo { freshnessStatus } } }",
        {"k": [{"path": TABLE_KEY}]},
    )
    (node,) = data["assetNodes"]
    return (node["freshnessStatusInfo"] or {}).get("freshnessStatus")


def _browser(playwright: Playwright) -> Browser:
    """Headless Chromium (Debian's) for the UI tests."""
    assert Path(CHROMIUM).exists(), (
        f"{CHROMIUM} is missing: `make test` installs Debian's chromium (scripts/setup-browser.sh)"
    )
    return playwright.chromium.launch(
        executable_path=CHROMIUM,
        headless=True,
        args=[
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ],
    )


def test_commits_made_before_dagster_started_show_from_the_first_tick(dagster_dev: DagsterDev):
    """The fixture staged and committed three batches with the CLI before dagster dev started, and no event came
    since: the outbox sensor's first tick reports each commit, so the table shows three materializations (newest
    first), and their checks run; the browser shows them on the asset's page."""
    from playwright.sync_api import expect, sync_playwright

    dev = dagster_dev
    table = qualified(dev.spec, dev.spec.pipeline().table)
    cli = [str(c.batch_id) for c in dev.ledger().commits_since(0, [table])]
    assert cli == ["0", "1", "2"], f"the fixture meant three CLI commits of {table}, made {cli}"
    shown = wait_until(
        lambda: (found := _materializations(dev)) and len(found) >= len(cli) and found,
        120,
        "the outbox sensor's first tick to report the CLI's commits",
        dev.process,
    )
    assert [(m["batch_id"], m["committed_by"], m["runId"]) for m in shown] == [
        (batch, "krishiv commit", "") for batch in reversed(cli)
    ]
    assert not dev.runs(f"{PIPELINE}_commit_job") and not dev.runs(f"{PIPELINE}_stage_job")  # nothing new to do
    checks = wait_until(lambda: _checks_done(dev), 180, "the checks of the reported commits", dev.process)
    for name, check in checks.items():
        assert check["executionForLatestMaterialization"]["status"] == "SUCCEEDED", (name, check)

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = _browser(playwright)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(f"{dev.url}/assets/{'/'.join(TABLE_KEY)}?view=events", wait_until="networkidle")
            # The Events tab lists the materializations, newest first, each row with a status icon (and the selected
            # one's details under one more); clicking a row shows its description.
            events = page.get_by_role("img", name="run_success")
            expect(events).to_have_count(len(cli) + 1, timeout=60_000)
            skip = page.get_by_role("button", name="Skip")  # the first visit's newsletter dialog
            if skip.is_visible():
                skip.click()
            for row, batch in enumerate(reversed(cli)):
                events.nth(row).click()
                expect(page.get_by_text(f"batch {batch} committed")).to_be_visible(timeout=30_000)
                page.screenshot(path=str(ARTIFACTS / f"dagster-first-tick-batch-{batch}.png"), full_page=True)
        finally:
            browser.close()


def test_sensors_stage_and_commit_with_no_manual_trigger(dagster_dev: DagsterDev, broker: LocalBroker):
    dev = dagster_dev
    _produce_and_wait(
        dev, "sensor staging (Kafka sensor -> staging run -> outbox sensor -> commit run)", 3_000, late=10, malformed=6
    )

    runs = dev.runs()
    jobs = {r["jobName"] for r in runs}
    assert {f"{PIPELINE}_stage_job", f"{PIPELINE}_commit_job"} <= jobs, runs
    for run in runs:
        tags = {t["key"]: t["value"] for t in run["tags"]}
        if tags.get("dagster/schedule_name") == f"{PIPELINE}_maintenance_schedule":
            continue  # the maintenance schedule, running by default, starts a run at the top of each hour
        assert tags.get("dagster/sensor_name") in (f"{PIPELINE}_kafka_sensor", f"{PIPELINE}_outbox_sensor"), run
        assert tags["dagster/run_key"].startswith(f"{PIPELINE}:")
    schedule = dev.graphql(
        "query($s: ScheduleSelector!) { scheduleOrError(scheduleSelector: $s) {"
        " ... on Schedule { scheduleState { status } } } }",
        {
            "s": {
                "repositoryLocationName": "krishiv",
                "repositoryName": "__repository__",
                "scheduleName": f"{PIPELINE}_maintenance_schedule",
            }
        },
    )
    assert schedule["scheduleOrError"]["scheduleState"]["status"] == "RUNNING"  # on with nobody turning it on

    # The sensors committed everything: a manual relay run finds nothing left.
    assert all(not r.committed for r in commit_pipelines(dev.spec, list(dev.spec.pipelines)))
    assert_exactly_once(dev.spec)

    checks = wait_until(lambda: _checks_done(dev), 120, "the asset checks of the last commit run", dev.process)
    assert set(checks) == CHECKS
    assert checks["no_duplicate_windows"]["blocking"]
    for name, check in checks.items():
        execution = check["executionForLatestMaterialization"]
        assert execution["status"] == "SUCCEEDED", (name, execution)
        assert execution["evaluation"]["success"], (name, execution["evaluation"])
    labels = {
        e["label"]
        for e in checks["no_duplicate_windows"]["executionForLatestMaterialization"]["evaluation"]["metadataEntries"]
    }
    assert {"duplicate_windows", "offending_windows", "rows"} <= labels
    # Each commit since the CLI's names the commit run that made it, and the freshness daemon (started by dagster
    # dev) finds the table fresh.
    runs = {r["runId"] for r in dev.runs(f"{PIPELINE}_commit_job")}
    by_runs = {m["committed_by"] for m in _materializations(dev) if m["committed_by"] != "krishiv commit"}
    assert by_runs and by_runs <= {f"dagster run {run_id}" for run_id in runs}
    wait_until(lambda: _freshness(dev) == "HEALTHY", 120, "the freshness daemon to find the table fresh", dev.process)


def test_continuous_krishiv_run_stages_while_the_sensor_commits(dagster_dev: DagsterDev, broker: LocalBroker):
    dev = dagster_dev
    in_flight = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED"}
    wait_until(
        lambda: not [r for r in dev.runs() if r["status"] in in_flight],
        180,
        "the sensor-started runs to end",
        dev.process,
    )
    staging_runs = len(dev.runs(f"{PIPELINE}_stage_job"))

    log = (dev.folder / "krishiv-run.log").open("w")
    run = subprocess.Popen(
        [sys.executable, "-m", "krishiv.cli", "--spec", str(dev.folder / "krishiv.toml"), "run"],
        cwd=ROOT,
        env=_clean_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: dev.ledger().live_lease(PIPELINE), 60, "krishiv run to take the stager lease", run)
        # Later events, so the windows of the first wave close as well.
        start = DEFAULT_START_MS + 3_000 * DEFAULT_SPACING_MS + 120_000
        _produce_and_wait(dev, "continuous krishiv run -> outbox sensor -> commit run", 2_000, seed=11, start_ms=start)
        assert run.poll() is None, "krishiv run stopped"
    finally:
        run.send_signal(signal.SIGTERM)
        try:
            run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
        log.close()
    assert dev.ledger().live_lease(PIPELINE) is None, "krishiv run left its lease behind"
    # While krishiv run held the lease, the Kafka sensor started no staging run.
    assert len(dev.runs(f"{PIPELINE}_stage_job")) == staging_runs
    assert_exactly_once(dev.spec)

    # The sensor reported krishiv run's commits as materializations credited to it, then started a checks run:
    # the newest materialization's checks are evaluated with nobody materializing anything.
    reported = wait_until(
        lambda: [m for m in _materializations(dev) if m["runId"] == "" and m["committed_by"] != "krishiv commit"],
        60,
        "the outbox sensor to report krishiv run's commits",
        dev.process,
    )
    assert {m["committed_by"] for m in reported} == {"krishiv run"}
    checks = wait_until(lambda: _checks_done(dev), 180, "the checks of the newest materialization", dev.process)
    for name, check in checks.items():
        assert check["executionForLatestMaterialization"]["status"] == "SUCCEEDED", (name, check)
    assert dev.runs(f"{PIPELINE}_checks_job"), "no checks run was started"


def test_the_commit_pool_runs_one_commit_run_at_a_time(dagster_dev: DagsterDev):
    """Two commit runs launched together (as from the UI): dagster.yaml's pool starts the second only
    after the first has finished."""
    dev = dagster_dev
    launched = []
    for _ in range(2):
        data = dev.graphql(
            "mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {"
            " __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }",
            {
                "p": {
                    "selector": {
                        "repositoryLocationName": "krishiv",
                        "repositoryName": "__repository__",
                        "jobName": f"{PIPELINE}_commit_job",
                    },
                    "runConfigData": {},
                }
            },
        )
        assert data["launchRun"]["__typename"] == "LaunchRunSuccess", data
        launched.append(data["launchRun"]["run"]["runId"])

    def finished() -> list[dict] | None:
        data = dev.graphql(
            "query($f: RunsFilter) { runsOrError(filter: $f) { ... on Runs { results {"
            " runId status startTime endTime } } } }",
            {"f": {"runIds": launched}},
        )
        runs = data["runsOrError"]["results"]
        return runs if all(r["status"] == "SUCCESS" for r in runs) else None

    runs = wait_until(finished, 300, "both commit runs to finish", dev.process)
    first, second = sorted(runs, key=lambda r: r["startTime"])
    assert second["startTime"] >= first["endTime"], f"the commit runs overlapped: {runs}"


def test_the_ui_shows_the_asset_graph_with_the_table_and_its_check(dagster_dev: DagsterDev):
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    # The newest commit may be one the outbox sensor reported, whose checks run comes up to the checks interval later.
    wait_until(lambda: _checks_done(dagster_dev), PIPELINE_TIMEOUT_S, "newest checks", dagster_dev.process)
    with sync_playwright() as playwright:
        browser = _browser(playwright)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(f"{dagster_dev.url}/locations/krishiv/asset-groups/{PIPELINE}", wait_until="networkidle")
            skip = page.get_by_role("button", name="Skip")  # the first visit's newsletter dialog
            if skip.is_visible():
                skip.click()
            expect(page.get_by_text("staged_batches").first).to_be_visible(timeout=60_000)
            table_node = page.locator("div", has=page.get_by_text(PIPELINE, exact=True)).filter(has_text="Asset checks")
            expect(table_node.last).to_contain_text(f"{len(CHECKS)} / {len(CHECKS)} Passed", timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "dagster-asset-graph.png"), full_page=True)

            page.goto(f"{dagster_dev.url}/assets/{'/'.join(TABLE_KEY)}?view=checks", wait_until="networkidle")
            expect(page.get_by_text("no_duplicate_windows").first).to_be_visible(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "dagster-table-checks.png"), full_page=True)
        finally:
            browser.close()
