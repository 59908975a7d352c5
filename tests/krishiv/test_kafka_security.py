"""Kafka as deployed: every client Krishiv builds takes the spec's ``[kafka.properties]`` (SASL, TLS), the password
from the environment; a refused client is one line naming the broker and the cause, the password never in it.

Through real listeners (:mod:`tests.services.secured_broker`): a SASL_SSL listener (TLS + SCRAM-SHA-512) in front
of Tansu for the whole pipeline, and Tansu's own ``--authentication`` listener for the refusals.
"""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path

import pytest

import chaos.oracle
from chaos.workspace import SPEC_TEMPLATE
from krishiv.operations import open_ledger, run_pipelines
from krishiv.preflight import check_broker
from krishiv.produce import demo_orders, ensure_topic, produce
from krishiv.query_supervisor import RunClients
from krishiv_assets.resources import KafkaResource
from krishiv_core.catalog import qualified
from krishiv_core.errors import BrokerUnavailable, ConfigError
from krishiv_core.spec import KrishivSpec, load_spec
from spark_jobs.errors import KafkaSourceError
from spark_jobs.kafka_source import latest_offsets
from tests.services.secured_broker import PASSWORD_ENV, SaslTansu, SecuredBroker
from tests.spark_jobs.pipeline_helpers import assert_exactly_once

RECORDS = 400
#: A refusal must be told this fast (the broker answers it at once; librdkafka used to retry for 15 s).
REFUSED_WITHIN_S = 5.0


def secured_spec(tmp_path: Path, bootstrap: str, topic: str, properties: str) -> KrishivSpec:
    values = {
        "bootstrap": bootstrap,
        "partitions": 2,
        "catalog_uri": "sqlite:///catalog.db",
        "warehouse": "warehouse",
        "topic": topic,
        "max_records": 2_000,  # one batch: the batches themselves are the other tests' subject
    }
    path = tmp_path / "krishiv.toml"
    path.write_text(SPEC_TEMPLATE.format(**values) + properties)
    return load_spec(path, env=os.environ)


