"""Avro and Protobuf topics through the broker, Spark and the catalog, with the fields taken from the registry.

The registry is ``tests.services.schema_registry``: every schema Krishiv reads travels over the client's real HTTP
path. The producers are confluent-kafka's serializers. The oracle is the records as produced: a record a
serializer wrote is a row with the values it was given (the first schema's fields; from the batch that first
carries a newer version, its new fields too), any other bytes a reject with the reason docs/formats.md gives.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

from chaos.workspace import SETTINGS_TEMPLATE
from krishiv.operations import commit_pipelines, run_pipelines
from krishiv.produce import OrderEvent, ensure_topic, produce
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.errors import KrishivError
from krishiv_core.spec import KrishivSpec, load_spec
from tests.services.processes import stop
from tests.services.schema_registry import SchemaRegistryServer
from tests.spark_jobs.pipeline_helpers import all_committed, krishiv_cli, start_krishiv, wait_for

#: The old columns: a nested record's fields as <record>_<field> (the Avro tests below were written for them, and
#: keep checking that tables made so keep working).
FLAT = "flatten = true\n"
TIMEOUT_S = 240.0  # a bound, not a target: Spark starts in a process of its own on a loaded 2-core machine
PIPELINE = """
[schema_registry]
url = "{registry}"
{auth}
[[pipelines]]
name = "orders"
kind = "events"
topic = "{topic}"
format = "{format}"
kafka_metadata = ["offset"]
{extra}"""


def _spec(
    tmp_path: Path, broker, topic: str, registry: SchemaRegistryServer, fmt: str, auth: str = "", extra: str = ""
) -> Path:
    """The spec of one events pipeline on ``topic`` (``extra``: more of its keys, such as ``flatten = true``)."""
    path = tmp_path / "krishiv.toml"
    settings = SETTINGS_TEMPLATE.format(
        bootstrap=broker.bootstrap, partitions=1, catalog_uri="sqlite:///catalog.db", warehouse="w", topic=topic
    )
    path.write_text(settings + PIPELINE.format(registry=registry.url, topic=topic, format=fmt, auth=auth, extra=extra))
    return path


def _send(broker, topic: str, values: list[bytes]) -> None:
    ensure_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, [OrderEvent(n, 0, b"k", v, "valid") for n, v in enumerate(values)])


def _run(spec: KrishivSpec) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    run_pipelines(spec, list(spec.pipelines), once=True)
    commit_pipelines(spec, list(spec.pipelines))
    catalog = load_catalog(spec)
    rows = catalog.load_table(qualified(spec, "orders")).scan().to_arrow().to_pylist()
    rejects = catalog.load_table(qualified(spec, "orders_rejects")).scan().to_arrow().to_pylist()
    assert len({r["_kafka_offset"] for r in rows}) == len(rows), "each offset once"
    return {r["_kafka_offset"]: r for r in rows}, {r["offset"]: r["reason"] for r in rejects}


CUSTOMER = [{"name": "id", "type": "long"}]
AVRO_V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 10}},
        {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {
            "name": "customer",
            "type": {"type": "record", "name": "Customer", "fields": [{"name": "id", "type": "long"}]},
        },
        {"name": "coupon", "type": ["null", "string"], "default": None},
    ],
}
AVRO_V2 = {**AVRO_V1, "fields": [*AVRO_V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}


def _avro_order(rng: random.Random, n: int, v2: bool) -> dict[str, Any]:
    digits = rng.choice([0, 1, 10**27 - 1, -(10**27) + 1, rng.randrange(-(10**20), 10**20)])
    order = {
        "order_id": f"o-{n}",
        "amount": Decimal(digits).scaleb(-10),
        "placed_at": datetime(2026, 1, 1, tzinfo=UTC) + timedelta(milliseconds=rng.randrange(10**11)),
        "customer": {"id": rng.randrange(-(2**63), 2**63)},
        "coupon": rng.choice([None, "", "SPRING"]),
    }
    return order | ({"note": rng.choice([None, f"note {n}"])} if v2 else {})


def test_an_avro_topic_lands_with_fields_from_the_registry_and_evolves_with_a_new_schema_version(
    tmp_path, broker, spark, topic, schema_registry: SchemaRegistryServer
):
    rng = random.Random(2424)
    client = SchemaRegistryClient({"url": schema_registry.url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    v1 = AvroSerializer(client, json.dumps(AVRO_V1))
    orders = [_avro_order(rng, n, v2=False) for n in range(40)]
    values = [v1(o, ctx) for o in orders]
    good = values[0]
    frame = "expected a magic byte 0, a 4-byte schema id and the avro payload"
    broken = {  # offset -> (bytes, reason)
        40: (b'{"order_id": "o-x"}', "not in the Confluent wire format: magic byte 0x7b, expected 0"),
        41: (
            b"\x00\x00\x00\x03\xe7" + good[5:],
            f"schema id 999 is not in the Schema Registry at {schema_registry.url}",
        ),
        42: (good[:8], "undecodable avro payload (schema id 1): it ends before the record does (truncated)"),
        43: (
            b"\x00\x00\x00",
            f"not in the Confluent wire format: 3 bytes, {frame}",
        ),
    }
    _send(broker, topic, values + [b for b, _ in broken.values()])
    path = _spec(tmp_path, broker, topic, schema_registry, "avro", extra=FLAT)
    spec = load_spec(path, env={})
    assert [(f.name, str(f.type), f.required) for f in spec.pipeline().fields] == [
        ("order_id", "string", True),
        ("amount", "decimal(38,10)", True),
        ("placed_at", "timestamp", True),
        ("customer_id", "long", True),
        ("coupon", "string", False),
    ]
    rows, rejects = _run(spec)
    assert rejects == {offset: reason for offset, (_, reason) in broken.items()}
    assert {o: _columns(r, V1) for o, r in rows.items()} == {n: _flat(order, V1) for n, order in enumerate(orders)}

    # A newer compatible version with a new field, with the spec loaded before it was registered: the run starts its
    # query again with the subject's latest fields, so the batch that first carries it adds its column.
    v2 = AvroSerializer(client, json.dumps(AVRO_V2))
    newer = [_avro_order(rng, n, v2=True) for n in range(44, 60)]
    _send(broker, topic, [v2(o, ctx) for o in newer])
    rows, rejects = _run(spec)
    assert load_spec(path, env={}).pipeline().fields[-1].name == "note"
    assert {o: _columns(r, V2) for o, r in rows.items() if o >= 44} == {
        n: _flat(order, V2) for n, order in enumerate(newer, start=44)
    }
    assert all(r["note"] is None for o, r in rows.items() if o < 44), "rows staged before the column came keep it null"
    assert len(rows) == 56 and len(rejects) == 4
    assert schema_registry.unknown_requests == []


def _point(with_alt: bool) -> dict[str, Any]:
    fields: list[dict[str, Any]] = [{"name": "lat", "type": "double"}, {"name": "lon", "type": "double"}]
    if with_alt:  # the version a producer moves to mid-stream: an optional field inside the nested record
        fields.append({"name": "alt", "type": ["null", "double"], "default": None})
    return {"type": "record", "name": "Point", "fields": fields}


def _van_schema(with_alt: bool) -> dict[str, Any]:
    reading = {
        "type": "record",
        "name": "Reading",
        "fields": [
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "value", "type": {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 6}},
        ],
    }
    decimal = {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 10}
    return {
        "type": "record",
        "name": "Van",
        "namespace": "fleet",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "gps", "type": _point(with_alt)},
            {"name": "readings", "type": {"type": "array", "items": reading}},
            {"name": "attrs", "type": {"type": "map", "values": ["null", decimal]}},
            {"name": "tags", "type": {"type": "array", "items": ["null", "string"]}},
            # (an optional record with a required field waits on staging: parquet_files.to_table_schema's cast refuses
            # the null field under a null struct; see the H1 report)
            {
                "name": "meta",
                "type": [
                    "null",
                    {"type": "record", "name": "Meta", "fields": [{"name": "site", "type": ["null", "string"]}]},
                ],
            },
        ],
    }


def _van(rng: random.Random, n: int, with_alt: bool) -> dict[str, Any]:
    """A record the producer sends, which is also the row docs/formats.md's mapping makes of it (records as structs,
    arrays as lists, maps as maps; a timestamp-millis a UTC time, decimals exact)."""
    at = datetime(2026, 3, 1, tzinfo=UTC)
    edge = [Decimal("99999999999999.999999"), Decimal("-0.000001"), Decimal(0)]
    van = {
        "id": f"van-{n}",
        "gps": {"lat": rng.choice([52.1, -90.0, 0.0]), "lon": rng.choice([4.3, 180.0])},
        "readings": [
            {"at": at + timedelta(milliseconds=rng.randrange(10**10)), "value": rng.choice(edge)}
            for _ in range(rng.choice([0, 1, 3]))
        ],
        "attrs": rng.choice([{}, {"speed": Decimal("12345678901234567890123456.1234567891"), "fuel": None}]),
        "tags": rng.choice([[], ["cold", None, "late"]]),
        "meta": rng.choice([None, {"site": "pune"}]),
    }
    if with_alt:
        van["gps"]["alt"] = rng.choice([None, 12.5])
    return van


def test_an_avro_topic_with_nested_records_arrays_and_maps_lands_nested_and_a_nested_field_added_mid_stream_evolves(
    tmp_path, broker, spark, topic, schema_registry: SchemaRegistryServer
):
    """Fields from the registry as nested types; then the producer registers a version with an optional field inside
    the nested record: the run takes the subject's latest fields with the batch that first carries it, the table
    gains ``gps.alt``, and rows staged before it are null there."""
    rng = random.Random(36)
    client = SchemaRegistryClient({"url": schema_registry.url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    first = AvroSerializer(client, json.dumps(_van_schema(with_alt=False)))
    vans = [_van(rng, n, with_alt=False) for n in range(30)]
    _send(broker, topic, [first(v, ctx) for v in vans])
    path = _spec(tmp_path, broker, topic, schema_registry, "avro")
    spec = load_spec(path, env={})
    assert [(f.name, str(f.type), f.required) for f in spec.pipeline().fields] == [
        ("id", "string", True),
        ("gps", "struct<lat: double, lon: double>", True),
        ("readings", "list<struct<at: timestamp, value: decimal(20,6)>>", True),
        ("attrs", "map<string, decimal(38,10)?>", True),
        ("tags", "list<string?>", True),
        ("meta", "struct<site: string?>", False),
    ]
    names = ("id", "gps", "readings", "attrs", "tags", "meta")
    rows, rejects = _run(spec)
    assert rejects == {}
    assert {o: _maps(_columns(r, names)) for o, r in rows.items()} == dict(enumerate(vans))

    second = AvroSerializer(client, json.dumps(_van_schema(with_alt=True)))
    newer = [_van(rng, n, with_alt=True) for n in range(30, 45)]
    _send(broker, topic, [second(v, ctx) for v in newer])
    rows, rejects = _run(spec)  # the spec loaded before the version was registered
    assert rejects == {}
    gps = load_spec(path, env={}).pipeline().field("gps")
    assert str(gps.type) == "struct<lat: double, lon: double, alt: double?>"
    table = load_catalog(spec).load_table(qualified(spec, "orders"))
    assert str(table.schema().find_field("gps.alt").field_type) == "double"
    expected = {n: v | {"gps": {"alt": None, **v["gps"]}} for n, v in enumerate(vans)}  # old rows: null there
    expected |= dict(enumerate(newer, start=30))
    assert {o: _maps(_columns(r, names)) for o, r in rows.items()} == expected
    assert schema_registry.unknown_requests == []


V1 = ("order_id", "amount", "placed_at", "customer_id", "coupon")
V2 = (*V1, "note")


def _flat(order: dict[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
    flat = {**order, "customer_id": order["customer"]["id"]}
    return {k: flat[k] for k in columns}


def _columns(row: dict[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
    return {k: row[k] for k in columns}


def _maps(row: dict[str, Any]) -> dict[str, Any]:
    """A row read back with its map columns (Arrow's lists of key-value pairs) as dicts: a Protobuf map has no order."""
    return {k: dict(v) if k in ("counts", "attrs") and v is not None else v for k, v in row.items()}


_F = descriptor_pb2.FieldDescriptorProto


def _order_type(with_note: bool) -> Any:
    """shop.Order as protoc would describe it (no protoc here), with a nested message, ``repeated string tags``, a
    ``map<string, int64> counts`` and ``repeated Customer others``: the second version adds ``optional string
    note``."""
    proto = descriptor_pb2.FileDescriptorProto(name="shop/order.proto", package="shop", syntax="proto3")
    proto.dependency.append("google/protobuf/timestamp.proto")
    order = proto.message_type.add(name="Order")
    status = order.enum_type.add(name="Status")
    for number, name in enumerate(["UNKNOWN", "PLACED", "SHIPPED"]):
        status.value.add(name=name, number=number)
    customer = order.nested_type.add(name="Customer")
    customer.field.add(name="name", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    for name, number, kind, type_name in [
        ("order_id", 1, _F.TYPE_STRING, ""),
        ("quantity", 2, _F.TYPE_INT64, ""),
        ("price", 3, _F.TYPE_DOUBLE, ""),
        ("placed_at", 4, _F.TYPE_MESSAGE, ".google.protobuf.Timestamp"),
        ("status", 5, _F.TYPE_ENUM, ".shop.Order.Status"),
        ("customer", 6, _F.TYPE_MESSAGE, ".shop.Order.Customer"),
    ]:
        field = order.field.add(name=name, number=number, type=kind, label=_F.LABEL_OPTIONAL)
        if type_name:
            field.type_name = type_name
    order.field.add(name="tags", number=9, type=_F.TYPE_STRING, label=_F.LABEL_REPEATED)
    entry = order.nested_type.add(name="CountsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=_F.TYPE_INT64, label=_F.LABEL_OPTIONAL)
    counts = order.field.add(name="counts", number=10, type=_F.TYPE_MESSAGE, label=_F.LABEL_REPEATED)
    counts.type_name = ".shop.Order.CountsEntry"
    others = order.field.add(name="others", number=11, type=_F.TYPE_MESSAGE, label=_F.LABEL_REPEATED)
    others.type_name = ".shop.Order.Customer"
    optional = [("coupon", 7)] + ([("note", 8)] if with_note else [])
    for name, number in optional:  # proto3 ``optional``: a synthetic oneof each
        order.oneof_decl.add(name=f"_{name}")
        order.field.add(
            name=name,
            number=number,
            type=_F.TYPE_STRING,
            label=_F.LABEL_OPTIONAL,
            proto3_optional=True,
            oneof_index=len(order.oneof_decl) - 1,
        )
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def _protobuf_order(cls: Any, rng: random.Random, n: int, with_note: bool) -> tuple[Any, dict[str, Any]]:
    """A message and the row the rule of docs/spec.md makes of it."""
    placed = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(microseconds=rng.randrange(10**13))
    row = {
        "order_id": f"o-{n}",
        "quantity": rng.choice([0, -1, 2**63 - 1, rng.randrange(1000)]),
        "price": rng.choice([0.0, 0.1, 1e300]),
        "placed_at": placed,
        "status": rng.choice(["UNKNOWN", "PLACED", "SHIPPED"]),
        "customer": {"name": rng.choice(["", "Asha"])},
        "coupon": rng.choice([None, "", "SPRING"]),
        "tags": rng.choice([[], ["cold"], ["", "late", "late"]]),
        "counts": rng.choice([{}, {"a": 2**63 - 1}, {"a": -1, "é": 0, "": 7}]),
        "others": rng.choice([[], [{"name": "Ravi"}, {"name": ""}]]),
    } | ({"note": rng.choice([None, f"note {n}"])} if with_note else {})
    message = cls(order_id=row["order_id"], quantity=row["quantity"], price=row["price"], status=row["status"])
    message.placed_at.FromDatetime(placed)
    message.customer.name = row["customer"]["name"]
    message.tags.extend(row["tags"])
    message.counts.update(row["counts"])
    for other in row["others"]:
        message.others.add(name=other["name"])
    for name in ("coupon", "note"):
        if row.get(name) is not None:
            setattr(message, name, row[name])
    return message, row


def test_a_protobuf_topic_lands_with_fields_from_the_registry_without_a_generated_class(
    tmp_path, broker, spark, topic, schema_registry: SchemaRegistryServer
):
    rng = random.Random(77)
    client = SchemaRegistryClient({"url": schema_registry.url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    first = _order_type(with_note=False)
    serializer = ProtobufSerializer(first, client, {"use.deprecated.format": False})
    sent = [_protobuf_order(first, rng, n, with_note=False) for n in range(30)]
    values = [serializer(m, ctx) for m, _ in sent]
    order_id = int.from_bytes(values[0][1:5], "big")
    _send(broker, topic, [*values, values[0][:6] + b"\xff\xff"])  # the first order's frame, then no message
    path = _spec(tmp_path, broker, topic, schema_registry, "protobuf")
    spec = load_spec(path, env={})
    assert [(f.name, str(f.type), f.required) for f in spec.pipeline().fields] == [
        ("order_id", "string", True),
        ("quantity", "long", True),
        ("price", "double", True),
        ("placed_at", "timestamp", False),
        ("status", "string", True),
        ("customer", "struct<name: string>", False),
        ("tags", "list<string>", True),
        ("counts", "map<string, long>", True),
        ("others", "list<struct<name: string>>", True),
        ("coupon", "string", False),
    ]
    rows, rejects = _run(spec)
    columns = tuple(f.name for f in spec.pipeline().fields)
    assert {o: _maps(_columns(r, columns)) for o, r in rows.items()} == {n: row for n, (_, row) in enumerate(sent)}
    assert list(rejects) == [30] and rejects[30].startswith(f"undecodable protobuf payload (schema id {order_id}): ")

    second = _order_type(with_note=True)
    serializer = ProtobufSerializer(second, client, {"use.deprecated.format": False})
    newer = [_protobuf_order(second, rng, n, with_note=True) for n in range(31, 41)]
    _send(broker, topic, [serializer(m, ctx) for m, _ in newer])
    spec = load_spec(path, env={})
    rows, _ = _run(spec)
    columns = (*columns, "note")
    assert {o: _maps(_columns(r, columns)) for o, r in rows.items() if o > 30} == {
        n: row for n, (_, row) in enumerate(newer, start=31)
    }
    assert schema_registry.unknown_requests == []


def test_a_registry_that_is_down_stops_the_run_after_the_bound_and_skips_no_record(
    tmp_path, broker, spark, topic, monkeypatch
):
    """Fields listed in the spec, so only the source's tasks ask the registry: down past the bound, the run stops
    naming it and no batch is recorded; wrong credentials stop it at once naming the 401; then every record once."""
    monkeypatch.setenv("KRISHIV_REGISTRY_OUTAGE_S", "2")
    monkeypatch.setenv("KRISHIV_TEST_SR_AUTH", "krishiv:wrong")
    with SchemaRegistryServer(user="krishiv", password="s3cret") as registry:
        client = SchemaRegistryClient({"url": registry.url, "basic.auth.user.info": "krishiv:s3cret"})
        serializer = AvroSerializer(client, json.dumps(AVRO_V1))
        orders = [_avro_order(random.Random(5), n, v2=False) for n in range(12)]
        _send(broker, topic, [serializer(o, SerializationContext(topic, MessageField.VALUE)) for o in orders])
        path = _spec(
            tmp_path,
            broker,
            topic,
            registry,
            "avro",
            auth='basic.auth.user.info = "${KRISHIV_TEST_SR_AUTH}"',
            extra=FLAT,
        )
        fields = '\n[pipelines.fields]\norder_id = "string"\namount = "decimal(38,10)"\ncustomer_id = "long"\n'
        path.write_text(path.read_text() + fields)
        spec = load_spec(path)

        with pytest.raises(KrishivError, match=r"refused Krishiv \(401 Unauthorized\): check the credentials"):
            run_pipelines(spec, list(spec.pipelines), once=True)
        monkeypatch.setenv("KRISHIV_TEST_SR_AUTH", "krishiv:s3cret")
        spec = load_spec(path)
        registry.down()
        with pytest.raises(KrishivError, match=rf"the Schema Registry at {registry.url} did not answer for 2s"):
            run_pipelines(spec, list(spec.pipelines), once=True)
        registry.up()
        rows, rejects = _run(spec)
    assert rejects == {}
    assert {o: (r["order_id"], r["amount"], r["customer_id"]) for o, r in rows.items()} == {
        n: (o["order_id"], o["amount"], o["customer"]["id"]) for n, o in enumerate(orders)
    }


def test_the_cli_says_a_registry_outage_in_one_line_without_a_traceback(
    tmp_path, broker, topic, schema_registry: SchemaRegistryServer
):
    """The real ``krishiv run`` process: the source task's failure reaches the user as one line, exit 2 (Spark's
    executor and scheduler ERRORs and py4j's callback traceback would repeat it in about 150 lines)."""
    serializer = AvroSerializer(SchemaRegistryClient({"url": schema_registry.url}), json.dumps(AVRO_V1))
    ctx = SerializationContext(topic, MessageField.VALUE)
    _send(broker, topic, [serializer(_avro_order(random.Random(3), n, v2=False), ctx) for n in range(5)])
    path = _spec(tmp_path, broker, topic, schema_registry, "avro", extra=FLAT)
    path.write_text(path.read_text() + '\n[pipelines.fields]\norder_id = "string"\n')
    schema_registry.down()
    result = krishiv_cli(path, "run", "--once", env={"KRISHIV_REGISTRY_OUTAGE_S": "2"})
    said = [line for line in result.stderr.splitlines() if not line.startswith("WARNING: Using incubator modules")]
    assert result.returncode == 2, result.stderr
    # the line that the task waits, when the client's own retries of its first call end within the 2 s
    said = [x for x in said if not x.startswith(f"krishiv-kafka: the Schema Registry at {schema_registry.url} did")]
    assert len(said) == 1, result.stderr
    assert said[0].startswith("krishiv run: query orders failed: RegistryUnavailable: the Schema Registry at ")
    assert said[0].endswith("(see docs/operations.md: Recovery runbook > A Schema Registry that does not answer)")


def test_commands_that_decode_nothing_load_the_spec_while_the_registry_is_down(
    tmp_path, broker, spark, topic, schema_registry: SchemaRegistryServer
):
    """Fields from the registry are remembered in the pipeline's checkpoint folder when read, so ``commit``,
    ``status`` and ``verify`` go on through a registry outage (here committing a batch staged before it); with
    nothing remembered the load says the registry did not answer, in one line."""
    serializer = AvroSerializer(SchemaRegistryClient({"url": schema_registry.url}), json.dumps(AVRO_V1))
    ctx = SerializationContext(topic, MessageField.VALUE)
    _send(broker, topic, [serializer(_avro_order(random.Random(4), n, v2=False), ctx) for n in range(6)])
    path = _spec(tmp_path, broker, topic, schema_registry, "avro", extra=FLAT)
    spec = load_spec(path, env={})
    run_pipelines(spec, list(spec.pipelines), once=True, commit=False)
    schema_registry.down()
    assert load_spec(path, env={}).pipeline().fields == spec.pipeline().fields
    for command in ("status", "commit", "verify"):
        result = krishiv_cli(path, command)
        assert result.returncode == 0, result.stdout + result.stderr
    table = load_catalog(spec).load_table(qualified(spec, "orders"))
    assert len(table.scan().to_arrow()) == 6
    (tmp_path / "checkpoints").rename(tmp_path / "elsewhere")
    with pytest.raises(KrishivError, match=r"did not answer \(ConnectError\); the fields of '.*' come from it"):
        load_spec(path, env={})


def test_a_json_schema_topic_lands_with_fields_from_the_registry_and_exact_decimals(
    tmp_path, broker, spark, topic, schema_registry: SchemaRegistryServer
):
    """JSON Schema through the broker, Spark and catalog: fields from the subject, each value validated by its
    schema and read by the JSON rule (a long past a double's exact range kept); one that fails its schema is a
    reject naming why."""
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    schema = {
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "qty": {"type": "integer"}, "note": {"type": "string"}},
        "required": ["order_id", "qty"],
    }
    serializer = JSONSerializer(json.dumps(schema), SchemaRegistryClient({"url": schema_registry.url}))
    ctx = SerializationContext(topic, MessageField.VALUE)
    orders = [{"order_id": f"o-{n}", "qty": n * 10**15} | ({"note": "gift"} if n % 2 else {}) for n in range(10)]
    values = [serializer(o, ctx) for o in orders]
    _send(broker, topic, [*values, values[0][:5] + b'{"order_id": 5, "qty": 1}'])
    spec = load_spec(_spec(tmp_path, broker, topic, schema_registry, "json_schema"), env={})
    assert [(f.name, str(f.type), f.required) for f in spec.pipeline().fields] == [
        ("order_id", "string", True),
        ("qty", "long", True),
        ("note", "string", False),
    ]
    rows, rejects = _run(spec)
    assert {o: (r["order_id"], r["qty"], r["note"]) for o, r in rows.items()} == {
        n: (o["order_id"], o["qty"], o.get("note")) for n, o in enumerate(orders)
    }
    assert list(rejects) == [10] and rejects[10].startswith("undecodable json_schema payload (schema id ")


AVRO_V3 = {**AVRO_V2, "fields": [*AVRO_V2["fields"], {"name": "channel", "type": ["null", "string"], "default": None}]}
V3 = (*V2, "channel")
#: A version the table cannot take: a new field, and the customer's id a string in a column of longs.
AVRO_RETYPED = {
    **AVRO_V3,
    "fields": [
        *[f for f in AVRO_V3["fields"] if f["name"] != "customer"],
        {"name": "customer", "type": {**AVRO_V1["fields"][3]["type"], "fields": [{"name": "id", "type": "string"}]}},
        {"name": "gift", "type": ["null", "string"], "default": None},
    ],
}


def test_a_continuous_run_takes_a_new_versions_fields_with_the_batch_that_first_carries_them(
    tmp_path, broker, topic, schema_registry: SchemaRegistryServer
):
    """A continuous ``krishiv run`` (the real process) on an Avro topic with its fields from the registry: the producer
    moves to a version with a new field (registry up), then to another while the registry is down; each time the run
    starts its query again with the latest fields, with no restart by hand, and every value is in the table, rows
    before the column null there, each record once. Then a version the table cannot take stops the run in one line,
    its record unstaged."""
    rng = random.Random(35)
    client = SchemaRegistryClient({"url": schema_registry.url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    serializers = {v: AvroSerializer(client, json.dumps(s)) for v, s in ((1, AVRO_V1), (2, AVRO_V2), (3, AVRO_V3))}
    sent: list[dict[str, Any]] = []  # the orders by offset

    def encoded(versions: list[int]) -> list[bytes]:
        values = []
        for v in versions:
            order = _avro_order(rng, len(sent), v2=v >= 2) | ({"channel": rng.choice([None, "web"])} if v >= 3 else {})
            sent.append(order)
            values.append(serializers[v](order, ctx))
        return values

    _send(broker, topic, encoded([1] * 10))
    path = _spec(tmp_path, broker, topic, schema_registry, "avro", extra=FLAT)
    spec = load_spec(path, env={})
    output = tmp_path / "run.log"
    run = start_krishiv(path, "run", output=output, env={"KRISHIV_REGISTRY_OUTAGE_S": "120"})
    waiting = f"krishiv-kafka: the Schema Registry at {schema_registry.url} did not answer"
    try:
        wait_for(lambda: all_committed(spec), "the first wave was not committed", output, TIMEOUT_S)
        _send(broker, topic, encoded([2, 1] * 6))  # the new version registered with the registry up
        wait_for(lambda: all_committed(spec), "the second version's wave was not committed", output, TIMEOUT_S)
        values = encoded([3, 2, 1] * 4)  # registered; then the registry goes down before the records are sent
        schema_registry.down()
        _send(broker, topic, values)
        wait_for(lambda: waiting in output.read_text(), "the run did not wait for the registry", output, TIMEOUT_S)
        schema_registry.up()
        wait_for(lambda: all_committed(spec), "the third version's wave was not committed", output, TIMEOUT_S)
        retyped = AvroSerializer(client, json.dumps(AVRO_RETYPED))
        order = _avro_order(rng, len(sent), v2=True) | {"channel": None, "gift": "bow"}
        _send(broker, topic, [retyped(order | {"customer": {"id": "c-1"}}, ctx)])
        code = run.wait(TIMEOUT_S)
    finally:
        stop(run)
    said = output.read_text()
    lines = [x for x in said.splitlines() if not x.startswith("WARNING: Using incubator modules")]
    restarts = [x for x in lines if "a batch holds records of a newer schema version" in x]
    assert [x.split("(new: ")[1].split(")")[0] for x in restarts] == ["note", "channel", "gift"], said
    assert "Traceback" not in said and any(x.startswith(waiting) for x in lines), said
    assert code != 0 and lines[-1].startswith("krishiv run: ") and "customer_id" in lines[-1], said

    catalog = load_catalog(spec)
    rows = catalog.load_table(qualified(spec, "orders")).scan().to_arrow().to_pylist()
    assert sorted(r["_kafka_offset"] for r in rows) == list(range(len(sent))), "each record once, the last unstaged"
    assert {r["_kafka_offset"]: _columns(r, V3) for r in rows} == {
        n: {k: {**o, "customer_id": o["customer"]["id"]}.get(k) for k in V3} for n, o in enumerate(sent)
    }
    assert len(catalog.load_table(qualified(spec, "orders_rejects")).scan().to_arrow()) == 0
