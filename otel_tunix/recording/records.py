"""What the hot path records: the plain data of a step in progress.

:mod:`otel_tunix.recording.hot_path` fills these in on the training thread (and in the threads and
tasks that record into a step); the pipeline reads them when the step is processed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from otel_tunix.model.record import ComponentStart
from otel_tunix.settings import attributes as attr

__all__ = [
    "MAX_PENDING_EVENTS",
    "AbandonedStep",
    "ComponentExtras",
    "ComponentStart",
    "DeviceEnd",
    "ScopeStepCounts",
    "StepEvent",
    "TimedTotal",
    "abandon",
    "append_event",
    "step_extras",
    "take_unsampled",
    "timed_totals",
]

DeviceEnd = Callable[[], int | None]
"""Resolves a component's device completion time, as ``time.perf_counter_ns()``.

Called once on otel-tunix's device-waiter thread, never on the training thread; it may block
(``jax.block_until_ready``, ``torch.cuda.Event.synchronize``). Returning ``None`` keeps the
host exit time. An object with a ``result()`` method (a ``concurrent.futures.Future``) works
too."""


StepEvent = tuple[str, dict[str, Any], int]
"""A span event recorded for a step: (name, attributes, ``time.perf_counter_ns()``)."""

MAX_PENDING_EVENTS = 256
"""Events waiting for the next sampled step (raised while none was open); the oldest are
dropped past this bound."""


class ScopeStepCounts:
    """Counts every step of a scope, sampled or not (read by the session summary).

    ``active_ns`` is the time the scope's own steps cover, with the gaps between two of its
    consecutive steps on one thread when no step of another scope ran on that thread in
    between: a scope that runs now and then (eval between training steps) gets its
    throughput from its own time, not from the span of the whole run."""

    __slots__ = ("active_ns", "count", "first_start_ns", "last_end_ns", "last_start_ns")

    def __init__(self) -> None:
        self.count = 0
        self.first_start_ns = 0
        self.last_start_ns = 0
        """The start of the scope's latest step that is not sampled."""
        self.last_end_ns = 0
        self.active_ns = 0


class ComponentExtras:
    """What few components have, per span id (one per step, made when first needed)."""

    __slots__ = ("attributes", "background", "device", "device_ends", "errors", "incomplete")

    def __init__(self) -> None:
        self.attributes: dict[int, dict[str, Any]] = {}
        self.errors: dict[int, BaseException] = {}
        self.device: dict[int, Any] = {}
        """Device-end resolvers not yet resolved."""
        self.device_ends: dict[int, int] = {}
        """Resolved device ends (perf_counter ns)."""
        self.incomplete: set[int] = set()
        """Components still open (or resolving) when the step was processed anyway."""
        self.background: frozenset[int] | set[int] = frozenset()
        """Components of other threads that ran past an edge of the step (background work:
        set by the worker)."""


_extras_lock = threading.Lock()


class TimedTotal(Protocol):
    """What the goodput ledger reads of a timed stand-in (``otel_tunix.recording.component.Timed``):
    its category and the time (ns) its uses in steps not sampled added up since the last
    :func:`take_unsampled`."""

    _category: str
    _total: int


timed_totals: dict[str, TimedTotal] = {}
"""The timed stand-in of each component name of a badput category (bounded)."""


def take_unsampled() -> dict[str, float] | None:
    """The time (seconds) per goodput category the timed stand-ins added up since the last
    call (``None``: none), reset to 0: the badput time of the steps not sampled since then."""
    out: dict[str, float] | None = None
    for t in list(timed_totals.values()):
        total = t._total
        if total:
            t._total = 0
            if out is None:
                out = {}
            out[t._category] = out.get(t._category, 0.0) + total * 1e-9
    return out


def step_extras(rec: _WithExtras) -> ComponentExtras:
    """The step's :class:`ComponentExtras`, made on first use (from any thread)."""
    ex = rec.extras
    if ex is None:
        with _extras_lock:
            ex = rec.extras
            if ex is None:
                ex = rec.extras = ComponentExtras()
    return ex


class _WithExtras(Protocol):
    extras: ComponentExtras | None
    events: list[StepEvent] | None


def append_event(rec: _WithExtras, event: StepEvent) -> None:
    """Add a span event to a step record."""
    events = rec.events
    if events is None:
        events = rec.events = []
    events.append(event)


class AbandonedStep(Exception):
    """The error of a step that was left open: its span's status says so."""


def abandon(rec: Any, end_ns: int) -> None:
    """Close the sampled step ``rec`` (a ``StepRecord``) that was left open in the calling
    context while the next step of its scope began there: a generator that opened it was
    abandoned or is suspended, or it was exited in another context. It ends now, marked
    (``tunix.step.abandoned``, an error status), its open components closed and marked
    incomplete, and goes to the worker as any step; its own exit, if it ever comes, then
    does nothing. Without this every later step nested under it (one trace for the run)."""
    rt = rec.runtime
    rec.end_ns = end_ns
    rec.attributes[attr.STEP_ABANDONED] = True
    rec.error = AbandonedStep(
        f"step {rec.number} of scope {rec.scope!r} was left open (a generator abandoned or "
        "suspended inside it, or exited elsewhere); closed when the next step began"
    )
    ends = rec.ends
    for c in list(rec.spans):
        if c[2] not in ends:
            ends[c[2]] = max(end_ns, c[4])
            step_extras(rec).incomplete.add(c[2])
    try:
        rt.open_steps.remove(rec)
    except ValueError:
        pass
    rt.pipeline.submit(rec)
