"""A pipeline over ``topic_pattern`` as a database grows: each table appears once its topic does, while the run goes
on, and a topic the spec cannot read yet stops the run with one line until its table's section is written.

Debezium's JSON change events (``c``/``u``/``d`` and the tombstone after a delete, each key's events on one
partition as Kafka Connect's partitioner puts them, decimals of up to 38 digits as its default ``precise`` mode
writes them) are produced to the real broker; ``krishiv run`` runs as its
own process. The oracle is a separate fold of the produced events by the documented rule (docs/spec.md, "kind =
upsert"): per key the event with the highest source position, absent when that event is a delete.
"""

from __future__ import annotations

import base64
import json
import random
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog

from chaos.workspace import SETTINGS_TEMPLATE
from krishiv.broker import LocalBroker
from krishiv.produce import OrderEvent, ensure_topic, produce
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.spec import load_spec
from tests.services.other_engines import OtherEngines
from tests.services.processes import stop
from tests.services.tcp_front import TcpFront, fronted_broker  # noqa: F401 - the fixture
from tests.spark_jobs.pipeline_helpers import (
    all_topics_committed,
    krishiv_cli,
    start_krishiv,
    verified_status,
    wait_for,
)

TIMEOUT_S = 240.0
OUTAGE_S = 10.0  # the broker's outage under a continuous run: shorter than its bound
PARTITIONS = 2
FIELDS = {
    "customers": {"id": "int", "name": "string"},
    "orders": {"id": "int", "customer_id": "int", "total": "decimal(12,2)"},
    "refunds": {"id": "int", "amount": "decimal(38,10)"},
}


def _section(table: str) -> str:
    fields = "\n".join(f'{name} = "{kind}"' for name, kind in FIELDS[table].items())
    return f'\n[pipelines.tables.{table}]\nkey = ["id"]\n[pipelines.tables.{table}.fields]\n{fields}\n'


def _spec_text(broker: LocalBroker | TcpFront, prefix: str, tables: list[str]) -> str:
    settings = {"bootstrap": broker.bootstrap, "partitions": PARTITIONS, "catalog_uri": "sqlite:///catalog.db"}
    head = SETTINGS_TEMPLATE.format(**settings, warehouse="warehouse") + (
        f'\n[[pipelines]]\nname = "shop"\nkind = "upsert"\nenvelope = "debezium"\n'
        f'topic_pattern = "{prefix}\\\\.public\\\\..*"\ntopic_discovery_interval = "1s"\n'
        'trigger_interval = "500ms"\nmax_records_per_batch = 30\n'
    )
    return head + "".join(_section(t) for t in tables)


