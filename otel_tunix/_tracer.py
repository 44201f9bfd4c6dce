"""The hot path: ``step()`` and ``component()``.

Inside the training loop otel-tunix only reads the clock, draws a span id and appends a small
record to the step. Real OTel spans are built from those records later, on the pipeline's
worker thread (``_pipeline.py``), and fed to the span processors and exporters there.

OTel context propagation costs about 1.5 us per attach (a SpanContext, a span object, a new
Context, the context-var set), too much per component. So a sampled step attaches, once, a
*proxy span* whose ``get_span_context()`` answers with the innermost otel-tunix component open
in the calling context (read from our own context variable), or the step itself. Spans that
any other code starts inside a component (an HTTP client, a user's
``tracer.start_as_current_span``) therefore become that component's children in the export,
while a component costs only one context-variable set. Only when a foreign span sits between
the step and a component (or in a thread that did not inherit the context) does the
component attach the proxy itself.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Mapping
from random import getrandbits
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry.context import attach, detach, get_current
from opentelemetry.trace import (
    DEFAULT_TRACE_STATE,
    NonRecordingSpan,
    SpanContext,
    TraceFlags,
    get_current_span,
    set_span_in_context,
)

if TYPE_CHECKING:
    from otel_tunix._pipeline import Pipeline

_logger = logging.getLogger(__name__)
_clock = time.perf_counter_ns
_current_thread = threading.current_thread
_threads_by_ident = threading._active  # what current_thread() reads, without its Python frame
_get_ident = threading.get_ident

try:  # the OTel context key of the current span: reading it directly saves an ABC check
    from opentelemetry.trace.propagation import _SPAN_KEY
except ImportError:  # pragma: no cover - a future API without the private key
    _SPAN_KEY = None  # never found: components then take the general path (get_current_span)


def _runtime_context_var() -> contextvars.ContextVar[Any] | None:
    """The ContextVar behind OTel's runtime context when it is the standard contextvars one
    (read and set directly below: a few Python calls fewer per step and component)."""
    from opentelemetry import context as otel_context

    var = getattr(getattr(otel_context, "_RUNTIME_CONTEXT", None), "_current_context", None)
    return var if isinstance(var, contextvars.ContextVar) else None


def _span_attacher(
    var: contextvars.ContextVar[Any] | None,
) -> tuple[Callable[[Any], Any], Callable[[Any], None]]:
    """``(attach_span, detach)``: make a span the current OTel span and undo it.

    With the standard runtime context this is one ``ContextVar.set`` of a new ``Context``
    holding the span (what ``attach(set_span_in_context(span))`` does, without its four
    Python calls); otherwise the public API.
    """
    from opentelemetry.context import Context

    if var is None or _SPAN_KEY is None:
        return (lambda span: attach(set_span_in_context(span))), detach
    key, get, set_ = _SPAN_KEY, var.get, var.set

    def attach_span(span: Any) -> Any:
        return set_(Context({**get(), key: span}))

    return attach_span, var.reset


_context_var = _runtime_context_var()
_otel_context: Callable[[], Any] = _context_var.get if _context_var is not None else get_current
"""Reads the current OTel Context."""
_attach_span, _detach = _span_attacher(_context_var)


_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def _span_context_factory() -> Callable[[int, int], SpanContext]:
    """``(trace_id, span_id) -> SpanContext`` (local, sampled) for ids otel-tunix drew or
    took from a valid context.

    ``SpanContext`` is a tuple; building the tuple directly skips the constructor's range
    checks (about half its cost, paid per span). Used only when it yields exactly what the
    constructor does in this version of the API; otherwise the constructor itself.
    """
    fields = (False, _SAMPLED, DEFAULT_TRACE_STATE, True)

    def fast(trace_id: int, span_id: int) -> SpanContext:
        return _tuple_new(SpanContext, (trace_id, span_id, *fields))  # type: ignore[no-any-return]

    def slow(trace_id: int, span_id: int) -> SpanContext:
        return SpanContext(trace_id, span_id, False, _SAMPLED)

    try:
        a, b = fast(3, 5), slow(3, 5)
        same = tuple(a) == tuple(b) and a.is_valid and a.trace_flags.sampled and not a.is_remote
    except Exception:  # pragma: no cover - a future API
        same = False
    return fast if same else slow


_tuple_new = tuple.__new__
new_span_context = _span_context_factory()
_F = TypeVar("_F", bound=Callable[..., Any])

DeviceEnd = Callable[[], int | None]
"""Resolves a component's device completion time, as ``time.perf_counter_ns()``.

