"""``krishiv status`` names who holds each of a pipeline's leases, until when, and under which fencing token."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from krishiv.cli import main
from outbox.ledger import Ledger


def _spec_file(tmp_path: Path) -> Path:
    from chaos.workspace import SPEC_TEMPLATE

    path = tmp_path / "krishiv.toml"
    path.write_text(
        SPEC_TEMPLATE.format(
            bootstrap="127.0.0.1:1",  # no broker: status shows the ledger's side and exits 1
            partitions=4,
            catalog_uri="sqlite:///catalog.db",
            warehouse="warehouse",
            topic="orders",
            max_records=100,
        )
    )
    return path


def test_status_shows_each_lease_with_its_holder_expiry_and_epoch(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    spec_file = _spec_file(tmp_path)
    ledger = Ledger(tmp_path / "ledger.duckdb")
    # The stager lease taken, given up and taken again: a fresh fencing token each time it changes hands (1, then 2).
    ledger.release_lease(ledger.acquire_lease("orders_per_minute", "krishiv run", ttl_s=60))
    stager = ledger.acquire_lease("orders_per_minute", "krishiv run", ttl_s=600)
    # A maintenance run that stopped without giving its lease up: the row stays, expired.
    ledger.acquire_lease("maintenance:krishiv.orders_per_minute_rejects", "krishiv maintain", ttl_s=-1)

    assert main(["--spec", str(spec_file), "status", "--json"]) == 1  # the broker does not answer
    [pipeline] = json.loads(capsys.readouterr().out)["pipelines"]
    stager_row, maintenance_row = pipeline["leases"]
    assert stager_row == {
        "name": "orders_per_minute",
        "holder": "krishiv run",
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "acquired_at": stager.acquired_at.isoformat(),
        "expires_at": stager.expires_at.isoformat(),
        "epoch": 2,
        "alive": True,
    }
    assert {k: maintenance_row[k] for k in ("name", "holder", "pid", "epoch", "alive")} == {
        "name": "maintenance:krishiv.orders_per_minute_rejects",
        "holder": "krishiv maintain",
        "pid": os.getpid(),
        "epoch": 1,
        "alive": False,
    }

    assert main(["--spec", str(spec_file), "status"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    here = f"(pid {os.getpid()} on {socket.gethostname()})"
    assert f"stager lease: krishiv run {here}, epoch 2, until {stager.expires_at:%m-%d %H:%M:%S} UTC" in out
    assert f"maintenance lease of orders_per_minute_rejects: krishiv maintain {here}, epoch 1, expired" in out
