"""The pipeline spec: the repository's file, environment overrides, relative paths and field-naming errors."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.types import DecimalType, LongType, TimestamptzType

from krishiv_core.errors import ConfigError
from krishiv_core.spec import (
    ENV_OVERRIDES,
    Aggregation,
    FieldType,
    KrishivSpec,
    MaintenanceSettings,
    PipelineSpec,
    Route,
    load_spec,
    parse_duration_ms,
    parse_size_bytes,
    parse_spec,
)
from krishiv_core.tables import aggregate_table_schema, aggregate_type

REPO_ROOT = Path(__file__).resolve().parents[2]
REPO_SPEC = REPO_ROOT / "krishiv.toml"

MINIMAL_TOML = """
[iceberg]
catalog_uri = "sqlite:///state/catalog.db"
warehouse = "state/warehouse"

[storage]
ledger_path = "state/ledger.duckdb"
checkpoint_location = "state/checkpoints"

[[pipelines]]
name = "orders_per_minute"
topic = "orders"
event_time_field = "event_time"

[pipelines.fields]
amount = "decimal(12,2)"
event_time = "timestamp_ms"

[[pipelines.aggregations]]
name = "order_count"
function = "count"
"""


def _doc(**pipeline_overrides: Any) -> dict[str, Any]:
    """A valid decoded spec document with one pipeline; keyword arguments replace pipeline keys."""
    pipeline: dict[str, Any] = {
        "name": "orders_per_minute",
        "topic": "orders",
        "table": "orders_per_minute",
        "event_time_field": "event_time",
        "watermark_delay": "5s",
        "window": "1m",
        "fields": {
            "order_id": "string",
            "customer_id": "string",
            "amount": "decimal(12,2)",
            "quantity": "long",
            "event_time": "timestamp_ms",
        },
        "aggregations": [
            {"name": "order_count", "function": "count"},
            {"name": "amount_total", "function": "sum", "field": "amount"},
        ],
    }
    pipeline.update(pipeline_overrides)
    return {
        "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
        "iceberg": {"catalog_uri": "sqlite:///state/catalog.db", "warehouse": "state/warehouse"},
        "pipelines": [pipeline],
    }


def _config_error(doc: dict[str, Any], env: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_spec(doc, env=env or {})
    return info.value


def _assert_names_field(error: ConfigError, field: str, *fragments: str) -> None:
    assert error.field == field
    message = str(error)
    assert message.startswith(f"{field}: "), message
    for fragment in fragments:
        assert fragment in message, message


# ------------------------------------------------------------------------------------------- the repo's spec


def test_repository_spec_is_the_classic_recipe() -> None:
    spec = load_spec(REPO_SPEC, env={})

    assert len(spec.pipelines) == 1
    pipeline = spec.pipeline()
    assert spec.pipeline("orders_per_minute") is pipeline
    assert pipeline.name == "orders_per_minute"
    assert pipeline.topic == "orders"
    assert pipeline.event_time_field == "event_time"
    assert pipeline.field("event_time").type == FieldType("timestamp_ms")
    assert pipeline.watermark_delay_ms == 5_000
    assert pipeline.window_ms == 60_000
    assert pipeline.output_mode == "append"
    assert pipeline.aggregations == (
        Aggregation("order_count", "count", None),
        Aggregation("amount_total", "sum", "amount"),
    )
    assert pipeline.field("amount").type == FieldType("decimal", 12, 2)
    assert pipeline.table == "orders_per_minute"
    assert pipeline.rejects_table == "orders_per_minute_rejects"


def test_repository_spec_shared_settings_and_folder() -> None:
    spec = load_spec(REPO_SPEC, env={})

    assert spec.base_dir == REPO_ROOT
    assert spec.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert spec.kafka.partitions == 4
    assert spec.iceberg.namespace == "krishiv"
    assert spec.catalog_uri() == f"sqlite:///{REPO_ROOT / 'state' / 'catalog.db'}"
    assert spec.resolve(spec.storage.ledger_path) == REPO_ROOT / "state" / "ledger.duckdb"


def test_load_spec_reads_krishiv_spec_variable(tmp_path: Path) -> None:
    path = tmp_path / "elsewhere.toml"
    path.write_text(MINIMAL_TOML)

    spec = load_spec(env={"KRISHIV_SPEC": str(path)})

    assert spec.base_dir == path.resolve().parent
    assert spec.pipeline().topic == "orders"


def test_unknown_pipeline_name_names_pipelines() -> None:
    spec = load_spec(REPO_SPEC, env={})
    with pytest.raises(ConfigError) as info:
        spec.pipeline("nope")
    _assert_names_field(info.value, "pipelines", "'nope'", "orders_per_minute")


# ------------------------------------------------------------------------------------------- env overrides


@pytest.mark.parametrize(
    ("variable", "value", "read"),
    [
        ("KRISHIV_KAFKA_BOOTSTRAP", "broker-a:9093,broker-b:9094", lambda s: s.kafka.bootstrap_servers),
        ("KRISHIV_ICEBERG_CATALOG_URI", "http://rest.example:8181", lambda s: s.iceberg.catalog_uri),
        ("KRISHIV_ICEBERG_WAREHOUSE", "s3://bucket/warehouse", lambda s: s.iceberg.warehouse),
        ("KRISHIV_LEDGER_PATH", "/var/lib/krishiv/ledger.duckdb", lambda s: s.storage.ledger_path),
        ("KRISHIV_CHECKPOINT_LOCATION", "/var/lib/krishiv/checkpoints", lambda s: s.storage.checkpoint_location),
    ],
)
def test_environment_override_replaces_its_field(variable: str, value: str, read: Callable[[KrishivSpec], str]) -> None:
    baseline = load_spec(REPO_SPEC, env={})
    assert read(baseline) != value

    spec = load_spec(REPO_SPEC, env={variable: value})

    assert read(spec) == value
    # Nothing else moves.
    others = {v: f for v, f in ENV_OVERRIDES.items() if v != variable}
    for field_path in others.values():
        section, key = field_path.split(".")
        assert getattr(getattr(spec, section), key) == getattr(getattr(baseline, section), key)


def test_every_override_variable_is_covered() -> None:
    assert set(ENV_OVERRIDES) == {
        "KRISHIV_KAFKA_BOOTSTRAP",
        "KRISHIV_ICEBERG_CATALOG_URI",
        "KRISHIV_ICEBERG_WAREHOUSE",
        "KRISHIV_LEDGER_PATH",
        "KRISHIV_CHECKPOINT_LOCATION",
    }


def test_all_overrides_together_and_derived_locations(tmp_path: Path) -> None:
    env = {
        "KRISHIV_KAFKA_BOOTSTRAP": "kafka:29092",
        "KRISHIV_ICEBERG_CATALOG_URI": f"sqlite:///{tmp_path}/other/catalog.db",
        "KRISHIV_ICEBERG_WAREHOUSE": str(tmp_path / "wh"),
        "KRISHIV_LEDGER_PATH": str(tmp_path / "l" / "ledger.duckdb"),
        "KRISHIV_CHECKPOINT_LOCATION": str(tmp_path / "cp"),
    }
    spec = load_spec(REPO_SPEC, env=env)

    assert spec.kafka.bootstrap_servers == "kafka:29092"
    assert spec.catalog_uri() == f"sqlite:///{tmp_path}/other/catalog.db"
    assert spec.warehouse_uri() == (tmp_path / "wh").as_uri()
    assert spec.resolve(spec.storage.ledger_path) == tmp_path / "l" / "ledger.duckdb"
    assert spec.checkpoint_dir(spec.pipeline()) == tmp_path / "cp" / "orders_per_minute"


def test_empty_override_is_ignored() -> None:
    spec = load_spec(REPO_SPEC, env={"KRISHIV_KAFKA_BOOTSTRAP": "", "KRISHIV_LEDGER_PATH": ""})
    assert spec.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert spec.storage.ledger_path == "state/ledger.duckdb"


def test_parse_spec_does_not_mutate_the_document() -> None:
    doc = _doc()
    before = copy.deepcopy(doc)
    parse_spec(doc, env={"KRISHIV_KAFKA_BOOTSTRAP": "other:1", "KRISHIV_LEDGER_PATH": "/x.duckdb"})
    assert doc == before


def test_bad_override_is_reported_against_its_field() -> None:
    error = _config_error(_doc(), env={"KRISHIV_KAFKA_BOOTSTRAP": "nohostport"})
    _assert_names_field(error, "kafka.bootstrap_servers", "nohostport")

    error = _config_error(_doc(), env={"KRISHIV_ICEBERG_CATALOG_URI": "mysql://db/cat"})
    _assert_names_field(error, "iceberg.catalog_uri", "a 'mysql' URI")


# ------------------------------------------------------------------------------------------- relative paths


def test_relative_paths_resolve_against_the_spec_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = (tmp_path / "project").resolve()
    folder.mkdir()
    (folder / "krishiv.toml").write_text(MINIMAL_TOML)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    spec = load_spec(folder / "krishiv.toml", env={})

    assert spec.base_dir == folder
    assert spec.resolve(spec.storage.ledger_path) == folder / "state" / "ledger.duckdb"
    assert spec.checkpoint_dir(spec.pipeline()) == folder / "state" / "checkpoints" / "orders_per_minute"
    assert spec.catalog_uri() == f"sqlite:///{folder / 'state' / 'catalog.db'}"
    assert spec.warehouse_uri() == (folder / "state" / "warehouse").as_uri()


def test_relative_spec_path_argument_is_found_from_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path.resolve()
    (folder / "sub").mkdir()
    (folder / "sub" / "krishiv.toml").write_text(MINIMAL_TOML)
    monkeypatch.chdir(folder)

    spec = load_spec("sub/krishiv.toml", env={})

    assert spec.resolve("ledger.duckdb") == folder / "sub" / "ledger.duckdb"


def test_absolute_paths_and_uris_are_kept(tmp_path: Path) -> None:
    doc = _doc()
    doc["iceberg"] = {"catalog_uri": "sqlite:////abs/catalog.db", "warehouse": "file:///data/wh"}
    doc["storage"] = {"ledger_path": "/abs/ledger.duckdb", "checkpoint_location": "/abs/cp"}
    spec = parse_spec(doc, env={}, base_dir=tmp_path)

    assert spec.catalog_uri() == "sqlite:////abs/catalog.db"
    assert spec.warehouse_uri() == "file:///data/wh"
    assert spec.resolve(spec.storage.ledger_path) == Path("/abs/ledger.duckdb")
    assert spec.checkpoint_dir(spec.pipeline()) == Path("/abs/cp/orders_per_minute")


def test_in_memory_sqlite_catalog_is_left_alone(tmp_path: Path) -> None:
    doc = _doc()
    doc["iceberg"] = {"catalog_uri": "sqlite:///:memory:"}
    assert parse_spec(doc, env={}, base_dir=tmp_path).catalog_uri() == "sqlite:///:memory:"


# ------------------------------------------------------------------------------------------- valid variants


def test_defaults_and_durations() -> None:
    pipeline_doc = _doc()["pipelines"][0]
    for key in ("table", "watermark_delay", "window"):
        del pipeline_doc[key]
    spec = parse_spec({"pipelines": [pipeline_doc]}, env={})
    p = spec.pipeline()

    assert p.table == p.name
    assert (p.watermark_delay_ms, p.window_ms, p.trigger_interval_ms) == (5_000, 60_000, 2_000)
    assert p.max_records_per_batch == 200_000
    assert spec.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert spec.iceberg.catalog_uri == "sqlite:///state/catalog.db"


@pytest.mark.parametrize(
    ("value", "ms"), [("250ms", 250), ("5s", 5_000), ("1m", 60_000), ("2h", 7_200_000), (" 10 s ", 10_000), (750, 750)]
)
def test_parse_duration(value: object, ms: int) -> None:
    assert parse_duration_ms(value, "x") == ms


def test_field_declared_as_table_with_required_flag() -> None:
    fields = dict(_doc()["pipelines"][0]["fields"])
    fields["customer_id"] = {"type": "string", "required": False}
    spec = parse_spec(_doc(fields=fields), env={})
    assert spec.pipeline().field("customer_id").required is False
    assert spec.pipeline().field("order_id").required is True


# ------------------------------------------------------------------------------------------- bad values


@pytest.mark.parametrize("value", ["5 parsecs", "fast", "-5s", 0, True, "0s"])
def test_bad_watermark_delay(value: object) -> None:
    error = _config_error(_doc(watermark_delay=value))
    _assert_names_field(error, "pipelines[0].watermark_delay", repr(value))


def test_unknown_aggregation_function() -> None:
    aggs = [
        {"name": "order_count", "function": "count"},
        {"name": "amount_median", "function": "median", "field": "amount"},
    ]
    error = _config_error(_doc(aggregations=aggs))
    _assert_names_field(error, "pipelines[0].aggregations[1].function", "'median'", "count", "sum")


def test_sum_over_a_string_field() -> None:
    aggs = [{"name": "total", "function": "sum", "field": "customer_id"}]
    error = _config_error(_doc(aggregations=aggs))
    _assert_names_field(error, "pipelines[0].aggregations[0].field", "customer_id", "string", "numeric")


def test_avg_over_a_timestamp_field() -> None:
    aggs = [{"name": "avg_time", "function": "avg", "field": "event_time"}]
    error = _config_error(_doc(aggregations=aggs))
    _assert_names_field(error, "pipelines[0].aggregations[0].field", "event_time", "numeric")


def test_aggregation_over_an_unknown_field() -> None:
    aggs = [{"name": "m", "function": "max", "field": "price"}]
    error = _config_error(_doc(aggregations=aggs))
    _assert_names_field(error, "pipelines[0].aggregations[0].field", "'price'")


@pytest.mark.parametrize("name", ["order_count", "window_start"])
def test_duplicate_output_column(name: str) -> None:
    aggs = [{"name": "order_count", "function": "count"}, {"name": name, "function": "max", "field": "amount"}]
    error = _config_error(_doc(aggregations=aggs))
    _assert_names_field(error, "pipelines[0].aggregations[1].name", repr(name))


def test_event_time_field_must_be_a_timestamp() -> None:
    error = _config_error(_doc(event_time_field="amount"))
    _assert_names_field(error, "pipelines[0].event_time_field", "amount", "timestamp", "decimal(12,2)")


def test_event_time_field_must_exist() -> None:
    error = _config_error(_doc(event_time_field="ts"))
    _assert_names_field(error, "pipelines[0].event_time_field", "'ts'")


@pytest.mark.parametrize("decl", ["decimal(50,2)", "decimal(10,11)", "decimal(0,0)", "money", "varchar"])
def test_bad_field_type(decl: str) -> None:
    fields = dict(_doc()["pipelines"][0]["fields"])
    fields["amount"] = decl
    error = _config_error(_doc(fields=fields))
    _assert_names_field(error, "pipelines[0].fields.amount", decl)


def test_bad_type_in_table_form_names_the_type_key() -> None:
    fields = dict(_doc()["pipelines"][0]["fields"])
    fields["amount"] = {"type": "decimal(50,2)"}
    error = _config_error(_doc(fields=fields))
    _assert_names_field(error, "pipelines[0].fields.amount.type", "decimal(50,2)")


@pytest.mark.parametrize("servers", ["nohostport", "host:", "host:port", "a:9092,nohostport", "a:9092,"])
def test_bad_bootstrap_servers(servers: str) -> None:
    doc = _doc()
    doc["kafka"] = {"bootstrap_servers": servers}
    error = _config_error(doc)
    _assert_names_field(error, "kafka.bootstrap_servers", servers)


@pytest.mark.parametrize("uri", ["mysql://user:pw@db/catalog", "file:///tmp/catalog.db"])
def test_bad_catalog_uri_scheme(uri: str) -> None:
    doc = _doc()
    doc["iceberg"] = {"catalog_uri": uri}
    error = _config_error(doc)
    _assert_names_field(error, "iceberg.catalog_uri", f"a {uri.split(':')[0]!r} URI")
    assert "pw" not in str(error), "the rest of the URI may hold a password: it is not echoed"


@pytest.mark.parametrize(
    "uri", ["sqlite:///c.db", "postgresql://u@h/db", "postgresql+psycopg://u@h/db", "http://r:8181", "https://r"]
)
def test_accepted_catalog_uri_schemes(uri: str) -> None:
    doc = _doc()
    doc["iceberg"] = {"catalog_uri": uri}
    assert parse_spec(doc, env={}).iceberg.catalog_uri == uri


@pytest.mark.parametrize(
    ("key", "value", "forced"),
    [
        ("isolation.level", "read_uncommitted", "read_committed"),
        ("enable.auto.commit", True, "false"),
        ("enable.auto.offset.store", "true", "false"),
        ("auto.offset.reset", "earliest", "error"),
    ],
)
def test_consumer_settings_exactly_once_depends_on_are_refused(key: str, value: object, forced: str) -> None:
    doc = _doc()
    doc["kafka"]["consumer"] = {"fetch.min.bytes": "1", key: value}
    error = _config_error(doc)
    _assert_names_field(error, f"kafka.consumer.{key}", f"({forced})", "exactly-once", "remove it")


def test_dotted_consumer_keys_in_a_file_are_read_as_dotted_names(tmp_path: Path) -> None:
    """TOML reads an unquoted ``a.b = 1`` as a nested table: it still names the librdkafka setting ``a.b``."""
    path = tmp_path / "krishiv.toml"
    path.write_text(
        MINIMAL_TOML
        + '\n[kafka.consumer]\nfetch.min.bytes = 1\n"group.id" = "mine"\nisolation.level = "read_uncommitted"\n'
    )
    with pytest.raises(ConfigError) as info:
        load_spec(path, env={})
    _assert_names_field(info.value, "kafka.consumer.isolation.level", "read_committed")

    path.write_text(MINIMAL_TOML + '\n[kafka.consumer]\nfetch.min.bytes = 1\n"group.id" = "mine"\n')
    assert dict(load_spec(path, env={}).kafka.consumer) == {"fetch.min.bytes": "1", "group.id": "mine"}


def test_unknown_key_in_a_pipeline() -> None:
    error = _config_error(_doc(watermark="5s"))
    _assert_names_field(error, "pipelines[0]", "'watermark'")


def test_unknown_key_in_a_section_and_unknown_section() -> None:
    doc = _doc()
    doc["kafka"]["brokers"] = "a:1"
    _assert_names_field(_config_error(doc), "kafka", "'brokers'")

    doc = _doc()
    doc["sparkle"] = {}
    _assert_names_field(_config_error(doc), "spec", "'sparkle'")


def test_duplicate_pipeline_names() -> None:
    doc = _doc()
    second = copy.deepcopy(doc["pipelines"][0])
    second["table"] = "other_table"
    doc["pipelines"].append(second)
    error = _config_error(doc)
    _assert_names_field(error, "pipelines.name", "orders_per_minute")


def test_duplicate_pipeline_tables() -> None:
    doc = _doc()
    second = copy.deepcopy(doc["pipelines"][0])
    second["name"] = "second"
    doc["pipelines"].append(second)
    error = _config_error(doc)
    _assert_names_field(error, "pipelines.table", "orders_per_minute")


@pytest.mark.parametrize("value", [0, -1, True, "100"])
def test_bad_max_records_per_batch(value: object) -> None:
    error = _config_error(_doc(max_records_per_batch=value))
    _assert_names_field(error, "pipelines[0].max_records_per_batch")


def test_catch_up_records_per_batch_is_off_or_above_the_batch_limit() -> None:
    assert _parse(_doc()).catch_up_records_per_batch == 0
    assert (
        _parse(_doc(max_records_per_batch=1_000, catch_up_records_per_batch=5_000)).catch_up_records_per_batch == 5_000
    )
    for value in (1_000, 10, -1, True, "5000"):
        error = _config_error(_doc(max_records_per_batch=1_000, catch_up_records_per_batch=value))
        _assert_names_field(error, "pipelines[0].catch_up_records_per_batch")
    assert "more than max_records_per_batch (1000)" in str(
        _config_error(_doc(max_records_per_batch=1_000, catch_up_records_per_batch=1_000))
    )


def test_second_pipeline_errors_name_its_index() -> None:
    doc = _doc()
    second = copy.deepcopy(doc["pipelines"][0])
    second.update(name="second", table="second", window="1 fortnight")
    doc["pipelines"].append(second)
    _assert_names_field(_config_error(doc), "pipelines[1].window", "1 fortnight")


def test_bad_topic_name() -> None:
    _assert_names_field(_config_error(_doc(topic="has space")), "pipelines[0].topic", "has space")


def test_no_pipelines() -> None:
    doc = _doc()
    doc["pipelines"] = []
    _assert_names_field(_config_error(doc), "pipelines")
    del doc["pipelines"]
    _assert_names_field(_config_error(doc), "pipelines")


def test_missing_spec_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "krishiv.toml"
    with pytest.raises(ConfigError) as info:
        load_spec(missing, env={})
    _assert_names_field(info.value, "spec", str(missing))


def test_invalid_toml(tmp_path: Path) -> None:
    path = tmp_path / "krishiv.toml"
    path.write_text("[kafka\nbootstrap_servers = 1\n")
    with pytest.raises(ConfigError) as info:
        load_spec(path, env={})
    _assert_names_field(info.value, "spec", str(path), "TOML")


def test_bad_value_in_a_file_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "krishiv.toml"
    path.write_text(
        MINIMAL_TOML.replace(
            'event_time_field = "event_time"', 'event_time_field = "event_time"\nwatermark_delay = "5 parsecs"'
        )
    )
    with pytest.raises(ConfigError) as info:
        load_spec(path, env={})
    _assert_names_field(info.value, "pipelines[0].watermark_delay", "5 parsecs")


# ------------------------------------------------------------------------------------------- output types


def _pipeline(aggregations: list[dict[str, Any]]) -> PipelineSpec:
    fields = {
        "amount": "decimal(12,2)",
        "big": "decimal(38,2)",
        "quantity": "long",
        "small": "int",
        "price": "double",
        "label": "string",
        "event_time": "timestamp_ms",
    }
    spec: KrishivSpec = parse_spec(_doc(fields=fields, aggregations=aggregations), env={})
    return spec.pipeline()


@pytest.mark.parametrize(
    ("function", "field", "expected"),
    [
        ("count", None, FieldType("long")),
        ("count", "amount", FieldType("long")),
        ("sum", "amount", FieldType("decimal", 22, 2)),
        ("avg", "amount", FieldType("decimal", 16, 6)),
        ("min", "amount", FieldType("decimal", 12, 2)),
        ("max", "amount", FieldType("decimal", 12, 2)),
        ("sum", "big", FieldType("decimal", 38, 2)),
        ("sum", "quantity", FieldType("long")),
        ("sum", "small", FieldType("long")),
        ("sum", "price", FieldType("double")),
        ("avg", "quantity", FieldType("double")),
        ("min", "quantity", FieldType("long")),
        ("max", "small", FieldType("int")),
        ("max", "price", FieldType("double")),
        ("min", "label", FieldType("string")),
        ("max", "event_time", FieldType("timestamp_ms")),
    ],
)
def test_aggregate_type(function: str, field: str | None, expected: FieldType) -> None:
    agg: dict[str, Any] = {"name": "out", "function": function}
    if field is not None:
        agg["field"] = field
    pipeline = _pipeline([agg])
    assert aggregate_type(pipeline.aggregations[0], pipeline) == expected


def test_aggregate_type_string_forms() -> None:
    assert str(FieldType("decimal", 22, 2)) == "decimal(22,2)"
    assert str(FieldType("long")) == "long"


def test_aggregate_table_schema_of_the_repository_spec() -> None:
    pipeline = load_spec(REPO_SPEC, env={}).pipeline()
    schema = aggregate_table_schema(pipeline)

    assert [f.name for f in schema.fields] == ["window_start", "window_end", "order_count", "amount_total"]
    assert [f.field_id for f in schema.fields] == [1, 2, 3, 4]
    assert schema.find_field("window_start").field_type == TimestamptzType()
    assert schema.find_field("window_start").required
    assert schema.find_field("window_end").field_type == TimestamptzType()
    assert schema.find_field("order_count").field_type == LongType()
    assert schema.find_field("amount_total").field_type == DecimalType(22, 2)
    assert schema.identifier_field_ids == [1]


def test_aggregate_table_schema_min_max_avg() -> None:
    pipeline = _pipeline(
        [
            {"name": "amount_min", "function": "min", "field": "amount"},
            {"name": "amount_max", "function": "max", "field": "amount"},
            {"name": "amount_avg", "function": "avg", "field": "amount"},
        ]
    )
    schema = aggregate_table_schema(pipeline)
    assert schema.find_field("amount_min").field_type == DecimalType(12, 2)
    assert schema.find_field("amount_max").field_type == DecimalType(12, 2)
    assert schema.find_field("amount_avg").field_type == DecimalType(16, 6)


# ------------------------------------------------------------------------------------------- pipeline kinds

KIND_FIELDS = {
    "order_id": "string",
    "customer_id": "string",
    "region": {"type": "string", "required": False},
    "amount": "decimal(12,2)",
    "price": "double",
    "quantity": "long",
    "small": "int",
    "paid": "boolean",
    "deleted": "boolean",
    "event_time": "timestamp_ms",
}


def _kind_doc(kind: str, **keys: Any) -> dict[str, Any]:
    """A one-pipeline document of ``kind`` (``events`` or ``upsert``) over :data:`KIND_FIELDS`."""
    pipeline: dict[str, Any] = {"name": "orders", "kind": kind, "topic": "orders", "fields": dict(KIND_FIELDS)}
    if kind == "upsert":
        pipeline["key"] = ["order_id"]
    pipeline.update(keys)
    return {"pipelines": [pipeline]}


def _windowed(**keys: Any) -> dict[str, Any]:
    return _doc(fields=dict(KIND_FIELDS), **keys)


def _one_refusal(doc: dict[str, Any], field: str, *fragments: str) -> ConfigError:
    """The document is refused with ONE ConfigError, naming ``field`` and every fragment, on one line."""
    error = _config_error(doc)
    _assert_names_field(error, field, *fragments)
    assert "\n" not in str(error), str(error)
    assert error.__cause__ is None and error.__context__ is None, "one error, not one raised while handling another"
    return error


def _parse(doc: dict[str, Any]) -> PipelineSpec:
    return parse_spec(doc, env={}).pipeline()


# windowed ------------------------------------------------------------------------------------------------------


def test_windowed_is_the_default_kind_with_its_defaults() -> None:
    p = _parse(_doc())
    assert p.kind == "windowed"
    assert (p.slide_ms, p.window_slide_ms, p.group_by, p.output_mode, p.partition_by) == (
        None,
        60_000,
        (),
        "append",
        (),
    )
    assert (p.kafka_metadata, p.routes, p.route_by, p.key, p.version_field, p.delete_field) == (
        (),
        (),
        None,
        (),
        None,
        None,
    )
    assert _parse(_doc(kind="windowed")) == p


def test_hopping_window_slide_and_group_by() -> None:
    p = _parse(_windowed(window="1m", slide="15s", group_by=["customer_id", "paid"], output_mode="update"))
    assert (p.window_ms, p.slide_ms, p.window_slide_ms) == (60_000, 15_000, 15_000)
    assert p.group_by == ("customer_id", "paid")
    assert p.output_mode == "update"
    assert p.tables == ("orders_per_minute",)


def test_group_by_may_be_one_name() -> None:
    assert _parse(_windowed(group_by="customer_id")).group_by == ("customer_id",)


def test_slide_equal_to_the_window_is_a_tumbling_window() -> None:
    p = _parse(_windowed(window="2m", slide=120_000))
    assert (p.slide_ms, p.window_slide_ms) == (None, 120_000)


@pytest.mark.parametrize(
    ("slide", "fragments"),
    [
        ("25s", ("60000 ms", "25000 ms", "divides")),
        ("2m", ("60000 ms", "120000 ms")),
        ("7 fortnights", ("'7 fortnights'", "duration")),
        (0, ("positive",)),
    ],
)
def test_bad_slide(slide: object, fragments: tuple[str, ...]) -> None:
    _one_refusal(_windowed(slide=slide), "pipelines[0].slide", *fragments)


def test_slide_is_checked_against_the_declared_window() -> None:
    _one_refusal(_windowed(window="90s", slide="1m"), "pipelines[0].slide", "90000 ms", "60000 ms")
    assert _parse(_windowed(window="90s", slide="30s")).slide_ms == 30_000


@pytest.mark.parametrize(
    ("group_by", "field", "fragments"),
    [
        (["customer_id", "shop"], "pipelines[0].group_by[1]", ("'shop'", "customer_id")),
        (["customer_id", "customer_id"], "pipelines[0].group_by", ("named twice", "customer_id")),
        (["region"], "pipelines[0].group_by[0]", ("required", "region is optional")),
        (["order_id", "price"], "pipelines[0].group_by[1]", ("not a double", "price is double")),
        (5, "pipelines[0].group_by", ("a list of event fields", "5")),
    ],
)
def test_bad_group_by(group_by: object, field: str, fragments: tuple[str, ...]) -> None:
    _one_refusal(_windowed(group_by=group_by), field, *fragments)


def test_group_by_field_that_is_also_an_aggregation_output() -> None:
    aggs = [{"name": "customer_id", "function": "count"}]
    _one_refusal(
        _windowed(group_by=["customer_id"], aggregations=aggs),
        "pipelines[0].aggregations",
        "['customer_id']",
        "group-by",
    )


@pytest.mark.parametrize("mode", ["complete", "Append", 1])
def test_bad_output_mode(mode: object) -> None:
    _one_refusal(_windowed(output_mode=mode), "pipelines[0].output_mode", repr(mode), "append", "update")


def test_windowed_needs_aggregations() -> None:
    doc = _windowed()
    del doc["pipelines"][0]["aggregations"]
    _one_refusal(doc, "pipelines[0].aggregations", "a list of {name, function, field}", "None")
    _one_refusal(_windowed(aggregations=[]), "pipelines[0].aggregations", "at least one aggregation")


def test_windowed_needs_an_event_time_field() -> None:
    doc = _windowed()
    del doc["pipelines"][0]["event_time_field"]
    _one_refusal(doc, "pipelines[0].event_time_field", "None", "event_time")


def test_windowed_partition_by_names_the_window_and_group_columns_only() -> None:
    p = _parse(_windowed(group_by=["customer_id"], partition_by=["day(window_start)", "bucket(4, customer_id)"]))
    assert [str(f) for f in p.partition_by] == ["day(window_start)", "bucket(4, customer_id)"]
    # An event field that is not a group-by field, or an aggregation, is not a column of the windowed table.
    for column in ("quantity", "order_count"):
        _one_refusal(
            _windowed(group_by=["customer_id"], partition_by=[column]),
            "pipelines[0].partition_by[0]",
            f"unknown column {column!r}",
            "window_start, window_end, customer_id",
        )


# kind-specific keys --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "key", "value"),
    [
        ("windowed", "kafka_metadata", True),
        ("windowed", "route_by", "customer_id"),
        ("windowed", "key", ["order_id"]),
        ("events", "slide", "30s"),
        ("events", "group_by", ["customer_id"]),
        ("events", "output_mode", "update"),
        ("events", "aggregations", [{"name": "n", "function": "count"}]),
        ("events", "watermark_delay", "5s"),
        ("events", "window", "1m"),
        ("events", "key", ["order_id"]),
        ("events", "version_field", "quantity"),
        ("upsert", "route_by", "customer_id"),
        ("upsert", "routes", {"a": "t"}),
        ("upsert", "unrouted", "t"),
        ("upsert", "slide", "30s"),
        ("upsert", "group_by", ["customer_id"]),
        ("upsert", "aggregations", [{"name": "n", "function": "count"}]),
    ],
)
def test_a_key_of_another_kind_is_refused(kind: str, key: str, value: object) -> None:
    doc = _windowed(**{key: value}) if kind == "windowed" else _kind_doc(kind, **{key: value})
    error = _one_refusal(doc, "pipelines[0]", f"unknown keys [{key!r}]", kind, "expected some of")
    expected = str(error).split("expected some of ", 1)[1]
    assert repr(key) not in expected and "partition_by" in expected and "fields" in expected


@pytest.mark.parametrize("kind", ["stream", "Events", None])
def test_unknown_kind(kind: object) -> None:
    _one_refusal(_doc(kind=kind), "pipelines[0].kind", repr(kind), "windowed", "events", "upsert")


# events --------------------------------------------------------------------------------------------------------


def test_events_defaults() -> None:
    p = _parse(_kind_doc("events"))
    assert (p.kind, p.table, p.event_time_field, p.kafka_metadata, p.metadata_columns) == (
        "events",
        "orders",
        None,
        (),
        (),
    )
    assert (p.route_by, p.routes, p.unrouted, p.aggregations, p.group_by) == (None, (), "rejects", (), ())
    assert (p.tables, p.all_tables) == (("orders",), ("orders", "orders_rejects"))


def test_events_event_time_field_is_optional_but_checked() -> None:
    assert _parse(_kind_doc("events", event_time_field="event_time")).event_time_field == "event_time"
    _one_refusal(
        _kind_doc("events", event_time_field="quantity"),
        "pipelines[0].event_time_field",
        "timestamp",
        "quantity is long",
    )


@pytest.mark.parametrize(
    ("value", "chosen"),
    [
        (True, ("topic", "partition", "offset", "timestamp", "key")),
        (False, ()),
        ([], ()),
        (["offset", "partition"], ("partition", "offset")),  # in the columns' own order
        (["key"], ("key",)),
    ],
)
def test_kafka_metadata(value: object, chosen: tuple[str, ...]) -> None:
    for kind in ("events", "upsert"):
        p = _parse(_kind_doc(kind, kafka_metadata=value))
        assert p.kafka_metadata == chosen
        assert p.metadata_columns == tuple(f"_kafka_{m}" for m in chosen)


@pytest.mark.parametrize(
    ("value", "field", "fragments"),
    [
        ("offset", "pipelines[0].kafka_metadata", ("true or a list of", "'offset'", "'partition'")),
        (1, "pipelines[0].kafka_metadata", ("true or a list of", "1")),
        (["offset", "headers"], "pipelines[0].kafka_metadata[1]", ("'headers'", "'timestamp'")),
        (["Offset"], "pipelines[0].kafka_metadata[0]", ("'Offset'",)),
    ],
)
def test_bad_kafka_metadata(value: object, field: str, fragments: tuple[str, ...]) -> None:
    _one_refusal(_kind_doc("events", kafka_metadata=value), field, *fragments)


def test_kafka_metadata_column_clashing_with_an_event_field() -> None:
    fields = {**KIND_FIELDS, "_kafka_offset": "long"}
    _one_refusal(
        _kind_doc("events", fields=fields, kafka_metadata=True),
        "pipelines[0].kafka_metadata",
        "['_kafka_offset']",
        "clash",
    )
    # Without that metadata column the field is an ordinary field.
    assert _parse(_kind_doc("events", fields=fields, kafka_metadata=["partition"])).kafka_metadata == ("partition",)


def test_partition_by_a_kafka_metadata_column() -> None:
    p = _parse(
        _kind_doc(
            "events",
            kafka_metadata=["partition", "timestamp"],
            partition_by=["_kafka_partition", "hour(_kafka_timestamp)"],
        )
    )
    assert [str(f) for f in p.partition_by] == ["_kafka_partition", "hour(_kafka_timestamp)"]
    _one_refusal(
        _kind_doc("events", partition_by=["_kafka_partition"]),
        "pipelines[0].partition_by[0]",
        "unknown column '_kafka_partition'",
    )
    _one_refusal(
        _kind_doc("events", kafka_metadata=["key"], partition_by=["bucket(4, _kafka_key)"]),
        "pipelines[0].partition_by[0]",
        "'_kafka_key' is binary",
    )


def test_events_partition_by_any_event_field() -> None:
    p = _parse(_kind_doc("events", partition_by=["day(event_time)", "truncate(2, customer_id)", "region"]))
    assert [f.name for f in p.partition_by] == ["event_time_day", "customer_id_trunc", "region"]


def test_fan_out_routes_and_tables() -> None:
    p = _parse(
        _kind_doc(
            "events",
            route_by="customer_id",
            routes={"c-001": "orders_a", "c-002": "orders_b", "c-003": "orders_a"},
            unrouted="orders_other",
        )
    )
    assert p.route_by == "customer_id"
    assert p.routes == (Route("c-001", "orders_a"), Route("c-002", "orders_b"), Route("c-003", "orders_a"))
    assert p.unrouted == "orders_other"
    assert p.tables == ("orders_a", "orders_b", "orders_other")  # each once, in order, the default last
    assert p.all_tables == ("orders_a", "orders_b", "orders_other", "orders_rejects")
    assert p.rejects_table == "orders_rejects"


def test_fan_out_without_a_default_table_rejects_unrouted_events() -> None:
    p = _parse(_kind_doc("events", route_by="paid", routes={"true": "paid_orders"}))
    assert p.unrouted == "rejects"
    assert (p.tables, p.all_tables) == (("paid_orders",), ("paid_orders", "orders_rejects"))


def test_fan_out_default_table_that_is_also_a_route_is_listed_once() -> None:
    p = _parse(_kind_doc("events", route_by="quantity", routes={"1": "one", "2": "many"}, unrouted="many"))
    assert p.tables == ("one", "many")


@pytest.mark.parametrize("key", ["routes", "unrouted"])
def test_routes_need_route_by(key: str) -> None:
    value = {"a": "t"} if key == "routes" else "t"
    _one_refusal(_kind_doc("events", **{key: value}), f"pipelines[0].{key}", "route_by")


@pytest.mark.parametrize(
    ("route_by", "fragments"),
    [
        ("shop", ("'shop'", "customer_id")),
        ("price", ("string or long or int or boolean", "price is double")),
        ("amount", ("amount is decimal(12,2)",)),
        ("event_time", ("event_time is timestamp_ms",)),
    ],
)
def test_bad_route_by(route_by: str, fragments: tuple[str, ...]) -> None:
    _one_refusal(_kind_doc("events", route_by=route_by, routes={"a": "t"}), "pipelines[0].route_by", *fragments)


@pytest.mark.parametrize(
    ("keys", "field", "fragments"),
    [
        ({}, "pipelines[0].routes", ("a table of field value = table name", "None")),
        ({"routes": {}}, "pipelines[0].routes", ("at least one route",)),
        ({"routes": ["orders_a"]}, "pipelines[0].routes", ("a table of field value = table name", "['orders_a']")),
        ({"routes": {"c-001": "orders a"}}, "pipelines[0].routes.c-001", ("'orders a'", "letters, digits")),
        ({"routes": {"c-001": 7}}, "pipelines[0].routes.c-001", ("a name", "7")),
        ({"routes": {"c-001": "t"}, "unrouted": "other table"}, "pipelines[0].unrouted", ("'other table'",)),
        ({"routes": {"c-001": "t"}, "unrouted": False}, "pipelines[0].unrouted", ("a name", "False")),
    ],
)
def test_bad_routes(keys: dict[str, Any], field: str, fragments: tuple[str, ...]) -> None:
    _one_refusal(_kind_doc("events", route_by="customer_id", **keys), field, *fragments)


# upsert --------------------------------------------------------------------------------------------------------


def test_upsert_keys() -> None:
    p = _parse(
        _kind_doc(
            "upsert",
            key=["customer_id", "order_id"],
            version_field="event_time",
            delete_field="deleted",
            kafka_metadata=["offset"],
            partition_by=["bucket(8, customer_id)"],
        )
    )
    assert (p.kind, p.key, p.version_field, p.delete_field) == (
        "upsert",
        ("customer_id", "order_id"),
        "event_time",
        "deleted",
    )
    assert p.metadata_columns == ("_kafka_offset",)
    assert (p.tables, p.all_tables) == (("orders",), ("orders", "orders_rejects"))
    assert _parse(_kind_doc("upsert", key="order_id")).key == ("order_id",)
    assert (_parse(_kind_doc("upsert")).version_field, _parse(_kind_doc("upsert")).delete_field) == (None, None)


@pytest.mark.parametrize("version", ["quantity", "small", "event_time", "amount"])
def test_upsert_version_field_types(version: str) -> None:
    assert _parse(_kind_doc("upsert", version_field=version)).version_field == version


def test_upsert_needs_a_key() -> None:
    doc = _kind_doc("upsert")
    del doc["pipelines"][0]["key"]
    _one_refusal(doc, "pipelines[0].key", "key = [field, ...]")


@pytest.mark.parametrize(
    ("key", "field", "fragments"),
    [
        ([], "pipelines[0].key", ("at least one key field",)),
        (["order_id", "shop"], "pipelines[0].key[1]", ("'shop'", "order_id")),
        (["order_id", "order_id"], "pipelines[0].key", ("named twice",)),
        (["region"], "pipelines[0].key[0]", ("required", "region is optional")),
        (["price"], "pipelines[0].key[0]", ("not a double", "price is double")),
        ({"order_id": True}, "pipelines[0].key", ("a list of event fields",)),
    ],
)
def test_bad_upsert_key(key: object, field: str, fragments: tuple[str, ...]) -> None:
    _one_refusal(_kind_doc("upsert", key=key), field, *fragments)


@pytest.mark.parametrize(
    ("keys", "field", "fragments"),
    [
        (
            {"version_field": "customer_id"},
            "pipelines[0].version_field",
            ("long or int or timestamp_ms", "customer_id is string"),
        ),
        ({"version_field": "price"}, "pipelines[0].version_field", ("price is double",)),
        ({"version_field": "seq"}, "pipelines[0].version_field", ("'seq'", "quantity")),
        ({"delete_field": "quantity"}, "pipelines[0].delete_field", ("boolean", "quantity is long")),
        ({"delete_field": "gone"}, "pipelines[0].delete_field", ("'gone'",)),
    ],
)
def test_bad_upsert_version_and_delete_fields(keys: dict[str, Any], field: str, fragments: tuple[str, ...]) -> None:
    _one_refusal(_kind_doc("upsert", **keys), field, *fragments)


def test_upsert_partition_by_checks_event_fields_and_metadata() -> None:
    _one_refusal(
        _kind_doc("upsert", partition_by=["day(order_id)"]), "pipelines[0].partition_by[0]", "order_id", "string"
    )
    p = _parse(_kind_doc("upsert", kafka_metadata=["timestamp"], partition_by=["day(_kafka_timestamp)"]))
    assert [str(f) for f in p.partition_by] == ["day(_kafka_timestamp)"]


# one pipeline per table ------------------------------------------------------------------------------------------


def _two(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    return {"pipelines": [first["pipelines"][0], second["pipelines"][0]]}


@pytest.mark.parametrize(
    ("second", "tables"),
    [
        # a route's table is another pipeline's table
        ({"name": "raw", "table": "orders_a"}, ["orders_a"]),
        # the default table of a fan-out is another pipeline's table
        ({"name": "raw", "table": "orders_other"}, ["orders_other"]),
        # another pipeline's table is this fan-out's rejects table
        ({"name": "raw", "table": "orders_rejects"}, ["orders_rejects"]),
        # two pipelines share a rejects table, their row tables differing
        (
            {"name": "raw", "table": "orders", "route_by": "customer_id", "routes": {"x": "elsewhere"}},
            ["orders_rejects"],
        ),
    ],
)
def test_each_table_is_written_by_one_pipeline_only(second: dict[str, Any], tables: list[str]) -> None:
    fan_out = _kind_doc(
        "events", route_by="customer_id", routes={"c-001": "orders_a", "c-002": "orders_b"}, unrouted="orders_other"
    )
    doc = _two(fan_out, _kind_doc("events", **second))
    _one_refusal(doc, "pipelines.table", "each table is written by one pipeline only", repr(tables))


def test_a_route_may_not_be_its_own_pipelines_rejects_table() -> None:
    _one_refusal(
        _kind_doc("events", route_by="customer_id", routes={"c-001": "orders_rejects"}),
        "pipelines.table",
        "['orders_rejects']",
    )
    _one_refusal(
        _kind_doc("events", route_by="customer_id", routes={"c-001": "a"}, unrouted="orders_rejects"),
        "pipelines.table",
        "['orders_rejects']",
    )


def test_pipelines_of_every_kind_on_their_own_tables() -> None:
    doc = {
        "pipelines": [
            _windowed(name="per_minute", table="per_minute")["pipelines"][0],
            _kind_doc("events", name="raw", table="raw")["pipelines"][0],
            _kind_doc("events", name="routed", route_by="customer_id", routes={"a": "ra"}, unrouted="rb")["pipelines"][
                0
            ],
            _kind_doc("upsert", name="latest", table="latest")["pipelines"][0],
        ]
    }
    spec = parse_spec(doc, env={})
    assert [p.all_tables for p in spec.pipelines] == [
        ("per_minute", "per_minute_rejects"),
        ("raw", "raw_rejects"),
        ("ra", "rb", "routed_rejects"),
        ("latest", "latest_rejects"),
    ]


# field names and route values --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        (_windowed(group_by=[["customer_id"]]), "pipelines[0].group_by[0]"),
        (_kind_doc("upsert", key=[{"order_id": 1}]), "pipelines[0].key[0]"),
        (_kind_doc("events", route_by=["customer_id"], routes={"a": "t"}), "pipelines[0].route_by"),
        (_kind_doc("upsert", version_field=["quantity"]), "pipelines[0].version_field"),
        (_kind_doc("upsert", delete_field={"deleted": True}), "pipelines[0].delete_field"),
        (_kind_doc("events", event_time_field=["event_time"]), "pipelines[0].event_time_field"),
    ],
)
def test_a_field_name_that_is_not_a_string_is_a_config_error(doc: dict[str, Any], field: str) -> None:
    _one_refusal(doc, field, "expected")


@pytest.mark.parametrize(
    ("route_by", "value"),
    [("quantity", "01"), ("quantity", "abc"), ("small", "1.0"), ("paid", "True"), ("paid", "yes")],
)
def test_a_route_value_route_by_can_never_hold_is_refused(route_by: str, value: str) -> None:
    """Spark compares ``cast(route_by as string)`` with the value: a long is "1", a boolean "true"; "01" or "True"
    never match, so every such event would silently go to the default table or the rejects."""
    _one_refusal(_kind_doc("events", route_by=route_by, routes={value: "t"}), f"pipelines[0].routes.{value}", value)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("checkpoint_location", "s3://bucket/checkpoints", "not a s3:// URI: Spark's checkpoint needs"),
        ("checkpoint_location", "s3a://bucket/checkpoints", "not a s3a:// URI: Spark's checkpoint needs"),
        ("ledger_path", "s3://bucket/ledger.duckdb", "not a s3:// URI: the ledger is a DuckDB file"),
        ("ledger_path", "mysql://db/ledger", "or postgresql://…, not a mysql:// URI: the ledger is a DuckDB file"),
        ("checkpoint_location", "file:///var/lib/krishiv/checkpoints", "write the path itself (/var/lib/krishiv/"),
    ],
)
def test_checkpoint_and_ledger_stay_on_a_filesystem(key: str, value: str, expected: str) -> None:
    import tomllib

    raw = tomllib.loads(MINIMAL_TOML)
    raw["storage"][key] = value
    with pytest.raises(ConfigError, match=re.escape(f"storage.{key}: expected a path") + ".*" + re.escape(expected)):
        parse_spec(raw, env={})


@pytest.mark.parametrize(
    ("value", "location", "on_server"),
    [
        ("state/ledger.duckdb", "{base}/state/ledger.duckdb", False),
        ("duckdb:///var/lib/krishiv/ledger.duckdb", "/var/lib/krishiv/ledger.duckdb", False),
        ("duckdb://state/ledger.duckdb", "{base}/state/ledger.duckdb", False),
        ("postgresql://app@db:5432/platform?schema=krishiv", "postgresql://app@db:5432/platform?schema=krishiv", True),
        ("postgresql+psycopg://app@db/platform", "postgresql+psycopg://app@db/platform", True),
    ],
)
def test_the_ledger_is_a_duckdb_file_or_a_postgresql_uri(
    tmp_path: Path, value: str, location: str, on_server: bool
) -> None:
    """A path and duckdb:// are files relative to the spec's folder; a PostgreSQL URI is kept as written."""
    import tomllib

    raw = tomllib.loads(MINIMAL_TOML)
    raw["storage"]["ledger_path"] = value
    spec = parse_spec(raw, env={}, base_dir=tmp_path)
    assert spec.ledger_location() == location.format(base=tmp_path)
    assert spec.ledger_on_server is on_server
    via_env = parse_spec(tomllib.loads(MINIMAL_TOML), env={"KRISHIV_LEDGER_PATH": value}, base_dir=tmp_path)
    assert via_env.ledger_location() == location.format(base=tmp_path)


