"""The rotel collector fixture, fed by the official OTLP exporters over gRPC and HTTP."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from collector import (
    DebugOutput,
    FakeDatadogIntake,
    RotelCollector,
    parse_debug_output,
)
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
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
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Link, SpanContext, Status, StatusCode

RESOURCE = {
    "service.name": "trainer",
    "tunix.run.id": "run-42",
    "tunix.rank": 3,
    "tunix.world_size": 8,
}
BOUNDS = [0.001, 0.01, 0.1, 1, 10]


def _span_exporter(protocol: str, collector: RotelCollector) -> SpanExporter:
    if protocol == "grpc":
        return GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True, timeout=5)
    return HttpSpanExporter(endpoint=collector.http_endpoint + "/v1/traces", timeout=5)


def _metric_exporter(protocol: str, collector: RotelCollector) -> MetricExporter:
    if protocol == "grpc":
        return GrpcMetricExporter(endpoint=collector.grpc_endpoint, insecure=True, timeout=5)
    return HttpMetricExporter(endpoint=collector.http_endpoint + "/v1/metrics", timeout=5)


@dataclass
class _SentStep:
    ids: dict[str, SpanContext] = field(default_factory=dict)


def _send_step(exporter: SpanExporter, step: int = 3) -> _SentStep:
    """One training step as otel-tunix shapes it: step span > component spans > user span."""
    sent = _SentStep()
    provider = TracerProvider(resource=Resource.create(RESOURCE))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("tunix", "0.1.0")
    try:
        with tracer.start_as_current_span(
            "train_step", attributes={"tunix.step": step, "tunix.scope": "train"}
        ) as root:
            sent.ids["train_step"] = root.get_span_context()
            with tracer.start_as_current_span(
                "train_data_load",
                attributes={
                    "tunix.component": "train_data_load",
                    "tunix.time_kind": "blocked",
                    "tunix.step": step,
                },
            ) as load:
                sent.ids["train_data_load"] = load.get_span_context()
            with tracer.start_as_current_span(
                "train_step_compute",
                attributes={
                    "tunix.component": "train_step_compute",
                    "tunix.time_kind": "busy",
                    "tokens": 4096,
                    "mfu": 0.41,
                    "synced": True,
                    "shape": ["batch", "seq"],
                },
                links=[Link(load.get_span_context(), {"reason": "waited-on"})],
            ) as compute:
                sent.ids["train_step_compute"] = compute.get_span_context()
                compute.add_event("alert", {"rule": "step_time > 1s", "value": 1.5})
                with tracer.start_as_current_span("user_matmul") as user:
                    sent.ids["user_matmul"] = user.get_span_context()
                    user.set_status(Status(StatusCode.ERROR, "nan loss"))
        assert provider.force_flush(10_000)
    finally:
        provider.shutdown()
    return sent


def _send_metrics(exporter: MetricExporter) -> None:
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(resource=Resource.create(RESOURCE), metric_readers=[reader])
    meter = provider.get_meter("tunix", "0.1.0")
    step_busy = meter.create_histogram(
        "tunix.step.busy_time", unit="s", explicit_bucket_boundaries_advisory=BOUNDS
    )
    component_busy = meter.create_histogram(
        "tunix.component.busy_time", unit="s", explicit_bucket_boundaries_advisory=BOUNDS
    )
    steps = meter.create_counter("tunix.steps", unit="{step}")
    for value in (0.05, 0.5, 2.0):
        step_busy.record(value, {"scope": "train"})
    component_busy.record(0.02, {"scope": "train", "component": "train_step_compute"})
    component_busy.record(0.2, {"scope": "train", "component": "train_data_load"})
    steps.add(3, {"scope": "train"})
    provider.shutdown()  # collects and exports once


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_spans_arrive_with_parents_attributes_and_resource(
    rotel_collector: RotelCollector, protocol: str
) -> None:
    sent = _send_step(_span_exporter(protocol, rotel_collector))
    out = rotel_collector.wait_for_spans(*sent.ids)
    assert len(out.spans) == 4

    root = out.span("train_step")
    load, compute = out.span("train_data_load"), out.span("train_step_compute")
    user = out.span("user_matmul")
    for name, span in [("train_step", root), ("train_data_load", load)]:
        assert span.trace_id == f"{sent.ids[name].trace_id:032x}"
        assert span.span_id == f"{sent.ids[name].span_id:016x}"
    assert {s.trace_id for s in out.spans} == {root.trace_id}
    assert root.parent_span_id is None
    assert load.parent_span_id == compute.parent_span_id == root.span_id
    assert user.parent_span_id == compute.span_id
    assert sorted(s.name for s in out.children(root)) == ["train_data_load", "train_step_compute"]

    assert root.attributes == {"tunix.step": 3, "tunix.scope": "train"}
    assert load.attributes["tunix.time_kind"] == "blocked"
    assert compute.attributes == {
        "tunix.component": "train_step_compute",
        "tunix.time_kind": "busy",
        "tokens": 4096,
        "mfu": 0.41,
        "synced": True,
        "shape": ["batch", "seq"],
    }
    assert compute.events[0].name == "alert"
    assert compute.events[0].attributes == {"rule": "step_time > 1s", "value": 1.5}
    assert compute.links[0].span_id == load.span_id
    assert compute.links[0].attributes == {"reason": "waited-on"}
    assert (user.status_code, user.status_message) == ("STATUS_CODE_ERROR", "nan loss")
    assert root.kind == "SPAN_KIND_INTERNAL"
    assert root.end_ns >= compute.end_ns > compute.start_ns >= root.start_ns

    for span in out.spans:
        assert {k: span.resource[k] for k in RESOURCE} == RESOURCE
        assert span.resource["telemetry.sdk.language"] == "python"
        assert (span.scope_name, span.scope_version) == ("tunix", "0.1.0")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_histograms_and_counter_arrive_with_units_and_buckets(
    rotel_collector: RotelCollector, protocol: str
) -> None:
    _send_metrics(_metric_exporter(protocol, rotel_collector))
    out = rotel_collector.wait_for_metrics(
        "tunix.step.busy_time", "tunix.component.busy_time", "tunix.steps"
    )

    step = out.metric("tunix.step.busy_time")
    assert (step.unit, step.data_type) == ("s", "Histogram")
    assert step.temporality == "AGGREGATION_TEMPORALITY_CUMULATIVE"
    assert step.resource["tunix.run.id"] == "run-42"
    assert step.scope_name == "tunix"
    (point,) = step.points
    assert point.attributes == {"scope": "train"}
    assert point.explicit_bounds == BOUNDS
    assert point.bucket_counts == [0, 0, 1, 1, 1, 0]  # per bucket, 6 = 5 bounds + overflow
    assert point.count == 3
    assert point.sum == pytest.approx(2.55)
    assert (point.min, point.max) == (0.05, 2.0)

    component = out.metric("tunix.component.busy_time")
    assert component.unit == "s"
    by_component = {p.attributes["component"]: p for p in component.points}
    assert set(by_component) == {"train_step_compute", "train_data_load"}
    assert all(p.attributes["scope"] == "train" for p in component.points)
    assert by_component["train_step_compute"].bucket_counts == [0, 0, 1, 0, 0, 0]

    steps = out.metric("tunix.steps")
    assert (steps.unit, steps.data_type, steps.is_monotonic) == ("{step}", "Sum", True)
    assert [(p.attributes, p.value) for p in steps.points] == [({"scope": "train"}, 3)]


def test_restart_keeps_the_ports_and_the_exporter_reconnects(
    rotel_collector: RotelCollector,
) -> None:
    exporter = _span_exporter("grpc", rotel_collector)
    provider = TracerProvider(resource=Resource.create(RESOURCE))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("tunix")
    try:
        with tracer.start_as_current_span("before_crash"):
            pass
        provider.force_flush(10_000)
        rotel_collector.wait_for_spans("before_crash")
        ports, first_pid = (
            (rotel_collector.grpc_port, rotel_collector.http_port),
            rotel_collector.pid,
        )

        rotel_collector.kill()  # a crash: SIGKILL, no graceful shutdown
        assert not rotel_collector.running and rotel_collector.pid is None
        rotel_collector.restart()
        assert (rotel_collector.grpc_port, rotel_collector.http_port) == ports
        assert rotel_collector.pid not in (None, first_pid)

        with tracer.start_as_current_span("after_restart"):
            pass
        provider.force_flush(20_000)
        out = rotel_collector.wait_for_spans("after_restart", timeout=20)
    finally:
        provider.shutdown()
    assert [s.name for s in out.spans] == ["before_crash", "after_restart"]
    assert "Starting Rotel" in rotel_collector.output()


def test_stop_ends_the_process_by_pid(rotel_collector: RotelCollector) -> None:
    pid = rotel_collector.pid
    assert pid is not None
    rotel_collector.stop()
    assert rotel_collector.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    rotel_collector.stop()  # idempotent


def test_wait_for_times_out_with_the_output_in_the_message(
    rotel_collector: RotelCollector,
) -> None:
    assert "Starting Rotel" in rotel_collector.wait_for("Starting Rotel", timeout=5)
    with pytest.raises(TimeoutError, match="Starting Rotel"):
        rotel_collector.wait_for(lambda text: "never printed" in text, timeout=0.2)


def test_start_failure_raises_with_the_agent_output(tmp_path: Path) -> None:
    collector = RotelCollector(tmp_path / "bad.log", args=["--exporter", "no-such-exporter"])
    with pytest.raises(RuntimeError, match="no-such-exporter"):
        collector.start(timeout=5)
    assert not collector.running


def test_parser_joins_multiline_values_and_skips_noise() -> None:
    text = (
        "2026-01-01T00:00:00.000000Z  INFO Starting Rotel.\n"
        "\x00\x00ResourceSpans #0\n"
        "Resource SchemaURL: \n"
        "Resource attributes:\n"
        "     -> service.name: Str(svc)\n"
        "     -> note: Str(line one\n"
        "line two -> (x)\n"
        "end)\n"
        "ScopeSpans #0\n"
        "ScopeSpans SchemaURL: \n"
        "InstrumentationScope tunix \n"
        "Span #0\n"
        "    Trace ID       : 0AF7651916CD43DD8448EB211C80319C\n"
        "    Parent ID      : \n"
        "    ID             : B7AD6B7169203331\n"
        "    Name           : rollout\n"
        "    Kind           : SPAN_KIND_INTERNAL\n"
        "Start time: 10\n"
        "End time: 20\n"
        "    Status code    : STATUS_CODE_UNSET\n"
        "    Status message : \n"
        "Attributes:\n"
        "     -> ratios: Slice(Double(0.5), Int(2), Bool(false))\n"
        '     -> nested: Map({"a": 1})\n'
        "2026-01-01T00:00:01.000000Z  INFO Exporting failed, will retry again after delay.\n"
        "ResourceLogs #0\n"
        "Resource attributes:\n"
        "     -> service.name: Str(ignored)\n"
    )
    out = parse_debug_output(text)
    (span,) = out.spans
    assert span.resource == {"service.name": "svc", "note": "line one\nline two -> (x)\nend"}
    assert span.trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert (span.span_id, span.parent_span_id, span.name) == ("b7ad6b7169203331", None, "rollout")
    assert (span.start_ns, span.end_ns, span.scope_name) == (10, 20, "tunix")
    assert span.attributes == {"ratios": [0.5, 2, False], "nested": '{"a": 1}'}
    assert out.metrics == []
    assert parse_debug_output("") == DebugOutput()


# -- Datadog: rotel's datadog exporter pointed at a loopback HTTP receiver ---------------


@pytest.fixture
def datadog_intake() -> Iterator[FakeDatadogIntake]:
    """A fake Datadog intake on loopback that records every POST."""
    with FakeDatadogIntake() as intake:
        yield intake


def test_datadog_exporter_sends_spans_in_datadog_format(
    rotel_factory: Callable[..., RotelCollector], datadog_intake: FakeDatadogIntake
) -> None:
    collector = rotel_factory(
        args=[
            "--exporter",
            "datadog",
            "--datadog-exporter-custom-endpoint",
            datadog_intake.url,
            "--datadog-exporter-api-key",
            "test-api-key",
        ]
    )
    sent = _send_step(_span_exporter("grpc", collector))
    spans = datadog_intake.wait_for_spans(*sent.ids)
    assert collector.running, collector.output()

    for path, headers, _ in datadog_intake.requests:
        assert path == "/api/v0.2/traces"
        assert headers["dd-api-key"] == "test-api-key"
        assert headers["content-type"] == "application/x-protobuf"
        assert headers.get("content-encoding") == "gzip"

    # OTel span name -> Datadog resource; service.name -> service; 64-bit ids.
    by_resource = {s.resource: s for s in spans}
    assert set(by_resource) == set(sent.ids)
    for name, span in by_resource.items():
        context = sent.ids[name]
        assert span.service == "trainer"
        assert span.trace_id == context.trace_id & 0xFFFF_FFFF_FFFF_FFFF
        assert span.span_id == context.span_id
        assert span.duration_ns > 0
        assert span.meta["tunix.run.id"] == "run-42"  # resource attributes become tags
    root, load = by_resource["train_step"], by_resource["train_data_load"]
    assert root.parent_id == 0
    assert load.parent_id == root.span_id
    assert by_resource["user_matmul"].parent_id == by_resource["train_step_compute"].span_id
    assert load.meta["tunix.time_kind"] == "blocked"  # strings -> meta
    assert root.metrics["tunix.step"] == 3.0  # numbers -> metrics
    assert by_resource["user_matmul"].error == 1
    assert root.error == 0
