"""Build real OTel spans from a finished step record and feed them to the span processors.

Runs on the pipeline's worker thread. Spans are SDK ``ReadableSpan`` objects with the ids that
were handed out on the hot path (so foreign spans parented to them line up), the run's
shared ``Resource`` and otel-tunix's instrumentation scope. Component spans are fed first,
in start order, then the step span: processors and exporters can rely on that order.
"""

from __future__ import annotations

import inspect
import logging
import time
import traceback
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from otel_tunix import attributes as attr
from otel_tunix._tracer import SpanRecord, StepRecord, new_span_context

_logger = logging.getLogger(__name__)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)


def epoch_offset_ns() -> int:
    """Add this to a ``perf_counter_ns()`` reading to get Unix epoch nanoseconds."""
    return time.time_ns() - time.perf_counter_ns()


def _error(exc: BaseException | None, end_ns: int) -> tuple[Status, tuple[Event, ...]]:
    if exc is None:
        return _UNSET, ()
    event = Event(
        "exception",
        {
            "exception.type": type(exc).__qualname__,
            "exception.message": str(exc),
            "exception.stacktrace": "".join(traceback.format_exception(exc)),
            "exception.escaped": True,
        },
        timestamp=end_ns,
    )
    return Status(StatusCode.ERROR, f"{type(exc).__qualname__}: {exc}"), (event,)


def _step_events(rec: StepRecord, step_end: int, off: int) -> tuple[Event, ...]:
    """Events added to the step (alerts). One raised before the step started (queued while
    no sampled step was open) is placed at the step's start and keeps its real time in
    ``tunix.event.time_unix_nano``."""
    out = []
    for name, attrs, t in rec.events or ():
        at = min(max(t, rec.start_ns), step_end)
        if at != t:
            attrs = {**attrs, "tunix.event.time_unix_nano": t + off}
        out.append(Event(name, attrs, timestamp=at + off))
    return tuple(out)


_POSITIONAL = (
    "name", "context", "parent", "resource", "attributes", "events", "links", "kind",
    "instrumentation_info", "status", "start_time", "end_time", "instrumentation_scope",
)  # fmt: skip
"""The SDK's ``ReadableSpan.__init__`` parameters, in the order the span builder passes them."""


def _readable_span_factory() -> Callable[..., ReadableSpan]:
    """``ReadableSpan`` itself when its signature has the order of :data:`_POSITIONAL`
    (positional arguments cost ~0.3 us less per span than keywords), else an adapter that
    takes the same positional arguments and passes them by keyword."""

    def by_keyword(*args: Any) -> ReadableSpan:
        return ReadableSpan(**dict(zip(_POSITIONAL, args, strict=True)))

    try:
        params = tuple(inspect.signature(ReadableSpan.__init__).parameters)[1:]
    except (TypeError, ValueError):  # pragma: no cover
        params = ()
    return ReadableSpan if params == _POSITIONAL else by_keyword


def _dispatch_targets(sink: SpanProcessor) -> list[tuple[SpanProcessor, Any]]:
    """The processors behind ``sink`` (a provider's multi-processor is unpacked), each with
    its ``on_step_end(step_span, component_spans, intervals)`` bulk method when it has one."""
    procs = getattr(sink, "_span_processors", None)
    if not isinstance(procs, tuple):
        procs = (sink,)
    return [(p, getattr(p, "on_step_end", None)) for p in procs]


