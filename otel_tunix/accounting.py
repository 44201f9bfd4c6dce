"""Busy / blocked / idle accounting of one step, and the per-session totals.

This is the one definition of the counters; the span processor, the Perfetto exporter and
the offline tools all call it, so every backend shows the same numbers.

How time is counted (all intervals are clipped to the step window):

* The step window runs from the step's start to the later of the step's own end and the
  end of its last component (a component that ends at device completion can outlive the
  host-side ``with`` block). A component whose end is before its start (a start given
  after the fact) is empty: it ends at its start.
* At every instant of the window the step is in exactly one state: **busy** if at least one
  busy component is open (on any thread), else **blocked** if at least one blocked component
  is open, else **idle**. ``busy_time_sec``, ``blocked_time_sec`` and ``idle_time_sec`` are
  the lengths of those three sets, so they never overlap and add up to ``step_time_sec``.
  Nested or concurrent busy spans are therefore counted once (the union of their intervals).
* A component's own ``busy_time_sec`` (or ``blocked_time_sec``) is the union of that
  component's intervals of that kind: two overlapping instances of the same component on two
  threads count once, but two different components overlapping each count their full time,
  so component times can add up to more than the step's busy time.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from otel_tunix.attributes import KIND_BLOCKED

_NS = 1e-9


@dataclass(slots=True)
class SpanInfo:
    """One component span of a step, in the form the local files and user functions see.

    Times are Unix epoch nanoseconds. ``span_id`` and ``parent`` are 16-hex-digit span ids;
    ``parent`` is the step span's id for top-level components.
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

    @property
    def duration_sec(self) -> float:
        """Length of the span in seconds."""
        return (self.end_ns - self.start_ns) * _NS

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (the ``spans`` entries of the spans JSONL file)."""
        out: dict[str, object] = {
            "name": self.name,
            "kind": self.kind,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "thread": self.thread,
            "thread_id": self.thread_id,
            "span_id": self.span_id,
            "parent": self.parent,
        }
        if self.error is not None:
            out["error"] = self.error
        if self.attributes:
            out["attributes"] = dict(self.attributes)
        return out


@dataclass(slots=True)
class ComponentTime:
    """Time of one component within a step (or summed over a session)."""

    busy_time_sec: float = 0.0
    blocked_time_sec: float = 0.0
    count: int = 0

    def to_json(self) -> dict[str, float | int]:
        return _times_json(self.busy_time_sec, self.blocked_time_sec, self.count)


def _times_json(busy: float, blocked: float, count: int) -> dict[str, float | int]:
    """A component's times as the JSON lines write them."""
    return {"busy_time_sec": busy, "blocked_time_sec": blocked, "count": count}


