"""Helpers to test code instrumented with otel-tunix (and otel-tunix itself).

``capture()`` configures otel-tunix with in-memory span and metric readers, so a test can
assert on the spans, the metrics and the step summaries a piece of code produces::

    from otel_tunix.testing import capture

    def test_my_loop(tmp_path):
        with capture(output_dir=tmp_path) as cap:
            run_my_training_loop(steps=3)
        assert [s.name for s in cap.spans()][-1] == "train_step"
        assert cap.summaries[0].busy_time_sec > 0
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_tunix.consumers.step_accounting import StepSink
from otel_tunix.model.steps import ScopeSession, StepSummary
from otel_tunix.pipeline.span_builder import FinishedStep
from otel_tunix.pipeline.worker import _MAX_BATCH
from otel_tunix.recording import current_run as _current
from otel_tunix.recording import hot_path as _recording
from otel_tunix.run import setup
from otel_tunix.support import errors as _errors
from otel_tunix.support.shortcuts import reset_global_providers

__all__ = ["Capture", "StepsSetAside", "capture", "reset", "steps_set_aside"]


def reset() -> None:
    """Shut otel-tunix down and clear the OTel API's global providers.

    The global tracer and meter providers can be set once per process; tests that configure
    several runs reset them between runs, as OpenTelemetry's own test utilities do.
    """
    setup.shutdown()
    reset_global_providers()
    _errors.forget_reports()
    _current.forget_shutdown()


class _SummaryCollector(StepSink):
    def __init__(self, cap: Capture) -> None:
        self._cap = cap

    def on_step(self, summary: StepSummary) -> None:
        self._cap.summaries.append(summary)

    def on_session(self, sessions: list[ScopeSession]) -> None:
        self._cap.sessions.extend(sessions)

    def close(self) -> None:
        return None


@dataclass
class Capture:
    """What a :func:`capture` block recorded."""

    span_exporter: InMemorySpanExporter
    metric_reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    summaries: list[StepSummary] = field(default_factory=list)
    sessions: list[ScopeSession] = field(default_factory=list)

    def flush(self) -> None:
        """Process every finished step (spans and summaries appear after this)."""
        setup.force_flush()

    def spans(self) -> list[ReadableSpan]:
        """Every finished span so far, in the order the processors saw them."""
        self.flush()
        return list(self.span_exporter.get_finished_spans())

    def metrics(self) -> dict[str, list[Any]]:
        """``{instrument name: [data points]}`` collected right now."""
        self.flush()
        data = self.metric_reader.get_metrics_data()
        out: dict[str, list[Any]] = {}
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out.setdefault(m.name, []).extend(m.data.data_points)
        return out

    def metric_units(self) -> dict[str, str]:
        """``{instrument name: unit}`` of the metrics collected right now."""
        data = self.metric_reader.get_metrics_data()
        return {
            m.name: m.unit or ""
            for rm in (data.resource_metrics if data else [])
            for sm in rm.scope_metrics
            for m in sm.metrics
        }


@contextmanager
def capture(
    *, output_dir: str | os.PathLike[str] | None = "none", **configure_kwargs: Any
) -> Iterator[Capture]:
    """Configure otel-tunix with in-memory exporters for the duration of the block.

    Built on :func:`otel_tunix.configure`'s public options only: an SDK tracer provider
    with an in-memory span exporter, an SDK meter provider with an in-memory reader, and a
    step sink that keeps every :class:`StepSummary`. Other keyword arguments go to
    ``configure()`` as they are (``clock=`` and ``id_seed=`` make times and ids
    deterministic; ``step_sinks=`` and ``span_processors=`` add to capture's own). By
    default no local run folder is written (``output_dir="none"``). On exit otel-tunix is
    shut down and the OTel globals are reset.
    """
    reset()
    exporter = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    tp = configure_kwargs.pop("tracer_provider", None) or TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    mp = configure_kwargs.pop("meter_provider", None) or MeterProvider(metric_readers=[reader])
    cap = Capture(exporter, reader, tp, mp)
    sinks = (*configure_kwargs.pop("step_sinks", ()), _SummaryCollector(cap))
    setup.configure(
        output_dir=output_dir,
        tracer_provider=tp,
        meter_provider=mp,
        step_sinks=sinks,
        **configure_kwargs,
    )
    try:
        yield cap
    finally:
        cap.flush()
        reset()


class StepsSetAside(list[Any]):
    """The sampled steps :func:`steps_set_aside` kept, as recorded on the hot path."""

    def __init__(self, builder: Any) -> None:
        super().__init__()
        self._builder = builder

    def finished(self) -> list[FinishedStep]:
        """The kept steps as the span processors would get them (components ended)."""
        return [FinishedStep(self._builder, rec) for rec in self]

    def process(self) -> int:
        """Hand the kept steps to the span processors now, on the calling thread, in the
        worker's batches (what otel-tunix's worker would have done with them; the
        benchmarks time the whole path on one thread this way), and forget them. Returns
        how many could not be read."""
        failed = 0
        for i in range(0, len(self), _MAX_BATCH):
            failed += self._builder(self[i : i + _MAX_BATCH])
        self.clear()
        return failed


@contextmanager
def steps_set_aside() -> Iterator[StepsSetAside]:
    """While active, finished sampled steps are kept in the yielded list instead of going to
    otel-tunix's worker: for timing the training thread's own cost (the benchmarks) and for
    looking at steps exactly as recorded (tests). Needs :func:`otel_tunix.configure` first.
    """
    runtime = _recording.get_runtime()
    if runtime is None:
        raise RuntimeError("steps_set_aside() needs otel_tunix.configure() first")
    pipeline = runtime.pipeline
    kept = StepsSetAside(pipeline._process)
    submit = pipeline.submit
    pipeline.submit = kept.append  # type: ignore[method-assign,assignment]
    try:
        yield kept
    finally:
        pipeline.submit = submit  # type: ignore[method-assign]
