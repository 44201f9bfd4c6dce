"""The hot path: ``step()`` and ``component()``.

Inside the training loop otel-tunix only reads the clock, draws a span id and appends a tuple
(:data:`ComponentStart`) to the step. Real OTel spans are built from those records later,
off the training thread (``worker.py``, ``span_builder.py``), for the processors and exporters
that want them.

OTel context propagation costs about 1.5 us per attach (a SpanContext, a span object, a new
Context, the context-var set), too much per component. So a sampled step attaches, once, a
*proxy span* whose ``get_span_context()`` answers with the innermost otel-tunix component open
in the calling context, or the step itself. Spans that any other code starts inside a
component (an HTTP client, a user's ``tracer.start_as_current_span``) therefore become that
component's children in the export, without an OTel attach per component. Only when a foreign
span sits between the step and a component (or in a thread that did not inherit the context)
does the component attach the proxy itself.

Where the innermost open component is kept:

* On the step's own thread, outside an event loop (the training loop), components open and
  close in nested order, so the innermost is an attribute of the step (``StepRecord.top``).
  Setting and resetting a context variable instead cost ~1.3k instructions more a component.
* Everywhere else, in our context variable ``_current``: in asyncio tasks and callbacks
  (which interleave on one thread), and in other threads. There, a component whose context
  holds the step itself (a thread or task given a copy of the context, an event loop run
  inside a component) takes the step thread's innermost open component as its parent: the
  one it was started from, when that component waits for its work (a pool, ``gather``,
  ``run_until_complete``).
* While trio is loaded, only the context variable (its tasks interleave on one thread with
  no asyncio loop to tell them apart).

Work on other threads: a thread whose context holds no open step (or a step that has ended)
records into the latest open step. A step that has ended answers no parent as the current
OTel span, so a thread started inside it that outlives it starts traces of its own.

Outside any step (no step open in the calling context, nor anywhere for a thread without
one): a component is the root of an :class:`OutsideRecord`, a trace of its own, recorded
whatever the sampling rate; the components nested in it record into that record (their
innermost open one in the context variable), which goes to the pipeline when the root
exits. Another thread's, started after a first step, is also put in ``Runtime.loose``: the
worker counts its time in the loop's later steps that it overlaps
(``pipeline/background.py``).

The parts, one module each (this one keeps the helpers that read the calling context and
installs the runtime and the clock in the others, which keep them as module globals of their
own, so the hot path reads no other module's attribute):

* ``_step_record.py``: :class:`StepRecord`, :class:`Runtime` and the context variable;
* ``_step.py``: :class:`step`;
* ``_component.py``: :func:`component`, :class:`Component`, :class:`Unrecorded`,
  :func:`record_component`.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from typing import Any

from otel_tunix.recording import component as _component
from otel_tunix.recording import step as _step
from otel_tunix.recording import step_record as _step_record
from otel_tunix.recording.component import (
    UNRECORDED,
    Component,
    Unrecorded,
    component,
    record_component,
)
from otel_tunix.recording.step import precede_next_step, step
from otel_tunix.recording.step_record import (
    _NOT_SET,
    CONTEXT_OUTSIDE_STEPS,
    MAX_LOOSE,
    OutsideRecord,
    Runtime,
    StepRecord,
    step_context_var,
)

__all__ = [
    "CONTEXT_OUTSIDE_STEPS",
    "MAX_LOOSE",
    "UNRECORDED",
    "Component",
    "OutsideRecord",
    "Runtime",
    "StepRecord",
    "Unrecorded",
    "before_a_step",
    "carried_context",
    "component",
    "context_step",
    "get_runtime",
    "in_step",
    "may_record",
    "now_ns",
    "precede_next_step",
    "record_component",
    "set_clock",
    "set_runtime",
    "step",
    "step_context_var",
]

_current = _step_record._current
"""The context variable (:mod:`otel_tunix.recording.step_record`), assigned here rather than
imported by name: CPython 3.11 compiles ``name.method()`` on an imported name as an attribute load
and a call (a bound method made each time, ~30 ns), not as a method call."""

_runtime: Runtime | None = None
_clock = time.perf_counter_ns


def _step_of(cur: Any) -> StepRecord | None:
    """The sampled step of a value of ``_current`` (``None`` outside one, an outside
    component's context included)."""
    if type(cur) is StepRecord:
        return cur
    if isinstance(cur, Component):
        st = cur._step
        return st if type(st) is StepRecord else None
    return None


def context_step(rt: Runtime | None = None) -> StepRecord | None:
    """The sampled step open in the calling context; with ``rt``, in a thread that did not
    inherit the context, the most recently opened step of ``rt``."""
    cur = _current.get()
    if cur is _NOT_SET and rt is not None and rt.open_steps:
        return rt.open_steps[-1]
    st = _step_of(cur)
    if st is not None and st.end_ns:  # ended, left in this context (exited elsewhere)
        return rt.open_steps[-1] if rt is not None and rt.open_steps else None
    return st


def carried_context() -> contextvars.Context | None:
    """A copy of the calling context when a sampled step is open in it, else ``None``.

    Run a thread or pool task started inside the step in it (``ctx.run(fn)``) and its
    components record into that step, under the component that started it. Outside a step,
    or in one that is not sampled, there is nothing to carry (a long-lived thread started
    there must not keep that decision for later steps).
    """
    cur = _current.get()
    if cur is _NOT_SET or cur is None:
        return None
    return contextvars.copy_context()


def set_runtime(runtime: Runtime | None) -> None:
    """Install the runtime of a ``configure()`` (``None``: otel-tunix is off, silently)."""
    global _runtime
    # Each module that reads the runtime on the hot path keeps it as a global of its own.
    _runtime = _step._runtime = _component._runtime = runtime
    _step._quiet = True


def get_runtime() -> Runtime | None:
    return _runtime


def set_clock(clock: Callable[[], int] | None) -> None:
    """Read step and component times from ``clock`` (ns) instead of
    ``time.perf_counter_ns`` (``None``: back to it). ``configure(clock=...)`` calls it."""
    global _clock
    # Each module that reads the clock on the hot path keeps it as a global of its own.
    _clock = _step._clock = _component._clock = clock if clock is not None else time.perf_counter_ns


def now_ns() -> int:
    """The hot path's clock now."""
    return _clock()


def may_record() -> bool:
    """False when a component opened now in the calling context would record nothing (in a
    step that is not sampled), or would be an outside component of its own (outside any step
    and any outside component, with no sampled step open anywhere): a cheap check (~60 ns)
    for integrations that wrap frequent calls (a batch fetch, a forward pass, a collective),
    whose calls outside the steps are recorded only inside a component that is."""
    cur = _current.get()
    if cur is None:
        return False
    if cur is _NOT_SET:
        rt = _runtime
        return rt is not None and bool(rt.open_steps)
    return True


def before_a_step() -> bool:
    """True when otel-tunix is configured and nothing of it is open in the calling context
    (no step, no component): work done now precedes the next step opened here, which
    takes it over when handed to :func:`precede_next_step`."""
    return _runtime is not None and _current.get() is _NOT_SET


def in_step() -> bool:
    """True when a step (sampled or not) is open in the calling context (in a thread that
    outlived the step its context holds: when any sampled step is open, as its components
    then record into the latest one)."""
    cur = _current.get()
    if cur is _NOT_SET:
        return False
    if cur is None:  # a step that is not sampled
        return True
    st = _step_of(cur)
    if st is None:  # inside an outside component: no step
        return False
    if st.end_ns:
        rt = _runtime
        return rt is not None and bool(rt.open_steps)
    return True
