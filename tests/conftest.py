"""Shared fixtures: a real Tansu broker, a real SparkSession, spec files and a PostgreSQL database."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chaos.workspace import SPEC_TEMPLATE
from krishiv.broker import LocalBroker, start_broker
from krishiv_core.spec import KrishivSpec, load_spec

#: Fixture modules of the slower real services, each started once per session when a test asks for it.
pytest_plugins: list[str] = [
    "tests.services.spark_cluster",
    "tests.services.s3",
    "tests.services.rest_catalog",
    "tests.services.otlp_receiver",
    "tests.services.secured_broker",
    "tests.services.private_postgres",
    "tests.services.ledger_postgres",
    "tests.services.schema_registry",
    "tests.services.other_engines",
]

PG_ADMIN_DSN = os.environ.get("KRISHIV_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with start_broker(log_path=log) as b:
        yield b


@pytest.fixture
def topic() -> str:
    return f"orders-{uuid.uuid4().hex[:10]}"


SpecFactory = Callable[..., KrishivSpec]


@pytest.fixture
def make_spec(tmp_path: Path, broker: LocalBroker, topic: str) -> SpecFactory:
    """Write a spec file into the test's folder and load it; keyword arguments fill the template."""

    def make(**overrides: object) -> KrishivSpec:
        values: dict[str, object] = {
            "bootstrap": broker.bootstrap,
            "partitions": 4,
            "catalog_uri": "sqlite:///catalog.db",
            "warehouse": "warehouse",
            "topic": topic,
            "max_records": 2_000,
        }
        values.update(overrides)
        path = tmp_path / "krishiv.toml"
        path.write_text(SPEC_TEMPLATE.format(**values))
        return load_spec(path, env={})

    return make


@pytest.fixture
def spec_file(tmp_path: Path, make_spec: SpecFactory) -> Path:
    make_spec()
    return tmp_path / "krishiv.toml"


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory):
    from krishiv_core.spec import parse_spec
    from spark_jobs.session import build_session

    base = parse_spec(
        {
            "spark": {"master": "local[2]", "shuffle_partitions": 2},
            "pipelines": [
                {
                    "name": "x",
                    "topic": "x",
                    "event_time_field": "t",
                    "fields": {"t": "timestamp_ms"},
                    "aggregations": [{"name": "n", "function": "count"}],
                }
            ],
        },
        env={},
    )
    session = build_session(base, app_name="krishiv-tests")
    yield session
    session.stop()


@pytest.fixture
def postgres_uri() -> Iterator[str]:
    """A fresh PostgreSQL database on the machine's server, dropped afterwards."""
    import psycopg

    name = f"krishiv_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=10) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    yield f"{base}/{name}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=10) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["duckdb", pytest.param("postgresql", marks=pytest.mark.postgres)])
def ledger_location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where a test's ledger goes, on each of its backends: a DuckDB file in the test's folder (not made yet), or a
    schema of its own in the machine's PostgreSQL database (not made yet either), dropped afterwards."""
    if request.param == "duckdb":
        yield str(tmp_path / "state" / "ledger.duckdb")
        return
    import psycopg

    schema = f"ledger_{uuid.uuid4().hex[:12]}"
    yield f"{PG_ADMIN_DSN}{'&' if '?' in PG_ADMIN_DSN else '?'}schema={schema}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=10) as con:
        con.execute("SET lock_timeout = '60s'")  # a session the test left open inside the schema: fail, never hang
        con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
