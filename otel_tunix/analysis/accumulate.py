"""Streaming accumulation of a run's spans JSONL files, for ``otel-tunix summary``.

:func:`~otel_tunix.analysis.breakdown.summarize` builds its statistics on what is gathered
here. :class:`_FileAcc` reads one spans file once; per scope, :class:`_ScopeAcc` keeps a handful
of floats per sampled step (step, busy, blocked, idle and each component's time), never
the lines or the spans; the same pass feeds the file's
:class:`~otel_tunix.analysis.timeline.RunTimeline`, from which the goodput ledger is made.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from otel_tunix.accounting.rl_steps import PARTS, is_learner_step, step_parts
from otel_tunix.analysis.readers import ReadStats, iter_records
from otel_tunix.analysis.timeline import RunTimeline, metrics_start_ns
from otel_tunix.model import record as rs
from otel_tunix.model.record import SpanInfo, as_int64
from otel_tunix.settings import attributes as attr

_NS = 1e-9


# --- streaming accumulation -----------------------------------------------------------------


def _f(v: object) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


_i = as_int64
"""A whole number of a line, clamped to int64 (a step number past it never raises)."""


class _ScopeAcc:
    """The per-step numbers of one scope in one file."""

    def __init__(self, scope: str) -> None:
        self.scope = scope
        self.step_no: array[int] = array("q")
        self.t: array[float] = array("d")
        self.busy: array[float] = array("d")
        self.blocked: array[float] = array("d")
        self.idle: array[float] = array("d")
        self.own: array[float] = array("d")
        """Step time minus the time the step waited (see :func:`waited_sec`)."""
        self.comp: dict[tuple[str, str], array[float]] = {}
        self.first: tuple[int, int] | None = None  # start_ns, index
        self.min_start: int | None = None
        self.max_end: int | None = None
        self.session: Mapping[str, Any] | None = None
        self.errors = 0
        """Step lines with an ``error``: the step's body raised."""
        self.last_error: str | None = None
        self.max_lag: array[float] = array("d")
        """Per learner step that consumed rollouts (``otel_tunix.rl``): its largest lag."""
        self.syncs: array[float] = array("d")
        """Per step that synced weights: its syncs, and (``sync_bytes``) their bytes."""
        self.sync_bytes: array[float] = array("d")
        self.rl_step: array[float] = array("d")
        """Per learner step with its spans in the line: its time, and (``rl_parts``) the
        seconds of each part of :mod:`otel_tunix.accounting.rl_steps`."""
        self.rl_parts: dict[str, array[float]] = {p: array("d") for p in PARTS}

    @property
    def n(self) -> int:
        return len(self.t)

    def add(self, obj: Mapping[str, Any]) -> None:
        start, end = _i(obj.get(rs.START_NS)), _i(obj.get(rs.END_NS))
        idx = self.n
        self.step_no.append(_i(obj.get(rs.STEP)))
        step_time, blocked = _f(obj.get(rs.STEP_TIME)), _f(obj.get(rs.BLOCKED_TIME))
        self.t.append(step_time)
        self.busy.append(_f(obj.get(rs.BUSY_TIME)))
        self.blocked.append(blocked)
        self.own.append(step_time - waited_sec(step_time, blocked, obj))
        self.idle.append(_f(obj.get(rs.IDLE_TIME)))
        error = obj.get(rs.ERROR)
        if isinstance(error, str):
            self.errors += 1
            self.last_error = error
        attrs = obj.get(rs.ATTRIBUTES)
        if isinstance(attrs, Mapping):
            self._rl(attrs)
        if is_learner_step(self.scope, attrs if isinstance(attrs, Mapping) else None):
            self._rl_parts(obj, start, end, step_time)
        comps = obj.get(rs.COMPONENTS)
        if isinstance(comps, Mapping):
            for name, ct in comps.items():
                if not isinstance(ct, Mapping):
                    continue
                busy, blocked = _f(ct.get(rs.BUSY_TIME)), _f(ct.get(rs.BLOCKED_TIME))
                if busy or not blocked:
                    self._comp(name, "busy", idx).append(busy)
                if blocked:
                    self._comp(name, "blocked", idx).append(blocked)
        for col in self.comp.values():
            if len(col) <= idx:
                col.append(math.nan)
        if self.first is None or start < self.first[0]:
            self.first = (start, idx)
        self.min_start = start if self.min_start is None else min(self.min_start, start)
        self.max_end = end if self.max_end is None else max(self.max_end, end)

    def _rl(self, attrs: Mapping[str, Any]) -> None:
        """A learner step's policy lag and weight syncs (its span's ``tunix.rl.*``)."""
        lag = attrs.get(attr.RL_POLICY_LAG)
        if isinstance(lag, int | float):
            self.max_lag.append(float(lag))
        syncs = attrs.get(attr.RL_WEIGHT_SYNCS)
        if isinstance(syncs, int | float):
            self.syncs.append(float(syncs))
            self.sync_bytes.append(_f(attrs.get(attr.RL_WEIGHT_SYNC_BYTES)))

    def _rl_parts(self, obj: Mapping[str, Any], start: int, end: int, step_time: float) -> None:
        """A learner step's parts, from the component spans of its line."""
        spans = obj.get(rs.SPANS)
        if not isinstance(spans, list):
            return
        infos = [SpanInfo.from_json(e) for e in spans if isinstance(e, Mapping)]
        parts = step_parts(start, max(end, start + round(step_time * 1e9)), infos)
        self.rl_step.append(step_time)
        for part, seconds in parts.items():
            self.rl_parts[part].append(seconds)

    def _comp(self, name: str, kind: str, idx: int) -> array[float]:
        col = self.comp.get((name, kind))
        if col is None:
            col = self.comp[(name, kind)] = array("d", [math.nan]) * idx
        return col

    # --- derived -------------------------------------------------------------------------

    @property
    def steps(self) -> int:
        s = self.session
        return max(_i(s.get("steps")), self.n) if s else self.n

    @property
    def first_start_ns(self) -> int:
        s = self.session
        cands = [v for v in (self.min_start, _i(s.get("first_start_ns")) if s else 0) if v]
        return min(cands) if cands else 0

    @property
    def last_end_ns(self) -> int:
        s = self.session
        return max(self.max_end or 0, _i(s.get("last_end_ns")) if s else 0)

    @property
    def wall_sec(self) -> float:
        return max(0, self.last_end_ns - self.first_start_ns) * _NS

    @property
    def steps_per_sec(self) -> float:
        s = self.session
        if s and isinstance(s.get("steps_per_sec"), int | float):
            return float(s["steps_per_sec"])
        wall = self.wall_sec
        return self.steps / wall if wall > 0 else 0.0

    def times(self) -> np.ndarray:
        return np.frombuffer(self.t, dtype=np.float64)

    def own_times(self) -> np.ndarray:
        return np.frombuffer(self.own, dtype=np.float64)


