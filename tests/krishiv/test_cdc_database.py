"""A whole PostgreSQL database through one pipeline over several topics: every table equal to its source table,
and every source transaction visible whole, through SIGKILLs of the run.

Five tables with foreign keys (customers, products, orders, order_lines, payments) are captured by Debezium's
embedded engine (``tests.services.debezium_capture``) with ``provide.transaction.metadata``: a topic per table and
the transaction topic. A seeded workload runs each business change as one source transaction: an order placed
with its lines (the order's total is the sum of its lines), a line changed or added with the total changed to
match, an order deleted (its lines and payments by ``ON DELETE CASCADE``), a customer renamed, a price changed.
The captured records go to the broker in order (each key's to one partition, as Kafka Connect's partitioner
would put them). ``krishiv run`` reads them all with one query and is SIGKILLed by the fault point right after the
ledger recorded its third batch, while more transactions arrive, so the next run replays that batch.

Beside it, a reader takes the pointers of ``orders`` and ``order_lines`` in one read of the catalog's database
after every commit, as a query joining them would see them, and checks the invariant the source's transactions
keep: each order's lines sum to its total, and no line belongs to an order that is not there. The oracle of the
tables is the database itself (``SELECT *``).
"""

from __future__ import annotations

import random
import signal
import threading
import zlib
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.table import StaticTable
from sqlalchemy import select
from sqlalchemy.orm import Session

from chaos.workspace import SETTINGS_TEMPLATE
from krishiv.broker import LocalBroker
from krishiv.produce import OrderEvent, ensure_topic, produce
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.spec import KrishivSpec, load_spec
from outbox.relay import SUMMARY_BATCH_ID
from tests.services.debezium_capture import Capture, CapturedRecord, start_capture
from tests.services.private_postgres import LogicalPostgres
from tests.services.processes import stop
from tests.services.schema_registry import SchemaRegistryServer
from tests.spark_jobs.pipeline_helpers import (
    all_topics_committed,
    krishiv_cli,
    start_krishiv,
    verified_status,
    wait_for,
)

TIMEOUT_S = 300.0
PARTITIONS = 2
PREFIX = "shop"
TABLES = {
    "customers": "id int PRIMARY KEY, name text NOT NULL, email text",
    "products": "id int PRIMARY KEY, name text NOT NULL, price numeric(10,2) NOT NULL",
    "orders": "id int PRIMARY KEY, customer_id int NOT NULL REFERENCES customers(id), total numeric(12,2) NOT NULL",
    "order_lines": "id int PRIMARY KEY, order_id int NOT NULL REFERENCES orders(id) ON DELETE CASCADE, "
    "product_id int NOT NULL REFERENCES products(id), qty int NOT NULL, amount numeric(12,2) NOT NULL",
    "payments": "id int PRIMARY KEY, order_id int NOT NULL REFERENCES orders(id) ON DELETE CASCADE, "
    "amount numeric(12,2) NOT NULL",
}
FIELDS = {
    "customers": 'id = "int"\nname = "string"\nemail = { type = "string", required = false }',
    "products": 'id = "int"\nname = "string"\nprice = "decimal(10,2)"',
    "orders": 'id = "int"\ncustomer_id = "int"\ntotal = "decimal(12,2)"',
    "order_lines": 'id = "int"\norder_id = "int"\nproduct_id = "int"\nqty = "int"\namount = "decimal(12,2)"',
    "payments": 'id = "int"\norder_id = "int"\namount = "decimal(12,2)"',
}
TRANSACTION_TOPIC = f"{PREFIX}.transaction"


def topic_of(table: str) -> str:
    return f"{PREFIX}.public.{table}"


def spec_text(broker: LocalBroker) -> str:
    settings = {
        "bootstrap": broker.bootstrap,
        "partitions": PARTITIONS,
        "catalog_uri": "sqlite:///catalog.db",
        "warehouse": "warehouse",
    }
    topics = ", ".join(f'"{topic_of(t)}"' for t in TABLES)
    text = (
        SETTINGS_TEMPLATE.format(**settings)
        + f"""
[[pipelines]]
name = "shop"
kind = "upsert"
envelope = "debezium"
topics = [{topics}]
transaction_topic = "{TRANSACTION_TOPIC}"
trigger_interval = "500ms"
max_records_per_batch = 40
"""
    )
    for table, fields in FIELDS.items():
        text += f'\n[pipelines.tables.{table}]\nkey = ["id"]\n[pipelines.tables.{table}.fields]\n{fields}\n'
    return text


