"""The step and component record: its fields, its span attributes, its JSON line, and
reading that line back. The one owner of the record's format.

A component is recorded on the hot path as a plain tuple (:data:`ComponentStart`, fields
by the ``I_*`` indices), its goodput category captured then (``component(name,
category=...)``, else the category declared for its name at that moment): every writer
reads the category from the tuple, none looks it up again by name. From the tuple:

* the span attributes of an SDK span or of the OTLP fast path's bytes
  (:func:`component_attributes`, :func:`set_component_times`, :func:`step_attributes`);
* the ``spans`` entry of a step line, or a ``type: "span"`` line, of the spans JSONL
  (:func:`component_json`, :func:`span_line`; a step line is
  :meth:`otel_tunix.model.steps.StepSummary.to_json`, with the keys defined here);
* back from a line: :meth:`SpanInfo.from_json`, :func:`read_step_line`, and the number
  readers (:func:`as_int64`, :func:`as_float`) that never raise.

Which steps need the SDK's span objects (an error, events, a link, a job step span) is
decided here too (:func:`needs_full_step_span`, :func:`has_job_step`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from otel_tunix.settings import attributes as attr
from otel_tunix.support.text import clean_value

__all__ = [
    "ComponentStart",
    "SpanInfo",
    "StepLine",
    "as_float",
    "as_int64",
    "component_attributes",
    "component_json",
    "exception_message",
    "exception_text",
    "has_job_step",
    "kind_of",
    "needs_full_step_span",
    "read_step_line",
    "set_component_times",
    "span_line",
    "step_attributes",
]

# --- the component as recorded ----------------------------------------------------------

ComponentStart = tuple[str, bool, int, int, int, "threading.Thread | None", "str | None"]
"""A component as recorded when it starts: ``(name, blocked, span_id, parent_id, start_ns,
thread, category)`` (perf_counter ns; ``thread`` is ``None`` for the step's own thread;
``category`` the goodput category it was recorded with, ``None``: none given or declared).

A plain tuple, not an object: a tuple of atoms is dropped from the garbage collector's
lists at its first collection, and a loop that records spans fast keeps thousands of them
queued. Per-component objects were walked by every collection until processed, about a
third of the cost of a span in such a loop."""

I_NAME: Final = 0
I_BLOCKED: Final = 1
I_SPAN_ID: Final = 2
I_PARENT: Final = 3
I_START: Final = 4
I_THREAD: Final = 5
I_CATEGORY: Final = 6
"""Indices of :data:`ComponentStart`'s fields."""

# --- the JSON line's keys ---------------------------------------------------------------

TYPE: Final = "type"
"""Every line's kind: :data:`TYPE_RUN`, :data:`TYPE_STEP`, :data:`TYPE_SPAN`,
:data:`TYPE_SESSION`."""
TYPE_RUN: Final = "run"
TYPE_STEP: Final = "step"
TYPE_SPAN: Final = "span"
TYPE_SESSION: Final = "session"

SCOPE: Final = "scope"
STEP: Final = "step"
START_NS: Final = "start_ns"
END_NS: Final = "end_ns"
TRACE_ID: Final = "trace_id"
SPAN_ID: Final = "span_id"
PARENT: Final = "parent"
NAME: Final = "name"
KIND: Final = "kind"
THREAD: Final = "thread"
THREAD_ID: Final = "thread_id"
ERROR: Final = "error"
ATTRIBUTES: Final = "attributes"
CATEGORY: Final = "category"
OUTSIDE: Final = "outside"
SPANS: Final = "spans"
COMPONENTS: Final = "components"
STEP_TIME: Final = "step_time_sec"
BUSY_TIME: Final = "busy_time_sec"
BLOCKED_TIME: Final = "blocked_time_sec"
IDLE_TIME: Final = "idle_time_sec"
BACKGROUND_TIME: Final = "background_time_sec"
BACKGROUND_TIMES: Final = "background_times"
COUNT: Final = "count"
DEVICE_END_NS: Final = "device_end_ns"
DEVICE_LAG: Final = "device_lag_sec"
DEVICE_TIMES: Final = "device_times"
DEVICE_BLOCKED_TIME: Final = "device_blocked_time_sec"
LINKS: Final = "links"
"""Step lines: the links the step's code added (``trace_id``, ``span_id``, ``attributes``)."""
UNSAMPLED: Final = "unsampled_sec"
"""Per goodput category, the seconds a scope's steps that were not sampled spent in
badput components since its previous sampled step (step and session lines)."""

