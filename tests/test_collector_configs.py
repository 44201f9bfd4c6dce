"""The ready collector configurations in collector-config/.

OTel Collector YAML files are checked structurally (every pipeline's components are
defined, every defined component is used, processor order, the settings each file exists
for). rotel env files are run for real on loopback ports.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from collector import (
    FakeDatadogIntake,
    RotelCollector,
    free_port,
    read_env_file,
    rotel_agent_path,
)
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from processes import child_env

CONFIG_DIR = Path(__file__).resolve().parent.parent / "collector-config"
YAML_FILES = sorted(CONFIG_DIR.glob("*.yaml"))
ENV_FILES = sorted(CONFIG_DIR.glob("*.env"))

SECTIONS = ("receivers", "processors", "exporters", "connectors", "extensions")
# Component types of otelcol-contrib these files may use (a typo fails here, not at deploy).
KNOWN_TYPES = {
    "receivers": {"otlp"},
    "processors": {"memory_limiter", "batch", "tail_sampling", "probabilistic_sampler"},
    "exporters": {"otlp", "prometheus", "debug", "datadog", "loadbalancing"},
    "connectors": {"datadog"},
    "extensions": {"health_check"},
}
SAMPLERS = {"tail_sampling", "probabilistic_sampler"}


def _load(path: Path) -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load(path.read_text())
    assert isinstance(config, dict), path
    return config


def _type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def _pipelines(config: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    return config["service"]["pipelines"]


def _defined(config: dict[str, Any], section: str) -> set[str]:
    return set(config.get(section) or {})


# -- every YAML file ------------------------------------------------------------------------


def test_the_expected_files_exist() -> None:
    names = {p.name for p in CONFIG_DIR.iterdir()}
    assert {
        "README.md",
        "otelcol-jaeger.yaml",
        "otelcol-datadog.yaml",
        "otelcol-agent.yaml",
        "otelcol-gateway.yaml",
        "rotel-debug.env",
        "rotel-jaeger.env",
    } <= names


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.name)
def test_pipelines_reference_only_defined_components(path: Path) -> None:
    config = _load(path)
    assert set(config) <= {*SECTIONS, "service"}, set(config) - {*SECTIONS, "service"}
    connectors = _defined(config, "connectors")
    for name, pipeline in _pipelines(config).items():
        assert re.fullmatch(r"(traces|metrics|logs)(/[\w.-]+)?", name), name
        assert set(pipeline) <= {"receivers", "processors", "exporters"}, name
        assert pipeline.get("receivers"), f"{name}: no receivers"
        assert pipeline.get("exporters"), f"{name}: no exporters"
        for receiver in pipeline["receivers"]:
            assert receiver in _defined(config, "receivers") | connectors, (name, receiver)
        for processor in pipeline.get("processors") or []:
            assert processor in _defined(config, "processors"), (name, processor)
        for exporter in pipeline["exporters"]:
            assert exporter in _defined(config, "exporters") | connectors, (name, exporter)
    for extension in config["service"].get("extensions") or []:
        assert extension in _defined(config, "extensions"), extension


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.name)
def test_every_defined_component_is_used(path: Path) -> None:
    config = _load(path)
    pipelines = _pipelines(config).values()
    used = {
        "receivers": {r for p in pipelines for r in p["receivers"]},
        "processors": {x for p in pipelines for x in p.get("processors") or []},
        "exporters": {e for p in pipelines for e in p["exporters"]},
        "extensions": set(config["service"].get("extensions") or []),
    }
    for section in ("receivers", "processors", "exporters", "extensions"):
        unused = _defined(config, section) - used[section]
        assert not unused, f"{section} defined but unused: {unused}"
    for connector in _defined(config, "connectors"):
        # A connector joins two pipelines: the exporter of one, the receiver of another.
        assert connector in used["exporters"], connector
        assert connector in used["receivers"], connector


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.name)
def test_component_types_are_known_and_processors_ordered(path: Path) -> None:
    config = _load(path)
    for section, known in KNOWN_TYPES.items():
        for component_id in _defined(config, section):
            assert _type(component_id) in known, (section, component_id)
    for name, pipeline in _pipelines(config).items():
        processors = pipeline.get("processors") or []
        if "memory_limiter" in processors:
            assert processors[0] == "memory_limiter", name  # first, to shed load early
        if "batch" in processors:
            assert processors[-1] == "batch", name  # last, after any sampling


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.name)
def test_otlp_receiver_listens_on_the_standard_ports(path: Path) -> None:
    protocols = _load(path)["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317")
    assert protocols["http"]["endpoint"].endswith(":4318")


# -- what each file is for --------------------------------------------------------------------


def test_jaeger_config_sends_traces_to_jaeger_and_metrics_to_prometheus() -> None:
    config = _load(CONFIG_DIR / "otelcol-jaeger.yaml")
    exporters, pipelines = config["exporters"], _pipelines(config)
    assert exporters["otlp/jaeger"]["endpoint"] == "jaeger:4317"
    assert exporters["prometheus"]["endpoint"].endswith(":8889")
    assert "debug" in exporters
    assert pipelines["traces"]["processors"] == ["memory_limiter", "batch"]
    assert set(pipelines["traces"]["exporters"]) == {"otlp/jaeger", "debug"}
    assert set(pipelines["metrics"]["exporters"]) == {"prometheus", "debug"}


def test_datadog_config_computes_apm_stats_before_sampling() -> None:
    config = _load(CONFIG_DIR / "otelcol-datadog.yaml")
    api = config["exporters"]["datadog"]["api"]
    assert (api["key"], api["site"]) == ("${env:DD_API_KEY}", "${env:DD_SITE}")
    (connector,) = (c for c in config["connectors"] if _type(c) == "datadog")
    pipelines = _pipelines(config)

    feeding = [n for n, p in pipelines.items() if connector in p["exporters"]]
    fed = [n for n, p in pipelines.items() if connector in p["receivers"]]
    assert feeding == ["traces"]
    # The pipeline that feeds the connector sees every span: no sampler in it.
    assert not SAMPLERS & set(pipelines["traces"].get("processors") or [])
    assert "otlp" in pipelines["traces"]["receivers"]
    # Every sampled traces pipeline gets its spans from the connector, i.e. after it.
    for name, pipeline in pipelines.items():
        if SAMPLERS & set(pipeline.get("processors") or []):
            assert name.startswith("traces") and connector in pipeline["receivers"], name
    # The APM stats (connector -> metrics) reach Datadog.
    assert any(n.startswith("metrics") for n in fed)
    for name in fed:
        assert "datadog" in pipelines[name]["exporters"], name
    assert {n.split("/")[0] for n, p in pipelines.items() if "datadog" in p["exporters"]} == {
        "traces",
        "metrics",
        "logs",
    }


def test_agent_routes_traces_by_trace_id_to_the_gateways() -> None:
    config = _load(CONFIG_DIR / "otelcol-agent.yaml")
    lb = config["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "traceID"
    assert "otlp" in lb["protocol"]
    assert set(lb["resolver"]) & {"dns", "static", "k8s"}
    assert _pipelines(config)["traces"]["exporters"] == ["loadbalancing"]
    assert not SAMPLERS & set(_defined(config, "processors"))  # sampling is the gateway's job


def test_gateway_tail_sampling_keeps_errors_slow_steps_and_a_baseline() -> None:
    config = _load(CONFIG_DIR / "otelcol-gateway.yaml")
    tail = config["processors"]["tail_sampling"]
    policies = {p["type"]: p for p in tail["policies"]}
    assert set(policies) == {"status_code", "latency", "probabilistic"}
    assert policies["status_code"]["status_code"]["status_codes"] == ["ERROR"]
    assert policies["latency"]["latency"]["threshold_ms"] > 0
    assert 0 < policies["probabilistic"]["probabilistic"]["sampling_percentage"] < 100
    assert "tail_sampling" in _pipelines(config)["traces"]["processors"]
    # The agent sends to the gateway's OTLP port.
    agent = _load(CONFIG_DIR / "otelcol-agent.yaml")
    assert agent["exporters"]["loadbalancing"]["resolver"]["dns"]["port"] == 4317


# -- rotel env files, run for real ----------------------------------------------------------


def _rotel_env_names() -> set[str]:
    help_text = subprocess.run(
        [str(rotel_agent_path()), "start", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return set(re.findall(r"\[env: (ROTEL_[A-Z0-9_]+)=", help_text))


def _start_from_env_file(
    rotel_factory: Callable[..., RotelCollector],
    path: Path,
    replace: Mapping[str, str] | None = None,
    add: Mapping[str, str] | None = None,
) -> RotelCollector:
    """Runs rotel configured by an env file, its listen endpoints moved to free loopback
    ports; ``replace`` overrides settings the file has, ``add`` supplies ones it leaves to
    the user's environment (secrets)."""
    ports = (free_port(), free_port())
    env = read_env_file(path)
    env["ROTEL_OTLP_GRPC_ENDPOINT"] = f"127.0.0.1:{ports[0]}"
    env["ROTEL_OTLP_HTTP_ENDPOINT"] = f"127.0.0.1:{ports[1]}"
    for key, value in (replace or {}).items():
        assert key in env, f"{path.name} has no {key}"
        env[key] = value
    for key, value in (add or {}).items():
        assert key not in env, f"{path.name} already sets {key}"
        env[key] = value
    # No arguments besides the (same) listen endpoints: the env file is the configuration.
    return rotel_factory(args=[], env=env, grpc_port=ports[0], http_port=ports[1])


