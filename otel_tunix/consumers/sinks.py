"""Where step summaries go: OTel instruments, the MetricsLogger, a user's export function.

Each class is a :class:`otel_tunix.consumers.step_accounting.StepSink`. They run on otel-tunix's
worker thread, never on the training thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.metrics import Histogram, Meter
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, set_span_in_context

from otel_tunix.consumers.step_accounting import StepSink
from otel_tunix.consumers.step_histograms import (
    STEP_HISTOGRAMS,
    StepHistograms,
    step_histograms_for,
)
from otel_tunix.logger.backend import PERF_SOURCE, otel_metric_name, to_scalar
from otel_tunix.logger.metrics_logger import MetricsLogger
from otel_tunix.logger.perf_rows import PerfRows
from otel_tunix.model.metric_spec import SECONDS_BUCKETS
from otel_tunix.model.steps import ScopeSession, StepSummary
from otel_tunix.settings import attributes as attr
from otel_tunix.support.errors import ReportOnce
from otel_tunix.support.shortcuts import new_span_context

_logger = logging.getLogger(__name__)


class InstrumentSink(StepSink):
    """Step counters as OTel histograms in seconds (scope / component as attributes).

    Instruments: ``tunix.step.duration``, ``tunix.step.busy_time``, ``tunix.step.blocked_time``,
    ``tunix.step.idle_time`` (attribute ``scope``); ``tunix.component.busy_time``,
    ``tunix.component.blocked_time`` (``scope``, ``component``); for steps with device work,
    ``tunix.step.device_lag`` (how long after the host window the device finished, ``scope``)
    and ``tunix.component.device_time`` (dispatch to device completion, ``scope``,
    ``component``). Values returned by a custom export function become histograms named as
    returned (see :meth:`record_custom`).

    ``tunix.step.duration`` is recorded in the context of the step's span, so the SDK's
    exemplar reservoir (one exemplar per bucket; ``OTEL_METRICS_EXEMPLAR_FILTER``, default
    ``trace_based``, which takes it: every recorded step span is sampled) keeps the trace id
    and span id of a step in each bucket, and a click from a percentile lands on its trace.

    With ``histograms`` (see :func:`instrument_sink`) the step histograms are folded per
    batch and handed to the readers whole, the same points for ~20x less CPU; values of an
    export function still go through the SDK's instruments.
    """

    def __init__(self, meter: Meter, histograms: StepHistograms | None = None) -> None:
        self._meter = meter
        self._histograms = histograms
        self._custom: dict[str, Histogram] = {}
        if histograms is not None:  # they make the step histograms; no SDK instrument
            return

        def hist(name: str, desc: str) -> Histogram:
            return meter.create_histogram(
                name,
                unit="s",
                description=desc,
                explicit_bucket_boundaries_advisory=list(SECONDS_BUCKETS),
            )

        (
            self._step,
            self._busy,
            self._blocked,
            self._idle,
            self._c_busy,
            self._c_blocked,
            self._device_lag,
            self._c_device,
        ) = (hist(name, desc) for name, desc in STEP_HISTOGRAMS)

    def on_steps(self, summaries: Sequence[StepSummary]) -> None:
        """A batch of steps: folded at once where the step histograms are otel-tunix's
        own (:mod:`otel_tunix.consumers.step_histograms`), else recorded step by step."""
        if self._histograms is not None:
            self._histograms.add(summaries)
        else:
            super().on_steps(summaries)

    def on_step(self, summary: StepSummary) -> None:
        if self._histograms is not None:
            self._histograms.add((summary,))
            return
        a = {attr.METRIC_SCOPE: summary.scope}
        self._step.record(summary.step_time_sec, a, context=_step_context(summary))
        self._busy.record(summary.busy_time_sec, a)
        self._blocked.record(summary.blocked_time_sec, a)
        self._idle.record(summary.idle_time_sec, a)
        for name, (busy, blocked, _) in summary.component_times.items():
            ca = {attr.METRIC_SCOPE: summary.scope, attr.METRIC_COMPONENT: name}
            if busy or not blocked:
                self._c_busy.record(busy, ca)
            if blocked:
                self._c_blocked.record(blocked, ca)
        if summary.device_end_ns:
            self._device_lag.record(summary.device_lag_sec, a)
            for name, seconds in (summary.device_times or {}).items():
                ca = {attr.METRIC_SCOPE: summary.scope, attr.METRIC_COMPONENT: name}
                self._c_device.record(seconds, ca)

    def record_custom(self, name: str, value: float, scope: str) -> None:
        """Record a value returned by a custom export function."""
        h = self._custom.get(name)
        if h is None:
            unit = "s" if name.endswith(("_sec", "_time", "_seconds")) else "1"
            h = self._custom[name] = self._meter.create_histogram(
                otel_metric_name(name),
                unit=unit,
                description="returned by the custom export function",
                explicit_bucket_boundaries_advisory=list(SECONDS_BUCKETS) if unit == "s" else None,
            )
        h.record(value, {attr.METRIC_SCOPE: scope})

    def on_session(self, sessions: list[ScopeSession]) -> None:
        return None

    def close(self) -> None:
        return None


def instrument_sink(
    meter_provider: Any,
    scope: str,
    version: str,
    *,
    readers: Sequence[MetricReader] | None,
    resource: Resource,
    fast: bool,
) -> InstrumentSink:
    """The run's :class:`InstrumentSink` on ``meter_provider``'s meter ``scope``.

    ``readers``: those of a provider otel-tunix built (``None`` for one it joined). With
    ``fast`` (``OTEL_TUNIX_METRICS_FAST_PATH``) and such readers, the step histograms are
    produced into them by otel-tunix where that gives what the SDK would
    (:func:`~otel_tunix.consumers.step_histograms.step_histograms_for`); else the SDK's
    instruments record them.
    """
    histograms = None
    if fast and readers:
        histograms = step_histograms_for(
            meter_provider, readers, InstrumentationScope(scope, version), resource
        )
    return InstrumentSink(meter_provider.get_meter(scope, version), histograms)


_NO_CONTEXT = Context()


def _step_context(summary: StepSummary) -> Context | None:
    """A context whose current span is the step's (for exemplars); ``None`` without ids."""
    tid, sid = summary.trace_id_int, summary.span_id
    if not (tid and sid):
        return None
    return set_span_in_context(NonRecordingSpan(new_span_context(tid, sid)), _NO_CONTEXT)


