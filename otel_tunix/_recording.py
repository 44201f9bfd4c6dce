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
records into the latest open step; between steps, into ``Runtime.loose``, apart from any
step (the worker counts such background work in the steps it overlaps:
``pipeline/background.py``). A step that has ended answers no parent as the current OTel
span, so a thread started inside it that outlives it starts traces of its own.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import inspect
import itertools
import operator
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    NonRecordingSpan,
    SpanContext,
    get_current_span,
)

from otel_tunix._errors import report_internal_error, warn_once
from otel_tunix._ids import JobStepIds, random_bits, refill_span_ids, take_span_id
from otel_tunix._records import (
    MAX_PENDING_EVENTS,
    ComponentExtras,
    ComponentStart,
    ScopeStepCounts,
    StepEvent,
    abandon,
    step_extras,
)
from otel_tunix._shortcuts import (
    HAS_SPAN_KEY,
    SPAN_KEY,
    attach_span,
    detach,
    new_span_context,
    otel_context,
    running_loop,
    threads_by_ident,
)

if TYPE_CHECKING:
    from otel_tunix.pipeline.worker import Pipeline

_clock = time.perf_counter_ns
_current_thread = threading.current_thread
_get_ident = threading.get_ident

_F = TypeVar("_F", bound=Callable[..., Any])


class StepRecord(NonRecordingSpan):
    """A sampled step as recorded on the hot path.

    It is also the current OTel span while the step runs (the *proxy span* of the module
    docstring): its ``get_span_context()`` answers with the innermost otel-tunix component
    open in the calling context, else with the step itself. One object per step instead of
    two (``NonRecordingSpan`` has empty ``__slots__``, so this one keeps its own).
    """

    __slots__ = (
        "_ctx",
        "attributes",
        "end_ns",
        "ends",
        "error",
        "events",
        "extras",
        "foreign",
        "ident",
        "link",
        "nest_ident",
        "number",
        "parent_id",
        "runtime",
        "scope",
        "span_id",
        "spans",
        "start_ns",
        "submitted_at",
        "thread",
        "top",
        "trace_id",
        "view",
    )

    def __init__(self, runtime: Runtime, scope: str, number: int, start_ns: int) -> None:
        # NonRecordingSpan.__init__ is not called: the span context is answered below.
        self.runtime = runtime
        self.scope = scope
        self.number = number
        self.start_ns = start_ns
        self.end_ns = 0
        self.spans: list[ComponentStart] = []
        self.ends: dict[int, int] = {}
        """Host end (perf_counter ns) per component span id, set as each one exits."""
        self.extras: ComponentExtras | None = None
        self.attributes: dict[str, Any] = {}
        self.error: BaseException | None = None
        self.events: list[StepEvent] | None = None
        self.submitted_at = 0.0
        self.foreign = False
        """True once a component of another thread was recorded into the step."""
        ident = self.ident = _get_ident()
        # The thread whose components outside an event loop nest in time (see Component):
        # none while trio is loaded (its tasks interleave on one thread with no asyncio loop).
        self.nest_ident = 0 if "trio" in sys.modules else ident
        self.thread = threads_by_ident.get(ident) or _current_thread()
        self.view: object = None
        """The step's :class:`~otel_tunix._step_view.StepView`, made on first request."""
        self.top: Component | None = None
        """The innermost component open on the step's thread outside an event loop: such
        components are kept here instead of in the context variable (see
        Component.__enter__)."""
        current: Any = otel_context().get(SPAN_KEY)
        if current is None and not HAS_SPAN_KEY:  # no direct read: the public API
            current = get_current_span()
        self.link: SpanContext | None = None
        """Where a step that starts its own trace was started from: the ended step whose
        copy of the context its thread holds (a thread started inside that step, or a step
        left open here and closed since)."""
        if type(current) is StepRecord and current.end_ns:  # not a parent: a trace of its own
            self.link = current.span_context()
            current = None
        parent = current.get_span_context() if current is not None else None
        if parent is not None and parent.is_valid:
            # Join the application's trace: the step becomes a child of its current span.
            self.trace_id = parent.trace_id
            self.parent_id = parent.span_id
        elif runtime.job_ids is not None:  # one trace per step across the job's ranks
            self.trace_id, self.parent_id = runtime.job_ids.ids(scope, number)
        else:
            self.trace_id = random_bits(128) or 1
            self.parent_id = 0
        try:
            self.span_id = take_span_id()
        except IndexError:  # the pool is empty
            self.span_id = refill_span_ids()
        self._ctx: SpanContext | None = None

    def span_context(self) -> SpanContext:
        """The OTel SpanContext of the step span (built on first use)."""
        ctx = self._ctx
        if ctx is None:
            ctx = self._ctx = new_span_context(self.trace_id, self.span_id)
        return ctx

    def get_span_context(self) -> SpanContext:
        """As the current OTel span: the innermost open component's context (the calling
        context's, else the step thread's), else the step's: what a span started by other
        code inside the step gets as its parent. Once the step has ended (asked from a
        thread or task that outlived it, holding a copy of its context): no parent, so
        what that thread starts later (its own steps, other code's spans) starts a trace of
        its own instead of stretching this step's."""
        if self.end_ns:
            return INVALID_SPAN_CONTEXT
        cur = _current.get()
        if isinstance(cur, Component) and cur._step.trace_id == self.trace_id:
            return cur.span_context()
        top = self.top
        if top is not None:
            return top.span_context()
        return self.span_context()

    def __repr__(self) -> str:
        return f"StepRecord({self.scope!r}, {self.number}, {self.get_span_context()!r})"


