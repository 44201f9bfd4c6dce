"""The trace model of the Perfetto exporter: plain records of finished spans.

:class:`TraceSpan` (with its :class:`SpanEventRecord` events and its :class:`ProcessInfo`) is
what :class:`~otel_tunix.exporters.perfetto.writer.PerfettoTraceWriter` translates; it is built
from an OTel span or from a spans JSONL line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from otel_tunix.settings.attributes import (
    RANK,
    RUN_ID,
    SCOPE,
    SPAN_TYPE,
    STEP,
    THREAD_ID,
    THREAD_NAME,
    TIME_KIND,
)

__all__ = ["ProcessInfo", "SpanEventRecord", "TraceSpan"]


# --- plain records -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """The process a span came from: its process track in the trace.

    Attributes:
        service_name: ``service.name`` of the Resource.
        host_name: ``host.name`` of the Resource.
        rank: ``tunix.rank`` of the Resource, if any.
        pid: ``process.pid`` (or the exporting process's pid); ``None`` makes one up from the
            other fields.
        run_id: ``tunix.run.id`` of the Resource, if any (shown as a process label).
    """

    service_name: str = ""
    host_name: str = ""
    rank: int | None = None
    pid: int | None = None
    run_id: str = ""

    @classmethod
    def from_resource(
        cls,
        resource: Resource | None,
        *,
        default_pid: int | None = None,
        default_host: str = "",
    ) -> ProcessInfo:
        """Read the process fields of an OTel Resource.

        Args:
            resource: The span's Resource (``None`` gives the defaults).
            default_pid: Used when the Resource has no ``process.pid``.
            default_host: Used when the Resource has no ``host.name``.

        Returns:
            The process description.
        """
        attrs: Mapping[str, object] = resource.attributes if resource is not None else {}
        return cls(
            service_name=str(attrs.get("service.name", "") or ""),
            host_name=str(attrs.get("host.name", "") or default_host),
            rank=_as_int(attrs.get(RANK)),
            pid=_as_int(attrs.get("process.pid"), default_pid),
            run_id=str(attrs.get(RUN_ID, "") or ""),
        )

    @property
    def label(self) -> str:
        """Name of the process track, e.g. ``trainer (node-3, rank 2)``."""
        details = [d for d in (self.host_name, _rank_text(self.rank)) if d]
        name = self.service_name or "otel-tunix"
        return f"{name} ({', '.join(details)})" if details else name


@dataclass(frozen=True, slots=True)
class SpanEventRecord:
    """One span event (an instant in the trace)."""

    name: str
    timestamp_ns: int
    attributes: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TraceSpan:
    """One finished span in the form the Perfetto translation needs.

    Built from an OTel span by :meth:`from_readable_span` or from a spans JSONL line by
    :func:`convert_jsonl_to_perfetto`.

    Attributes:
        name: Span name (slice name).
        start_ns: Start, Unix epoch nanoseconds.
        end_ns: End, Unix epoch nanoseconds.
        trace_id: 32-hex-digit trace id ("" if unknown).
        span_id: 16-hex-digit span id ("" if unknown).
        parent_id: Span id of the local parent; ``None`` for a local root.
        span_type: ``step``, ``component`` or ``None`` for a foreign span.
        scope: ``tunix.scope``, if any.
        step: ``tunix.step``, if any.
        time_kind: ``busy`` or ``blocked`` for components.
        thread_id: ``thread.id``, if known.
        thread_name: ``thread.name``, if known.
        attributes: All span attributes (written as slice arguments).
        events: Span events (written as instants).
        process: The process the span came from.
        error: Status description of a failed span, else ``None``.
    """

    name: str
    start_ns: int
    end_ns: int
    trace_id: str = ""
    span_id: str = ""
    parent_id: str | None = None
    span_type: str | None = None
    scope: str | None = None
    step: int | None = None
    time_kind: str | None = None
    thread_id: int | None = None
    thread_name: str | None = None
    attributes: Mapping[str, object] = field(default_factory=dict)
    events: tuple[SpanEventRecord, ...] = ()
    process: ProcessInfo = field(default_factory=ProcessInfo)
    error: str | None = None

    @classmethod
    def from_readable_span(
        cls, span: ReadableSpan, process: ProcessInfo | None = None
    ) -> TraceSpan:
        """Translate a finished OTel span.

        Args:
            span: The finished span.
            process: Its process; read from ``span.resource`` when ``None``.

        Returns:
            The record.
        """
        attrs = dict(span.attributes or {})
        ctx = span.context
        parent = span.parent
        start = span.start_time or 0
        status = span.status
        error = None
        if status.status_code is StatusCode.ERROR:
            error = status.description or "error"
        if span.kind is not SpanKind.INTERNAL:
            attrs.setdefault("span.kind", span.kind.name.lower())
        span_type = attrs.get(SPAN_TYPE)
        return cls(
            name=span.name,
            start_ns=start,
            end_ns=span.end_time if span.end_time is not None else start,
            trace_id=f"{ctx.trace_id:032x}" if ctx is not None else "",
            span_id=f"{ctx.span_id:016x}" if ctx is not None else "",
            parent_id=None if parent is None or parent.is_remote else f"{parent.span_id:016x}",
            span_type=span_type if isinstance(span_type, str) else None,
            scope=_as_str(attrs.get(SCOPE)),
            step=_as_int(attrs.get(STEP)),
            time_kind=_as_str(attrs.get(TIME_KIND)),
            thread_id=_as_int(attrs.get(THREAD_ID)),
            thread_name=_as_str(attrs.get(THREAD_NAME)),
            attributes=attrs,
            events=tuple(
                SpanEventRecord(e.name, e.timestamp, dict(e.attributes or {})) for e in span.events
            ),
            process=process if process is not None else ProcessInfo.from_resource(span.resource),
            error=error,
        )


# --- small helpers -----------------------------------------------------------------------


def _as_int(value: object, default: int | None = None) -> int | None:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return default
    return default


def _as_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _rank_text(rank: int | None) -> str:
    return f"rank {rank}" if rank is not None else ""
