"""A real OTLP/HTTP metrics receiver for the tests: an HTTP server on loopback that decodes each
``ExportMetricsServiceRequest`` (protobuf, optionally gzip) with opentelemetry-proto and keeps it.

No collector binary is on the machine, so this is the wire protocol's receiving end. Started once per session,
only when a test asks for ``otlp_receiver``.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

#: (metric name, sorted label pairs) -> the data point's value; a histogram's value is its count.
Points = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class OtlpReceiver:
    endpoint: str  # what OTEL_EXPORTER_OTLP_ENDPOINT is set to
    requests: list[ExportMetricsServiceRequest] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def clear(self) -> None:
        with self.lock:
            self.requests.clear()
            self.headers.clear()

    def latest_points(self) -> Points:
        """Every data point received, the latest value of each series winning."""
        points: Points = {}
        with self.lock:
            requests = list(self.requests)
        for request in requests:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        kind = m.WhichOneof("data")
                        for p in getattr(m, kind).data_points:
                            labels = tuple(sorted((a.key, a.value.string_value) for a in p.attributes))
                            if kind == "histogram":
                                value = float(p.count)
                            else:
                                value = float(p.as_int if p.WhichOneof("value") == "as_int" else p.as_double)
                            points[(m.name, labels)] = value
        return points

    def service_names(self) -> set[str]:
        with self.lock:
            return {
                a.value.string_value
                for r in self.requests
                for rm in r.resource_metrics
                for a in rm.resource.attributes
                if a.key == "service.name"
            }

    def wait_for(self, condition: Callable[[Points], bool], timeout_s: float = 30.0) -> Points:
        deadline = time.monotonic() + timeout_s
        while True:
            points = self.latest_points()
            if condition(points):
                return points
            if time.monotonic() >= deadline:
                raise AssertionError(f"OTLP receiver: condition not met in {timeout_s}s; got {sorted(points)}")
            time.sleep(0.1)


def _handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/metrics":
                self.send_error(404)
                return
            request = ExportMetricsServiceRequest()
            request.ParseFromString(body)
            with receiver.lock:
                receiver.requests.append(request)
                receiver.headers.append(dict(self.headers.items()))
            payload = ExportMetricsServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *_args: object) -> None:  # quiet: pytest shows failures, not every request
            return

    return Handler


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver("")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    receiver.endpoint = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
