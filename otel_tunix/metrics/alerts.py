"""Alert rules on any logged metric, with the defaults of Signal's RL monitoring guide.

A rule watches MetricsLogger names (glob patterns) and has a level per observation: OK,
WARNING or CRITICAL. :class:`AlertEngine` keeps one state per (rule, metric name) and acts
only on **transitions**:

* it **fires** when a level is reached for ``consecutive`` observations in a row (a new
  episode, or an escalation from warning to critical);
* it **resolves** (or downgrades) when the value is back inside the threshold by the
  rule's ``hysteresis`` margin, so a value hovering at the line does not flap.

Each transition

1. adds a ``tunix.alert`` **event to the step span**: the step open in the calling context
   when the metric was logged inside ``otel_tunix.step(...)``; otherwise (a metric logged
   after the step, or a ``perf/...`` metric logged by otel-tunix's worker) the next sampled
   step that starts, with ``tunix.alert.step`` naming the step the value belongs to.
   This needs the core hook ``otel_tunix._tracer.add_step_event`` (see
   ``docs/alerts.md``); without it the event goes on the current span only when that span
   is a recording span of the application's own;
2. emits an **OTel log record** (``event_name="tunix.alert"``, severity WARN / ERROR, INFO
   when resolved) through the logs API, correlated with the current trace and span;
3. sends a **Datadog event and service check** (``tunix.alert.<rule>``) when Datadog is on
   (``DATADOG_ENABLED`` or ``OTEL_METRICS_EXPORTER=datadog``, or a client given);
4. **warns on the console** once when an episode starts (and once more if it escalates to
   critical), never per step;
5. counts ``tunix.alert.firings{rule, severity}`` when it fires;
6. appends a JSON line to ``alerts.jsonl`` in the run folder (local-first: no collector
   needed to see what fired).

Hook it up as a MetricsLogger backend, so it sees every logged scalar including otel-tunix's
``perf/<scope>/step_time_sec``::

    from otel_tunix.metrics import alerts
    engine = alerts.install()          # default rules, on the current run's MetricsLogger

No method raises into the training loop; a failing action is reported once.
"""

from __future__ import annotations

import bisect
import fnmatch
import itertools
import json
import logging
import math
import operator
import os
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any, Literal

from otel_tunix._once import ReportOnce
from otel_tunix.metrics_logger import row_names
from otel_tunix.perf_rows import PerfRows, perf_value

__all__ = [
    "Alert",
    "AlertEngine",
    "DropRule",
    "NonFiniteRule",
    "Rule",
    "Severity",
    "SpikeRule",
    "Threshold",
    "ThresholdRule",
    "above",
    "below",
    "default_rules",
    "install",
    "outside",
]

_logger = logging.getLogger(__name__)

EVENT_NAME = "tunix.alert"
"""Name of the span event and of the log record's event."""


class Severity(IntEnum):
    """Level of a rule for one metric; also the Datadog service-check status."""

    OK = 0
    WARNING = 1
    CRITICAL = 2


_OK = Severity.OK  # read per evaluated value: a module global is the cheapest lookup


# --- thresholds ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Threshold:
    """A condition on a value: ``above`` ``value``, ``below`` ``value``, or ``outside``
    ``[value, high]``. NaN never breaches a threshold (see :class:`NonFiniteRule`)."""

    direction: Literal["above", "below", "outside"]
    value: float
    high: float | None = None

    def __post_init__(self) -> None:
        if self.direction == "outside" and (self.high is None or self.high < self.value):
            raise ValueError("outside(low, high) needs low <= high")
        if self.direction not in ("above", "below", "outside"):
            raise ValueError(f"direction must be above, below or outside: {self.direction!r}")

    def breached(self, v: float) -> bool:
        """True when ``v`` is past the threshold."""
        if self.direction == "above":
            return v > self.value
        if self.direction == "below":
            return v < self.value
        assert self.high is not None
        return v < self.value or v > self.high

    def cleared(self, v: float, hysteresis: float = 0.0) -> bool:
        """True when ``v`` is back inside by at least ``hysteresis`` (False for NaN)."""
        if math.isnan(v):
            return False
        if self.direction == "above":
            return v <= self.value - hysteresis
        if self.direction == "below":
            return v >= self.value + hysteresis
        assert self.high is not None
        return self.value + hysteresis <= v <= self.high - hysteresis

    def __str__(self) -> str:
        if self.direction == "above":
            return f"> {self.value:g}"
        if self.direction == "below":
            return f"< {self.value:g}"
        return f"outside [{self.value:g}, {self.high:g}]"


