"""The live goodput ledger: ``tunix.run.goodput`` and ``tunix.run.badput_time`` while the
run goes on.

:class:`LiveLedger` takes the finished steps from the span builder (on otel-tunix's worker
thread) and gives every instant of the run, from the process's start
(:func:`otel_tunix._process.process_start_ns`) to the latest record processed, one category of
:mod:`otel_tunix.categories`, by the rules written there (and in docs/goodput.md):

* inside a training step's window, what its components (on any thread, background work
  included) cover is theirs, by :data:`~otel_tunix.categories.PRECEDENCE`; the rest is
  ``productive``; an evaluation scope's steps (``eval``, ``val``, ...) are ``evaluation``
  as a whole;
* before the first step: ``initialization``, unless a component of a category that comes
  first covers it (a ``checkpoint_restore`` before the loop);
* in no step at all: ``other``, unless a component outside the steps covers it
  (:meth:`LiveLedger.on_outside_spans`);
* where steps overlap (an RL actor's steps beside the learner's, a trainer's steps inside a
  global step), the instant takes every open step's components at once: a learner waiting
  for rollouts while the actor computes one costs nothing, while the actor idles it is
  ``rollout_wait``;
* in a run that records only some steps (``sampling_rate`` > 1), the time between two
  recorded steps of a scope that ran steps between them (and after its last recorded one,
  up to its last step) counts as the scope's recorded steps did.

The arithmetic of a window is :func:`otel_tunix.categories.categorize_intervals`, once per
step window (or per piece of one, where windows overlap). The time is settled up to the
start of the oldest step still open (a step can only add to time it covers) and to the
latest record of the batch before (components outside the steps, handed on with a later
batch, still count): the live figures trail the run by one batch of steps.

The figures go out as observable instruments (read at each metric export: no work on the
worker), as MetricsLogger scalars (``goodput``, ``productive_time_sec``,
``badput_time/<category>``, every 100 training steps and when the run ends) and in
``summary.json`` (``goodput``), with each scope's own steps apart (``scopes``: the
categories of each step's window alone, so an RL learner's ``rollout_wait`` and
``weight_sync`` show there whatever its actor did meanwhile).
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Sequence
from itertools import pairwise
from typing import Any, Final

from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from otel_tunix import categories as cat
from otel_tunix import record_schema as rs
from otel_tunix._process import process_start_ns
from otel_tunix._version import __version__
from otel_tunix.logging_backend import PERF_SOURCE
from otel_tunix.metrics.catalog import by_otel_name
from otel_tunix.metrics.instruments import METER_SCOPE, create_observable, observable
from otel_tunix.pipeline.outside import OutsideSpan
from otel_tunix.pipeline.span_builder import FinishedStep, StepSpanProcessor

__all__ = [
    "BADPUT_TIME",
    "FIRST_STEP",
    "GOODPUT",
    "LOG_BADPUT",
    "LOG_GOODPUT",
    "LOG_PRODUCTIVE",
    "LiveLedger",
    "ledger_meter",
    "observe",
]

GOODPUT = "tunix.run.goodput"
"""The gauge: productive time over the wall time since the process started (0..1)."""
BADPUT_TIME = "tunix.run.badput_time"
"""The counter: seconds of each badput category (attribute ``category``)."""
LOG_GOODPUT = "goodput"
"""MetricsLogger name of the gauge's value."""
LOG_PRODUCTIVE = "productive_time_sec"
"""MetricsLogger name of the productive seconds so far."""
LOG_BADPUT = "badput_time/"
"""MetricsLogger prefix of each category's seconds (``badput_time/data_stall``)."""
LOG_EVERY_STEPS = 100
"""The scalars are logged each time the training steps' number passes a multiple of this
(and when the run ends): as many records for a run of a given length, however fast."""
MAX_PENDING = 4096
"""Step windows kept while an older step is still open (an RL actor's long step beside
thousands of learner steps); past this the time is settled up to the latest record."""
FIRST_STEP = -1
"""``LiveLedger(start_ns=FIRST_STEP)``: the wall time starts at the first step."""
_NS = 1e-9
_CATEGORY = "category"
_RECORDED_CATEGORY = operator.itemgetter(rs.I_CATEGORY)
"""A recorded component's goodput category (``None``: none given or declared then)."""


