"""The live goodput ledger: ``tunix.run.goodput`` and ``tunix.run.badput_time`` while the
run goes on.

:class:`LiveLedger` feeds the one ledger engine (:class:`otel_tunix.accounting.ledger.Ledger`, whose
module docstring and docs/goodput.md give the rules) from the worker thread: each finished
step's window and its own components, background work and components outside the steps
(counted where no step runs), the badput time of the steps that were not sampled (measured
on the hot path) and the device completion of the steps' work. ``otel-tunix goodput`` feeds
the same engine from the spans file, so the two agree.

The time is settled up to the start of the oldest step still open (a step can only add to
time it covers) and to the latest record of the batch before (components outside the steps,
handed on with a later batch, still count): the live figures trail the run by one batch of
steps.

The figures go out as observable instruments (read at each metric export: no work on the
worker), as MetricsLogger scalars (``goodput``, ``productive_time_sec``,
``badput_time/<category>``, every 100 training steps and when the run ends) and in
``summary.json`` (``goodput``), with each scope's own steps apart (``scopes``: the
categories of each step's window alone, so an RL learner's ``rollout_wait`` and
``weight_sync`` show there whatever its actor did meanwhile).
"""

from __future__ import annotations

import functools
import math
import operator
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from otel_tunix.accounting import categories as cat
from otel_tunix.accounting.ledger import Interval, Ledger, as_figures_json
from otel_tunix.logger.backend import PERF_SOURCE
from otel_tunix.logger.instruments import METER_SCOPE, create_observable, observable
from otel_tunix.model import record as rs
from otel_tunix.model.catalog import by_otel_name
from otel_tunix.pipeline.background import BackgroundSpan
from otel_tunix.pipeline.outside import OutsideSpan
from otel_tunix.pipeline.span_builder import FinishedStep
from otel_tunix.pipeline.step_sinks import StepSink
from otel_tunix.recording.records import ComponentStart
from otel_tunix.settings.version import __version__
from otel_tunix.support.process import process_start_ns

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
FIRST_STEP = -1
"""``LiveLedger(start_ns=FIRST_STEP)``: the wall time starts at the first step."""
_NS = 1e-9
_CATEGORY = "category"
_RECORDED_CATEGORY = operator.itemgetter(rs.I_CATEGORY)
"""A recorded component's goodput category (``None``: none given or declared then)."""
_WAITS = frozenset(cat.PRECEDENCE[cat.PRECEDENCE.index(cat.PRODUCTIVE) + 1 :])
"""Categories that productive work overlapping them takes over."""


def _own(
    components: Sequence[ComponentStart], ends: Sequence[int], off: int, bg: Any
) -> list[Interval]:
    """A step's own components, classified (its background work, span ids ``bg``, apart:
    that counts beside the steps), Unix ns."""
    classify = cat.classify
    return [
        (classify(c[0], c[1], c[rs.I_CATEGORY]), c[4] + off, e + off)
        for c, e in zip(components, ends, strict=True)
        if bg is None or c[2] not in bg
    ]


def _shortcut(step: FinishedStep) -> dict[str, float] | None:
    """The usual step's figures from the accounting's per-name times, without interval
    arithmetic (``None``: weigh its components): productive work only (every busy name
    productive, no blocked one), or productive work and waits of one kind (a blocked data
    load: the wait's category then has the time the accounting found a blocked component
    open and no busy one, as productive work over a wait takes it over)."""
    summary = step.summary
    if step.background_ids is not None or summary.device_end_ns > step.end_ns:
        return None  # (background work, or work that ran on past the window: weighed)
    if any(map(_RECORDED_CATEGORY, step.components)):
        return None  # (a category recorded with a component, not its name's: weighed)
    classify, productive = cat.classify, cat.PRODUCTIVE
    wait: str | None = None
    for name, (busy, blocked, _) in summary.component_times.items():
        if busy and classify(name, False) != productive:
            return None
        if blocked:
            kind = classify(name, True)
            if kind not in _WAITS or (wait is not None and kind != wait):
                return None
            wait = kind
    seconds = max(0, step.end_ns - step.start_ns) * _NS
    if wait is None:
        return {productive: seconds}
    waited = summary.blocked_time_sec
    return {wait: waited, productive: seconds - waited}