_NS = 1e-9
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


def kind_of(blocked: bool) -> str:
    """``busy`` or ``blocked``: a component's ``kind`` (and ``tunix.time_kind``)."""
    return attr.KIND_BLOCKED if blocked else attr.KIND_BUSY


def exception_message(exc: BaseException) -> str:
    """``str(exc)``, never raising: an exception whose ``__str__`` raises (or returns no
    text) is ``"<unprintable Type object>"``, as ``traceback`` writes it."""
    try:
        message = str(exc)
    except Exception:
        return f"<unprintable {type(exc).__qualname__} object>"
    return message if type(message) is str else f"<unprintable {type(exc).__qualname__} object>"


def exception_text(exc: BaseException) -> str:
    """``"Type: message"`` of an exception (an error status' description, the ``error`` of
    a JSONL entry), cleaned as a text value; never raises (:func:`exception_message`)."""
    return clean_value(f"{type(exc).__qualname__}: {exception_message(exc)}")


# --- the span attributes ----------------------------------------------------------------


def component_attributes(
    name: str,
    blocked: bool,
    thread_id: int,
    thread_name: str,
    category: str | None,
    scope: str | None = None,
    number: int | None = None,
) -> dict[str, Any]:
    """A component span's standard attributes, in the order every writer puts them (the
    SDK span and the OTLP fast path's bytes): type, step and scope (none outside a step),
    name, kind, thread, the goodput category it was recorded with."""
    out: dict[str, Any] = {attr.SPAN_TYPE: attr.SPAN_TYPE_COMPONENT}
    if scope is not None:
        out[attr.STEP] = number
        out[attr.SCOPE] = scope
    out[attr.COMPONENT] = name
    out[attr.TIME_KIND] = attr.KIND_BLOCKED if blocked else attr.KIND_BUSY
    out[attr.THREAD_ID] = thread_id
    out[attr.THREAD_NAME] = thread_name
    if category is not None:
        out[attr.GOODPUT_CATEGORY] = category
    return out


def set_component_times(attrs: dict[str, Any], times: tuple[float, float, int] | None) -> None:
    """A component's accounted busy / blocked seconds (and count, if several) in its step,
    after its standard attributes."""
    attrs.pop(attr.COMPONENT_COUNT, None)
    if times is None:
        return
    busy, blocked, count = times
    attrs[attr.COMPONENT_BUSY_TIME] = busy
    attrs[attr.COMPONENT_BLOCKED_TIME] = blocked
    if count > 1:
        attrs[attr.COMPONENT_COUNT] = count


class _Accounted(Protocol):
    step_time_sec: float
    busy_time_sec: float
    blocked_time_sec: float
    idle_time_sec: float
    background_time_sec: float
    background_times: Mapping[str, float] | None


def step_attributes(
    base: Mapping[str, Any], scope: str, number: int, summary: _Accounted
) -> dict[str, Any]:
    """A step span's attributes: ``base`` (the application's, the thread's), then type,
    number, scope and the step's accounting (what Perfetto's counters read back)."""
    out = {
        **base,
        attr.SPAN_TYPE: attr.SPAN_TYPE_STEP,
        attr.STEP: number,
        attr.SCOPE: scope,
        attr.STEP_DURATION: summary.step_time_sec,
        attr.STEP_BUSY_TIME: summary.busy_time_sec,
        attr.STEP_BLOCKED_TIME: summary.blocked_time_sec,
        attr.STEP_IDLE_TIME: summary.idle_time_sec,
    }
    if summary.background_times:
        out[attr.STEP_BACKGROUND_TIME] = summary.background_time_sec
    return out


