"""otel_tunix.testing.capture(): public configure() options, deterministic times and ids."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_tunix
from otel_tunix import ConfigurationError, StepSummary
from otel_tunix.consumers.step_accounting import StepSink
from otel_tunix.testing import capture


def _ticks(step_ns: int = 1_000_000) -> Any:
    """A clock that advances 1 ms each time it is read."""
    counter = itertools.count(step_ns, step_ns)
    return lambda: next(counter)


def _loop() -> None:
    for n in range(3):
        with otel_tunix.step(n):
            with otel_tunix.component("data"):
                pass
            with otel_tunix.component("compute"):
                pass


def _run() -> list[tuple[str, int, int, int, int, int | None]]:
    with capture(clock=_ticks(), id_seed=7) as cap:
        _loop()
        spans = cap.spans()
        summaries = list(cap.summaries)
    assert [s.step_time_sec for s in summaries] == [0.005, 0.005, 0.005]
    assert [s.components["data"].busy_time_sec for s in summaries] == [0.001] * 3
    return [
        (
            s.name,
            s.start_time or 0,
            s.end_time or 0,
            s.context.trace_id,
            s.context.span_id,
            s.parent.span_id if s.parent else None,
        )
        for s in spans
    ]


def test_a_clock_and_an_id_seed_make_two_runs_identical() -> None:
    first, second = _run(), _run()
    assert first == second
    by_name = {name: (start, end) for name, start, end, *_ in first[:3]}
    # Ticks of 1 ms: step 0 starts at 1 ms, data runs 2-3 ms, compute 4-5 ms, the step ends at 6.
    assert by_name == {
        "data": (2_000_000, 3_000_000),
        "compute": (4_000_000, 5_000_000),
        "train_step": (1_000_000, 6_000_000),
    }
    with capture(clock=_ticks(), id_seed=8) as cap:
        _loop()
        other = {s.context.trace_id for s in cap.spans()}
    assert other.isdisjoint({tid for *_, tid, _, _ in first})


def test_ids_are_random_again_after_a_seeded_run() -> None:
    _run()
    with capture() as cap:
        _loop()
        trace_ids = {s.context.trace_id for s in cap.spans()}
    assert trace_ids.isdisjoint({t for *_, t, _, _ in _run()})


def test_step_sinks_span_processors_and_metric_readers_are_public_options(tmp_path) -> None:
    class Keep(StepSink):
        def __init__(self) -> None:
            self.steps: list[int] = []
            self.scopes: list[str] = []

        def on_step(self, summary: StepSummary) -> None:
            self.steps.append(summary.step)

        def on_session(self, sessions: Any) -> None:
            self.scopes = [s.scope for s in sessions]

    sink, exporter, reader = Keep(), InMemorySpanExporter(), InMemoryMetricReader()
    otel_tunix.configure(
        output_dir="none",
        step_sinks=[sink],
        span_processors=[SimpleSpanProcessor(exporter)],
        metric_readers=[reader],
    )
    _loop()
    otel_tunix.shutdown()
    assert sink.steps == [0, 1, 2] and sink.scopes == ["train"]
    assert [s.name for s in exporter.get_finished_spans()].count("train_step") == 3
    data = reader.get_metrics_data()
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert "tunix.step.duration" in names


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"step_sinks": [object()]}, "step_sinks: <object"),
        ({"span_processors": ["p"]}, "span_processors: 'p' is not a SpanProcessor"),
        ({"metric_readers": [1]}, "metric_readers: 1 is not a MetricReader"),
        ({"clock": 5}, "clock must be a function"),
        ({"id_seed": "x"}, "id_seed must be an int"),
    ],
)
def test_bad_options_are_configuration_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        otel_tunix.configure(output_dir="none", **kwargs)