def above(value: float) -> Threshold:
    """Breached when the metric is greater than ``value``."""
    return Threshold("above", float(value))


def below(value: float) -> Threshold:
    """Breached when the metric is less than ``value``."""
    return Threshold("below", float(value))


def outside(low: float, high: float) -> Threshold:
    """Breached when the metric is less than ``low`` or greater than ``high``."""
    return Threshold("outside", float(low), float(high))


# --- rules ---------------------------------------------------------------------------------
class Rule(ABC):
    """A rule: which metrics it watches and the level of one observation.

    Subclasses are frozen dataclasses with at least ``name``, ``metrics`` (glob patterns of
    MetricsLogger names, matched with :func:`fnmatch.fnmatchcase`), ``consecutive`` and
    ``window`` (how many previous values of the metric it needs, 0 for none).
    """

    name: str
    metrics: tuple[str, ...]
    consecutive: int
    window: int
    description: str

    def matches(self, metric: str) -> bool:
        """True when the rule watches ``metric``."""
        return any(fnmatch.fnmatchcase(metric, p) for p in self.metrics)

    @abstractmethod
    def level(self, value: float, history: Sequence[float]) -> Severity:
        """The level of this observation (``history``: previous finite values, oldest
        first)."""

    @abstractmethod
    def clears(self, value: float, history: Sequence[float], level: Severity) -> bool:
        """True when a state at ``level`` may leave it (hysteresis applied)."""

    @abstractmethod
    def condition(self, level: Severity, history: Sequence[float]) -> str:
        """The breached condition at ``level``, in words (``> 0.1``)."""

    def _check(self) -> None:
        if not self.metrics:
            raise ValueError(f"rule {self.name!r} watches no metric")
        if self.consecutive < 1:
            raise ValueError(f"rule {self.name!r}: consecutive must be >= 1")


@dataclass(frozen=True)
class ThresholdRule(Rule):
    """Warning and / or critical thresholds on a metric.

    Args:
        name: Rule name (Datadog check ``tunix.alert.<name>``).
        metrics: Glob patterns of the MetricsLogger names to watch.
        warning: Threshold of the warning level.
        critical: Threshold of the critical level (checked first).
        consecutive: Observations in a row past a threshold before it fires.
        hysteresis: How far back inside the threshold a value must come to clear it.
        description: What the rule means, shown in messages.
    """

    name: str
    metrics: tuple[str, ...]
    warning: Threshold | None = None
    critical: Threshold | None = None
    consecutive: int = 1
    hysteresis: float = 0.0
    description: str = ""
    window: int = 0

    def __post_init__(self) -> None:
        self._check()
        if self.warning is None and self.critical is None:
            raise ValueError(f"rule {self.name!r} has no threshold")

    def level(self, value: float, history: Sequence[float]) -> Severity:
        if self.critical is not None and self.critical.breached(value):
            return Severity.CRITICAL
        if self.warning is not None and self.warning.breached(value):
            return Severity.WARNING
        return Severity.OK

    def _threshold(self, level: Severity) -> Threshold | None:
        return self.critical if level is Severity.CRITICAL else self.warning

    def clears(self, value: float, history: Sequence[float], level: Severity) -> bool:
        t = self._threshold(level)
        return t is None or t.cleared(value, self.hysteresis)

    def condition(self, level: Severity, history: Sequence[float]) -> str:
        return str(self._threshold(level) or "")


@dataclass(frozen=True)
class NonFiniteRule(Rule):
    """Fires when a metric is NaN or infinite (a diverged loss)."""

    name: str
    metrics: tuple[str, ...]
    severity: Severity = Severity.CRITICAL
    consecutive: int = 1
    description: str = ""
    window: int = 0

    def __post_init__(self) -> None:
        self._check()

    def level(self, value: float, history: Sequence[float]) -> Severity:
        return Severity.OK if math.isfinite(value) else self.severity

    def clears(self, value: float, history: Sequence[float], level: Severity) -> bool:
        return math.isfinite(value)

    def condition(self, level: Severity, history: Sequence[float]) -> str:
        return "is NaN or infinite"