def _send_span(exporter: SpanExporter, name: str) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "trainer"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("tunix").start_as_current_span(name, attributes={"tunix.step": 1}):
        pass
    provider.shutdown()


@pytest.mark.parametrize("path", ENV_FILES, ids=lambda p: p.name)
def test_env_files_use_only_rotel_variables(path: Path) -> None:
    env = read_env_file(path)
    documented = _rotel_env_names()
    named = set(env.get("ROTEL_EXPORTERS", "").replace(":", ",").split(","))
    for key in env:
        # ROTEL_EXPORTER_<NAME>_* configure a named exporter of ROTEL_EXPORTERS=name:type.
        m = re.fullmatch(r"ROTEL_EXPORTER_([A-Z0-9]+)_[A-Z_]+", key)
        if key not in documented and m:
            assert m.group(1).lower() in named, key
        else:
            assert key in documented, key
    assert env["ROTEL_OTLP_GRPC_ENDPOINT"].startswith("127.0.0.1:")  # safe default


def test_rotel_debug_env_prints_received_spans(
    rotel_factory: Callable[..., RotelCollector],
) -> None:
    collector = _start_from_env_file(rotel_factory, CONFIG_DIR / "rotel-debug.env")
    _send_span(HttpSpanExporter(endpoint=collector.http_endpoint + "/v1/traces"), "from_env")
    span = collector.wait_for_spans("from_env").span("from_env")
    assert span.attributes == {"tunix.step": 1}
    assert span.resource["service.name"] == "trainer"


