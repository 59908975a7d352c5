"""Debezium change data capture of a real PostgreSQL into an upsert table, exactly once through a SIGKILL.

A private PostgreSQL with ``wal_level = logical`` (``tests.services.private_postgres``) is captured by Debezium's
embedded engine (``tests.services.debezium_capture``: the PostgreSQL connector, Kafka Connect's JSON converter or
Confluent's Avro converter against the test's Schema Registry). The test runs DML on the source table (a snapshot
of existing rows, inserts, updates, deletes, a primary key changed, a column added), produces the captured
records to the broker in order (each key's records to one partition, as Kafka Connect would), runs the real
``krishiv run`` and kills it with SIGKILL while it works, restarts it, and compares the Iceberg table with
``SELECT * FROM`` the source table: the oracle is the database itself.
"""

from __future__ import annotations

import os
import random
import signal
import tomllib
import zlib
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from chaos.workspace import SETTINGS_TEMPLATE
from krishiv.broker import LocalBroker
from krishiv.operations import open_ledger
from krishiv.produce import OrderEvent, ensure_topic, produce
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.spec import KrishivSpec, load_spec
from tests.services.debezium_capture import Capture, CapturedRecord, start_capture
from tests.services.private_postgres import LogicalPostgres
from tests.services.processes import stop
from tests.services.schema_registry import SchemaRegistryServer
from tests.spark_jobs.pipeline_helpers import all_committed, krishiv_cli, start_krishiv, wait_for

TIMEOUT_S = 240.0
PARTITIONS = 2
COLUMNS = ("id", "name", "amount", "updated_at", "born", "note")

SPEC = (
    SETTINGS_TEMPLATE
    + """{registry}
[[pipelines]]
name = "customers"
kind = "upsert"
topic = "{topic}"
envelope = "debezium"
key = ["id"]
cdc_columns = ["op"]
trigger_interval = "500ms"
max_records_per_batch = 20
{format}
"""
)


def _settings(broker: LocalBroker, topic: str) -> dict[str, object]:
    return {
        "bootstrap": broker.bootstrap,
        "partitions": PARTITIONS,
        "catalog_uri": "sqlite:///catalog.db",
        "warehouse": "warehouse",
        "topic": topic,
    }


FIELDS = """
[pipelines.fields]
id = "int"
name = { type = "string", required = false }
amount = { type = "decimal(12,2)", required = false }
updated_at = { type = "timestamp", required = false }
born = { type = "date", required = false }
note = { type = "string", required = false }
"""