MAX_LOOSE = 4096
"""Loose components waiting for the worker (it takes them when it processes a step or the
run flushes); past this bound the oldest are dropped (a thread that records components
forever after the last step)."""


class Runtime:
    """What the hot path needs from one ``configure()``: sampling, filter, the pipeline."""

    __slots__ = (
        "allowed",
        "job_ids",
        "job_root",
        "last_scope",
        "last_step",
        "loose",
        "open_steps",
        "pending_events",
        "pipeline",
        "sampling_rate",
        "scopes",
    )

    def __init__(
        self,
        sampling_rate: int,
        components: tuple[str, ...] | None,
        pipeline: Pipeline,
        *,
        job_ids: JobStepIds | None = None,
        job_root: bool = False,
    ) -> None:
        self.sampling_rate = sampling_rate
        self.job_ids = job_ids
        """With several ranks: step n of a scope is one trace on every rank (see
        :class:`~otel_tunix._ids.JobStepIds`), each rank's step span under its root."""
        self.job_root = job_root
        """This rank exports the roots of those traces (rank 0)."""
        self.allowed = frozenset(components) if components is not None else None
        self.pipeline = pipeline
        self.scopes: dict[str, ScopeStepCounts] = {}
        self.last_scope: dict[int, ScopeStepCounts] = {}
        """Per thread, the scope of the step that ended last on it."""
        self.open_steps: list[StepRecord] = []
        self.last_step: StepRecord | None = None
        """The sampled step opened last (kept after it ends)."""
        self.loose: collections.deque[tuple[ComponentStart, StepRecord]] = collections.deque(
            maxlen=MAX_LOOSE
        )
        """Components that other threads started while no sampled step was open, each
        with the step opened last before them (``Component._enter_loose``): the worker counts them
        in the later steps of that step's thread that they overlap."""
        self.pending_events: collections.deque[StepEvent] = collections.deque(
            maxlen=MAX_PENDING_EVENTS
        )


_runtime: Runtime | None = None
_quiet = False  # True once configure() ran: a missing runtime is then deliberate (disabled)
_NOT_SET: Any = object()
_current: contextvars.ContextVar[Any] = contextvars.ContextVar("otel_tunix", default=_NOT_SET)
"""Where the calling context stands: ``_NOT_SET`` outside any step, ``None`` in a step that
is not sampled, the :class:`StepRecord` of a sampled step (with no component open, or with
those open kept in ``StepRecord.top``: see the module docstring), else the innermost open
:class:`component` (whose ``_step`` is the step). One variable, so a component reads and
sets at most one."""