def test_rotel_jaeger_env_forwards_traces_and_drops_metrics(
    rotel_factory: Callable[..., RotelCollector],
) -> None:
    jaeger = rotel_factory()  # stands in for Jaeger: an OTLP receiver that prints spans
    agent = _start_from_env_file(
        rotel_factory,
        CONFIG_DIR / "rotel-jaeger.env",
        replace={"ROTEL_EXPORTER_JAEGER_ENDPOINT": jaeger.grpc_endpoint},
    )
    _send_span(GrpcSpanExporter(endpoint=agent.grpc_endpoint, insecure=True), "to_jaeger")
    span = jaeger.wait_for_spans("to_jaeger").span("to_jaeger")
    assert span.resource["service.name"] == "trainer"

    # Metrics are accepted (success, not UNIMPLEMENTED) and dropped, never forwarded.
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter("tunix").create_counter("tunix.steps").add(1)
    data = reader.get_metrics_data()
    provider.shutdown()
    exporter = HttpMetricExporter(endpoint=agent.http_endpoint + "/v1/metrics", timeout=5)
    assert exporter.export(data) is MetricExportResult.SUCCESS
    exporter.shutdown()
    _send_span(GrpcSpanExporter(endpoint=agent.grpc_endpoint, insecure=True), "after_metrics")
    assert jaeger.wait_for_spans("after_metrics").metrics == []


