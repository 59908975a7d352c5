"""Debezium captures a real PostgreSQL table (private cluster, ``wal_level = logical``) as Kafka Connect would.

Each test creates a table with one row, starts a capture (snapshot: ``op=r``), waits until Debezium streams from
its slot, then inserts, updates non-key columns, deletes (``d`` and a tombstone), adds a column and inserts again.
"""

from __future__ import annotations

import base64
import io
import json
import re
import threading
import uuid
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import fastavro
import pytest

from tests.services.debezium_capture import CapturedRecord, start_capture
from tests.services.private_postgres import LogicalPostgres

TOPIC_PREFIX = "krishiv"
SNAPSHOT_TS = "2024-01-02T03:04:05.123456Z"
#: r (snapshot of id 1), c (id 2), u (id 2), d (id 1), tombstone (id 1), c (id 3, with the added column).
EXPECTED_RECORDS = 6


def _make_table(pg: LogicalPostgres, *, replica_identity_full: bool) -> str:
    table = f"orders_{uuid.uuid4().hex[:8]}"
    with pg.connect() as conn:
        conn.execute(
            f"CREATE TABLE {table} (id int PRIMARY KEY, name text, amount numeric(12,2), updated_at timestamptz)"
        )
        if replica_identity_full:
            conn.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
        conn.execute(f"INSERT INTO {table} VALUES (1, 'alpha', 12.50, %s)", (SNAPSHOT_TS,))
    return table


def _change(pg: LogicalPostgres, table: str) -> None:
    """The DML and DDL after the snapshot, one transaction each."""
    with pg.connect() as conn:
        conn.execute(f"INSERT INTO {table} VALUES (2, 'beta', -3.75, '2024-02-03T04:05:06Z')")
        conn.execute(f"UPDATE {table} SET name = 'beta2', amount = 100.00 WHERE id = 2")
        conn.execute(f"DELETE FROM {table} WHERE id = 1")
        conn.execute(f"ALTER TABLE {table} ADD COLUMN note text")
        conn.execute(f"INSERT INTO {table} VALUES (3, 'gamma', 0.01, '2024-03-04T05:06:07Z', 'hello')")