class Shop:
    """The source database and a seeded workload of business transactions over it."""

    def __init__(self, pg: LogicalPostgres, seed: int) -> None:
        self.pg = pg
        self.random = random.Random(seed)
        self.next_id = {t: 1 for t in TABLES}
        self.kept_orders: set[int] = set()  # orders a test placed itself, which the workload leaves alone

    def _id(self, table: str) -> int:
        self.next_id[table] += 1
        return self.next_id[table] - 1

    def create(self) -> None:
        with self.pg.connect() as conn:
            for table, columns in TABLES.items():
                conn.execute(f"CREATE TABLE {table} ({columns})")
            for _ in range(4):  # read by the snapshot: outside any transaction
                conn.execute("INSERT INTO customers VALUES (%s, %s, %s)", (self._id("customers"), "c", None))
                conn.execute("INSERT INTO products VALUES (%s, %s, %s)", (self._id("products"), "p", self._price()))

    def _price(self) -> Decimal:
        return Decimal(self.random.randrange(1, 10**6)).scaleb(-2)

    def _ids(self, conn: Any, table: str, where: str = "", args: tuple = ()) -> list[int]:
        return [r[0] for r in conn.execute(f"SELECT id FROM {table} {where} ORDER BY id", args)]

    def transactions(self, n: int) -> None:
        """``n`` business transactions, each one source transaction."""
        with self.pg.connect() as conn:
            for _ in range(n):
                with conn.transaction():
                    self._one(conn)

    def _one(self, conn: Any) -> None:
        r = self.random
        orders = [o for o in self._ids(conn, "orders") if o not in self.kept_orders]
        roll = r.random()
        if roll < 0.35 or not orders:  # an order placed with its lines and maybe a payment
            order = self._id("orders")
            customer = r.choice(self._ids(conn, "customers"))
            lines = [(self._id("order_lines"), r.randrange(1, 5), self._price()) for _ in range(r.randrange(1, 5))]
            total = sum((a for _, _, a in lines), Decimal(0))
            conn.execute("INSERT INTO orders VALUES (%s, %s, %s)", (order, customer, total))
            for line, qty, amount in lines:
                product = r.choice(self._ids(conn, "products"))
                conn.execute("INSERT INTO order_lines VALUES (%s, %s, %s, %s, %s)", (line, order, product, qty, amount))
            if r.random() < 0.5:
                conn.execute("INSERT INTO payments VALUES (%s, %s, %s)", (self._id("payments"), order, total))
            return
        order = r.choice(orders)
        lines = self._ids(conn, "order_lines", "WHERE order_id = %s", (order,))
        if roll < 0.55 and lines:  # a line changed, the total with it
            conn.execute("UPDATE order_lines SET amount = %s WHERE id = %s", (self._price(), r.choice(lines)))
        elif roll < 0.7:  # a line added
            product = r.choice(self._ids(conn, "products"))
            line = (self._id("order_lines"), order, product, 1, self._price())
            conn.execute("INSERT INTO order_lines VALUES (%s, %s, %s, %s, %s)", line)
        elif roll < 0.8 and len(lines) > 1:  # a line removed
            conn.execute("DELETE FROM order_lines WHERE id = %s", (r.choice(lines),))
        elif roll < 0.9:  # the order deleted, its lines and payments by cascade
            conn.execute("DELETE FROM orders WHERE id = %s", (order,))
            return
        elif roll < 0.95:
            customer = r.choice(self._ids(conn, "customers"))
            conn.execute("UPDATE customers SET name = %s, email = %s WHERE id = %s", (f"n{r.random()}", "e", customer))
            return
        else:
            product = r.choice(self._ids(conn, "products"))
            conn.execute("UPDATE products SET price = %s WHERE id = %s", (self._price(), product))
            return
        conn.execute(
            "UPDATE orders SET total = (SELECT coalesce(sum(amount), 0) FROM order_lines WHERE order_id = %s) "
            "WHERE id = %s",
            (order, order),
        )

    def rows(self, table: str) -> dict[int, dict[str, Any]]:
        with self.pg.connect() as conn:
            result = conn.execute(f"SELECT * FROM {table}")
            names = [d.name for d in result.description]
            return {row[0]: dict(zip(names, row, strict=True)) for row in result}