class _Window:
    """A step window (``rest``: what its uncovered time is) or a component outside the steps
    (``rest`` ``None``), Unix ns."""

    __slots__ = ("cats", "end", "number", "rest", "sampled", "scope", "source", "start")

    def __init__(
        self,
        start: int,
        end: int,
        rest: str | None,
        source: Any,
        cats: dict[str, float] | None,
    ) -> None:
        self.start = start
        self.end = end
        self.rest = rest
        self.scope = ""
        self.number = 0
        self.sampled = False
        """Whether the run records only some steps (``sampling_rate`` > 1)."""
        self.source = source
        """Where its intervals come from: a list of them, or (a step's) ``(components,
        ends, offset, background)``, read only where windows overlap."""
        self.cats = cats
        """The window's categories alone (a step's; ``None`` for an outside component)."""

    def intervals(self) -> list[tuple[str, int, int]]:
        """Its components as ``(category, start, end)``, Unix ns."""
        source = self.source
        if isinstance(source, list):
            return source
        components, ends, off, background = source
        classify = cat.classify
        out = [
            (classify(c[0], c[1], c[rs.I_CATEGORY]), c[4] + off, e + off)
            for c, e in zip(components, ends, strict=True)
        ]
        for name, blocked, b0, b1, _, category in background or ():
            out.append((classify(name, blocked, category), b0 + off, b1 + off))
        if self.rest == cat.EVALUATION:
            out.append((cat.EVALUATION, self.start, self.end))
        return out


_BELOW_PRODUCTIVE: Final = frozenset(cat.PRECEDENCE[cat.PRECEDENCE.index(cat.PRODUCTIVE) + 1 :])
"""Categories that productive work overlapping them takes over (the waits)."""


def _step_window(step: FinishedStep) -> tuple[str, _Window]:
    """A finished step as a window, with its categories alone: its components (its own and
    other threads' work overlapping it) classified; only the badput ones, and the productive
    ones overlapping a wait, go to :func:`~otel_tunix.categories.categorize_intervals`
    (the others change nothing: the window's uncovered time is productive too)."""
    start, end = step.start_ns, step.end_ns
    seconds = max(0, end - start) * _NS
    off = step.offset
    components, ends, background = step.components, step.ends, step.background
    source = (components, ends, off, background)
    if cat.is_eval_scope(step.scope):
        return step.scope, _Window(start, end, cat.EVALUATION, source, {cat.EVALUATION: seconds})
    beside = background is not None
    if beside:
        # Background work (another thread's component open at an edge of the window: an
        # asynchronous checkpoint writer) does not take a training step's time: training
        # went on beside it (docs/goodput.md; the offline ledger's rule too).
        own = step.background_ids or ()
        kept = [i for i, c in enumerate(components) if c[2] not in own]
        if len(kept) < len(components):
            components, ends = [components[i] for i in kept], [ends[i] for i in kept]
        background = None
        source = (components, ends, off, None)
    classify, productive = cat.classify, cat.PRODUCTIVE
    # First by name, from the accounting's per-name times (a name used ten times in the step
    # is looked at once). The usual steps: productive work only, or productive work and
    # waits of one kind (a blocked data load): the wait's category is then the time the
    # accounting found a blocked component open and no busy one (busy work is productive,
    # and productive work over a wait takes it over), the rest productive.
    summary = step.summary
    wait: str | None = None
    for name, (busy, blocked, _) in summary.component_times.items():
        if busy and classify(name, False) != productive:
            break
        if blocked:  # (a blocked component declared productive: weighed below)
            kind = classify(name, True)
            if kind not in _BELOW_PRODUCTIVE or (wait is not None and kind != wait):
                break
            wait = kind
    else:
        if wait is None and not any(map(_RECORDED_CATEGORY, components)):
            return step.scope, _Window(start, end, productive, source, {productive: seconds})
        # (the accounting's blocked time would hold background waits; a component recorded
        # with a category of its own is classified one by one below, not by its name)
        if wait is not None and not beside and not any(map(_RECORDED_CATEGORY, components)):
            waited = summary.blocked_time_sec
            cats = {wait: waited, productive: seconds - waited}
            return step.scope, _Window(start, end, productive, source, cats)
    bad = [
        (kind, comp[4] + off, c_end + off)
        for comp, c_end in zip(components, ends, strict=True)
        if (kind := classify(comp[0], comp[1], comp[rs.I_CATEGORY])) != productive
    ]
    if not bad:  # only productive work, or none
        return step.scope, _Window(start, end, productive, source, {productive: seconds})
    waits = [(s0, s1) for k, s0, s1 in bad if k in _BELOW_PRODUCTIVE]
    if waits:  # productive work over a wait takes it over
        for kind, s0, s1 in _overlapping(source, waits):
            if kind == productive:
                bad.append((kind, s0, s1))
    cats = cat.categorize_intervals(start, end, bad, productive)
    return step.scope, _Window(start, end, productive, source, cats)


