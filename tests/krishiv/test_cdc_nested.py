"""Debezium change data capture of a PostgreSQL table with array, jsonb and json columns into nested columns.

One private PostgreSQL table (``tests.services.private_postgres``) with ``text[]``, ``numeric(12,3)[]``,
``bigint[]``, ``timestamptz[]``, ``jsonb`` and ``json`` columns is captured twice at once by Debezium's embedded
engine (``tests.services.debezium_capture``): through Kafka Connect's JSON converter (with schemas; the spec
declares the fields) and through Confluent's Avro converter (the fields come from the registry). Seeded DML writes
a snapshot, inserts, updates and deletes, with null and empty arrays, null array elements, edge decimals and
bigints, and nested JSON with decimals, unicode and escapes. Each capture's records go to their own topic; one
``krishiv run --once`` stages both pipelines, ``krishiv commit`` commits them, and each table must equal ``SELECT``
of the source table mapped by the documented rule (docs/formats.md, "PostgreSQL arrays, json and composite
columns"; docs/spec.md, "Nested fields": a ``json`` column holds the canonical text), the oracle below being
written from that rule, not from Krishiv's code.
"""

from __future__ import annotations

import json
import random
import zlib
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from chaos.workspace import SETTINGS_TEMPLATE
from krishiv.broker import LocalBroker
from krishiv.produce import OrderEvent, ensure_topic, produce
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.spec import load_spec
from krishiv_core.spec_types import EventField, FieldType
from tests.services.debezium_capture import CapturedRecord, start_capture
from tests.services.private_postgres import LogicalPostgres
from tests.services.schema_registry import SchemaRegistryServer
from tests.spark_jobs.pipeline_helpers import krishiv_cli

PARTITIONS = 2
COLUMNS = ("id", "tags", "amounts", "counts", "moments", "doc", "raw")
DDL = (
    "CREATE TABLE readings (id int PRIMARY KEY, tags text[], amounts numeric(12,3)[], counts bigint[], "
    "moments timestamptz[], doc jsonb, raw json)"
)
INSERT = (
    "INSERT INTO readings (id, tags, amounts, counts, moments, doc, raw) "
    "VALUES (%s, %s::text[], %s::numeric(12,3)[], %s::bigint[], %s::timestamptz[], %s::jsonb, %s::json)"
)

SPEC = (
    SETTINGS_TEMPLATE
    + """
[schema_registry]
url = "{registry}"

[[pipelines]]
name = "readings_json"
kind = "upsert"
topic = "{topic}-json"
table = "readings_json"
envelope = "debezium"
key = ["id"]
trigger_interval = "500ms"

[pipelines.fields]
id = "int"
tags = {{ type = "list", element = {{ type = "string", required = false }}, required = false }}
amounts = {{ type = "list", element = {{ type = "decimal(12,3)", required = false }}, required = false }}
counts = {{ type = "list", element = {{ type = "long", required = false }}, required = false }}
moments = {{ type = "list", element = {{ type = "timestamp", required = false }}, required = false }}
doc = {{ type = "json", required = false }}
raw = {{ type = "json", required = false }}

[[pipelines]]
name = "readings_avro"
kind = "upsert"
topic = "{topic}-avro"
table = "readings_avro"
envelope = "debezium"
key = ["id"]
format = "avro"
subject = "krishiv.public.readings-value"
trigger_interval = "500ms"
"""
)


def _optional_list(element: FieldType) -> FieldType:
    return FieldType("list", element=EventField("element", element, False))


#: What Debezium's Avro schema of the table gives, by docs/formats.md's mapping.
AVRO_FIELDS = [
    EventField("id", FieldType("int")),
    EventField("tags", _optional_list(FieldType("string")), False),
    EventField("amounts", _optional_list(FieldType("decimal", 12, 3)), False),
    EventField("counts", _optional_list(FieldType("long")), False),
    EventField("moments", _optional_list(FieldType("timestamp")), False),
    EventField("doc", FieldType("json"), False),
    EventField("raw", FieldType("json"), False),
]