@dataclass(frozen=True)
class DropRule(Rule):
    """Fires on a sudden fall: the value is below ``(1 - drop_fraction)`` x the median of
    the previous ``window`` values (policy collapse when applied to entropy).

    Args:
        drop_fraction: Relative fall that fires (0.5: half the recent median).
        window: Previous values the median is taken over.
        min_history: Values needed before the rule can fire.
        hysteresis: Clears at ``(1 - drop_fraction + hysteresis)`` x the median.
    """

    name: str
    metrics: tuple[str, ...]
    drop_fraction: float = 0.5
    window: int = 20
    min_history: int = 5
    severity: Severity = Severity.WARNING
    consecutive: int = 1
    hysteresis: float = 0.1
    description: str = ""

    def __post_init__(self) -> None:
        self._check()
        if not 0 < self.drop_fraction < 1:
            raise ValueError(f"rule {self.name!r}: drop_fraction must be in (0, 1)")

    def _median(self, history: Sequence[float]) -> float | None:
        if len(history) < self.min_history:
            return None
        m = _median(history)
        return m if m > 0 else None

    def level(self, value: float, history: Sequence[float]) -> Severity:
        m = self._median(history)
        if m is None or math.isnan(value):
            return Severity.OK
        return self.severity if value < (1 - self.drop_fraction) * m else Severity.OK

    def clears(self, value: float, history: Sequence[float], level: Severity) -> bool:
        m = self._median(history)
        if m is None:
            return True
        return value >= (1 - self.drop_fraction + self.hysteresis) * m

    def condition(self, level: Severity, history: Sequence[float]) -> str:
        m = self._median(history)
        limit = "" if m is None else f" (< {(1 - self.drop_fraction) * m:.4g})"
        return f"fell over {self.drop_fraction:.0%} below the recent median{limit}"


@dataclass(frozen=True)
class SpikeRule(Rule):
    """Fires when a value is above ``median + k x MAD`` of the previous ``window`` values
    (and at least ``min_relative`` above the median, so a perfectly steady series with
    MAD 0 does not fire on noise). The goodput definition of a slow step.

    Args:
        k: MAD multiplier (3).
        window: Previous values the median and MAD are taken over.
        min_history: Values needed before the rule can fire.
        min_relative: Minimum rise over the median, as a fraction of it (10 %: with raw MAD,
            median + 3·MAD is about 2 standard deviations of normal jitter).
        min_absolute: Minimum rise over the median, in the metric's unit (the default rule
            uses 10 ms, so microsecond jitter of tiny steps never alerts).
    """

    name: str
    metrics: tuple[str, ...]
    k: float = 3.0
    window: int = 50
    min_history: int = 10
    min_relative: float = 0.1
    min_absolute: float = 0.0
    severity: Severity = Severity.WARNING
    consecutive: int = 1
    description: str = ""

    def __post_init__(self) -> None:
        self._check()

    def _limit(self, history: Sequence[float], value: float | None = None) -> float | None:
        """``max(median + k·MAD, median·(1 + min_relative), median + min_absolute)``; with
        ``value`` given, a value at or below the last two terms returns that floor without
        computing the MAD (the usual, quiet case: one sort instead of two)."""
        if len(history) < self.min_history:
            return None
        med = _median(history)
        floor = med * (1 + self.min_relative)
        if med + self.min_absolute > floor:
            floor = med + self.min_absolute
        if value is not None and value <= floor:
            return floor
        mad = _median(abs(x - med) for x in history)
        return max(med + self.k * mad, floor)

    def level(self, value: float, history: Sequence[float]) -> Severity:
        limit = self._limit(history, value)
        # NaN compares false: never above the limit
        return self.severity if limit is not None and value > limit else _OK

    def clears(self, value: float, history: Sequence[float], level: Severity) -> bool:
        limit = self._limit(history, value)
        return limit is None or value <= limit

    def condition(self, level: Severity, history: Sequence[float]) -> str:
        limit = self._limit(history)
        tail = "" if limit is None else f" (> {limit:.4g})"
        return f"above median + {self.k:g}·MAD of the last {len(history)} values{tail}"