class Source:
    """The captured table and the DML run on it: random, seeded, each statement its own transaction."""

    def __init__(self, pg: LogicalPostgres, seed: int) -> None:
        self.pg = pg
        self.random = random.Random(seed)
        self.next_id = 1
        self.noted = False
        #: How many records Debezium emits for the DML so far: a row read or written 1, a delete 2 (the event and
        #: its tombstone), a primary key changed 3 (a delete, its tombstone, a create).
        self.records = 0

    def create(self, rows: int) -> None:
        with self.pg.connect() as conn:
            conn.execute(
                "CREATE TABLE customers (id int PRIMARY KEY, name text, amount numeric(12,2), updated_at timestamp, "
                "born date)"
            )
        self.insert(rows)

    def _values(self) -> tuple[Any, ...]:
        r = self.random
        amount = Decimal(r.randrange(-(10**12) + 1, 10**12)).scaleb(-2) if r.random() < 0.9 else None
        moment = datetime(2026, 1, 1) + timedelta(microseconds=r.randrange(10**14))
        born = date(1950, 1, 1) + timedelta(days=r.randrange(30_000)) if r.random() < 0.8 else None
        return f"name-{r.randrange(10**6)}", amount, moment, born

    def insert(self, rows: int) -> None:
        with self.pg.connect() as conn:
            for _ in range(rows):
                note = ", note" if self.noted else ""
                values = (*self._values(), f"note-{self.next_id}") if self.noted else self._values()
                marks = ", ".join(["%s"] * (len(values) + 1))
                conn.execute(
                    f"INSERT INTO customers (id, name, amount, updated_at, born{note}) VALUES ({marks})",
                    (self.next_id, *values),
                )
                self.next_id += 1
                self.records += 1

    def ids(self) -> list[int]:
        with self.pg.connect() as conn:
            return [row[0] for row in conn.execute("SELECT id FROM customers ORDER BY id")]

    def churn(self, statements: int) -> None:
        """Updates (some of a row twice in one transaction), deletes, a primary key changed, inserts."""
        with self.pg.connect() as conn:
            for _ in range(statements):
                ids = self.ids()
                roll = self.random.random()
                victim = self.random.choice(ids)
                if roll < 0.45:
                    name, amount, moment, _born = self._values()
                    with conn.transaction():
                        conn.execute(
                            "UPDATE customers SET name = %s, amount = %s WHERE id = %s", (name, amount, victim)
                        )
                        conn.execute("UPDATE customers SET updated_at = %s WHERE id = %s", (moment, victim))
                    self.records += 2
                    if self.noted:
                        conn.execute("UPDATE customers SET note = %s WHERE id = %s", (f"changed-{name}", victim))
                        self.records += 1
                elif roll < 0.65:
                    conn.execute("DELETE FROM customers WHERE id = %s", (victim,))
                    self.records += 2
                elif roll < 0.75:
                    conn.execute("UPDATE customers SET id = %s WHERE id = %s", (self.next_id, victim))
                    self.next_id += 1
                    self.records += 3
                else:
                    self.insert(1)

    def add_note(self) -> None:
        with self.pg.connect() as conn:
            conn.execute("ALTER TABLE customers ADD COLUMN note text")
        self.noted = True

    def rows(self) -> dict[int, dict[str, Any]]:
        with self.pg.connect() as conn:
            columns = ", ".join(COLUMNS if self.noted else COLUMNS[:-1])
            result = conn.execute(f"SELECT {columns} FROM customers")
            names = [d.name for d in result.description]
            rows = {}
            for values in result:
                row = dict(zip(names, values, strict=True))
                if row["updated_at"] is not None:
                    row["updated_at"] = row["updated_at"].replace(tzinfo=UTC)  # Debezium: a timestamp is UTC
                rows[row["id"]] = {c: row.get(c) for c in COLUMNS}
            return rows


def _to_broker(bootstrap: str, topic: str, records: list[CapturedRecord]) -> None:
    """Produce the captured records in order, each key's to one partition (Kafka Connect's default partitioner
    hashes the key the same way for every record of a key)."""
    events = [
        OrderEvent(seq, zlib.crc32(r.key or b"") % PARTITIONS, r.key or b"", r.value, "valid")  # type: ignore[arg-type]
        for seq, r in enumerate(records)
    ]
    produce(bootstrap, topic, events)


def _table_rows(spec: KrishivSpec) -> dict[int, dict[str, Any]]:
    table = load_catalog(spec).load_table(qualified(spec, spec.pipeline().table))
    rows = table.scan().to_arrow().to_pylist()
    assert len({r["id"] for r in rows}) == len(rows), "one row per key"
    return {r["id"]: {c: r.get(c) for c in COLUMNS} for r in rows}


def _staged_offsets(spec: KrishivSpec) -> int:
    """How far the ledger has staged the topic (recorded batches, committed or not), in records."""
    ledger = open_ledger(spec)
    if not Path(ledger.path).exists():
        return 0
    pipeline = spec.pipeline()
    return sum(ledger.end_offsets(qualified(spec, pipeline.rejects_table), pipeline.topic).values())