# --- the source's values: generated edge values --------------------------------------------------------------------

_TEXTS = ["", "cold", "late", "é ü 漢", 'a "quoted" one', "back\\slash", "comma, {brace}", "NULL", "tab\there"]
_AMOUNTS = ["999999999.999", "-999999999.999", "0.000", "0.001", "-0.001", "123.450", "1.5"]
_COUNTS = [9223372036854775807, -9223372036854775808, 0, -1, 2**31]
#: JSON number texts as written, each one jsonb keeps as it is (jsonb prints a number as PostgreSQL's numeric does:
#: ``1e3`` would come back ``1000``, so exponents are left out of what the oracle compares).
_NUMBERS = ["1.10", "-0.000", "0", "2.50", "123456789012345678901234567890.123456789", "-7", "0.0000001"]


def _json_value(r: random.Random, depth: int = 0) -> str:
    """A JSON text (as a producer would write it: spaces after separators, keys in any order)."""
    roll = r.random()
    if depth < 3 and roll < 0.35:
        keys = r.sample(["b", "a", "é", "Z", "k-1", 'quote"d', "n"], r.randrange(0, 4))
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_json_value(r, depth + 1)}" for k in keys) + "}"
    if depth < 3 and roll < 0.55:
        return "[" + ", ".join(_json_value(r, depth + 1) for _ in range(r.randrange(0, 4))) + "]"
    if roll < 0.8:
        return r.choice(_NUMBERS)
    if roll < 0.9:
        return json.dumps(r.choice(_TEXTS), ensure_ascii=r.random() < 0.5)
    return r.choice(["true", "false", "null"])


def _maybe_list(r: random.Random, make: Any) -> list[Any] | None:
    roll = r.random()
    if roll < 0.15:
        return None
    if roll < 0.3:
        return []
    return [None if r.random() < 0.15 else make() for _ in range(r.randrange(1, 5))]


class Source:
    """The captured table and the seeded DML on it, each statement its own transaction."""

    def __init__(self, pg: LogicalPostgres, seed: int) -> None:
        self.pg = pg
        self.random = random.Random(seed)
        self.next_id = 1
        #: Records Debezium emits for the DML so far: a row read or written 1, a delete 2 (with its tombstone).
        self.records = 0

    def _values(self) -> tuple[Any, ...]:
        r = self.random
        moment = datetime(2026, 1, 1, tzinfo=UTC)
        doc = None if r.random() < 0.15 else "{" + f'"n": {_json_value(r)}, "m": {{"v": {r.choice(_NUMBERS)}}}' + "}"
        # json keeps its text: whitespace, key order and a key given twice (the last counts)
        raw = None if r.random() < 0.2 else r.choice(["[]", "{}", _json_value(r), '{"b": 1, "a": 2.50, "b": 3.0}'])
        return (
            _maybe_list(r, lambda: r.choice(_TEXTS)),
            _maybe_list(r, lambda: Decimal(r.choice(_AMOUNTS))),
            _maybe_list(r, lambda: r.choice(_COUNTS)),
            _maybe_list(r, lambda: moment + timedelta(microseconds=r.randrange(10**14))),
            doc,
            raw,
        )

    def insert(self, rows: int) -> None:
        with self.pg.connect() as conn:
            for _ in range(rows):
                conn.execute(INSERT, (self.next_id, *self._values()))
                self.next_id += 1
                self.records += 1

    def churn(self, statements: int) -> None:
        with self.pg.connect() as conn:
            for _ in range(statements):
                ids = [row[0] for row in conn.execute("SELECT id FROM readings ORDER BY id")]
                roll = self.random.random()
                victim = self.random.choice(ids)
                if roll < 0.5:
                    tags, amounts, counts, _, doc, _ = self._values()
                    conn.execute(
                        "UPDATE readings SET tags = %s::text[], amounts = %s::numeric(12,3)[], counts = %s::bigint[], "
                        "doc = %s::jsonb WHERE id = %s",
                        (tags, amounts, counts, doc, victim),
                    )
                    self.records += 1
                elif roll < 0.7:
                    conn.execute("DELETE FROM readings WHERE id = %s", (victim,))
                    self.records += 2
                else:
                    self.insert(1)

    def rows(self) -> dict[int, dict[str, Any]]:
        """The table now, by the documented mapping: arrays as lists (null elements kept), a json/jsonb column as
        the canonical text of PostgreSQL's own text of it, times in UTC."""
        with self.pg.connect() as conn:
            result = conn.execute("SELECT id, tags, amounts, counts, moments, doc::text, raw::text FROM readings")
            rows = {}
            for id_, tags, amounts, counts, moments, doc, raw in result:
                utc = None if moments is None else [None if m is None else m.astimezone(UTC) for m in moments]
                rows[id_] = dict(
                    zip(COLUMNS, (id_, tags, amounts, counts, utc, _canonical(doc), _canonical(raw)), strict=True)
                )
            return rows


