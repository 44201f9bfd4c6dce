"""What one sampled step is on the hot path (:class:`StepRecord`, also the step's proxy span),
what the hot path needs from one ``configure()`` (:class:`Runtime`), and the context variable
that says where the calling context stands (``_current``).

How these are used, and why the innermost open component is kept where it is: the module
docstring of :mod:`otel_tunix.recording.hot_path`.
"""

from __future__ import annotations

import collections
import contextvars
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    Link,
    NonRecordingSpan,
    SpanContext,
    get_current_span,
)

from otel_tunix.recording.records import (
    MAX_PENDING_EVENTS,
    ComponentExtras,
    ComponentStart,
    ScopeStepCounts,
    StepEvent,
)
from otel_tunix.support.ids import JobStepIds, random_bits, refill_span_ids, take_span_id
from otel_tunix.support.shortcuts import (
    HAS_SPAN_KEY,
    SPAN_KEY,
    new_span_context,
    otel_context,
    threads_by_ident,
)

if TYPE_CHECKING:
    from otel_tunix.pipeline.worker import Pipeline
    from otel_tunix.recording.component import Component

_current_thread = threading.current_thread
_get_ident = threading.get_ident

_NOT_SET: Any = object()
_current: contextvars.ContextVar[Any] = contextvars.ContextVar("otel_tunix", default=_NOT_SET)
"""Where the calling context stands: ``_NOT_SET`` outside any step, ``None`` in a step that
is not sampled, the :class:`StepRecord` of a sampled step (with no component open, or with
those open kept in ``StepRecord.top``: see :mod:`otel_tunix.recording.hot_path`), else the innermost
open :class:`~otel_tunix.recording.component.Component` (whose ``_step`` is the step). One variable,
so a component reads and sets at most one."""


step_context_var = _current
"""For code that must tell, as cheaply as can be, whether the calling context is in a
sampled step (a patched ``ThreadPoolExecutor.submit``): it is not when the variable holds
:data:`CONTEXT_OUTSIDE_STEPS` (no step) or ``None`` (a step that is not sampled)."""
CONTEXT_OUTSIDE_STEPS = _NOT_SET


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
        "links",
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
        "unsampled",
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
        self.unsampled: dict[str, float] | None = None
        """Per goodput category, the time (seconds) the components of the steps not sampled
        before this one spent in it (:func:`otel_tunix.recording.records.take_unsampled`)."""
        self.foreign = False
        """True once a component of another thread was recorded into the step."""
        ident = self.ident = _get_ident()
        # The thread whose components outside an event loop nest in time (see Component):
        # none while trio is loaded (its tasks interleave on one thread with no asyncio loop).
        self.nest_ident = 0 if "trio" in sys.modules else ident
        self.thread = threads_by_ident.get(ident) or _current_thread()
        self.view: object = None
        """The step's :class:`~otel_tunix.recording.step_view.StepView`, made on first request."""
        self.top: Component | None = None
        """The innermost component open on the step's thread outside an event loop: such
        components are kept here instead of in the context variable (see
        Component.__enter__)."""
        current: Any = otel_context().get(SPAN_KEY)
        if current is None and not HAS_SPAN_KEY:  # no direct read: the public API
            current = get_current_span()
        self.link: Link | None = None
        """Where a step that starts its own trace was started from: the ended step whose
        copy of the context its thread holds (a thread started inside that step, or a step
        left open here and closed since); or, on a later attempt's first step, the previous
        attempt (set by the span builder)."""
        self.links: list[Link] | None = None
        """Links the step's code added (:func:`otel_tunix.rl.consume`: the rollouts a
        learner step trained on), bounded by whoever adds them."""
        if type(current) is StepRecord and current.end_ns:  # not a parent: a trace of its own
            self.link = Link(current.span_context())
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
        # Anything else the variable holds is an open component (the component module
        # sits above this one: no isinstance check against its class).
        if (
            cur is not _NOT_SET
            and cur is not None
            and type(cur) is not StepRecord
            and cur._step.trace_id == self.trace_id
        ):
            ctx: SpanContext = cur.span_context()
            return ctx
        top = self.top
        if top is not None:
            return top.span_context()
        return self.span_context()

    def __repr__(self) -> str:
        return f"StepRecord({self.scope!r}, {self.number}, {self.get_span_context()!r})"