class SpanBuilder:
    """Callable given to the pipeline: step record in, spans out to the span processors.

    Processors get the spans in the usual way, one ``on_end`` call per span, except those
    that have an ``on_step_end(step_span, component_spans)`` method (otel-tunix's accounting
    and export processors): they get a whole step in one call, which is most of what a
    processed span costs. When ``processor`` is a TracerProvider's multi-processor, its
    processors are called directly, in its order; processors added to the provider later
    are picked up. A processor that raises is reported once and does not stop the others.
    """

    def __init__(
        self,
        processor: SpanProcessor,
        resource: Resource,
        scope: InstrumentationScope,
    ) -> None:
        self._processor = processor
        self._resource = resource
        self._scope = scope
        self._offset = epoch_offset_ns()
        self._targets_key: object = None
        self._targets: list[tuple[SpanProcessor, Any]] = []
        self._threads: dict[Any, tuple[int, str]] = {}
        self._failed: set[int] = set()

    def __call__(self, rec: StepRecord) -> None:
        step_span, components, intervals = self.build(rec)
        key = getattr(self._processor, "_span_processors", self._processor)
        if key is not self._targets_key:
            self._targets, self._targets_key = _dispatch_targets(self._processor), key
        for proc, bulk in self._targets:
            try:
                if bulk is not None:
                    bulk(step_span, components, intervals)
                else:
                    on_end = proc.on_end
                    for span in components:
                        on_end(span)
                    on_end(step_span)
            except Exception:
                if id(proc) not in self._failed:
                    self._failed.add(id(proc))
                    _logger.exception(
                        "otel-tunix: span processor %s raised (reported once)",
                        type(proc).__name__,
                    )

    def _thread(self, thread: Any) -> tuple[int, str]:
        """(native id, name) of a recorded thread, cached: the lookups cost per span."""
        found = self._threads.get(thread)
        if found is None:
            if len(self._threads) > 4096:  # threads come and go: keep the cache bounded
                self._threads.clear()
            found = self._threads[thread] = (thread.native_id or thread.ident or 0, thread.name)
        return found

    def build(
        self, rec: StepRecord
    ) -> tuple[ReadableSpan, list[ReadableSpan], list[tuple[str, bool, int, int]]]:
        """The step span, its component spans (in start order) and their ``(name, blocked,
        start, end)`` intervals (Unix epoch ns) of one step record."""
        off = self._offset
        trace_id = rec.trace_id
        resource, iscope = self._resource, self._scope
        step_ctx = rec.span_context()
        # A parent starts before its children, so in start order its context is made first.
        contexts: dict[int, SpanContext] = {rec.span_id: step_ctx}
        step_end = rec.end_ns
        number, scope = rec.number, rec.scope
        out: list[ReadableSpan] = []
        intervals: list[tuple[str, bool, int, int]] = []
        last_thread: Any = None
        tid, tname = 0, ""
        make, new_ctx = readable_span, new_span_context
        for s in sorted(rec.spans, key=_start_ns):
            ctx = s._ctx
            if ctx is None:
                ctx = s._ctx = new_ctx(trace_id, s.span_id)
            contexts[s.span_id] = ctx
            parent_ctx = contexts.get(s.parent_id)
            if parent_ctx is None:  # a foreign span (or a parent recorded after the fact)
                parent_ctx = new_ctx(trace_id, s.parent_id)
            if s.thread is not last_thread:
                last_thread = s.thread
                tid, tname = self._thread(last_thread)
            name, blocked, start, end = s.name, s.blocked, s.start_ns, s.end_ns
            attrs: dict[str, Any] = {
                _SPAN_TYPE: _COMPONENT,
                _STEP: number,
                _SCOPE: scope,
                _COMPONENT_NAME: name,
                _TIME_KIND: _BLOCKED if blocked else _BUSY,
                _THREAD_ID: tid,
                _THREAD_NAME: tname,
            }
            if end != s.host_end_ns:
                attrs[attr.DEVICE_END] = True
                attrs[attr.HOST_DURATION] = (s.host_end_ns - start) * 1e-9
            if s.incomplete:
                attrs[attr.INCOMPLETE] = True
            if s.attributes:
                attrs = {**s.attributes, **attrs}
            if s.error is not None:
                status, events = _error(s.error, s.host_end_ns + off)
            else:
                status, events = _UNSET, ()
            if end < start:
                end = start
            if end > step_end:
                step_end = end
            start += off
            end += off
            intervals.append((name, blocked, start, end))
            span = make(
                name, ctx, parent_ctx, resource, attrs, events, (), _INTERNAL, None,
                status, start, end, iscope,
            )  # fmt: skip
            out.append(span)
        status, events = _error(rec.error, rec.end_ns + off) if rec.error else (_UNSET, ())
        if rec.events:
            events += _step_events(rec, step_end, off)
        parent = new_span_context(trace_id, rec.parent_id) if rec.parent_id else None
        tid, tname = self._thread(rec.thread)
        step_attrs = {
            **rec.attributes,
            _SPAN_TYPE: attr.SPAN_TYPE_STEP,
            _STEP: number,
            _SCOPE: scope,
            _THREAD_ID: tid,
            _THREAD_NAME: tname,
        }
        step_span = make(
            f"{scope}_step", step_ctx, parent, resource, step_attrs, events, (), _INTERNAL,
            None, status, rec.start_ns + off, step_end + off, iscope,
        )  # fmt: skip
        return step_span, out, intervals


def _start_ns(s: SpanRecord) -> int:
    return s.start_ns


_INTERNAL = SpanKind.INTERNAL
readable_span = _readable_span_factory()
_SPAN_TYPE, _COMPONENT = attr.SPAN_TYPE, attr.SPAN_TYPE_COMPONENT
_STEP, _SCOPE, _COMPONENT_NAME, _TIME_KIND = attr.STEP, attr.SCOPE, attr.COMPONENT, attr.TIME_KIND
_BLOCKED, _BUSY = attr.KIND_BLOCKED, attr.KIND_BUSY
_THREAD_ID, _THREAD_NAME = attr.THREAD_ID, attr.THREAD_NAME