class StepSummary:
    """Everything otel-tunix derives from one sampled step.

    Attributes:
        scope: The step's scope (``train``, ``eval``, ``rl/actor``, ...).
        step: The step number.
        start_ns: Start of the step window (Unix epoch ns).
        end_ns: End of the step window: the later of the step's end and its last component's.
        step_time_sec: ``end_ns - start_ns`` in seconds.
        busy_time_sec: Time with at least one busy component open.
        blocked_time_sec: Time with a blocked component open and no busy one.
        idle_time_sec: The rest of the window.
        components: Per component name, its :class:`ComponentTime` (made on first access).
        component_times: Per component name, ``(busy_time_sec, blocked_time_sec, count)``:
            the same numbers as plain tuples (what otel-tunix's own sinks read: a tuple of
            numbers costs less to make, and Python's garbage collector stops tracking it the
            first time it looks at it, where an object of a class stays tracked until the
            step is exported).
        spans: The component spans (:class:`SpanInfo`), converted on first access.
        trace_id: The step's trace id (32 hex digits; may be given as an int).
        attributes: Extra attributes of the step span.
    """

    __slots__ = (
        "_components",
        "_span_source",
        "_spans",
        "_trace_id",
        "attributes",
        "blocked_time_sec",
        "busy_time_sec",
        "component_times",
        "end_ns",
        "idle_time_sec",
        "scope",
        "start_ns",
        "step",
        "step_time_sec",
    )

    def __init__(
        self,
        scope: str,
        step: int,
        start_ns: int,
        end_ns: int,
        step_time_sec: float,
        busy_time_sec: float,
        blocked_time_sec: float,
        idle_time_sec: float,
        component_times: Mapping[str, tuple[float, float, int]],
        spans: Sequence[SpanInfo] | Callable[[], Sequence[SpanInfo]] = (),
        trace_id: str | int = "",
        attributes: Mapping[str, object] | None = None,
    ) -> None:
        self.scope = scope
        self.step = step
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.step_time_sec = step_time_sec
        self.busy_time_sec = busy_time_sec
        self.blocked_time_sec = blocked_time_sec
        self.idle_time_sec = idle_time_sec
        self.component_times = component_times
        self._components: dict[str, ComponentTime] | None = None
        self._trace_id = trace_id
        self.attributes = dict(attributes or {})
        if callable(spans):
            self._spans: tuple[SpanInfo, ...] | None = None
            self._span_source: Callable[[], Sequence[SpanInfo]] | None = spans
        else:
            self._spans, self._span_source = tuple(spans), None

    @property
    def components(self) -> dict[str, ComponentTime]:
        """Per component name, its :class:`ComponentTime` (made on first access)."""
        comps = self._components
        if comps is None:
            comps = self._components = {
                name: ComponentTime(*times) for name, times in self.component_times.items()
            }
        return comps

    @property
    def trace_id(self) -> str:
        """The step's trace id, 32 hex digits (formatted when first read: usually only a
        file writer reads it)."""
        tid = self._trace_id
        if type(tid) is int:
            tid = self._trace_id = f"{tid:032x}"
        return tid  # type: ignore[return-value]

    @property
    def spans(self) -> tuple[SpanInfo, ...]:
        """The step's component spans, in start order."""
        if self._spans is None:
            assert self._span_source is not None
            self._spans = tuple(self._span_source())
            self._span_source = None
        return self._spans

    def _spans_json(self) -> list[dict[str, object]]:
        """The ``spans`` of :meth:`to_json`: from a span factory that has a ``span_json()``
        method (the same dicts as ``SpanInfo.to_json()``, made straight from the records),
        while the spans were not needed as ``SpanInfo`` objects; else from those."""
        source = self._span_source
        span_json = getattr(source, "span_json", None) if source is not None else None
        if span_json is not None:
            return span_json()  # type: ignore[no-any-return]
        return [s.to_json() for s in self.spans]

    def __repr__(self) -> str:
        return (
            f"StepSummary(scope={self.scope!r}, step={self.step}, "
            f"step_time_sec={self.step_time_sec:.6f}, busy_time_sec={self.busy_time_sec:.6f}, "
            f"blocked_time_sec={self.blocked_time_sec:.6f}, "
            f"idle_time_sec={self.idle_time_sec:.6f}, components={dict(self.components)!r})"
        )

    def to_json(self) -> dict[str, object]:
        """The JSON object written as one line of the spans JSONL file."""
        out: dict[str, object] = {
            "type": "step",
            "scope": self.scope,
            "step": self.step,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "trace_id": self.trace_id,
            "step_time_sec": self.step_time_sec,
            "busy_time_sec": self.busy_time_sec,
            "blocked_time_sec": self.blocked_time_sec,
            "idle_time_sec": self.idle_time_sec,
            "components": {name: _times_json(*t) for name, t in self.component_times.items()},
            "spans": self._spans_json(),
        }
        if self.attributes:
            out["attributes"] = dict(self.attributes)
        return out


def union_ns(intervals: Iterable[tuple[int, int]]) -> int:
    """Total length of the union of half-open ``(start, end)`` intervals."""
    ordered = sorted(intervals)
    if not ordered:
        return 0
    return _union_clipped([("", False, s, e) for s, e in ordered], ordered[0][0], None)


Interval = tuple[str, bool, int, int]
"""``(component name, blocked, start_ns, end_ns)``."""

_by_start = operator.itemgetter(2)


def account_step(
    scope: str,
    step: int,
    start_ns: int,
    end_ns: int,
    spans: Sequence[SpanInfo],
    *,
    trace_id: str = "",
    attributes: Mapping[str, object] | None = None,
) -> StepSummary:
    """Derive the busy / blocked / idle counters of one step from its component spans.

    See the module docstring for the exact rules.
    """
    return account_intervals(
        scope,
        step,
        start_ns,
        end_ns,
        [(s.name, s.kind == KIND_BLOCKED, s.start_ns, s.end_ns) for s in spans],
        spans=spans,
        trace_id=trace_id,
        attributes=attributes,
    )


def account_intervals(
    scope: str,
    step: int,
    start_ns: int,
    end_ns: int,
    intervals: Sequence[Interval],
    *,
    presorted: bool = False,
    spans: Sequence[SpanInfo] | Callable[[], Sequence[SpanInfo]] = (),
    trace_id: str | int = "",
    attributes: Mapping[str, object] | None = None,
) -> StepSummary:
    """:func:`account_step` on plain intervals (``presorted``: they are in start order
    already); ``spans`` may be a factory, called when the spans are first read (one with a
    ``span_json()`` method also gives :meth:`StepSummary.to_json` their JSON dicts)."""
    if not presorted:
        intervals = sorted(intervals, key=_by_start)
    return account_components(
        scope,
        step,
        start_ns,
        end_ns,
        [(name, blocked, i, None, s, None) for i, (name, blocked, s, _) in enumerate(intervals)],
        {i: e for i, (_, _, _, e) in enumerate(intervals)},
        spans=spans,
        trace_id=trace_id,
        attributes=attributes,
    )


