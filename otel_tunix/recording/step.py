"""``step()``: one training iteration, as the context manager that opens and closes it.

It counts every step of its scope, decides sampling, makes the sampled step's
:class:`~otel_tunix.recording.step_record.StepRecord` the calling context's step and current OTel
span, closes a step of the same scope left open (abandoned), and hands the ended step to the
pipeline. How components then find it: the module docstring of :mod:`otel_tunix.recording.hot_path`.
"""

from __future__ import annotations

import contextvars
import operator
import threading
import time
from typing import Any

from otel_tunix.recording import step_record as _step_record
from otel_tunix.recording.component import record_component
from otel_tunix.recording.records import (
    ScopeStepCounts,
    StepEvent,
    abandon,
    take_unsampled,
    timed_totals,
)
from otel_tunix.recording.step_record import _NOT_SET, Runtime, StepRecord
from otel_tunix.support.errors import report_internal_error, warn_once
from otel_tunix.support.shortcuts import SPAN_KEY, attach_span, detach, otel_context

_current = _step_record._current
"""The context variable (:mod:`otel_tunix.recording.step_record`), assigned here rather than
imported by name: CPython 3.11 compiles ``name.method()`` on an imported name as an attribute load
and a call (a bound method made each time, ~30 ns a component), not as a method call."""

# Module globals of this module, read by the hot path below (no lookup through another
# module): set_runtime() and set_clock() of otel_tunix.recording.hot_path write them.
_runtime: Runtime | None = None
_quiet = False  # True once configure() ran: a missing runtime is then deliberate (disabled)
_clock = time.perf_counter_ns
_get_ident = threading.get_ident


class _Prelude(threading.local):
    """The last piece of work done on this thread while no step was open that the next step
    opened here takes over (:func:`precede_next_step`)."""

    item: tuple[Runtime, str, bool, int, int] | None = None


_prelude = _Prelude()


def precede_next_step(name: str, blocked: bool, start_ns: int, end_ns: int) -> None:
    """Hand a component that ran on this thread while no step was open (``[start_ns,
    end_ns]`` on the hot path's clock) to the next step opened on this thread: that step
    starts at ``start_ns`` and records it as its first component.

    The usual loop, ``for batch in instrument_dataloader(loader): with step(n): ...``,
    fetches each batch before its step opens; the fetch belongs to that step. Only the last
    one handed over is kept; a step given its own ``start_ns`` drops it.
    """
    rt = _runtime
    if rt is not None:
        _prelude.item = (rt, name, blocked, start_ns, end_ns)