class LiveLedger(StepSink):
    """The run's goodput ledger, kept as its steps are processed: the worker's feed of the
    one engine (:class:`otel_tunix.accounting.ledger.Ledger`).

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
        start = None if start_ns == FIRST_STEP else start_ns
        self._engine = Ledger(process_start_ns() if start_ns is None else start)
        self._reached = self._engine.latest
        """The latest end when the previous batch of steps came: settled up to there."""
        self._runtime: tuple[Any, int] | None = None
        """The steps' runtime (its counts of every step, recorded or not) and offset."""
        self._lock = threading.Lock()
        self._logged_at = 0
        """The step number the scalars were last logged at."""
        self._last_number: int | None = None
        self._seen: set[str] = set()
        """The scopes whose first step was handed to the engine."""
        self._closed = False

    # --- input ------------------------------------------------------------------------

    def on_finished_steps(self, steps: Sequence[FinishedStep]) -> None:
        """A batch of finished steps (worker thread): their windows, then the time settled
        up to the oldest step still open and what the batch before reached (components
        beside the steps, handed on with a later batch, still count)."""
        if self._closed or not steps:
            return
        hold = _oldest_open(steps[-1])
        engine = self._engine
        with self._lock:
            engine.sampled = steps[-1].record.runtime.sampling_rate > 1
            for step in steps:
                off = step.offset
                if step.scope not in self._seen:  # its unsampled steps before this one
                    self._seen.add(step.scope)
                    counts = step.record.runtime.scopes.get(step.scope)
                    if counts is not None and counts.first_start_ns:
                        engine.scope_first(step.scope, counts.first_start_ns + off)
                cats = _shortcut(step)
                if cats is not None:
                    # (made only where windows overlap; the step itself is not kept)
                    own = functools.partial(
                        _own, step.components, step.ends, off, step.background_ids
                    )
                    engine.add_step(
                        step.scope, step.number, step.start_ns, step.end_ns, own, cats=cats
                    )
                else:
                    intervals = _own(step.components, step.ends, off, step.background_ids)
                    engine.add_step(step.scope, step.number, step.start_ns, step.end_ns, intervals)
                    if any(iv[0] == cat.COMPILATION for iv in intervals):
                        self._compilations(step)
                    bg = step.background_ids
                    if bg is not None:
                        for c, e in zip(step.components, step.ends, strict=True):
                            if c[2] in bg:
                                kind = cat.classify(c[0], c[1], c[rs.I_CATEGORY])
                                engine.add_beside(kind, c[4] + off, e + off)
                unsampled = step.summary.unsampled_sec
                if unsampled:
                    engine.add_unsampled(step.scope, unsampled)
                if step.summary.device_end_ns > engine.latest:
                    engine.reach(step.summary.device_end_ns)
            for step in reversed(steps):  # the scalars' step: the latest training step's
                if not cat.is_eval_scope(step.scope):
                    self._last_number = step.number
                    break
            self._runtime = (steps[-1].record.runtime, steps[-1].offset)
            engine.settle(min(hold, self._reached))
            self._reached = engine.latest
        self._maybe_log()

    def _compilations(self, step: FinishedStep) -> None:
        classify = cat.classify
        ex = step.record.extras
        attrs = ex.attributes if ex is not None else {}
        self._engine.compiles.add(
            (
                (c[0], classify(c[0], c[1], c[rs.I_CATEGORY]), c[2], c[3], attrs.get(c[2]))
                for c in step.components
            ),
            siblings=True,
        )

    def on_background_spans(self, spans: Sequence[BackgroundSpan]) -> None:
        """Background work that ended after its step was handed on (an asynchronous
        checkpoint writer): it counts where no step runs."""
        if self._closed:
            return
        with self._lock:
            for s in spans:
                name, blocked, start, end, category = s.interval()
                self._engine.add_beside(cat.classify(name, blocked, category), start, end)

    def on_outside_spans(self, spans: Sequence[OutsideSpan]) -> None:
        """Components recorded outside any step (a restore before the loop, an evaluation
        or a checkpoint between steps), as the span builder hands each ended record on."""
        self._add_outside([(s.name, s.blocked, s.start_ns, s.end_ns, s.category) for s in spans])
        if self._closed:
            return
        with self._lock:
            classify = cat.classify
            found = [
                (
                    s.name,
                    classify(s.name, s.blocked, s.category),
                    s.span_id,
                    s.parent_id,
                    s.attributes,
                )
                for s in spans
            ]
            self._engine.compiles.add(found, siblings=False)

    def add_outside(
        self, name: str, blocked: bool, start_ns: int, end_ns: int, category: str | None = None
    ) -> None:
        """One component outside any step (see :meth:`on_outside_spans`), Unix ns."""
        self._add_outside([(name, blocked, start_ns, end_ns, category)])

    def _add_outside(self, components: list[tuple[str, bool, int, int, str | None]]) -> None:
        if self._closed:
            return
        with self._lock:
            for name, blocked, start, end, category in components:
                self._engine.add_beside(cat.classify(name, blocked, category), start, end)

    # --- output -------------------------------------------------------------------------

    def figures(self) -> dict[str, Any]:
        """The ledger so far: ``wall_time_sec`` (process start to the time settled),
        ``productive_time_sec``, ``goodput``, ``badput_sec`` (every category of
        :data:`~otel_tunix.accounting.categories.BADPUT`), ``scopes`` (each scope's steps' own
        categories, ``productive`` included) and ``compilations``."""
        with self._lock:
            f = self._engine.figures()
        return as_figures_json(f)

    def scalars(self) -> dict[str, float]:
        """The figures as MetricsLogger scalars."""
        f = self.figures()
        out = {LOG_GOODPUT: f["goodput"], LOG_PRODUCTIVE: f["productive_time_sec"]}
        for k, v in f["badput_sec"].items():
            out[LOG_BADPUT + k] = v
        return out

    def _maybe_log(self, force: bool = False) -> None:
        logger = self._logger
        if logger is None or not logger.active or self._engine.first_step_ns is None:
            return  # nothing to tell before the first step
        number = self._last_number
        if not force:
            if number is None or number // self._log_every <= self._logged_at // self._log_every:
                return
            self._logged_at = number
        # As the perf/... rows: a fixed set of names, not counted against the bound on the
        # names a program logs (OTEL_TUNIX_MAX_METRIC_NAMES).
        logger.log_rows(((self._last_number, self.scalars()),), source=PERF_SOURCE)

    def finish(self, unsampled: Mapping[str, Mapping[str, float]] | None = None) -> None:
        """The run ends (every step processed): each scope's unsampled steps after its
        last recorded one (the runtime counts every step) and their badput time
        (``unsampled``: seconds per category, per scope), then the rest settled and the
        scalars logged."""
        if self._closed:
            return
        with self._lock:
            engine = self._engine
            if self._runtime is not None:
                runtime, off = self._runtime
                for scope, counts in list(runtime.scopes.items()):
                    if counts.last_end_ns:
                        engine.scope_last(scope, counts.last_end_ns + off)
            for scope, seconds in (unsampled or {}).items():
                engine.add_unsampled(scope, seconds)
            engine.finish()
        self._maybe_log(force=True)
        self._closed = True

    def shutdown(self) -> None:
        return None


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
