"""The goodput ledger engine: every instant of a run, one category.

One implementation of the rules of docs/goodput.md, fed live by the worker
(:class:`otel_tunix.consumers.live_ledger.LiveLedger`: finished steps and components outside the
steps, as they are processed) and offline by the readers
(:mod:`otel_tunix.analysis.timeline`: the lines of a spans file), so ``summary.json``, the
``tunix.run.goodput`` gauge and ``otel-tunix goodput`` cannot disagree.

What it takes (Unix ns throughout):

* **step windows** (:meth:`Ledger.add_step`): a step's host window and its own components,
  classified (``(category, start, end)``: the work the step waited for, on any thread).
  Time in a training step's window that no badput component covers is ``productive``; an
  evaluation scope's step (``eval``, ``val``, ...) is ``evaluation`` as a whole; a step a
  later attempt ran again (``wasted``) is ``wasted_progress`` as a whole. In a run that
  records only some steps, the time between two recorded steps of a scope with steps between
  them ran those steps: it is step time too, and so is the time before its first and after
  its last recorded one (:meth:`Ledger.scope_first`, :meth:`Ledger.scope_last`);
* **components beside the steps** (:meth:`Ledger.add_beside`): components outside any step
  (a restore before the loop, an evaluation between steps) and background work (another
  thread's component open at an edge of a step's window: an asynchronous checkpoint writer).
  They count as their category only where no step window runs: inside one, the step's own
  time stands (training went on beside them). One handed on after the time it covered was
  settled weighs the stretches between steps it covered again;
* **a step's own work past its window** (work it dispatched, still running on the device):
  its category wherever it runs;
* **time of steps that were not recorded** (:meth:`Ledger.add_unsampled`): per category, the
  time the components of unsampled steps spent in a badput category (measured on the hot
  path): it moves from ``productive`` to that category;
* **compilations** (:class:`Compilations`, :attr:`Ledger.compiles`).

The instants no window and no component covers are ``initialization`` before the first step
and ``other`` after it. Where components of several categories are open at one instant, the
first in :data:`otel_tunix.accounting.categories.PRECEDENCE` wins
(:func:`otel_tunix.accounting.categories.categorize_intervals`, the one interval arithmetic).

The time is settled up to a point (:meth:`Ledger.settle`): the feeder says up to where no
later input can reach (the live worker: the start of the oldest step still open; a reader:
the start of the next record in start order); windows and components that end before it are
then dropped, so memory stays with what is still open.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, pairwise
from typing import Any, Final

from otel_tunix.accounting import categories as cat
from otel_tunix.settings.attributes import COMPILE_TRIGGER, LAZY_BACKWARD

__all__ = [
    "COUNTED_COMPILE",
    "Compilations",
    "CompileInfo",
    "Figures",
    "Interval",
    "Ledger",
    "as_figures_json",
    "window_categories",
]

Interval = tuple[str, int, int]
"""``(category, start_ns, end_ns)``: a classified component."""
CompileInfo = tuple[str, str, object, object, object]
"""``(name, category, span_id, parent_id, attributes)`` of a component, for
:class:`Compilations`."""

COUNTED_COMPILE: Final = re.compile(r"compile", re.I)
"""A component of category ``compilation`` whose name matches this (``jax_compile``,
``torch_compile``, ``xla_compile``) is one compilation, unless its parent is one too (the
outermost counts). ``jax_trace`` / ``jax_lower`` (the same compilation's earlier phases) and
``warmup`` are compilation time, not compilations."""

_NS: Final = 1e-9
_WAITS: Final = frozenset(cat.PRECEDENCE[cat.PRECEDENCE.index(cat.PRODUCTIVE) + 1 :])
"""Categories that productive work overlapping them takes over."""
MAX_GAPS: Final = 65536
"""Stretches in no step window kept after they are settled, for components beside the steps
that are handed on after they end (a writer thread's span comes when it ends, long after
the stretch between two steps it covered was settled)."""
MAX_PENDING: Final = 4096
"""Windows kept unsettled while an older step is still open (an RL actor's long step beside
thousands of learner steps); past this the time is settled up to the latest record."""


def window_categories(start: int, end: int, intervals: Sequence[Interval]) -> dict[str, float]:
    """Seconds of a training step's window ``[start, end]`` in each category, from its own
    components: badput ones take their instants (by precedence), productive work overlapping
    a wait takes that over, the rest is ``productive``. A step of productive work only costs
    one pass over its components."""
    productive = cat.PRODUCTIVE
    bad = [iv for iv in intervals if iv[0] != productive]
    if not bad:
        return {productive: max(0, end - start) * _NS}
    waits = [(s0, s1) for k, s0, s1 in bad if k in _WAITS]
    if waits:  # only the productive components that overlap a wait matter
        for iv in intervals:
            if iv[0] == productive and any(iv[1] < w1 and w0 < iv[2] for w0, w1 in waits):
                bad.append(iv)
    return cat.categorize_intervals(start, end, bad, productive)


class _Window:
    """A step window: its own figures (``cats``) and the components they came from
    (``own``: a list, or a function that makes it, read only where windows overlap)."""

    __slots__ = ("cats", "end", "evaluation", "number", "own", "scope", "start", "wasted")

    def __init__(
        self,
        scope: str,
        number: int,
        start: int,
        end: int,
        own: Sequence[Interval] | Callable[[], Sequence[Interval]],
        cats: dict[str, float],
        evaluation: bool = False,
        wasted: bool = False,
    ) -> None:
        self.scope = scope
        self.number = number
        self.start = start
        self.end = max(start, end)
        self.own = own
        self.cats = cats
        self.evaluation = evaluation
        self.wasted = wasted

    def intervals(self) -> Sequence[Interval]:
        own = self.own
        if callable(own):
            own = self.own = own()
        if self.evaluation:
            return [*own, (cat.EVALUATION, self.start, self.end)]
        return own


def _gap_figures(start: int, end: int, rest: str, near: Sequence[Interval]) -> dict[str, float]:
    """A stretch in no step window: ``rest``, unless components beside the steps cover it."""
    if not near:
        return {rest: (end - start) * _NS}
    return cat.categorize_intervals(start, end, near, rest)


@dataclass(slots=True)
class Figures:
    """The ledger so far: wall time, productive seconds, each badput category's seconds,
    each scope's steps' own categories (``productive`` included) and the compilations."""

    wall_time_sec: float = 0.0
    productive_sec: float = 0.0
    badput_sec: dict[str, float] = field(default_factory=lambda: dict.fromkeys(cat.BADPUT, 0.0))
    scopes: dict[str, dict[str, float]] = field(default_factory=dict)
    compilations: int = 0

    @property
    def goodput(self) -> float:
        """``productive_sec`` over the wall time (0 before any time is settled)."""
        return self.productive_sec / self.wall_time_sec if self.wall_time_sec > 0 else 0.0


class Compilations:
    """The compilations a run's components show (docs/goodput.md): one of category
    ``compilation`` named like ``compile`` (:data:`COUNTED_COMPILE`) whose parent is not one
    too (the outermost counts)."""

    __slots__ = ("_ids", "count")

    def __init__(self) -> None:
        self.count = 0
        self._ids: set[object] = set()

    def add(self, components: Iterable[CompileInfo], *, siblings: bool) -> None:
        """Count the compilations among ``(name, category, span_id, parent_id,
        attributes)`` components (``siblings``: one step's, so a parent among them counts
        too). A backward graph compiled lazily
        (:data:`~otel_tunix.settings.attributes.COMPILE_TRIGGER`
        ``lazy_backward``) is time of its frame's compilation, counted already."""
        compiles = [
            c
            for c in components
            if c[1] == cat.COMPILATION and COUNTED_COMPILE.search(c[0]) is not None
        ]
        if not compiles:
            return
        ids = {c[2] for c in compiles} if siblings else ()
        known = self._ids
        for _, _, sid, parent, attrs in compiles:
            lazy = isinstance(attrs, Mapping) and attrs.get(COMPILE_TRIGGER) == LAZY_BACKWARD
            if not lazy and parent not in known and parent not in ids:
                self.count += 1
            if sid is not None:
                known.add(sid)


class Ledger:
    """One run's (one rank's) goodput ledger; see the module docstring.

    Args:
        start_ns: Where the run's wall time starts (the process start); ``None``: at the
            first step (a run on a clock of its own: no initialization then).
        sampled: Whether the run records only some steps (``sampling_rate`` > 1): the time
            between two recorded steps of a scope with steps between them is step time.
    """

    def __init__(self, start_ns: int | None, *, sampled: bool = False) -> None:
        self._start: int | None = start_ns
        self._frontier = start_ns or 0
        self._latest = start_ns or 0
        self.sampled = sampled
        self._first_step: int | None = None
        self._windows: list[_Window] = []
        self._beside: list[Interval] = []
        self._evals: dict[str, bool] = {}
        """Per scope, whether it is an evaluation scope."""
        self._gap_starts: array[int] = array("q")
        self._gap_ends: array[int] = array("q")
        """The latest stretches in no step window that were settled (at most
        :data:`MAX_GAPS`, oldest first; plain numbers: nothing for the garbage collector)."""
        self._gap_near: dict[int, list[Interval]] = {}
        """The components beside the steps that covered some of them, by their start."""
        self._spill: list[Interval] = []
        """The parts of steps' own components past their windows (work a step dispatched,
        still running on the device): their category wherever they run."""
        self._totals: dict[str, float] = {}
        self._scopes: dict[str, dict[str, float]] = {}
        self._unsampled: dict[str, dict[str, float]] = {}
        self._last: dict[str, _Window] = {}
        """Per scope, its latest step window (in the order given)."""
        self._first: dict[str, int] = {}
        """Per scope, its first step window's start."""
        self._front: dict[str, int] = {}
        """Per scope, its first step's start (recorded or not), until its first window."""
        self.compiles = Compilations()

    @property
    def frontier(self) -> int:
        """Time before this is settled (Unix ns)."""
        return self._frontier

    @property
    def latest(self) -> int:
        """The latest end of anything given."""
        return self._latest

    def last_number(self, scope: str) -> int | None:
        """The number of the scope's latest step window given (``None``: none yet)."""
        w = self._last.get(scope)
        return None if w is None else w.number

    @property
    def first_step_ns(self) -> int | None:
        """The start of the first step window given (``None``: none yet)."""
        return self._first_step

    # --- input ------------------------------------------------------------------------

    def add_step(
        self,
        scope: str,
        number: int,
        start: int,
        end: int,
        own: Sequence[Interval] | Callable[[], Sequence[Interval]],
        *,
        cats: dict[str, float] | None = None,
        wasted: bool = False,
    ) -> dict[str, float]:
        """A step window and its own components (or a function making them, with ``cats``,
        its figures alone, already known: only for a step whose components all end inside
        its window); its figures alone are returned (and added to its scope's)."""
        evaluation = self._evals.get(scope)
        if evaluation is None:
            evaluation = self._evals[scope] = cat.is_eval_scope(scope)
        if self._start is None:
            self._start = self._frontier = self._latest = start
        if evaluation:  # an evaluation step is evaluation as a whole
            cats = {cat.EVALUATION: max(0, end - start) * _NS}
        elif cats is None:
            intervals = own() if callable(own) else own
            own = intervals
            cats = window_categories(start, end, intervals)
        if not callable(own):  # work of the step's that ran past its window (on the device)
            for k, s0, s1 in own:
                if s1 > end:
                    self._spill.append((k, max(s0, end), s1))
                    if s1 > self._latest:
                        self._latest = s1
        w = _Window(scope, number, start, end, own, cats, evaluation, wasted)
        if not wasted:
            figures = self._scopes.get(scope)
            if figures is None:
                figures = self._scopes[scope] = {}
            for k, v in cats.items():
                figures[k] = figures.get(k, 0.0) + v
        prev = self._last.get(scope)
        if prev is None:
            self._first[scope] = start
            front = self._front.pop(scope, None)
            if self.sampled and front is not None and front < start:
                self._add_window(_Window(scope, -1, front, start, (), {}, False, wasted))
        elif self.sampled and number - prev.number > 1 and start > prev.end:
            self._add_window(  # the unsampled steps between ran here
                _Window(scope, number - 1, prev.end, start, (), {}, False, wasted)
            )
        self._last[scope] = w
        first = self._first_step  # (_add_window, inline: once a step)
        if first is None or start < first:
            self._first_step = start
        if w.end > self._latest:
            self._latest = w.end
        if w.end > self._frontier or start >= self._frontier:
            self._windows.append(w)
        return cats

    def scope_first(self, scope: str, first_start: int) -> None:
        """A scope's first step's start (recorded or not): in a run that records only some
        steps, the unsampled steps before its first recorded one ran from there (step
        time)."""
        first = self._first.get(scope)
        if first is None:
            self._front[scope] = first_start
        elif self.sampled and first_start < first:
            self._add_window(_Window(scope, -1, first_start, first, (), {}))

    def scope_last(self, scope: str, last_end: int) -> None:
        """A scope's last step's end (recorded or not): in a run that records only some
        steps, the unsampled steps after its last recorded one ran until then."""
        last = self._last.get(scope)
        if self.sampled and last is not None and last_end > last.end:
            self._add_window(_Window(scope, last.number + 1, last.end, last_end, (), {}))

    def _add_window(self, w: _Window) -> None:
        if self._first_step is None or w.start < self._first_step:
            self._first_step = w.start
        if w.end > self._latest:
            self._latest = w.end
        if w.end > self._frontier or w.start >= self._frontier:
            self._windows.append(w)

    def reach(self, end: int) -> None:
        """Something of the run ended at ``end`` (the device completion of the work its
        steps dispatched): the wall time runs to it."""
        if end > self._latest:
            self._latest = end

    def add_beside(self, category: str, start: int, end: int) -> None:
        """A component beside the steps (outside any step, or background work), classified:
        it counts where no step window runs. One of no category of its own (``productive``)
        leaves its stretch to the rest: productive time is a training step's."""
        if self._start is None:
            return  # (a run timed from its first step: nothing before it)
        if end > self._latest:
            self._latest = end
        if category == cat.PRODUCTIVE or end <= start:
            return
        if start < self._frontier:  # handed on late: the stretches it covered, again
            self._late((category, start, end))
        if end > self._frontier:
            self._beside.append((category, start, end))

    def _late(self, iv: Interval) -> None:
        """A component beside the steps that covers settled time: each stretch in no step
        window it overlaps is weighed again with it."""
        starts, ends, totals = self._gap_starts, self._gap_ends, self._totals
        first = self._first_step
        i = len(ends)
        while i and ends[i - 1] > iv[1]:
            i -= 1
        for j in range(i, len(ends)):
            a, b = starts[j], ends[j]
            if a >= iv[2]:
                break
            rest = cat.INITIALIZATION if first is None or b <= first else cat.OTHER
            near = self._gap_near.get(a, [])
            for k, v in _gap_figures(a, b, rest, near).items():
                totals[k] = totals.get(k, 0.0) - v
            near = self._gap_near[a] = [*near, iv]
            for k, v in _gap_figures(a, b, rest, near).items():
                totals[k] = totals.get(k, 0.0) + v

    def add_unsampled(self, scope: str, seconds: Mapping[str, float]) -> None:
        """Per badput category, the time the components of a scope's unsampled steps spent
        in it (taken from the productive time of the steps around them)."""
        acc = self._unsampled.setdefault(scope, {})
        for k, v in seconds.items():
            if k != cat.PRODUCTIVE and k in cat.COMPONENT_CATEGORIES and v > 0:
                acc[k] = acc.get(k, 0.0) + v

    # --- the arithmetic -----------------------------------------------------------------

    def settle(self, upto: int) -> None:
        """Give every instant from the frontier to ``upto`` its category (nothing given
        later may reach before ``upto``)."""
        lo = self._frontier
        if self._start is None:
            return
        if len(self._windows) > MAX_PENDING:
            upto = max(upto, self._latest)
        if upto <= lo:
            return
        windows = sorted(self._windows, key=_start_of)
        beside = sorted(self._beside, key=_second)
        spill = sorted(self._spill, key=_second)
        totals = self._totals
        n = self._tiled(windows, lo, upto)
        if (
            (n == len(windows) or windows[n].start >= upto)
            and (not beside or beside[0][1] >= upto)
            and (not spill or spill[0][1] >= upto)
        ):  # one loop's steps, one by one, and nothing else up to there
            for w in windows[:n]:
                if w.start > lo:
                    self._gap(lo, w.start, ())
                cats = w.cats
                if w.wasted or not cats:
                    self._own(w)
                else:
                    for k, v in cats.items():
                        totals[k] = totals.get(k, 0.0) + v
                lo = w.end
            if upto > lo:
                self._gap(lo, upto, ())
            self._frontier, self._windows = upto, windows[n:]
            return
        points = {lo, upto}
        for w in windows:
            points.update(x for x in (w.start, w.end) if lo < x < upto)
        for _, s0, s1 in chain(beside, spill):
            points.update(x for x in (s0, s1) if lo < x < upto)
        active: list[_Window] = []
        near: list[Interval] = []
        running: list[Interval] = []
        i = j = m = 0
        for a, b in pairwise(sorted(points)):
            while i < len(windows) and windows[i].start <= a:
                active.append(windows[i])
                i += 1
            while j < len(beside) and beside[j][1] <= a:
                near.append(beside[j])
                j += 1
            while m < len(spill) and spill[m][1] <= a:
                running.append(spill[m])
                m += 1
            active = [w for w in active if w.end > a]
            near = [iv for iv in near if iv[2] > a]
            running = [iv for iv in running if iv[2] > a]
            if not active:  # in no step: what components beside cover, else the rest
                self._gap(a, b, [*near, *running] if running else near)
            elif any(w.wasted for w in active):
                totals[cat.WASTED_PROGRESS] = totals.get(cat.WASTED_PROGRESS, 0.0) + (b - a) * _NS
            elif len(active) == 1 and active[0].start == a and active[0].end == b and not running:
                self._own(active[0])  # a step window alone: its own figures
            else:
                intervals: list[Interval] = list(running)
                for w in active:
                    intervals.extend(w.intervals())
                for k, v in cat.categorize_intervals(a, b, intervals).items():
                    totals[k] = totals.get(k, 0.0) + v
        self._frontier = upto
        self._windows = [w for w in windows if w.end > upto]
        self._beside = [iv for iv in beside if iv[2] > upto]
        self._spill = [iv for iv in spill if iv[2] > upto]

    @staticmethod
    def _tiled(windows: list[_Window], lo: int, upto: int) -> int:
        """How many of the windows (in start order) lie one after the other between ``lo``
        and ``upto``: each of those counts with its own figures."""
        for n, w in enumerate(windows):
            if w.start < lo or w.end > upto:
                return n
            lo = w.end
        return len(windows)

    def _own(self, w: _Window) -> None:
        totals = self._totals
        if w.wasted:
            seconds = (w.end - w.start) * _NS
            totals[cat.WASTED_PROGRESS] = totals.get(cat.WASTED_PROGRESS, 0.0) + seconds
            return
        if not w.cats:  # unsampled steps: step time
            totals[cat.PRODUCTIVE] = totals.get(cat.PRODUCTIVE, 0.0) + (w.end - w.start) * _NS
            return
        for k, v in w.cats.items():
            totals[k] = totals.get(k, 0.0) + v

    def _gap(self, a: int, b: int, near: Sequence[Interval]) -> None:
        """``[a, b]`` in no step window: ``initialization`` before the first step, else
        ``other``, unless components beside the steps cover it."""
        first = self._first_step
        rest = cat.INITIALIZATION if first is None or b <= first else cat.OTHER
        totals = self._totals
        starts, ends = self._gap_starts, self._gap_ends
        if len(starts) >= MAX_GAPS:
            cut = starts[MAX_GAPS // 2]
            del starts[: MAX_GAPS // 2], ends[: MAX_GAPS // 2]
            self._gap_near = {k: v for k, v in self._gap_near.items() if k >= cut}
        starts.append(a)
        ends.append(b)
        if not near:
            totals[rest] = totals.get(rest, 0.0) + (b - a) * _NS
            return
        self._gap_near[a] = list(near)
        for k, v in _gap_figures(a, b, rest, near).items():
            totals[k] = totals.get(k, 0.0) + v

    def finish(self, end: int | None = None) -> None:
        """Settle everything given (up to ``end`` if later: a run's last record)."""
        self.settle(max(self._latest, end or 0))

    # --- output -------------------------------------------------------------------------

    def figures(self) -> Figures:
        """The ledger settled so far. The unsampled steps' badput time
        (:meth:`add_unsampled`) moves from productive time to its categories."""
        totals = dict(self._totals)
        scopes = {s: dict(v) for s, v in self._scopes.items()}
        for scope, moved in self._unsampled.items():
            for into in (totals, scopes.setdefault(scope, {})):
                _move(into, moved)
        start = self._start if self._start is not None else self._frontier
        wall = max(0, self._frontier - start) * _NS
        return Figures(
            wall_time_sec=wall,
            productive_sec=totals.get(cat.PRODUCTIVE, 0.0),
            badput_sec={k: totals.get(k, 0.0) for k in cat.BADPUT},
            scopes=scopes,
            compilations=self.compiles.count,
        )


def _move(into: dict[str, float], moved: Mapping[str, float]) -> None:
    """Move ``moved`` seconds from productive time into their categories (no more than
    there is)."""
    for k, v in moved.items():
        v = min(v, into.get(cat.PRODUCTIVE, 0.0))
        if v > 0:
            into[cat.PRODUCTIVE] -= v
            into[k] = into.get(k, 0.0) + v


def _start_of(w: _Window) -> int:
    return w.start


def _second(iv: Interval) -> int:
    return iv[1]


def as_figures_json(f: Figures) -> dict[str, Any]:
    """The figures as ``summary.json``'s ``goodput`` object."""
    return {
        "wall_time_sec": f.wall_time_sec,
        "productive_time_sec": f.productive_sec,
        "goodput": f.goodput,
        "badput_sec": dict(f.badput_sec),
        "scopes": f.scopes,
        "compilations": f.compilations,
    }