def _overlapping(source: Any, waits: list[tuple[int, int]]) -> list[tuple[str, int, int]]:
    """The components of a step (``_Window.source``) that overlap one of ``waits``,
    classified (only those: most of a step's components overlap none)."""
    components, ends, off, _ = source  # (a training step's: no background work)
    out = []
    for c, e in zip(components, ends, strict=True):
        s0, s1 = c[4] + off, e + off
        for w0, w1 in waits:
            if s0 < w1 and w0 < s1:
                out.append((cat.classify(c[0], c[1], c[rs.I_CATEGORY]), s0, s1))
                break
    return out


class LiveLedger(StepSpanProcessor):
    """The run's goodput ledger, kept as its steps are processed.

    Args:
        logger: The run's MetricsLogger (``None``: no scalars).
        start_ns: Where the run's wall time starts (Unix ns; default: the process's start;
            ``FIRST_STEP``: at the first step, for a run on a clock of its own, whose times
            are not Unix time: no initialization then).
        log_every_steps: The scalars are logged each time the training steps' number passes
            a multiple of this (and when the run ends).
    """

    def __init__(
        self,
        logger: Any = None,
        *,
        start_ns: int | None = None,
        log_every_steps: int = LOG_EVERY_STEPS,
    ) -> None:
        self._logger = logger
        self._log_every = max(1, log_every_steps)
        self._from_first_step = start_ns == FIRST_STEP
        self._start = process_start_ns() if start_ns is None else start_ns
        self._frontier = self._start
        """Time before this is settled (Unix ns)."""
        self._first_step: int | None = None
        self._latest = self._start
        """The latest end of anything received."""
        self._reached = self._start
        """``_latest`` when the previous batch of steps came: settled up to there."""
        self._pending: list[_Window] = []
        self._prev: _Window | None = None
        """The step window settled last."""
        self._runtime: tuple[Any, int] | None = None
        """The steps' runtime (its counts of every step, recorded or not) and offset."""
        self._totals: dict[str, float] = {}
        self._scopes: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        self._logged_at = 0
        """The step number the scalars were last logged at."""
        self._last_number: int | None = None
        self._closed = False

    # --- input ------------------------------------------------------------------------

    def on_finished_steps(self, steps: Sequence[FinishedStep]) -> None:
        """A batch of finished steps (worker thread): their windows, then the time settled
        up to the oldest step still open."""
        if self._closed or not steps:
            return
        hold = _oldest_open(steps[-1])
        with self._lock:
            for step in steps:
                scope, window = _step_window(step)
                assert window.cats is not None
                window.scope, window.number = scope, step.number
                window.sampled = step.record.runtime.sampling_rate > 1
                own = self._scopes.get(scope)
                if own is None:
                    own = self._scopes[scope] = {}
                for k, v in window.cats.items():
                    own[k] = own.get(k, 0.0) + v
                self._add(window)
            for step in reversed(steps):  # the scalars' step: the latest training step's
                if not cat.is_eval_scope(step.scope):
                    self._last_number = step.number
                    break
            self._runtime = (steps[-1].record.runtime, steps[-1].offset)
            # Up to what the batch before this one reached: components outside the steps
            # that the recording layer hands on with (or after) this batch still count.
            self._settle(min(hold, self._reached))
            self._reached = self._latest
        self._maybe_log()

    def on_outside_spans(self, spans: Sequence[OutsideSpan]) -> None:
        """Components recorded outside any step (a restore before the loop, an evaluation
        or a checkpoint between steps), as the span builder hands each ended record on."""
        self._add_outside([(s.name, s.blocked, s.start_ns, s.end_ns, s.category) for s in spans])

    def add_outside(
        self, name: str, blocked: bool, start_ns: int, end_ns: int, category: str | None = None
    ) -> None:
        """One component outside any step (see :meth:`on_outside_spans`), Unix ns."""
        self._add_outside([(name, blocked, start_ns, end_ns, category)])

    def _add_outside(self, components: list[tuple[str, bool, int, int, str | None]]) -> None:
        """Each counts where no step covers its time, and beside the steps' components where
        one does, by its category (:func:`otel_tunix.categories.classify`). One with no
        category of its own (none declared, no name rule: a busy ``prepare``) leaves its
        stretch to the rest: productive time is a training step's (as offline)."""
        if self._closed:
            return
        with self._lock:
            for name, blocked, start, end, category in components:
                kind = cat.classify(name, blocked, category)
                if kind != cat.PRODUCTIVE:
                    self._add(_Window(start, end, None, [(kind, start, end)], None))

    def _add(self, window: _Window) -> None:
        if self._from_first_step and self._first_step is None and window.rest is not None:
            self._start = self._frontier = self._latest = self._reached = window.start
        if window.end <= self._frontier:  # settled already (a record that came late)
            return
        if window.rest is not None and self._first_step is None:
            self._first_step = window.start
        self._pending.append(window)
        if window.end > self._latest:
            self._latest = window.end

    # --- the arithmetic -----------------------------------------------------------------

    def _settle(self, upto: int) -> None:
        """Give every instant from the frontier to ``upto`` its category."""
        if len(self._pending) > MAX_PENDING:
            upto = self._latest
        lo = self._frontier
        if upto <= lo:
            return
        first = self._first_step
        totals = self._totals
        pending = sorted(self._pending, key=_start_of)
        prev = self._prev
        n = self._tiled(pending, lo, upto)
        if n == len(pending) or pending[n].start >= upto:  # one loop's steps, one by one
            self._pending = pending[n:]
            for w in pending[:n]:
                if w.start > lo:
                    self._gap(lo, w.start, prev, w)
                for k, v in w.cats.items():  # type: ignore[union-attr]
                    totals[k] = totals.get(k, 0.0) + v
                lo = w.end
                prev = w
            if upto > lo:
                self._gap(lo, upto, prev, pending[n] if n < len(pending) else None)
            self._frontier, self._prev = upto, prev
            return
        points = {lo, upto}
        for w in pending:
            if lo < w.start < upto:
                points.add(w.start)
            if lo < w.end < upto:
                points.add(w.end)
        cuts = sorted(points)
        active: list[_Window] = []
        i = 0
        for a, b in pairwise(cuts):
            while i < len(pending) and pending[i].start <= a:
                active.append(pending[i])
                i += 1
            for w in active:
                if w.end <= a and w.cats is not None and (prev is None or w.end >= prev.end):
                    prev = w  # the step that ended last before this piece
            active = [w for w in active if w.end > a]
            if not active:  # in no step, no component
                nxt = pending[i] if i < len(pending) and pending[i].start == b else None
                self._gap(a, b, prev, nxt)
                continue
            own = active[0].cats if len(active) == 1 else None
            if own is not None and active[0].start == a and active[0].end == b:
                for k, v in own.items():  # a step window alone: its own figures
                    totals[k] = totals.get(k, 0.0) + v
                continue
            self._weigh(a, b, active, first)
        for w in active:
            if w.end <= upto and w.cats is not None and (prev is None or w.end >= prev.end):
                prev = w
        self._frontier, self._prev = upto, prev
        self._pending = [w for w in pending if w.end > upto]

    def _tail(self) -> None:
        """In a run that records only some steps: the steps after the last recorded one
        (the runtime counts every step) ran until the latest end of their scope; that time
        counts as the scope's recorded steps did."""
        prev = self._prev
        if self._runtime is None or prev is None or not prev.sampled:
            return
        runtime, off = self._runtime
        counts = runtime.scopes.get(prev.scope)
        end = counts.last_end_ns + off if counts is not None and counts.last_end_ns else 0
        if end <= self._frontier:
            return
        tail = _Window(end, end, cat.PRODUCTIVE, [], {})
        tail.scope, tail.number, tail.sampled = prev.scope, prev.number + 2, True
        self._gap(self._frontier, end, prev, tail)
        self._frontier = end

    def _gap(self, a: int, b: int, prev: _Window | None, nxt: _Window | None) -> None:
        """Time in no step window and no component: ``initialization`` before the first
        step, else ``other``; but in a run that records only some steps, the time between
        two recorded steps of a scope with steps between them ran those steps: it counts as
        the scope's recorded steps did (their categories' shares so far)."""
        totals, seconds = self._totals, (b - a) * _NS
        first = self._first_step
        if first is None or b <= first:
            totals[cat.INITIALIZATION] = totals.get(cat.INITIALIZATION, 0.0) + seconds
            return
        if (
            prev is not None
            and nxt is not None
            and nxt.sampled
            and nxt.scope == prev.scope
            and nxt.cats is not None
            and nxt.number - prev.number > 1
        ):
            shares = self._scopes.get(nxt.scope)
            whole = sum(shares.values()) if shares else 0.0
            if shares and whole > 0:
                for k, v in shares.items():
                    totals[k] = totals.get(k, 0.0) + seconds * v / whole
                return
        totals[cat.OTHER] = totals.get(cat.OTHER, 0.0) + seconds

    @staticmethod
    def _tiled(pending: list[_Window], lo: int, upto: int) -> int:
        """How many of the windows (in start order) are steps' that lie one after the other
        between ``lo`` and ``upto``: each of those counts with its own figures, no
        weighing."""
        for n, w in enumerate(pending):
            if w.cats is None or w.start < lo or w.end > upto:
                return n
            lo = w.end
        return len(pending)

    def _weigh(self, a: int, b: int, active: list[_Window], first: int | None) -> None:
        """The piece ``[a, b]`` under several windows (or part of one), by
        :func:`~otel_tunix.categories.categorize_intervals`."""
        rests = {w.rest for w in active}
        intervals: list[tuple[str, int, int]] = []
        for w in active:
            intervals.extend(w.intervals())
        if cat.PRODUCTIVE in rests:
            rest = cat.PRODUCTIVE
        elif cat.EVALUATION in rests:
            rest = cat.EVALUATION
        elif first is None or b <= first:  # before the first step: initialization first
            rest = cat.INITIALIZATION
            intervals.append((cat.INITIALIZATION, a, b))
        else:
            rest = cat.OTHER
        totals = self._totals
        for k, v in cat.categorize_intervals(a, b, intervals, rest).items():
            totals[k] = totals.get(k, 0.0) + v

    # --- output -------------------------------------------------------------------------

    def figures(self) -> dict[str, Any]:
        """The ledger so far: ``wall_time_sec`` (process start to the time settled),
        ``productive_time_sec``, ``goodput``, ``badput_sec`` (every category of
        :data:`~otel_tunix.categories.BADPUT`) and ``scopes`` (each scope's steps' own
        categories, ``productive`` included)."""
        with self._lock:
            totals = dict(self._totals)
            wall = max(0, self._frontier - self._start) * _NS
            scopes = {s: dict(v) for s, v in self._scopes.items()}
        productive = totals.get(cat.PRODUCTIVE, 0.0)
        return {
            "wall_time_sec": wall,
            "productive_time_sec": productive,
            "goodput": productive / wall if wall > 0 else 0.0,
            "badput_sec": {k: totals.get(k, 0.0) for k in cat.BADPUT},
            "scopes": scopes,
        }

    def scalars(self) -> dict[str, float]:
        """The figures as MetricsLogger scalars."""
        f = self.figures()
        out = {LOG_GOODPUT: f["goodput"], LOG_PRODUCTIVE: f["productive_time_sec"]}
        for k, v in f["badput_sec"].items():
            out[LOG_BADPUT + k] = v
        return out

    def _maybe_log(self, force: bool = False) -> None:
        logger = self._logger
        if logger is None or not logger.active or self._first_step is None:
            return  # nothing to tell before the first step
        number = self._last_number
        if not force:
            if number is None or number // self._log_every <= self._logged_at // self._log_every:
                return
            self._logged_at = number
        # As the perf/... rows: a fixed set of names, not counted against the bound on the
        # names a program logs (OTEL_TUNIX_MAX_METRIC_NAMES).
        logger.log_rows(((self._last_number, self.scalars()),), source=PERF_SOURCE)

    def finish(self) -> None:
        """The run ends (every step processed): the rest settled, the scalars logged."""
        if self._closed:
            return
        with self._lock:
            self._settle(self._latest)
            self._tail()
        self._maybe_log(force=True)
        self._closed = True

    def shutdown(self) -> None:
        return None


