"""The relay's ambiguous commits through a real REST catalog (``lakana-server``).

A small HTTP proxy sits between pyiceberg and the server and gives the next commit request
(``POST /v1/{prefix}/namespaces/{namespace}/tables/{table}``) a scripted fate: forwarded and then answered 502 or
504, or held past the client's ``connection.timeout`` (the server applied it; the client never hears), or answered
502 without being forwarded (the server never saw it). Every other request passes through. The relay must find
the applied commits by reloading the table and commit the others exactly once, and never re-send a commit blindly:
the proxy counts what reached the server.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest

from krishiv.verify import check_ledger_agreement
from krishiv_core.catalog import TABLE_BY_TABLE, CatalogRefused, load_catalog, multi_table_commits_at, redact
from krishiv_core.entries import COMMITTED, PENDING, OutboxEntry
from krishiv_core.errors import CatalogUnavailable
from krishiv_core.spec import KrishivSpec, parse_spec
from outbox.ledger import Ledger
from outbox.multi_table_commit import multi_table_commits
from outbox.relay import MAX_AMBIGUOUS_RECHECKS, CommitRelay
from tests.outbox.test_relay import stage as stage_in
from tests.services.rest_catalog import NAMESPACE, TOKEN_VARIABLE

ROOT = Path(__file__).resolve().parents[2]
#: The client's timeout in these tests: a held commit answer makes pyiceberg's call raise ``requests.ReadTimeout``.
CLIENT_TIMEOUT_S = 2.0
HOLD_LIMIT_S = 30.0
COMMIT_PATH = re.compile(r"^/v1/[^/]+/namespaces/[^/]+/tables/[^/?]+$")

FORWARD_THEN_502 = "forward, then 502"
FORWARD_THEN_504 = "forward, then 504"
FORWARD_THEN_HOLD = "forward, then hold past the client's timeout"
REFUSE_502 = "502 without forwarding"
REFUSE_403 = "403 without forwarding"
ECHO_500 = "500 quoting the request's Authorization header, without forwarding"


class CommitProxy(ThreadingHTTPServer):
    """Forwards every request to ``upstream``; each commit request takes the next fate of :attr:`fates`."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        parsed = urlparse(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.fates: list[str] = []
        self.commits_seen = 0  # commit requests pyiceberg sent
        self.commits_forwarded = 0  # commit requests the server received
        self.commit_headers: list[dict[str, str]] = []
        self.release = threading.Event()  # lets held answers go when the test ends
        #: Requests whose path matches are answered with :data:`ECHO_500`'s error, as a careless server might.
        self.echo_paths: re.Pattern[str] | None = None
        self.echo_status = 500
        self.lock = threading.Lock()

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def fate(self, method: str, path: str, headers: dict[str, str]) -> str | None:
        if method != "POST" or not COMMIT_PATH.match(path):
            return None
        with self.lock:
            self.commits_seen += 1
            self.commit_headers.append(headers)
            return self.fates.pop(0) if self.fates else "pass"