Called once on otel-tunix's device-waiter thread, never on the training thread; it may block
(``jax.block_until_ready``, ``torch.cuda.Event.synchronize``). Returning ``None`` keeps the
host exit time. An object with a ``result()`` method (a ``concurrent.futures.Future``) works
too."""


StepEvent = tuple[str, dict[str, Any], int]
"""A span event recorded for a step: (name, attributes, ``time.perf_counter_ns()``)."""

_MAX_PENDING_EVENTS = 256
"""Events waiting for the next sampled step (raised while none was open); the oldest are
dropped past this bound."""


class _ScopeStats:
    """Counts every step of a scope, sampled or not (read by the session summary)."""

    __slots__ = ("count", "first_start_ns", "last_end_ns")

    def __init__(self) -> None:
        self.count = 0
        self.first_start_ns = 0
        self.last_end_ns = 0


class SpanRecord:
    """A component as recorded on the hot path (perf_counter nanoseconds)."""

    __slots__ = (
        "_ctx",
        "attributes",
        "blocked",
        "device_end",
        "end_ns",
        "error",
        "host_end_ns",
        "incomplete",
        "name",
        "parent_id",
        "span_id",
        "start_ns",
        "thread",
        "trace_id",
    )

    def __init__(
        self,
        name: str,
        blocked: bool,
        trace_id: int,
        span_id: int,
        parent_id: int,
        device_end: Any = None,
    ) -> None:
        self.name = name
        self.blocked = blocked
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        self._ctx: SpanContext | None = None
        self.end_ns = self.host_end_ns = 0
        self.error: BaseException | None = None
        self.device_end = device_end
        self.incomplete = False
        self.attributes: dict[str, Any] | None = None
        self.thread = _threads_by_ident.get(_get_ident()) or _current_thread()
        self.start_ns = _clock()

    def span_context(self) -> SpanContext:
        """The OTel SpanContext of this component (built on first use)."""
        ctx = self._ctx
        if ctx is None:
            ctx = self._ctx = new_span_context(self.trace_id, self.span_id)
        return ctx


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
        "device_pending",
        "end_ns",
        "error",
        "events",
        "number",
        "parent_id",
        "runtime",
        "scope",
        "span_id",
        "spans",
        "start_ns",
        "submitted_at",
        "thread",
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
        self.spans: list[SpanRecord] = []
        self.device_pending: list[SpanRecord] | None = None
        self.attributes: dict[str, Any] = {}
        self.error: BaseException | None = None
        self.events: list[StepEvent] | None = None
        self.submitted_at = 0.0
        self.thread = _threads_by_ident.get(_get_ident()) or _current_thread()
        self.view: StepView | None = None
        current = _otel_context().get(_SPAN_KEY) or get_current_span()
        parent = current.get_span_context()
        if parent.is_valid:
            # Join the application's trace: the step becomes a child of its current span.
            self.trace_id = parent.trace_id
            self.parent_id = parent.span_id
        else:
            self.trace_id = getrandbits(128) or 1
            self.parent_id = 0
        self.span_id = getrandbits(64) or 1
        self._ctx: SpanContext | None = None

    def span_context(self) -> SpanContext:
        """The OTel SpanContext of the step span (built on first use)."""
        ctx = self._ctx
        if ctx is None:
            ctx = self._ctx = new_span_context(self.trace_id, self.span_id)
        return ctx

    def get_span_context(self) -> SpanContext:
        """As the current OTel span: the innermost open component's context, else the
        step's (what a span started by other code inside the step gets as its parent)."""
        rec = _current_component.get()
        if rec is not None and rec.trace_id == self.trace_id:
            return rec.span_context()
        return self.span_context()

    def __repr__(self) -> str:
        return f"StepRecord({self.scope!r}, {self.number}, {self.get_span_context()!r})"


