"""DogStatsD exporter, step sink and events against a real socket on loopback.

A bound UDP (or Unix datagram) socket plays the Datadog Agent: the real ``datadog`` client
sends to it and the tests parse the DogStatsD wire format that arrives.
"""

from __future__ import annotations

import importlib
import logging
import math
import socket
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("datadog")

from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from otel_tunix.accounting.step_time import account_step
from otel_tunix.exporters.datadog import (
    DatadogClient,
    DatadogMetricExporter,
    DatadogStepSink,
    ServiceCheckStatus,
    datadog_enabled,
    resource_tags,
)
from otel_tunix.model.steps import SpanInfo, StepSummary

_CLEARED_ENV = (
    "DD_AGENT_HOST",
    "DD_DOGSTATSD_PORT",
    "DD_DOGSTATSD_URL",
    "DD_ENV",
    "DD_SERVICE",
    "DD_VERSION",
    "DD_ENTITY_ID",
    "DD_DOGSTATSD_DISABLE",
    "DD_TELEMETRY_HOST",
    "DD_TELEMETRY_PORT",
    "DATADOG_TAGS",
    "DATADOG_ENABLED",
    "OTEL_METRICS_EXPORTER",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_SERVICE_NAME",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _CLEARED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DD_ORIGIN_DETECTION_ENABLED", "false")


# --- a fake Agent: a bound datagram socket and a parser of what arrives -------------------


@dataclass
class Sample:
    """One DogStatsD metric line: ``name:value|type[|@rate][|#tags][|c:...]``."""

    name: str
    value: float
    type: str
    tags: list[str]
    rate: float = 1.0

    def tag(self, key: str) -> list[str]:
        return [t.split(":", 1)[1] for t in self.tags if t.split(":", 1)[0] == key]


@dataclass
class Event:
    title: str
    text: str
    fields: dict[str, str]
    tags: list[str]


@dataclass
class Check:
    name: str
    status: int
    fields: dict[str, str]
    tags: list[str]


@dataclass
class Received:
    samples: list[Sample] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    def named(self, name: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name]

    def one(self, name: str) -> Sample:
        found = self.named(name)
        assert len(found) == 1, (name, found, [s.name for s in self.samples])
        return found[0]


def _fields(parts: list[str]) -> tuple[dict[str, str], list[str]]:
    fields: dict[str, str] = {}
    tags: list[str] = []
    for part in parts:
        if part.startswith("#"):
            tags = part[1:].split(",")
        else:
            key, _, value = part.partition(":")
            fields[key] = value
    return fields, tags


def parse_line(line: str, out: Received) -> None:
    if line.startswith("_e{"):
        head, rest = line[3:].split("}:", 1)
        title_len, text_len = (int(n) for n in head.split(","))
        raw = rest.encode()
        title = raw[:title_len].decode()
        assert raw[title_len : title_len + 1] == b"|"
        text = raw[title_len + 1 : title_len + 1 + text_len].decode()
        tail = raw[title_len + 1 + text_len :].decode()
        fields, tags = _fields([p for p in tail.split("|") if p])
        out.events.append(Event(title, text, fields, tags))
    elif line.startswith("_sc|"):
        _, name, status, *rest = line.split("|")
        fields, tags = _fields(rest)
        out.checks.append(Check(name, int(status), fields, tags))
    else:
        name_value, metric_type, *rest = line.split("|")
        name, _, value = name_value.rpartition(":")
        if name.startswith("datadog.dogstatsd."):  # the client's own telemetry
            return
        rate = 1.0
        tags: list[str] = []
        for part in rest:
            if part.startswith("@"):
                rate = float(part[1:])
            elif part.startswith("#"):
                tags = part[1:].split(",")
        out.samples.append(Sample(name, float(value), metric_type, tags, rate))