# ------------------------------------------------------------------------------------------- [maintenance]


def test_maintenance_defaults() -> None:
    m = parse_spec(_doc(), env={}).maintenance
    assert m == MaintenanceSettings()
    assert (m.enabled, m.schedule, m.keep_last, m.min_files) == (True, "0 * * * *", 100, 5)
    assert (m.keep_younger_than_ms, m.orphan_grace_ms, m.target_file_size) == (900_000, 86_400_000, 128 << 20)


def test_maintenance_section_read() -> None:
    doc = _doc()
    doc["maintenance"] = {
        "enabled": False,
        "schedule": "*/10  *  * * *",
        "keep_last": 7,
        "keep_younger_than": "90s",
        "orphan_grace": "7d",
        "target_file_size": "64MiB",
        "min_files": 3,
    }
    m = parse_spec(doc, env={}).maintenance
    assert m == MaintenanceSettings(False, "*/10 * * * *", 7, 90_000, 7 * 86_400_000, 64 << 20, 3)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("keep_last", 0, "expected a positive whole number"),
        ("keep_younger_than", "15 minutes", "expected a duration like"),
        ("orphan_grace", "5m", "expected at least 10m"),
        ("target_file_size", "big", "expected a size like '128MiB'"),
        ("min_files", "two", "expected"),
        ("min_files", 1, "expected at least 2"),
        ("schedule", "hourly", "expected a cron string of five fields"),
        ("enabled", "yes", "expected true or false"),
        ("compact", True, "unknown keys ['compact']"),
    ],
)
def test_bad_maintenance_value_names_its_key(key: str, value: object, expected: str) -> None:
    doc = _doc()
    doc["maintenance"] = {key: value}
    with pytest.raises(ConfigError) as err:
        parse_spec(doc, env={})
    assert err.value.field == ("maintenance" if key == "compact" else f"maintenance.{key}")
    assert expected in str(err.value)


@pytest.mark.parametrize(
    ("value", "size"), [("128MiB", 128 << 20), ("1GB", 10**9), ("512 KiB", 512 << 10), (4096, 4096)]
)
def test_parse_size(value: object, size: int) -> None:
    assert parse_size_bytes(value, "x") == size


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        ({"kafak": {}}, "spec: unknown sections ['kafak']; did you mean 'kafka' (for 'kafak')?"),
        ({"kafka": {"bootstrap_server": "x:1"}}, "did you mean 'bootstrap_servers' (for 'bootstrap_server')?"),
    ],
)
def test_a_misspelled_key_or_section_is_named_with_the_one_meant(doc: dict, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_spec(doc, env={})
    assert str(refused.value).endswith(said)


def test_a_misspelled_pipeline_key_is_matched_against_every_kinds_keys() -> None:
    doc = _kind_doc("events", formt="avro")
    with pytest.raises(ConfigError, match=r"did you mean 'format' \(for 'formt'\)\?$"):
        parse_spec(doc, env={})
    doc = _kind_doc("events", key=["order_id"])  # another kind's key: no guess
    with pytest.raises(ConfigError) as refused:
        parse_spec(doc, env={})
    assert "did you mean" not in str(refused.value)