ComponentRecord = tuple[str, bool, Hashable, Any, int, Any]
"""``(component name, blocked, key, -, start_ns, -)``: a component as the hot path records
it (:data:`otel_tunix._tracer.ComponentStart`, whose key is the span id); its end is looked
up by key. The fields marked ``-`` are not read here."""


def account_components(
    scope: str,
    step: int,
    start_ns: int,
    end_ns: int,
    components: Sequence[ComponentRecord],
    ends: Mapping[Hashable, int],
    *,
    device_ends: Mapping[Hashable, int] | None = None,
    offset: int = 0,
    ends_out: list[int] | None = None,
    spans: Sequence[SpanInfo] | Callable[[], Sequence[SpanInfo]] = (),
    trace_id: str | int = "",
    attributes: Mapping[str, object] | None = None,
) -> StepSummary:
    """The accounting itself, on components in start order (the worker's path: what the hot
    path recorded, read in one pass).

    A component ends at ``device_ends[key]``, else ``ends[key]``, else at its start; one that
    would end before it starts ends at its start (empty). Those ends, in order, are appended
    to ``ends_out`` when given. ``offset`` is added to the summary's ``start_ns`` / ``end_ns`` (from
    ``perf_counter_ns`` readings to Unix epoch ns); durations do not depend on it.
    """
    # One pass, in start order: each component's end, the window end, each component's time
    # (taken whole for a component seen once in the step, the usual case; the union of its
    # intervals for one seen more than once, after the loop), and the union of the open
    # intervals as runs (starts clipped to the step's keep the order). Until the first
    # blocked interval, the busy union is that union; from there it is kept apart.
    window_end = end_ns
    found: dict[str, tuple[float, float, int]] = {}
    repeated: set[str] | None = None
    ends_list = ends_out if ends_out is not None else []
    first = len(ends_list)
    add_end = ends_list.append
    total = 0
    run_start = run_end = start_ns  # the union of every interval: done runs, open run
    busy_total: int | None = None  # the busy union, once a blocked interval split it off
    busy_start = busy_end = start_ns
    for name, is_blocked, key, _, s, _ in components:
        e = ends.get(key, s)
        if device_ends is not None:
            e = device_ends.get(key, e)
        if e < s:
            e = s
        if e > window_end:
            window_end = e
        add_end(e)
        if s < start_ns:
            s = start_ns
        if name in found:
            if repeated is None:
                repeated = set()
            repeated.add(name)
        else:
            length = (e - s) * _NS if e > s else 0.0
            found[name] = (0.0, length, 1) if is_blocked else (length, 0.0, 1)
        if e <= s:
            continue
        if is_blocked:
            if busy_total is None:  # the first blocked interval: busy so far = all so far
                busy_total, busy_start, busy_end = total, run_start, run_end
        elif busy_total is not None:
            if s > busy_end:
                busy_total += busy_end - busy_start
                busy_start, busy_end = s, e
            elif e > busy_end:
                busy_end = e
        if s > run_end:
            total += run_end - run_start
            run_start, run_end = s, e
        elif e > run_end:
            run_end = e
    open_ns = total + run_end - run_start
    if busy_total is None:  # nothing blocked
        busy_ns, blocked_ns = open_ns, 0
    else:
        busy_ns = busy_total + busy_end - busy_start
        blocked_ns = open_ns - busy_ns
    wall_ns = window_end - start_ns
    idle_ns = wall_ns - open_ns
    if repeated is not None:
        if len(found) == 1 and busy_total is None:  # one component, all busy: busy_ns
            (name,) = found
            found[name] = (busy_ns * _NS, 0.0, len(components))
        else:
            intervals = [
                (n, b, s, e)
                for (n, b, _, _, s, _), e in zip(components, ends_list[first:], strict=True)
            ]
            for name in repeated:
                group = [iv for iv in intervals if iv[0] == name]
                found[name] = (
                    _union_clipped(group, start_ns, False) * _NS,
                    _union_clipped(group, start_ns, True) * _NS,
                    len(group),
                )
    return StepSummary(  # positionally: ~0.4 us less per step than by keyword
        scope,
        step,
        start_ns + offset,
        window_end + offset,
        wall_ns * _NS,
        busy_ns * _NS,
        blocked_ns * _NS,
        (idle_ns if idle_ns > 0 else 0) * _NS,
        found,
        spans,
        trace_id,
        attributes,
    )


