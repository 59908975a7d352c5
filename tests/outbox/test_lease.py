"""The stager lease: one live process runs a pipeline's query; a dead or expired holder is taken over."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from krishiv.cli import main
from outbox.errors import StagerBusy
from outbox.lease import stager_lease
from outbox.ledger import Ledger

HOLD = (
    "import sys, time; from outbox.ledger import Ledger;"
    "Ledger(sys.argv[1]).acquire_lease('orders_per_minute', 'krishiv run', float(sys.argv[2]));"
    "print('held', flush=True); time.sleep(120)"
)


def _holder(path: Path, ttl_s: float = 60.0) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(ttl_s)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.duckdb")


def test_a_live_holder_blocks_and_is_named(ledger: Ledger) -> None:
    holder = _holder(Path(ledger.path))
    try:
        with pytest.raises(StagerBusy, match=rf"already being staged by krishiv run \(pid {holder.pid} on "):
            ledger.acquire_lease("orders_per_minute", "dagster run x", 30)
        assert ledger.live_lease("orders_per_minute").pid == holder.pid
        # Another pipeline is free.
        assert ledger.acquire_lease("refunds", "dagster run x", 30).holder == "dagster run x"
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holder_is_taken_over_at_once(ledger: Ledger) -> None:
    holder = _holder(Path(ledger.path))
    holder.kill()
    holder.wait()
    assert ledger.live_lease("orders_per_minute") is None
    lease = ledger.acquire_lease("orders_per_minute", "krishiv run", 30)
    assert ledger.live_lease("orders_per_minute") == lease


def test_an_expired_lease_is_taken_over(ledger: Ledger) -> None:
    holder = _holder(Path(ledger.path), ttl_s=0.2)
    try:
        deadline = time.monotonic() + 10
        while ledger.live_lease("orders_per_minute") is not None:
            assert time.monotonic() < deadline, "the lease never expired"
            time.sleep(0.05)
        assert ledger.acquire_lease("orders_per_minute", "krishiv run", 30).pid != holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_the_context_renews_and_releases(ledger: Ledger) -> None:
    with stager_lease(ledger, "orders_per_minute", "krishiv run", ttl_s=0.6) as lease:
        first_expiry = ledger.live_lease("orders_per_minute").expires_at
        deadline = time.monotonic() + 10
        while ledger.live_lease("orders_per_minute").expires_at == first_expiry:
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.05)
        assert ledger.live_lease("orders_per_minute").pid == lease.pid
    assert ledger.live_lease("orders_per_minute") is None


def test_krishiv_run_refuses_a_pipeline_staged_elsewhere(spec_file: Path, make_spec, capsys) -> None:
    spec = make_spec()
    holder = _holder(spec.resolve(spec.storage.ledger_path))
    try:
        assert main(["--spec", str(spec_file), "run", "--once"]) == 2
        err = capsys.readouterr().err
        assert "pipeline 'orders_per_minute' is already being staged by krishiv run" in err
        assert f"pid {holder.pid}" in err
    finally:
        holder.kill()
        holder.wait()