class Runtime:
    """What the hot path needs from one ``configure()``: sampling, filter, the pipeline."""

    __slots__ = ("allowed", "open_steps", "pending_events", "pipeline", "sampling_rate", "scopes")

    def __init__(
        self, sampling_rate: int, components: tuple[str, ...] | None, pipeline: Pipeline
    ) -> None:
        self.sampling_rate = sampling_rate
        self.allowed = frozenset(components) if components is not None else None
        self.pipeline = pipeline
        self.scopes: dict[str, _ScopeStats] = {}
        self.open_steps: list[StepRecord] = []
        self.pending_events: collections.deque[StepEvent] = collections.deque(
            maxlen=_MAX_PENDING_EVENTS
        )


_runtime: Runtime | None = None
_quiet = False  # True once configure() ran: a missing runtime is then deliberate (disabled)
_NOT_SET: Any = object()
_current_step: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "otel_tunix_step", default=_NOT_SET
)
_current_component: contextvars.ContextVar[SpanRecord | None] = contextvars.ContextVar(
    "otel_tunix_component", default=None
)
_warned: set[str] = set()


def set_runtime(runtime: Runtime | None) -> None:
    """Install the runtime of a ``configure()`` (``None``: otel-tunix is off, silently)."""
    global _runtime, _quiet
    _runtime = runtime
    _quiet = True


def get_runtime() -> Runtime | None:
    return _runtime