def _start_of(w: _Window) -> int:
    return w.start


def _oldest_open(step: FinishedStep) -> int:
    """The start (Unix ns) of the oldest sampled step still open (no limit: none is)."""
    open_steps = list(step.record.runtime.open_steps)
    if not open_steps:
        return 1 << 62
    return min(r.start_ns for r in open_steps) + step.offset


def ledger_meter(meter_provider: MeterProvider) -> Meter:
    """The meter of the ledger's instruments (the catalog's scope)."""
    return meter_provider.get_meter(METER_SCOPE, __version__)


def observe(meter: Meter, ledger: LiveLedger | None) -> None:
    """``tunix.run.goodput`` and ``tunix.run.badput_time`` reading ``ledger`` at each metric
    export (``None``: nothing to report, the run has ended)."""
    if ledger is None:
        for name in (GOODPUT, BADPUT_TIME):
            spec = by_otel_name(name)
            observable(meter, spec.instrument, name, None)
        return

    def goodput(_: CallbackOptions) -> list[Observation]:
        f = ledger.figures()
        return [Observation(f["goodput"])] if f["wall_time_sec"] > 0 else []

    def badput(_: CallbackOptions) -> list[Observation]:
        f = ledger.figures()
        return [
            Observation(v, {_CATEGORY: k}) for k, v in f["badput_sec"].items() if math.isfinite(v)
        ]

    create_observable(meter, by_otel_name(GOODPUT), goodput)
    create_observable(meter, by_otel_name(BADPUT_TIME), badput)