class _Written(str):
    """A JSON number's text as written."""


def _canonical(text: str | None) -> str | None:
    """docs/spec.md's canonical JSON text: no whitespace outside strings, keys sorted by code point (a key given twice
    keeps the last), strings escaped only for ``"``, ``\\`` and control characters, numbers as written."""
    if text is None:
        return None

    def out(v: Any) -> str:
        if isinstance(v, _Written):
            return str.__str__(v)
        if isinstance(v, str):
            return json.dumps(v, ensure_ascii=False)
        if isinstance(v, dict):
            return "{" + ",".join(f"{out(k)}:{out(v[k])}" for k in sorted(v)) + "}"
        if isinstance(v, list):
            return "[" + ",".join(out(x) for x in v) + "]"
        return {None: "null", True: "true", False: "false"}[v]

    return out(json.loads(text, parse_float=_Written, parse_int=_Written))


def _to_broker(bootstrap: str, topic: str, records: list[CapturedRecord]) -> None:
    """The captured records in order, each key's to one partition (as Kafka Connect's partitioner would)."""
    events = [
        OrderEvent(seq, zlib.crc32(r.key or b"") % PARTITIONS, r.key or b"", r.value, "valid")  # type: ignore[arg-type]
        for seq, r in enumerate(records)
    ]
    ensure_topic(bootstrap, topic, PARTITIONS)
    produce(bootstrap, topic, events)


def _table_rows(spec: Any, table: str) -> dict[int, dict[str, Any]]:
    rows = load_catalog(spec).load_table(qualified(spec, table)).scan().to_arrow().to_pylist()
    assert len({r["id"] for r in rows}) == len(rows), "one row per key"
    return {r["id"]: {c: r[c] for c in COLUMNS} for r in rows}


