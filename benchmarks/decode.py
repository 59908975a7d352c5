"""How fast one core decodes each format into a pipeline's typed columns: JSON beside Avro, Protobuf, JSON Schema
and Debezium change events.

The decoder is the one step of the source's tasks that differs by format (reading Kafka, Spark and the staging are
the same), so records per second of :func:`spark_jobs.registry_decoder.decoder_for` on one core say what a format
costs. The records are the demo's orders (an id, a customer, a decimal(12,2) amount, an event time), encoded by
confluent-kafka's serializers against an in-process registry (``mock://``: after the first record of a schema the
client's cache answers, as it does against a real registry); Debezium's as its JSON converter writes them, with
the embedded schema. Every decoded batch is checked against the records' values.

    .venv/bin/python -m benchmarks.decode [--records 200000] [--out benchmarks/results/decode.json]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.workload import NESTED_FIELDS, nested_order
from krishiv_core.spec_types import EventField, FieldType
from spark_jobs.record_decoder import Decoding
from spark_jobs.registry_decoder import decoder_for, registry_client

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "decode.json"
BATCH = 10_000  # records per decode call, about what a task hands Spark at a time
FIELDS = (
    EventField("order_id", FieldType("string")),
    EventField("customer_id", FieldType("string")),
    EventField("amount", FieldType("decimal", 12, 2)),
    EventField("event_time", FieldType("timestamp")),
)
AVRO = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "customer_id", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "customer_id": {"type": "string"},
        "amount": {"type": "string"},
        "event_time": {"type": "string", "format": "date-time"},
    },
    "required": ["order_id", "customer_id", "amount", "event_time"],
}


@dataclass(frozen=True)
class Order:
    order_id: str
    customer_id: str
    amount: Decimal
    event_time: datetime


def orders(n: int) -> list[Order]:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        Order(f"o-{i}", f"c-{i % 200:03d}", Decimal(i % 100_000).scaleb(-2), start + timedelta(milliseconds=i))
        for i in range(n)
    ]


@dataclass(frozen=True)
class Case:
    name: str
    decoding: Decoding
    values: list[bytes]
    keys: list[bytes | None]


def _decoding(registry: dict[str, str] | None, **kw: Any) -> Decoding:
    fields = FIELDS + tuple(kw.pop("extra", ()))
    return Decoding(fields, frozenset(f.name for f in FIELDS), tuple(f.name for f in fields), registry=registry, **kw)


def _ctx(topic: str) -> Any:
    from confluent_kafka.serialization import MessageField, SerializationContext

    return SerializationContext(topic, MessageField.VALUE)


def _json(rows: list[Order]) -> Case:
    values = [
        json.dumps(
            {
                "order_id": o.order_id,
                "customer_id": o.customer_id,
                "amount": str(o.amount),
                "event_time": o.event_time.isoformat(),
            }
        ).encode()
        for o in rows
    ]
    return Case("json", _decoding(None), values, [None] * len(rows))


def _nested(o: Order) -> dict[str, Any]:
    return nested_order(o.order_id, o.customer_id, o.amount, o.event_time)


def _flattened(nested: dict[str, Any]) -> dict[str, Any]:
    """The nested order's 14 values as top-level fields: what the nested case costs beside a flat record holding the
    same values."""
    flat = {"order_id": nested["order_id"], "customer_id": nested["customer"]["id"]}
    flat["city"] = nested["customer"]["address"]["city"]
    flat["amount"] = nested["amount"]
    for i, line in enumerate(nested["lines"]):
        flat |= {f"line{i}_{k}": v for k, v in line.items()}
    flat |= {f"attr_{k}": v for k, v in nested["attrs"].items()}
    flat["event_time"] = nested["meta"]["event_time"]
    return flat


def _json_nested(rows: list[Order]) -> tuple[Case, Case]:
    """The nested orders, and the same values as a flat record."""
    nested = [_nested(o) for o in rows]
    decoding = Decoding(NESTED_FIELDS, frozenset(f.name for f in NESTED_FIELDS), tuple(f.name for f in NESTED_FIELDS))
    flat_fields = tuple(EventField(name, _flat_type(name)) for name in _flattened(nested[0]))
    flat_decoding = Decoding(flat_fields, frozenset(f.name for f in flat_fields), tuple(f.name for f in flat_fields))
    return (
        Case("json_nested", decoding, [json.dumps(n).encode() for n in nested], [None] * len(rows)),
        Case(
            "json_flat_same_values",
            flat_decoding,
            [json.dumps(_flattened(n)).encode() for n in nested],
            [None] * len(rows),
        ),
    )


def _flat_type(name: str) -> FieldType:
    if name.startswith("attr_"):
        return FieldType("decimal", 20, 6)
    line = {"sku": FieldType("string"), "qty": FieldType("long"), "price": FieldType("decimal", 12, 2)}
    if name.startswith("line"):
        return line[name.split("_", 1)[1]]
    return {f.name: f.type for f in FIELDS}.get(name, FieldType("string"))


def _avro(rows: list[Order], registry: dict[str, str]) -> Case:
    from confluent_kafka.schema_registry.avro import AvroSerializer

    serializer = AvroSerializer(registry_client(registry), json.dumps(AVRO))
    values = [serializer(o.__dict__, _ctx("orders")) for o in rows]
    return Case("avro", _decoding(registry, value_format="avro"), values, [None] * len(rows))


def _json_schema(rows: list[Order], registry: dict[str, str]) -> Case:
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    serializer = JSONSerializer(json.dumps(JSON_SCHEMA), registry_client(registry))
    docs = [{**o.__dict__, "amount": str(o.amount), "event_time": o.event_time.isoformat()} for o in rows]
    values = [serializer(d, _ctx("orders-js")) for d in docs]
    return Case("json_schema", _decoding(registry, value_format="json_schema"), values, [None] * len(rows))


def _protobuf(rows: list[Order], registry: dict[str, str]) -> Case:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="bench/order.proto", package="bench", syntax="proto3")
    proto.dependency.append("google/protobuf/timestamp.proto")
    message = proto.message_type.add(name="Order")
    for number, (name, kind) in enumerate(
        [("order_id", field.TYPE_STRING), ("customer_id", field.TYPE_STRING), ("amount_cents", field.TYPE_INT64)], 1
    ):
        message.field.add(name=name, number=number, type=kind, label=field.LABEL_OPTIONAL)
    message.field.add(
        name="event_time",
        number=4,
        type=field.TYPE_MESSAGE,
        type_name=".google.protobuf.Timestamp",
        label=field.LABEL_OPTIONAL,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(proto)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Order"))
    serializer = ProtobufSerializer(cls, registry_client(registry), {"use.deprecated.format": False})
    values = []
    for o in rows:
        m = cls(order_id=o.order_id, customer_id=o.customer_id, amount_cents=int(o.amount * 100))
        m.event_time.FromDatetime(o.event_time)
        values.append(serializer(m, _ctx("orders-pb")))
    fields = (
        *FIELDS[:2],
        EventField("amount_cents", FieldType("long")),
        EventField("event_time", FieldType("timestamp")),
    )
    decoding = Decoding(fields, frozenset(), tuple(f.name for f in fields), registry=registry, value_format="protobuf")
    return Case("protobuf", decoding, values, [None] * len(rows))


def _debezium(rows: list[Order]) -> Case:
    columns = [
        {"type": "string", "optional": False, "field": "order_id"},
        {"type": "string", "optional": False, "field": "customer_id"},
        {
            "type": "bytes",
            "optional": False,
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "2"},
            "field": "amount",
        },
        {"type": "int64", "optional": False, "name": "io.debezium.time.MicroTimestamp", "field": "event_time"},
    ]
    row = {"type": "struct", "fields": columns, "optional": True, "name": "shop.public.orders.Value"}
    schema = {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"}]}
    values, keys = [], []
    for i, o in enumerate(rows):
        cents = int(o.amount * 100)
        after = {
            "order_id": o.order_id,
            "customer_id": o.customer_id,
            "amount": base64.b64encode(cents.to_bytes(4, "big", signed=True)).decode(),
            "event_time": int(o.event_time.timestamp() * 1_000_000),
        }
        payload = {"op": "c", "before": None, "after": after, "source": {"lsn": 1_000 + i, "ts_ms": 0}}
        values.append(json.dumps({"schema": schema, "payload": payload}).encode())
        keys.append(json.dumps({"order_id": o.order_id}).encode())
    decoding = _decoding(
        None,
        extra=[EventField("_cdc_lsn", FieldType("long"), False)],
        tombstone_key=("order_id",),
        key_format="json",
        envelope="debezium",
        cdc_version="_cdc_lsn",
    )
    return Case("debezium_json", decoding, values, keys)


def measure(
    case: Case,
    expected: list[Order],
    amount: Callable[[dict[str, Any]], Decimal],
    event_time: Callable[[dict[str, Any]], datetime] = lambda r: r["event_time"],
) -> float:
    """Records per second of the case's decoder on this core; every row checked against the orders."""
    decoder = decoder_for(case.decoding)
    n = len(case.values)
    decoder.decode(case.keys[:BATCH], case.values[:BATCH], "orders", 0, list(range(min(n, BATCH))), [0] * min(n, BATCH))
    began = time.perf_counter()  # after a first batch: the registry's schema cached, Arrow's kernels loaded
    batches = [
        decoder.decode(
            case.keys[i : i + BATCH],
            case.values[i : i + BATCH],
            "orders",
            0,
            list(range(i, min(n, i + BATCH))),
            [0] * min(BATCH, n - i),
        )
        for i in range(0, n, BATCH)
    ]
    seconds = time.perf_counter() - began
    rows = [r for b in batches for r in b.to_pylist()]
    bad = [
        r
        for r, o in zip(rows, expected, strict=True)
        if r["reason"] is not None
        or r["order_id"] != o.order_id
        or amount(r) != o.amount
        or event_time(r) != o.event_time
    ]
    if bad:
        raise SystemExit(f"{case.name}: {len(bad)} rows decoded wrong, e.g. {bad[0]}")
    return n / seconds


