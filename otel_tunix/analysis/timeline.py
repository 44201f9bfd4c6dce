"""One run's time, instant by instant: what the goodput ledger reads from a spans JSONL file.

:class:`RunTimeline` takes a spans file's records one at a time (:meth:`RunTimeline.add`) and
keeps what the ledger needs: the run's start (the ``type: "run"`` header's
``process_start_ns``, else its ``start_ns``), every step's window, every component's interval
with its category (:func:`otel_tunix.categories.classify`, 17 bytes each in arrays), the
compilations and the last record's end. Steps (``type: "step"`` lines), other threads' work
(``type: "span"`` lines) and components outside any step (``type: "span"`` with
``outside: true``) all count; a line cut short by a kill is skipped and counted.

:meth:`RunTimeline.goodput` then gives every instant from the start to the last record one
category, by :func:`otel_tunix.categories.categorize_intervals` (the one interval
arithmetic): inside a training step's window, time no badput component covers is
``productive``; an evaluation step's window is ``evaluation``; before the first step the
rest is ``initialization``, between and after steps ``other``; the windows of steps a later
attempt ran again are ``wasted_progress`` as a whole. docs/goodput.md gives each rule.
"""

from __future__ import annotations

import heapq
import itertools
import re
from array import array
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from otel_tunix import categories as cat
from otel_tunix.analysis.readers import AnalysisError, ReadStats, iter_records
from otel_tunix.attributes import BACKGROUND, KIND_BLOCKED

__all__ = [
    "COUNTED_COMPILE",
    "Goodput",
    "RunTimeline",
    "metrics_start_ns",
    "read_timeline",
]

_NS = 1e-9

COUNTED_COMPILE: Final = re.compile(r"compile", re.I)
"""A component of category ``compilation`` whose name matches this (``jax_compile``,
``torch_compile``, ``xla_compile``) is one compilation, unless its parent is one too (the
outermost counts). ``jax_trace`` / ``jax_lower`` (the same compilation's earlier phases) and
``warmup`` are compilation time, not compilations."""

_CODE: Final = {c: i for i, c in enumerate(cat.PRECEDENCE)}
_EVALUATION_CODE: Final = _CODE[cat.EVALUATION]
_BACKGROUND: Final = 64
"""Added to the code of a background component's interval (another thread's work open at an
edge of a step's window, ``tunix.background`` in its attributes: an asynchronous checkpoint
writer): it counts as its category only where no training step runs; inside a training
step's window the step's own time stands (the training went on beside it)."""

# What each stretch of the run is when no component decides it (``rest`` of
# categorize_intervals); a wasted stretch is wasted_progress whatever ran in it.
_Windows = tuple["array[int]", "array[int]"]
"""Sorted disjoint windows: their starts and their ends."""

_IN_STEP, _BEFORE_FIRST, _BETWEEN, _WASTED = (
    cat.PRODUCTIVE,
    cat.INITIALIZATION,
    cat.OTHER,
    cat.WASTED_PROGRESS,
)


@dataclass(slots=True)
class Goodput:
    """Productive time over wall time, and the badput by category (seconds).

    ``wall_time_sec`` runs from the run's start (its process start where the spans file's
    header has it, else ``configure()``) to its last record: the end of its last step, of a
    component still running then (an asynchronous checkpoint writer) or of the device work
    its steps dispatched (``device_run_on_sec`` past the last host step: an asynchronous
    loop); for a job, the restart gaps between its runs too. Productive time and the badput
    add up to it. Several ranks: their figures are summed (rank-seconds).
    """

    wall_time_sec: float = 0.0
    device_run_on_sec: float = 0.0
    productive_sec: float = 0.0
    badput_sec: dict[str, float] = field(default_factory=lambda: dict.fromkeys(cat.BADPUT, 0.0))
    notes: list[str] = field(default_factory=list)

    @property
    def goodput(self) -> float:
        """``productive_sec`` over the wall time (0 for an empty run)."""
        return self.productive_sec / self.wall_time_sec if self.wall_time_sec > 0 else 0.0

    def share(self, category: str) -> float:
        """A badput category's fraction of the wall time."""
        w = self.wall_time_sec
        return self.badput_sec.get(category, 0.0) / w if w > 0 else 0.0

    def add(self, other: Goodput) -> None:
        """Pool another rank's (or run's) figures into these."""
        self.wall_time_sec += other.wall_time_sec
        self.device_run_on_sec += other.device_run_on_sec
        self.productive_sec += other.productive_sec
        for k, v in other.badput_sec.items():
            self.badput_sec[k] = self.badput_sec.get(k, 0.0) + v
        self.notes.extend(n for n in other.notes if n not in self.notes)

    def to_json(self) -> dict[str, Any]:
        return {
            "wall_time_sec": self.wall_time_sec,
            "device_run_on_sec": self.device_run_on_sec,
            "productive_time_sec": self.productive_sec,
            "goodput": self.goodput,
            "badput_sec": dict(self.badput_sec),
            "badput_share": {k: self.share(k) for k in self.badput_sec},
            "notes": list(self.notes),
        }


