"""PostgreSQL locations that cannot be right are named before anything connects; right ones pass as libpq reads them."""

from __future__ import annotations

import pytest

from krishiv_core.errors import ConfigError
from krishiv_core.postgres_location import libpq_uri_problem, sqlalchemy_uri_problem
from krishiv_core.spec import parse_spec

# The ledger's locations, as libpq reads them (``schema=`` is the ledger's own parameter).
WRONG_LEDGERS = [
    ("postgresql://db.internal/platform?sslmod=require", "unknown parameter 'sslmod' (did you mean sslmode?)"),
    ("postgresql://db.internal/platform?shema=krishiv", "unknown parameter 'shema' (did you mean schema?)"),
    ("postgresql://[oops/platform", 'it does not parse: end of string reached when looking for matching "]"'),
    ("postgresql://db.internal:54x/platform", "port '54x' is not a number"),
    ("postgresql://db.internal:70000/platform", "port 70000 is not between 1 and 65535"),
    ("postgres://a:5432,b:x/platform", "port 'x' is not a number"),
    ("postgresql://db.internal/platform?connect_timeout=ten", "connect_timeout='ten' is not a whole number"),
    ("postgresql://db.internal/platform?sslmode", 'missing key/value separator "="'),
]
RIGHT_LEDGERS = [
    "postgresql://krishiv@db.internal:5432/platform?schema=krishiv",
    "postgresql+psycopg://app:s3cret@a:5432,b:5433/platform?sslmode=require&schema=ledger&connect_timeout=5",
    "postgres:///platform?host=/var/run/postgresql",
    "postgresql://[::1]:5432/platform",
]
# The catalog's, as SQLAlchemy's psycopg dialect reads them and hands them to libpq.
WRONG_CATALOGS = [
    ("postgresql+psycopg://db.internal/platform?sslmod=require", "unknown parameter 'sslmod' (did you mean sslmode?)"),
    ("postgresql+psycopg://[oops/platform", "host '[oops' is not a host name"),
    ("postgresql+psycopg://db.internal:54x/platform", "port '54x' is not a number"),
    ("postgresql+psycopg://a:5432,b:5433/platform", "several hosts go in the query"),
    ("postgresql+psycopg:///platform?host=a:5432&host=b:x", "non-integer port"),
    ("postgresql+psycopg://db.internal/platform?keepalives_idle=soon", "keepalives_idle='soon' is not a whole number"),
]
RIGHT_CATALOGS = [
    "postgresql+psycopg://krishiv@db.internal:5432/platform",
    "postgresql+psycopg://app:pa/ss@db.internal/platform?sslmode=require",  # SQLAlchemy takes a '/' in a password
    "postgresql+psycopg:///platform?host=a:5432&host=b:5433",
    "postgresql+psycopg://[::1]:5432/platform",
]


@pytest.mark.parametrize(("uri", "said"), WRONG_LEDGERS)
def test_a_ledger_location_that_cannot_be_right_is_named(uri: str, said: str) -> None:
    assert said in (libpq_uri_problem(uri, own=("schema",)) or "")


@pytest.mark.parametrize("uri", RIGHT_LEDGERS)
def test_a_right_ledger_location_passes(uri: str) -> None:
    assert libpq_uri_problem(uri, own=("schema",)) is None


@pytest.mark.parametrize(("uri", "said"), WRONG_CATALOGS)
def test_a_catalog_location_that_cannot_be_right_is_named(uri: str, said: str) -> None:
    assert said in (sqlalchemy_uri_problem(uri) or "")


@pytest.mark.parametrize("uri", RIGHT_CATALOGS)
def test_a_right_catalog_location_passes(uri: str) -> None:
    assert sqlalchemy_uri_problem(uri) is None


def test_a_password_libpq_repeats_is_masked() -> None:
    said = libpq_uri_problem("postgresql://app:tops%zzecret@db.internal/platform") or ""
    assert "invalid percent-encoded token" in said and "tops" not in said and "***" in said


def _spec(storage: dict[str, str], iceberg: dict[str, str]) -> dict[str, object]:
    return {
        "storage": storage,
        "iceberg": iceberg,
        "pipelines": [
            {
                "name": "orders",
                "topic": "orders",
                "table": "orders",
                "kind": "events",
                "fields": {"order_id": "string"},
            }
        ],
    }


def _refusal(spec: dict[str, object], env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_spec(spec, env=env)
    return str(info.value)


def test_the_spec_refuses_either_location_naming_the_setting_and_the_way_out() -> None:
    said = _refusal(_spec({"ledger_path": "postgresql://db.internal:54x/platform"}, {}))
    assert said.startswith("storage.ledger_path: port '54x' is not a number; correct it (or $KRISHIV_LEDGER_PATH)")
    assert said.endswith("Recovery runbook > A location that cannot be right)")
    said = _refusal(_spec({}, {"catalog_uri": "postgresql://db.internal/platform?sslmod=require"}))
    assert said.startswith("iceberg.catalog_uri: unknown parameter 'sslmod' (did you mean sslmode?); correct it (or ")
    assert "$KRISHIV_ICEBERG_CATALOG_URI" in said
    # Read from the environment too, where most deployments set them.
    said = _refusal(_spec({}, {}), env={"KRISHIV_LEDGER_PATH": "postgresql://db.internal/platform?sslmod=require"})
    assert said.startswith("storage.ledger_path: unknown parameter 'sslmod'")
