"""The importable dashboards name only metrics that otel-tunix really emits.

The names come from a real run: otel-tunix configured with the Prometheus endpoint and
DogStatsD (the real ``datadog`` client to a loopback UDP socket), a few steps with forward /
backward / a blocked wait, logged loss / learning rate / KL / clip fraction, and an
instrumented queue sampled by the system sampler. GPU metrics (``hw.gpu.*``) cannot be
emitted on a machine without an NVIDIA GPU (CI has none); for those the test checks the
catalog entry, whose emission ``bench/gpu_check.py`` showed on an H100.
"""

from __future__ import annotations

import json
import queue
import re
import socket
import time
import urllib.request
from pathlib import Path

import pytest

import otel_tunix
from otel_tunix.metrics import CATALOG, instrument_queue

DASHBOARDS = Path(__file__).resolve().parent.parent / "collector-config" / "dashboards"


@pytest.fixture(scope="module")
def emitted() -> dict[str, set[str]]:
    """Metric names seen by a Prometheus scrape and on the DogStatsD socket of a real run."""
    mp = pytest.MonkeyPatch()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.3)
    for k, v in {
        "DATADOG_ENABLED": "true",
        "DD_AGENT_HOST": "127.0.0.1",
        "DD_DOGSTATSD_PORT": str(sock.getsockname()[1]),
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_TUNIX_PROMETHEUS_PORT": "0",
        "OTEL_TUNIX_SYSTEM_METRICS_INTERVAL": "0.05",
        "OTEL_TUNIX_OUTPUT_DIR": "none",
    }.items():
        mp.setenv(k, v)
    try:
        info = otel_tunix.configure(service_name="dashboards")
        q: queue.Queue[int] = queue.Queue()
        q.put(1)
        instrument_queue(q, "rollout")
        logger = otel_tunix.get_metrics_logger()
        for n in range(4):
            with otel_tunix.step(n):
                with otel_tunix.component("train_queue_wait", blocked=True):
                    time.sleep(0.001)
                with otel_tunix.component("forward"):
                    time.sleep(0.001)
                with otel_tunix.component("backward"):
                    time.sleep(0.001)
            logger.log_dict(
                {"loss": 1.0 / (n + 1), "learning_rate": 1e-3, "kl": 0.01, "pg_clipfrac": 0.2},
                step=n,
            )
        time.sleep(0.2)  # a few system samples (queue depth)
        otel_tunix.force_flush()
        text = urllib.request.urlopen(info.endpoints["prometheus"], timeout=5).read().decode()
        otel_tunix.shutdown()
        prom = {
            line.split("{")[0].split(" ")[0]
            for line in text.splitlines()
            if line and not line.startswith("#")
        }
        dd: set[str] = set()
        dd_tags: set[str] = set()  # "metric|tag key"
        while True:
            try:
                packet = sock.recv(65535).decode()
            except TimeoutError:
                break
            for line in packet.splitlines():
                if line and not line.startswith("_"):
                    name, _, rest = line.partition(":")
                    fields = rest.split("|")
                    dd.add(f"{name}|{fields[1]}")
                    for tags in (f[1:] for f in fields if f.startswith("#")):
                        dd_tags.update(f"{name}|{t.split(':')[0]}" for t in tags.split(","))
    finally:
        sock.close()
        mp.undo()
    return {"prometheus": prom, "datadog": dd, "datadog_tags": dd_tags}


def _gpu_catalog_names() -> set[str]:
    return {spec.otel_name for spec in CATALOG if spec.otel_name.startswith("hw.gpu.")}


_PROM_IDENT = re.compile(r"\b((?:tunix|hw)_[a-z0-9_]+)")


def test_grafana_queries_name_emitted_prometheus_metrics(emitted):
    board = json.loads((DASHBOARDS / "grafana-otel-tunix.json").read_text())
    titles = {p["title"] for p in board["panels"]}
    assert {
        "Loss and learning rate",
        "KL divergence and clip fraction",
        "GPU utilization and queue depth",
        "Step-time breakdown (share of step time)",
        "Forward / backward latency p50 and p99",
    } <= titles
    gpu = {n.replace(".", "_") for n in _gpu_catalog_names()}
    seen = []
    for panel in board["panels"]:
        for target in panel["targets"]:
            for name in _PROM_IDENT.findall(target["expr"]):
                seen.append(name)
                assert name in emitted["prometheus"] or name in gpu, (panel["title"], name)
    assert "tunix_component_busy_time_seconds_bucket" in seen
    assert "hw_gpu_utilization" in seen


_DD_QUERY = re.compile(r"^(avg|sum|min|max|p50|p75|p90|p95|p99):([a-z0-9_.]+)\{")


def test_datadog_queries_name_emitted_dogstatsd_metrics(emitted):
    board = json.loads((DASHBOARDS / "datadog-otel-tunix.json").read_text())
    emitted_names = {n.split("|")[0] for n in emitted["datadog"]}
    distributions = {n.split("|")[0] for n in emitted["datadog"] if n.endswith("|d")}
    count = 0
    for widget in board["widgets"]:
        for request in widget["definition"]["requests"]:
            for q in request["queries"]:
                m = _DD_QUERY.match(q["query"])
                assert m, q["query"]
                agg, name = m.groups()
                count += 1
                if name.startswith("hw.gpu."):
                    assert name in _gpu_catalog_names(), name
                    continue
                assert name in emitted_names, name
                if agg.startswith("p"):  # percentiles exist only for distributions
                    assert name in distributions, name
                # template variables are tags the run really sends, and so are group-bys
                assert "$service" in q["query"] and "$run_id" in q["query"]
                for by in re.findall(r"\bby \{([^}]*)\}", q["query"]):
                    for key in by.split(","):
                        assert f"{name}|{key.strip()}" in emitted["datadog_tags"], (name, key)
    assert count >= 10
    prefixes = {v["prefix"] for v in board["template_variables"]}
    assert prefixes == {"service", "run_id"}