class Producer:
    """The captured records produced to the broker in order: a table's by the key's hash, the transaction
    topic's to its one partition."""

    def __init__(self, bootstrap: str, capture: Capture, transaction_topic: str = TRANSACTION_TOPIC) -> None:
        self.bootstrap, self.capture, self.sent = bootstrap, capture, 0
        self.transaction_topic = transaction_topic

    def send_all(self, settle_s: float = 3.0) -> None:
        """Everything captured so far, once the capture has been quiet for ``settle_s``."""
        records = self.capture.records()
        deadline = threading.Event()
        while True:
            deadline.wait(settle_s)
            again = self.capture.records()
            if len(again) == len(records):
                break
            records = again
        by_topic: dict[str, list[CapturedRecord]] = {}
        for r in records[self.sent :]:
            by_topic.setdefault(r.destination, []).append(r)
        for topic, batch in by_topic.items():  # a topic made with its first record, as Kafka Connect's are
            partitions = 1 if topic == self.transaction_topic else PARTITIONS
            ensure_topic(self.bootstrap, topic, partitions)
            produce(
                self.bootstrap,
                topic,
                [
                    OrderEvent(i, zlib.crc32(r.key or b"") % partitions, r.key or b"", r.value, "valid")  # type: ignore[arg-type]
                    for i, r in enumerate(batch)
                ],
            )
        self.sent = len(records)


class InvariantReader:
    """After every commit, ``orders`` and ``order_lines`` at one cut of the catalog: each order's lines sum to its
    total, and every line's order is there."""

    def __init__(self, catalog: SqlCatalog, namespace: str) -> None:
        self.catalog, self.namespace = catalog, namespace
        self.cuts = 0
        self.broken: list[str] = []
        self.errors: list[str] = []
        self._seen: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> InvariantReader:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.check()
            except Exception as exc:  # the catalog busy: the next read tries again
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def check(self) -> None:
        with Session(self.catalog.engine) as session:
            pointers = dict(
                session.execute(
                    select(IcebergTables.table_name, IcebergTables.metadata_location).where(
                        IcebergTables.table_namespace == self.namespace,
                        IcebergTables.table_name.in_(["orders", "order_lines"]),
                    )
                ).all()
            )
        if len(pointers) < 2 or (pointers["orders"], pointers["order_lines"]) in self._seen:
            return
        self._seen.add((pointers["orders"], pointers["order_lines"]))
        orders = StaticTable.from_metadata(pointers["orders"]).scan().to_arrow()
        lines = StaticTable.from_metadata(pointers["order_lines"]).scan().to_arrow()
        self.cuts += 1
        totals = dict(zip(orders.column("id").to_pylist(), orders.column("total").to_pylist(), strict=True))
        sums: dict[int, Decimal] = {}
        for order, amount in zip(lines.column("order_id").to_pylist(), lines.column("amount").to_pylist(), strict=True):
            sums[order] = sums.get(order, Decimal(0)) + amount
        for order, total in sums.items():
            if order not in totals:
                self.broken.append(f"cut {self.cuts}: lines of order {order}, which is not there")
            elif totals[order] != total:
                self.broken.append(f"cut {self.cuts}: order {order} total {totals[order]}, its lines sum to {total}")
        for order, total in totals.items():
            if order not in sums and total != 0:
                self.broken.append(f"cut {self.cuts}: order {order} total {total} without its lines")


