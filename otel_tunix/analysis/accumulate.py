"""Streaming accumulation of a run's spans JSONL files, for ``otel-tunix summary``.

:func:`~otel_tunix.analysis.breakdown.summarize` builds its statistics on what is gathered
here. :class:`_FileAcc` reads one spans file once; per scope, :class:`_ScopeAcc` keeps a handful
of floats per sampled step (step, busy, blocked, idle and each component's time), never
the lines or the spans. :func:`_metrics_start` reads the run's start from the
``metrics.jsonl`` header next to a spans file.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from otel_tunix.analysis import goodput as gp
from otel_tunix.analysis.readers import AnalysisError, ReadStats, iter_records
from otel_tunix.attributes import DEVICE_END

_NS = 1e-9


# --- streaming accumulation -----------------------------------------------------------------


def _f(v: object) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


def _i(v: object) -> int:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0


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
        self.cats: dict[str, float] = {}
        self.first: tuple[int, int, dict[str, float]] | None = None  # start_ns, index, cats
        self.min_start: int | None = None
        self.max_end: int | None = None
        self.session: Mapping[str, Any] | None = None
        self.device_end = 0
        """The latest device completion of any step (0: no device-ended component)."""
        self.device_tail: list[tuple[str, int, int]] = []
        """Device-ended components' time past the host end of their step, classified
        (category, start, end): only those that may outlast the last host step are kept."""

    @property
    def n(self) -> int:
        return len(self.t)

    def add(self, obj: Mapping[str, Any]) -> None:
        start, end = _i(obj.get("start_ns")), _i(obj.get("end_ns"))
        idx = self.n
        self.step_no.append(_i(obj.get("step")))
        step_time, blocked = _f(obj.get("step_time_sec")), _f(obj.get("blocked_time_sec"))
        self.t.append(step_time)
        self.busy.append(_f(obj.get("busy_time_sec")))
        self.blocked.append(blocked)
        self.own.append(step_time - waited_sec(step_time, blocked, obj))
        self.idle.append(_f(obj.get("idle_time_sec")))
        comps = obj.get("components")
        if isinstance(comps, Mapping):
            for name, ct in comps.items():
                if not isinstance(ct, Mapping):
                    continue
                busy, blocked = _f(ct.get("busy_time_sec")), _f(ct.get("blocked_time_sec"))
                if busy or not blocked:
                    self._comp(name, "busy", idx).append(busy)
                if blocked:
                    self._comp(name, "blocked", idx).append(blocked)
        for col in self.comp.values():
            if len(col) <= idx:
                col.append(math.nan)
        spans = obj.get("spans")
        cats = gp.categorize_step(
            self.scope,
            start,
            end,
            [s for s in spans if isinstance(s, Mapping)] if isinstance(spans, list) else (),
        )
        for k, v in cats.items():
            self.cats[k] = self.cats.get(k, 0.0) + v
        if self.first is None or start < self.first[0]:
            self.first = (start, idx, cats)
        self.min_start = start if self.min_start is None else min(self.min_start, start)
        self.max_end = end if self.max_end is None else max(self.max_end, end)
        device_end = _i(obj.get("device_end_ns"))
        if device_end > end and isinstance(spans, list):
            self._device_run_on(end, spans)
        self.device_end = max(self.device_end, device_end)

    def _device_run_on(self, end: int, spans: list[Any]) -> None:
        eval_scope = gp.is_eval_scope(self.scope)
        for s in spans:
            if not isinstance(s, Mapping) or not isinstance(s.get("attributes"), Mapping):
                continue
            s1 = _i(s.get("end_ns"))
            if s["attributes"].get(DEVICE_END) is not True or s1 <= end:
                continue
            name, kind = str(s.get("name", "")), str(s.get("kind", ""))
            cat = gp.EVALUATION if eval_scope else gp.classify_component(name, kind)
            self.device_tail.append((cat, max(_i(s.get("start_ns")), end), s1))
        if len(self.device_tail) > 256:  # what ends before the host's latest end cannot
            last = self.max_end or 0  # outlast the last host step: memory stays bounded
            self.device_tail = [iv for iv in self.device_tail if iv[2] > last]

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
    start_ns: int | None = None
    start_source: str = ""
    run_id: str | None = None
    stats: ReadStats = field(default_factory=ReadStats)

    def read(self) -> None:
        for obj in iter_records(self.path, self.stats):
            kind = obj.get("type")
            if kind == "step":
                scope = str(obj.get("scope") or "default")
                acc = self.scopes.get(scope)
                if acc is None:
                    acc = self.scopes[scope] = _ScopeAcc(scope)
                acc.add(obj)
            elif kind == "session":
                scope = str(obj.get("scope") or "default")
                acc = self.scopes.get(scope)
                if acc is None:
                    acc = self.scopes[scope] = _ScopeAcc(scope)
                acc.session = obj
            elif kind in ("run", "meta"):
                self._run_line(obj)

    def _run_line(self, obj: Mapping[str, Any]) -> None:
        if isinstance(obj.get("start_ns"), int):
            self.start_ns, self.start_source = int(obj["start_ns"]), "spans file header"
        elif isinstance(obj.get("time"), int | float):
            self.start_ns, self.start_source = int(obj["time"] * 1e9), "spans file header"
        resource = obj.get("resource")
        if isinstance(resource, Mapping):
            rid = resource.get("tunix.run.id")
            self.run_id = rid if isinstance(rid, str) and rid else self.run_id
            if self.rank is None:
                r = resource.get("tunix.rank")
                self.rank = r if isinstance(r, int) else None

    @property
    def n(self) -> int:
        return sum(a.n for a in self.scopes.values())


def _metrics_start(folder: Path, rank: int | None) -> int | None:
    """The ``time`` of the ``metrics.jsonl`` header in the folder (the run's configure
    time), if that header is this rank's."""
    for name in ("metrics.jsonl", "metrics.jsonl.gz"):
        p = folder / name
        if not p.is_file():
            continue
        try:
            for obj in iter_records(p):
                if obj.get("type") != "meta" or not isinstance(obj.get("time"), int | float):
                    return None
                meta_rank = obj.get("rank")
                if rank is not None and isinstance(meta_rank, int) and meta_rank != rank:
                    return None
                return int(obj["time"] * 1e9)
        except AnalysisError:
            return None
    return None