def _precise(value: str) -> str:
    """``decimal.handling.mode=precise`` in JSON: base64 of the unscaled value, Java's BigInteger.toByteArray()."""
    unscaled = int(Decimal(value).scaleb(2))
    bits = (~unscaled).bit_length() if unscaled < 0 else unscaled.bit_length()
    return base64.b64encode(unscaled.to_bytes(bits // 8 + 1, "big", signed=True)).decode()


def _unscaled(b64: str, scale: int) -> Decimal:
    return Decimal(int.from_bytes(base64.b64decode(b64), "big", signed=True)).scaleb(-scale)


def _assert_lsn_increasing(payloads: list[dict[str, Any]]) -> None:
    lsns = [p["source"]["lsn"] for p in payloads]
    assert all(isinstance(lsn, int) for lsn in lsns), lsns
    assert lsns == sorted(lsns) and len(set(lsns)) == len(lsns), lsns


def _row(id_: int, name: str | None, amount: Any, updated_at: str | None, **more: Any) -> dict[str, Any]:
    return {"id": id_, "name": name, "amount": amount, "updated_at": updated_at, **more}


def test_json_with_schemas(cdc_database: LogicalPostgres, tmp_path: Path) -> None:
    pg = cdc_database
    table = _make_table(pg, replica_identity_full=True)
    with start_capture(pg, table, out_dir=tmp_path / "capture", topic_prefix=TOPIC_PREFIX) as capture:
        assert [r.value_json()["payload"]["op"] for r in capture.wait(1)] == ["r"]
        _change(pg, table)
        records = capture.wait(EXPECTED_RECORDS)
    assert capture.process.returncode == 0  # the child closed the engine and exited when asked

    assert {r.destination for r in records} == {f"{TOPIC_PREFIX}.public.{table}"}
    keys = [r.key_json() for r in records]
    assert [k["payload"] for k in keys] == [{"id": 1}, {"id": 2}, {"id": 2}, {"id": 1}, {"id": 1}, {"id": 3}]
    assert keys[0]["schema"] == {
        "type": "struct",
        "fields": [{"type": "int32", "optional": False, "field": "id"}],
        "optional": False,
        "name": f"{TOPIC_PREFIX}.public.{table}.Key",
    }
    assert records[4].value is None  # the tombstone after the delete
    snapshot, insert, update, delete, _, last = (r.value_json() for r in records)
    payloads = [v["payload"] for v in (snapshot, insert, update, delete, last)]
    assert [p["op"] for p in payloads] == ["r", "c", "u", "d", "c"]
    assert payloads[0]["source"]["snapshot"] in ("true", "last")
    assert {p["source"]["snapshot"] for p in payloads[1:]} == {"false"}
    _assert_lsn_increasing(payloads)

    assert payloads[0]["before"] is None
    assert payloads[0]["after"] == _row(1, "alpha", _precise("12.50"), SNAPSHOT_TS)
    assert payloads[1]["after"] == _row(2, "beta", _precise("-3.75"), "2024-02-03T04:05:06.000000Z")
    assert _unscaled(payloads[1]["after"]["amount"], 2) == Decimal("-3.75")
    # REPLICA IDENTITY FULL: the update and the delete carry the whole old row.
    assert payloads[2]["before"] == payloads[1]["after"]
    assert payloads[2]["after"] == _row(2, "beta2", _precise("100.00"), "2024-02-03T04:05:06.000000Z")
    assert payloads[3]["before"] == payloads[0]["after"]
    assert payloads[3]["after"] is None
    assert payloads[4]["after"] == _row(3, "gamma", _precise("0.01"), "2024-03-04T05:06:07.000000Z", note="hello")

    def after_fields(value: dict[str, Any]) -> dict[str, dict[str, Any]]:
        after = next(f for f in value["schema"]["fields"] if f["field"] == "after")
        return {f["field"]: f for f in after["fields"]}

    amount = after_fields(snapshot)["amount"]
    assert amount["name"] == "org.apache.kafka.connect.data.Decimal"
    assert amount["parameters"] == {"scale": "2", "connect.decimal.precision": "12"}
    assert "note" not in after_fields(delete)
    assert after_fields(last)["note"] == {"type": "string", "optional": True, "field": "note"}


def test_json_without_schemas(cdc_database: LogicalPostgres, tmp_path: Path) -> None:
    """No envelope, default replica identity (no old row on update; only the key on delete), decimals as strings."""
    pg = cdc_database
    table = _make_table(pg, replica_identity_full=False)
    with start_capture(
        pg, table, out_dir=tmp_path / "capture", schemas_enable=False, decimal_handling_mode="string"
    ) as capture:
        capture.wait(1)
        _change(pg, table)
        records = capture.wait(EXPECTED_RECORDS)

    assert [r.key for r in records] == [b'{"id":%d}' % i for i in (1, 2, 2, 1, 1, 3)]
    assert records[4].value is None
    payloads = [r.value_json() for r in records if r.value is not None]
    assert all("schema" not in p and "payload" not in p for p in payloads)
    assert [p["op"] for p in payloads] == ["r", "c", "u", "d", "c"]
    _assert_lsn_increasing(payloads)
    assert payloads[0]["after"] == _row(1, "alpha", "12.50", SNAPSHOT_TS)
    assert payloads[2]["before"] is None
    assert payloads[2]["after"] == _row(2, "beta2", "100.00", "2024-02-03T04:05:06.000000Z")
    assert payloads[3]["before"] == _row(1, None, None, None)
    assert payloads[4]["after"] == _row(3, "gamma", "0.01", "2024-03-04T05:06:07.000000Z", note="hello")


# --- Avro, against a throwaway schema registry -------------------------------------------------------------------


class _Registry(ThreadingHTTPServer):
    """The least of the Confluent Schema Registry REST API the Avro converter needs; it records every call."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _RegistryHandler)
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str, Any]] = []
        self.ids: dict[str, int] = {}  # schema text -> id
        self.subjects: dict[str, list[int]] = {}  # subject -> ids by version

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def schema(self, schema_id: int) -> dict[str, Any]:
        return json.loads(next(text for text, i in self.ids.items() if i == schema_id))


class _RegistryHandler(BaseHTTPRequestHandler):
    server: _Registry

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the calls are recorded instead
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _not_found(self, code: int, message: str) -> None:
        self._answer(404, {"error_code": code, "message": message})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
        registry = self.server
        path = self.path.split("?")[0]
        with registry.lock:
            registry.calls.append(("POST", self.path, body))
            if m := re.fullmatch(r"/subjects/([^/]+)/versions", path):
                schema_id = registry.ids.setdefault(body["schema"], len(registry.ids) + 1)
                versions = registry.subjects.setdefault(m[1], [])
                if schema_id not in versions:
                    versions.append(schema_id)
                return self._answer(200, {"id": schema_id})
            if m := re.fullmatch(r"/subjects/([^/]+)", path):  # lookup: is this schema registered under it?
                versions = registry.subjects.get(m[1])
                if versions is None:
                    return self._not_found(40401, "Subject not found")
                schema_id = registry.ids.get(body["schema"])
                if schema_id not in versions:
                    return self._not_found(40403, "Schema not found")
                version = versions.index(schema_id) + 1
                return self._answer(
                    200, {"subject": m[1], "version": version, "id": schema_id, "schema": body["schema"]}
                )
        self._not_found(404, "no such endpoint")

    def do_GET(self) -> None:
        registry = self.server
        path = self.path.split("?")[0]
        with registry.lock:
            registry.calls.append(("GET", self.path, None))
            if m := re.fullmatch(r"/schemas/ids/(\d+)", path):
                text = next((t for t, i in registry.ids.items() if i == int(m[1])), None)
                return self._answer(200, {"schema": text}) if text else self._not_found(40403, "Schema not found")
            if m := re.fullmatch(r"/subjects/([^/]+)/versions/latest", path):
                versions = registry.subjects.get(m[1])
                if not versions:
                    return self._not_found(40401, "Subject not found")
                text = next(t for t, i in registry.ids.items() if i == versions[-1])
                return self._answer(
                    200, {"subject": m[1], "version": len(versions), "id": versions[-1], "schema": text}
                )
            if path == "/subjects":
                return self._answer(200, sorted(registry.subjects))
        self._not_found(404, "no such endpoint")


@pytest.fixture
def registry() -> Iterator[_Registry]:
    server = _Registry()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _decode_avro(registry: _Registry, data: bytes) -> tuple[int, Any]:
    """Confluent's wire format: magic byte 0, the schema id (4 bytes, big-endian), then the Avro binary datum."""
    assert data[0] == 0, data[:5]
    schema_id = int.from_bytes(data[1:5], "big")
    schema = fastavro.parse_schema(registry.schema(schema_id))
    return schema_id, fastavro.schemaless_reader(io.BytesIO(data[5:]), schema, schema)


@pytest.mark.heavy  # make test-heavy: the same capture feeds tests/krishiv/test_cdc.py's heavy Avro stream
def test_avro_with_schema_registry(cdc_database: LogicalPostgres, tmp_path: Path, registry: _Registry) -> None:
    pg = cdc_database
    table = _make_table(pg, replica_identity_full=True)
    with start_capture(pg, table, out_dir=tmp_path / "capture", converter="avro", registry_url=registry.url) as capture:
        capture.wait(1)
        _change(pg, table)
        records: list[CapturedRecord] = capture.wait(EXPECTED_RECORDS)
    (tmp_path / "registry-calls.json").write_text(json.dumps(registry.calls, indent=1))  # for a failure's post-mortem

    topic = f"{TOPIC_PREFIX}.public.{table}"
    assert {r.destination for r in records} == {topic}
    assert records[4].value is None
    keys = [_decode_avro(registry, r.key)[1] for r in records if r.key is not None]
    assert keys == [{"id": i} for i in (1, 2, 2, 1, 1, 3)]
    decoded = [_decode_avro(registry, r.value) for r in records if r.value is not None]
    payloads = [value for _, value in decoded]
    assert [p["op"] for p in payloads] == ["r", "c", "u", "d", "c"]
    _assert_lsn_increasing(payloads)
    assert payloads[0]["after"] == _row(1, "alpha", Decimal("12.50"), SNAPSHOT_TS)
    assert payloads[2]["before"] == _row(2, "beta", Decimal("-3.75"), "2024-02-03T04:05:06.000000Z")
    assert payloads[2]["after"] == _row(2, "beta2", Decimal("100.00"), "2024-02-03T04:05:06.000000Z")
    assert payloads[3]["after"] is None
    assert payloads[4]["after"] == _row(3, "gamma", Decimal("0.01"), "2024-03-04T05:06:07.000000Z", note="hello")

    value_ids = [schema_id for schema_id, _ in decoded]
    assert len(set(value_ids[:4])) == 1 and value_ids[4] != value_ids[0]  # the added column: a new value schema
    assert set(registry.subjects) == {f"{topic}-key", f"{topic}-value"}
    assert registry.subjects[f"{topic}-value"] == sorted(set(value_ids))
    before = next(f for f in registry.schema(value_ids[0])["fields"] if f["name"] == "before")
    amount = next(f for f in before["type"][1]["fields"] if f["name"] == "amount")
    assert amount["type"][1] | {"connect.parameters": None} == {
        "type": "bytes",
        "logicalType": "decimal",
        "precision": 12,
        "scale": 2,
        "connect.version": 1,
        "connect.name": "org.apache.kafka.connect.data.Decimal",
        "connect.parameters": None,
    }
    # What the converter asked of the registry: one registration per new schema, cached afterwards.
    assert [(method, path.split("?")[0]) for method, path, _ in registry.calls] == [
        ("POST", f"/subjects/{topic}-key/versions"),
        ("POST", f"/subjects/{topic}-value/versions"),
        ("POST", f"/subjects/{topic}-value/versions"),
    ]


def test_arrays_json_jsonb_and_a_composite_type(cdc_database: LogicalPostgres, tmp_path: Path) -> None:
    """What the connector emits for PostgreSQL arrays (one and two dimensions, empty, null, null elements),
    ``json``/``jsonb`` and a composite type (with ``include.unknown.datatypes``): docs/formats.md's table."""
    pg = cdc_database
    with pg.connect() as conn:
        conn.execute("CREATE TYPE point2 AS (x numeric(6,2), label text)")
        conn.execute(
            "CREATE TABLE t (id int PRIMARY KEY, ints int[], nums numeric(10,3)[], grid int[][], j json, jb jsonb, "
            "pt point2)"
        )
        conn.execute(
            "INSERT INTO t VALUES (1, '{1,NULL,3}', '{1.5,NULL,-2.125}', '{{1,2},{3,4}}', "
            """'{"b": 1.10, "a": [1, 2.50], "b": 2}', '{"b": 1.10, "a": [1, 2.50], "n": {"y": 1e3}}', ROW(1.25, 'p'))"""
        )
    extra = {"include.unknown.datatypes": "true"}
    with start_capture(pg, "t", out_dir=tmp_path / "capture", extra_properties=extra) as capture:
        capture.wait(1)
        with pg.connect() as conn:
            conn.execute("""INSERT INTO t (id, ints, nums, jb) VALUES (2, '{}', NULL, 'null')""")
        records = capture.wait(2)
    first, second = (r.value_json() for r in records)
    after = next(f for f in first["schema"]["fields"] if f["field"] == "after")
    columns = {f["field"]: f for f in after["fields"]}
    assert columns["ints"] == {
        "type": "array",
        "items": {"type": "int32", "optional": True},
        "optional": True,
        "field": "ints",
    }
    assert columns["nums"]["items"]["name"] == "org.apache.kafka.connect.data.Decimal"
    assert columns["nums"]["items"]["parameters"] == {"scale": "3", "connect.decimal.precision": "10"}
    assert columns["grid"]["items"] == {"type": "int32", "optional": True}  # the same schema as a 1-D array
    for name in ("j", "jb"):
        assert columns[name]["type"] == "string" and columns[name]["name"] == "io.debezium.data.Json"
    assert columns["pt"] == {"type": "bytes", "optional": True, "field": "pt"}

    row = first["payload"]["after"]
    assert row["ints"] == [1, None, 3]
    assert [None if v is None else _unscaled(v, 3) for v in row["nums"]] == [Decimal("1.5"), None, Decimal("-2.125")]
    assert row["grid"] == [None, None]  # a 2-D array: its values are lost
    assert row["j"] == '{"b": 1.10, "a": [1, 2.50], "b": 2}'  # json: the text as written
    assert row["jb"] == '{"a": [1, 2.50], "b": 1.10, "n": {"y": 1000}}'  # jsonb: PostgreSQL's normalised text
    assert base64.b64decode(row["pt"]) == b"(1.25,p)"  # a composite: PostgreSQL's text of it
    row = second["payload"]["after"]
    assert (row["ints"], row["nums"], row["grid"], row["j"], row["jb"], row["pt"]) == (
        [],
        None,
        None,
        None,
        "null",
        None,
    )


def test_transaction_metadata_over_several_tables(cdc_database: LogicalPostgres, tmp_path: Path) -> None:
    """With ``provide.transaction.metadata``, one capture of two tables (a topic each) also writes each source
    transaction's BEGIN and END to ``<prefix>.transaction`` (the END counting its events per table), and each data
    event names its transaction and its place in it, overall and within its table: what a pipeline needs to end its
    batches only where a transaction ends.

    Captured, not assumed: Debezium's PostgreSQL connector writes a transaction's id as ``<xid>:<lsn>``
    (DBZ-5329, DBZ-7454) with the LSN of the record itself, so the BEGIN, each event and the END of one transaction
    carry different ids: only the xid before the colon (``source.txId`` on an event) names the transaction.
    """
    pg = cdc_database
    suffix = uuid.uuid4().hex[:8]
    orders, lines = f"orders_{suffix}", f"order_lines_{suffix}"
    with pg.connect() as conn:
        conn.execute(f"CREATE TABLE {orders} (id int PRIMARY KEY, total numeric(12,2) NOT NULL)")
        conn.execute(
            f"CREATE TABLE {lines} (order_id int REFERENCES {orders}(id), line int, amount numeric(12,2) NOT NULL,"
            " PRIMARY KEY (order_id, line))"
        )
        conn.execute(f"INSERT INTO {orders} VALUES (1, 5.00)")  # the snapshot's: no transaction
    extra = {"provide.transaction.metadata": "true"}
    with start_capture(pg, [orders, lines], out_dir=tmp_path / "capture", extra_properties=extra) as capture:
        capture.wait(1)
        with pg.connect() as conn, conn.transaction():  # one transaction, both tables
            conn.execute(f"INSERT INTO {orders} VALUES (2, 7.50)")
            conn.execute(f"INSERT INTO {lines} VALUES (2, 1, 5.00), (2, 2, 2.50)")
        with pg.connect() as conn:  # and one of one table
            conn.execute(f"UPDATE {orders} SET total = 6.00 WHERE id = 1")
        # r, BEGIN, c, c, c, END, BEGIN, u, END
        records = capture.wait(9)

    transaction_topic = f"{TOPIC_PREFIX}.transaction"
    payloads = [(r.destination, r.value_json()["payload"]) for r in records]
    snapshot = payloads[0]
    assert snapshot[0] == f"{TOPIC_PREFIX}.public.{orders}" and snapshot[1]["op"] == "r"
    assert snapshot[1]["transaction"] is None

    marks = [(i, p) for i, (topic, p) in enumerate(payloads) if topic == transaction_topic]
    assert [(i, p["status"]) for i, p in marks] == [(1, "BEGIN"), (5, "END"), (6, "BEGIN"), (8, "END")]
    begin, first, second = marks[0][1], marks[1][1], marks[3][1]
    assert begin["event_count"] is None and begin["data_collections"] is None
    assert first["event_count"] == 3 and sorted(
        (c["data_collection"], c["event_count"]) for c in first["data_collections"]
    ) == [(f"public.{lines}", 2), (f"public.{orders}", 1)]
    assert second["event_count"] == 1

    def xid(transaction_id: str) -> str:
        return transaction_id.split(":")[0]

    assert xid(begin["id"]) == xid(first["id"]) != xid(second["id"]) and begin["id"] != first["id"]
    assert json.loads(records[5].key or b"{}")["payload"] == {"id": first["id"]}

    data = [(topic, p) for topic, p in payloads[1:] if topic != transaction_topic]
    assert [(topic.rsplit(".", 1)[1], p["op"]) for topic, p in data] == [
        (orders, "c"),
        (lines, "c"),
        (lines, "c"),
        (orders, "u"),
    ]
    assert [p["transaction"]["id"] for _, p in data] == [f"{p['source']['txId']}:{p['source']['lsn']}" for _, p in data]
    assert [
        (xid(p["transaction"]["id"]), p["transaction"]["total_order"], p["transaction"]["data_collection_order"])
        for _, p in data
    ] == [(xid(first["id"]), 1, 1), (xid(first["id"]), 2, 1), (xid(first["id"]), 3, 2), (xid(second["id"]), 1, 1)]