def waited_sec(step_time: float, blocked: float, obj: Mapping[str, Any]) -> float:
    """The time a step waited, as the live straggler detector counts it: its blocked time,
    or the device time of its blocked components when that is more (a NCCL collective
    returns to the host at once and the GPU does the waiting)."""
    on_device = min(_f(obj.get("device_blocked_time_sec")), step_time)
    return on_device if on_device > blocked else blocked


@dataclass
class _FileAcc:
    path: Path
    rank: int | None
    scopes: dict[str, _ScopeAcc] = field(default_factory=dict)
    run_id: str | None = None
    stats: ReadStats = field(default_factory=ReadStats)
    timeline: RunTimeline = field(init=False)

    def __post_init__(self) -> None:
        self.timeline = RunTimeline(self.path, self.rank)

    def read(self) -> None:
        timeline = self.timeline
        for obj in iter_records(self.path, self.stats):
            timeline.add(obj)
            kind = obj.get(rs.TYPE)
            if kind == rs.TYPE_STEP:
                scope = str(obj.get(rs.SCOPE) or "default")
                acc = self.scopes.get(scope)
                if acc is None:
                    acc = self.scopes[scope] = _ScopeAcc(scope)
                acc.add(obj)
            elif kind == rs.TYPE_SESSION:
                scope = str(obj.get(rs.SCOPE) or "default")
                acc = self.scopes.get(scope)
                if acc is None:
                    acc = self.scopes[scope] = _ScopeAcc(scope)
                acc.session = obj
        self.run_id = timeline.run_id
        self.rank = timeline.rank
        if timeline.start_ns is None:
            start = metrics_start_ns(self.path.parent, self.rank)
            if start is not None:
                timeline.start_ns, timeline.start_source = start, "metrics.jsonl header"

    @property
    def n(self) -> int:
        return sum(a.n for a in self.scopes.values())