def _table_rows(spec: KrishivSpec, table: str) -> dict[int, dict[str, Any]]:
    rows = load_catalog(spec).load_table(qualified(spec, table)).scan().to_arrow()
    columns = [c for c in rows.column_names if not c.startswith("_cdc_")]
    assert pc.count_distinct(rows.column("id")).as_py() == rows.num_rows, f"{table}: one row per key"
    return {r["id"]: {c: r[c] for c in columns} for r in rows.to_pylist()}


def test_a_database_of_five_tables_lands_whole_transactions_through_a_kill(
    cdc_database: LogicalPostgres, broker: LocalBroker, tmp_path: Path
) -> None:
    shop = Shop(cdc_database, seed=38)
    shop.create()
    spec_file = tmp_path / "krishiv.toml"
    spec_file.write_text(spec_text(broker))
    extra = {"provide.transaction.metadata": "true"}
    with start_capture(
        cdc_database, list(TABLES), out_dir=tmp_path / "capture", topic_prefix=PREFIX, extra_properties=extra
    ) as capture:
        producer = Producer(broker.bootstrap, capture)
        capture.wait(8)  # the snapshot's reads
        spec = load_spec(spec_file, env={})
        catalog = load_catalog(spec)
        assert isinstance(catalog, SqlCatalog)
        with InvariantReader(catalog, spec.iceberg.namespace) as reader:
            shop.transactions(35)
            producer.send_all()
            # a run killed (SIGKILL, by the fault point) right after the ledger recorded its third batch, before
            # Spark's commit log, while more transactions arrive: the next run replays that batch from the rows that
            # waited before it, and must stage nothing twice
            output = tmp_path / "run-killed.log"
            run = start_krishiv(spec_file, "run", output=output, env={"KRISHIV_FAULTS": "stage.after_ledger@2:kill"})
            try:
                shop.transactions(25)
                producer.send_all()
                wait_for(lambda: run.poll() is not None, "the fault point did not kill the run", output, TIMEOUT_S)
                assert run.returncode == -signal.SIGKILL
            finally:
                stop(run)
            shop.transactions(25)
            producer.send_all()
            output = tmp_path / "run-last.log"
            run = start_krishiv(spec_file, "run", output=output)
            try:
                wait_for(lambda: all_topics_committed(spec), "not everything was committed", output, TIMEOUT_S)
            finally:
                stop(run)
            reader.check()

    print(f"reader: {reader.cuts} cuts, {len(reader.broken)} broken, {len(reader.errors)} errors")
    assert reader.broken == [], reader.broken[:5]
    assert reader.cuts >= 5, f"the reader saw {reader.cuts} cuts ({reader.errors[:3]})"
    for table in TABLES:
        assert _table_rows(spec, table) == shop.rows(table), table
    shown = verified_status(spec_file)
    assert shown["topics"] == [*map(topic_of, TABLES), TRANSACTION_TOPIC]
    assert {(p["topic"], p["partition"]) for p in shown["partitions"]} == {
        *((topic_of(t), p) for t in TABLES for p in range(PARTITIONS)),
        (TRANSACTION_TOPIC, 0),
    }
    assert all(p["lag"] == 0 for p in shown["partitions"]) and shown["held_events"] == 0
    check = krishiv_cli(spec_file, "check")  # every table keyed by its own section's key
    assert check.returncode == 0, check.stdout + check.stderr
    mistake = krishiv_cli(spec_file, "skip-offsets", "--partition", "0", "--to", "1", "--reason", "test")
    assert mistake.returncode != 0 and "--topic" in mistake.stderr and "Traceback" not in mistake.stderr