CASES = ("json", "json_nested", "json_flat_same_values", "avro", "json_schema", "protobuf", "debezium_json")


def run(records: int, only: Sequence[str] = CASES) -> dict[str, Any]:
    from benchmarks.runner import checkout

    rows = orders(records)
    registry = {"url": f"mock://bench-{uuid.uuid4().hex}"}
    builders: dict[str, Callable[[], list[Case]]] = {
        "json": lambda: [_json(rows)],
        "json_nested": lambda: list(_json_nested(rows)),
        "avro": lambda: [_avro(rows, registry)],
        "json_schema": lambda: [_json_schema(rows, registry)],
        "protobuf": lambda: [_protobuf(rows, registry)],
        "debezium_json": lambda: [_debezium(rows)],
    }
    wanted = set(only) | ({"json_nested"} if "json_flat_same_values" in only else set())
    cases = [c for name, build in builders.items() if name in wanted for c in build() if c.name in only]
    results = {}
    for case in cases:
        if case.name == "json_nested":
            speed = measure(case, rows, lambda r: r["lines"][0]["price"], lambda r: r["meta"]["event_time"])
        elif case.name == "protobuf":
            speed = measure(case, rows, lambda r: Decimal(r["amount_cents"]).scaleb(-2))
        else:
            speed = measure(case, rows, lambda r: r["amount"])
        results[case.name] = round(speed)
    commit = checkout()
    doc: dict[str, Any] = {
        "records": records,
        "batch": BATCH,
        "python": sys.version.split()[0],
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit["commit"],
        "dirty": commit["dirty"],
        "load_average": [round(v, 2) for v in os.getloadavg()],  # other work on the machine at the end
        "records_per_s_one_core": results,
    }
    if "json" in results:
        doc["relative_to_json"] = {name: round(v / results["json"], 3) for name, v in results.items()}
    if {"json_nested", "json_flat_same_values"} <= set(results):
        # the nested orders beside a flat record of the same 14 values (the target: >= 0.5)
        doc["nested_relative_to_flat_same_values"] = round(results["json_nested"] / results["json_flat_same_values"], 3)
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.decode", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument(
        "--cases",
        default=",".join(CASES),
        help=f"comma-separated cases to time (default all: {','.join(CASES)}); write a subset to its own --out",
    )
    args = parser.parse_args(argv)
    only = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(only) - set(CASES))
    if unknown or not only:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    doc = run(args.records, only)
    console = Console()
    table = Table(title=f"decode, one core, {args.records:,} orders")
    for column in ("format", "records/s", "of JSON"):
        table.add_column(column, justify="right" if column != "format" else "left")
    for name, value in doc["records_per_s_one_core"].items():
        of_json = doc.get("relative_to_json", {}).get(name)
        table.add_row(name, f"{value:,}", "" if of_json is None else f"{of_json:.2f}")
    console.print(table)
    if "nested_relative_to_flat_same_values" in doc:
        console.print(f"nested / flat of the same values: {doc['nested_relative_to_flat_same_values']}")
    console.print(f"load average at the end: {', '.join(map(str, doc['load_average']))}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    console.print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
