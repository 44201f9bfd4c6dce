"""The Prometheus endpoint under load: many scrapes at once, idle connections, a taken port."""

from __future__ import annotations

import logging
import socket
import statistics
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider

import otel_tunix

pytest.importorskip("prometheus_client")
from otel_tunix.exporters.prometheus import WORKERS, PrometheusEndpoint

SCRAPES = 200


@pytest.fixture
def served() -> Iterator[PrometheusEndpoint]:
    endpoint = PrometheusEndpoint()
    provider = MeterProvider(metric_readers=[endpoint.reader])
    hist = provider.get_meter("t").create_histogram("tunix.step.duration", unit="s")
    for scope in ("train", "eval", "rl/actor", "rl/learner"):
        for v in (0.01, 0.1, 1.0):
            hist.record(v, {"scope": scope})
    yield endpoint
    provider.shutdown()


def _endpoint_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("otel-tunix-prometheus")]


def test_two_hundred_concurrent_scrapes_are_all_served_by_a_bounded_pool(served):
    start = threading.Barrier(SCRAPES)
    results: list[tuple[int, float]] = []
    lock = threading.Lock()

    def scrape() -> None:
        start.wait()
        t0 = time.perf_counter()
        with urllib.request.urlopen(served.url, timeout=60) as response:
            body = response.read()
        with lock:
            results.append((response.status, time.perf_counter() - t0))
        assert b"tunix_step_duration_seconds_bucket" in body

    clients = [threading.Thread(target=scrape) for _ in range(SCRAPES)]
    for c in clients:
        c.start()
    peak = 0
    while any(c.is_alive() for c in clients):
        peak = max(peak, len(_endpoint_threads()))
        time.sleep(0.005)
    for c in clients:
        c.join()
    assert [status for status, _ in results] == [200] * SCRAPES
    assert peak <= WORKERS + 2  # the pool, the selector thread, the accepting thread
    took = sorted(t for _, t in results)
    print(f"{SCRAPES} scrapes: p50 {statistics.median(took):.3f} s, max {took[-1]:.3f} s")


def test_idle_connections_hold_no_threads_and_scrapes_go_on(served):
    idle = []
    for _ in range(SCRAPES):
        conn = socket.create_connection((served.host, served.port))
        idle.append(conn)  # connected, never sends a request
    try:
        with urllib.request.urlopen(served.url, timeout=60) as response:
            assert response.status == 200
        assert len(_endpoint_threads()) <= WORKERS + 2
    finally:
        for conn in idle:
            conn.close()


def test_a_taken_port_is_reported_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
        monkeypatch.setenv("OTEL_TUNIX_PROMETHEUS_PORT", str(port))
        with caplog.at_level(logging.WARNING, logger="otel_tunix"):
            info = otel_tunix.configure(output_dir=tmp_path, system_metrics=False)
        with otel_tunix.step(0):
            with otel_tunix.component("work"):
                pass
        otel_tunix.shutdown()
    assert "prometheus" not in info.endpoints
    (message,) = [r.getMessage() for r in caplog.records if "Prometheus" in r.getMessage()]
    assert f"cannot serve Prometheus metrics on 127.0.0.1:{port}" in message
    assert "the run goes on without the Prometheus endpoint" in message
    assert '"step":0' in (tmp_path / "spans.jsonl").read_text().replace(" ", "")