class MetricsLoggerSink(StepSink):
    """Logs the ``perf/<scope>/...`` scalars of each sampled step at its step number."""

    def __init__(self, logger: MetricsLogger) -> None:
        self._logger = logger

    def on_step(self, summary: StepSummary) -> None:
        self.on_steps((summary,))

    def on_steps(self, summaries: Sequence[StepSummary]) -> None:
        """A batch of steps, logged with one :meth:`MetricsLogger.log_rows` call (as
        :class:`~otel_tunix.logger.perf_rows.PerfRows`: dicts made only for backends that read
        them)."""
        if self._logger.wants(PERF_SOURCE):
            self._logger.log_rows(PerfRows(summaries), source=PERF_SOURCE)

    def on_session(self, sessions: list[ScopeSession]) -> None:
        for s in sessions:
            self._logger.log(
                f"perf/{s.scope}/steps_per_sec", s.steps_per_sec, step=None, source=PERF_SOURCE
            )

    def close(self) -> None:
        return None


ExportFn = Callable[[StepSummary], Mapping[str, Any] | None]


class ExportFnSink(StepSink):
    """Runs a user's export function on each step and publishes what it returns.

    The function gets the :class:`StepSummary` (its ``spans`` are the step's component
    spans) and returns ``{metric name: value}``; each value goes to the MetricsLogger at the
    step and to an OTel histogram of that name. An exception is reported once, with its
    traceback, and never reaches the training loop. It runs on a thread of its own
    (``runs_user_code``): a slow or stuck function holds up nothing else.
    """

    runs_user_code = True

    def __init__(
        self,
        fn: ExportFn,
        *,
        instruments: InstrumentSink | None,
        logger: MetricsLogger | None,
        name: str | None = None,
    ) -> None:
        self._fn = fn
        self._instruments = instruments
        self._logger = logger
        self._name = name or getattr(fn, "__qualname__", repr(fn))
        self._report = ReportOnce(_logger)
        self.failures = 0

    def on_step(self, summary: StepSummary) -> None:
        try:
            result = self._fn(summary)
            values = {str(k): to_scalar(v) for k, v in (result or {}).items()}
        except Exception:
            self.failures += 1
            self._report(
                "fn",
                "otel-tunix: export function %s raised (reported once; the run goes on)",
                self._name,
            )
            return
        for name, value in values.items():
            if self._instruments is not None:
                self._instruments.record_custom(name, value, summary.scope)
            if self._logger is not None:
                self._logger.log(name, value, step=summary.step, source=PERF_SOURCE)

    def on_session(self, sessions: list[ScopeSession]) -> None:
        return None

    def close(self) -> None:
        return None