def _int(v: object) -> int:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0


class RunTimeline:
    """What one spans file (one rank of one run) says about the run's time; feed it the
    file's records with :meth:`add` (or use :func:`read_timeline`)."""

    def __init__(self, path: Path | None = None, rank: int | None = None) -> None:
        self.path = path
        self.rank = rank
        self.run_id: str | None = None
        self.job_id: str | None = None
        self.attempt: int | None = None
        self.start_ns: int | None = None
        self.start_source = ""
        self.sampling_rate = 1
        self.scopes: list[str] = []
        self._scope_index: dict[str, int] = {}
        # the step windows: scope index, step number, start, end
        self.w_scope: array[int] = array("i")
        self.w_step: array[int] = array("q")
        self.w_start: array[int] = array("q")
        self.w_end: array[int] = array("q")
        # the component intervals: category code (index in PRECEDENCE), start, end
        self.i_code: array[int] = array("b")
        self.i_start: array[int] = array("q")
        self.i_end: array[int] = array("q")
        self.compilations = 0
        self._compile_ids: set[object] = set()
        self.outside_spans = 0
        self.host_end_ns = 0
        self.device_end_ns = 0
        self.last_ns = 0
        self.sessions: dict[str, tuple[int, int]] = {}
        """Per scope, the session line's ``(first_start_ns, last_end_ns)``."""
        self.stats = ReadStats()

    @property
    def steps(self) -> int:
        """Step records read."""
        return len(self.w_step)

    # --- reading -----------------------------------------------------------------------

    def add(self, obj: Mapping[str, Any]) -> None:
        """Take one record of the spans file."""
        kind = obj.get("type")
        if kind == "step":
            self._step(obj)
        elif kind == "span":
            self._loose_span(obj)
        elif kind == "session":
            first, last = _int(obj.get("first_start_ns")), _int(obj.get("last_end_ns"))
            if first and last:
                self.sessions[str(obj.get("scope") or "default")] = (first, last)
            self.last_ns = max(self.last_ns, last)
        elif kind in ("run", "meta"):
            self._header(obj)

    def _header(self, obj: Mapping[str, Any]) -> None:
        if _int(obj.get("process_start_ns")) > 0:
            self.start_ns, self.start_source = int(obj["process_start_ns"]), "process start"
        elif _int(obj.get("start_ns")) > 0:
            self.start_ns, self.start_source = int(obj["start_ns"]), "configure()"
        elif isinstance(obj.get("time"), int | float):
            self.start_ns, self.start_source = int(obj["time"] * 1e9), "configure()"
        rate = obj.get("sampling_rate")
        if isinstance(rate, int) and rate > 1:
            self.sampling_rate = rate
        run_id = obj.get("run_id")
        if isinstance(run_id, str) and run_id:
            self.run_id = run_id
        resource = obj.get("resource")
        if isinstance(resource, Mapping):
            rid = resource.get("tunix.run.id")
            if isinstance(rid, str) and rid:
                self.run_id = self.run_id or rid
            job = resource.get("tunix.job.id")
            if isinstance(job, str | int) and not isinstance(job, bool) and str(job):
                self.job_id = str(job)
            attempt = resource.get("tunix.job.attempt")
            if isinstance(attempt, str) and attempt.isdigit():
                attempt = int(attempt)
            if isinstance(attempt, int) and not isinstance(attempt, bool):
                self.attempt = attempt
            if self.rank is None and isinstance(resource.get("tunix.rank"), int):
                self.rank = resource["tunix.rank"]
        if isinstance(obj.get("job_id"), str) and obj["job_id"]:
            self.job_id = obj["job_id"]
        if isinstance(obj.get("attempt"), int) and not isinstance(obj["attempt"], bool):
            self.attempt = obj["attempt"]

    def _step(self, obj: Mapping[str, Any]) -> None:
        start, end = _int(obj.get("start_ns")), _int(obj.get("end_ns"))
        if end < start or not start:
            return
        scope = str(obj.get("scope") or "default")
        idx = self._scope_index.get(scope)
        if idx is None:
            idx = self._scope_index[scope] = len(self.scopes)
            self.scopes.append(scope)
        self.w_scope.append(idx)
        self.w_step.append(_int(obj.get("step")))
        self.w_start.append(start)
        self.w_end.append(end)
        if cat.is_eval_scope(scope):  # an evaluation step is evaluation as a whole
            self._interval(_EVALUATION_CODE, start, end)
        self.host_end_ns = max(self.host_end_ns, end)
        device_end = _int(obj.get("device_end_ns"))
        self.device_end_ns = max(self.device_end_ns, device_end)
        self.last_ns = max(self.last_ns, end, device_end)
        spans = obj.get("spans")
        if not isinstance(spans, list):
            return
        compiles = []
        for s in spans:
            if isinstance(s, Mapping):
                category = self._component(s, outside=False)
                if category == cat.COMPILATION and COUNTED_COMPILE.search(str(s.get("name"))):
                    compiles.append(s)
        if compiles:
            ids = {s.get("span_id") for s in compiles}
            for s in compiles:
                self._count_compile(s, ids)

    def _loose_span(self, obj: Mapping[str, Any]) -> None:
        outside = obj.get("outside") is True
        self.outside_spans += outside
        category = self._component(obj, outside=outside)
        if category == cat.COMPILATION and COUNTED_COMPILE.search(str(obj.get("name"))):
            self._count_compile(obj, ())

    def _count_compile(self, span: Mapping[str, Any], siblings: Collection[object]) -> None:
        parent = span.get("parent")
        if parent not in self._compile_ids and parent not in siblings:
            self.compilations += 1
        if span.get("span_id") is not None:
            self._compile_ids.add(span.get("span_id"))

    def _component(self, s: Mapping[str, Any], *, outside: bool) -> str | None:
        """Keep one component's interval; its category (``None``: not kept)."""
        s0, s1 = s.get("start_ns"), s.get("end_ns")
        if type(s0) is not int or type(s1) is not int:  # (what the SDK writes: fast path)
            s0, s1 = _int(s0), _int(s1)
        if s1 < s0 or not s0:
            return None
        if s1 > self.last_ns:
            self.last_ns = s1
        name, given = s.get("name", ""), s.get("category")
        category = cat.classify(
            name if type(name) is str else str(name),
            s.get("kind") == KIND_BLOCKED,
            given if type(given) is str else None,
        )
        if outside and category == cat.PRODUCTIVE:
            # Productive time is a training step's: a component outside any step with no
            # category of its own (none declared, no name rule) leaves the stretch to the
            # rest (initialization before the first step, other after it).
            return None
        if s1 > s0:
            attrs = s.get("attributes")
            background = isinstance(attrs, Mapping) and attrs.get(BACKGROUND) is True
            self.i_code.append(_CODE[category] + (_BACKGROUND if background else 0))
            self.i_start.append(s0)
            self.i_end.append(s1)
        return category

    def _interval(self, code: int, s0: int, s1: int) -> None:
        if s1 > s0:
            self.i_code.append(code)
            self.i_start.append(s0)
            self.i_end.append(s1)

    # --- the ledger --------------------------------------------------------------------

    def goodput(
        self, redo: Mapping[str, Sequence[tuple[int, int]]] | None = None
    ) -> tuple[Goodput, int]:
        """This file's figures, and how many of its steps were redone.

        Args:
            redo: Per scope, the step ranges (``(first, last)``) later attempts of the job
                ran: this file's steps in them are ``wasted_progress``.
        """
        g = Goodput()
        first_step = min(self.w_start) if self.w_start else None
        firsts = [x for x in (first_step, min(self.i_start, default=None)) if x is not None]
        if not firsts:
            return g, 0
        start = self.start_ns
        if start is None or start > min(firsts):
            g.notes.append(
                "initialization unknown (no run header with a start, or one later than the "
                "first record): wall time starts at the first record"
            )
            start = min(firsts)
        end = max(self.last_ns, start)
        kept, wasted, redone = self._windows(redo or {}, g)
        regions = _regions(start, end, first_step, kept, wasted)
        totals = self._categorize(regions)
        g.wall_time_sec = (end - start) * _NS
        if self.device_end_ns > self.host_end_ns:
            g.device_run_on_sec = (min(self.device_end_ns, end) - self.host_end_ns) * _NS
        g.productive_sec = totals.pop(cat.PRODUCTIVE, 0.0)
        for k, v in totals.items():
            g.badput_sec[k] = g.badput_sec.get(k, 0.0) + v
        return g, redone

    def _windows(
        self, redo: Mapping[str, Sequence[tuple[int, int]]], g: Goodput
    ) -> tuple[_Windows, _Windows, int]:
        """The step windows kept and wasted, each as their union (unsampled steps between
        sampled ones included with ``sampling_rate`` > 1), and the number of steps wasted."""
        evals = [cat.is_eval_scope(s) for s in self.scopes]

        def is_redone(scope: int, step: int) -> bool:
            if evals[scope]:
                return False
            return any(lo <= step <= hi for lo, hi in redo.get(self.scopes[scope], ()))

        mask = np.zeros(len(self.w_step), dtype=bool)
        if redo:
            for i in range(len(self.w_step)):
                mask[i] = is_redone(self.w_scope[i], self.w_step[i])
        redone = int(mask.sum())
        extra_kept: list[tuple[int, int]] = []
        extra_wasted: list[tuple[int, int]] = []
        if self.sampling_rate > 1 and self.w_step:
            # Between two sampled steps of a scope ran the unsampled ones: step time too.
            by_scope: dict[int, list[int]] = {}
            for i, sc in enumerate(self.w_scope):
                by_scope.setdefault(sc, []).append(i)
            for sc, idx in by_scope.items():
                idx.sort(key=self.w_start.__getitem__)
                for a, b in itertools.pairwise(idx):
                    gap = self.w_step[b] - self.w_step[a] - 1
                    if gap > 0 and self.w_start[b] > self.w_end[a]:
                        w = is_redone(sc, self.w_step[a] + 1)
                        (extra_wasted if w else extra_kept).append((self.w_end[a], self.w_start[b]))
                        redone += gap if w else 0
                session = self.sessions.get(self.scopes[sc])
                if session is not None:  # unsampled steps before the first, after the last
                    extra_kept.append((session[0], self.w_start[idx[0]]))
                    extra_kept.append((self.w_end[idx[-1]], session[1]))
            g.notes.append(
                "sampling_rate > 1: the time between two sampled steps of a scope counts as "
                "step time (the unsampled steps ran there); their components are not seen"
            )
        starts = np.frombuffer(self.w_start, dtype=np.int64)
        ends = np.frombuffer(self.w_end, dtype=np.int64)
        kept = _merge(starts[~mask], ends[~mask], extra_kept)
        wasted = _merge(starts[mask], ends[mask], extra_wasted)
        return kept, wasted, redone

    def _categorize(self, regions: Iterable[tuple[int, int, str]]) -> dict[str, float]:
        """Seconds per category over the regions, each by the components open in it
        (background components not inside training steps)."""
        totals: dict[str, float] = {}
        active: list[tuple[str, int, int, bool]] = []
        pending = self._sorted_intervals()
        nxt = next(pending, None)
        for a, b, label in regions:
            while nxt is not None and nxt[1] < b:
                active.append(nxt)
                nxt = next(pending, None)
            if label == _WASTED:
                totals[label] = totals.get(label, 0.0) + (b - a) * _NS
                continue
            active = [iv for iv in active if iv[2] > a]
            counted = [iv[:3] for iv in active if iv[1] < b and not (iv[3] and label == _IN_STEP)]
            if not counted:
                totals[label] = totals.get(label, 0.0) + (b - a) * _NS
                continue
            for k, v in cat.categorize_intervals(a, b, counted, rest=label).items():
                totals[k] = totals.get(k, 0.0) + v
        return totals

    def _sorted_intervals(self) -> Iterator[tuple[str, int, int, bool]]:
        """The intervals by start (category, start, end, background), made into tuples a
        block at a time (memory stays at the arrays' 17 bytes an interval and numpy's sort
        order)."""
        starts = np.frombuffer(self.i_start, dtype=np.int64)
        ends = np.frombuffer(self.i_end, dtype=np.int64)
        codes = np.frombuffer(self.i_code, dtype=np.int8)
        order = starts.argsort(kind="stable")
        names = cat.PRECEDENCE
        for k in range(0, len(order), 4096):
            idx = order[k : k + 4096]
            for c, s0, s1 in zip(
                codes[idx].tolist(), starts[idx].tolist(), ends[idx].tolist(), strict=True
            ):
                yield names[c % _BACKGROUND], s0, s1, c >= _BACKGROUND


