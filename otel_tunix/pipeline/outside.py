"""Components recorded outside any step, as the span builder hands them on.

A component opened while no step is open (a checkpoint restore before the loop, an eval
loop between steps, a writer after the last step) is recorded by the hot path as the root
of an :class:`~otel_tunix.recording.step_record.OutsideRecord`, with the components nested in it;
the record reaches the worker when the root exits. Each of its components becomes an
:class:`OutsideSpan`: the root span of a trace of its own and its children, with no step
or scope, handed to the run's consumers at once:

* every consumer (:class:`~otel_tunix.pipeline.step_sinks.StepSink`) gets them through
  ``on_outside_spans``: the spans JSONL writes a ``{"type": "span", "outside": true, ...}``
  line each, the live ledger counts their time by goodput category, the export processors
  queue them for every exporter (OTLP, Perfetto, yours);
* any other span processor of the tracer provider gets the SDK spans through ``on_end``
  (:class:`~otel_tunix.pipeline.step_sinks.ProviderSpans`).

They are not steps: no step summary, no ``perf/...`` scalar, no step metric counts them.
The nested components come first, in start order, then the root (as a step's components
come before the step span).
"""

from __future__ import annotations

from typing import Any, Protocol

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import SpanContext, Status

from otel_tunix.model import record as rs
from otel_tunix.model.steps import SpanInfo
from otel_tunix.pipeline.span_errors import span_error
from otel_tunix.recording.hot_path import StepRecord, now_ns
from otel_tunix.settings.attributes import DEVICE_END, HOST_DURATION, INCOMPLETE, OUTSIDE
from otel_tunix.support.shortcuts import new_span_context

__all__ = ["OutsideSpan", "outside_spans"]


class _Builder(Protocol):
    """What an :class:`OutsideSpan` needs of the span builder."""

    offset: int

    def thread(self, thread: Any) -> tuple[int, str]: ...

    def full_span(
        self,
        name: str,
        ctx: SpanContext,
        parent: SpanContext | None,
        attrs: dict[str, Any],
        events: tuple[Event, ...],
        status: Status,
        start: int,
        end: int,
    ) -> ReadableSpan: ...


class OutsideSpan:
    """One component recorded outside any step: the root of a trace of its own
    (``parent_id`` 0, or the application's span that was current when it started) or a
    component nested in one.

    Attributes:
        name: The component name.
        blocked: True for a blocked (waiting) component.
        start_ns: Its start, Unix epoch ns.
        end_ns: Its end (the device end if it had one), Unix epoch ns.
        trace_id: Its trace (the root's).
        span_id: Its span id.
        parent_id: Its parent's span id (0: none).
        root: True for the root of its record (the outside component itself).
        category: The goodput category it was recorded with, else ``None``
            (``otel_tunix.accounting.categories.classify(name, blocked, category)`` gives the one
            the ledger counts).
        thread_id: The native id of the thread that ran it.
        thread_name: That thread's name.
        attributes: Its attributes beyond the standard ones (its own, device end,
            incompleteness).
        error: The exception that escaped it, if any.
        scope: Always ``None`` (no step), as ``number``.
    """

    __slots__ = (
        "_builder",
        "_span",
        "attributes",
        "blocked",
        "category",
        "end_ns",
        "error",
        "name",
        "parent_id",
        "root",
        "span_id",
        "start_ns",
        "thread_id",
        "thread_name",
        "trace_id",
    )

    outside = True
    """Tells these from :class:`~otel_tunix.pipeline.background.BackgroundSpan`."""
    scope = None
    number = None

    def __init__(
        self,
        builder: _Builder,
        rec: StepRecord,
        comp: tuple[Any, ...],
        end: int,
        attributes: dict[str, object],
    ) -> None:
        name, blocked, sid, parent, start, thread, category = comp
        off = builder.offset
        self._builder = builder
        self._span: ReadableSpan | None = None
        self.name: str = name
        self.blocked: bool = blocked
        self.start_ns: int = start + off
        self.end_ns: int = max(end, start) + off
        self.trace_id: int = rec.trace_id
        self.span_id: int = sid
        self.parent_id: int = parent
        self.root = sid == rec.span_id
        self.category: str | None = category
        self.thread_id, self.thread_name = builder.thread(thread or rec.thread)
        self.attributes = attributes
        ex = rec.extras
        self.error: BaseException | None = ex.errors.get(sid) if ex is not None else None

    @property
    def kind(self) -> str:
        """``busy`` or ``blocked``."""
        return rs.kind_of(self.blocked)

    def span(self) -> ReadableSpan:
        """The SDK span (built on first use and kept)."""
        span = self._span
        if span is None:
            attributes = {
                **self.attributes,
                **rs.component_attributes(
                    self.name, self.blocked, self.thread_id, self.thread_name, self.category
                ),
            }
            trace, parent = self.trace_id, self.parent_id
            status, events = span_error(self.error, self.end_ns)
            span = self._span = self._builder.full_span(
                self.name,
                new_span_context(trace, self.span_id),
                new_span_context(trace, parent) if parent else None,
                attributes,
                events,
                status,
                self.start_ns,
                self.end_ns,
            )
        return span

    def info(self) -> SpanInfo:
        """As a :class:`~otel_tunix.model.steps.SpanInfo` (what the spans JSONL writes)."""
        return SpanInfo.from_json(self.to_json())

    def to_json(self) -> dict[str, object]:
        """Its line of the spans JSONL file: ``type: "span"``, ``outside: true``, no scope
        or step, then the fields of a step line's ``spans`` entries (its attributes always:
        ``tunix.outside`` among them)."""
        entry = rs.component_json(
            self.name,
            self.blocked,
            self.start_ns,
            self.end_ns,
            self.thread_name,
            self.thread_id,
            self.span_id,
            self.parent_id,
            self.error,
            self.attributes,
            self.category,
        )
        return rs.span_line(entry, None, None, self.trace_id)


def outside_spans(builder: _Builder, rec: StepRecord) -> list[OutsideSpan]:
    """The spans of an outside record: its nested components in start order, then its root.

    A component still open when the record is processed (one of another thread that the
    root did not wait for) ends now, marked ``tunix.incomplete``; a device end still
    resolving is not waited for (the host end, marked so).
    """
    ex = rec.extras
    ends = rec.ends
    now = 0
    nested: list[OutsideSpan] = []
    root: OutsideSpan | None = None
    for comp in sorted(list(rec.spans), key=_start):
        sid, start = comp[2], comp[4]
        mine = ex.attributes.get(sid) if ex is not None else None
        attrs: dict[str, object] = {**mine, OUTSIDE: True} if mine else {OUTSIDE: True}
        end = ends.get(sid)
        if end is None:  # another thread's, still running
            now = now or now_ns()
            end = now
            attrs[INCOMPLETE] = True
        elif ex is not None:
            device_end = ex.device_ends.get(sid)
            if device_end is not None and device_end != end:
                attrs[DEVICE_END] = True
                attrs[HOST_DURATION] = (end - start) * 1e-9
                end = device_end
            if sid in ex.incomplete:
                attrs[INCOMPLETE] = True
        span = OutsideSpan(builder, rec, comp, end, attrs)
        if span.root:
            root = span
        else:
            nested.append(span)
    if root is not None:
        nested.append(root)
    return nested


def _start(comp: tuple[Any, ...]) -> int:
    start: int = comp[4]
    return start