def _median(values: Iterable[float]) -> float:
    """The median (``statistics.median`` without its overhead: rules take one per value);
    a :class:`_Window` brings its values sorted already."""
    s = values.sorted if type(values) is _Window else sorted(values)
    n = len(s)
    if not n:
        raise ValueError("median of no values")
    m = n // 2
    return s[m] if n % 2 else (s[m - 1] + s[m]) / 2


def default_rules() -> list[Rule]:
    """The default rules (Signal's guide, plus divergence and slow-step detection).

    ============================ ===================================== =====================
    rule                         metrics                               levels
    ============================ ===================================== =====================
    ``kl_divergence``            ``kl``, ``*/kl``, ``kl_divergence``   warning > 0.05,
                                                                       critical > 0.1
    ``clip_fraction``            ``pg_clipfrac``, ``clip_fraction``    warning outside
                                 ``policy/clipfrac_avg``               [0.1, 0.3], critical
                                                                       > 0.5 (3 in a row)
    ``explained_variance``       ``explained_variance``, ``*/``...     warning < 0.5
                                                                       (3 in a row)
    ``entropy_collapse``         ``loss/entropy``, ``entropy``, ...    warning: 50 % below
                                                                       the median of 20
    ``loss_not_finite``          ``loss``, ``*loss``, ``loss/*``       critical: NaN / Inf
    ``step_time_spike``          ``step_time_sec``,                    warning > median +
                                 ``perf/*/step_time_sec``              3·MAD of 50
    ============================ ===================================== =====================
    """
    return [
        ThresholdRule(
            "kl_divergence",
            ("kl", "*/kl", "kl_divergence", "*/kl_divergence"),
            warning=above(0.05),
            critical=above(0.1),
            hysteresis=0.005,
            description="policy drifts from the reference; lower the learning rate or raise "
            "the KL coefficient",
        ),
        ThresholdRule(
            "clip_fraction",
            ("pg_clipfrac", "clip_fraction", "policy/clipfrac_avg"),
            warning=outside(0.1, 0.3),
            critical=above(0.5),
            consecutive=3,
            hysteresis=0.02,
            description="below 0.1: reduce clip_epsilon; above 0.5: increase clip_epsilon or "
            "reduce the learning rate",
        ),
        ThresholdRule(
            "explained_variance",
            ("explained_variance", "*/explained_variance"),
            warning=below(0.5),
            consecutive=3,
            hysteresis=0.05,
            description="the value function is not learning",
        ),
        DropRule(
            "entropy_collapse",
            ("loss/entropy", "entropy", "*/entropy", "*/entropy_avg"),
            description="sudden entropy drop: policy collapse; add an entropy bonus",
        ),
        NonFiniteRule(
            "loss_not_finite",
            ("loss", "*loss", "loss/*", "*/loss"),
            description="the loss diverged",
        ),
        SpikeRule(
            "step_time_spike",
            ("step_time_sec", "perf/*/step_time_sec"),
            min_absolute=0.01,
            description="a step much slower than the recent ones",
        ),
    ]


# --- alerts and the engine -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Alert:
    """A transition of one rule on one metric."""

    rule: str
    metric: str
    severity: Severity
    previous: Severity
    value: float
    step: int | None
    condition: str
    message: str
    time_ns: int = field(default_factory=time.time_ns)

    @property
    def fired(self) -> bool:
        """True for a new episode or an escalation."""
        return self.severity > self.previous

    @property
    def resolved(self) -> bool:
        """True when the metric is back to OK."""
        return self.severity is Severity.OK

    def attributes(self) -> dict[str, Any]:
        """Attributes of the span event and the log record."""
        a: dict[str, Any] = {
            "tunix.alert.rule": self.rule,
            "tunix.alert.metric": self.metric,
            "tunix.alert.severity": self.severity.name.lower(),
            "tunix.alert.previous_severity": self.previous.name.lower(),
            "tunix.alert.value": self.value,
            "tunix.alert.condition": self.condition,
        }
        if self.step is not None:
            a["tunix.alert.step"] = self.step
        return a