class OutsideRecord(StepRecord):
    """A component recorded outside any step, with the components nested in it: what the
    hot path records while no step is open (a checkpoint restore before the loop, an eval
    loop between steps, a writer after the last step).

    The root component is the root of a trace of its own (or, when an application's span is
    current, its child, as a step would be); the components nested in it are its children.
    The record plays the step's part for them (spans, ends, extras; the proxy span while the
    root is open, so that other code's spans started inside nest under it) and goes to the
    pipeline when the root exits. It is no step: ``scope`` is ``""``, ``number`` ``-1``, and
    ``span_id`` is the root component's. Only ``type(x) is StepRecord`` tells a step (the
    checks of the hot path use it), so a record like this is never taken for one.
    """

    __slots__ = ("otel_token",)

    def __init__(self, runtime: Runtime, span_id: int, start_ns: int) -> None:
        # StepRecord.__init__ is not called: it takes the current span as a step's parent.
        self.runtime = runtime
        self.scope = ""
        self.number = -1
        self.start_ns = start_ns
        self.end_ns = 0
        self.spans = []
        self.ends = {}
        self.extras = None
        self.attributes = {}
        self.error = None
        self.events = None
        self.submitted_at = 0.0
        self.foreign = False
        ident = self.ident = _get_ident()
        self.nest_ident = 0  # nesting inside is kept in the context variable
        self.thread = threads_by_ident.get(ident) or _current_thread()
        self.view = None
        self.top = None
        self.link = None
        self.links = None
        self.otel_token: object = None
        """The token of the record made the current OTel span (detached with the root)."""
        current: Any = otel_context().get(SPAN_KEY)
        if current is None and not HAS_SPAN_KEY:
            current = get_current_span()
        # An ended step or record (a thread that outlived it) answers an invalid context.
        parent = current.get_span_context() if current is not None else None
        if parent is not None and parent.is_valid:  # the application's span: its child
            self.trace_id = parent.trace_id
            self.parent_id = parent.span_id
        else:  # made from the span id, drawn already: a seeded run's step ids stay the same
            self.trace_id = ((span_id << 64) | ((span_id * _ID_STRIDE) & _MASK64)) or 1
            self.parent_id = 0
        self.span_id = span_id
        self._ctx = None

    def __repr__(self) -> str:
        return f"OutsideRecord({self.get_span_context()!r})"


_ID_STRIDE = 0x9E3779B97F4A7C15  # odd: the low half is a 1:1 function of the span id
_MASK64 = (1 << 64) - 1


MAX_LOOSE = 4096
"""Loose components waiting for the worker (it takes them when it processes a step or the
run flushes); past this bound the oldest are dropped (a thread that records components
forever after the last step)."""


class StepWatch:
    """What :attr:`Runtime.step_watch` is told at each step's edges, on the step's thread
    (sampled or not: ``rec`` is ``None`` for a step that is not sampled). It must not raise
    (``step()`` reports what does as an internal error)."""

    def step_started(self, scope: str, number: int, rec: StepRecord | None) -> None:
        """Step ``number`` of ``scope`` has started (after its start time was read)."""

    def step_ended(self, scope: str, number: int, rec: StepRecord | None) -> None:
        """The step is ending: called before its end time is read, the step still open
        in the calling context (what is done here is in the step's time; components
        recorded here are the step's; attributes set on ``rec`` go on its span)."""


class Runtime:
    """What the hot path needs from one ``configure()``: sampling, filter, the pipeline."""

    __slots__ = (
        "allowed",
        "error_watch",
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
        "step_watch",
        "unsampled_scope",
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
        :class:`~otel_tunix.support.ids.JobStepIds`), each rank's step span under its root."""
        self.job_root = job_root
        """This rank exports the roots of those traces (rank 0)."""
        self.allowed = frozenset(components) if components is not None else None
        self.pipeline = pipeline
        self.scopes: dict[str, ScopeStepCounts] = {}
        self.unsampled_scope: str | None = None
        """The scope of the step not sampled that opened last (where the badput time the
        timed stand-ins of :mod:`otel_tunix.recording.component` measured after the last sampled
        step goes at the end)."""
        self.last_scope: dict[int, ScopeStepCounts] = {}
        """Per thread, the scope of the step that ended last on it."""
        self.open_steps: list[StepRecord] = []
        self.last_step: StepRecord | None = None
        """The sampled step opened last (kept after it ends)."""
        self.loose: collections.deque[tuple[ComponentStart, StepRecord, int]] = collections.deque(
            maxlen=MAX_LOOSE
        )
        """Outside components that other threads started after a first step, each with its
        :class:`OutsideRecord` and the thread of the step opened last before it
        (``Component._enter_outside``): the worker counts their time in the later steps of
        that thread that they overlap (background work; their spans go out with their
        records)."""
        self.pending_events: collections.deque[StepEvent] = collections.deque(
            maxlen=MAX_PENDING_EVENTS
        )
        self.error_watch: Callable[[StepRecord, BaseException], None] | None = None
        """Told, on the raising thread, when an exception leaves a recorded component or a
        sampled step (with that step's record; the step still open): the out-of-memory
        marks and snapshots (:mod:`otel_tunix.metrics.memory_snapshots`). It must not
        raise."""
        self.step_watch: StepWatch | None = None
        """Told when each step starts and ends, while set (``None``: nothing is told; the
        hot path reads this one attribute per step edge): a profile capture pending or
        running (:mod:`otel_tunix.metrics.profiling`)."""

    def step_open(self) -> bool:
        """Whether a step, sampled or not, is open on any thread: a sampled one in
        ``open_steps``, or a scope's step that is not sampled started after the scope's
        last step ended (``last_start_ns``, stored by such a step only: no cost per step
        beyond that store). While one is, a component of a thread without a step in its
        context belongs to it. A step left open for good (a generator abandoned inside it)
        stops counting once a later step of its scope has ended."""
        return bool(self.open_steps) or any(
            s.last_start_ns > s.last_end_ns for s in list(self.scopes.values())
        )