class Database:
    """Change events of a few tables, as Debezium writes them, and what each table holds after them."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.lsn = 1000
        self.events: dict[str, list[tuple[int, str, dict[str, Any]]]] = {t: [] for t in FIELDS}

    def _row(self, table: str, key: int) -> dict[str, Any]:
        rng = self.rng
        if table == "customers":
            return {"id": key, "name": rng.choice(["Ada", "Bo", "Çelik", "", "x" * 300])}
        if table == "orders":
            total = rng.choice([Decimal("0.00"), Decimal("9999999999.99"), Decimal(f"{rng.randint(0, 10**6)}E-2")])
            return {"id": key, "customer_id": rng.randint(1, 5), "total": total}
        return {"id": key, "amount": Decimal(f"{rng.randint(-(10**38) + 1, 10**38 - 1)}E-10")}

    def changes(self, table: str, n: int) -> list[OrderEvent]:
        """``n`` change events of ``table`` (and a tombstone after each delete) in the order Debezium writes them."""
        live = set(self.expected(table))
        out = []
        for _ in range(n):
            key = self.rng.randint(1, 12)
            self.lsn += self.rng.randint(1, 50)
            if key in live and self.rng.random() < 0.3:
                op, before, after = "d", {"id": key}, None
                live.discard(key)
            else:
                op, before, after = ("u" if key in live else "c"), None, self._row(table, key)
                live.add(key)
            self.events[table].append((key, op, after or {}))
            value = {"op": op, "before": before, "after": after, "source": {"lsn": self.lsn}}
            k = json.dumps({"id": key}).encode()
            out.append(OrderEvent(len(out), key % PARTITIONS, k, json.dumps(value, default=_precise).encode(), "valid"))
            if op == "d":
                out.append(OrderEvent(len(out), key % PARTITIONS, k, None, "valid"))
        return out

    def expected(self, table: str) -> dict[int, dict[str, Any]]:
        """The table by the upsert rule: per key its last event by source position, gone if that is a delete."""
        rows: dict[int, dict[str, Any]] = {}
        for key, op, after in self.events[table]:  # produced in source order: the last event is the highest lsn
            if op == "d":
                rows.pop(key, None)
            else:
                rows[key] = after
        return rows


def _precise(value: Decimal) -> str:
    """A decimal as Debezium's JSON converter writes it by default (``decimal.handling.mode = precise``, no schema):
    the base64 of its unscaled value's big-endian two's complement, at its scale."""
    sign, digits, _ = value.as_tuple()
    unscaled = int("".join(map(str, digits))) * (-1 if sign else 1)
    return base64.b64encode(unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big", signed=True)).decode()


def _send(broker: LocalBroker | TcpFront, topic: str, events: list[OrderEvent]) -> None:
    ensure_topic(broker.bootstrap, topic, PARTITIONS)
    produce(broker.bootstrap, topic, events)


def _rows(spec_file: Path, table: str) -> dict[int, dict[str, Any]]:
    spec = load_spec(spec_file, env={})
    rows = load_catalog(spec).load_table(qualified(spec, table)).scan().to_arrow().to_pylist()
    out = {r["id"]: {c: r[c] for c in FIELDS[table]} for r in rows}
    assert len(out) == len(rows), f"{table}: one row per key"
    return out


def _tables(catalog: Catalog) -> set[str]:
    return {name for _, name in catalog.list_tables("krishiv")}


def test_tables_appear_as_their_topics_do_and_an_unreadable_topic_stops_with_one_line(
    broker: LocalBroker, tmp_path: Path
) -> None:
    prefix = f"pat{uuid.uuid4().hex[:8]}"
    topic = {t: f"{prefix}.public.{t}" for t in FIELDS}
    spec_file = tmp_path / "krishiv.toml"
    spec_file.write_text(_spec_text(broker, prefix, ["customers", "orders"]))
    db = Database(seed=39)

    # nothing matches yet: one line naming the pattern and the way out
    early = krishiv_cli(spec_file, "status")
    assert early.returncode != 0 and "Traceback" not in early.stderr, early.stderr
    assert "pipelines[0].topic_pattern: no topic on the Kafka broker" in early.stderr, early.stderr

    _send(broker, topic["customers"], db.changes("customers", 40))
    catalog = load_catalog(load_spec(spec_file, env={}))
    output = tmp_path / "run.log"
    run = start_krishiv(spec_file, "run", output=output)
    try:
        wait_for(lambda: all_topics_committed(load_spec(spec_file, env={})), "customers committed", output, TIMEOUT_S)
        assert "orders" not in _tables(catalog)  # no topic, no table yet
        # a new table's topic appears while the run goes on, and the old one moves on too
        _send(broker, topic["orders"], db.changes("orders", 50))
        _send(broker, topic["customers"], db.changes("customers", 20))
        wait_for(
            lambda: "orders" in _tables(catalog) and all_topics_committed(load_spec(spec_file, env={})),
            "orders committed",
            output,
            TIMEOUT_S,
        )
        assert f"new topics match its topic_pattern: {topic['orders']} (table orders)" in output.read_text()
        # a topic whose table has no section (JSON has no fields of its own): the run stops, naming it
        _send(broker, topic["refunds"], db.changes("refunds", 30))
        wait_for(lambda: run.poll() is not None, "the run did not stop on the unreadable topic", output, TIMEOUT_S)
    finally:
        stop(run)
    said = output.read_text()
    assert run.returncode != 0 and "Traceback" not in said, said[-3000:]
    assert f"pipelines[0].tables.refunds: topic {topic['refunds']} matches topic_pattern and its table has no " in said
    assert "give it a [pipelines.tables.refunds] section with key and fields, or narrow topic_pattern" in said
    # every command says the same while the topic cannot be read
    blocked = krishiv_cli(spec_file, "status")
    assert blocked.returncode != 0 and "[pipelines.tables.refunds]" in blocked.stderr, blocked.stderr
    assert "refunds" not in _tables(catalog)

    # the way out: the table's section; the run reads the topic from its first offset
    spec_file.write_text(_spec_text(broker, prefix, ["customers", "orders", "refunds"]))
    _send(broker, topic["orders"], db.changes("orders", 20))
    output = tmp_path / "run-again.log"
    run = start_krishiv(spec_file, "run", output=output)
    try:
        wait_for(lambda: all_topics_committed(load_spec(spec_file, env={})), "everything committed", output, TIMEOUT_S)
    finally:
        stop(run)
    for table in FIELDS:
        assert _rows(spec_file, table) == db.expected(table), table
    shown = verified_status(spec_file)
    assert shown["topics"] == [topic[t] for t in FIELDS] and shown["topic_pattern"] == rf"{prefix}\.public\..*"


def test_a_pattern_run_rides_out_a_broker_outage_and_a_topic_made_after_it_joins(
    fronted_broker: TcpFront,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    other_engines: OtherEngines,
) -> None:
    """The broker goes away under a continuous run over a pattern: the run waits for it (one line when it goes, one
    when it is back; topic discovery waits too), then a topic made after the outage joins, and every table ends
    equal to the fold of its events, read with pyiceberg and with polars, DuckDB and daft."""
    prefix = f"out{uuid.uuid4().hex[:8]}"
    topic = {t: f"{prefix}.public.{t}" for t in FIELDS}
    spec_file = tmp_path / "krishiv.toml"
    spec_file.write_text(_spec_text(fronted_broker, prefix, ["customers", "orders"]))
    db = Database(seed=40)
    _send(fronted_broker, topic["customers"], db.changes("customers", 40))
    catalog = load_catalog(load_spec(spec_file, env={}))
    output = tmp_path / "run.log"
    run = start_krishiv(spec_file, "run", output=output, env={"KRISHIV_BROKER_OUTAGE_S": "120"})
    try:
        wait_for(lambda: all_topics_committed(load_spec(spec_file, env={})), "customers committed", output, TIMEOUT_S)
        fronted_broker.cut()
        cut_at = time.monotonic()
        wait_for(lambda: "retrying for up to" in output.read_text(), "the outage reported", output, TIMEOUT_S)
        # The outage lasts OUTAGE_S (a duration the test sets, not a wait for a condition); the run stays up.
        wait_for(lambda: time.monotonic() - cut_at >= OUTAGE_S or run.poll() is not None, "the outage", output, 60)
        assert run.poll() is None, output.read_text()[-3000:]
        fronted_broker.restore()
        wait_for(lambda: "is back after" in output.read_text(), "the broker's return reported", output, TIMEOUT_S)
        _send(fronted_broker, topic["orders"], db.changes("orders", 50))
        _send(fronted_broker, topic["customers"], db.changes("customers", 20))
        wait_for(
            lambda: "orders" in _tables(catalog) and all_topics_committed(load_spec(spec_file, env={})),
            "orders committed after the outage",
            output,
            TIMEOUT_S,
        )
        assert run.poll() is None, output.read_text()[-3000:]
    finally:
        stop(run)
    said = output.read_text()
    assert "Traceback" not in said, said[-3000:]
    assert f"new topics match its topic_pattern: {topic['orders']} (table orders)" in said
    for table in ("customers", "orders"):
        assert _rows(spec_file, table) == db.expected(table), table
    shown = verified_status(spec_file)
    assert shown["topics"] == [topic["customers"], topic["orders"]]
    spec = load_spec(spec_file, env={})
    tables = {t: load_catalog(spec).load_table(qualified(spec, t)).metadata_location for t in ("customers", "orders")}
    for table, by_engine in other_engines.read(tables, tmp_path / "engines").items():
        for engine, rows in by_engine.items():
            assert {r["id"]: {c: r[c] for c in FIELDS[table]} for r in rows.to_pylist()} == db.expected(table), (
                table,
                engine,
            )
