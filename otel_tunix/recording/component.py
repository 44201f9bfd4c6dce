"""``component()``: one phase of a step, as the context manager (and decorator) it returns.

:class:`Component` records the phase into the step open in the calling context (or, while
no step is open, as an outside component: the root of an
:class:`~otel_tunix.recording.step_record.OutsideRecord`, a trace of its own); :class:`Unrecorded`
is the shared stand-in returned inside a step that is not sampled. Where the innermost open
component is kept, and how other threads' components find their step: the module docstring
of :mod:`otel_tunix.recording.hot_path`.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import itertools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry.trace import SpanContext, get_current_span

from otel_tunix.accounting import categories
from otel_tunix.recording import step_record as _step_record
from otel_tunix.recording.records import step_extras, timed_totals
from otel_tunix.recording.step_record import _NOT_SET, OutsideRecord, Runtime, StepRecord
from otel_tunix.support.errors import report_internal_error, warn_once
from otel_tunix.support.ids import refill_span_ids, take_span_id
from otel_tunix.support.shortcuts import (
    SPAN_KEY,
    attach_span,
    detach,
    new_span_context,
    otel_context,
    running_loop,
    threads_by_ident,
)

_current = _step_record._current
"""The context variable (:mod:`otel_tunix.recording.step_record`), assigned here rather than
imported by name: CPython 3.11 compiles ``name.method()`` on an imported name as an attribute load
and a call (a bound method made each time, ~30 ns a component), not as a method call."""

# Module globals of this module, read by the hot path below (no lookup through another
# module): set_runtime() and set_clock() of otel_tunix.recording.hot_path write them.
_runtime: Runtime | None = None
_clock = time.perf_counter_ns
_declared_now = categories.declared_now
_current_thread = threading.current_thread
_get_ident = threading.get_ident

_F = TypeVar("_F", bound=Callable[..., Any])


def component(
    name: str,
    blocked: bool = False,
    device_end: Any = None,
    *,
    start_ns: int | None = None,
    category: str | None = None,
) -> Component | Unrecorded:
    """One phase of a step: ``with otel_tunix.component("train_data_load"): ...``.

    Also a decorator, for plain and ``async`` functions: ``@otel_tunix.component("rollout")``.
    Components nest, and work in threads and asyncio tasks started inside the step (they read
    the step from ``contextvars``; a thread started without a copy of the context records
    into the most recently opened step). Inside a step that is not sampled, or when the name
    is filtered out by ``components=``, it records nothing.

    Opened while no step is open (before the first step, between steps, after the last
    one), it is an *outside component*, recorded whatever the sampling rate: the root span
    of a trace of its own, with the components nested in it as its children (a checkpoint
    restore before the loop, an evaluation between steps). One that another thread runs
    beside the loop's later steps also counts in them as background work.

    Made outside any step, the returned :class:`Component` can be kept and entered in every
    step. Made inside a step that is not sampled, it is an :class:`Unrecorded` stand-in
    shared by the components of that name (what keeps such a component near 0.2 us): it
    records nothing wherever it is entered later, so keep-and-reuse objects are made outside
    steps. Used as a decorator, either kind records each call that runs in a sampled step.

    Args:
        name: The component (and span) name, e.g. ``"train_step_compute"``.
        blocked: True for time spent waiting (a queue, a throttle, a mesh swap): it counts as
            ``blocked_time_sec`` instead of ``busy_time_sec``.
        device_end: Optional :data:`DeviceEnd` resolver; the span then ends at device
            completion instead of host exit. It can also be given inside the block with
            :meth:`Component.end_on_device` once the outputs exist.
        start_ns: When the component started (``time.perf_counter_ns()``), for integrations
            that learn of it after the fact; default: now.
        category: The goodput category of this component (one of
            :data:`otel_tunix.accounting.categories.COMPONENT_CATEGORIES`, e.g. ``"evaluation"``,
            ``"checkpoint_restore"``), recorded with it, and declared for its name
            (:func:`otel_tunix.accounting.categories.declare`: the default of later components of
            that name given none; in a step that is not sampled, only when the name's
            shared stand-in is made, which keeps such a component's cost); default: the
            one declared for its name now, else the one its name gives.

    Raises:
        ValueError: ``category`` is not a goodput category (the message names it and the
            allowed ones).
    """
    if _current.get() is None:  # inside a step that is not sampled
        u = _unrecorded.get(name)
        if u is None or u._blocked is not blocked or u._device_end is not device_end:
            if category is not None:  # (the stand-in of a name made once: checked then)
                categories.declare(name, category)
            u = _new_unrecorded(name, blocked, device_end)
        return u
    if category is not None:  # declared when given only: no cost per component otherwise
        categories.declare(name, category)
    else:  # captured now, and it travels with the record (no writer looks it up later)
        category = _declared_now(name)
    # What a constructor would do, without its Python frame: a class with no __init__ of
    # its own is made in C (the hot path; this function is the only place one is made).
    c = Component()
    c._name = name
    c._blocked = blocked
    # The given device end, and this use's (end_on_device replaces it; a use that ends on
    # the device puts the given one back for the next use).
    c._device_end = c._resolver = device_end
    c._start_ns = start_ns
    c._category = category
    c._sid = 0  # the span id while recorded, else 0
    # _step, _span_id (the span id, kept after exit: a task or thread that copied the
    # context may still parent spans to it), _token, _ctoken and _ctx are set by __enter__
    # when it records (and read only then): fewer assignments per component.
    return c


def _decorate(name: str, blocked: bool, device_end: Any, fn: _F) -> _F:
    """``fn`` wrapped so each call runs inside a fresh ``component(name, ...)``."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            with component(name, blocked, device_end):
                return await fn(*args, **kwargs)

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with component(name, blocked, device_end):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


class Component:
    """A component being (or to be) recorded: what :func:`component` returns outside a step
    that is not sampled (made only there). A context manager, reusable across steps, and a
    decorator.

    One object is one open span at a time: enter it again only after it exited. A kept
    object entered inside itself (``with c: with c:``) would mix up the two uses; nest
    ``component(name)`` calls instead (a decorated function that recurses does: each call
    makes its own).
    """

    __slots__ = (
        "_blocked",
        "_category",
        "_ctoken",
        "_ctx",
        "_device_end",
        "_name",
        "_outer",
        "_resolver",
        "_sid",
        "_span_id",
        "_start_ns",
        "_step",
        "_token",
    )

    _name: str
    _blocked: bool
    _category: str | None
    _device_end: Any
    _resolver: Any
    _start_ns: int | None
    _sid: int
    _span_id: int
    _step: StepRecord
    _token: Any
    _ctoken: contextvars.Token[Any] | None
    _outer: Component | None
    _ctx: SpanContext

    @property
    def recording(self) -> bool:
        """True when this component is being recorded."""
        return self._sid != 0

    def set_attribute(self, key: str, value: Any) -> None:
        """Add an attribute to the component's span (ignored when it is not recorded)."""
        attrs = self.span_attributes
        if attrs is not None:
            attrs[key] = value

    @property
    def span_attributes(self) -> dict[str, Any] | None:
        """The span's extra attributes while it is recorded (``None`` otherwise).

        A live dict: a device-end resolver may add to it later (e.g. the device duration),
        until the step is processed.
        """
        sid = self._sid
        if not sid:
            return None
        return step_extras(self._step).attributes.setdefault(sid, {})

    def end_on_device(self, resolver: Any) -> None:
        """End the span at device completion, as resolved later by ``resolver``.

        See :data:`DeviceEnd`. Does nothing when the component is not recorded.
        """
        if self._sid:
            self._resolver = resolver

    def span_context(self) -> SpanContext:
        """The OTel SpanContext of this component once recorded (built on first use; only
        spans that other code starts inside the component ask for it)."""
        ctx: SpanContext | None = getattr(self, "_ctx", None)
        if ctx is None or ctx.span_id != self._span_id:  # none yet, or from an earlier use
            ctx = self._ctx = new_span_context(self._step.trace_id, self._span_id)
        return ctx

    def __enter__(self) -> Component:
        cur = _current.get()
        if cur is None:  # a step that is not sampled
            return self
        try:
            if type(cur) is StepRecord:
                st = cur
                top = st.top
                outer_id = st.span_id if top is None else top._span_id
            elif cur is _NOT_SET:  # no step in this context: a thread that did not inherit it
                rt = _runtime
                if rt is None:
                    return self
                if not rt.open_steps:  # no step open: a component of its own
                    return self._enter_outside(rt)
                st = rt.open_steps[-1]
                outer_id = st.span_id
            else:  # the component open around this one (set in the context variable)
                st = cur._step
                outer_id = cur._span_id
            allowed = st.runtime.allowed
            name = self._name
            if allowed is not None and name not in allowed:
                return self
            ident = _get_ident()
            # On the step's thread and outside an event loop, components open and close in
            # nested order: the innermost is kept on the step (st.top, two attribute writes)
            # instead of in the context variable (a set and its reset: ~1.3k instructions
            # more). In an event loop tasks interleave: the variable. (cur is st: the
            # context holds the step itself, no component of its own.)
            fast = cur is st and ident == st.nest_ident and running_loop() is None
            if st.end_ns:  # a thread or task that outlived the step its context holds
                # (started inside it, still running), or a step exited elsewhere and left
                # in this context: the latest open step
                rt = _runtime
                if rt is None:
                    return self
                if not rt.open_steps:  # no step open: a component of its own
                    return self._enter_outside(rt)
                st = rt.open_steps[-1]
                outer_id = st.span_id
                fast = False
            span: Any = otel_context().get(SPAN_KEY)  # the current OTel span, read directly
            if span is st:  # the usual case: no foreign span in between
                parent = outer_id
                self._token = None
            else:  # a foreign span is current, or a thread that did not inherit the context
                cur_ctx = (span or get_current_span()).get_span_context()
                parent = cur_ctx.span_id if cur_ctx.trace_id == st.trace_id else st.span_id
                self._token = attach_span(st)
            try:
                sid = take_span_id()
            except IndexError:  # the pool is empty, once every 256 components
                sid = refill_span_ids()
            thread = None  # the step's thread
            if ident != st.ident:
                thread = threads_by_ident.get(ident) or _current_thread()
                st.foreign = True
            self._step = st
            if fast:
                self._ctoken = None
                self._outer = top
                st.top = self
            else:
                self._ctoken = _current.set(self)
            self._sid = self._span_id = sid
            start = self._start_ns or _clock()
            st.spans.append((name, self._blocked, sid, parent, start, thread, self._category))
        except Exception:
            self._sid = 0
            report_internal_error("component() (the component is not recorded)")
        return self

    def _enter_outside(self, rt: Runtime) -> Component:
        """Record a component opened while no step is open in the calling context nor
        (for a thread without one) anywhere, sampled or not: the root of an
        :class:`OutsideRecord`, a trace of its own, which goes to the pipeline when it
        exits; the components nested in it record into that record. Another thread's,
        after a first step, also counts in the steps of the loop's thread that it overlaps
        (``rt.loose``: background work)."""
        allowed = rt.allowed
        name = self._name
        if (allowed is not None and name not in allowed) or rt.step_open():
            return self  # filtered out, or beside a step that is not sampled: not recorded
        try:
            sid = take_span_id()
        except IndexError:
            sid = refill_span_ids()
        start = self._start_ns or _clock()
        rec = OutsideRecord(rt, sid, start)
        self._step = rec
        self._token = None  # the record's own (detached by _close_outside)
        rec.otel_token = attach_span(rec)
        self._ctoken = _current.set(self)
        self._sid = self._span_id = sid
        comp = (name, self._blocked, sid, rec.parent_id, start, None, self._category)
        rec.spans.append(comp)
        last = rt.last_step
        if last is not None and last.ident != rec.ident:  # beside the loop's steps
            rt.loose.append((comp, rec, last.ident))
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        sid = self._sid
        if not sid:
            return
        end_ns = _clock()
        self._sid = 0
        try:
            # The span is complete before the context is restored (which can fail: a block
            # left in another asyncio task or context than it was entered in).
            st = self._step
            if exc is not None:
                step_extras(st).errors[sid] = exc
                watch = st.runtime.error_watch
                if watch is not None:
                    watch(st, exc)
            resolver = self._resolver
            if resolver is not None:
                self._resolver = self._device_end  # for the next use of this object
                # Registered before the end below: the step is never seen complete with
                # this device end still unknown.
                step_extras(st).device[sid] = resolver
                st.ends[sid] = end_ns
                # To the device waiter now, not when the host step ends: the resolver reads
                # the clock when the device finishes, however long the host works after.
                st.runtime.pipeline.wait_for_device(st, [sid])
            else:
                st.ends[sid] = end_ns
            token = self._token
            if token is not None:
                detach(token)
            ctoken = self._ctoken
            if ctoken is None:
                st.top = self._outer
            elif sid == st.span_id:  # the root of an outside component: its record is done
                _close_outside(st, end_ns, ctoken)
            else:
                _current.reset(ctoken)
        except ValueError:  # reset() in another context than the one entered: the caller's
            warn_once(
                "component-context",
                "otel-tunix: closing a component failed: it was left in another context "
                "(thread or task) than it was entered in; its span ends all the same",
            )
        except Exception:
            report_internal_error("closing a component")

    def __call__(self, fn: _F) -> _F:
        """Use as a decorator: each call of ``fn`` runs inside a fresh component."""
        return _decorate(self._name, self._blocked, self._device_end, fn)


class Unrecorded:
    """What :func:`component` returns inside a step that is not sampled: records nothing.

    Its ``with`` costs two calls of C functions and no Python frame: ``__enter__`` and
    ``__exit__`` are C callables stored on the class (written by hand because no library
    object is a do-nothing context manager in C). ``__enter__`` returns the shared
    :data:`UNRECORDED` (whatever arguments it gets: ``with`` passes none,
    ``contextlib.ExitStack`` passes the manager); ``__exit__`` is ``"".format``, which
    accepts any arguments and returns ``""``: false, so an exception propagates unchanged.
    ``staticmethod`` keeps both unbound on every Python version.
    """

    __slots__ = ("_blocked", "_device_end", "_name")

    recording = False
    span_attributes = None

    def __init__(self, name: str, blocked: bool, device_end: Any) -> None:
        self._name = name
        self._blocked = blocked
        self._device_end = device_end

    if TYPE_CHECKING:  # the C callables set below the class, as type checkers see them

        def __enter__(self) -> Unrecorded: ...

        def __exit__(self, *exc_info: object) -> None: ...

    def set_attribute(self, key: str, value: Any) -> None:
        """Ignored: nothing is recorded."""

    def end_on_device(self, resolver: Any) -> None:
        """Ignored: nothing is recorded."""

    def __call__(self, fn: _F) -> _F:
        """Use as a decorator: each call of ``fn`` runs inside a fresh component (recorded
        when it runs in a sampled step)."""
        return _decorate(self._name, self._blocked, self._device_end, fn)


UNRECORDED = Unrecorded("", False, None)
"""What ``with`` an :class:`Unrecorded` binds with ``as``."""
Unrecorded.__enter__ = staticmethod(functools.partial(next, itertools.repeat(UNRECORDED)))  # type: ignore[method-assign]
Unrecorded.__exit__ = staticmethod("".format)  # type: ignore[method-assign,assignment]

_unrecorded: dict[str, Unrecorded] = {}
"""One :class:`Unrecorded` per component name (the latest arguments given with it)."""
_MAX_UNRECORDED = 4096


class Timed(Unrecorded):
    """The stand-in of a component whose goodput category is not ``productive`` (a
    checkpoint, an evaluation, a compilation, a data wait), inside a step that is not
    sampled: it records nothing but its time (two clock reads and an addition), which the
    next sampled step takes (:func:`otel_tunix.recording.records.take_unsampled`), so sampling does
    not blind the goodput ledger. Shared by the components of its name, like
    :class:`Unrecorded`: one use at a time (the same name nested, or used by two threads at
    once in steps not sampled, times the innermost / latest use)."""

    __slots__ = ("_category", "_t0", "_total")

    def __init__(self, name: str, blocked: bool, device_end: Any, category: str) -> None:
        super().__init__(name, blocked, device_end)
        self._category = category
        self._t0 = 0
        self._total = 0

    def __enter__(self) -> Unrecorded:
        self._t0 = _clock()
        return UNRECORDED

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:  # type: ignore[override]
        self._total += _clock() - self._t0

    def add(self, start_ns: int, end_ns: int) -> None:
        """Count ``[start_ns, end_ns]`` (``perf_counter_ns``), a use that already ran."""
        if end_ns > start_ns:
            self._total += end_ns - start_ns


def _new_unrecorded(name: str, blocked: bool, device_end: Any) -> Unrecorded:
    """The shared stand-in of ``name`` in steps not sampled: :class:`Timed` when its
    category (declared, else by name, resolved once here) is not ``productive``."""
    kind = categories.classify(name, blocked)
    if kind == categories.PRODUCTIVE:
        u = Unrecorded(name, blocked, device_end)
    else:
        u = Timed(name, blocked, device_end, kind)
        old = timed_totals.get(name)  # (made again with other arguments: its time carried)
        if old is not None:
            u._total = old._total
        if old is not None or len(timed_totals) < _MAX_UNRECORDED:
            timed_totals[name] = u
    if len(_unrecorded) < _MAX_UNRECORDED or name in _unrecorded:
        _unrecorded[name] = u
    return u


def record_component(
    name: str,
    start_ns: int,
    end_ns: int,
    *,
    blocked: bool = False,
    attributes: dict[str, Any] | None = None,
    category: str | None = None,
) -> None:
    """Record a component that already happened, over ``[start_ns, end_ns]``
    (``time.perf_counter_ns()``), in the step open in the calling context.

    For integrations that learn of a phase after the fact (a compile event, a callback pair).
    It nests under the component open in the calling context; with no step open it is an
    outside component (see :func:`component`); in a step that is not sampled, or when
    ``name`` is filtered out, it records nothing. ``category`` as for :func:`component`
    (a bad one raises ``ValueError``); nothing else raises.
    """
    c = component(name, blocked, start_ns=start_ns, category=category)
    if type(c) is not Component:  # a step that is not sampled
        if type(c) is Timed:
            c.add(start_ns, end_ns)
        return
    c.__enter__()
    sid = c._sid
    if not sid:
        return
    st = c._step
    if attributes:
        step_extras(st).attributes[sid] = dict(attributes)
    end = max(end_ns, start_ns)
    if sid == st.span_id:  # an outside component of its own: it ends at end_ns
        c._sid = 0
        st.ends[sid] = end
        try:
            _close_outside(st, end, c._ctoken)
        except Exception:
            report_internal_error("closing an outside component")
        return
    c.__exit__(None, None, None)
    st.ends[sid] = end


def _close_outside(rec: StepRecord, end_ns: int, ctoken: Any) -> None:
    """The root of an outside component ended (its end stored): its record goes to the
    pipeline, then the calling context is restored (which can fail: a block left in another
    context than it was entered in)."""
    rec.end_ns = end_ns
    rec.runtime.pipeline.submit(rec)
    token = getattr(rec, "otel_token", None)
    if token is not None:
        detach(token)
    _current.reset(ctoken)
