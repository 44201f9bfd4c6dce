"""Alert rules: thresholds, the rule kinds, the default rules, and the window of previous
values a rule reads (kept sorted, so a median costs a lookup).

A rule gives each observation of a metric a level (:class:`Severity`); the
:class:`~otel_tunix.metrics.alerts.engine.AlertEngine` turns levels into transitions.
"""

from __future__ import annotations

import fnmatch
import math
from abc import ABC, abstractmethod
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

__all__ = [
    "ALLOC_RETRIES_METRIC",
    "POLICY_LAG_METRIC",
    "WEIGHT_SYNCS_METRIC",
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
    "outside",
    "policy_lag_rule",
]


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
SAME_QUANTITY: dict[str, str] = {"perf/train/step_time_sec": "step_time_sec"}
"""MetricsLogger names that measure what another name measures: the training step's time
from its spans and as the trainer measures it. A rule watching both fires once for one
event (the first name to fire says it; the other stays quiet until both are back)."""


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
    profile: bool
    """Whether the rule's firing asks for a profile capture of the next steps
    (``otel_tunix.metrics.profiling``; ``profile=False``: this rule never does)."""

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
        profile: Whether its firing asks for a profile capture of the next steps.
    """

    name: str
    metrics: tuple[str, ...]
    warning: Threshold | None = None
    critical: Threshold | None = None
    consecutive: int = 1
    hysteresis: float = 0.0
    description: str = ""
    profile: bool = True
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
    profile: bool = True
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
    profile: bool = True

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
        consecutive: Values in a row above the limit before it fires (the default rule: 3,
            so one slow step, a checkpoint or a garbage collection, is no episode).
        hysteresis: How far back a value must come to clear it, as a fraction of the way
            from the limit down to the median (the default rule: 0.5, half way), so a
            series hovering at the limit is one episode, not one per crossing.
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
    hysteresis: float = 0.0
    description: str = ""
    profile: bool = True

    def __post_init__(self) -> None:
        self._check()
        if not 0.0 <= self.hysteresis <= 1.0:
            raise ValueError(f"rule {self.name!r}: hysteresis must be in [0, 1]")

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
        limit = self._limit(history)
        if limit is None:
            return True
        med = _median(history)
        return value <= limit - self.hysteresis * (limit - med)

    def condition(self, level: Severity, history: Sequence[float]) -> str:
        limit = self._limit(history)
        tail = "" if limit is None else f" (> {limit:.4g})"
        return f"above median + {self.k:g}·MAD of the last {len(history)} values{tail}"


# --- the window of previous values ---------------------------------------------------------
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
            del srt[bisect_left(srt, self[0])]
        deque.append(self, value)
        insort(srt, value)


def _median(values: Iterable[float]) -> float:
    """The median (``statistics.median`` without its overhead: rules take one per value);
    a :class:`_Window` brings its values sorted already."""
    s = values.sorted if type(values) is _Window else sorted(values)
    n = len(s)
    if not n:
        raise ValueError("median of no values")
    m = n // 2
    return s[m] if n % 2 else (s[m - 1] + s[m]) / 2


# --- the default rules ---------------------------------------------------------------------
def default_rules(*, max_policy_lag: int | None = None) -> list[Rule]:
    """The default rules (Signal's guide, plus divergence and slow-step detection).

    Args:
        max_policy_lag: With a bound (``OTEL_TUNIX_MAX_POLICY_LAG``), also
            :func:`policy_lag_rule`: a learner step that trained on a rollout more than this
            many policy versions old.

    ============================ ===================================== =====================
    rule                         metrics                               levels
    ============================ ===================================== =====================
    ``kl_divergence``            ``kl``, ``*/kl``, ``kl_divergence``   warning > 0.05,
                                                                       critical > 0.1
    ``clip_fraction``            ``pg_clipfrac``, ``clip_fraction``    warning > 0.3,
                                 ``policy/clipfrac_avg``               critical > 0.5
                                                                       (3 in a row)
    ``explained_variance``       ``explained_variance``, ``*/``...     warning < 0.5
                                                                       (3 in a row)
    ``entropy_collapse``         ``loss/entropy``, ``entropy``, ...    warning: 50 % below
                                                                       the median of 20
    ``loss_not_finite``          ``loss``, ``*loss``, ``loss/*``       critical: NaN / Inf
    ``step_time_spike``          ``step_time_sec``,                    warning > median +
                                 ``perf/*/step_time_sec``              3·MAD of 50 (3 in a
                                                                       row, after 50 steps)
    ``alloc_retries_growing``    ``memory/alloc_retries``              warning > 0 (the
                                                                       retry count grew)
    ``weight_sync_repeated``     ``rl/weight_syncs_per_step``          warning > 1
    ``policy_lag`` (with a       ``policy_lag``                        warning > the bound
    bound)
    ============================ ===================================== =====================
    """
    extra = [policy_lag_rule(max_policy_lag)] if max_policy_lag is not None else []
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
            # Signal's guide also calls < 0.1 too low; not as a default: one update per batch
            # (Tunix's num_iterations=1, any synchronous on-policy run) clips nothing by
            # construction, so every such healthy run would warn (docs/alerts.md).
            warning=above(0.3),
            critical=above(0.5),
            consecutive=3,
            hysteresis=0.02,
            description="updates leave the trust region: increase clip_epsilon or reduce the "
            "learning rate",
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
            min_history=50,  # warm-up: compilation and cold caches make no baseline
            min_absolute=0.01,
            consecutive=3,
            hysteresis=0.5,
            description="steps much slower than the recent ones",
        ),
        ThresholdRule(
            "alloc_retries_growing",
            (ALLOC_RETRIES_METRIC,),
            warning=above(0),
            description="the CUDA allocator had to free its cache and retry allocations: "
            "memory is nearly full (fragmentation, or a batch too large); an OOM may follow",
        ),
        ThresholdRule(
            "weight_sync_repeated",
            (WEIGHT_SYNCS_METRIC,),
            warning=above(1),
            description="a learner step synced its weights more than once: one sync per "
            "step was meant (a second publish path, or a retry)",
        ),
        *extra,
    ]


ALLOC_RETRIES_METRIC = "memory/alloc_retries"
"""The allocation retries of torch's CUDA caching allocator during a step (the PyTorch
integration logs it after each optimizer step; rule ``alloc_retries_growing``)."""

WEIGHT_SYNCS_METRIC = "rl/weight_syncs_per_step"
"""The MetricsLogger name of a learner step's weight syncs so far (``otel_tunix.rl``)."""


POLICY_LAG_METRIC = "policy_lag"
"""The MetricsLogger name of a learner step's largest policy lag (``otel_tunix.rl``)."""


def policy_lag_rule(bound: int) -> ThresholdRule:
    """``policy_lag``: warning when a learner step trained on a rollout more than ``bound``
    policy versions old (``policy_lag`` above ``bound``); clears at ``bound`` or less.
    """
    return ThresholdRule(
        "policy_lag",
        (POLICY_LAG_METRIC,),
        warning=above(bound),
        description="the learner trains on rollouts of an older policy than allowed: the "
        "actor runs too far ahead (bound the rollout queue) or weight syncs are late",
    )