step_context_var = _current
"""For code that must tell, as cheaply as can be, whether the calling context is in a
sampled step (a patched ``ThreadPoolExecutor.submit``): it is not when the variable holds
:data:`CONTEXT_OUTSIDE_STEPS` (no step) or ``None`` (a step that is not sampled)."""
CONTEXT_OUTSIDE_STEPS = _NOT_SET


def _step_of(cur: Any) -> StepRecord | None:
    """The sampled step of a value of ``_current`` (``None`` outside one)."""
    if type(cur) is StepRecord:
        return cur
    return cur._step if isinstance(cur, Component) else None


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
    global _runtime, _quiet
    _runtime = runtime
    _quiet = True


def get_runtime() -> Runtime | None:
    return _runtime


def set_clock(clock: Callable[[], int] | None) -> None:
    """Read step and component times from ``clock`` (ns) instead of
    ``time.perf_counter_ns`` (``None``: back to it). ``configure(clock=...)`` calls it."""
    global _clock
    _clock = clock if clock is not None else time.perf_counter_ns


def now_ns() -> int:
    """The hot path's clock now."""
    return _clock()


class step:
    """One training iteration: ``with otel_tunix.step(n, scope="train") as s: ...``.

    Opens the step span ``<scope>_step`` when step ``n`` is sampled (``n % sampling_rate ==
    0``); every component inside follows that decision. Counts every step of the scope, so
    the session's ``steps_per_sec`` includes the steps that were not sampled. Never raises;
    an exception from the body propagates unchanged and marks the step span as an error.

    Args:
        n: The step number: an ``int``, or an integer of numpy, JAX or torch (kept as its
            value); anything else is counted as the scope's next step, with one warning.
        scope: ``"train"``, ``"eval"``, ``"rl/actor"``, ``"rl/learner"`` or any string.
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
        self._scope = scope
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
            if start is None:
                start = self._start_ns = _clock()
            held = _current.get()  # a step cannot hold the next one of its own scope
            if type(held) is not StepRecord and held is not _NOT_SET and held is not None:
                held = held._step
            if type(held) is StepRecord and not held.end_ns and held.scope == self._scope:
                abandon(held, start)
            if not count:
                stats.first_start_ns = start
            if n % rt.sampling_rate:  # not sampled
                self._token = _current.set(None)
                return self
            rec = StepRecord(rt, self._scope, n, start)
            if rt.pending_events:  # events raised while no sampled step was open
                rec.events = _take_pending(rt)
            self._record = rec
            self._token = _current.set(rec)
            self._otel_token = attach_span(rec)
            rt.open_steps.append(rec)
            rt.last_step = rec
        except Exception:  # never hurt the training loop
            self._record = None
            report_internal_error("step() (the step is not recorded)")
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
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
                rec.end_ns = end
                rec.error = exc
                rt = rec.runtime
                try:
                    rt.open_steps.remove(rec)
                except ValueError:
                    pass
                rt.pipeline.submit(rec)
                self._record = None
        except Exception:
            report_internal_error("closing a step")


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


def component(
    name: str,
    blocked: bool = False,
    device_end: Any = None,
    *,
    start_ns: int | None = None,
) -> Component | Unrecorded:
    """One phase of a step: ``with otel_tunix.component("train_data_load"): ...``.

    Also a decorator, for plain and ``async`` functions: ``@otel_tunix.component("rollout")``.
    Components nest, and work in threads and asyncio tasks started inside the step (they read
    the step from ``contextvars``; a thread started without a copy of the context records
    into the most recently opened step, and between steps as background work counted in the
    steps it overlaps). Outside a sampled step, or when the name is filtered out by
    ``components=``, it records nothing.

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
    """
    if _current.get() is None:  # inside a step that is not sampled
        u = _unrecorded.get(name)
        if u is None or u._blocked is not blocked or u._device_end is not device_end:
            u = _new_unrecorded(name, blocked, device_end)
        return u
    # What a constructor would do, without its Python frame: a class with no __init__ of
    # its own is made in C (the hot path; this function is the only place one is made).
    c = Component()
    c._name = name
    c._blocked = blocked
    # The given device end, and this use's (end_on_device replaces it; a use that ends on
    # the device puts the given one back for the next use).
    c._device_end = c._resolver = device_end
    c._start_ns = start_ns
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
                if not rt.open_steps:  # between steps
                    return self._enter_loose(rt)
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
                if not rt.open_steps:  # between steps
                    return self._enter_loose(rt)
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
            st.spans.append((name, self._blocked, sid, parent, self._start_ns or _clock(), thread))
        except Exception:
            self._sid = 0
            report_internal_error("component() (the component is not recorded)")
        return self

    def _enter_loose(self, rt: Runtime) -> Component:
        """Record a component that another thread starts while no sampled step is open:
        apart from any step (``rt.loose``), as a span of its own, with its end stored in the
        step opened last before it; the worker counts it in the later steps of that step's
        thread that it overlaps (background work). On that step's own thread, between two
        of its steps, nothing is recorded."""
        st = rt.last_step
        ident = _get_ident()
        if st is None or ident == st.ident:
            return self
        allowed = rt.allowed
        name = self._name
        if allowed is not None and name not in allowed:
            return self
        span: Any = otel_context().get(SPAN_KEY)
        # The ended step as the current span answers no parent: spans that other code
        # starts inside this component start traces of their own, as the component does.
        self._token = None if span is st else attach_span(st)
        try:
            sid = take_span_id()
        except IndexError:
            sid = refill_span_ids()
        thread = threads_by_ident.get(ident) or _current_thread()
        self._step = st
        self._ctoken = _current.set(self)
        self._sid = self._span_id = sid
        rt.loose.append(((name, self._blocked, sid, 0, self._start_ns or _clock(), thread), st))
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


def _new_unrecorded(name: str, blocked: bool, device_end: Any) -> Unrecorded:
    u = Unrecorded(name, blocked, device_end)
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
) -> None:
    """Record a component that already happened, over ``[start_ns, end_ns]``
    (``time.perf_counter_ns()``), in the step open in the calling context.

    For integrations that learn of a phase after the fact (a compile event, a callback pair).
    It nests under the component open in the calling context; outside a sampled step, or
    when ``name`` is filtered out, it records nothing. Never raises.
    """
    c = component(name, blocked, start_ns=start_ns)
    if type(c) is not Component:  # a step that is not sampled
        return
    c.__enter__()
    sid = c._sid
    if not sid:
        return
    st = c._step
    if attributes:
        step_extras(st).attributes[sid] = dict(attributes)
    c.__exit__(None, None, None)
    st.ends[sid] = max(end_ns, start_ns)


def _take_pending(rt: Runtime) -> list[StepEvent]:
    out: list[StepEvent] = []
    pending = rt.pending_events
    while pending:
        try:
            out.append(pending.popleft())
        except IndexError:  # emptied by another thread
            break
    return out


def may_record() -> bool:
    """False when a component opened now in the calling context would surely record nothing
    (in a step that is not sampled; outside any step with no sampled step open anywhere): a
    cheap check (~60 ns) for integrations that wrap frequent calls."""
    cur = _current.get()
    if cur is None:
        return False
    if cur is _NOT_SET:
        rt = _runtime
        return rt is not None and bool(rt.open_steps)
    return True


def in_step() -> bool:
    """True when a step (sampled or not) is open in the calling context (in a thread that
    outlived the step its context holds: when any sampled step is open, as its components
    then record into the latest one)."""
    cur = _current.get()
    if cur is _NOT_SET:
        return False
    st = _step_of(cur)
    if st is not None and st.end_ns:
        rt = _runtime
        return rt is not None and bool(rt.open_steps)
    return True