def test_a_growing_avro_database_lands_through_a_topic_pattern_with_no_table_sections(
    cdc_database: LogicalPostgres, broker: LocalBroker, tmp_path: Path, schema_registry: SchemaRegistryServer
) -> None:
    """Debezium's Avro converter registers each table's key and value schemas; a pipeline with only
    ``topic_pattern`` takes every table's fields and key from them. The run starts with the two tables the
    snapshot read; the others' topics appear with the first transactions, while it runs, and their tables with
    them, each transaction still visible whole."""
    prefix = "grow"
    shop = Shop(cdc_database, seed=39)
    shop.create()
    spec_file = tmp_path / "krishiv.toml"
    settings = {"bootstrap": broker.bootstrap, "partitions": PARTITIONS, "catalog_uri": "sqlite:///catalog.db"}
    spec_file.write_text(
        SETTINGS_TEMPLATE.format(**settings, warehouse="warehouse")
        + f"""
[schema_registry]
url = "{schema_registry.url}"

[[pipelines]]
name = "shop"
kind = "upsert"
envelope = "debezium"
format = "avro"
topic_pattern = "{prefix}\\\\.public\\\\..*"
transaction_topic = "{prefix}.transaction"
topic_discovery_interval = "15s"
trigger_interval = "500ms"
max_records_per_batch = 40
"""
    )
    with start_capture(
        cdc_database,
        list(TABLES),
        out_dir=tmp_path / "capture",
        topic_prefix=prefix,
        converter="avro",
        registry_url=schema_registry.url,
        extra_properties={"provide.transaction.metadata": "true"},
    ) as capture:
        producer = Producer(broker.bootstrap, capture, f"{prefix}.transaction")
        capture.wait(8)  # the snapshot's reads of customers and products
        producer.send_all()
        spec = load_spec(spec_file, env={})
        assert [m.table for m in spec.pipeline().members] == ["customers", "products"]
        assert [m.key for m in spec.pipeline().members] == [("id",), ("id",)]  # from each <topic>-key subject
        catalog = load_catalog(spec)
        assert isinstance(catalog, SqlCatalog)
        output = tmp_path / "run.log"
        run = start_krishiv(spec_file, "run", output=output)
        try:
            with InvariantReader(catalog, spec.iceberg.namespace) as reader:
                wait_for(
                    lambda: all_topics_committed(load_spec(spec_file, env={})),
                    "the snapshot committed",
                    output,
                    TIMEOUT_S,
                )
                # one transaction over a table the query reads and one whose topic it makes: it waits for that
                # topic to be read (up to topic_discovery_interval, while batches read the rest), and lands in both
                # tables with one batch
                order = shop._id("orders")
                shop.kept_orders.add(order)
                product = shop._id("products")
                with cdc_database.connect() as conn, conn.transaction():
                    conn.execute("INSERT INTO products VALUES (%s, 'both', 12345.67)", (product,))
                    conn.execute("INSERT INTO orders VALUES (%s, 1, 0)", (order,))
                shop.transactions(30)
                producer.send_all()
                wait_for(
                    lambda: (
                        len(load_spec(spec_file, env={}).pipeline().members) == len(TABLES)
                        and all_topics_committed(load_spec(spec_file, env={}))
                    ),
                    "every table committed",
                    output,
                    TIMEOUT_S,
                )
                reader.check()
        finally:
            stop(run)

    said = output.read_text()
    assert "new topics match its topic_pattern" in said and "Traceback" not in said, said[-3000:]
    print(f"reader: {reader.cuts} cuts, {len(reader.broken)} broken, {len(reader.errors)} errors")
    assert reader.broken == [], reader.broken[:5]
    spec = load_spec(spec_file, env={})
    assert {m.table for m in spec.pipeline().members} == set(TABLES)
    for table in TABLES:
        assert _table_rows(spec, table) == shop.rows(table), table
    together = _first_batch(catalog, "products", lambda r: r["id"] == product)
    assert together is not None and together == _first_batch(catalog, "orders", lambda r: r["id"] == order)
    result = krishiv_cli(spec_file, "verify")
    assert result.returncode == 0, result.stdout + result.stderr
    assert schema_registry.unknown_requests == []


def _first_batch(catalog: SqlCatalog, table: str, holds: Callable[[dict[str, Any]], bool]) -> str | None:
    """The batch id of the first snapshot of ``table`` with a row that ``holds``."""
    loaded = catalog.load_table(f"krishiv.{table}")
    for snapshot in sorted(loaded.snapshots(), key=lambda s: s.sequence_number):
        if any(holds(r) for r in loaded.scan(snapshot_id=snapshot.snapshot_id).to_arrow().to_pylist()):
            return (snapshot.summary or {}).get(SUMMARY_BATCH_ID)
    return None
