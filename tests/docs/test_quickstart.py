"""docs/quickstart.md runs as written: its shell blocks, in order, from the clone, with a home folder of their own,
then its Python block. The table they make is compared with an oracle folded from the page's own events file by
the field rule of docs/spec.md, and the output the page shows is the output the commands print."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

from pyiceberg.catalog import load_catalog

from krishiv.broker import free_port
from krishiv_core.spec import ENV_OVERRIDES, SPEC_FILE_ENV
from tests.docs.pages import DOCS, REPO, blocks_under

PAGE = DOCS / "quickstart.md"
_PLAIN_DECIMAL = re.compile(r"-?\d+(\.\d{1,2})?")


def _expected(events: Path) -> tuple[dict[str, tuple[str, Decimal]], set[str]]:
    """payment id -> (customer, amount) of the lines the rule reads, and the lines it rejects: every field is a JSON
    string; ``amount`` must be plain digits with at most 2 decimal places (``decimal(10,2)`` holds 8 integer digits)."""
    rows, rejects = {}, set()
    for line in events.read_text().splitlines():
        event = json.loads(line)
        amount = event["amount"]
        if _PLAIN_DECIMAL.fullmatch(amount) and len(amount.split(".")[0].lstrip("-")) <= 8:
            rows[event["payment_id"]] = (event["customer"], Decimal(amount))
        else:
            rejects.add(line)
    return rows, rejects


def _shown(block_text: str) -> list[str]:
    return [line.rstrip() for line in block_text.splitlines() if line.strip()]


def test_the_quickstart_runs_as_written_and_makes_the_table_it_shows(tmp_path: Path) -> None:
    shell = [b for b in blocks_under(PAGE, "Your own topic") if b.language == "bash"]
    shell += [b for b in blocks_under(PAGE, "Reading the tables") if b.language == "bash"]
    python = [b for b in blocks_under(PAGE, "Reading the tables") if b.language == "python"]
    shown = [b for b in blocks_under(PAGE, "Your own topic") if b.language == "text"]
    assert len(shell) >= 5 and len(python) == 1 and len(shown) == 3, "the page's blocks are not the ones this reads"
    script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + "".join(
        f"echo '>>> {b.where}'\n{b.text}" for b in shell
    )
    env = {k: v for k, v in os.environ.items() if k not in (*ENV_OVERRIDES, SPEC_FILE_ENV, "VIRTUAL_ENV")}
    env.update(HOME=str(tmp_path), KRISHIV_KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}", COLUMNS="120")
    done = subprocess.run(
        ["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    folder = tmp_path / "krishiv-payments"

    # What the page shows is what the commands printed: init's fields and the query's table.
    for block in shown:
        lines = _shown(block.text)
        assert "\n".join(lines) in "\n".join(line.rstrip() for line in done.stdout.splitlines()), (block.where, said)

    reason = 'mistyped field: amount (decimal(10,2), got a JSON string "twelve": not a number)'
    assert reason in PAGE.read_text() and reason in done.stdout, said

    rows, rejects = _expected(folder / "payments.jsonl")
    catalog = load_catalog("krishiv", uri=f"sqlite:///{folder}/state/catalog.db")
    table = catalog.load_table("krishiv.payments").scan().to_arrow().to_pylist()
    assert {r["payment_id"]: (r["customer"], r["amount"]) for r in table} == rows
    assert len(table) == len(rows), "a record twice"
    rejected = catalog.load_table("krishiv.payments_rejects").scan().to_arrow().to_pylist()
    assert {r["value"].decode() if isinstance(r["value"], bytes) else r["value"] for r in rejected} == rejects
    status = json.loads((folder / "status.json").read_text())
    assert status["pipelines"][0]["events"] == {"read": len(rows) + len(rejects), "rejected": len(rejects), "late": 0}

    ran = subprocess.run(
        [sys.executable, "-"], input=python[0].text, cwd=folder, capture_output=True, text=True, timeout=120, env=env
    )
    assert ran.returncode == 0, ran.stderr
    assert all(payment in ran.stdout for payment, (customer, _) in rows.items() if customer == "c-1")