class _Window(deque[float]):
    """The last ``maxlen`` values of a series, with the same values kept sorted alongside,
    so a rule's median costs a lookup per value instead of a sort of the window."""

    # Slots, and the size kept apart from deque's ``maxlen``: what append() reads is then
    # read by the interpreter's fast paths (append runs once per watched value and step).
    __slots__ = ("size", "sorted")

    def __init__(self, maxlen: int) -> None:
        super().__init__(maxlen=maxlen)
        self.size = maxlen
        self.sorted: list[float] = []

    def append(self, value: float) -> None:
        srt = self.sorted
        if len(self) == self.size:
            del srt[_bisect_left(srt, self[0])]
        _deque_append(self, value)
        _insort(srt, value)


_bisect_left, _insort, _deque_append = bisect.bisect_left, bisect.insort, deque.append


@dataclass(slots=True)
class _Series:
    level: Severity = Severity.OK
    streak_warning: int = 0
    streak_critical: int = 0
    history: deque[float] = field(default_factory=deque)


_MAX_NAME_SETS = 1024
"""Sets of names whose watched names are kept (bounded: names made up per step)."""

_LOG_SEVERITY = {Severity.OK: ("INFO", 9), Severity.WARNING: ("WARN", 13),
                 Severity.CRITICAL: ("ERROR", 17)}  # fmt: skip