def _merge(starts: np.ndarray, ends: np.ndarray, more: list[tuple[int, int]]) -> _Windows:
    """The union of windows (and ``more``), as sorted disjoint intervals: two arrays of
    8 bytes an interval, for a run of any length."""
    if more:
        starts = np.concatenate([starts, np.array([w[0] for w in more], dtype=np.int64)])
        ends = np.concatenate([ends, np.array([w[1] for w in more], dtype=np.int64)])
    keep = ends > starts
    s, e = starts[keep], ends[keep]
    if not len(s):
        return array("q"), array("q")
    order = s.argsort(kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    first = np.flatnonzero(np.concatenate([[True], s[1:] > reach[:-1]]))
    last = np.concatenate([first[1:] - 1, [len(s) - 1]])
    return array("q", s[first].tobytes()), array("q", reach[last].tobytes())


def _regions(
    start: int, end: int, first_step: int | None, kept: _Windows, wasted: _Windows
) -> Iterator[tuple[int, int, str]]:
    """``[start, end]`` cut into stretches labelled by what they are when no component
    decides: wasted, in a step, before the first step, between steps (made as they are
    walked: memory stays with the windows)."""
    (ks, ke), (ws, we) = kept, wasted
    edges = heapq.merge(
        (x for i in range(len(ks)) for x in (ks[i], ke[i])),
        (x for i in range(len(ws)) for x in (ws[i], we[i])),
        () if first_step is None else (first_step,),
    )
    ki = wi = 0
    a = start
    run: tuple[int, int, str] | None = None
    for b in itertools.chain((x for x in edges if start < x < end), (end,)):
        if b <= a:
            continue
        while ki < len(ks) and ke[ki] <= a:
            ki += 1
        while wi < len(ws) and we[wi] <= a:
            wi += 1
        if wi < len(ws) and ws[wi] <= a:
            label = _WASTED
        elif ki < len(ks) and ks[ki] <= a:
            label = _IN_STEP
        elif first_step is None or a < first_step:
            label = _BEFORE_FIRST
        else:
            label = _BETWEEN
        if run is not None and run[2] == label:
            run = (run[0], b, label)
        else:
            if run is not None:
                yield run
            run = (a, b, label)
        a = b
    if run is not None:
        yield run


def read_timeline(path: Path, rank: int | None = None) -> RunTimeline:
    """Read one spans file (plain or gzip) into a :class:`RunTimeline`; a run without a
    start in its header starts at its ``metrics.jsonl`` header, if that is this rank's."""
    t = RunTimeline(path, rank)
    for obj in iter_records(path, t.stats):
        t.add(obj)
    if t.start_ns is None:
        start = metrics_start_ns(path.parent, t.rank)
        if start is not None:
            t.start_ns, t.start_source = start, "metrics.jsonl header"
    return t


def metrics_start_ns(folder: Path, rank: int | None) -> int | None:
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
