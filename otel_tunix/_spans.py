"""Build real OTel spans from a finished step record and feed them to the span processors.

Runs on the pipeline's worker thread. Spans are SDK ``ReadableSpan`` objects with the ids that
were handed out on the hot path (so foreign spans parented to them line up), the run's
shared ``Resource`` and otel-tunix's instrumentation scope. Component spans are fed first,
in start order, then the step span: processors and exporters can rely on that order.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from otel_tunix import attributes as attr
from otel_tunix._tracer import SpanRecord, StepRecord

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


class SpanBuilder:
    """Callable given to the pipeline: step record in, spans out to ``processor.on_end``."""

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

    def __call__(self, rec: StepRecord) -> None:
        off = self._offset
        trace_id = rec.trace_id
        step_ctx = rec.span_context()
        # Parents are mostly the step or another component of the step: reuse their contexts.
        contexts: dict[int, SpanContext] = {rec.span_id: step_ctx}
        spans = sorted(rec.spans, key=lambda s: s.start_ns)
        for s in spans:
            contexts[s.span_id] = s.span_context()
        step_end = max([rec.end_ns, *(s.end_ns for s in spans)])
        on_end = self._processor.on_end
        for s in spans:
            parent_ctx = contexts.get(s.parent_id)
            if parent_ctx is None:  # a foreign span
                parent_ctx = SpanContext(trace_id, s.parent_id, False, _SAMPLED)
            on_end(self._component_span(s, rec, parent_ctx, off))
        status, events = _error(rec.error, rec.end_ns + off)
        events += _step_events(rec, step_end, off)
        parent = SpanContext(trace_id, rec.parent_id, False, _SAMPLED) if rec.parent_id else None
        step_span = ReadableSpan(
            name=f"{rec.scope}_step",
            context=step_ctx,
            parent=parent,
            resource=self._resource,
            attributes={
                **rec.attributes,
                attr.SPAN_TYPE: attr.SPAN_TYPE_STEP,
                attr.STEP: rec.number,
                attr.SCOPE: rec.scope,
                attr.THREAD_ID: rec.thread.native_id or rec.thread.ident or 0,
                attr.THREAD_NAME: rec.thread.name,
            },
            events=events,
            kind=SpanKind.INTERNAL,
            status=status,
            start_time=rec.start_ns + off,
            end_time=step_end + off,
            instrumentation_scope=self._scope,
        )
        self._processor.on_end(step_span)

    def _component_span(
        self, s: SpanRecord, rec: StepRecord, parent: SpanContext, off: int
    ) -> ReadableSpan:
        attrs: dict[str, Any] = {
            attr.SPAN_TYPE: attr.SPAN_TYPE_COMPONENT,
            attr.STEP: rec.number,
            attr.SCOPE: rec.scope,
            attr.COMPONENT: s.name,
            attr.TIME_KIND: attr.KIND_BLOCKED if s.blocked else attr.KIND_BUSY,
            attr.THREAD_ID: s.thread.native_id or s.thread.ident or 0,
            attr.THREAD_NAME: s.thread.name,
        }
        if s.end_ns != s.host_end_ns:
            attrs[attr.DEVICE_END] = True
            attrs[attr.HOST_DURATION] = (s.host_end_ns - s.start_ns) * 1e-9
        if s.incomplete:
            attrs[attr.INCOMPLETE] = True
        if s.attributes:
            attrs = {**s.attributes, **attrs}
        status, events = _error(s.error, s.host_end_ns + off) if s.error else (_UNSET, ())
        return ReadableSpan(
            name=s.name,
            context=s.span_context(),
            parent=parent,
            resource=self._resource,
            attributes=attrs,
            events=events,
            kind=SpanKind.INTERNAL,
            status=status,
            start_time=s.start_ns + off,
            end_time=max(s.end_ns, s.start_ns) + off,
            instrumentation_scope=self._scope,
        )