class AlertEngine:
    """Evaluates rules on logged scalars and acts on transitions (see the module doc).

    It is a MetricsLogger backend (``log_scalar`` / ``log_scalars`` / ``close``) and can also
    be fed directly with :meth:`observe`.

    Args:
        rules: Default: :func:`default_rules`.
        logger_provider: OTel ``LoggerProvider`` for the log records; default: the global
            one (a no-op until the application or otel-tunix sets an SDK provider).
        meter_provider: For ``tunix.alert.firings``; default: the current run's.
        datadog: A :class:`~otel_tunix.exporters.datadog.DatadogClient`, ``True``/``False``,
            or ``None`` to follow ``datadog_enabled()``.
        console: Warn on the console (Python logging, logger ``otel_tunix.metrics.alerts``)
            when an episode starts or escalates.
        span_events: Add ``tunix.alert`` events to step spans.
        history_size: Transitions kept in :attr:`history`.
        jsonl_path: Also append each transition as a JSON line to this file (the run
            folder's ``alerts.jsonl`` when installed with :func:`install`).
    """

    skip_sources: tuple[str, ...] = ()

    def __init__(
        self,
        rules: Iterable[Rule] | None = None,
        *,
        logger_provider: Any = None,
        meter_provider: Any = None,
        datadog: Any = None,
        console: bool = True,
        span_events: bool = True,
        history_size: int = 1000,
        jsonl_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.rules: list[Rule] = list(default_rules() if rules is None else rules)
        names = [r.name for r in self.rules]
        if len(set(names)) != len(names):
            raise ValueError(f"rule names must be unique: {names}")
        self._series: dict[tuple[str, str], _Series] = {}
        self._routes: dict[str, list[tuple[Rule, _Series]]] = {}
        """Per metric name: the rules that watch it, each with its series."""
        self._watched_by_names: dict[tuple[str, ...], list[tuple[str, Any]]] = {}
        """Per set of names logged together: those some rule watches, with their rules."""
        self._lock = threading.Lock()  # never taken twice: actions run outside it
        self._logger_provider = logger_provider
        self._otel_logger: Any = None
        self._meter_provider = meter_provider
        self._counter: Any = None
        self._datadog_opt = datadog
        self._datadog: Any = None
        self._owns_datadog = False
        self._datadog_resolved = datadog is False
        self.console = console
        self.span_events = span_events
        self.history: deque[Alert] = deque(maxlen=history_size)
        self.jsonl_path = Path(jsonl_path) if jsonl_path is not None else None
        self._jsonl: Any = None
        self._report = ReportOnce(_logger, logging.WARNING)
        self._closed = False

    # --- evaluation ---------------------------------------------------------------------
    def _routes_for(self, metric: str) -> list[tuple[Rule, _Series]]:
        routes = self._routes.get(metric)
        if routes is None:
            routes = []
            with self._lock:
                for rule in self.rules:
                    if rule.matches(metric):
                        key = (rule.name, metric)
                        s = self._series.get(key)
                        if s is None:
                            s = self._series[key] = _Series(history=_Window(max(rule.window, 1)))
                        routes.append((rule, s))
            self._routes[metric] = routes
        return routes

    def observe(self, metric: str, value: float, step: int | None = None) -> list[Alert]:
        """Evaluate one value; returns the transitions it caused (usually none)."""
        return self._evaluate_rows(((step, {metric: value}),))

    def _evaluate_rows(self, rows: Iterable[tuple[int | None, Mapping[str, float]]]) -> list[Alert]:
        """Evaluate the values of several steps, in order, under one lock; act on the
        transitions afterwards and return them."""
        if self._closed:
            return []
        out: list[Alert] = []
        by_names = self._watched_by_names
        watched = []  # the values some rule watches
        runs: Iterable[tuple[tuple[str, ...], Iterable[tuple[int | None, Any]]]]
        if isinstance(rows, PerfRows):  # the worker's: values read from the step summaries
            runs = ((names, [(s.step, s) for s in steps]) for names, steps in rows.runs())
            value_of: Any = perf_value
        else:
            runs = itertools.groupby(rows, row_names)
            value_of = operator.getitem
        # A loop logs the same few sets of names step after step: which of them some rule
        # watches is looked up once per set and run of rows, not once per name and step.
        for names, run in runs:
            found = by_names.get(names)
            for step, values in run:
                watch = found
                if watch is None:  # a set not seen yet, or one with a name that failed to
                    watch = self._watched_of(names)  # route: routed (again) for this row
                    found = by_names.get(names)  # kept once every name routed
                for name, rules in watch:
                    watched.append((name, value_of(values, name), step, rules))
        if watched:
            with self._lock:
                for name, value, step, rules in watched:
                    try:  # a value that cannot be evaluated does not stop the others
                        v = value if type(value) is float else float(value)
                        for rule, series in rules:
                            alert = self._evaluate(rule, series, name, v, step)
                            if alert is not None:
                                out.append(alert)
                                self.history.append(alert)
                    except Exception:
                        self._failed()
        for alert in out:
            self._act(alert)
        return out

    def _watched_of(self, names: tuple[str, ...]) -> list[tuple[str, Any]]:
        """The names of this set that some rule watches, with their rules (names seen
        first are routed here; a name that fails to route is left out of the set)."""
        found = []
        complete = True
        for name in names:
            try:
                rules = self._routes_for(name)
            except Exception:
                self._failed()
                complete = False
                continue
            if rules:
                found.append((name, rules))
        if complete:  # a set with a name that failed is routed again next time
            if len(self._watched_by_names) >= _MAX_NAME_SETS:  # names that change per step
                self._watched_by_names.clear()
            self._watched_by_names[names] = found
        return found

    def _failed(self) -> None:
        self._report("observe", "otel-tunix: alert evaluation failed (reported once)")

    def _evaluate(
        self, rule: Rule, s: _Series, metric: str, v: float, step: int | None
    ) -> Alert | None:
        hist = s.history  # the values before this one (v is appended on the way out)
        try:
            raw = rule.level(v, hist)
            if raw is _OK and s.level is _OK:  # the quiet case: no change
                s.streak_warning = s.streak_critical = 0
                return None
            return self._transition(rule, s, metric, v, step, hist, raw)
        finally:
            if rule.window and v - v == 0.0:  # finite
                hist.append(v)

    def _transition(
        self,
        rule: Rule,
        s: _Series,
        metric: str,
        v: float,
        step: int | None,
        hist: Sequence[float],
        raw: Severity,
    ) -> Alert | None:
        s.streak_warning = s.streak_warning + 1 if raw >= Severity.WARNING else 0
        s.streak_critical = s.streak_critical + 1 if raw >= Severity.CRITICAL else 0
        target = Severity.OK
        if s.streak_critical >= rule.consecutive:
            target = Severity.CRITICAL
        elif s.streak_warning >= rule.consecutive:
            target = Severity.WARNING
        previous = s.level
        if target > previous:
            new = target
        elif previous > Severity.OK and raw < previous and rule.clears(v, hist, previous):
            new = raw if raw > Severity.OK else Severity.OK
        else:
            return None
        s.level = new
        cond = rule.condition(new if new > Severity.OK else previous, hist)
        return Alert(
            rule=rule.name,
            metric=metric,
            severity=new,
            previous=previous,
            value=v,
            step=step,
            condition=cond,
            message=_message(rule, metric, v, step, new, previous, cond),
        )

    def active(self) -> dict[tuple[str, str], Severity]:
        """``{(rule, metric): severity}`` of every series not OK now."""
        with self._lock:
            return {k: s.level for k, s in self._series.items() if s.level > Severity.OK}

    # --- MetricsLogger backend ----------------------------------------------------------
    def log_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        """Backend protocol: evaluate ``event`` at ``kwargs["step"]``."""
        self.observe(event, value, kwargs.get("step"))

    def log_scalars(self, values: Mapping[str, float], **kwargs: Any) -> None:
        """Backend protocol: evaluate several scalars of one step."""
        self.log_rows(((kwargs.get("step"), values),))

    def log_rows(
        self, rows: Sequence[tuple[int | None, Mapping[str, float]]], **kwargs: Any
    ) -> None:
        """Backend protocol: evaluate the scalars of several steps, in order (those no rule
        watches cost one dict lookup)."""
        self._evaluate_rows(rows)

    def close(self) -> None:
        """Stop evaluating; close the JSONL file; flush (and close, if created here) the
        Datadog client."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            if self._jsonl is not None:
                self._jsonl.close()
                self._jsonl = None
        dd = self._datadog
        if dd is not None:
            try:
                dd.close() if self._owns_datadog else dd.flush()
            except Exception:
                self._report("dd-close", "otel-tunix: closing the alerts' Datadog client failed")

    # --- actions ------------------------------------------------------------------------
    def _act(self, alert: Alert) -> None:
        for name, action in (
            ("span", self._span_event),
            ("log", self._log_record),
            ("datadog", self._send_datadog),
            ("console", self._console),
            ("counter", self._count),
            ("jsonl", self._write_jsonl),
        ):
            try:
                action(alert)
            except Exception:
                self._report(name, f"otel-tunix: alert action {name!r} failed (reported once)")

    def _span_event(self, alert: Alert) -> None:
        if not self.span_events:
            return
        from otel_tunix import _tracer

        add = getattr(_tracer, "add_step_event", None)
        if add is not None and _tracer.get_runtime() is not None:
            add(EVENT_NAME, alert.attributes())
            return
        from opentelemetry import trace

        span = trace.get_current_span()
        if span.is_recording():
            span.add_event(EVENT_NAME, alert.attributes())

    def _log_record(self, alert: Alert) -> None:
        if self._otel_logger is None:
            from opentelemetry import _logs

            from otel_tunix._version import __version__

            provider = self._logger_provider or _logs.get_logger_provider()
            self._otel_logger = provider.get_logger(__name__, __version__)
        from opentelemetry._logs import LogRecord, SeverityNumber
        from opentelemetry.context import get_current

        text, number = _LOG_SEVERITY[alert.severity]
        fields: dict[str, Any] = {
            "timestamp": alert.time_ns,
            "observed_timestamp": alert.time_ns,
            "severity_text": text,
            "severity_number": SeverityNumber(number),
            "body": alert.message,
            "attributes": alert.attributes(),
        }
        try:
            record = LogRecord(context=get_current(), event_name=EVENT_NAME, **fields)
        except TypeError:  # opentelemetry-api < 1.35: no context / event_name
            from opentelemetry import trace

            ctx = trace.get_current_span().get_span_context()
            record = LogRecord(
                trace_id=ctx.trace_id, span_id=ctx.span_id, trace_flags=ctx.trace_flags,
                **fields,
            )  # fmt: skip
        self._otel_logger.emit(record)

    def _client(self) -> Any:
        if not self._datadog_resolved:
            self._datadog_resolved = True
            opt = self._datadog_opt
            if opt is None or opt is True:
                from otel_tunix.exporters.datadog import DatadogClient, datadog_enabled

                if opt is True or datadog_enabled():
                    try:
                        self._datadog = DatadogClient()
                        self._owns_datadog = True
                    except ImportError as exc:
                        self._report("dd-import", f"otel-tunix: no Datadog alerts: {exc}")
            else:
                self._datadog = opt
        return self._datadog

    def _send_datadog(self, alert: Alert) -> None:
        dd = self._client()
        if dd is None:
            return
        tags = {"rule": alert.rule, "metric": alert.metric,
                "severity": alert.severity.name.lower()}  # fmt: skip
        if alert.step is not None:
            tags["step"] = str(alert.step)
        dd.service_check(f"tunix.alert.{alert.rule}", int(alert.severity), tags=tags,
                         message=alert.message)  # fmt: skip
        if alert.fired or alert.resolved:
            kind = {Severity.CRITICAL: "error", Severity.WARNING: "warning"}.get(
                alert.severity, "success"
            )
            title = (f"otel-tunix: {alert.rule} {alert.severity.name.lower()}" if alert.fired
                     else f"otel-tunix: {alert.rule} resolved")  # fmt: skip
            dd.event(title, alert.message, alert_type=kind, tags=tags,
                     aggregation_key=f"tunix.alert.{alert.rule}.{alert.metric}")  # fmt: skip

    def _console(self, alert: Alert) -> None:
        if self.console and alert.fired:
            log = _logger.error if alert.severity is Severity.CRITICAL else _logger.warning
            log("%s", alert.message)

    def _count(self, alert: Alert) -> None:
        if not alert.fired:
            return
        if self._counter is None:
            from otel_tunix.metrics.instruments import CatalogInstruments

            self._counter = CatalogInstruments(self._meter_provider)
        self._counter.record(
            "tunix.alert.firings", 1,
            {"rule": alert.rule, "severity": alert.severity.name.lower()},
        )  # fmt: skip

    def _write_jsonl(self, alert: Alert) -> None:
        if self.jsonl_path is None:
            return
        with self._lock:
            if self._jsonl is None:
                self.jsonl_path.parent.mkdir(parents=True, exist_ok=True)
                self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")
            rec = {"time_ns": alert.time_ns, **alert.attributes(), "message": alert.message}
            self._jsonl.write(json.dumps(rec) + "\n")
            self._jsonl.flush()


def _message(
    rule: Rule,
    metric: str,
    value: float,
    step: int | None,
    new: Severity,
    previous: Severity,
    condition: str,
) -> str:
    at = f" at step {step}" if step is not None else ""
    if new > previous:
        head = f"otel-tunix alert [{new.name}] {rule.name}: {metric} = {value:.6g} {condition}"
        hint = f" ({rule.description})" if rule.description else ""
        return f"{head}{at}{hint}"
    if new is Severity.OK:
        return f"otel-tunix alert [RESOLVED] {rule.name}: {metric} = {value:.6g}{at}"
    return (
        f"otel-tunix alert [{new.name}] {rule.name}: {metric} = {value:.6g}{at} "
        f"(down from {previous.name.lower()})"
    )


def install(
    rules: Iterable[Rule] | None = None,
    *,
    logger: Any = None,
    **engine_kwargs: Any,
) -> AlertEngine:
    """Create an :class:`AlertEngine` and add it to a MetricsLogger's backends, replacing
    an engine already there (``configure()`` may have added the default one).

    Args:
        rules: Default: :func:`default_rules`.
        logger: The MetricsLogger; default: the current run's (call after ``configure()``).
        **engine_kwargs: More :class:`AlertEngine` arguments.

    Returns:
        The engine (closed with the logger at ``otel_tunix.shutdown()``).
    """
    if logger is None:
        from otel_tunix._configure import current_run, get_metrics_logger

        if current_run() is None:
            _logger.warning(
                "otel-tunix: alerts.install() before otel_tunix.configure(): pass logger= "
                "or call it after configure(); the engine is not attached"
            )
            return AlertEngine(rules, **engine_kwargs)
        logger = get_metrics_logger()
        run = current_run()
        if run is not None and run.output_dir is not None:
            suffix = f"-rank{run.rank.rank}" if run.rank.distributed else ""
            engine_kwargs.setdefault("jsonl_path", run.output_dir / f"alerts{suffix}.jsonl")
    engine = AlertEngine(rules, **engine_kwargs)
    if not getattr(logger, "active", True):
        _logger.info("otel-tunix: alerts not installed: this rank's MetricsLogger is inactive")
        return engine
    for old in [b for b in logger.backends if isinstance(b, AlertEngine)]:
        logger.backends.remove(old)  # one engine per logger: the new rules replace the old
        old.close()
    logger.backends.append(engine)
    return engine