def _run_through_a_kill(
    spec_file: Path, source: Source, capture: Capture, tmp_path: Path, *, column_added_while_down: bool
) -> KrishivSpec:
    """Wave 1 (the snapshot and churn) committed by a continuous run, which is SIGKILLed once it has staged a
    batch of wave 2; wave 3 is sent while it is down, and a second run finishes. The column is added in wave 2
    (fields listed in the spec: the run reads it at once) or in wave 3 (fields from the registry: the restarted
    run takes the new schema as its reader schema and adds the column). Returns the spec as the last run read it."""
    sent = 0
    topic = tomllib.loads(spec_file.read_text())["pipelines"][0]["topic"]
    bootstrap = tomllib.loads(spec_file.read_text())["kafka"]["bootstrap_servers"]

    def send_captured() -> None:
        nonlocal sent
        records = capture.wait(source.records)
        _to_broker(bootstrap, topic, records[sent:])
        sent = len(records)

    ensure_topic(bootstrap, topic, PARTITIONS)
    source.churn(25)
    send_captured()
    spec = load_spec(spec_file, env={})  # after the capture registered its schemas: fields may come from them
    output = tmp_path / "run-1.log"
    run = start_krishiv(spec_file, "run", output=output)
    try:
        wait_for(lambda: all_committed(spec), "wave 1 was not committed", output, TIMEOUT_S)
        before = _staged_offsets(spec)
        if not column_added_while_down:
            source.add_note()
        source.churn(25)
        send_captured()
        wait_for(lambda: _staged_offsets(spec) > before, "no batch of wave 2 was staged", output, TIMEOUT_S)
        os.kill(run.pid, signal.SIGKILL)
        run.wait(30)
    finally:
        stop(run)
    if column_added_while_down:
        source.add_note()
    source.churn(10)
    send_captured()
    output = tmp_path / "run-2.log"
    run = start_krishiv(spec_file, "run", output=output)
    try:
        wait_for(lambda: all_committed(spec), "the run after the kill did not commit everything", output, TIMEOUT_S)
    finally:
        stop(run)
    return load_spec(spec_file, env={})


def _check(spec: KrishivSpec, spec_file: Path, source: Source) -> None:
    assert _table_rows(spec) == source.rows()
    result = krishiv_cli(spec_file, "verify")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_debezium_json_stream_of_a_postgresql_table_lands_equal_to_the_table_through_a_kill(
    cdc_database: LogicalPostgres, broker: LocalBroker, topic: str, tmp_path: Path
) -> None:
    source = Source(cdc_database, seed=24)
    source.create(rows=8)  # read by the snapshot (op r)
    spec_file = tmp_path / "krishiv.toml"
    spec_file.write_text(SPEC.format(**_settings(broker, topic), registry="", format="") + FIELDS)
    with start_capture(cdc_database, "public.customers", out_dir=tmp_path / "capture") as capture:
        spec = _run_through_a_kill(spec_file, source, capture, tmp_path, column_added_while_down=False)
    _check(spec, spec_file, source)


@pytest.mark.heavy
def test_a_debezium_avro_stream_lands_with_fields_from_the_registry_through_a_kill_and_a_new_column(
    cdc_database: LogicalPostgres,
    broker: LocalBroker,
    topic: str,
    tmp_path: Path,
    schema_registry: SchemaRegistryServer,
) -> None:
    """Debezium's Avro converter registers the envelope's schemas in the test's registry over HTTP; Krishiv takes
    the fields from the value subject's latest schema and reads every record through the registry's REST API."""
    source = Source(cdc_database, seed=25)
    source.create(rows=8)
    spec_file = tmp_path / "krishiv.toml"
    registry = f'\n[schema_registry]\nurl = "{schema_registry.url}"\n'
    avro = 'format = "avro"\nsubject = "krishiv.public.customers-value"\n'
    spec_file.write_text(SPEC.format(**_settings(broker, topic), registry=registry, format=avro))
    with start_capture(
        cdc_database,
        "public.customers",
        out_dir=tmp_path / "capture",
        converter="avro",
        registry_url=schema_registry.url,
    ) as capture:
        spec = _run_through_a_kill(spec_file, source, capture, tmp_path, column_added_while_down=True)
    assert [f.name for f in spec.pipeline().fields] == [*COLUMNS, "_cdc_op", "_cdc_lsn"]
    _check(spec, spec_file, source)
    assert schema_registry.unknown_requests == []
