"""Before Spark starts: the broker and the catalog are asked once, and a missing one is one line, in seconds, with
nothing else on stderr (librdkafka used to print hundreds of lines over 15 s)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import krishiv.produce
from krishiv.broker import free_port
from krishiv.preflight import check_broker, check_catalog
from krishiv.produce import demo_orders, ensure_topic, produce
from krishiv_core.errors import BrokerUnavailable, CatalogUnavailable
from spark_jobs.errors import KafkaSourceError
from spark_jobs.kafka_source import latest_offsets

#: A refused connection is believed after about a second; the rest is Python and librdkafka starting.
DOWN_WITHIN_S = 5.0


def test_the_broker_and_catalog_of_a_working_spec_pass(make_spec) -> None:
    spec = make_spec()
    check_broker(spec)
    check_catalog(spec)


def test_a_broker_that_is_down_is_one_line_within_seconds(make_spec, capfd) -> None:
    address = f"127.0.0.1:{free_port()}"  # a loopback port nothing listens on
    spec = make_spec(bootstrap=address)
    topic = spec.pipeline().topic
    attempts = {
        "check_broker": lambda: check_broker(spec),
        "ensure_topic": lambda: ensure_topic(address, topic, 4, settings=spec.kafka.client_settings()),
        "latest_offsets": lambda: latest_offsets(address, topic, spec.kafka.consumer_settings()),
    }
    for name, attempt in attempts.items():
        started = time.monotonic()
        with pytest.raises((BrokerUnavailable, KafkaSourceError)) as down:
            attempt()
        took = time.monotonic() - started
        assert took < DOWN_WITHIN_S, f"{name} took {took:.1f}s"
        assert str(down.value) == f"Kafka broker at {address} is unreachable: connection refused " + (
            "(is the broker running, and at this address?)"
        ), name
    assert capfd.readouterr().err == "", "librdkafka printed nothing"


def test_a_producer_whose_broker_went_away_stops_with_one_line(make_spec, capfd, monkeypatch) -> None:
    monkeypatch.setattr(krishiv.produce, "REFUSED_FOR_S", 1.0)
    address = f"127.0.0.1:{free_port()}"
    spec = make_spec(bootstrap=address)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable, match=rf"records were not acknowledged by {address}: connection refused"):
        produce(address, spec.pipeline().topic, demo_orders(3, partitions=1), settings=spec.kafka.client_settings())
    assert time.monotonic() - started < DOWN_WITHIN_S
    assert capfd.readouterr().err == ""


def test_a_catalog_that_is_down_is_one_line_with_its_password_masked(make_spec) -> None:
    port = free_port()
    spec = make_spec(catalog_uri=f"postgresql://krishiv:hunter22@127.0.0.1:{port}/iceberg")
    started = time.monotonic()
    with pytest.raises(CatalogUnavailable) as down:
        check_catalog(spec)
    message = str(down.value)
    assert time.monotonic() - started < 15
    assert message.startswith(
        f"Iceberg catalog at postgresql+psycopg://krishiv:***@127.0.0.1:{port}/iceberg is unreachable"
    )
    assert "Connection refused" in message
    assert "hunter22" not in message and "\n" not in message


def test_a_rest_catalog_that_is_down_is_one_line(make_spec) -> None:
    uri = f"http://127.0.0.1:{free_port()}/catalog"
    spec = make_spec(catalog_uri=uri)
    with pytest.raises(CatalogUnavailable) as down:
        check_catalog(spec)
    assert str(down.value) == f"Iceberg catalog at {uri} is unreachable: Connection refused"


def test_a_catalog_that_does_not_answer_is_given_up_after_the_timeout(make_spec, tmp_path: Path) -> None:
    import socket

    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}/catalog"
        spec = make_spec(catalog_uri=uri)
        started = time.monotonic()
        with pytest.raises(CatalogUnavailable, match=rf"^Iceberg catalog at {uri} did not answer within 1s$"):
            check_catalog(spec, timeout_s=1.0)
        assert time.monotonic() - started < 3
