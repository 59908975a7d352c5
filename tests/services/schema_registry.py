"""A small, faithful Confluent Schema Registry for the tests, served over real HTTP on loopback.

No Schema Registry server can be installed on this machine, so this module implements the REST API that
confluent-kafka's Python ``SchemaRegistryClient`` (2.16) and Confluent's Java ``kafka-schema-registry-client``
(7.0, used by Debezium's ``AvroConverter``) call, with the shapes of Confluent's documentation.

Faithful to the real registry:

* paths, query parameters and JSON shapes of the v1 API; every answer is ``application/vnd.schemaregistry.v1+json``
  with status 200 on success (the Java client treats anything but 200/204 as an error);
* error bodies ``{"error_code": ..., "message": ...}`` with the messages of Confluent 7.0's ``Errors``: 40401 subject
  not found, 40402 version not found, 40403 schema not found, 40404-40407 soft/permanent deletion rules, 40408/40409
  no subject-level config/mode, 42201 invalid schema, 42202 invalid version, 42203 invalid compatibility level, 42204
  invalid mode, 42205 read-only mode, 409 incompatible schema, 401 bad credentials, 50001 for injected 5xx faults,
  and ``{"error_code": 404, "message": "HTTP 404 Not Found"}`` for a path the registry does not know (Jersey's);
* what the Java client 7.0.16 sends (checked against its ``RestService``): ``POST /subjects/{s}/versions?normalize=``,
  ``GET /schemas/ids/{id}?fetchMaxId=&subject=`` (``maxId`` answered when asked), ``POST /subjects/{s}?normalize=
  &deleted=``, ``GET /subjects/{s}/versions/latest``, and the JSON it reads (``schemaType`` omitted for AVRO, empty
  ``references`` omitted);
* global schema ids from 1, one id per distinct (type, canonical schema, references), whatever the subject;
  versions 1..n per subject; re-registering a schema a subject already has returns its id without a new version;
* schemas are validated (Avro with fastavro, references resolved; JSON Schema with ``jsonschema``'s meta-schema;
  Protobuf as ``.proto`` text or as a base64 ``FileDescriptorProto``, checked by a ``DescriptorPool``) and stored in a
  canonical form: compact JSON for Avro and JSON Schema (whitespace-insensitive identity, as Avro's
  ``Schema.toString()``/Jackson give), ``.proto`` text for Protobuf;
* Protobuf is answered as ``.proto`` text by default and as the base64 of a serialized ``FileDescriptorProto`` with
  ``format=serialized`` (what confluent-kafka's Protobuf serde asks for);
* soft and permanent deletes of subjects and versions, ``deleted``/``deleted_only``/``subjectPrefix``/``offset``/
  ``limit`` filters, ``/config`` and ``/mode`` (READONLY refuses registrations with 42205);
* HTTP/1.1 keep-alive, chunked request bodies, URL-encoded subject names (``a%2Fb.proto`` is subject ``a/b.proto``).

Not faithful (kept simple on purpose):

* no compatibility checking: every schema is compatible unless ``compatibility_checker`` is set (a callable given
  the type and the canonical texts of the candidate and of the latest version, returning error messages); a 409 can
  also be forced with ``fail_next(1, status=409)``;
* no contexts (``GET /contexts`` answers ``["."]``), no IMPORT-mode ids, no metadata/rule sets, no schema guids
  (the 8.x ``/schemas/guids`` endpoint and ``guid`` fields), no ``/subjects/{s}/metadata``;
  ``GET /associations/resources/{ns}/{name}`` answers ``[]`` (a registry with no associations: confluent-kafka 2.16's
  default ASSOCIATED subject-name strategy asks it, then falls back to the topic strategy);
* a permanently deleted schema stays readable by id and keeps its id;
* the ``.proto`` text is this module's own rendering (Confluent's uses Square Wire): file options are dropped,
  services, extensions and groups are not rendered (such a schema is answered as base64 in the default format too),
  and the ``.proto`` text parser covers syntax/package/imports, messages, nested types, enums, ``map<>``, ``oneof``,
  proto3 ``optional``, ``reserved`` and ``default``/``packed``/``json_name``/``deprecated`` field options;
* ``normalize`` is accepted and ignored (the canonical form is already whitespace-insensitive);
* a 401 has the JSON body ``{"error_code": 401, "message": "Unauthorized"}`` (as Confluent's RBAC/Cloud registries
  answer) and a ``WWW-Authenticate`` header; a plain Jetty basic-auth setup answers an HTML body instead, which
  confluent-kafka turns into ``SchemaRegistryError(401, -1, ...)``.

Faults for tests: basic auth (``user``/``password``) and/or bearer ``token``; ``down()``/``up()`` really stop and
restart listening on the same port (clients see connection refused, pooled keep-alive connections are cut);
``fail_next(n, status)`` answers the next n requests with an error; ``delay_next(n, seconds)`` stalls them (a stalled
request still in flight when ``down()`` is called dies unanswered: the client sees the server disconnect).
Every request is logged in ``requests`` (and unknown ones in ``unknown_requests``) for assertions.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import fastavro
import jsonschema
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

from tests.services.proto_text import (
    InvalidProto,
    _add_file,
    _add_well_known,
    _ProtoParser,
    _ProtoSyntaxError,
    _render_proto,
    _Unsupported,
    _unused_file_name,
)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")
COMPATIBILITY_LEVELS = (
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
    "NONE",
)
MODES = ("READWRITE", "READONLY", "READONLY_OVERRIDE", "IMPORT")
#: The error code of a path the registry has no resource for (Jersey's NotFoundException, as the real one answers).
UNKNOWN_PATH_ERROR_CODE = 404

#: (schema type, candidate canonical schema, latest canonical schema) -> incompatibility messages (empty: compatible).
CompatibilityChecker = Callable[[str, str, str], list[str]]


class RegistryError(Exception):
    """An error answer of the registry: HTTP status, Confluent error code and message."""

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(f"{status} {error_code}: {message}")
        self.status = status
        self.error_code = error_code
        self.message = message


def _subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{subject}' not found.")


def _version_not_found(version: object) -> RegistryError:
    return RegistryError(404, 40402, f"Version {version} not found.")


def _invalid_schema(message: str) -> RegistryError:
    return RegistryError(422, 42201, f"Invalid schema: {message}")


@dataclass(frozen=True)
class RecordedRequest:
    """One request the registry answered: method, decoded path (no query), query, headers (lower-case), status."""

    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]
    body: Any
    status: int


@dataclass
class _Schema:
    id: int
    schema_type: str
    canonical: str  # what the registry answers by default
    references: list[dict[str, Any]]
    descriptor: bytes | None = None  # Protobuf only: a serialized FileDescriptorProto, for format=serialized


@dataclass
class _Version:
    subject: str
    version: int
    schema_id: int
    deleted: bool = False


@dataclass
class _Fault:
    remaining: int
    status: int = 500
    error_code: int = 50001
    message: str = "Error in the backend data store"
    delay_s: float = 0.0


@dataclass
class _Connections:
    lock: threading.Lock = field(default_factory=threading.Lock)
    sockets: set[socket.socket] = field(default_factory=set)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], registry: SchemaRegistryServer) -> None:
        self.registry = registry
        self.connections = _Connections()
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet about connections cut by ``down()`` or by the client; anything else is printed as usual."""
        import sys

        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    def cut_connections(self) -> None:
        """Shut down every open client connection, so that a pooled keep-alive connection sees the outage too."""
        with self.connections.lock:
            sockets = list(self.connections.sockets)
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real registry (Jetty)
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        # Headers and body are two writes: without TCP_NODELAY, Nagle + delayed ACK stall each answer ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.connections.lock:
            self.server.connections.sockets.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.server.connections.lock:
                self.server.connections.sockets.discard(self.connection)

    def _serve(self) -> None:
        self.server.registry._serve(self)

    do_GET = do_POST = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""