def _union_clipped(intervals: Sequence[Interval], start_ns: int, blocked: bool | None) -> int:
    """Length of the union of ``intervals`` (in start order) of one kind (``blocked``; any
    kind when ``None``), starts clipped to ``start_ns``."""
    total = 0
    run_start = run_end = start_ns
    for _, is_blocked, s, e in intervals:
        if blocked is not None and (not is_blocked) is blocked:  # the other kind
            continue
        if s < start_ns:
            s = start_ns
        if e <= s:
            continue
        if s > run_end:
            total += run_end - run_start
            run_start, run_end = s, e
        elif e > run_end:
            run_end = e
    return total + run_end - run_start


def _component_names(summary: StepSummary) -> tuple[str, ...]:
    """A step's component names, in order (what splits steps into runs of one layout)."""
    return tuple(summary.component_times)


@dataclass(slots=True)
class ScopeSession:
    """Totals of one scope over a session (first to last step)."""

    scope: str
    steps: int = 0
    sampled_steps: int = 0
    first_start_ns: int = 0
    last_end_ns: int = 0
    step_time_sec: float = 0.0
    busy_time_sec: float = 0.0
    blocked_time_sec: float = 0.0
    idle_time_sec: float = 0.0
    components: dict[str, ComponentTime] = field(default_factory=dict)

    @property
    def wall_time_sec(self) -> float:
        """Time from the start of the first step to the end of the last one."""
        return max(0, self.last_end_ns - self.first_start_ns) * _NS

    @property
    def steps_per_sec(self) -> float:
        """All steps of the scope (sampled or not) over :attr:`wall_time_sec`."""
        wall = self.wall_time_sec
        return self.steps / wall if wall > 0 else 0.0

    def add(self, summary: StepSummary) -> None:
        """Add one sampled step's counters."""
        self.add_all((summary,))

    def add_all(self, summaries: Iterable[StepSummary]) -> None:
        """Add sampled steps' counters, in order (the worker's batches)."""
        step_time, busy, blocked, idle = (
            self.step_time_sec, self.busy_time_sec, self.blocked_time_sec, self.idle_time_sec
        )  # fmt: skip
        # Steps with the same component names in the same order (the usual run of steps)
        # are summed a column at a time: transposed by zip and added by sum(), in C, in the
        # same order as one step at a time (~0.7k instructions less a component than a
        # Python loop over each step's components, in a batch of many steps).
        for names, run in itertools.groupby(summaries, _component_names):
            times: list[Iterable[tuple[float, float, int]]] = []
            for summary in run:
                step_time += summary.step_time_sec
                busy += summary.busy_time_sec
                blocked += summary.blocked_time_sec
                idle += summary.idle_time_sec
                times.append(summary.component_times.values())
            self.sampled_steps += len(times)
            self._add_columns(names, times)
        self.step_time_sec, self.busy_time_sec, self.blocked_time_sec, self.idle_time_sec = (
            step_time, busy, blocked, idle
        )  # fmt: skip

    def _add_columns(
        self, names: tuple[str, ...], run: list[Iterable[tuple[float, float, int]]]
    ) -> None:
        """Add the component times of steps whose components are ``names``, in that order."""
        totals = self.components
        for name, column in zip(names, zip(*run, strict=True), strict=True):
            acc = totals.get(name)
            if acc is None:
                acc = totals[name] = ComponentTime()
            busy, blocked, count = zip(*column, strict=True)
            acc.busy_time_sec = sum(busy, acc.busy_time_sec)
            acc.blocked_time_sec = sum(blocked, acc.blocked_time_sec)
            acc.count = sum(count, acc.count)

    def copy(self) -> ScopeSession:
        """A snapshot that later :meth:`add` calls do not change."""
        return replace(self, components={k: replace(v) for k, v in self.components.items()})

    def mean(self, total: float) -> float:
        """A session total divided by the number of sampled steps."""
        return total / self.sampled_steps if self.sampled_steps else 0.0

    def to_json(self) -> dict[str, object]:
        """The JSON object of the ``type: "session"`` line (one per scope)."""
        n = self.sampled_steps
        return {
            "type": "session",
            "scope": self.scope,
            "steps": self.steps,
            "sampled_steps": n,
            "first_start_ns": self.first_start_ns,
            "last_end_ns": self.last_end_ns,
            "wall_time_sec": self.wall_time_sec,
            "steps_per_sec": self.steps_per_sec,
            "step_time_sec": self.step_time_sec,
            "busy_time_sec": self.busy_time_sec,
            "blocked_time_sec": self.blocked_time_sec,
            "idle_time_sec": self.idle_time_sec,
            "mean_step_time_sec": self.mean(self.step_time_sec),
            "components": {k: v.to_json() for k, v in self.components.items()},
        }