class _Record(Protocol):
    """What the decisions below read of a step record."""

    error: BaseException | None
    events: list[Any] | None
    link: Any
    links: list[Any] | None
    parent_id: int

    @property
    def runtime(self) -> Any: ...


def needs_full_step_span(rec: _Record) -> bool:
    """Whether a step's span needs more than the plain span maker (an error, events, a
    link, links the step's code added): the SDK span builder then makes it in full, and the
    OTLP fast path hands the whole step to the SDK encoder."""
    return rec.error is not None or bool(rec.events) or rec.link is not None or bool(rec.links)


def has_job_step(rec: _Record) -> bool:
    """Whether the step's parent is the job's step span (rank 0 of a job: one more span,
    ``<scope>_job_step``, goes out with the step)."""
    rt = rec.runtime
    return bool(rt.job_root and rec.parent_id and rt.job_ids is not None)


# --- the JSON line ----------------------------------------------------------------------


def component_json(
    name: str,
    blocked: bool,
    start_ns: int,
    end_ns: int,
    thread_name: str,
    thread_id: int,
    span_id: int,
    parent_id: int | None,
    error: BaseException | str | None = None,
    attributes: Mapping[str, object] | None = None,
    category: str | None = None,
) -> dict[str, object]:
    """A component's entry in the spans JSONL (a step line's ``spans`` entry; the body of a
    ``type: "span"`` line): times in Unix epoch ns, ids as 16 hex digits (``parent``
    ``None`` for a root)."""
    out: dict[str, object] = {
        NAME: name,
        KIND: attr.KIND_BLOCKED if blocked else attr.KIND_BUSY,
        START_NS: start_ns,
        END_NS: end_ns,
        THREAD: thread_name,
        THREAD_ID: thread_id,
        SPAN_ID: f"{span_id:016x}",
        PARENT: f"{parent_id:016x}" if parent_id else None,
    }
    if error is not None:
        out[ERROR] = error if isinstance(error, str) else exception_text(error)
    if attributes:
        out[ATTRIBUTES] = dict(attributes)
    if category is not None:
        out[CATEGORY] = category
    return out


def span_line(
    entry: dict[str, object], scope: str | None, number: int | None, trace_id: int
) -> dict[str, object]:
    """A ``type: "span"`` line: a component handed on apart from its step's line (its step's
    scope and number), or, with ``scope`` ``None``, one recorded outside any step
    (``outside: true``, no scope or step); then the fields of :func:`component_json`."""
    head: dict[str, object] = {TYPE: TYPE_SPAN}
    if scope is None:
        head[OUTSIDE] = True
    head[SCOPE] = scope
    head[STEP] = number
    head[TRACE_ID] = f"{trace_id:032x}"
    return {**head, **entry}


# --- reading it back --------------------------------------------------------------------


def as_int64(value: object, default: int = 0) -> int:
    """A whole number read from a line: an int or a finite float, clamped to int64 (what a
    step number past it was written as is kept readable, never an ``OverflowError``);
    ``default`` for anything else."""
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        n = value
    elif isinstance(value, float) and math.isfinite(value):
        n = int(value)
    else:
        return default
    return _INT64_MIN if n < _INT64_MIN else _INT64_MAX if n > _INT64_MAX else n