class _Handler(BaseHTTPRequestHandler):
    server: CommitProxy

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: pytest would show every request."""

    def _relay(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        fate = self.server.fate(self.command, self.path, dict(self.headers.items()))
        echo = self.server.echo_paths
        if fate == ECHO_500 or (fate is None and echo is not None and echo.search(self.path)):
            status = 500 if fate == ECHO_500 else self.server.echo_status
            quoted = f"credentials {self.headers.get('Authorization')!r} look wrong"
            return self._answer(status, json.dumps({"error": {"message": quoted, "type": "Error", "code": status}}))
        if fate == REFUSE_502:
            return self._answer(502, b"Bad Gateway", "text/plain")
        if fate == REFUSE_403:
            return self._answer(403, b'{"error":{"message":"not allowed","type":"ForbiddenException","code":403}}')
        status, headers, answer = self._forward(body)
        if fate is not None:
            with self.server.lock:
                self.server.commits_forwarded += 1
        if fate == FORWARD_THEN_502:
            return self._answer(502, b"Bad Gateway", "text/plain")
        if fate == FORWARD_THEN_504:
            return self._answer(504, b"Gateway Timeout", "text/plain")
        if fate == FORWARD_THEN_HOLD:
            self.server.release.wait(HOLD_LIMIT_S)  # the client gives up first; then the connection just closes
            self.close_connection = True
            return None
        self._answer(status, answer, headers.get("Content-Type", "application/json"))
        return None

    def _forward(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection(*self.server.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            connection.request(self.command, self.path, body=body or None, headers=headers)
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()

    def _answer(self, status: int, body: bytes | str, content_type: str = "application/json") -> None:
        body = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = do_HEAD = _relay


@pytest.fixture
def proxy(rest_catalog) -> Iterator[CommitProxy]:
    server = CommitProxy(rest_catalog.uri)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="commit-proxy", daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture
def spec(tmp_path: Path, rest_catalog, proxy: CommitProxy) -> KrishivSpec:
    prefix, _ = rest_catalog.new_environment()
    raw = {
        "iceberg": {
            "catalog_uri": proxy.uri,
            "namespace": NAMESPACE,
            "properties": {
                "token": f"${{{TOKEN_VARIABLE}}}",
                "prefix": prefix,
                "connection.timeout": str(CLIENT_TIMEOUT_S),
                "header.X-Krishiv-Test": "relay",  # pyiceberg sends every header.* property with each request
            },
        },
        "storage": {"ledger_path": "ledger.duckdb"},
        "pipelines": [
            {
                "name": "orders_per_minute",
                "topic": "orders",
                "event_time_field": "event_time",
                "fields": {"amount": "decimal(12,2)", "event_time": "timestamp_ms"},
                "aggregations": [
                    {"name": "order_count", "function": "count"},
                    {"name": "amount_total", "function": "sum", "field": "amount"},
                ],
            }
        ],
    }
    return parse_spec(raw, env=os.environ, base_dir=tmp_path)


def stage(spec: KrishivSpec, ledger: Ledger, batch_id: int) -> OutboxEntry:
    """One batch of one window row in the REST catalog, staged beside the table and recorded in the ledger."""
    return stage_in(load_catalog(spec), ledger, batch_id, batch_id, pipeline=spec.pipeline(), namespace=NAMESPACE)


def relay_for(spec: KrishivSpec, ledger: Ledger) -> CommitRelay:
    return CommitRelay(ledger, lambda: load_catalog(spec), redact(spec.catalog_uri()))


@pytest.mark.parametrize("fate", [FORWARD_THEN_502, FORWARD_THEN_504, FORWARD_THEN_HOLD])
def test_a_commit_the_server_applied_but_the_client_never_heard_of_is_found_not_made_twice(
    spec: KrishivSpec, proxy: CommitProxy, fate: str
) -> None:
    ledger = Ledger(spec.resolve(spec.storage.ledger_path))
    entries = [stage(spec, ledger, b) for b in range(2)]
    table_name = entries[0].table
    proxy.fates = [fate]
    report = relay_for(spec, ledger).commit_table(table_name)

    assert (report.recovered, report.committed) == ([0], [1]), "batch 0 found by reloading, batch 1 committed"
    assert (proxy.commits_seen, proxy.commits_forwarded) == (2, 2), "one request per batch: none re-sent"
    assert [h.get("X-Krishiv-Test") for h in proxy.commit_headers] == ["relay", "relay"]
    table = load_catalog(spec).load_table(table_name)
    assert [s.snapshot_id for s in table.snapshots()] == [e.intended_snapshot_id for e in entries]
    assert table.scan().to_arrow().num_rows == 2, "each batch's row once"
    assert [ledger.get("q1", table_name, b).status for b in range(2)] == [COMMITTED, COMMITTED]
    assert check_ledger_agreement(table, table_name, ledger) == []


def test_a_commit_refused_by_a_gateway_before_the_server_saw_it_is_made_once(
    spec: KrishivSpec, proxy: CommitProxy
) -> None:
    ledger = Ledger(spec.resolve(spec.storage.ledger_path))
    entry = stage(spec, ledger, 0)
    proxy.fates = [REFUSE_502]
    report = relay_for(spec, ledger).commit_table(entry.table)

    assert (report.recovered, report.committed) == ([], [0]), "reloaded, not there, committed again"
    assert (proxy.commits_seen, proxy.commits_forwarded) == (2, 1)
    table = load_catalog(spec).load_table(entry.table)
    assert [s.snapshot_id for s in table.snapshots()] == [entry.intended_snapshot_id]
    assert table.scan().to_arrow().num_rows == 1


def test_an_outcome_that_stays_unknown_leaves_the_entry_pending_for_the_next_run(
    spec: KrishivSpec, proxy: CommitProxy, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = Ledger(spec.resolve(spec.storage.ledger_path))
    entry = stage(spec, ledger, 0)
    attempts = MAX_AMBIGUOUS_RECHECKS + 1
    proxy.fates = [ECHO_500] * attempts  # each answer quotes the token
    with caplog.at_level("INFO"), pytest.raises(CatalogUnavailable) as raised:
        relay_for(spec, ledger).commit_table(entry.table)
    message = str(raised.value)
    assert message.startswith(f"Iceberg catalog at {proxy.uri}: the commit of {entry.table} batch 0 had an unknown ")
    assert "CommitStateUnknownException" in message and "\n" not in message
    assert os.environ[TOKEN_VARIABLE] not in message and "credentials 'Bearer ***' look wrong" in message
    assert caplog.text.count("unknown outcome") == MAX_AMBIGUOUS_RECHECKS, "each re-check is logged"
    assert os.environ[TOKEN_VARIABLE] not in caplog.text and "Bearer ***" in caplog.text
    assert ledger.get("q1", entry.table, 0).status == PENDING
    assert proxy.commits_forwarded == 0

    report = relay_for(spec, ledger).commit_table(entry.table)
    assert report.committed == [0] and proxy.commits_forwarded == 1
    assert load_catalog(spec).load_table(entry.table).scan().to_arrow().num_rows == 1


def test_a_refused_commit_is_one_line_and_never_repeated(spec: KrishivSpec, proxy: CommitProxy) -> None:
    ledger = Ledger(spec.resolve(spec.storage.ledger_path))
    entry = stage(spec, ledger, 0)
    proxy.fates = [REFUSE_403]
    with pytest.raises(CatalogRefused, match=rf"refused the commit of {re.escape(entry.table)} batch 0 \(HTTP 403\)"):
        relay_for(spec, ledger).commit_table(entry.table)
    assert (proxy.commits_seen, proxy.commits_forwarded) == (1, 0)
    assert ledger.get("q1", entry.table, 0).status == PENDING


def test_a_reload_the_catalog_refuses_stops_at_once_naming_what_to_check(
    spec: KrishivSpec, proxy: CommitProxy, monkeypatch
) -> None:
    ledger = Ledger(spec.resolve(spec.storage.ledger_path))
    entry = stage(spec, ledger, 0)
    wrong = os.environ[TOKEN_VARIABLE][:-6] + "WRONG1"
    monkeypatch.setenv(TOKEN_VARIABLE, wrong)
    with pytest.raises(CatalogRefused, match=r"\(HTTP 401\): .*check the token or credential") as refused:
        relay_for(spec, ledger).commit_table(entry.table)
    assert wrong not in str(refused.value)
    assert str(refused.value).endswith("(see docs/operations.md: Recovery runbook > A catalog that refuses)")
    monkeypatch.undo()

    other = replace(spec, iceberg=replace(spec.iceberg, properties={**spec.iceberg.properties, "prefix": "nowhere"}))
    with pytest.raises(CatalogRefused, match=rf"table {re.escape(entry.table)} is not in the Iceberg catalog") as info:
        relay_for(other, ledger).commit_table(entry.table)
    assert str(info.value).endswith("(see docs/operations.md: Recovery runbook > A catalog that refuses)")
    assert proxy.commits_seen == 0 and ledger.get("q1", entry.table, 0).status == PENDING

    # The runbook's way on: the token and the prefix put right, the command run again.
    assert relay_for(spec, ledger).commit_table(entry.table).committed == [0]


def test_a_server_that_quotes_the_token_back_never_gets_it_shown(spec: KrishivSpec, proxy: CommitProxy) -> None:
    proxy.echo_paths = re.compile(r"^/v1/config")
    with pytest.raises(CatalogUnavailable) as raised:
        load_catalog(spec)
    assert os.environ[TOKEN_VARIABLE] not in str(raised.value) and "'Bearer ***'" in str(raised.value)

    ledger = Ledger(spec.resolve(spec.storage.ledger_path))
    proxy.echo_paths = None
    entry = stage(spec, ledger, 0)
    proxy.echo_paths = re.compile(r"/tables/")
    with pytest.raises(CatalogUnavailable) as down:  # ensure_table's load of the table
        stage(spec, ledger, 1)
    assert os.environ[TOKEN_VARIABLE] not in str(down.value) and "'Bearer ***'" in str(down.value)
    proxy.echo_status = 401
    with pytest.raises(CatalogRefused) as refused:  # the relay's load
        relay_for(spec, ledger).commit_table(entry.table)
    assert os.environ[TOKEN_VARIABLE] not in str(refused.value) and "'Bearer ***'" in str(refused.value)


def test_a_batch_of_several_tables_is_committed_table_by_table_on_a_rest_catalog(
    spec: KrishivSpec, proxy: CommitProxy
) -> None:
    """The server has no ``transactions/commit`` (its config advertises no endpoints): each table of a batch is its
    own commit request, in order, and every table holds the batch once."""
    catalog = load_catalog(spec)
    assert multi_table_commits(catalog) == TABLE_BY_TABLE == multi_table_commits_at(spec.catalog_uri())
    ledger = Ledger(spec.resolve(spec.storage.ledger_path))
    namespaces = (NAMESPACE, "silver")  # the server admits tables under bronze, silver and gold
    entries = [
        stage_in(catalog, ledger, b, b, pipeline=spec.pipeline(), namespace=ns) for b in range(2) for ns in namespaces
    ]
    reports = relay_for(spec, ledger).run()

    assert sorted((r.table, r.committed) for r in reports) == sorted((e.table, [0, 1]) for e in entries[:2])
    assert proxy.commits_forwarded == 4, "one commit request per table and batch"
    for entry in entries[:2]:
        table = load_catalog(spec).load_table(entry.table)
        assert table.scan().to_arrow().num_rows == 2, "each batch's row once"
        assert check_ledger_agreement(table, entry.table, ledger) == []