def test_produce_and_the_spark_source_read_through_sasl_ssl_exactly_once(
    secured_broker: SecuredBroker, spark, tmp_path: Path, topic: str, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    spec = secured_spec(tmp_path, secured_broker.bootstrap, topic, secured_broker.toml())
    assert "${" + PASSWORD_ENV + "}" in (tmp_path / "krishiv.toml").read_text(), "the spec holds a reference only"
    check_broker(spec)
    settings = spec.kafka.client_settings()
    partitions = ensure_topic(spec.kafka.bootstrap_servers, topic, spec.kafka.partitions, settings=settings)
    produce(
        spec.kafka.bootstrap_servers, topic, demo_orders(RECORDS, partitions=partitions, malformed=6), settings=settings
    )

    pipeline = spec.pipeline()
    run_pipelines(spec, [pipeline], once=True, clients=RunClients(spark=spark))
    latest = latest_offsets(spec.kafka.bootstrap_servers, topic, spec.kafka.consumer_settings())
    assert sum(latest.values()) >= RECORDS
    staged = open_ledger(spec).end_offsets(qualified(spec, pipeline.table), topic)
    assert staged == latest, "every offset was read through the secured listener, and staged once"
    # The Dagster sensor asks through its resource with the same settings; the resource holds the address only.
    resource = KafkaResource(bootstrap_servers=spec.kafka.bootstrap_servers)
    assert resource.latest_offsets(topic, spec.kafka.consumer_settings()) == latest
    assert os.environ[PASSWORD_ENV] not in repr(resource)

    # The oracle reads the topic on its own, through the same listener (it knows no security settings itself).
    plain_consumer = chaos.oracle.Consumer
    monkeypatch.setattr(chaos.oracle, "Consumer", lambda config: plain_consumer({**config, **settings}))
    expected = assert_exactly_once(spec)
    assert expected.valid_events == RECORDS - 6
    assert os.environ[PASSWORD_ENV] not in capfd.readouterr().err


def test_a_wrong_password_is_one_line_naming_the_broker_and_never_the_password(
    secured_broker: SecuredBroker, sasl_tansu: SaslTansu, tmp_path: Path, topic: str, monkeypatch, capfd
) -> None:
    wrong = "not-the-password-4711"
    monkeypatch.setenv(PASSWORD_ENV, wrong)
    for bootstrap, properties in (
        (secured_broker.bootstrap, secured_broker.toml()),
        (sasl_tansu.bootstrap, SASL_PLAINTEXT.format(variable=PASSWORD_ENV)),
    ):
        spec = secured_spec(tmp_path, bootstrap, topic, properties)
        attempts = (
            partial(check_broker, spec),
            partial(ensure_topic, bootstrap, topic, 2, settings=spec.kafka.client_settings()),
            partial(latest_offsets, bootstrap, topic, spec.kafka.consumer_settings()),
        )
        for attempt in attempts:
            started = time.monotonic()
            with pytest.raises((BrokerUnavailable, KafkaSourceError)) as refused:
                attempt()
            message = str(refused.value)
            assert time.monotonic() - started < REFUSED_WITHIN_S, message
            assert f"Kafka broker at {bootstrap}" in message and "authentication failed" in message, message
            assert "\n" not in message and wrong not in message
    assert capfd.readouterr().err == "", "librdkafka printed nothing"


SASL_PLAINTEXT = """
[kafka.properties]
"security.protocol" = "SASL_PLAINTEXT"
"sasl.mechanism" = "SCRAM-SHA-512"
"sasl.username" = "krishiv"
"sasl.password" = "${{{variable}}}"
"""


def test_a_plaintext_client_of_a_sasl_listener_is_one_line(sasl_tansu: SaslTansu, tmp_path, topic, capfd) -> None:
    spec = secured_spec(tmp_path, sasl_tansu.bootstrap, topic, "")
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable, match=r"closed the connection .*security\.protocol") as refused:
        check_broker(spec)
    assert time.monotonic() - started < REFUSED_WITHIN_S
    assert f"Kafka broker at {sasl_tansu.bootstrap}" in str(refused.value)
    with pytest.raises(KafkaSourceError, match="closed the connection"):
        latest_offsets(sasl_tansu.bootstrap, topic, spec.kafka.consumer_settings())
    assert capfd.readouterr().err == ""


def test_a_plaintext_client_of_a_tls_listener_is_told_to_check_the_protocol(
    secured_broker: SecuredBroker, tmp_path, topic
) -> None:
    spec = secured_spec(tmp_path, secured_broker.bootstrap, topic, "")
    with pytest.raises(BrokerUnavailable, match=r"accepts connections but no Kafka answer came within 2s .*TLS"):
        check_broker(spec, timeout_s=2.0)


def test_a_client_without_the_certificate_authority_is_told_the_tls_handshake_failed(
    secured_broker: SecuredBroker, tmp_path, topic
) -> None:
    properties = secured_broker.toml().replace(f'"ssl.ca.location" = "{secured_broker.ca_location}"\n', "")
    spec = secured_spec(tmp_path, secured_broker.bootstrap, topic, properties)
    with pytest.raises(BrokerUnavailable, match=r"TLS handshake failed .*certificate verify failed"):
        check_broker(spec)


def test_a_password_variable_unset_when_the_client_is_built_is_a_config_error(
    secured_broker: SecuredBroker, tmp_path, topic, monkeypatch
) -> None:
    spec = secured_spec(tmp_path, secured_broker.bootstrap, topic, secured_broker.toml())
    monkeypatch.delenv(PASSWORD_ENV)
    with pytest.raises(ConfigError, match=rf"kafka\.properties\.sasl\.password: environment variable {PASSWORD_ENV}"):
        check_broker(spec)


def test_a_setting_librdkafka_refuses_is_a_config_error(tmp_path, topic, broker) -> None:
    spec = secured_spec(tmp_path, broker.bootstrap, topic, '\n[kafka.properties]\n"security.protocol" = "SASL_NOPE"\n')
    with pytest.raises(ConfigError, match=r"kafka\.properties: librdkafka refused the settings: .*security\.protocol"):
        check_broker(spec)
    with pytest.raises(ConfigError, match="librdkafka refused"):
        produce(broker.bootstrap, topic, demo_orders(1), settings=spec.kafka.client_settings())