def as_float(value: object, default: float = 0.0) -> float:
    """A number read from a line (``default`` for anything else; never raises)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return default
    return default


def _as_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(slots=True)
class SpanInfo:
    """One component span of a step, in the form the local files and user functions see.

    Times are Unix epoch nanoseconds. ``span_id`` and ``parent`` are 16-hex-digit span ids;
    ``parent`` is the step span's id for top-level components. ``category`` is the goodput
    category the component was recorded with (``component(name, category=...)``, else the
    one declared for its name then), if any.
    """

    name: str
    kind: str
    start_ns: int
    end_ns: int
    thread: str = ""
    thread_id: int = 0
    span_id: str = ""
    parent: str | None = None
    error: str | None = None
    attributes: Mapping[str, object] = field(default_factory=dict)
    category: str | None = None

    @property
    def duration_sec(self) -> float:
        """Length of the span in seconds."""
        return (self.end_ns - self.start_ns) * _NS

    @property
    def blocked(self) -> bool:
        """True for a blocked (waiting) component."""
        return self.kind == attr.KIND_BLOCKED

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (the ``spans`` entries of the spans JSONL file)."""
        out: dict[str, object] = {
            NAME: self.name,
            KIND: self.kind,
            START_NS: self.start_ns,
            END_NS: self.end_ns,
            THREAD: self.thread,
            THREAD_ID: self.thread_id,
            SPAN_ID: self.span_id,
            PARENT: self.parent,
        }
        if self.error is not None:
            out[ERROR] = self.error
        if self.attributes:
            out[ATTRIBUTES] = dict(self.attributes)
        if self.category is not None:
            out[CATEGORY] = self.category
        return out

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> SpanInfo:
        """Read back a ``spans`` entry or a ``type: "span"`` line (any field missing or of
        the wrong type gets its default; never raises)."""
        kind = entry.get(KIND)
        attrs = entry.get(ATTRIBUTES)
        category = entry.get(CATEGORY)
        return cls(
            name=str(entry.get(NAME) or ""),
            kind=kind if kind in (attr.KIND_BUSY, attr.KIND_BLOCKED) else attr.KIND_BUSY,
            start_ns=as_int64(entry.get(START_NS)),
            end_ns=as_int64(entry.get(END_NS)),
            thread=str(entry.get(THREAD) or ""),
            thread_id=as_int64(entry.get(THREAD_ID)),
            span_id=str(entry.get(SPAN_ID) or ""),
            parent=_as_str(entry.get(PARENT)),
            error=_as_str(entry.get(ERROR)),
            attributes=dict(attrs) if isinstance(attrs, Mapping) else {},
            category=category if isinstance(category, str) else None,
        )


@dataclass(slots=True)
class StepLine:
    """A ``type: "step"`` line read back: the step, its stored accounting and its spans."""

    scope: str
    step: int
    start_ns: int
    end_ns: int
    trace_id: str
    span_id: str
    step_time_sec: float
    busy_time_sec: float
    blocked_time_sec: float
    idle_time_sec: float
    background_time_sec: float
    attributes: dict[str, object]
    error: str | None
    spans: list[SpanInfo]


def read_step_line(obj: Mapping[str, Any]) -> StepLine:
    """A step line (``type: "step"``) read back through the schema; never raises."""
    attrs = obj.get(ATTRIBUTES)
    spans = obj.get(SPANS)
    return StepLine(
        scope=str(obj.get(SCOPE) or "default"),
        step=as_int64(obj.get(STEP)),
        start_ns=as_int64(obj.get(START_NS)),
        end_ns=as_int64(obj.get(END_NS)),
        trace_id=str(obj.get(TRACE_ID) or ""),
        span_id=str(obj.get(SPAN_ID) or ""),
        step_time_sec=as_float(obj.get(STEP_TIME)),
        busy_time_sec=as_float(obj.get(BUSY_TIME)),
        blocked_time_sec=as_float(obj.get(BLOCKED_TIME)),
        idle_time_sec=as_float(obj.get(IDLE_TIME)),
        background_time_sec=as_float(obj.get(BACKGROUND_TIME)),
        attributes=dict(attrs) if isinstance(attrs, Mapping) else {},
        error=_as_str(obj.get(ERROR)),
        spans=[
            SpanInfo.from_json(s)
            for s in (spans if isinstance(spans, list) else ())
            if isinstance(s, Mapping)
        ],
    )
