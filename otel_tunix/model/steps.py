"""The step model: the plain data otel-tunix derives from a step and a session.

:class:`SpanInfo` (one component span as the local files and user functions see it),
:class:`ComponentTime`, :class:`StepSummary` (everything derived from one sampled step) and
:class:`ScopeSession` (a scope's totals over the run). :mod:`otel_tunix.accounting.step_time` makes
them; every sink, exporter and analysis tool reads them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from otel_tunix.model import record as rs
from otel_tunix.model.record import SpanInfo

__all__ = [
    "BackgroundInterval",
    "ComponentRecord",
    "ComponentTime",
    "Interval",
    "ScopeSession",
    "SpanInfo",
    "StepSummary",
    "link_json",
]

_NS = 1e-9

Interval = tuple[str, bool, int, int]
"""``(component name, blocked, start_ns, end_ns)``."""


BackgroundInterval = tuple[str, bool, int, int, int, str | None]
"""``(component name, blocked, start_ns, end_ns, count, category)``: background work
overlapping a step (``count``: 1 in the step the component belongs to, 0 in the others it
overlaps; ``category``: the goodput category it was recorded with)."""

ComponentRecord = tuple[str, bool, Hashable, Any, int, Any, Any]
"""``(component name, blocked, key, -, start_ns, -, -)``: a component as the hot path
records it (:data:`otel_tunix.model.record.ComponentStart`, whose key is the span id); its
end is looked up by key. The fields marked ``-`` are not read here."""


def link_json(link: Any) -> dict[str, object]:
    """An OTel ``Link`` as the spans JSONL writes it: ``trace_id`` (32 hex digits),
    ``span_id`` (16) and its ``attributes``."""
    ctx = link.context
    return {
        rs.TRACE_ID: f"{ctx.trace_id:032x}",
        rs.SPAN_ID: f"{ctx.span_id:016x}",
        rs.ATTRIBUTES: dict(link.attributes or {}),
    }


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
    return {rs.BUSY_TIME: busy, rs.BLOCKED_TIME: blocked, rs.COUNT: count}


class StepSummary:
    """Everything otel-tunix derives from one sampled step.

    Attributes:
        scope: The step's scope (``train``, ``eval``, ``rl/actor``, ...).
        step: The step number.
        start_ns: Start of the step window (Unix epoch ns).
        end_ns: End of the step's host window (its own end; device work may run past it).
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
        device_end_ns: The latest device completion of the step's components (Unix epoch
            ns; 0: none ended on the device). It never stretches the step's window.
        device_times: Per component that ended on the device, the time from its start to
            its device end, in seconds (``None``: none did).
        span_id: The step span's id (0: unknown, a summary not made from a recorded step).
        device_blocked_time_sec: The device time of the step's blocked components that ended
            on the device (between each one's two CUDA events: what the GPU waited there,
            such as a NCCL collective waiting for the other ranks while the host ran ahead);
            0 without any.
        background_time_sec: Time of the window in which background work was open: other
            threads' components that crossed an edge of a step (an async checkpoint
            writer). Beside busy / blocked / idle, not part of them.
        background_times: Per component that ran in the step as background work, its
            overlap with the window in seconds (also in its ``components`` time; ``None``:
            none did).
        error: The error that escaped the step's body (``"Type: message"``), else ``None``.
    """

    __slots__ = (
        "_components",
        "_span_source",
        "_spans",
        "_trace_id",
        "attributes",
        "background_time_sec",
        "background_times",
        "blocked_time_sec",
        "busy_time_sec",
        "component_times",
        "device_blocked_time_sec",
        "device_end_ns",
        "device_times",
        "end_ns",
        "error",
        "idle_time_sec",
        "links",
        "scope",
        "span_id",
        "start_ns",
        "step",
        "step_time_sec",
        "unsampled_sec",
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
        device_end_ns: int = 0,
        device_times: Mapping[str, float] | None = None,
        span_id: int = 0,
        background_time_sec: float = 0.0,
        background_times: Mapping[str, float] | None = None,
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
        self.device_end_ns = device_end_ns
        self.device_times = device_times
        self.span_id = span_id
        self.device_blocked_time_sec = 0.0
        self.background_time_sec = background_time_sec
        self.background_times = background_times
        self.links: list[dict[str, object]] | None = None
        """The links the step's code added to its span (:func:`link_json` each: a learner
        step's rollouts, :func:`otel_tunix.rl.consume`); ``None``: none."""
        self.unsampled_sec: dict[str, float] | None = None
        """Per goodput category, the time the components of the scope's steps that were
        not recorded since its previous recorded step spent in it (``None``: none)."""
        self.error: str | None = None
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
    def device_lag_sec(self) -> float:
        """How long after the step's host window its last device work finished (0: none
        later, or none on the device)."""
        lag = self.device_end_ns - self.end_ns
        return lag * _NS if self.device_end_ns and lag > 0 else 0.0

    @property
    def trace_id(self) -> str:
        """The step's trace id, 32 hex digits (formatted when first read: usually only a
        file writer reads it)."""
        tid = self._trace_id
        if type(tid) is int:
            tid = self._trace_id = f"{tid:032x}"
        return tid  # type: ignore[return-value]

    @property
    def trace_id_int(self) -> int:
        """The step's trace id as a number (0: none)."""
        tid = self._trace_id
        if isinstance(tid, int):
            return tid
        return int(tid, 16) if tid else 0

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
        """The JSON object written as one line of the spans JSONL file (its keys:
        :mod:`otel_tunix.model.record`)."""
        out: dict[str, object] = {
            rs.TYPE: rs.TYPE_STEP,
            rs.SCOPE: self.scope,
            rs.STEP: self.step,
            rs.START_NS: self.start_ns,
            rs.END_NS: self.end_ns,
            rs.TRACE_ID: self.trace_id,
            rs.SPAN_ID: f"{self.span_id:016x}",
            rs.STEP_TIME: self.step_time_sec,
            rs.BUSY_TIME: self.busy_time_sec,
            rs.BLOCKED_TIME: self.blocked_time_sec,
            rs.IDLE_TIME: self.idle_time_sec,
            rs.COMPONENTS: {name: _times_json(*t) for name, t in self.component_times.items()},
            rs.SPANS: self._spans_json(),
        }
        if self.device_end_ns:
            out[rs.DEVICE_END_NS] = self.device_end_ns
            out[rs.DEVICE_LAG] = self.device_lag_sec
            out[rs.DEVICE_TIMES] = dict(self.device_times or {})
        if self.device_blocked_time_sec:
            out[rs.DEVICE_BLOCKED_TIME] = self.device_blocked_time_sec
        if self.unsampled_sec:
            out[rs.UNSAMPLED] = dict(self.unsampled_sec)
        if self.background_times:
            out[rs.BACKGROUND_TIME] = self.background_time_sec
            out[rs.BACKGROUND_TIMES] = dict(self.background_times)
        if self.error is not None:
            out[rs.ERROR] = self.error
        if self.attributes:
            out[rs.ATTRIBUTES] = dict(self.attributes)
        if self.links:
            out[rs.LINKS] = list(self.links)
        return out


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
    active_ns: int = 0
    """The time the scope's own steps cover, with the gaps between two of its consecutive
    steps on one thread when no other scope's step ran there in between (0: unknown)."""
    step_time_sec: float = 0.0
    busy_time_sec: float = 0.0
    blocked_time_sec: float = 0.0
    idle_time_sec: float = 0.0
    background_time_sec: float = 0.0
    """Summed over the sampled steps: time other threads' background work ran in them."""
    components: dict[str, ComponentTime] = field(default_factory=dict)
    unsampled_sec: dict[str, float] = field(default_factory=dict)
    """Per goodput category, the time the components of the scope's steps that were not
    recorded after its last recorded step spent in it."""

    @property
    def wall_time_sec(self) -> float:
        """Time from the start of the first step to the end of the last one."""
        return max(0, self.last_end_ns - self.first_start_ns) * _NS

    @property
    def active_time_sec(self) -> float:
        """The scope's own time (:attr:`active_ns`), else :attr:`wall_time_sec`."""
        return self.active_ns * _NS if self.active_ns > 0 else self.wall_time_sec

    @property
    def steps_per_sec(self) -> float:
        """All steps of the scope (sampled or not) over :attr:`active_time_sec`: an eval
        scope run between training steps gets its own rate, not one diluted by the
        training in between."""
        active = self.active_time_sec
        return self.steps / active if active > 0 else 0.0

    def add(self, summary: StepSummary) -> None:
        """Add one sampled step's counters."""
        self.add_all((summary,))

    def add_all(self, summaries: Iterable[StepSummary]) -> None:
        """Add sampled steps' counters, in order (the worker's batches)."""
        step_time, busy, blocked, idle = (
            self.step_time_sec,
            self.busy_time_sec,
            self.blocked_time_sec,
            self.idle_time_sec,
        )
        # Steps with the same component names in the same order (the usual run of steps)
        # are summed a column at a time: transposed by zip and added by sum(), in C, in the
        # same order as one step at a time (~0.7k instructions less a component than a
        # Python loop over each step's components, in a batch of many steps).
        for names, run in itertools.groupby(summaries, _component_names):
            times: list[Iterable[tuple[float, float, int]]] = []
            for summary in run:
                if summary.background_times:
                    self.background_time_sec += summary.background_time_sec
                step_time += summary.step_time_sec
                busy += summary.busy_time_sec
                blocked += summary.blocked_time_sec
                idle += summary.idle_time_sec
                times.append(summary.component_times.values())
            self.sampled_steps += len(times)
            self._add_columns(names, times)
        self.step_time_sec, self.busy_time_sec, self.blocked_time_sec, self.idle_time_sec = (
            step_time,
            busy,
            blocked,
            idle,
        )

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
            rs.TYPE: rs.TYPE_SESSION,
            rs.SCOPE: self.scope,
            "steps": self.steps,
            "sampled_steps": n,
            "first_start_ns": self.first_start_ns,
            "last_end_ns": self.last_end_ns,
            "wall_time_sec": self.wall_time_sec,
            "active_time_sec": self.active_time_sec,
            "steps_per_sec": self.steps_per_sec,
            rs.STEP_TIME: self.step_time_sec,
            rs.BUSY_TIME: self.busy_time_sec,
            rs.BLOCKED_TIME: self.blocked_time_sec,
            rs.IDLE_TIME: self.idle_time_sec,
            rs.BACKGROUND_TIME: self.background_time_sec,
            "mean_step_time_sec": self.mean(self.step_time_sec),
            "components": {k: v.to_json() for k, v in self.components.items()},
            **({rs.UNSAMPLED: dict(self.unsampled_sec)} if self.unsampled_sec else {}),
            rs.COMPONENTS: {k: v.to_json() for k, v in self.components.items()},
        }
