"""``krishiv cut``: each table's snapshot as of one batch, so a reader can time-travel every table to the same cut.
The oracle is the rule in krishiv/cut.py's docstring, applied to which batches were staged with rows for which table."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from krishiv.cut import TableCut, consistent_cut, cut_at, default_cut
from outbox.ledger import Ledger
from outbox.relay import CommitRelay
from tests.outbox.test_relay import TABLE, stage

NAMESPACES = ("krishiv", "rejects", "route")
TABLES = [f"{ns}.{TABLE.split('.')[1]}" for ns in NAMESPACES]
#: Which tables each batch gives rows to (a batch with none for a table makes no snapshot there).
ROWS = {0: NAMESPACES, 1: ("krishiv",), 2: ("krishiv", "route"), 3: ("krishiv", "rejects")}


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(str(tmp_path / "ledger.duckdb"))


def test_each_table_is_named_at_the_snapshot_of_its_last_batch_up_to_the_cut(tmp_path: Path, ledger: Ledger) -> None:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=tmp_path.as_uri())
    snapshot_of: dict[tuple[str, int], int] = {}
    for batch, namespaces in ROWS.items():
        for ns in namespaces:
            entry = stage(catalog, ledger, batch, batch, namespace=ns)
            snapshot_of[(entry.table, batch)] = entry.intended_snapshot_id
    CommitRelay(ledger, catalog).run(TABLES)
    tables = {t: catalog.load_table(t) for t in TABLES}

    def expected(cut: int) -> list[TableCut]:
        out = []
        for t, ns in zip(TABLES, NAMESPACES, strict=True):
            batches = [b for b, with_rows in ROWS.items() if b <= cut and ns in with_rows]
            out.append(
                TableCut(t, snapshot_of[(t, max(batches))], max(batches)) if batches else TableCut(t, None, None)
            )
        return out

    assert default_cut(ledger, "orders_per_minute", TABLES[0]) == ("q1", 3)
    for cut in ROWS:
        assert cut_at(tables, ledger, "q1", cut) == expected(cut), cut
    doc = consistent_cut(ledger, "orders_per_minute", TABLES[0], tables)
    assert doc == {"query_id": "q1", "batch_id": 3, "snapshots": {c.table: c.snapshot_id for c in expected(3)}}

    route = catalog.load_table(TABLES[2])  # the route's batch 0 snapshot expires (batch 2's is its current one)
    route.maintenance.expire_snapshots().by_ids([snapshot_of[(TABLES[2], 0)]]).commit()
    tables[TABLES[2]] = catalog.load_table(TABLES[2])
    assert cut_at(tables, ledger, "q1", 1)[2] == TableCut(TABLES[2], None, 0, expired=True)
    assert cut_at(tables, ledger, "q1", 2)[2] == expected(2)[2], "batch 2's snapshot is still there"


def test_the_default_cut_stops_before_the_first_pending_batch(tmp_path: Path, ledger: Ledger) -> None:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=tmp_path.as_uri())
    assert default_cut(ledger, "orders_per_minute", TABLES[0]) is None, "nothing staged"
    stage(catalog, ledger, 0, 0)
    assert default_cut(ledger, "orders_per_minute", TABLES[0]) is None, "nothing committed"
    CommitRelay(ledger, catalog).run()
    stage(catalog, ledger, 1, 1)
    assert default_cut(ledger, "orders_per_minute", TABLES[0]) == ("q1", 0)