class step:
    """One training iteration: ``with otel_tunix.step(n, scope="train") as s: ...``.

    Opens the step span ``<scope>_step`` when step ``n`` is sampled (``n % sampling_rate ==
    0``); every component inside follows that decision. Counts every step of the scope, so
    the session's ``steps_per_sec`` includes the steps that were not sampled. Never raises;
    an exception from the body propagates unchanged and marks the step span as an error.

    Args:
        n: The step number: an ``int``, or an integer of numpy, JAX or torch (kept as its
            value); anything else is counted as the scope's next step, with one warning.
        scope: ``"train"``, ``"eval"``, ``"rl/actor"``, ``"rl/learner"`` or any string; a
            value that is not a string is taken as its string (``5``: ``"5"``), with one
            warning.
        start_ns: When the step started (``time.perf_counter_ns()``), for integrations that
            open the step after the fact; default: now.
    """

    __slots__ = (
        "_n",
        "_otel_token",
        "_record",
        "_scope",
        "_start_ns",
        "_stats",
        "_token",
    )

    def __init__(self, n: int, scope: str = "train", *, start_ns: int | None = None) -> None:
        self._n = n
        self._scope = scope if type(scope) is str else _scope_text(n, scope)
        self._start_ns = start_ns
        self._record: StepRecord | None = None
        self._stats: ScopeStepCounts | None = None
        self._token: contextvars.Token[Any] | None = None
        self._otel_token: object = None

    @property
    def sampled(self) -> bool:
        """True when this step is recorded."""
        return self._record is not None

    def set_attribute(self, key: str, value: Any) -> None:
        """Add an attribute to the step span (ignored when the step is not sampled)."""
        if self._record is not None:
            self._record.attributes[key] = value

    def __enter__(self) -> step:
        rt = _runtime
        if rt is None:
            if not _quiet:
                warn_once(
                    "not-configured",
                    "otel_tunix.step() was called before otel_tunix.configure(); "
                    "nothing is recorded until configure() runs",
                )
            return self
        try:
            outer = _current.get()
            if outer is not _NOT_SET:
                _warn_nested(outer, self._scope, self._n)
            stats = rt.scopes.get(self._scope)
            if stats is None:
                stats = rt.scopes.setdefault(self._scope, ScopeStepCounts())
            count = stats.count
            stats.count = count + 1
            self._stats = stats
            n = self._n
            if type(n) is not int:  # numpy / JAX / torch integers keep their value
                try:
                    if isinstance(n, bool):
                        raise TypeError(n)
                    n = self._n = operator.index(n)
                except Exception:
                    warn_once(
                        "step-n",
                        "otel_tunix.step() wants an integer step number, got a %s (counted "
                        "as the scope's next step)",
                        type(n).__name__,
                    )
                    n = self._n = count
            start = self._start_ns
            pre = _prelude.item
            if pre is not None:  # the next step here takes it, or drops it
                _prelude.item = None
                if start is not None or pre[0] is not rt:
                    pre = None
            if start is None:
                start = _clock()
                if pre is not None and pre[3] <= start:
                    start = pre[3]  # the fetch that preceded it is the step's
                self._start_ns = start
            held = _current.get()  # a step cannot hold the next one of its own scope
            if type(held) is not StepRecord and held is not _NOT_SET and held is not None:
                held = held._step
            if type(held) is StepRecord and not held.end_ns and held.scope == self._scope:
                abandon(held, start)
            if not count:
                stats.first_start_ns = start
            if n % rt.sampling_rate:  # not sampled
                self._token = _current.set(None)
                stats.last_start_ns = start  # open till it ends (Runtime.step_open)
                rt.unsampled_scope = self._scope
                if rt.step_watch is not None:  # a profile capture pending or running
                    _watch_start(rt, self._scope, n, None)
                return self
            rec = StepRecord(rt, self._scope, n, start)
            if timed_totals:  # the badput time of the steps not sampled before this one
                rec.unsampled = take_unsampled()
            if rt.pending_events:  # events raised while no sampled step was open
                rec.events = _take_pending(rt)
            self._record = rec
            self._token = _current.set(rec)
            self._otel_token = attach_span(rec)
            rt.open_steps.append(rec)
            rt.last_step = rec
            if pre is not None:
                _, name, blocked, pre_start, pre_end = pre
                record_component(name, pre_start, pre_end, blocked=blocked)
            if rt.step_watch is not None:  # a profile capture pending or running
                _watch_start(rt, self._scope, n, rec)
        except Exception:  # never hurt the training loop
            self._record = None
            report_internal_error("step() (the step is not recorded)")
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        rt = _runtime
        watch = rt.step_watch if rt is not None else None
        if watch is not None and self._stats is not None:
            try:  # a profile capture running: its work at the step's end is in the step
                watch.step_ended(self._scope, self._n, self._record)
            except Exception:
                report_internal_error("a step watch at the step's end")
        end = _clock()
        try:
            stats = self._stats
            if stats is not None:
                start = self._start_ns
                _add_active_time(stats, end if start is None else start, end)
            rec = self._record
            if rec is not None and rec.end_ns:  # abandoned: closed when the next step began
                self._record = None  # its context is restored only where it is still on top
                if self._token is not None and _current.get() is rec:
                    _current.reset(self._token)
                if self._otel_token is not None and otel_context().get(SPAN_KEY) is rec:
                    detach(self._otel_token)
                self._otel_token = self._token = None
                return
            try:
                if self._otel_token is not None:
                    detach(self._otel_token)
                if self._token is not None:
                    _current.reset(self._token)
            except ValueError:  # exited in another context (thread, task) than entered:
                warn_once(  # the step ends all the same; its own context still holds it,
                    "step-context",  # and the next step there starts a trace of its own
                    "otel-tunix: a step was exited in another context (thread or task) "
                    "than it was entered in; its span ends all the same",
                )
            self._otel_token = self._token = None
            if rec is not None:
                rt = rec.runtime
                if exc is not None and rt.error_watch is not None:
                    rt.error_watch(rec, exc)  # the step still open: its attributes count
                rec.end_ns = end
                rec.error = exc
                try:
                    rt.open_steps.remove(rec)
                except ValueError:
                    pass
                rt.pipeline.submit(rec)
                self._record = None
        except Exception:
            report_internal_error("closing a step")


