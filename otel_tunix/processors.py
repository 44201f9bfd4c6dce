"""Span processors of otel-tunix.

:class:`StepAccountingProcessor` is a real OTel ``SpanProcessor``. otel-tunix's span
builder hands it each finished step whole (:meth:`~StepAccountingProcessor.on_finished_steps`,
no SDK spans needed), with the step's counters already derived as the builder read it
(``FinishedStep.summary``); fed SDK spans one at a time instead (``on_end``, from any span
pipeline), it groups the components of each step by the ``tunix.*`` attributes and derives
the same numbers when the step span ends. Either way the busy / blocked / idle counters come
from :func:`otel_tunix.accounting.account_components`; the resulting :class:`StepSummary`
goes to *sinks*: OTel instruments, the MetricsLogger, the spans JSONL file, a user's export
function.
Spans from other code pass through untouched.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span
from opentelemetry.trace import StatusCode

from otel_tunix import attributes as attr
from otel_tunix._errors import ReportOnce, report_internal_error
from otel_tunix.accounting import account_intervals
from otel_tunix.model import ScopeSession, SpanInfo, StepSummary
from otel_tunix.pipeline.background import BackgroundSpan
from otel_tunix.pipeline.hooks import (
    HookRunner,
    close_hooks,
    closing_threads,
    flush_hooks,
    runs_user_code,
)
from otel_tunix.pipeline.outside import OutsideSpan
from otel_tunix.pipeline.span_builder import FinishedStep, StepSpanProcessor

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


class StepSink:
    """Base class of what receives the accounting processor's step summaries.

    Every hook is declared here with a default, as the OTel SDK's ``SpanProcessor`` does;
    a sink overrides what it needs. Contract: hooks should not raise (one that raises is
    reported once and the other sinks go on). otel-tunix's own sinks run on its worker
    thread; any other (``configure(step_sinks=)``, an export function's, a class whose
    ``runs_user_code`` is true) runs on a thread of its own (:class:`OffThreadSink`), so
    that whatever it does, the worker, the training loop and the shutdown budget hold.
    """

    runs_user_code = False
    """True for a sink of otel-tunix's that calls the user's code (it then runs on a thread
    of its own, as the user's sinks do)."""

    def on_step(self, summary: StepSummary) -> None:
        """One sampled step finished. Default: nothing."""

    def on_steps(self, summaries: Sequence[StepSummary]) -> None:
        """The steps of one batch, in order. Default: :meth:`on_step` for each; a step that
        raises does not lose the others (the first error is raised at the end, for the
        processor to report)."""
        error: Exception | None = None
        for summary in summaries:
            try:
                self.on_step(summary)
            except Exception as exc:  # the sink's code: raised below, the processor reports it
                error = error or exc
        if error is not None:
            raise error

    def on_session(self, sessions: list[ScopeSession]) -> None:
        """The session ends (``otel_tunix.shutdown()``): totals per scope. Default:
        nothing."""

    def on_background_spans(self, spans: Sequence[BackgroundSpan]) -> None:
        """Spans of other threads' work that ended after their step was processed (an async
        checkpoint writer's), each with its step's scope, number and trace id; their time
        is already in the steps they overlap. Default: nothing."""

    def on_outside_spans(self, spans: Sequence[OutsideSpan]) -> None:
        """Components recorded outside any step (a checkpoint restore before the loop, an
        evaluation between steps, a writer after the last step), each ended record at once:
        its nested components in start order, then its root
        (:class:`~otel_tunix.pipeline.outside.OutsideSpan`: name, kind, Unix-ns times,
        trace / span / parent ids, thread, declared ``category``; ``info()``, ``span()``).
        No step counts them: a sink that keeps time by goodput category (the live ledger)
        takes the time outside the steps from here. Called on the worker thread (a user's
        sink: on its own thread, in order with its other calls). Default: nothing."""

    def flush(self) -> None:
        """After each batch of steps: hand buffered output on. Default: nothing."""

    def close(self) -> None:
        """Release files and clients (after :meth:`on_session`). Default: nothing."""


class OffThreadSink(StepSink):
    """A sink that is not otel-tunix's own, run on a thread of its own
    (:mod:`otel_tunix.pipeline.hooks`): each hook call is queued and returns at once;
    :meth:`StepAccountingProcessor.finish_session` waits for it until a deadline."""

    def __init__(self, sink: StepSink, failed: Callable[[str], object]) -> None:
        self.sink = sink
        self.runner = HookRunner(type(sink).__name__, failed)

    def on_step(self, summary: StepSummary) -> None:
        self.runner.call(self.sink.on_steps, (summary,))

    def on_steps(self, summaries: Sequence[StepSummary]) -> None:
        self.runner.call(self.sink.on_steps, summaries)

    def on_session(self, sessions: list[ScopeSession]) -> None:
        self.runner.call(self.sink.on_session, sessions)

    def on_background_spans(self, spans: Sequence[BackgroundSpan]) -> None:
        self.runner.call(self.sink.on_background_spans, spans)

    def on_outside_spans(self, spans: Sequence[OutsideSpan]) -> None:
        self.runner.call(self.sink.on_outside_spans, spans)

    def flush(self) -> None:
        self.runner.call(self.sink.flush)

    def close(self) -> None:
        """Close it on its thread, waiting as long as it takes (``finish_session`` gives it
        a deadline instead)."""
        self.runner.start_closing(self.sink.close).join()


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
    """Derives per-step busy / blocked / idle time and per-session totals from spans.

    Args:
        sinks: Where each :class:`StepSummary` goes; more can be added with :meth:`add_sink`.
        max_open_steps: Steps whose component spans are buffered while their step span has
            not arrived; the oldest is dropped past this bound (memory stays constant).
    """

    def __init__(self, sinks: Iterable[StepSink] = (), *, max_open_steps: int = 1024) -> None:
        self._sinks: list[StepSink] = []
        for sink in sinks:
            self.add_sink(sink)
        self._open: OrderedDict[tuple[int, str, int], list[ReadableSpan]] = OrderedDict()
        self._max_open = max_open_steps
        self._sessions: dict[str, ScopeSession] = {}
        self._lock = threading.Lock()
        self._report = ReportOnce(_logger)
        self._closed = False
        self.last_summary: StepSummary | None = None

    def add_sink(self, sink: StepSink) -> None:
        """Add a destination for step summaries.

        Raises:
            TypeError: ``sink`` is not a :class:`StepSink`.
        """
        if not isinstance(sink, StepSink):
            raise TypeError(f"{sink!r} is not an otel_tunix.processors.StepSink")
        if runs_user_code(sink) and not isinstance(sink, OffThreadSink):
            sink = OffThreadSink(sink, functools.partial(self._failed, sink))
        self._sinks.append(sink)

    @property
    def sinks(self) -> tuple[StepSink, ...]:
        return tuple(self._sinks)

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
        """Whole otel-tunix steps, in order: the span builder's path, with no per-span
        buffering and no SDK spans needed; the sinks get the batch's summaries together."""
        if self._closed:
            return
        summaries = []
        for step in steps:
            try:
                summaries.append(step.summary)  # made as the span builder read the step
            except Exception:
                report_internal_error("the accounting of a step")
        if summaries:
            self._publish(summaries)

    def on_background_spans(self, spans: Sequence[BackgroundSpan]) -> None:
        """Background spans handed on after their step: to every sink."""
        self._to_sinks("on_background_spans", spans)

    def on_outside_spans(self, spans: Sequence[OutsideSpan]) -> None:
        """Components recorded outside any step: to every sink (no step counts them)."""
        self._to_sinks("on_outside_spans", spans)

    def _to_sinks(self, hook: str, spans: Sequence[Any]) -> None:
        """``sink.<hook>(spans)`` for every sink; one that raises is reported, not the rest."""
        if self._closed:
            return
        for sink in self._sinks:
            try:
                getattr(sink, hook)(spans)
            except Exception:
                self._failed(sink, hook)

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
        """Session totals, then every sink's ``on_steps(summaries)``."""
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
        for sink in self._sinks:
            try:
                sink.on_steps(summaries)
            except Exception:
                self._failed(sink, "on_steps")

    def _failed(self, sink: StepSink, method: str) -> None:
        self._report(
            id(sink),
            "otel-tunix: %s.%s failed (reported once; the run goes on)",
            type(sink).__name__,
            method,
        )

    def flush_sinks(self) -> None:
        """Call every sink's ``flush()`` (after a batch of steps)."""
        for sink in self._sinks:
            try:
                sink.flush()
            except Exception:
                self._failed(sink, "flush")

    def flush_hooks(self, timeout: float) -> bool:
        """Wait until the sinks on threads of their own have run every call queued so far
        (False: ``timeout`` passed first)."""
        return flush_hooks(self._runners(), timeout)

    def hooks_closing(self) -> list[tuple[str, threading.Thread]]:
        """``(name, thread)`` of each sink being closed on a thread of its own: for a
        shutdown that waits for them beside other work."""
        return closing_threads(self._runners(), "step sink")

    def _runners(self) -> list[HookRunner]:
        return [s.runner for s in self._sinks if isinstance(s, OffThreadSink)]

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
        """Send the session totals to every sink and close the sinks. Those on threads of
        their own are closed side by side and waited for at most ``timeout`` seconds (default:
        as long as they take; ``0``: not at all, see :meth:`hooks_closing`); returns the
        names of those that had not finished."""
        sessions = self.sessions(step_counts, unsampled)
        for sink in self._sinks:
            try:
                sink.on_session(sessions)
            except Exception:
                self._failed(sink, "on_session")
        hooks = []
        for sink in self._sinks:
            if isinstance(sink, OffThreadSink):
                hooks.append((sink.runner, sink.sink.close))
                continue
            try:
                sink.close()
            except Exception:
                self._failed(sink, "close")
        self._closed = True
        if not hooks:
            return []
        unfinished = close_hooks(hooks, 1e9 if timeout is None else timeout)
        if unfinished:
            _logger.warning(
                "otel-tunix: step sink %s had not finished after %g s; left behind",
                ", ".join(unfinished),
                timeout,
            )
        return unfinished

    def shutdown(self) -> None:
        self._closed = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
