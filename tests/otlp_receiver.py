"""OTLP receivers for tests that must see the requests themselves (headers, deadlines,
TLS), where rotel cannot: its OTLP receivers take neither TLS nor client certificates.

:func:`grpc_receiver` serves the OTLP/gRPC services (grpcio, any ``.../Export`` method:
traces, metrics, logs), :func:`http_receiver` the OTLP/HTTP paths (``http.server``); both
on a free loopback port, plain or with TLS (:class:`ServerTls`, optionally requiring a
client certificate), answering every export with success and keeping each request.
"""

from __future__ import annotations

import gzip
import http.server
import ssl
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
from opentelemetry.proto.trace.v1.trace_pb2 import Span

__all__ = ["OtlpReceiver", "Request", "ServerTls", "attributes", "grpc_receiver", "http_receiver"]

_SIGNALS = {"trace": "traces", "metrics": "metrics", "logs": "logs"}


@dataclass(frozen=True)
class ServerTls:
    """A receiver's TLS: its certificate and key, and the CA its clients' certificates
    must be signed by (``None``: no client certificate asked for)."""

    cert: Path
    key: Path
    client_ca: Path | None = None


@dataclass(frozen=True)
class Request:
    """One export request as the receiver got it."""

    signal: str
    """``traces``, ``metrics`` or ``logs``."""
    headers: dict[str, str]
    """HTTP headers or gRPC metadata, names in lower case."""
    body: bytes
    """As received (gzip'd over HTTP when ``content-encoding`` says so; gRPC's own
    compression is undone by grpcio)."""
    deadline_s: float | None = None
    """gRPC: seconds left before the client's deadline when the call arrived."""

    @property
    def payload(self) -> bytes:
        """The request's protobuf bytes."""
        if self.headers.get("content-encoding") == "gzip":
            return gzip.decompress(self.body)
        return self.body


@dataclass
class OtlpReceiver:
    """A running receiver: its endpoint, what it received; :meth:`close` stops it."""

    endpoint: str
    """``http://`` or ``https://127.0.0.1:<port>`` (an OTLP base endpoint: the HTTP
    receiver takes ``/v1/traces``, ``/v1/metrics`` and ``/v1/logs``)."""
    requests: list[Request] = field(default_factory=list)
    handshake_failures: int = 0
    """TLS handshakes that failed (HTTP receiver only: grpcio does not tell)."""
    _stop: Callable[[], None] = lambda: None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _received: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self._received = threading.Condition(self._lock)

    def add(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)
            self._received.notify_all()

    def wait(self, signal: str, timeout: float = 10.0) -> bool:
        """Whether a request of ``signal`` arrived within ``timeout`` seconds."""
        with self._lock:
            return self._received.wait_for(
                lambda: any(r.signal == signal for r in self.requests), timeout
            )

    def of(self, signal: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.signal == signal]

    def spans(self) -> list[Span]:
        """Every span received, decoded, in arrival order."""
        return [
            span
            for r in self.of("traces")
            for rs in ExportTraceServiceRequest.FromString(r.payload).resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    def metrics(self, name: str) -> list[Metric]:
        """Every metric named ``name`` received (one per export request that held it)."""
        return [
            metric
            for r in self.of("metrics")
            for rm in ExportMetricsServiceRequest.FromString(r.payload).resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
            if metric.name == name
        ]

    def logs(self) -> list[LogRecord]:
        """Every log record received, decoded, in arrival order."""
        return [
            record
            for r in self.of("logs")
            for rl in ExportLogsServiceRequest.FromString(r.payload).resource_logs
            for sl in rl.scope_logs
            for record in sl.log_records
        ]

    def close(self) -> None:
        self._stop()


def attributes(kvs: Iterable[KeyValue]) -> dict[str, Any]:
    """An OTLP attribute list as a dict of plain values (scalars only)."""
    out: dict[str, Any] = {}
    for kv in kvs:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out


def _signal_of(path: str) -> str:
    """``traces`` for ``/v1/traces`` or ``/opentelemetry.proto.collector.trace.v1....``."""
    path = path.partition("?")[0]
    for part, signal in _SIGNALS.items():
        if path.endswith(f"/v1/{signal}") or f".{part}.v1." in path:
            return signal
    return path


def grpc_receiver(tls: ServerTls | None = None, port: int = 0) -> OtlpReceiver:
    """The OTLP/gRPC services on loopback, on ``port`` (0: a free one; ``https://`` with
    ``tls``)."""
    import grpc

    receiver = OtlpReceiver(endpoint="")

    class Handler(grpc.GenericRpcHandler):
        def service(self, details: Any) -> Any:
            signal = _signal_of(details.method)

            def export(request: bytes, context: Any) -> bytes:
                metadata = {k.lower(): v for k, v in context.invocation_metadata()}
                receiver.add(Request(signal, metadata, request, context.time_remaining()))
                return b""  # an empty Export...ServiceResponse: all accepted

            return grpc.unary_unary_rpc_method_handler(export)  # bytes in and out

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((Handler(),))
    if tls is None:
        port = server.add_insecure_port(f"127.0.0.1:{port}")
    else:
        credentials = grpc.ssl_server_credentials(
            [(tls.key.read_bytes(), tls.cert.read_bytes())],
            root_certificates=tls.client_ca.read_bytes() if tls.client_ca else None,
            require_client_auth=tls.client_ca is not None,
        )
        port = server.add_secure_port(f"127.0.0.1:{port}", credentials)
    server.start()
    receiver.endpoint = f"{'http' if tls is None else 'https'}://127.0.0.1:{port}"
    receiver._stop = lambda: server.stop(0)
    return receiver


def http_receiver(tls: ServerTls | None = None) -> OtlpReceiver:
    """The OTLP/HTTP paths on a free loopback port (``https://`` with ``tls``)."""
    receiver = OtlpReceiver(endpoint="")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            headers = {k.lower(): v for k, v in self.headers.items()}
            receiver.add(Request(_signal_of(self.path), headers, body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return None

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True

        def get_request(self) -> Any:
            try:
                return super().get_request()  # the TLS handshake happens here
            except ssl.SSLError:  # counted; socketserver then skips the connection
                receiver.handshake_failures += 1
                raise

    server = Server(("127.0.0.1", 0), Handler)
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls.cert, tls.key)
        if tls.client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(tls.client_ca)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="otlp-http-receiver", daemon=True).start()
    receiver.endpoint = f"{'http' if tls is None else 'https'}://127.0.0.1:{server.server_port}"

    def stop() -> None:
        server.shutdown()
        server.server_close()

    receiver._stop = stop
    return receiver