def test_rotel_datadog_env_sends_traces_to_the_intake(
    rotel_factory: Callable[..., RotelCollector],
) -> None:
    with FakeDatadogIntake() as intake:
        # The API key is not in the file (it is a secret): the test supplies it, as a user's
        # environment would, plus the intake's address in place of Datadog's.
        agent = _start_from_env_file(
            rotel_factory,
            CONFIG_DIR / "rotel-datadog.env",
            add={
                "ROTEL_EXPORTER_DATADOG_API_KEY": "test-api-key",
                "ROTEL_EXPORTER_DATADOG_CUSTOM_ENDPOINT": intake.url,
            },
        )
        _send_span(GrpcSpanExporter(endpoint=agent.grpc_endpoint, insecure=True), "to_datadog")
        (span,) = intake.wait_for_spans("to_datadog")
        assert span.service == "trainer"
        assert span.metrics["tunix.step"] == 1.0
        assert intake.requests[0][1]["dd-api-key"] == "test-api-key"


TIER_RANK = """
import json, sys, time
import otel_tunix

steps, components = int(sys.argv[1]), int(sys.argv[2])
otel_tunix.configure(output_dir="none", system_metrics=False)
start = time.perf_counter()
for n in range(steps):
    with otel_tunix.step(n):
        for c in range(components):
            with otel_tunix.component(f"c{c}"):
                pass
otel_tunix.shutdown()
print(json.dumps({"sec": time.perf_counter() - start}))
"""


@pytest.mark.slow
def test_agent_gateway_tier_carries_several_processes_without_loss(
    rotel_factory: Callable[..., RotelCollector], tmp_path: Path
) -> None:
    """Three trainer processes -> a rotel agent (rotel-agent.env) -> a rotel gateway
    (rotel-gateway.env) -> a backend standing in for Tempo: every span arrives."""
    import json
    import sys
    import time

    backend = rotel_factory(
        args=["--exporter", "blackhole", "--debug-log", "traces", "--debug-log-verbosity", "basic"]
    )
    gateway = _start_from_env_file(
        rotel_factory,
        CONFIG_DIR / "rotel-gateway.env",
        replace={"ROTEL_OTLP_EXPORTER_ENDPOINT": backend.grpc_endpoint},
    )
    agent = _start_from_env_file(
        rotel_factory,
        CONFIG_DIR / "rotel-agent.env",
        replace={"ROTEL_OTLP_EXPORTER_ENDPOINT": gateway.grpc_endpoint},
    )
    script = tmp_path / "rank.py"
    script.write_text(TIER_RANK)
    steps, components, ranks = 1000, 9, 3
    env = child_env(
        OTEL_EXPORTER_OTLP_ENDPOINT=agent.grpc_endpoint,
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_TUNIX_QUIET="true",
        # a loop with no work makes spans faster than any exporter sends them: room for all
        # of them in each trainer's queue, so what is measured is the tier
        OTEL_BSP_MAX_QUEUE_SIZE=str(2 * steps * (components + 1)),
    )
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(steps), str(components)],
            env={**env, "RANK": str(r), "WORLD_SIZE": str(ranks), "TORCHELASTIC_RUN_ID": "tier"},
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(ranks)
    ]
    outs = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    expected = ranks * steps * (components + 1) + steps  # and rank 0's job step roots

    def received(text: str) -> int:
        # "Received traces. ... resource_spans=2 spans=512" (colour codes taken out)
        plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
        return sum(int(m) for m in re.findall(r"(?<![_\w])spans=(\d+)", plain))

    backend.wait_for(lambda text: received(text) >= expected, timeout=60)
    arrived = time.perf_counter() - start
    assert received(backend.output()) == expected  # nothing lost, nothing doubled
    print(
        f"collector tier: {expected} spans from {ranks} processes in {arrived:.2f} s "
        f"({expected / arrived:,.0f} spans/s end to end; the processes' loops "
        f"{max(o['sec'] for o in outs):.2f} s)"
    )
