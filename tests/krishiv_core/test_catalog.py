"""Catalog URIs in messages: passwords and secret query parameters are masked, the rest stays readable."""

from __future__ import annotations

from pathlib import Path

import pytest

from krishiv.broker import free_port
from krishiv_core.catalog import has_secret, load_catalog, redact, redact_text
from krishiv_core.errors import CatalogUnavailable
from krishiv_core.spec import parse_spec

PASSWORD = "Dummy-Pa55word"


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        (
            f"postgresql+psycopg://app:{PASSWORD}@db:5432/iceberg",
            "postgresql+psycopg://app:***@db:5432/iceberg",
        ),
        (
            f"postgresql+psycopg://app@db/iceberg?sslmode=require&password={PASSWORD}&application_name=krishiv",
            "postgresql+psycopg://app@db/iceberg?sslmode=require&password=***&application_name=krishiv",
        ),
        (
            f"postgresql+psycopg://app:{PASSWORD}@db/iceberg?PASSWORD={PASSWORD}&SSLPassword=k3y",
            "postgresql+psycopg://app:***@db/iceberg?PASSWORD=***&SSLPassword=***",
        ),
        (
            "https://rest.example/catalog?warehouse=lake&token=t0k&Credential=c&key=k&secret=s"
            "&access_key=AK&secret_access_key=SK",
            "https://rest.example/catalog?warehouse=lake&token=***&Credential=***&key=***&secret=***"
            "&access_key=***&secret_access_key=***",
        ),
        # Unescaped characters a driver still reads as part of the password are masked with it.
        ("postgresql+psycopg://app:a/b?c@d@db/iceberg", "postgresql+psycopg://app:***@db/iceberg"),
        ("sqlite:////var/lib/krishiv/catalog.db", "sqlite:////var/lib/krishiv/catalog.db"),
        ("sqlite:///state/catalog.db?mode=ro", "sqlite:///state/catalog.db?mode=ro"),
        ("postgresql+psycopg://app@db:5432/iceberg", "postgresql+psycopg://app@db:5432/iceberg"),
        ("http://127.0.0.1:8181/v1", "http://127.0.0.1:8181/v1"),
    ],
)
def test_redact_masks_passwords_and_secret_parameters_only(uri: str, shown: str) -> None:
    assert redact(uri) == shown
    assert has_secret(uri) is (shown != uri)
    assert redact(shown) == shown


def test_redact_text_masks_the_uri_and_its_secrets_anywhere_in_a_message() -> None:
    uri = f"postgresql+psycopg://app:{PASSWORD}@db/iceberg?token=T0ken-value"
    message = f"could not connect to {uri}: authentication with 'Dummy-Pa55word' failed (token T0ken-value)"
    assert redact_text(message, uri) == (
        "could not connect to postgresql+psycopg://app:***@db/iceberg?token=***: "
        "authentication with '***' failed (token ***)"
    )


@pytest.mark.parametrize(
    "uri",
    [
        f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:{{port}}/test",
        f"postgresql+psycopg://postgres@127.0.0.1:{{port}}/test?connect_timeout=5&password={PASSWORD}",
    ],
)
def test_an_unreachable_catalog_is_named_without_its_password(tmp_path: Path, uri: str) -> None:
    uri = uri.format(port=free_port())
    spec = parse_spec(
        {
            "iceberg": {"catalog_uri": uri, "warehouse": "warehouse"},
            "pipelines": [
                {
                    "name": "p",
                    "topic": "t",
                    "event_time_field": "t",
                    "fields": {"t": "timestamp_ms"},
                    "aggregations": [{"name": "n", "function": "count"}],
                }
            ],
        },
        env={},
        base_dir=tmp_path,
    )
    with pytest.raises(CatalogUnavailable) as raised:
        load_catalog(spec)
    message = str(raised.value)
    assert message.startswith(f"Iceberg catalog at {redact(uri)} is unreachable: ")
    assert PASSWORD not in message