def _flag(query: Mapping[str, list[str]], name: str, default: bool = False) -> bool:
    values = query.get(name)
    return values[-1].strip().lower() == "true" if values else default


def _param(query: Mapping[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def _page(items: list[Any], query: Mapping[str, list[str]]) -> list[Any]:
    offset = int(_param(query, "offset") or 0)
    limit = int(_param(query, "limit") or -1)
    items = items[max(offset, 0) :]
    return items[:limit] if limit >= 0 else items


class SchemaRegistryServer:
    """An in-memory Confluent Schema Registry on ``http://127.0.0.1:<port>``, served by a daemon thread.

    ``url`` is the address to give a client. Use it as a context manager or call ``close()``.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        compatibility: str = "BACKWARD",
    ) -> None:
        if (user is None) != (password is None):
            raise ValueError("give both user and password, or neither")
        self.user = user
        self.password = password
        self.token = token
        self.compatibility_checker: CompatibilityChecker | None = None
        self._lock = threading.RLock()
        self._log_changed = threading.Condition(self._lock)
        self._schemas: dict[int, _Schema] = {}
        self._ids_by_key: dict[tuple[str, str, str], int] = {}
        self._subjects: dict[str, list[_Version]] = {}
        self._config: dict[str | None, dict[str, Any]] = {None: {"compatibilityLevel": compatibility}}
        self._modes: dict[str | None, str] = {None: "READWRITE"}
        self._faults: list[_Fault] = []
        self._requests: list[RecordedRequest] = []
        self._unknown: list[RecordedRequest] = []
        self._host = host
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._listen(port)
        assert self._httpd is not None
        self.port: int = int(self._httpd.server_address[1])
        self.url = f"http://{host}:{self.port}"

    # ------------------------------------------------------------------ lifecycle

    def _listen(self, port: int) -> None:
        self._interrupt = threading.Event()
        httpd = _HTTPServer((self._host, port), self)
        thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="schema-registry", daemon=True
        )
        thread.start()
        self._httpd, self._thread = httpd, thread

    @property
    def is_up(self) -> bool:
        return self._httpd is not None

    def down(self) -> None:
        """Stop listening and cut open connections: a client now gets *connection refused*. ``up()`` undoes it."""
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._httpd = self._thread = None
        httpd.shutdown()
        httpd.server_close()
        httpd.cut_connections()
        self._interrupt.set()
        if thread is not None:
            thread.join(timeout=10)

    def up(self) -> None:
        """Listen again on the same port, with the same state."""
        if self._httpd is None:
            self._listen(self.port)

    def close(self) -> None:
        self.down()

    def __enter__(self) -> SchemaRegistryServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ faults

    def fail_next(
        self, n: int = 1, status: int = 500, error_code: int | None = None, message: str | None = None
    ) -> None:
        """Answer the next ``n`` requests with ``status`` and an error body (50001 for a 500, else status*100+1
        for a 5xx, else the status itself), before authentication and routing."""
        if error_code is None:
            error_code = status * 100 + 1 if status >= 500 else status
        if message is None:
            message = "Error in the backend data store" if status >= 500 else "Injected failure"
        with self._lock:
            self._faults.append(_Fault(n, status, error_code, message))

    def delay_next(self, n: int, seconds: float) -> None:
        """Stall the next ``n`` requests ``seconds`` before answering them normally (to exercise client timeouts)."""
        with self._lock:
            self._faults.append(_Fault(n, status=0, error_code=0, message="", delay_s=seconds))

    @property
    def faults_pending(self) -> int:
        """How many requests the queued faults will still hit (0: a stall from ``delay_next`` has begun, say)."""
        with self._lock:
            return sum(max(f.remaining, 0) for f in self._faults)

    def clear_faults(self) -> None:
        """Drop the faults not yet used up."""
        with self._lock:
            self._faults.clear()

    def _take_fault(self) -> _Fault | None:
        with self._lock:
            while self._faults and self._faults[0].remaining <= 0:
                self._faults.pop(0)
            if not self._faults:
                return None
            fault = self._faults[0]
            fault.remaining -= 1
            return fault

    # ------------------------------------------------------------------ request log

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def unknown_requests(self) -> list[RecordedRequest]:
        """Requests for paths (or methods) this registry does not implement; a test asserts this stays empty."""
        with self._lock:
            return list(self._unknown)

    def calls(self, method: str | None = None, path: str | None = None) -> list[tuple[str, str]]:
        """(method, path) of the requests so far, optionally filtered by method and path prefix."""
        return [
            (r.method, r.path)
            for r in self.requests
            if (method is None or r.method == method) and (path is None or r.path.startswith(path))
        ]

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()
            self._unknown.clear()

    def wait_for_request(
        self, predicate: Callable[[RecordedRequest], bool], timeout_s: float = 10.0
    ) -> RecordedRequest:
        """The first logged request matching ``predicate``, waiting for it up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._log_changed:
            while True:
                for r in self._requests:
                    if predicate(r):
                        return r
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    seen = [(r.method, r.path) for r in self._requests]
                    raise AssertionError(f"schema registry: no matching request in {timeout_s}s; saw {seen}")
                self._log_changed.wait(remaining)

    # ------------------------------------------------------------------ direct helpers (no HTTP)

    def register(
        self,
        subject: str,
        schema_text: str,
        schema_type: str = "AVRO",
        references: Sequence[Mapping[str, Any]] = (),
    ) -> int:
        """Register a schema as ``POST /subjects/{subject}/versions`` would, without HTTP; returns its id."""
        body: dict[str, Any] = {"schema": schema_text, "schemaType": schema_type, "references": list(references)}
        with self._lock:
            return int(self._register(subject, body)["id"])

    def schema_by_id(self, schema_id: int, fmt: str | None = None) -> dict[str, Any]:
        """What ``GET /schemas/ids/{id}`` answers."""
        with self._lock:
            return self._schema_answer(self._schema(schema_id), fmt)

    def subjects(self) -> list[str]:
        with self._lock:
            return sorted(s for s, versions in self._subjects.items() if any(not v.deleted for v in versions))

    def versions(self, subject: str) -> list[int]:
        with self._lock:
            return [v.version for v in self._subjects.get(subject, []) if not v.deleted]

    def latest(self, subject: str) -> dict[str, Any]:
        """What ``GET /subjects/{subject}/versions/latest`` answers."""
        with self._lock:
            return self._version_answer(self._version(subject, "latest", deleted=False), None)

    def set_compatibility(self, level: str, subject: str | None = None) -> None:
        with self._lock:
            self._config.setdefault(subject, {})["compatibilityLevel"] = level

    def set_mode(self, mode: str, subject: str | None = None) -> None:
        with self._lock:
            self._modes[subject] = mode

    # ------------------------------------------------------------------ HTTP

    def _serve(self, handler: _Handler) -> None:
        split = urlsplit(handler.path)
        segments = [unquote(s) for s in split.path.split("/")[1:]]
        if segments and segments[-1] == "":
            segments.pop()  # a trailing slash
        path = "/" + "/".join(segments)
        query = parse_qs(split.query, keep_blank_values=True)
        headers = {k.lower(): v for k, v in handler.headers.items()}
        raw = handler.read_body()
        body: Any = None
        status, answer, extra_headers, known = 200, None, {}, True
        try:
            if raw:
                try:
                    body = json.loads(raw)
                except ValueError as e:
                    raise RegistryError(400, 400, f"Unexpected character in JSON body: {e}") from None
            fault = self._take_fault()
            if fault is not None and fault.delay_s > 0:
                self._interrupt.wait(fault.delay_s)  # down() and close() cut a stall short ...
                if handler.server is not self._httpd:  # ... and then the request dies unanswered
                    handler.close_connection = True
                    return
            elif fault is not None:
                raise RegistryError(fault.status, fault.error_code, fault.message)
            if not self._authorized(headers):
                extra_headers["WWW-Authenticate"] = 'Basic realm="SchemaRegistry"'
                raise RegistryError(401, 401, "Unauthorized")
            with self._lock:
                answer, known = self._route(handler.command, segments, query, body)
            if not known:
                raise RegistryError(404, UNKNOWN_PATH_ERROR_CODE, "HTTP 404 Not Found")
        except RegistryError as e:
            status, answer = e.status, {"error_code": e.error_code, "message": e.message}
        except Exception as e:  # a bug here must reach the test as a 500, not hang the client
            status, answer = 500, {"error_code": 50001, "message": f"{type(e).__name__}: {e}"}
        record = RecordedRequest(handler.command, path, query, headers, body, status)
        with self._log_changed:
            self._requests.append(record)
            if not known:
                self._unknown.append(record)
            self._log_changed.notify_all()
        payload = json.dumps(answer).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", CONTENT_TYPE)
        handler.send_header("Content-Length", str(len(payload)))
        for k, v in extra_headers.items():
            handler.send_header(k, v)
        handler.end_headers()
        handler.wfile.write(payload)

    def _authorized(self, headers: Mapping[str, str]) -> bool:
        if self.user is None and self.token is None:
            return True
        auth = headers.get("authorization", "")
        scheme, _, credentials = auth.partition(" ")
        if self.token is not None and scheme.lower() == "bearer" and credentials == self.token:
            return True
        if self.user is not None and scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(credentials, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return False
            return user == self.user and password == self.password
        return False

    def _route(self, method: str, segments: list[str], query: Mapping[str, list[str]], body: Any) -> tuple[Any, bool]:
        """The answer to a request and whether the path is known. Runs under the lock."""
        fmt = _param(query, "format")
        deleted = _flag(query, "deleted")
        match (method, segments):
            case ("GET", []):
                return {}, True
            case ("GET", ["schemas", "types"]):
                return list(SCHEMA_TYPES), True
            case ("GET", ["schemas"]):
                return self._list_schemas(query), True
            case ("GET", ["schemas", "ids", sid]):
                answer = self._schema_answer(self._schema(sid), fmt)
                if _flag(query, "fetchMaxId"):
                    answer["maxId"] = max(self._schemas, default=0)
                return answer, True
            case ("GET", ["schemas", "ids", sid, "schema"]):
                return self._raw(self._schema(sid), fmt), True
            case ("GET", ["schemas", "ids", sid, "subjects"]):
                schema = self._schema(sid)
                found = {
                    v.subject for v in self._all_versions() if v.schema_id == schema.id and (deleted or not v.deleted)
                }
                return _page(sorted(found), query), True
            case ("GET", ["schemas", "ids", sid, "versions"]):
                schema = self._schema(sid)
                pairs = [
                    {"subject": v.subject, "version": v.version}
                    for v in self._all_versions()
                    if v.schema_id == schema.id and (deleted or not v.deleted)
                ]
                return _page(pairs, query), True
            case ("GET", ["subjects"]):
                return self._list_subjects(query), True
            case ("GET", ["subjects", subject, "versions"]):
                return self._list_versions(subject, query), True
            case ("POST", ["subjects", subject, "versions"]):
                return self._register(subject, body), True
            case ("GET", ["subjects", subject, "versions", version]):
                return self._version_answer(self._version(subject, version, deleted), fmt), True
            case ("GET", ["subjects", subject, "versions", version, "schema"]):
                found = self._version(subject, version, deleted)
                return self._raw(self._schemas[found.schema_id], fmt), True
            case ("GET", ["subjects", subject, "versions", version, "referencedby"]):
                return self._referenced_by(self._version(subject, version, deleted=True), query), True
            case ("DELETE", ["subjects", subject, "versions", version]):
                return self._delete_version(subject, version, _flag(query, "permanent")), True
            case ("POST", ["subjects", subject]):
                return self._lookup(subject, body, deleted), True
            case ("DELETE", ["subjects", subject]):
                return self._delete_subject(subject, _flag(query, "permanent")), True
            case ("GET", ["config"]):
                return self._config_answer(None), True
            case ("GET", ["config", subject]):
                if subject not in self._config and not _flag(query, "defaultToGlobal"):
                    raise RegistryError(
                        404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured"
                    )
                return self._config_answer(subject if subject in self._config else None), True
            case ("PUT", ["config"]):
                return self._put_config(None, body), True
            case ("PUT", ["config", subject]):
                return self._put_config(subject, body), True
            case ("DELETE", ["config"]):
                old = self._config_answer(None)
                self._config[None] = {"compatibilityLevel": "BACKWARD"}
                return old, True
            case ("DELETE", ["config", subject]):
                if subject not in self._config:
                    raise RegistryError(
                        404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured"
                    )
                old = self._config_answer(subject)
                del self._config[subject]
                return old, True
            case ("GET", ["mode"]):
                return {"mode": self._modes[None]}, True
            case ("GET", ["mode", subject]):
                if subject not in self._modes and not _flag(query, "defaultToGlobal"):
                    raise RegistryError(404, 40409, f"Subject '{subject}' does not have subject-level mode configured")
                return {"mode": self._mode(subject)}, True
            case ("PUT", ["mode"]):
                return self._put_mode(None, body), True
            case ("PUT", ["mode", subject]):
                return self._put_mode(subject, body), True
            case ("DELETE", ["mode", subject]):
                old = self._modes.pop(subject, self._modes[None])
                return {"mode": old}, True
            case ("POST", ["compatibility", "subjects", subject, "versions", version]):
                target = self._version(subject, version, deleted=False)
                candidate = self._parse(body)
                return self._compatibility_answer(candidate, [self._schemas[target.schema_id]], query), True
            case ("POST", ["compatibility", "subjects", subject, "versions"]):
                candidate = self._parse(body)
                live = [self._schemas[v.schema_id] for v in self._subjects.get(subject, []) if not v.deleted]
                return self._compatibility_answer(candidate, live, query), True
            case ("GET", ["contexts"]):
                return ["."], True
            case ("GET", ["associations", "resources", _namespace, _name]):
                return [], True
        return None, False

    # ------------------------------------------------------------------ state (all under the lock)

    def _all_versions(self) -> Iterator[_Version]:
        for versions in self._subjects.values():
            yield from versions

    def _schema(self, sid: str | int) -> _Schema:
        try:
            schema_id = int(sid)
        except ValueError:
            raise RegistryError(404, 40403, f"Schema {sid} not found") from None
        if schema_id not in self._schemas:
            raise RegistryError(404, 40403, f"Schema {schema_id} not found")
        return self._schemas[schema_id]

    def _live_versions(self, subject: str, deleted: bool) -> list[_Version]:
        versions = [v for v in self._subjects.get(subject, []) if deleted or not v.deleted]
        if not versions:
            raise _subject_not_found(subject)
        return versions

    def _version(self, subject: str, version: str | int, deleted: bool) -> _Version:
        versions = self._live_versions(subject, deleted)
        if str(version) in ("latest", "-1"):
            return versions[-1]
        try:
            number = int(version)
        except ValueError:
            number = 0
        if number < 1:
            raise RegistryError(
                422,
                42202,
                f"The specified version '{version}' is not a valid version id. "
                'Allowed values are between [1, 2^31-1] and the string "latest"',
            )
        for v in versions:
            if v.version == number:
                return v
        raise _version_not_found(number)

    @staticmethod
    def _with_type(answer: dict[str, Any], schema: _Schema) -> dict[str, Any]:
        if schema.schema_type != "AVRO":
            answer["schemaType"] = schema.schema_type
        if schema.references:
            answer["references"] = [dict(r) for r in schema.references]
        return answer

    def _text(self, schema: _Schema, fmt: str | None) -> str:
        if schema.schema_type == "PROTOBUF" and fmt == "serialized" and schema.descriptor is not None:
            return base64.standard_b64encode(schema.descriptor).decode("ascii")
        return schema.canonical

    def _schema_answer(self, schema: _Schema, fmt: str | None) -> dict[str, Any]:
        return self._with_type({"schema": self._text(schema, fmt)}, schema)

    def _version_answer(self, version: _Version, fmt: str | None) -> dict[str, Any]:
        schema = self._schemas[version.schema_id]
        answer: dict[str, Any] = {"subject": version.subject, "version": version.version, "id": schema.id}
        self._with_type(answer, schema)
        answer["schema"] = self._text(schema, fmt)
        return answer

    def _raw(self, schema: _Schema, fmt: str | None) -> Any:
        text = self._text(schema, fmt)
        return json.loads(text) if schema.schema_type in ("AVRO", "JSON") else text

    def _list_schemas(self, query: Mapping[str, list[str]]) -> list[dict[str, Any]]:
        prefix = _param(query, "subjectPrefix") or ""
        deleted = _flag(query, "deleted")
        latest_only = _flag(query, "latestOnly")
        answers = []
        for subject in sorted(self._subjects):
            if not subject.startswith(prefix):
                continue
            versions = [v for v in self._subjects[subject] if deleted or not v.deleted]
            for v in versions[-1:] if latest_only else versions:
                answers.append(self._version_answer(v, _param(query, "format")))
        return _page(answers, query)

    def _list_subjects(self, query: Mapping[str, list[str]]) -> list[str]:
        prefix = _param(query, "subjectPrefix") or ""
        if prefix == ":*:":
            prefix = ""  # "all contexts"
        deleted, deleted_only = _flag(query, "deleted"), _flag(query, "deleted_only")
        found = []
        for subject, versions in sorted(self._subjects.items()):
            if not subject.startswith(prefix) or not versions:
                continue
            live = any(not v.deleted for v in versions)
            soft = any(v.deleted for v in versions)
            if (deleted_only and soft) or (not deleted_only and (live or (deleted and soft))):
                found.append(subject)
        return _page(found, query)

    def _list_versions(self, subject: str, query: Mapping[str, list[str]]) -> list[int]:
        versions = self._subjects.get(subject, [])
        if not versions:
            raise _subject_not_found(subject)
        if _flag(query, "deleted_only"):
            chosen = [v.version for v in versions if v.deleted]
        else:
            chosen = [v.version for v in versions if _flag(query, "deleted") or not v.deleted]
            if not chosen:
                raise _subject_not_found(subject)
        return _page(chosen, query)

    def _referenced_by(self, version: _Version, query: Mapping[str, list[str]]) -> list[int]:
        ids = sorted(
            s.id
            for s in self._schemas.values()
            if any(r.get("subject") == version.subject and r.get("version") == version.version for r in s.references)
        )
        return _page(ids, query)

    def _mode(self, subject: str) -> str:
        return self._modes.get(subject, self._modes[None])

    def _register(self, subject: str, body: Any) -> dict[str, Any]:
        parsed = self._parse(body)
        key = _identity(parsed)
        versions = self._subjects.setdefault(subject, [])
        for v in versions:
            if not v.deleted and _identity(self._schemas[v.schema_id]) == key:
                return {"id": v.schema_id}
        if self._mode(subject) in ("READONLY", "READONLY_OVERRIDE"):
            raise RegistryError(422, 42205, f"Subject {subject} is in read-only mode")
        live = [v for v in versions if not v.deleted]
        level = self._config.get(subject, self._config[None]).get("compatibilityLevel", "BACKWARD")
        if live and level != "NONE" and self.compatibility_checker is not None:
            latest = self._schemas[live[-1].schema_id]
            errors = self.compatibility_checker(parsed.schema_type, parsed.canonical, latest.canonical)
            if errors:
                raise RegistryError(
                    409,
                    409,
                    f'Schema being registered is incompatible with an earlier schema for subject "{subject}", '
                    f"details: {errors}",
                )
        schema_id = self._ids_by_key.get(key)
        if schema_id is None:
            schema_id = max(self._schemas, default=0) + 1
            self._schemas[schema_id] = _Schema(
                schema_id, parsed.schema_type, parsed.canonical, parsed.references, parsed.descriptor
            )
            self._ids_by_key[key] = schema_id
        number = max((v.version for v in versions), default=0) + 1
        versions.append(_Version(subject, number, schema_id))
        return {"id": schema_id}

    def _lookup(self, subject: str, body: Any, deleted: bool) -> dict[str, Any]:
        versions = self._live_versions(subject, deleted)
        key = _identity(self._parse(body))
        for v in versions:
            if _identity(self._schemas[v.schema_id]) == key:
                return self._version_answer(v, None)
        raise RegistryError(404, 40403, "Schema not found")

    def _delete_version(self, subject: str, version: str, permanent: bool) -> int:
        if self._mode(subject) in ("READONLY", "READONLY_OVERRIDE"):
            raise RegistryError(422, 42205, f"Subject {subject} is in read-only mode")
        found = self._version(subject, version, deleted=permanent)
        if permanent:
            if not found.deleted:
                raise RegistryError(
                    404,
                    40407,
                    f"Subject '{subject}' Version {found.version} was not deleted first before being "
                    "permanently deleted",
                )
            self._subjects[subject].remove(found)
        elif found.deleted:
            raise RegistryError(
                404,
                40406,
                f"Subject '{subject}' Version {found.version} was soft deleted."
                "Set permanent=true to delete permanently",
            )
        else:
            found.deleted = True
        return found.version

    def _delete_subject(self, subject: str, permanent: bool) -> list[int]:
        versions = self._subjects.get(subject, [])
        if not versions:
            raise _subject_not_found(subject)
        if self._mode(subject) in ("READONLY", "READONLY_OVERRIDE"):
            raise RegistryError(422, 42205, f"Subject {subject} is in read-only mode")
        if permanent:
            if any(not v.deleted for v in versions):
                raise RegistryError(
                    404, 40405, f"Subject '{subject}' was not deleted first before being permanently deleted"
                )
            del self._subjects[subject]
            self._config.pop(subject, None)
            self._modes.pop(subject, None)
            return [v.version for v in versions]
        live = [v for v in versions if not v.deleted]
        if not live:
            raise RegistryError(
                404, 40404, f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently"
            )
        for v in live:
            v.deleted = True
        return [v.version for v in live]

    def _config_answer(self, subject: str | None) -> dict[str, Any]:
        return dict(self._config[subject])

    def _put_config(self, subject: str | None, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise RegistryError(422, 42203, "Invalid compatibility level")
        level = body.get("compatibility", body.get("compatibilityLevel"))
        if level is not None and str(level).upper() not in COMPATIBILITY_LEVELS:
            raise RegistryError(
                422, 42203, f"Invalid compatibility level. Valid values are: {', '.join(COMPATIBILITY_LEVELS)}"
            )
        stored = {k: v for k, v in body.items() if k not in ("compatibility", "compatibilityLevel")}
        if level is not None:
            stored["compatibilityLevel"] = str(level).upper()
        self._config.setdefault(subject, {}).update(stored)
        answer = {k: v for k, v in body.items() if k != "compatibilityLevel"}
        if level is not None:
            answer["compatibility"] = str(level).upper()
        return answer

    def _put_mode(self, subject: str | None, body: Any) -> dict[str, Any]:
        mode = str(body.get("mode", "")).upper() if isinstance(body, dict) else ""
        if mode not in MODES:
            raise RegistryError(422, 42204, f"Invalid mode. Valid values are: {', '.join(MODES)}")
        self._modes[subject] = mode
        return {"mode": mode}

    def _compatibility_answer(
        self, candidate: _Parsed, against: list[_Schema], query: Mapping[str, list[str]]
    ) -> dict[str, Any]:
        errors: list[str] = []
        if self.compatibility_checker is not None:
            for existing in against:
                errors += self.compatibility_checker(candidate.schema_type, candidate.canonical, existing.canonical)
        answer: dict[str, Any] = {"is_compatible": not errors}
        if _flag(query, "verbose"):
            answer["messages"] = errors
        return answer

    # ------------------------------------------------------------------ parsing and canonical forms

    def _parse(self, body: Any) -> _Parsed:
        if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise _invalid_schema("the request has no schema")
        schema_type = str(body.get("schemaType") or "AVRO").upper()
        if schema_type not in SCHEMA_TYPES:
            raise RegistryError(422, 42201, f"Invalid schema type {schema_type}")
        references = []
        for ref in body.get("references") or []:
            if not isinstance(ref, dict) or not ref.get("name") or not ref.get("subject"):
                raise _invalid_schema(f"invalid reference {ref!r}")
            target = self._resolve_reference(ref)
            references.append({"name": ref["name"], "subject": ref["subject"], "version": target.version})
        text: str = body["schema"]
        if schema_type == "AVRO":
            return _Parsed(schema_type, self._parse_avro(text, references), references)
        if schema_type == "JSON":
            return _Parsed(schema_type, _parse_json_schema(text), references)
        return self._parse_protobuf(text, references)

    def _resolve_reference(self, ref: Mapping[str, Any]) -> _Version:
        try:
            return self._version(str(ref["subject"]), ref.get("version", "latest"), deleted=True)
        except RegistryError as e:
            raise _invalid_schema(f"reference {ref!r} not found: {e.message}") from None

    def _referenced_schemas(self, references: list[dict[str, Any]]) -> Iterator[tuple[str, _Schema]]:
        """(name, schema) of every reference, depth first, dependencies before dependents, each once."""
        seen: set[str] = set()

        def walk(refs: list[dict[str, Any]]) -> Iterator[tuple[str, _Schema]]:
            for ref in refs:
                if ref["name"] in seen:
                    continue
                seen.add(ref["name"])
                schema = self._schemas[self._resolve_reference(ref).schema_id]
                yield from walk(schema.references)
                yield ref["name"], schema

        yield from walk(references)

    def _parse_avro(self, text: str, references: list[dict[str, Any]]) -> str:
        try:
            obj = json.loads(text)
        except ValueError as e:
            raise _invalid_schema(f"not JSON: {e}") from None
        named: dict[str, Any] = {}
        try:
            for _, ref in self._referenced_schemas(references):
                fastavro.parse_schema(json.loads(ref.canonical), named_schemas=named)
            fastavro.parse_schema(obj, named_schemas=named)
        except Exception as e:
            raise _invalid_schema(f"{type(e).__name__}: {e}") from None
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)

    def _parse_protobuf(self, text: str, references: list[dict[str, Any]]) -> _Parsed:
        # As the real registry: the schema sees its references and the well-known files it imports, nothing else
        # (so google/protobuf/struct.proto itself can be registered).
        pool = descriptor_pool.DescriptorPool()
        for name, ref in self._referenced_schemas(references):
            if ref.descriptor is None:
                raise _invalid_schema(f"reference {name} is not a Protobuf schema")
            ref_proto = descriptor_pb2.FileDescriptorProto.FromString(ref.descriptor)
            for dependency in ref_proto.dependency:
                _add_well_known(pool, dependency)
            ref_proto.name = name
            try:
                _add_file(pool, ref_proto)
            except InvalidProto as e:
                raise _invalid_schema(str(e)) from None
        descriptor: bytes | None = None
        try:
            proto = _ProtoParser(text, pool).parse()
        except _ProtoSyntaxError as text_error:
            try:
                descriptor = base64.b64decode(text.strip().encode("ascii"), validate=True)
                proto = descriptor_pb2.FileDescriptorProto.FromString(descriptor)
            except Exception:
                raise _invalid_schema(f"neither .proto text ({text_error}) nor a base64 FileDescriptorProto") from None
            for dependency in proto.dependency:
                _add_well_known(pool, dependency)
        proto.name = _unused_file_name(pool)
        try:
            pool.Add(proto)
        except Exception as e:
            raise _invalid_schema(f"{type(e).__name__}: {e}") from None
        try:
            canonical = _render_proto(proto)
        except _Unsupported:
            canonical = base64.standard_b64encode(descriptor or proto.SerializeToString()).decode("ascii")
        if descriptor is None:
            proto.name = "default"
            descriptor = proto.SerializeToString()
        return _Parsed("PROTOBUF", canonical, references, descriptor)


@dataclass
class _Parsed:
    schema_type: str
    canonical: str
    references: list[dict[str, Any]]
    descriptor: bytes | None = None


def _identity(schema: _Schema | _Parsed) -> tuple[str, str, str]:
    """What makes two registrations the same schema (and so the same id): type, canonical text, references."""
    refs = [[r.get("name"), r.get("subject"), r.get("version")] for r in schema.references]
    return (schema.schema_type, schema.canonical, json.dumps(refs, separators=(",", ":")))


def _parse_json_schema(text: str) -> str:
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise _invalid_schema(f"not JSON: {e}") from None
    if not isinstance(obj, dict | bool):
        raise _invalid_schema("a JSON Schema is an object or a boolean")
    if isinstance(obj, dict):
        try:
            jsonschema.validators.validator_for(obj).check_schema(obj)
        except jsonschema.SchemaError as e:
            raise _invalid_schema(e.message) from None
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


@pytest.fixture
def schema_registry() -> Iterator[SchemaRegistryServer]:
    """A running registry with no schemas, closed after the test."""
    with SchemaRegistryServer() as server:
        yield server
