"""A Prometheus ``/metrics`` endpoint for otel-tunix's OpenTelemetry instruments.

:class:`PrometheusEndpoint` pairs the OpenTelemetry Prometheus exporter
(:class:`opentelemetry.exporter.prometheus.PrometheusMetricReader`) with a small HTTP server
running on a background daemon thread::

    from opentelemetry.sdk.metrics import MeterProvider
    from otel_tunix.exporters.prometheus import PrometheusEndpoint

    endpoint = PrometheusEndpoint()                 # 127.0.0.1, a free port
    provider = MeterProvider(metric_readers=[endpoint.reader])
    print(endpoint.url)                             # http://127.0.0.1:<port>/metrics
    ...
    provider.shutdown()                             # also stops the endpoint

Routes: ``GET /metrics`` (Prometheus text format, or OpenMetrics when the scraper asks for
it) and ``GET /healthz`` (``200 ok``); every other path answers ``404``.

Under load the server holds: a listen backlog of 512, eight worker threads whatever the
number of scrapers, idle or stalled connections closed after 10 s without a thread each
(200 concurrent scrapes all answered; a thread per connection and a backlog of 5 failed 24
of them, ``tests/exporters/test_prometheus_load.py``). Label values and help texts are made
valid UTF-8, so an odd component name cannot fail a scrape.

Each endpoint owns a private :class:`prometheus_client.CollectorRegistry`, so several
endpoints (one per rank, or one per test) live side by side in one process without their
metric names colliding in the global registry.

Settings resolve in this order: the constructor argument, ``OTEL_TUNIX_PROMETHEUS_HOST`` /
``OTEL_TUNIX_PROMETHEUS_PORT``, the OpenTelemetry SDK's ``OTEL_EXPORTER_PROMETHEUS_HOST`` /
``OTEL_EXPORTER_PROMETHEUS_PORT``, then the defaults ``127.0.0.1`` and port ``0`` (a free
port chosen by the OS; read it back from :attr:`PrometheusEndpoint.port`). The default
binds loopback only: set the host to ``0.0.0.0`` to let a Prometheus server on another
machine scrape it.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.metrics_core import Metric

from otel_tunix.settings.values import load_setting
from otel_tunix.settings.variables import OTEL_TUNIX_PROMETHEUS_HOST, OTEL_TUNIX_PROMETHEUS_PORT
from otel_tunix.support.text import utf8_text

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "HEALTH_PATH",
    "METRICS_PATH",
    "OTEL_TUNIX_PROMETHEUS_HOST",
    "OTEL_TUNIX_PROMETHEUS_PORT",
    "PrometheusEndpoint",
    "endpoint_reader",
]

_logger = logging.getLogger(__name__)

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 0
METRICS_PATH: Final = "/metrics"
HEALTH_PATH: Final = "/healthz"
BACKLOG: Final = 512
"""Listen backlog of the endpoint (the kernel caps it at ``net.core.somaxconn``)."""
WORKERS: Final = 8
"""Threads that serve requests; more concurrent scrapes wait their turn."""
IDLE_TIMEOUT_SEC: Final = 10.0
"""A connection that sends no request, or stalls in one, is closed after this."""
MAX_WAITING: Final = 1024
"""Connections held open waiting for their request at most; more are closed at once."""

_WSGIEnviron = dict[str, Any]
_StartResponse = Callable[..., Any]
_WSGIApp = Callable[[_WSGIEnviron, _StartResponse], Iterable[bytes]]


class PrometheusEndpoint:
    """Serves the metrics of a ``MeterProvider`` at ``/metrics`` from a daemon thread.

    The server starts in the constructor; pass :attr:`reader` to the ``MeterProvider``.
    Shutting the provider down shuts the endpoint down too, and :meth:`shutdown` may be
    called any number of times, before or after the provider's.

    Args:
        host: Interface to bind. ``None`` reads ``OTEL_TUNIX_PROMETHEUS_HOST``, then
            ``OTEL_EXPORTER_PROMETHEUS_HOST``, then uses ``127.0.0.1``.
        port: Port to bind, ``0`` for a free one. ``None`` reads
            ``OTEL_TUNIX_PROMETHEUS_PORT``, then ``OTEL_EXPORTER_PROMETHEUS_PORT``, then
            uses ``0``.
        registry: The ``prometheus_client`` registry the reader registers in. ``None``
            (the default) creates a private one for this endpoint.
        labels: Labels put on every series (``configure()`` gives ``service`` and
            ``run_id``), so one Prometheus scraping several jobs tells their series apart
            without a join on ``target_info``; a series' own label of the same name wins.

    Raises:
        ValueError: The port (argument or environment variable, named in the message) is
            not an integer from 0 to 65535.
        OSError: The address cannot be bound (for example, the port is taken).
    """

    def __init__(
        self,
        host: str | None = None,
        port: int | None = None,
        *,
        registry: CollectorRegistry | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self._host = _resolve_host(host)
        requested_port = _resolve_port(port)
        self._registry = registry if registry is not None else CollectorRegistry()
        self._lock = threading.Lock()
        self._stopped = False

        # Bind before creating the reader, so a bind failure leaves nothing registered.
        self._server = _bind(
            self._host, requested_port, _make_app(self._registry, dict(labels or {}))
        )
        self._port: int = self._server.server_port
        try:
            self._reader = _EndpointMetricReader(self._registry, self._stop_server)
        except BaseException:  # release the bound port, then raised on
            self._server.server_close()
            raise
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            name=f"otel-tunix-prometheus-{self._port}",
            daemon=True,
        )
        self._thread.start()
        _logger.info("otel-tunix Prometheus endpoint serving %s", self.url)

    @property
    def reader(self) -> PrometheusMetricReader:
        """The metric reader to pass to ``MeterProvider(metric_readers=[...])``."""
        return self._reader

    @property
    def registry(self) -> CollectorRegistry:
        """The ``prometheus_client`` registry this endpoint serves."""
        return self._registry

    @property
    def host(self) -> str:
        """The host (interface) the server is bound to."""
        return self._host

    @property
    def port(self) -> int:
        """The port the server is bound to (the real one when ``0`` was asked for)."""
        return self._port

    @property
    def url(self) -> str:
        """The full URL of the metrics route, e.g. ``http://127.0.0.1:9464/metrics``."""
        return self._base_url() + METRICS_PATH

    @property
    def health_url(self) -> str:
        """The full URL of the health route, e.g. ``http://127.0.0.1:9464/healthz``."""
        return self._base_url() + HEALTH_PATH

    @property
    def running(self) -> bool:
        """Whether the server thread is still serving."""
        return self._thread.is_alive() and not self._stopped

    def shutdown(self) -> None:
        """Stops the server, frees the port and unregisters the reader's collector.

        Idempotent: later calls, and the ``MeterProvider``'s own shutdown, do nothing more.
        """
        self._reader.shutdown()

    def _base_url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    def _stop_server(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"PrometheusEndpoint(url={self.url!r}, {state})"


def endpoint_reader() -> PrometheusMetricReader:
    """Starts a :class:`PrometheusEndpoint` configured from the environment; returns its reader.

    Takes no arguments, so it can back an ``opentelemetry_metrics_exporter`` entry point
    (``OTEL_METRICS_EXPORTER=<name>``): unlike the stock ``prometheus`` entry point, which
    serves the global registry on port 9464, this endpoint has its own registry, a
    ``/healthz`` route and reads ``OTEL_TUNIX_PROMETHEUS_*`` first. The URL is logged at INFO;
    shutting the ``MeterProvider`` down stops the server.

    Returns:
        The reader to pass to ``MeterProvider(metric_readers=[...])``.
    """
    return PrometheusEndpoint().reader


class _EndpointMetricReader(PrometheusMetricReader):
    """A :class:`PrometheusMetricReader` whose shutdown also stops the endpoint's server.

    The upstream reader's ``shutdown`` unregisters its collector and raises ``KeyError``
    when called twice; this one is idempotent, because both the ``MeterProvider`` and
    :meth:`PrometheusEndpoint.shutdown` call it.
    """

    def __init__(self, registry: CollectorRegistry, stop_server: Callable[[], None]) -> None:
        super().__init__(registry=registry)
        self._stop_server = stop_server
        self._shutdown_lock = threading.Lock()
        self._unregistered = False

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._stop_server()
        with self._shutdown_lock:
            if self._unregistered:
                return
            self._unregistered = True
        try:
            super().shutdown(timeout_millis=timeout_millis, **kwargs)
        except KeyError:  # already unregistered from the registry by someone else
            pass


def _resolve_host(host: str | None) -> str:
    if host is not None:
        if not host.strip():
            raise ValueError("host must be a non-empty host name or IP address")
        return host.strip()
    for name in (OTEL_TUNIX_PROMETHEUS_HOST, "OTEL_EXPORTER_PROMETHEUS_HOST"):
        value: str | None = load_setting(name)
        if value:
            return value
    return DEFAULT_HOST


def _resolve_port(port: int | None) -> int:
    if port is not None:
        return _parse_port(port, "port")
    for name in (OTEL_TUNIX_PROMETHEUS_PORT, "OTEL_EXPORTER_PROMETHEUS_PORT"):
        port = load_setting(name)
        if port is not None:
            return int(port)
    return DEFAULT_PORT


def _parse_port(value: object, name: str) -> int:
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    else:
        try:
            number = int(str(value), 10)
        except ValueError:
            number = None
    if number is None or not 0 <= number <= 65535:
        raise ValueError(
            f"{name}={value!r} is not a valid port: expected an integer from 0 to 65535 "
            "(0 picks a free port)"
        )
    return number


def _make_app(registry: CollectorRegistry, labels: Mapping[str, str]) -> _WSGIApp:
    # prometheus_client's make_wsgi_app serves the metrics on every path and has no health
    # route, so this wrapper routes /metrics to it, answers /healthz itself, and 404s the
    # rest. All the exposition (text format, OpenMetrics, gzip) stays prometheus_client's.
    metrics_app: _WSGIApp = make_wsgi_app(_ExposedRegistry(registry, labels))

    def app(environ: _WSGIEnviron, start_response: _StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "") or "/"
        if path.rstrip("/") == METRICS_PATH:
            return metrics_app(environ, start_response)
        if path.rstrip("/") == HEALTH_PATH:
            body = b"ok"
            status = "200 OK"
        else:
            body = f"not found: {path}; try {METRICS_PATH} or {HEALTH_PATH}\n".encode()
            status = "404 Not Found"
        start_response(
            status,
            [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
        )
        return [body]

    return app


class _ExposedRegistry:
    """The registry as the exposition reads it (``collect``, ``restricted_registry``), with
    the endpoint's labels on every sample, and label values and help texts made valid
    UTF-8: a component name holding a lone surrogate would otherwise fail the encoding of
    the whole scrape (HTTP 500, every metric lost)."""

    def __init__(self, registry: Any, labels: Mapping[str, str]) -> None:
        self._registry = registry
        self._labels = {k: utf8_text(v) for k, v in labels.items()}

    def collect(self) -> Iterable[Metric]:
        extra = self._labels
        for metric in self._registry.collect():
            metric.documentation = utf8_text(metric.documentation)
            metric.samples = [
                s._replace(labels={**extra, **{k: utf8_text(v) for k, v in s.labels.items()}})
                if extra or any(not v.isascii() for v in s.labels.values())
                else s
                for s in metric.samples
            ]
            yield metric

    def restricted_registry(self, names: Iterable[str]) -> _ExposedRegistry:
        return _ExposedRegistry(self._registry.restricted_registry(names), self._labels)


class _PooledWSGIServer(WSGIServer):
    """A WSGI server with a listen backlog of :data:`BACKLOG`, a bounded pool of
    :data:`WORKERS` threads, and no thread for a connection that has sent nothing yet.

    Accepted connections wait in one selector thread until their request arrives (an idle
    connection costs a socket, not a thread; one idle past :data:`IDLE_TIMEOUT_SEC`, or past
    :data:`MAX_WAITING` waiting, is closed), then go to the pool; a request that stalls half
    way is cut after :data:`IDLE_TIMEOUT_SEC` (the handler's socket timeout). Each
    connection serves one request (wsgiref's HTTP/1.0 handling).
    """

    request_queue_size = BACKLOG
    _waiter: threading.Thread | None = None  # set when the server is activated

    def server_activate(self) -> None:
        super().server_activate()
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="otel-tunix-prometheus")
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._incoming: deque[tuple[socket.socket, Any]] = deque()
        self._closing = False
        self._waiter = threading.Thread(
            target=self._wait_for_requests, name="otel-tunix-prometheus-wait", daemon=True
        )
        self._waiter.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        self._incoming.append((request, client_address))  # to the selector thread
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # the buffer is full (it is being woken already) or closed
            pass

    def _wait_for_requests(self) -> None:
        waiting: dict[socket.socket, tuple[Any, float]] = {}
        while not self._closing:
            for key, _ in self._selector.select(timeout=1.0):
                conn = key.fileobj
                if conn is self._wake_r:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except OSError:  # drained
                        pass
                    continue
                assert isinstance(conn, socket.socket)
                self._selector.unregister(conn)
                address, _ = waiting.pop(conn)
                self._pool.submit(self._serve, conn, address)
            now = time.monotonic()
            while self._incoming:
                conn, address = self._incoming.popleft()
                if len(waiting) >= MAX_WAITING:
                    self.shutdown_request(conn)
                    continue
                waiting[conn] = (address, now)
                self._selector.register(conn, selectors.EVENT_READ, None)
            for conn, (_, since) in list(waiting.items()):
                if now - since > IDLE_TIMEOUT_SEC:
                    self._selector.unregister(conn)
                    del waiting[conn]
                    self.shutdown_request(conn)
        for conn in waiting:
            self.shutdown_request(conn)

    def _serve(self, conn: Any, address: Any) -> None:
        try:
            self.finish_request(conn, address)
        except Exception:  # a broken client: its connection only
            self.handle_error(conn, address)
        finally:
            self.shutdown_request(conn)

    def server_close(self) -> None:
        super().server_close()
        if self._waiter is None:  # the bind failed: nothing was started
            return
        self._closing = True
        self._wake()
        self._waiter.join(timeout=5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        _logger.debug("otel-tunix Prometheus endpoint: request from %s failed", client_address)


class _QuietHandler(WSGIRequestHandler):
    """Does not print a line to stderr for every scrape; gives up on a request that stalls
    (its socket times out after :data:`IDLE_TIMEOUT_SEC`)."""

    timeout = IDLE_TIMEOUT_SEC

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _bind(host: str, port: int, app: _WSGIApp) -> WSGIServer:
    # prometheus_client.start_http_server would also do this, but it serves its own app
    # (no health route), so the server is built here with the same ingredients: the
    # address family chosen from the host, a threading WSGI server and a quiet handler.
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        server_class = type(
            "_PrometheusEndpointServer", (_PooledWSGIServer,), {"address_family": family}
        )
        return make_server(
            str(sockaddr[0]), port, app, server_class=server_class, handler_class=_QuietHandler
        )
    except OSError as exc:
        raise OSError(
            exc.errno, f"cannot serve Prometheus metrics on {host}:{port}: {exc.strerror or exc}"
        ) from exc
