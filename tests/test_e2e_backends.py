"""End to end through configure(): DogStatsD (real datadog client, loopback UDP) and the
Prometheus endpoint (scraped over HTTP, parsed with prometheus_client)."""

from __future__ import annotations

import socket
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

import otel_tunix


def _steps(n: int) -> None:
    for i in range(n):
        with otel_tunix.step(i, scope="train"):
            with otel_tunix.component("train_step_compute"):
                time.sleep(0.002)
            with otel_tunix.component("train_queue_wait", blocked=True):
                time.sleep(0.001)


def _parse_dogstatsd(packets: list[bytes]) -> list[tuple[str, float, str, dict[str, str]]]:
    out = []
    for packet in packets:
        for line in packet.decode().splitlines():
            if not line or line.startswith(("_e{", "_sc|")):
                continue
            head, *fields = line.split("|")
            name, value = head.rsplit(":", 1)
            kind = fields[0]
            tags: dict[str, str] = {}
            for f in fields[1:]:
                if f.startswith("#"):
                    for t in f[1:].split(","):
                        k, _, v = t.partition(":")
                        tags[k] = v
            out.append((name, float(value), kind, tags))
    return out


def test_datadog_enabled_sends_step_distributions_and_metrics(monkeypatch):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    monkeypatch.setenv("DATADOG_ENABLED", "true")
    monkeypatch.setenv("DD_AGENT_HOST", "127.0.0.1")
    monkeypatch.setenv("DD_DOGSTATSD_PORT", str(sock.getsockname()[1]))
    monkeypatch.setenv("DD_ENV", "staging")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "dd-train")
    info = otel_tunix.configure(output_dir="none")
    _steps(3)
    otel_tunix.shutdown()
    packets = []
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            packets.append(sock.recv(65535))
        except TimeoutError:
            if packets:
                break
    sock.close()
    metrics = _parse_dogstatsd(packets)
    dist = [m for m in metrics if m[0] == "tunix.step.busy_time" and m[2] == "d"]
    assert len(dist) == 3
    for _, value, _, tags in dist:
        assert 0.002 <= value < 0.1
        assert tags["scope"] == "train"
        assert tags["service"] == "dd-train"
        assert tags["env"] == "staging"
        assert tags["run_id"] == info.run_id
    comp = [m for m in metrics if m[0] == "tunix.component.blocked_time" and m[2] == "d"]
    assert {m[3]["component"] for m in comp} == {"train_queue_wait"}
    # the OTel metric exporter runs too: histogram counts and the step counter
    counts = [m for m in metrics if m[0] == "tunix.step.duration.count"]
    assert sum(m[1] for m in counts) == 3
    steps = [m for m in metrics if m[0] == "tunix.steps"]
    assert steps and steps[0][2] == "c"


def test_prometheus_endpoint_from_otel_metrics_exporter(monkeypatch):
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    monkeypatch.setenv("OTEL_TUNIX_PROMETHEUS_PORT", "0")
    info = otel_tunix.configure(output_dir="none")
    _steps(2)
    otel_tunix.force_flush()
    url = info.endpoints["prometheus"]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    health = urllib.request.urlopen(url.replace("/metrics", "/healthz"), timeout=5)
    assert health.status == 200
    otel_tunix.shutdown()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    busy = families["tunix_step_busy_time_seconds"]
    assert busy.type == "histogram"
    count = next(s for s in busy.samples if s.name.endswith("_count"))
    assert count.value == 2 and count.labels["scope"] == "train"
    comp = families["tunix_component_busy_time_seconds"]
    assert {s.labels.get("component") for s in comp.samples} == {"train_step_compute"}
    buckets = [s for s in busy.samples if s.name.endswith("_bucket")]
    assert {s.labels["le"] for s in buckets} >= {"0.005", "0.01", "+Inf"}
