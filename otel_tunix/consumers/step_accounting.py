"""The accounting processor, and the public names of the one consumer interface.

:class:`StepSink` (the base class of everything that consumes finished steps) and
:class:`StepSpanProcessor` (a consumer that is also an SDK span processor) are defined in
:mod:`otel_tunix.pipeline.step_sinks` and importable from here.

:class:`StepAccountingProcessor` is one of the worker's consumers: it keeps the session
totals per scope and the latest step summary, from each finished step whole
(:meth:`~StepAccountingProcessor.on_finished_steps`, its counters already derived as the
span builder read it: ``FinishedStep.summary``). It is also a real OTel ``SpanProcessor``:
fed SDK spans one at a time instead (``on_end``, from any span pipeline), it groups the
components of each step by the ``tunix.*`` attributes and derives the same numbers when the
step span ends (:func:`otel_tunix.accounting.step_time.account_intervals`), and hands the summaries
to
sinks of its own (``StepAccountingProcessor(sinks)``). Spans from other code pass through
untouched.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span
from opentelemetry.trace import StatusCode

from otel_tunix.accounting.step_time import account_intervals
from otel_tunix.model.steps import ScopeSession, SpanInfo, StepSummary
from otel_tunix.pipeline.background import BackgroundSpan
from otel_tunix.pipeline.outside import OutsideSpan
from otel_tunix.pipeline.span_builder import FinishedStep
from otel_tunix.pipeline.step_sinks import Consumers, StepSink, StepSpanProcessor
from otel_tunix.settings import attributes as attr
from otel_tunix.support.errors import report_internal_error

__all__ = ["StepAccountingProcessor", "StepSink", "StepSpanProcessor", "span_info"]

_logger = logging.getLogger(__name__)

_EXTRA_SPAN_ATTRS = (attr.DEVICE_END, attr.HOST_DURATION, attr.INCOMPLETE)
_STEP_KEYS = frozenset(
    (
        attr.SPAN_TYPE,
        attr.SCOPE,
        attr.STEP,
        # the breakdown the span builder puts on the step span: derived, not the user's
        attr.STEP_DURATION,
        attr.STEP_BUSY_TIME,
        attr.STEP_BLOCKED_TIME,
        attr.STEP_IDLE_TIME,
    )
)


def span_info(span: ReadableSpan) -> SpanInfo:
    """The :class:`SpanInfo` of an otel-tunix component span."""
    a = span.attributes or {}
    parent = span.parent
    error = None
    if span.status.status_code is StatusCode.ERROR:
        error = span.status.description or "error"
    ctx = span.context
    return SpanInfo(
        name=span.name,
        kind=str(a.get(attr.TIME_KIND, attr.KIND_BUSY)),
        start_ns=span.start_time or 0,
        end_ns=span.end_time or 0,
        thread=str(a.get(attr.THREAD_NAME, "")),
        thread_id=int(a.get(attr.THREAD_ID, 0) or 0),  # type: ignore[arg-type]
        span_id=f"{ctx.span_id:016x}" if ctx else "",
        parent=f"{parent.span_id:016x}" if parent else None,
        error=error,
        attributes={k: a[k] for k in _EXTRA_SPAN_ATTRS if k in a},
        category=_as_category(a.get(attr.GOODPUT_CATEGORY)),
    )


def _as_category(value: object) -> str | None:
    return value if isinstance(value, str) else None


class StepAccountingProcessor(StepSpanProcessor):
    """Per-scope session totals and the latest step summary, from otel-tunix's steps (one
    of the worker's consumers) or from SDK spans (``on_end``).

    Args:
        sinks: Where its step summaries go when it is used on its own (fed SDK spans, or
            steps by hand); in a run the worker's consumers get the steps themselves. More
            can be added with :meth:`add_sink`.
        max_open_steps: Steps whose component spans are buffered while their step span has
            not arrived; the oldest is dropped past this bound (memory stays constant).
    """

    def __init__(self, sinks: Iterable[StepSink] = (), *, max_open_steps: int = 1024) -> None:
        self._consumers = Consumers(sinks)
        self._open: OrderedDict[tuple[int, str, int], list[ReadableSpan]] = OrderedDict()
        self._max_open = max_open_steps
        self._sessions: dict[str, ScopeSession] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.last_summary: StepSummary | None = None

    def add_sink(self, sink: StepSink) -> None:
        """Add a destination for its step summaries.

        Raises:
            TypeError: ``sink`` is not a :class:`StepSink`.
        """
        self._consumers.add(sink)

    @property
    def sinks(self) -> tuple[StepSink, ...]:
        """Its own sinks, in order."""
        return self._consumers.sinks

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if self._closed:
            return
        a = span.attributes
        kind = a.get(attr.SPAN_TYPE) if a else None
        if kind is None or a is None or attr.OUTSIDE in a:  # no step's (outside: its own)
            return
        try:
            trace_id = span.context.trace_id if span.context else 0
            key = (trace_id, str(a[attr.SCOPE]), int(a[attr.STEP]))  # type: ignore[arg-type]
            if kind == attr.SPAN_TYPE_COMPONENT:
                with self._lock:
                    buf = self._open.get(key)
                    if buf is None:
                        buf = self._open[key] = []
                    buf.append(span)
                    while len(self._open) > self._max_open:
                        self._open.popitem(last=False)
            elif kind == attr.SPAN_TYPE_STEP:
                with self._lock:
                    components = self._open.pop(key, [])
                self._finish_step(span, components)
        except Exception:
            report_internal_error("the accounting of a span")

    def on_finished_steps(self, steps: Sequence[FinishedStep]) -> None:
        """Whole otel-tunix steps, in order: their summaries (made as the span builder read
        each step) into the session totals; the steps to its own sinks."""
        if self._closed:
            return
        summaries = []
        for step in steps:
            try:
                summaries.append(step.summary)
            except Exception:
                report_internal_error("the accounting of a step")
        if summaries:
            self._totals(summaries)
            self._consumers.steps(steps)

    def on_background_spans(self, spans: Sequence[BackgroundSpan]) -> None:
        """Background spans handed on after their step: to its own sinks."""
        self._consumers.background(spans)

    def on_outside_spans(self, spans: Sequence[OutsideSpan]) -> None:
        """Components recorded outside any step: to its own sinks (no step counts them)."""
        self._consumers.outside(spans)

    def _finish_step(self, span: ReadableSpan, components: Sequence[ReadableSpan]) -> None:
        components = sorted(components, key=lambda c: c.start_time or 0)  # arrival order varies
        a = span.attributes or {}
        scope = str(a[attr.SCOPE])
        extra = {k: v for k, v in a.items() if k not in _STEP_KEYS}
        intervals = [
            (
                c.name,
                c.attributes.get(attr.TIME_KIND) == attr.KIND_BLOCKED,  # type: ignore[union-attr]
                c.start_time or 0,
                c.end_time or 0,
            )
            for c in components
        ]
        summary = account_intervals(
            scope,
            int(a[attr.STEP]),  # type: ignore[arg-type]
            span.start_time or 0,
            span.end_time or 0,
            intervals,
            spans=lambda: [span_info(c) for c in components],
            trace_id=f"{span.context.trace_id:032x}" if span.context else "",
            attributes=extra,
            span_id=span.context.span_id if span.context else 0,
        )
        self._publish((summary,))

    def _publish(self, summaries: Sequence[StepSummary]) -> None:
        """Session totals, then its sinks' ``on_steps(summaries)``."""
        self._totals(summaries)
        self._consumers.summaries(summaries)

    def _totals(self, summaries: Sequence[StepSummary]) -> None:
        """The summaries into the session totals; the latest kept."""
        by_scope: dict[str, list[StepSummary]] = {}
        for summary in summaries:
            scope = summary.scope
            if scope in by_scope:
                by_scope[scope].append(summary)
            else:
                by_scope[scope] = [summary]
        with self._lock:
            sessions = self._sessions
            for scope, steps in by_scope.items():
                session = sessions.get(scope)
                if session is None:
                    session = sessions[scope] = ScopeSession(scope)
                session.add_all(steps)
        self.last_summary = summaries[-1]

    def flush(self) -> None:
        """Its own sinks' ``flush()`` (after a batch of steps)."""
        self._consumers.flush()

    def flush_hooks(self, timeout: float) -> bool:
        """Wait until its sinks on threads of their own have run every call queued so far
        (False: ``timeout`` passed first)."""
        return self._consumers.flush_hooks(timeout)

    def hooks_closing(self) -> list[tuple[str, threading.Thread]]:
        """``(name, thread)`` of each of its sinks being closed on a thread of its own."""
        return self._consumers.hooks_closing()

    def sessions(
        self,
        step_counts: Mapping[str, tuple[int, int, int, int]] | None = None,
        unsampled: Mapping[str, Mapping[str, float]] | None = None,
    ) -> list[ScopeSession]:
        """Per-scope totals; ``step_counts`` maps scope to (steps, first start, last end,
        active ns) of all its steps, sampled or not; ``unsampled``, scope to the badput
        time (seconds per goodput category) of its unsampled steps after its last sampled
        one."""
        with self._lock:
            out = {k: v.copy() for k, v in self._sessions.items()}
        for scope, (count, first, last, active) in (step_counts or {}).items():
            s = out.setdefault(scope, ScopeSession(scope))
            s.steps, s.first_start_ns, s.last_end_ns, s.active_ns = count, first, last, active
        for scope, seconds in (unsampled or {}).items():
            out.setdefault(scope, ScopeSession(scope)).unsampled_sec = dict(seconds)
        return [out[k] for k in sorted(out)]

    def finish_session(
        self,
        step_counts: Mapping[str, tuple[int, int, int, int]],
        timeout: float | None = None,
        unsampled: Mapping[str, Mapping[str, float]] | None = None,
    ) -> list[str]:
        """Send the session totals to its sinks and close them (see
        :meth:`Consumers.finish`); returns the names of those that had not finished."""
        unfinished = self._consumers.finish(self.sessions(step_counts, unsampled), timeout)
        self._closed = True
        return unfinished

    def shutdown(self) -> None:
        self._closed = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