@pytest.mark.heavy  # a minute or more of its own; make test-heavy (docs/testing.md)
def test_a_debezium_stream_with_array_and_jsonb_columns_lands_in_nested_columns_in_json_and_avro(
    cdc_database: LogicalPostgres,
    broker: LocalBroker,
    topic: str,
    tmp_path: Path,
    schema_registry: SchemaRegistryServer,
) -> None:
    source = Source(cdc_database, seed=36)
    with cdc_database.connect() as conn:
        conn.execute(DDL)
    source.insert(6)  # read by the snapshot (op r)
    with (
        start_capture(cdc_database, "public.readings", out_dir=tmp_path / "json") as json_capture,
        start_capture(
            cdc_database,
            "public.readings",
            out_dir=tmp_path / "avro",
            converter="avro",
            registry_url=schema_registry.url,
        ) as avro_capture,
    ):
        source.churn(30)
        json_records = json_capture.wait(source.records)
        avro_records = avro_capture.wait(source.records)
    assert sum(r.value is None for r in json_records) > 0, "the DML deletes rows"
    _to_broker(broker.bootstrap, f"{topic}-json", json_records)
    _to_broker(broker.bootstrap, f"{topic}-avro", avro_records)

    spec_file = tmp_path / "krishiv.toml"
    settings = {"bootstrap": broker.bootstrap, "partitions": PARTITIONS, "catalog_uri": "sqlite:///catalog.db"}
    spec_file.write_text(SPEC.format(**settings, warehouse="warehouse", registry=schema_registry.url, topic=topic))
    spec = load_spec(spec_file, env={})
    avro = next(p for p in spec.pipelines if p.name == "readings_avro")
    assert [f for f in avro.fields if not f.name.startswith("_cdc_")] == AVRO_FIELDS
    for command in (("run", "--once"), ("commit",), ("verify",)):
        result = krishiv_cli(spec_file, *command)
        assert result.returncode == 0, f"krishiv {' '.join(command)}:\n{result.stdout}{result.stderr}"

    expected = source.rows()
    assert any(r["tags"] == [] for r in expected.values()) and any(r["tags"] is None for r in expected.values())
    assert _table_rows(spec, "readings_json") == expected
    assert _table_rows(spec, "readings_avro") == expected


def test_init_types_a_debezium_json_sample_by_the_envelopes_schema(tmp_path: Path) -> None:
    """With ``schemas.enable``, ``krishiv init`` takes each column's type from Debezium's Connect schema, not from
    its encoding (a decimal's base64, a date's days, jsonb's text); a column no type holds is left out, saying why."""
    from krishiv.init_spec import analyse, spec_text

    decimal = {"name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "3"}, "type": "bytes"}
    decimal["parameters"]["connect.decimal.precision"] = "12"
    variable = {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "optional": True, "fields": []}
    columns = [
        {"type": "int32", "optional": False, "field": "id"},
        {"type": "array", "items": {**decimal, "optional": True}, "optional": True, "field": "amounts"},
        {"type": "array", "items": {"type": "int32", "name": "io.debezium.time.Date", "optional": True}, "field": "d"},
        {"type": "string", "optional": True, "name": "io.debezium.data.Json", "field": "doc"},
        {"type": "array", "items": variable, "optional": True, "field": "anynums"},
    ]
    row = {"type": "struct", "fields": columns, "optional": True, "field": "after"}
    schema = {"type": "struct", "fields": [{**row, "field": "before"}, row], "name": "krishiv.public.t.Envelope"}
    after = {"id": 1, "amounts": ["Bdw=", None], "d": [19724], "doc": '{"a": 1.10}', "anynums": None}
    payload = {"op": "c", "before": None, "after": after, "source": {"lsn": 5}}
    sample = analyse([json.dumps({"schema": schema, "payload": payload}).encode()], [b'{"id": 1}'])
    text = spec_text(sample, "krishiv.public.t", "upsert", "127.0.0.1:9092", ["id"])
    assert (
        "# anynums: left out: Debezium's schema says it is an unbounded numeric (Debezium's VariableScaleDecimal: a "
        "PostgreSQL numeric without precision and scale, its scale varying by value; declare it as a decimal(p,s) "
        "that holds its values), which Krishiv's tables do not hold"
    ) in text.splitlines()
    (tmp_path / "krishiv.toml").write_text(text)
    fields = [f for f in load_spec(tmp_path / "krishiv.toml", env={}).pipeline().fields if not f.name.startswith("_")]
    assert fields == [
        EventField("id", FieldType("int")),
        EventField("amounts", _optional_list(FieldType("decimal", 12, 3)), False),
        EventField("d", FieldType("list", element=EventField("element", FieldType("date"), False))),
        EventField("doc", FieldType("json"), False),
    ]
