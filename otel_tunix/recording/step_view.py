"""What integrations may know about the step open in the calling context.

:func:`current_step` gives a :class:`StepView` of the sampled step open in the calling
context; :func:`add_step_event` adds a span event to it (or to the next sampled step when
none is open: the alert engine's hook).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_tunix.recording.hot_path import StepRecord, context_step, get_runtime, now_ns
from otel_tunix.recording.records import StepEvent, append_event
from otel_tunix.support.errors import report_internal_error

__all__ = ["StepView", "add_step_event", "current_step"]


class StepView:
    """What integrations may know about the sampled step open in the calling context.

    One view per step: ``current_step()`` returns the same object for the whole step, so it
    can be compared by identity ("is this still the step I saw?").
    """

    __slots__ = ("_rec",)

    def __init__(self, rec: StepRecord) -> None:
        self._rec = rec

    @property
    def scope(self) -> str:
        return self._rec.scope

    @property
    def number(self) -> int:
        return self._rec.number

    @property
    def attributes(self) -> dict[str, Any]:
        """The step span's extra attributes (a live dict: adding to it adds to the span)."""
        return self._rec.attributes

    def set_attribute(self, key: str, value: Any) -> None:
        """Add an attribute to the step span."""
        self._rec.attributes[key] = value

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        """Add an event (now) to the step span."""
        append_event(self._rec, (name, dict(attributes or {}), now_ns()))


def _append_event(rec: StepRecord, event: StepEvent) -> None:
    events = rec.events
    if events is None:
        events = rec.events = []
    events.append(event)


def add_step_event(name: str, attributes: Mapping[str, Any] | None = None) -> bool:
    """Add an event, stamped now, to a step span (alerts use it). Never raises.

    The event goes on the sampled step open in the calling context (or, in a thread that did
    not inherit the context, the most recently opened step). With no sampled step open (the
    caller runs between steps, in an unsampled step, or on otel-tunix's worker thread) it is
    queued and goes on the next sampled step that starts, placed at that step's start.

    Returns:
        True if a step open now got the event; False if it was queued (or otel-tunix is off).
    """
    rt = get_runtime()
    if rt is None:
        return False
    try:
        event: StepEvent = (name, dict(attributes or {}), now_ns())
        st = context_step(rt)
        if st is not None and not st.end_ns:
            append_event(st, event)
            return True
        rt.pending_events.append(event)
    except Exception:
        report_internal_error("add_step_event()")
    return False


def current_step() -> StepView | None:
    """The sampled step open in the calling context, or ``None`` (no step, or not sampled)."""
    st = context_step()
    if st is None:
        return None
    view = st.view
    if not isinstance(view, StepView):
        view = st.view = StepView(st)
    return view
