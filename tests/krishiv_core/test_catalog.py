"""Catalog URIs in messages: passwords and secret query parameters are masked, the rest stays readable; a real
REST catalog (``lakana-server``) reached with a token and prefix from ``[iceberg.properties]``; refusals in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from krishiv.broker import free_port
from krishiv_core.catalog import (
    CatalogRefused,
    ensure_pipeline_tables,
    failure_reason,
    has_secret,
    load_catalog,
    qualified,
    redact,
    redact_text,
)
from krishiv_core.errors import CatalogUnavailable, ConfigError
from krishiv_core.spec import parse_spec
from tests.services.rest_catalog import TOKEN_VARIABLE

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


# ------------------------------------------------------------------------------------------ a real REST catalog


def _rest_spec(tmp_path: Path, uri: str, properties: dict[str, str], namespace: str = "bronze"):
    return parse_spec(
        {
            "iceberg": {"catalog_uri": uri, "warehouse": "warehouse", "namespace": namespace, "properties": properties},
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
        env=os.environ,
        base_dir=tmp_path,
    )


def test_a_rest_catalog_takes_its_token_and_prefix_from_the_spec_properties(tmp_path: Path, rest_catalog) -> None:
    prefix, warehouse = rest_catalog.new_environment()
    spec = _rest_spec(tmp_path, rest_catalog.uri, {"token": f"${{{TOKEN_VARIABLE}}}", "prefix": prefix})
    assert os.environ[TOKEN_VARIABLE] not in repr(spec), "the spec keeps the reference, not the token"
    catalog = load_catalog(spec)
    tables = ensure_pipeline_tables(catalog, spec, spec.pipeline())
    assert set(tables) == {"p", "p_rejects"}
    table = catalog.load_table(qualified(spec, "p"))
    assert table.location().startswith(warehouse.as_uri()), "the server places the table in the prefix's warehouse"
    assert table.properties["commit.retry.num-retries"] == "0"
    assert ensure_pipeline_tables(catalog, spec, spec.pipeline())["p"].metadata_location == table.metadata_location


def test_a_rest_catalog_refusal_is_one_line_with_the_servers_reason(tmp_path: Path, rest_catalog) -> None:
    prefix, _ = rest_catalog.new_environment()
    spec = _rest_spec(
        tmp_path, rest_catalog.uri, {"token": f"${{{TOKEN_VARIABLE}}}", "prefix": prefix}, namespace="krishiv"
    )
    with pytest.raises(CatalogRefused) as raised:
        ensure_pipeline_tables(load_catalog(spec), spec, spec.pipeline())
    message = str(raised.value)
    assert message.startswith(f"Iceberg catalog at {rest_catalog.uri} refused to create table krishiv.p (HTTP 422): ")
    assert "bronze, silver, or gold" in message and "\n" not in message
    assert message.endswith("(see docs/operations.md: Recovery runbook > A catalog that refuses)")


def test_a_wrong_rest_token_is_refused_without_showing_it(tmp_path: Path, rest_catalog, monkeypatch) -> None:
    prefix, _ = rest_catalog.new_environment()
    wrong = os.environ[TOKEN_VARIABLE][:-6] + "WRONG1"
    monkeypatch.setenv("KRISHIV_TEST_WRONG_TOKEN", wrong)
    spec = _rest_spec(tmp_path, rest_catalog.uri, {"token": "${KRISHIV_TEST_WRONG_TOKEN}", "prefix": prefix})
    refused = r"refused to load table bronze\.p \(HTTP 401\).*check the token"
    with pytest.raises(CatalogRefused, match=refused) as raised:
        ensure_pipeline_tables(load_catalog(spec), spec, spec.pipeline())
    assert wrong not in str(raised.value) and os.environ[TOKEN_VARIABLE] not in str(raised.value)


def test_an_unreachable_rest_catalog_is_named_without_its_token(tmp_path: Path, rest_catalog) -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    spec = _rest_spec(tmp_path, uri, {"token": f"${{{TOKEN_VARIABLE}}}", "prefix": "p"})
    with pytest.raises(CatalogUnavailable) as raised:
        load_catalog(spec)
    message = str(raised.value)
    assert message.startswith(f"Iceberg catalog at {uri} is unreachable: ")
    assert os.environ[TOKEN_VARIABLE] not in message


@pytest.mark.parametrize("timeout", ["0", "-1", "soon"])
def test_a_rest_timeout_must_be_positive_seconds(tmp_path: Path, timeout: str) -> None:
    spec = _rest_spec(tmp_path, "http://127.0.0.1:9", {"connection.timeout": timeout})
    with pytest.raises(ConfigError, match=r"iceberg\.properties\.connection\.timeout: expected seconds > 0"):
        load_catalog(spec)


def test_pyicebergs_own_configuration_may_supply_the_rest_token(tmp_path: Path, rest_catalog) -> None:
    """``PYICEBERG_CATALOG__KRISHIV__TOKEN`` (read by pyiceberg when it is imported, hence a process of its own)
    reaches the catalog named ``krishiv`` under the spec's properties: a spec without the token works."""
    prefix, _ = rest_catalog.new_environment()
    spec_file = tmp_path / "krishiv.toml"
    spec_file.write_text(
        f'[iceberg]\ncatalog_uri = "{rest_catalog.uri}"\nnamespace = "bronze"\n'
        f'[iceberg.properties]\nprefix = "{prefix}"\n'
        '[[pipelines]]\nname = "p"\ntopic = "t"\nevent_time_field = "t"\n[pipelines.fields]\nt = "timestamp_ms"\n'
        '[[pipelines.aggregations]]\nname = "n"\nfunction = "count"\n'
    )
    program = (
        "import sys; from krishiv_core.catalog import ensure_pipeline_tables, load_catalog; "
        "from krishiv_core.spec import load_spec; spec = load_spec(sys.argv[1]); "
        "print(sorted(ensure_pipeline_tables(load_catalog(spec), spec, spec.pipeline())))"
    )
    env = {k: v for k, v in os.environ.items() if k != TOKEN_VARIABLE}
    env["PYICEBERG_CATALOG__KRISHIV__TOKEN"] = os.environ[TOKEN_VARIABLE]
    done = subprocess.run(
        [sys.executable, "-c", program, str(spec_file)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['p', 'p_rejects']"


@pytest.mark.postgres
def test_a_sql_catalog_whose_server_ended_the_session_is_one_line_without_the_statement(postgres_uri: str) -> None:
    """A PostgreSQL catalog restarted under a commit: SQLAlchemy's error carries the statement, its parameters and a
    link on lines of their own, which the relay's warning and the outage line used to print mid-run."""
    import psycopg
    import sqlalchemy

    engine = sqlalchemy.create_engine(postgres_uri)
    try:
        with engine.connect() as session:
            pid = session.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            admin = postgres_uri.replace("postgresql+psycopg://", "postgresql://")
            with psycopg.connect(admin, autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s)", [pid])  # what a restart does to open sessions
            with pytest.raises(sqlalchemy.exc.OperationalError) as info:
                session.exec_driver_sql("SELECT 1 FROM iceberg_tables WHERE table_name = %(n)s", {"n": "orders"})
    finally:
        engine.dispose()
    assert "[SQL: " in str(info.value)  # SQLAlchemy's own words span lines
    said = failure_reason(info.value)
    assert said == "(psycopg.errors.AdminShutdown) terminating connection due to administrator command", said
