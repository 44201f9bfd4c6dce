"""The OTLP fast path (otel_tunix.exporters.otlp): what a real collector receives from it is
what it receives from the SDK's OTLP exporter, field by field, for the same spans; and the
bytes are the SDK encoder's."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from otlp_receiver import grpc_receiver, http_receiver

import otel_tunix
from otel_tunix.consumers.step_accounting import StepSpanProcessor
from otel_tunix.exporters.otlp import GrpcStepExporter, HttpStepExporter
from otel_tunix.exporters.otlp_encoding import StepEncoder
from otel_tunix.pipeline.export_processor import BatchExportProcessor
from otel_tunix.support.shortcuts import span_processors_of

STEPS = 6


def _run() -> int:
    """Steps of every shape the span builder makes; returns how many spans they are."""
    tracer = trace.get_tracer("user-code", "1.2")
    with otel_tunix.component("checkpoint_restore"):  # outside any step: a trace of its own
        with otel_tunix.component("read_shard"):
            pass
    spans = 2
    for n in range(STEPS):
        with otel_tunix.step(n, scope="train"):
            with otel_tunix.component("train_data_load"):
                time.sleep(0.0005)
            with otel_tunix.component("train_step_compute"):
                with otel_tunix.component("forward"):  # nested: parent is a component
                    pass
                with otel_tunix.component("forward"):  # the same name twice: a count
                    pass
            with otel_tunix.component("train_queue_wait", blocked=True):
                pass
            with otel_tunix.component("fast_path_probe", category="evaluation"):
                pass  # a declared category: an attribute of its own
            worker = threading.Thread(target=_in_thread, name="loader-thread")
            worker.start()
            worker.join()
            spans += 8  # seven components and the step span
            if n == 2:  # a component that fails: error status and an exception event
                with pytest.raises(ValueError):
                    with otel_tunix.component("checkpoint_save"):
                        raise ValueError("disk full")
                spans += 1
            if n == 3:  # a component's own attributes; the step's events and attributes
                with otel_tunix.component("rollout") as c:
                    c.set_attribute("gen_ai.request.model", "tiny")
                    c.set_attribute("rollout.sizes", [1, 2, 3])
                view = otel_tunix.current_step()
                assert view is not None
                view.add_event("tunix.alert", {"rule": "slow_step", "value": 1.5})
                view.set_attribute("tunix.tokens", 4096)
                spans += 1
            if n == 4:  # other code's spans: another scope, kind, status, event, link
                with otel_tunix.component("reward"):
                    with tracer.start_as_current_span("http.request", kind=SpanKind.CLIENT) as s:
                        s.add_event("retry", {"attempt": 2})
                        s.set_status(Status(StatusCode.ERROR, "timeout"))
                        s.set_attribute("http.status_code", 504)
                    link = Link(s.get_span_context(), {"why": "follow-up"})
                    with tracer.start_as_current_span("follow.up", links=[link]):
                        pass
                spans += 3
    return spans


def _in_thread() -> None:
    with otel_tunix.component("prefetch"):
        pass


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_collector_receives_the_same_from_the_fast_path_and_the_sdk(
    rotel_factory: Any, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    fast_collector, sdk_collector = rotel_factory(), rotel_factory()
    if protocol == "grpc":
        fast: Any = GrpcStepExporter(endpoint=fast_collector.grpc_endpoint, insecure=True)
        sdk: Any = GrpcSpanExporter(endpoint=sdk_collector.grpc_endpoint, insecure=True)
    else:
        fast = HttpStepExporter(endpoint=f"{fast_collector.http_endpoint}/v1/traces")
        sdk = HttpSpanExporter(endpoint=f"{sdk_collector.http_endpoint}/v1/traces")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "fast-path")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test,team=ml")
    # rank 0 of a job: the step spans have a parent, and the job step span is made
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-fast-path")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    otel_tunix.configure(output_dir="none", span_exporters=[fast, sdk])
    expected = _run() + STEPS  # and a job step span per step
    otel_tunix.shutdown()

    counts = {"train_step": STEPS, "train_job_step": STEPS, "follow.up": 1}
    got_fast = fast_collector.wait_for_span_counts(counts).spans
    got_sdk = sdk_collector.wait_for_span_counts(counts).spans
    assert len(got_fast) == len(got_sdk) == expected
    by_id = {s.span_id: s for s in got_sdk}
    assert len(by_id) == expected
    names = set()
    for span in got_fast:
        twin = by_id[span.span_id]
        for field in ("name", "trace_id", "parent_span_id", "kind", "status_code",
                      "status_message", "start_ns", "end_ns", "attributes", "resource",
                      "scope_name", "scope_version", "events", "links"):  # fmt: skip
            assert getattr(span, field) == getattr(twin, field), (span.name, field)
        names.add(span.name)
    # every shape was there
    assert {"forward", "prefetch", "checkpoint_save", "rollout", "http.request",
            "fast_path_probe", "checkpoint_restore", "read_shard"} <= names  # fmt: skip
    probe = next(s for s in got_fast if s.name == "fast_path_probe")
    assert probe.attributes["tunix.goodput.category"] == "evaluation"
    fail = next(s for s in got_fast if s.name == "checkpoint_save")
    assert fail.status_code == "STATUS_CODE_ERROR" and fail.events[0].name == "exception"
    assert next(s for s in got_fast if s.name == "follow.up").links
    assert any(e.name == "tunix.alert" for s in got_fast for e in s.events)


class _Keep(StepSpanProcessor):
    def __init__(self) -> None:
        self.steps: list[Any] = []

    def on_finished_steps(self, steps: Any) -> None:
        self.steps.extend(steps)


def test_the_bytes_are_the_sdk_encoders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-bytes")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    keep = _Keep()
    otel_tunix.configure(output_dir="none", span_processors=[keep])
    _run()
    otel_tunix.shutdown()
    steps = keep.steps
    assert len(steps) == STEPS
    sdk_spans = [span for step in steps for span in step.spans()]
    encoder = StepEncoder()
    for _ in range(2):  # made, then from the caches
        mine = encoder.encode(steps, lambda step: step.spans())
        assert mine == encode_spans(sdk_spans).SerializeToString()


@pytest.mark.parametrize(
    ("protocol", "fast", "expected"),
    [
        ("grpc", "true", GrpcStepExporter),
        ("http/protobuf", "true", HttpStepExporter),
        ("grpc", "false", GrpcSpanExporter),
        ("http/protobuf", "false", HttpSpanExporter),
    ],
)
def test_otel_traces_exporter_otlp_takes_the_fast_path_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch, protocol: str, fast: str, expected: type
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_TUNIX_OTLP_FAST_PATH", fast)
    otel_tunix.configure(output_dir="none")
    exporters = [
        p.exporter
        for p in span_processors_of(trace.get_tracer_provider()._active_span_processor)  # type: ignore[attr-defined]
        if isinstance(p, BatchExportProcessor)
    ]
    otel_tunix.shutdown()
    assert [type(e) for e in exporters] == [expected]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_otlp_settings_reach_the_wire_through_the_fast_path(
    monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    """Endpoint, protocol, headers, compression and timeout from the signal's own
    ``OTEL_EXPORTER_OTLP_TRACES_*`` variables, as a receiver sees them (certificates:
    test_otlp_tls.py)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    receiver = (grpc_receiver if protocol == "grpc" else http_receiver)()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint
                           + ("" if protocol == "grpc" else "/v1/traces"))  # fmt: skip
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        monkeypatch.setenv(
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-team=ml,authorization=Bearer t0k"
        )
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "3")
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
        monkeypatch.setenv("OTEL_LOGS_EXPORTER", "none")
        otel_tunix.configure(output_dir="none")
        with otel_tunix.step(0):
            with otel_tunix.component("forward"):
                pass
        otel_tunix.shutdown()
        assert receiver.wait("traces", 10)
    finally:
        receiver.close()
    request = receiver.of("traces")[0]
    headers = request.headers
    assert headers["x-team"] == "ml"
    assert headers["authorization"] == "Bearer t0k"
    if protocol == "grpc":
        assert request.deadline_s is not None and 0 < request.deadline_s <= 3
    else:  # (gRPC's compression is undone by the server's library)
        assert headers["content-encoding"] == "gzip"
    spans = ExportTraceServiceRequest.FromString(request.payload).resource_spans[0]
    assert sorted(s.name for s in spans.scope_spans[0].spans) == ["forward", "train_step"]