def _watch_start(rt: Runtime, scope: str, n: int, rec: StepRecord | None) -> None:
    """Tell the step watch that a step started; what it raises is its own failure (the
    step is recorded all the same)."""
    watch = rt.step_watch
    if watch is None:
        return
    try:
        watch.step_started(scope, n, rec)
    except Exception:
        report_internal_error("a step watch at the step's start")


def _scope_text(n: object, scope: object) -> str:
    """A scope that is not a string, taken as its string (a subclass of ``str`` as its
    plain text), with one warning per type."""
    if isinstance(scope, str):
        return str.__str__(scope)
    try:
        text = str(scope)
    except Exception:  # a __str__ of the caller's that raises
        text = type(scope).__name__
    if type(text) is not str:  # pragma: no cover - str() answers a str
        text = type(scope).__name__
    try:
        shown = repr(scope)
    except Exception:  # a __repr__ of the caller's that raises
        shown = f"<{type(scope).__name__}>"
    warn_once(
        ("step-scope", type(scope).__name__),
        "otel_tunix.step(%s, scope=%s): the scope is not a string; taken as %r (said once a type)",
        n if type(n) is int else type(n).__name__,
        shown,
        text,
    )
    return text


def _warn_nested(outer: Any, scope: str, n: object) -> None:
    """Say once that a step was opened directly inside a sampled step on the same thread
    (see "Steps do not nest" in docs/accounting.md for what is recorded). One opened inside
    a component of the outer step is that phase's own loop (the Trainer integration's eval
    steps inside ``evaluate``), and one in a thread or task that carried the step's context
    belongs to that thread's loop: neither is said."""
    if type(outer) is not StepRecord or outer.ident != _get_ident() or outer.top is not None:
        return  # (a component open on the step's own thread is kept in ``top``)
    warn_once(
        "nested-step",
        "otel_tunix.step(%s, scope=%r) was opened inside step %s of scope %r: steps do not "
        "nest. The inner step is recorded as a step of its own, its span a child in the "
        "outer step's trace, and its time is idle time of the outer step. Use component() "
        "for a phase of a step, open the inner loop's steps inside a component of the outer "
        "step, or close the outer step first",
        n,
        scope,
        outer.number,
        outer.scope,
    )


def _add_active_time(stats: ScopeStepCounts, start: int, end: int) -> None:
    """Count a step's time, and the gap since the scope's previous step when that step was
    the last to end on this thread (no other scope's step ran in between)."""
    rt = _runtime
    ident = _get_ident()
    prev = stats.last_end_ns
    last = rt.last_scope if rt is not None else None
    if last is not None and last.get(ident) is stats and 0 < prev <= start:
        stats.active_ns += end - prev
    elif end > start:
        stats.active_ns += end - start
    stats.last_end_ns = end
    if last is not None:
        last[ident] = stats


def _take_pending(rt: Runtime) -> list[StepEvent]:
    out: list[StepEvent] = []
    pending = rt.pending_events
    while pending:
        try:
            out.append(pending.popleft())
        except IndexError:  # emptied by another thread
            break
    return out
