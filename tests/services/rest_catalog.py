"""A real Iceberg REST catalog for the tests: ``lakana-server`` over a PostgreSQL database of its own.

Lakana serves the Iceberg REST protocol at ``/v1`` with the spec's ``{prefix}`` being one of its *environments*
(each with a storage root, a local folder here) and every call but ``/v1/config`` needing a bearer token. The
server is started once per session, when a test asks for :func:`rest_catalog`: its metadata database is created
and migrated (what ``lakana-server migrate`` runs), the server runs on a free loopback port with a fixed administrator
token, and each test asks :meth:`RestCatalogServer.new_environment` for a fresh prefix with its own warehouse
folder, so tests never share tables. The token is put in ``os.environ`` under :data:`TOKEN_VARIABLE` and a spec
names it as ``${KRISHIV_TEST_REST_TOKEN}``: it is never written into a spec file.

Lakana creates tables only under the top-level namespaces ``bronze``, ``silver`` and ``gold`` (which every
environment starts with), so the specs of these tests use :data:`NAMESPACE`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from krishiv.broker import free_port
from tests.services.processes import stop

#: The environment variable the specs reference for the token (``token = "${KRISHIV_TEST_REST_TOKEN}"``).
TOKEN_VARIABLE = "KRISHIV_TEST_REST_TOKEN"
#: The namespace Lakana lets tables be created in.
NAMESPACE = "bronze"
PG_ADMIN_DSN = os.environ.get("KRISHIV_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
START_TIMEOUT_S = 90.0
MIGRATE_TIMEOUT_S = 120.0
MIGRATE = "import sys; from lakana_core import migrate; migrate.upgrade(sys.argv[1])"


def _lakana_server() -> str:
    """The ``lakana-server`` script of this interpreter's environment."""
    script = Path(sys.executable).with_name("lakana-server")
    if not script.exists():
        pytest.fail(f"lakana-server is not installed beside {sys.executable}; run scripts/setup.sh")
    return str(script)


@dataclass(frozen=True)
class RestCatalogServer:
    """A running Lakana server: what a spec needs to reach it."""

    uri: str  # http://127.0.0.1:PORT, the spec's catalog_uri
    root: Path  # the folder under which each environment's warehouse lives
    log: Path
    token_variable: str = TOKEN_VARIABLE
    namespace: str = NAMESPACE

    def new_environment(self) -> tuple[str, Path]:
        """A new Lakana environment (the REST ``prefix``) with its own warehouse folder: ``(prefix, folder)``."""
        prefix = f"t{uuid.uuid4().hex[:10]}"
        folder = self.root / prefix
        folder.mkdir(parents=True)
        body = {"name": prefix, "storage": {"scheme": "file", "root": folder.as_uri()}}
        _request(f"{self.uri}/api/v1/environments", os.environ[self.token_variable], body)
        return prefix, folder

    def iceberg_properties(self, prefix: str) -> str:
        """The spec's ``[iceberg.properties]`` table for ``prefix``: the token by reference, never by value."""
        return f'\n[iceberg.properties]\ntoken = "${{{self.token_variable}}}"\nprefix = "{prefix}"\n'


def _request(url: str, token: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _answers(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/v1/config", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


@pytest.fixture(scope="session")
def rest_catalog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestCatalogServer]:
    """Lakana on a free loopback port over a fresh PostgreSQL database; stopped and dropped at the session's end."""
    import psycopg

    folder = tmp_path_factory.mktemp("rest-catalog")
    database = f"krishiv_rest_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=10) as con:
        con.execute(f'CREATE DATABASE "{database}"')
    base = PG_ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    port = free_port()
    key_id, secret = uuid.uuid4().hex[:16], secrets.token_urlsafe(24)
    env = {
        **os.environ,
        "LAKANA_DATABASE__URL": f"{base}/{database}",
        "LAKANA_HOST": "127.0.0.1",
        "LAKANA_PORT": str(port),
        "LAKANA_BOOTSTRAP_PAT_KEY_ID": key_id,
        "LAKANA_BOOTSTRAP_PAT_SECRET": secret,
        "LAKANA_LOG__LEVEL": "WARNING",
        "LAKANA_LOG__ACCESS": "false",
    }
    log = folder / "lakana.log"
    process: subprocess.Popen[bytes] | None = None
    try:
        with log.open("ab") as out:
            # What `lakana-server migrate` runs, without importing the whole server first (10 s on a loaded machine).
            subprocess.run(
                [sys.executable, "-c", MIGRATE, env["LAKANA_DATABASE__URL"]],
                env=env,
                stdout=out,
                stderr=out,
                check=True,
                timeout=MIGRATE_TIMEOUT_S,
            )
            process = subprocess.Popen(
                [_lakana_server()], env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True
            )
        uri = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(uri):
            if process.poll() is not None:
                pytest.fail(f"lakana-server exited with {process.returncode}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                pytest.fail(f"lakana-server did not answer at {uri} within {START_TIMEOUT_S:.0f}s:\n{_tail(log)}")
            with contextlib.suppress(subprocess.TimeoutExpired):  # between probes: an exit is seen at once
                process.wait(timeout=0.2)
        os.environ[TOKEN_VARIABLE] = f"lakana_pat_{key_id}_{secret}"
        yield RestCatalogServer(uri=uri, root=folder / "warehouses", log=log)
    finally:
        os.environ.pop(TOKEN_VARIABLE, None)
        if process is not None:
            stop(process)
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=10) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
