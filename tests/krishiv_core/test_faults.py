"""Fault points: each action, once per batch in a process, and the firing log a harness reads."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from krishiv_core import faults
from krishiv_core.faults import FAULTS_ENV, FAULTS_LOG_ENV, FAULTS_SYNC_ENV, InjectedFault, fault_point


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path: Path) -> Path:
    monkeypatch.setattr(faults, "_fired", set())
    log = tmp_path / "faults.jsonl"
    monkeypatch.setenv(FAULTS_LOG_ENV, str(log))
    return log


def test_unarmed_points_do_nothing(monkeypatch):
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    fault_point("relay.before_catalog_commit", 3)


def test_raise_fires_once_per_batch_and_is_logged(monkeypatch, fresh: Path):
    monkeypatch.setenv(FAULTS_ENV, "relay.after_catalog_commit:raise")
    with pytest.raises(InjectedFault, match=r"relay\.after_catalog_commit"):
        fault_point("relay.after_catalog_commit", 1)
    fault_point("relay.after_catalog_commit", 1)  # the retry of the same step goes through
    with pytest.raises(InjectedFault):
        fault_point("relay.after_catalog_commit", 2)
    fault_point("relay.before_catalog_commit", 1)  # another point
    logged = [json.loads(line) for line in fresh.read_text().splitlines()]
    assert [(e["point"], e["batch"], e["action"]) for e in logged] == [
        ("relay.after_catalog_commit", 1, "raise"),
        ("relay.after_catalog_commit", 2, "raise"),
    ]


def test_batch_filter_and_timeout(monkeypatch):
    monkeypatch.setenv(FAULTS_ENV, "relay.before_catalog_commit@4:timeout")
    monkeypatch.setattr(faults, "TIMEOUT_DELAY_S", 0.05)
    fault_point("relay.before_catalog_commit", 3)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="batch 4"):
        fault_point("relay.before_catalog_commit", 4)
    assert time.monotonic() - started >= 0.05


def test_pause_waits_for_the_harness(monkeypatch, tmp_path: Path):
    monkeypatch.setenv(FAULTS_ENV, "stage.begin@2:pause")
    monkeypatch.setenv(FAULTS_SYNC_ENV, str(tmp_path))
    done = threading.Event()
    worker = threading.Thread(target=lambda: (fault_point("stage.begin", 2), done.set()))
    worker.start()
    deadline = time.monotonic() + 10
    while not (tmp_path / "stage.begin@2.reached").exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not done.wait(0.2), "the paused step went on before it was released"
    (tmp_path / "stage.begin@2.go").write_text("go")
    assert done.wait(10)
    worker.join()


def test_kill_logs_before_dying(tmp_path: Path, fresh: Path):
    code = "from krishiv_core.faults import fault_point; fault_point('stage.after_files', 1); print('survived')"
    env = {FAULTS_ENV: "stage.after_files@1", FAULTS_LOG_ENV: str(fresh), "PATH": ""}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == -9 and "survived" not in result.stdout
    assert json.loads(fresh.read_text())["point"] == "stage.after_files"


def test_unknown_action_names_the_item(monkeypatch):
    monkeypatch.setenv(FAULTS_ENV, "stage.begin:explode")
    with pytest.raises(ValueError, match=r"unknown action 'explode' in 'stage\.begin:explode'"):
        fault_point("stage.begin", 0)
