"""Property tables of the spec: secrets only from the environment, resolved only when a client is built."""

from __future__ import annotations

import pytest

from krishiv_core.client_settings import parse_properties, resolve, shown
from krishiv_core.errors import ConfigError
from krishiv_core.spec import parse_spec

PIPELINE = {
    "name": "p",
    "topic": "t",
    "table": "t_out",
    "event_time_field": "ts",
    "fields": {"ts": "timestamp_ms"},
    "aggregations": [{"name": "n", "function": "count"}],
}


def test_a_secret_comes_from_the_environment_and_is_resolved_only_when_asked() -> None:
    raw = {"token": "${ICEBERG_TOKEN}", "prefix": "main", "header.X-Tenant": "a-$${literal}"}
    properties = parse_properties(raw, "iceberg.properties", {"ICEBERG_TOKEN": "s3cr3t"})
    assert properties["token"] == "${ICEBERG_TOKEN}"  # the spec never holds the value
    resolved = resolve(properties, {"ICEBERG_TOKEN": "s3cr3t"}, "iceberg.properties")
    assert resolved == {"token": "s3cr3t", "prefix": "main", "header.X-Tenant": "a-${literal}"}
    assert shown({"token": "s3cr3t", "prefix": "main"}) == {"token": "***", "prefix": "main"}


@pytest.mark.parametrize(
    ("raw", "env", "message"),
    [
        ({"token": "abc"}, {}, "iceberg.properties.token: holds a secret: write it as ${SOME_VARIABLE}"),
        ({"s3": {"secret-access-key": "abc"}}, {}, "iceberg.properties.s3.secret-access-key: holds a secret"),
        ({"credential": "${MISSING}"}, {}, "iceberg.properties.credential: environment variable MISSING is not set"),
        ({"prefix": "${oops"}, {}, "iceberg.properties.prefix: expected ${NAME}"),
        ({"prefix": ["a"]}, {}, "iceberg.properties.prefix: expected a string, number or boolean, got list"),
    ],
)
def test_bad_properties_are_one_line_naming_the_property(raw: dict, env: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_properties(raw, "iceberg.properties", env)
    assert str(caught.value).startswith(message)
    assert "abc" not in str(caught.value)


def test_the_spec_takes_catalog_kafka_and_spark_properties() -> None:
    env = {"KAFKA_PASSWORD": "pw", "S3_SECRET": "sk"}
    spec = parse_spec(
        {
            "kafka": {"properties": {"security": {"protocol": "SASL_PLAINTEXT"}, "sasl.password": "${KAFKA_PASSWORD}"}},
            "iceberg": {"properties": {"s3.endpoint": "http://127.0.0.1:9000", "s3.secret-access-key": "${S3_SECRET}"}},
            "spark": {"master": "spark://127.0.0.1:7077", "conf": {"spark.executor.memory": "1g"}},
            "pipelines": [PIPELINE],
        },
        env,
    )
    assert spec.kafka.client_settings(env) == {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.password": "pw",
        "bootstrap.servers": "127.0.0.1:9092",
    }
    assert spec.kafka.consumer_settings(env)["sasl.password"] == "pw"
    assert spec.iceberg.properties["s3.secret-access-key"] == "${S3_SECRET}"
    assert spec.spark.resolved_conf(env) == {"spark.executor.memory": "1g"}


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"spark": {"conf": {"spark.master": "local[2]"}}}, "spark.conf.spark.master: set spark.master instead"),
        ({"spark": {"conf": {"executor.memory": "1g"}}}, "spark.conf.executor.memory: expected a Spark setting"),
        ({"kafka": {"properties": {"isolation.level": "x"}}}, "kafka.properties.isolation.level: a consumer setting"),
        ({"iceberg": {"properties": {"uri": "http://x"}}}, "iceberg.properties.uri: set iceberg.catalog_uri"),
    ],
)
def test_settings_krishiv_owns_are_refused(section: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_spec({**section, "pipelines": [PIPELINE]}, {})
    assert str(caught.value).startswith(message)
