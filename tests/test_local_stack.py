"""``deploy/docker-compose.yaml`` (collector, Jaeger, Prometheus, Grafana), checked without
containers (this machine runs none): every file parses and is wired to the others and to the
shipped collector configuration and dashboard (docs/local-stack.md says what is not tested)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = _load(DEPLOY / "docker-compose.yaml")
    return data


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of each bind mount (relative to deploy/)."""
    out = {}
    for volume in service.get("volumes", []):
        host, container, *_ = volume.split(":")
        out[container] = (DEPLOY / host).resolve()
    return out


def _published(service: dict[str, Any]) -> set[int]:
    return {int(str(p).split(":")[-1]) for p in service.get("ports", [])}


def test_the_stack_has_its_four_services_with_pinned_images(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"otel-collector", "jaeger", "prometheus", "grafana"}
    for name, service in services.items():
        image = service["image"]
        assert re.search(r":v?\d+\.\d+\.\d+$", image), (name, image)  # a release, not latest
        for host in _mounts(service).values():
            assert host.is_file(), (name, host)


def test_the_collector_runs_the_shipped_jaeger_config_and_it_reaches_jaeger(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    collector = services["otel-collector"]
    mounted = _mounts(collector)["/etc/otelcol-contrib/config.yaml"]
    # the configuration tests/test_collector_configs.py checks, not a copy
    assert mounted == ROOT / "collector-config" / "otelcol-jaeger.yaml"
    config = _load(mounted)
    host, port = config["exporters"]["otlp/jaeger"]["endpoint"].split(":")
    assert host in services and port == "4317"  # Jaeger v2 takes OTLP on 4317
    receivers = config["receivers"]["otlp"]["protocols"]
    ports = {int(p["endpoint"].rsplit(":", 1)[1]) for p in receivers.values()}
    assert ports == {4317, 4318} <= _published(collector)
    assert 16686 in _published(services["jaeger"])
    # Prometheus scrapes the collector's Prometheus exporter
    exporter_port = int(config["exporters"]["prometheus"]["endpoint"].rsplit(":", 1)[1])
    prom = services["prometheus"]
    prom_config = _load(_mounts(prom)["/etc/prometheus/prometheus.yml"])
    (job,) = prom_config["scrape_configs"]
    (targets,) = [c["targets"] for c in job["static_configs"]]
    assert targets == [f"otel-collector:{exporter_port}"]
    assert job["honor_labels"] is True


def test_grafana_gets_prometheus_and_the_shipped_dashboard(compose: dict[str, Any]) -> None:
    services = compose["services"]
    mounts = _mounts(services["grafana"])
    sources = _load(mounts["/etc/grafana/provisioning/datasources/otel-tunix.yaml"])
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert source["url"] == f"http://prometheus:{min(_published(services['prometheus']))}"
    providers = _load(mounts["/etc/grafana/provisioning/dashboards/otel-tunix.yaml"])
    (provider,) = providers["providers"]
    folder = provider["options"]["path"]
    dashboards = {c: h for c, h in mounts.items() if c.startswith(folder + "/")}
    shipped = ROOT / "collector-config" / "dashboards" / "grafana-otel-tunix.json"
    assert list(dashboards.values()) == [shipped]  # its queries: tests/test_dashboards.py
    dashboard = json.loads(shipped.read_text())
    kinds = {p["datasource"]["type"] for p in dashboard["panels"] if "datasource" in p}
    assert kinds == {"prometheus"}


def test_the_relabel_rule_undoes_the_collectors_ratio_suffix() -> None:
    (job,) = _load(DEPLOY / "prometheus.yaml")["scrape_configs"]
    (rule,) = job["metric_relabel_configs"]
    assert rule["source_labels"] == ["__name__"] and rule["target_label"] == "__name__"
    regex = re.compile(f"^(?:{rule['regex']})$")  # Prometheus anchors its regexes
    replacement = rule["replacement"].replace("$1", r"\1")
    for name, expected in {
        "tunix_train_loss_ratio": "tunix_train_loss",
        "hw_gpu_utilization_ratio": "hw_gpu_utilization",
    }.items():
        assert regex.sub(replacement, name) == expected
    assert not regex.match("tunix_step_busy_time_seconds_sum")  # left alone


def test_the_readme_and_the_doc_give_the_commands() -> None:
    """Both give the compose command and `make demo-otlp`, which sends the demo to the
    stack's collector (the Makefile's default endpoint, localhost:4317)."""
    up = "docker compose -f deploy/docker-compose.yaml up -d"
    for doc in (ROOT / "README.md", ROOT / "docs" / "local-stack.md"):
        text = doc.read_text()
        assert up in text and "make demo-otlp" in text, doc
    makefile = (ROOT / "Makefile").read_text()
    assert "OTLP_ENDPOINT ?= http://localhost:4317" in makefile
    assert "OTEL_EXPORTER_OTLP_ENDPOINT=$(OTLP_ENDPOINT) $(BIN)/otel-tunix demo" in makefile
    assert "docker compose -f deploy/docker-compose.yaml down" in (
        (ROOT / "docs" / "local-stack.md").read_text()
    )