def _warn_once(key: str, msg: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        _logger.warning(msg, *args)


class step:
    """One training iteration: ``with otel_tunix.step(n, scope="train") as s: ...``.

    Opens the step span ``<scope>_step`` when step ``n`` is sampled (``n % sampling_rate ==
    0``); every component inside follows that decision. Counts every step of the scope, so
    the session's ``steps_per_sec`` includes the steps that were not sampled. Never raises;
    an exception from the body propagates unchanged and marks the step span as an error.

    Args:
        n: The step number (an ``int``; other values are counted as the scope's next step).
        scope: ``"train"``, ``"eval"``, ``"rl/actor"``, ``"rl/learner"`` or any string.
        start_ns: When the step started (``time.perf_counter_ns()``), for integrations that
            open the step after the fact; default: now.
    """

    __slots__ = (
        "_comp_token",
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
        self._stats: _ScopeStats | None = None
        self._token: contextvars.Token[Any] | None = None
        self._otel_token: object = None
        self._comp_token: contextvars.Token[Any] | None = None

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
                _warn_once(
                    "not-configured",
                    "otel_tunix.step() was called before otel_tunix.configure(); "
                    "nothing is recorded until configure() runs",
                )
            return self
        try:
            start = self._start_ns or _clock()
            stats = rt.scopes.get(self._scope)
            if stats is None:
                stats = rt.scopes.setdefault(self._scope, _ScopeStats())
            if stats.count == 0:
                stats.first_start_ns = start
            stats.count += 1
            self._stats = stats
            n = self._n
            if type(n) is not int:
                _warn_once("step-n", "otel_tunix.step() wants an int step number, got %r", n)
                n = self._n = stats.count - 1
            if n % rt.sampling_rate:
                self._token = _current_step.set(None)
                return self
            rec = StepRecord(rt, self._scope, n, start)
            if rt.pending_events:  # events raised while no sampled step was open
                rec.events = _take_pending(rt)
            self._record = rec
            self._token = _current_step.set(rec)
            self._comp_token = _current_component.set(None)
            self._otel_token = _attach_span(rec)
            rt.open_steps.append(rec)
        except Exception:  # never hurt the training loop
            _logger.exception("otel-tunix: step() failed; this step is not recorded")
            self._record = None
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        end = _clock()
        try:
            if self._stats is not None:
                self._stats.last_end_ns = end
            if self._otel_token is not None:
                _detach(self._otel_token)
                self._otel_token = None
            if self._comp_token is not None:
                _current_component.reset(self._comp_token)
                self._comp_token = None
            if self._token is not None:
                _current_step.reset(self._token)
                self._token = None
            rec = self._record
            if rec is not None:
                rec.end_ns = end
                rec.error = exc
                rt = rec.runtime
                if rec.device_pending:
                    rt.pipeline.wait_for_device(rec.device_pending)
                try:
                    rt.open_steps.remove(rec)
                except ValueError:
                    pass
                rt.pipeline.submit(rec)
                self._record = None
        except Exception:
            _logger.exception("otel-tunix: closing a step failed")


class component:
    """One phase of a step: ``with otel_tunix.component("train_data_load"): ...``.

    Also a decorator, for plain and ``async`` functions: ``@otel_tunix.component("rollout")``.
    Components nest, and work in threads and asyncio tasks started inside the step (they read
    the step from ``contextvars``; a thread started without a copy of the context records
    into the most recently opened step). Outside a sampled step, or when the name is filtered
    out by ``components=``, it costs a few hundred nanoseconds and records nothing.

    Args:
        name: The component (and span) name, e.g. ``"train_step_compute"``.
        blocked: True for time spent waiting (a queue, a throttle, a mesh swap): it counts as
            ``blocked_time_sec`` instead of ``busy_time_sec``.
        device_end: Optional :data:`DeviceEnd` resolver; the span then ends at device
            completion instead of host exit. It can also be given inside the block with
            :meth:`end_on_device` once the outputs exist.
        start_ns: When the component started (``time.perf_counter_ns()``), for integrations
            that learn of it after the fact; default: now.
    """

    __slots__ = (
        "_blocked",
        "_ctoken",
        "_device_end",
        "_name",
        "_record",
        "_start_ns",
        "_step",
        "_token",
    )

    def __init__(
        self,
        name: str,
        blocked: bool = False,
        device_end: Any = None,
        *,
        start_ns: int | None = None,
    ) -> None:
        self._name = name
        self._blocked = blocked
        self._device_end = device_end
        self._start_ns = start_ns
        self._record: SpanRecord | None = None
        # _step, _token and _ctoken are set by __enter__ when it records (and read by
        # __exit__ only then): fewer assignments for every component created.

    @property
    def recording(self) -> bool:
        """True when this component is being recorded."""
        return self._record is not None

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
        rec = self._record
        if rec is None:
            return None
        if rec.attributes is None:
            rec.attributes = {}
        return rec.attributes

    def end_on_device(self, resolver: Any) -> None:
        """End the span at device completion, as resolved later by ``resolver``.

        See :data:`DeviceEnd`. Does nothing when the component is not recorded.
        """
        if self._record is not None:
            self._record.device_end = resolver

    def __enter__(self) -> component:
        st = _current_step.get()
        if st is None:
            return self
        try:
            if st is _NOT_SET:
                rt = _runtime
                if rt is None or not rt.open_steps:
                    return self
                st = rt.open_steps[-1]
            else:
                rt = st.runtime
            allowed = rt.allowed
            name = self._name
            if allowed is not None and name not in allowed:
                return self
            trace_id = st.trace_id
            cur = _otel_context().get(_SPAN_KEY)  # the current OTel span, read directly
            if cur is st:  # the usual case: no foreign span in between
                outer = _current_component.get()
                parent = outer.span_id if outer is not None else st.span_id
                attach_proxy = False
            else:  # a foreign span is current, or a thread that did not inherit the context
                cur_ctx = (cur or get_current_span()).get_span_context()
                parent = cur_ctx.span_id if cur_ctx.trace_id == trace_id else st.span_id
                attach_proxy = True
            rec = SpanRecord(
                name, self._blocked, trace_id, getrandbits(64) or 1, parent, self._device_end
            )
            if self._start_ns is not None:
                rec.start_ns = self._start_ns
            st.spans.append(rec)
            self._step = st
            self._ctoken = _current_component.set(rec)
            self._token = _attach_span(st) if attach_proxy else None
            self._record = rec
        except Exception:
            _logger.exception("otel-tunix: component() failed; it is not recorded")
            self._record = None
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        rec = self._record
        if rec is None:
            return
        rec.end_ns = rec.host_end_ns = _clock()
        self._record = None
        try:
            if exc is not None:
                rec.error = exc
            token = self._token
            if token is not None:
                _detach(token)
            _current_component.reset(self._ctoken)
            if rec.device_end is not None:
                st = self._step
                if st.end_ns:  # the step already ended (a component in another thread)
                    st.runtime.pipeline.wait_for_device([rec])
                elif st.device_pending is None:  # handed to the device waiter with the
                    st.device_pending = [rec]  # step: one hand-off per step
                else:
                    st.device_pending.append(rec)
        except Exception:
            _logger.exception("otel-tunix: closing a component failed")

    def __call__(self, fn: _F) -> _F:
        """Use as a decorator: each call of ``fn`` runs inside a fresh component."""
        name, blocked, device_end = self._name, self._blocked, self._device_end
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
    c.__enter__()
    rec = c._record
    if rec is None:
        return
    if attributes:
        rec.attributes = dict(attributes)
    c.__exit__(None, None, None)
    rec.end_ns = rec.host_end_ns = max(end_ns, start_ns)


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
        _append_event(self._rec, (name, dict(attributes or {}), _clock()))


def _append_event(rec: StepRecord, event: StepEvent) -> None:
    events = rec.events
    if events is None:
        events = rec.events = []
    events.append(event)


def _take_pending(rt: Runtime) -> list[StepEvent]:
    out: list[StepEvent] = []
    pending = rt.pending_events
    while pending:
        try:
            out.append(pending.popleft())
        except IndexError:  # emptied by another thread
            break
    return out


def add_step_event(name: str, attributes: Mapping[str, Any] | None = None) -> bool:
    """Add an event, stamped now, to a step span (alerts use it). Never raises.

    The event goes on the sampled step open in the calling context (or, in a thread that did
    not inherit the context, the most recently opened step). With no sampled step open (the
    caller runs between steps, in an unsampled step, or on otel-tunix's worker thread) it is
    queued and goes on the next sampled step that starts, placed at that step's start.

    Returns:
        True if a step open now got the event; False if it was queued (or otel-tunix is off).
    """
    rt = _runtime
    if rt is None:
        return False
    try:
        event: StepEvent = (name, dict(attributes or {}), _clock())
        st = _current_step.get()
        if st is _NOT_SET and rt.open_steps:
            st = rt.open_steps[-1]
        if isinstance(st, StepRecord) and not st.end_ns:
            _append_event(st, event)
            return True
        rt.pending_events.append(event)
    except Exception:
        _logger.exception("otel-tunix: add_step_event() failed")
    return False


def current_step() -> StepView | None:
    """The sampled step open in the calling context, or ``None`` (no step, or not sampled)."""
    st = _current_step.get()
    if not isinstance(st, StepRecord):
        return None
    view = st.view
    if view is None:
        view = st.view = StepView(st)
    return view


def in_step() -> bool:
    """True when a step (sampled or not) is open in the calling context."""
    return _current_step.get() is not _NOT_SET