class Agent:
    """A datagram socket on loopback (UDP) or a Unix socket path that collects packets."""

    def __init__(self, path: Path | None = None) -> None:
        if path is None:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.sock.bind(("127.0.0.1", 0))
            self.port: int = self.sock.getsockname()[1]
        else:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self.sock.bind(str(path))
            self.port = 0
        self.sock.settimeout(0.05)
        self.received = Received()

    def receive(self, until: Callable[[Received], bool], timeout: float = 3.0) -> Received:
        """Collect packets until ``until(received)`` holds; fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not until(self.received):
            if time.monotonic() > deadline:
                names = [s.name for s in self.received.samples]
                pytest.fail(f"timed out waiting for DogStatsD packets; got {names}")
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            for line in data.decode().split("\n"):
                if line:
                    parse_line(line, self.received)
        return self.received

    def has(self, *names: str) -> Callable[[Received], bool]:
        return lambda r: all(r.named(n) for n in names)


@pytest.fixture
def agent() -> Iterator[Agent]:
    a = Agent()
    yield a
    a.sock.close()


def _provider(exporter: DatadogMetricExporter, resource: Resource | None = None) -> MeterProvider:
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=math.inf)
    return MeterProvider(resource=resource or Resource.create({}), metric_readers=[reader])


# --- the metric exporter ------------------------------------------------------------------


def test_types_values_and_resource_tags(agent: Agent) -> None:
    resource = Resource.create(
        {
            "service.name": "trainer",
            "deployment.environment.name": "staging",
            "service.version": "1.0",
            "tunix.run.id": "run-7",
            "tunix.rank": 3,
            "host.name": "node-1",
            "process.pid": 1234,
        }
    )
    exporter = DatadogMetricExporter(host="127.0.0.1", port=agent.port)
    provider = _provider(exporter, resource)
    meter = provider.get_meter("test")
    steps = meter.create_counter("tunix.steps", unit="{step}")
    steps.add(3, {"scope": "train"})
    steps.add(2, {"scope": "train"})
    queue = meter.create_up_down_counter("tunix.queue.depth")
    queue.add(5)
    queue.add(-2)
    meter.create_gauge("tunix.lr").set(0.25, {"scope": "train", "warmup": True})
    meter.create_observable_gauge(
        "hw.gpu.utilization", callbacks=[lambda _o: [_observation(0.75, {"hw.id": "0"})]]
    )
    busy = meter.create_histogram("tunix.step.busy_time", unit="s")
    busy.record(0.1, {"scope": "train"})
    busy.record(0.3, {"scope": "train"})
    try:
        assert provider.force_flush()
        got = agent.receive(
            agent.has(
                "tunix.steps",
                "tunix.queue.depth",
                "tunix.lr",
                "hw.gpu.utilization",
                "tunix.step.busy_time.max",
            )
        )
    finally:
        provider.shutdown()

    steps_line = got.one("tunix.steps")
    assert (steps_line.type, steps_line.value) == ("c", 5)
    assert steps_line.tag("scope") == ["train"]
    for key, value in {
        "service": "trainer",
        "env": "staging",
        "version": "1.0",
        "run_id": "run-7",
        "rank": "3",
        "host": "node-1",
    }.items():
        assert steps_line.tag(key) == [value], key
    assert not steps_line.tag("process.pid") and not steps_line.tag("pid")

    assert (got.one("tunix.queue.depth").type, got.one("tunix.queue.depth").value) == ("g", 3)
    lr = got.one("tunix.lr")
    assert (lr.type, lr.value, lr.tag("warmup")) == ("g", 0.25, ["true"])
    gpu = got.one("hw.gpu.utilization")
    assert (gpu.type, gpu.value, gpu.tag("hw.id")) == ("g", 0.75, ["0"])

    hist = {s.name.rsplit(".", 1)[1]: s for s in got.samples if "busy_time." in s.name}
    assert {k: v.type for k, v in hist.items()} == {
        "count": "c",
        "sum": "c",
        "avg": "g",
        "min": "g",
        "max": "g",
    }
    assert hist["count"].value == 2
    assert hist["sum"].value == pytest.approx(0.4)
    assert hist["avg"].value == pytest.approx(0.2)
    assert (hist["min"].value, hist["max"].value) == (0.1, 0.3)
    assert all(s.tag("scope") == ["train"] and s.tag("run_id") == ["run-7"] for s in hist.values())
    assert not got.named("tunix.step.busy_time.bucket")  # only with histogram_buckets=True


def _observation(value: float, attributes: dict[str, str]) -> Observation:
    return Observation(value, attributes)


def test_counters_and_histograms_are_sent_as_deltas(agent: Agent) -> None:
    exporter = DatadogMetricExporter(host="127.0.0.1", port=agent.port)
    provider = _provider(exporter)
    meter = provider.get_meter("test")
    counter = meter.create_counter("tunix.tokens")
    hist = meter.create_histogram("tunix.step.duration", unit="s")
    try:
        counter.add(3)
        hist.record(1.0)
        hist.record(3.0)
        provider.force_flush()
        agent.receive(agent.has("tunix.tokens", "tunix.step.duration.max"))
        counter.add(2)
        hist.record(0.5)
        provider.force_flush()
        got = agent.receive(lambda r: len(r.named("tunix.step.duration.max")) == 2)
    finally:
        provider.shutdown()
    assert [s.value for s in got.named("tunix.tokens")] == [3, 2]
    assert [s.value for s in got.named("tunix.step.duration.count")] == [2, 1]
    assert [s.value for s in got.named("tunix.step.duration.sum")] == [4.0, 0.5]
    assert [s.value for s in got.named("tunix.step.duration.min")] == [1.0, 0.5]
    assert [s.value for s in got.named("tunix.step.duration.max")] == [3.0, 0.5]


def test_cumulative_input_is_turned_into_deltas(agent: Agent) -> None:
    # A reader that insists on cumulative temporality: the exporter still sends deltas.
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("test")
    counter = meter.create_counter("tunix.tokens")
    hist = meter.create_histogram("tunix.step.duration", unit="s")
    exporter = DatadogMetricExporter(host="127.0.0.1", port=agent.port)
    try:
        counter.add(3, {"scope": "train"})
        hist.record(1.0)
        assert exporter.export(_collect(reader)) is MetricExportResult.SUCCESS
        counter.add(2, {"scope": "train"})
        hist.record(2.0)
        hist.record(4.0)
        assert exporter.export(_collect(reader)) is MetricExportResult.SUCCESS
        exporter.force_flush()
        got = agent.receive(lambda r: len(r.named("tunix.step.duration.avg")) == 2)
    finally:
        exporter.shutdown()
        provider.shutdown()
    assert [s.value for s in got.named("tunix.tokens")] == [3, 2]
    assert [s.value for s in got.named("tunix.step.duration.count")] == [1, 2]
    assert [s.value for s in got.named("tunix.step.duration.sum")] == [1.0, 6.0]
    assert [s.value for s in got.named("tunix.step.duration.avg")] == [1.0, 3.0]
    # min / max of a cumulative point span the whole run, so they are not sent.
    assert not got.named("tunix.step.duration.min")


def _collect(reader: InMemoryMetricReader) -> MetricsData:
    data = reader.get_metrics_data()
    assert data is not None
    return data


def test_histogram_buckets_option(agent: Agent) -> None:
    exporter = DatadogMetricExporter(host="127.0.0.1", port=agent.port, histogram_buckets=True)
    provider = _provider(exporter)
    hist = provider.get_meter("test").create_histogram(
        "tunix.step.duration", unit="s", explicit_bucket_boundaries_advisory=[0.5, 1.0]
    )
    try:
        for value in (0.2, 0.7, 0.8, 5.0):
            hist.record(value)
        provider.force_flush()
        got = agent.receive(lambda r: len(r.named("tunix.step.duration.bucket")) == 3)
    finally:
        provider.shutdown()
    buckets = {
        (s.tag("lower_bound")[0], s.tag("upper_bound")[0]): (s.type, s.value)
        for s in got.named("tunix.step.duration.bucket")
    }
    assert buckets == {
        ("-inf", "0.5"): ("c", 1),
        ("0.5", "1"): ("c", 2),
        ("1", "inf"): ("c", 1),
    }


def test_namespace_and_constant_tags(agent: Agent) -> None:
    exporter = DatadogMetricExporter(
        host="127.0.0.1", port=agent.port, namespace="signal", constant_tags={"team": "ml"}
    )
    provider = _provider(exporter)
    provider.get_meter("test").create_counter("tunix.steps").add(1)
    try:
        provider.force_flush()
        got = agent.receive(agent.has("signal.tunix.steps"))
    finally:
        provider.shutdown()
    line = got.one("signal.tunix.steps")
    assert line.tag("team") == ["ml"]


@pytest.mark.parametrize("how", ["agent_host_port", "udp_url"])
def test_connection_from_environment(
    agent: Agent, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how == "agent_host_port":
        monkeypatch.setenv("DD_AGENT_HOST", "127.0.0.1")
        monkeypatch.setenv("DD_DOGSTATSD_PORT", str(agent.port))
    else:
        monkeypatch.setenv("DD_DOGSTATSD_URL", f"udp://127.0.0.1:{agent.port}")
    provider = _provider(DatadogMetricExporter())
    provider.get_meter("test").create_counter("tunix.steps").add(4)
    try:
        provider.force_flush()
        got = agent.receive(agent.has("tunix.steps"))
    finally:
        provider.shutdown()
    assert got.one("tunix.steps").value == 4


@pytest.mark.parametrize("how", ["env_unix_url", "socket_path_arg"])
def test_unix_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    path = tmp_path / "dsd.socket"
    uds = Agent(path)
    try:
        if how == "env_unix_url":
            monkeypatch.setenv("DD_DOGSTATSD_URL", f"unix://{path}")
            exporter = DatadogMetricExporter()
        else:
            exporter = DatadogMetricExporter(socket_path=f"unixgram://{path}")
        provider = _provider(exporter)
        provider.get_meter("test").create_gauge("tunix.lr").set(0.5)
        try:
            provider.force_flush()
            got = uds.receive(uds.has("tunix.lr"))
        finally:
            provider.shutdown()
    finally:
        uds.sock.close()
    assert (got.one("tunix.lr").type, got.one("tunix.lr").value) == ("g", 0.5)


def test_dd_unified_service_tags_beat_resource(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DD_ENV", "prod")
    monkeypatch.setenv("DD_SERVICE", "dd-trainer")
    monkeypatch.setenv("DD_VERSION", "2.0")
    resource = Resource.create(
        {"service.name": "otel-trainer", "deployment.environment": "dev", "tunix.run.id": "r1"}
    )
    provider = _provider(DatadogMetricExporter(host="127.0.0.1", port=agent.port), resource)
    provider.get_meter("test").create_counter("tunix.steps").add(1)
    try:
        provider.force_flush()
        line = agent.receive(agent.has("tunix.steps")).one("tunix.steps")
    finally:
        provider.shutdown()
    assert line.tag("env") == ["prod"]
    assert line.tag("service") == ["dd-trainer"]
    assert line.tag("version") == ["2.0"]
    assert line.tag("run_id") == ["r1"]


def test_constructor_beats_environment(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DD_ENV", "prod")
    monkeypatch.setenv("DD_SERVICE", "from-env")
    monkeypatch.setenv("DD_VERSION", "2.0")
    exporter = DatadogMetricExporter(
        host="127.0.0.1", port=agent.port, service="from-arg", constant_tags=["env:from-tags"]
    )
    provider = _provider(exporter, Resource.create({"service.name": "from-resource"}))
    provider.get_meter("test").create_counter("tunix.steps").add(1)
    try:
        provider.force_flush()
        line = agent.receive(agent.has("tunix.steps")).one("tunix.steps")
    finally:
        provider.shutdown()
    assert line.tag("service") == ["from-arg"]
    assert line.tag("env") == ["from-tags"]
    assert line.tag("version") == ["2.0"]


def test_resource_tags_mapping() -> None:
    # The SDK's placeholder service name is not a useful tag.
    assert resource_tags(Resource.create({})) == []
    tags = resource_tags(
        Resource.create(
            {
                "service.name": "svc",
                "deployment.environment.name": "new",
                "deployment.environment": "old",
                "tunix.rank": 0,
            }
        ),
        exclude={"service"},
    )
    assert tags == ["env:new", "rank:0"]


def test_export_never_raises_and_reports_once(
    agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    exporter = DatadogMetricExporter(host="127.0.0.1", port=agent.port)
    broken = MetricsData(resource_metrics=[object()])  # type: ignore[list-item]
    with caplog.at_level(logging.WARNING, logger="otel_tunix.exporters.datadog"):
        assert exporter.export(broken) is MetricExportResult.FAILURE
        assert exporter.export(broken) is MetricExportResult.FAILURE
    ours = [r for r in caplog.records if r.name == "otel_tunix.exporters.datadog"]
    assert len(ours) == 1
    exporter.shutdown()
    exporter.shutdown()  # idempotent
    assert exporter.export(MetricsData(resource_metrics=[])) is MetricExportResult.FAILURE


def test_agent_down_never_blocks_or_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    dead_port = probe.getsockname()[1]
    probe.close()  # nothing listens there any more
    targets = [
        DatadogMetricExporter(host="127.0.0.1", port=dead_port),
        DatadogMetricExporter(socket_path=str(tmp_path / "missing.socket")),
    ]
    with caplog.at_level(logging.WARNING):
        for exporter in targets:
            provider = _provider(exporter)
            meter = provider.get_meter("test")
            counter = meter.create_counter("tunix.steps")
            hist = meter.create_histogram("tunix.step.duration")
            start = time.monotonic()
            for i in range(5):
                counter.add(1)
                hist.record(0.1 * i)
                assert provider.force_flush(timeout_millis=2000)
                exporter.client.event("still training", "step done", alert_type="info")
                exporter.client.service_check("tunix.health", ServiceCheckStatus.OK)
            provider.shutdown()
            # a blocking send would wait out the 2 s flush timeouts (10 s); the margin is
            # for a loaded CI machine
            assert time.monotonic() - start < 4.0
    # The client's own "Error submitting packet" warning is shown once, not per packet.
    submits = [r for r in caplog.records if "Error submitting packet" in str(r.msg)]
    assert len(submits) <= 1


# --- the step sink ------------------------------------------------------------------------

_S = 1_000_000_000


def _summary() -> StepSummary:
    spans = [
        SpanInfo(name="train_data_load", kind="blocked", start_ns=0, end_ns=_S // 5),
        SpanInfo(name="train_step_compute", kind="busy", start_ns=_S // 5, end_ns=9 * _S // 10),
    ]
    return account_step("rl/actor", 7, 0, _S, spans)


def test_step_sink_sends_distributions(agent: Agent) -> None:
    resource = Resource.create({"tunix.run.id": "run-9", "service.name": "trainer"})
    sink = DatadogStepSink(
        host="127.0.0.1", port=agent.port, resource=resource, tags={"team": "ml"}
    )
    summary = _summary()
    sink.on_step(summary)
    sink.on_session([])
    sink.close()
    sink.close()
    sink.on_step(summary)  # after close: ignored, no error
    got = agent.receive(agent.has("tunix.component.blocked_time", "tunix.step.idle_time"))

    expected = {
        "tunix.step.duration": 1.0,
        "tunix.step.busy_time": 0.7,
        "tunix.step.blocked_time": 0.2,
        "tunix.step.idle_time": 0.1,
    }
    for name, value in expected.items():
        line = got.one(name)
        assert line.type == "d"
        assert line.value == pytest.approx(value)
        assert line.tag("scope") == ["rl/actor"]
        assert line.tag("run_id") == ["run-9"] and line.tag("service") == ["trainer"]
        assert line.tag("team") == ["ml"]
    busy = got.one("tunix.component.busy_time")
    assert (busy.type, busy.tag("component"), busy.tag("scope")) == (
        "d",
        ["train_step_compute"],
        ["rl/actor"],
    )
    assert busy.value == pytest.approx(0.7)
    blocked = got.one("tunix.component.blocked_time")
    assert blocked.tag("component") == ["train_data_load"]
    assert blocked.value == pytest.approx(0.2)
    # A component only reports the kinds it had: no zero blocked time for the compute.
    assert len(got.named("tunix.component.busy_time")) == 1
    assert len(got.named("tunix.component.blocked_time")) == 1


def test_step_sink_shares_a_client(agent: Agent) -> None:
    client = DatadogClient(host="127.0.0.1", port=agent.port, namespace="ns")
    sink = DatadogStepSink(client)
    sink.on_step(_summary())
    sink.close()  # flushes; the shared client stays usable
    client.event("after sink close", "still open")
    client.flush()
    got = agent.receive(lambda r: bool(r.events) and bool(r.named("ns.tunix.step.duration")))
    client.close()
    assert got.events[0].title == "after sink close"
    with pytest.raises(ValueError, match="client= or connection options"):
        DatadogStepSink(client, host="127.0.0.1")


# --- events and service checks ------------------------------------------------------------


def test_events_and_service_checks(agent: Agent) -> None:
    client = DatadogClient(
        host="127.0.0.1", port=agent.port, constant_tags=["team:ml"], service="trainer"
    )
    client.event(
        "High KL divergence",
        "kl=0.2 exceeds 0.1\nstep 40",
        alert_type="warning",
        tags={"run_id": "r1"},
        aggregation_key="kl",
    )
    client.event("Odd alert", "unknown type", alert_type="fatal")  # type: ignore[arg-type]
    client.service_check("tunix.rl.kl_divergence", "critical", tags=["run_id:r1"], message="kl")
    client.service_check("tunix.health", ServiceCheckStatus.OK)
    client.service_check("tunix.bad", 9)
    client.flush()
    got = agent.receive(lambda r: len(r.events) == 2 and len(r.checks) == 3)
    client.close()

    kl = got.events[0]
    assert kl.title == "High KL divergence"
    assert kl.text == "kl=0.2 exceeds 0.1\\nstep 40"  # DogStatsD escapes newlines
    assert kl.fields["t"] == "warning" and kl.fields["k"] == "kl"
    assert set(kl.tags) >= {"run_id:r1", "team:ml", "service:trainer"}
    assert got.events[1].fields["t"] == "info"

    checks = {c.name: c for c in got.checks}
    assert checks["tunix.rl.kl_divergence"].status == 2
    assert checks["tunix.rl.kl_divergence"].fields["m"] == "kl"
    assert "run_id:r1" in checks["tunix.rl.kl_divergence"].tags
    assert checks["tunix.health"].status == 0
    assert checks["tunix.bad"].status == 3


# --- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, False),
        ({"DATADOG_ENABLED": "true"}, True),
        ({"DATADOG_ENABLED": "1"}, True),
        ({"DATADOG_ENABLED": "false"}, False),
        ({"OTEL_METRICS_EXPORTER": "otlp, datadog"}, True),
        ({"OTEL_METRICS_EXPORTER": "otlp"}, False),
    ],
)
def test_datadog_enabled(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: bool
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert datadog_enabled() is expected


def test_entry_point_builds_with_no_arguments(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    entry_points = tomllib.loads(pyproject.read_text())["project"]["entry-points"]
    module, _, name = entry_points["opentelemetry_metrics_exporter"]["datadog"].partition(":")
    cls = getattr(importlib.import_module(module), name)
    assert cls is DatadogMetricExporter
    monkeypatch.setenv("DD_DOGSTATSD_URL", f"udp://127.0.0.1:{agent.port}")
    exporter = cls()
    assert isinstance(exporter, DatadogMetricExporter)
    exporter.shutdown()


def test_invalid_options_fail_fast() -> None:
    with pytest.raises(ValueError, match="port"):
        DatadogClient(port=70000)
    client = DatadogClient(host="127.0.0.1", port=9)
    try:
        with pytest.raises(ValueError, match="not both"):
            DatadogMetricExporter(client, namespace="x")
        with pytest.raises(ValueError, match="statsd="):
            DatadogClient(statsd=client.statsd, host="127.0.0.1")
    finally:
        client.close()
