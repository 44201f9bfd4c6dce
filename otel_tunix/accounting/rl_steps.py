"""The RL learner step, broken into parts that add up to its wall time.

Each instant of a learner step's window gets exactly one part, so the parts sum to the
step's time (``docs/rl.md``, "The learner step, added up"):

========================  ==============================================================
part                      components (by name, else by goodput category)
========================  ==============================================================
``rollout``               generation inside the step: ``rollout``, ``generate``, ...
``rollout_wait``          waiting for rollouts: ``rollout_wait``, ``*_queue_wait``,
                          ``wait``, ``rollout_idle``; the ``rollout_wait`` and
                          ``data_stall`` categories
``reference_inference``   ``reference_inference`` (``refer_inference``, ``ref_logps``)
``old_actor_inference``   ``old_actor_inference`` (``old_policy_*``, ``old_logps``)
``training``              ``actor_train_step`` and every other busy component of the
                          ``productive`` category (``forward``, ``backward``, ...)
``weight_sync``           ``weight_sync`` (the ``weight_sync`` category)
``other``                 components of any other category (checkpoint, compilation, an
                          unnamed blocked wait, ...)
``idle``                  the step's time in no component
========================  ==============================================================

Where components of several parts are open at one instant (``forward`` inside
``actor_train_step``, a ``weight_sync`` inside the train component), the first part of
:data:`PRECEDENCE` wins; the arithmetic is the ledger's own
(:func:`~otel_tunix.accounting.categories.categorize_intervals`). Background work (another
thread's component that crossed an edge of the step) is not the step's and stays out, as it
stays out of busy / blocked / idle.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Final

from otel_tunix.accounting import categories as cat
from otel_tunix.model.steps import SpanInfo, StepSummary
from otel_tunix.settings.attributes import (
    BACKGROUND,
    KIND_BLOCKED,
    RL_POLICY_VERSION,
    RL_WEIGHT_SYNCS,
)

__all__ = [
    "IDLE",
    "OLD_ACTOR_INFERENCE",
    "OTHER",
    "OWN_SCALAR_NAMES",
    "PARTS",
    "PRECEDENCE",
    "REFERENCE_INFERENCE",
    "ROLLOUT",
    "ROLLOUT_WAIT",
    "SCALAR_NAMES",
    "STEP_TIME_SCALAR",
    "TRAINING",
    "WEIGHT_SYNC",
    "declare_framework_perf",
    "forget_framework_perf",
    "is_learner_step",
    "rl_part",
    "scalar_names",
    "step_parts",
    "summary_parts",
]

ROLLOUT: Final = "rollout"
ROLLOUT_WAIT: Final = "rollout_wait"
REFERENCE_INFERENCE: Final = "reference_inference"
OLD_ACTOR_INFERENCE: Final = "old_actor_inference"
TRAINING: Final = "training"
WEIGHT_SYNC: Final = "weight_sync"
OTHER: Final = "other"
IDLE: Final = "idle"

PARTS: Final = (
    ROLLOUT,
    ROLLOUT_WAIT,
    REFERENCE_INFERENCE,
    OLD_ACTOR_INFERENCE,
    TRAINING,
    WEIGHT_SYNC,
    OTHER,
    IDLE,
)
"""Every part of a learner step, in report order."""

PRECEDENCE: Final = (
    WEIGHT_SYNC,
    REFERENCE_INFERENCE,
    OLD_ACTOR_INFERENCE,
    ROLLOUT,
    TRAINING,
    OTHER,
    ROLLOUT_WAIT,
)
"""Which part an instant gets when components of several are open (first wins); an instant
in none is ``idle``. A wait comes last: one that overlaps work costs nothing."""

STEP_TIME_SCALAR: Final = "perf/global_step_time"
"""The MetricsLogger name of the learner step's wall time (Tunix's)."""

SCALAR_NAMES: Final[Mapping[str, str]] = {
    ROLLOUT: "perf/sum/rollout_time",
    ROLLOUT_WAIT: "rl/step/rollout_wait_time",
    REFERENCE_INFERENCE: "perf/sum/refer_inference_time",
    OLD_ACTOR_INFERENCE: "rl/step/old_actor_inference_time",
    TRAINING: "perf/sum/actor_train_time",
    WEIGHT_SYNC: "perf/weight_sync_time",
    OTHER: "rl/step/other_time",
    IDLE: "rl/step/idle_time",
}
"""The MetricsLogger name of each part: Tunix's ``perf/*`` name where Tunix has one for the
same time, else ``rl/step/<part>_time``. (Tunix's ``perf/rollout_idle_time`` is the rollout
engine's idle time, not the learner's wait, so the wait has a name of its own.)"""

OWN_SCALAR_NAMES: Final[Mapping[str, str]] = {
    **{part: f"rl/step/{part}_time" for part in PARTS},
    "step": "rl/step/step_time",
}
"""The names used instead of :data:`SCALAR_NAMES` (and :data:`STEP_TIME_SCALAR`, under
``"step"``) for a scope whose framework logs Tunix's ``perf/*`` figures itself
(:func:`declare_framework_perf`): one name, one meaning, at each step."""

_framework_perf: set[str] = set()
"""Scopes whose framework integration logs Tunix's ``perf/*`` names itself."""


def declare_framework_perf(scope: str) -> None:
    """Say that the framework logs Tunix's own ``perf/*`` figures for the learner steps of
    ``scope`` (the Tunix integration's perf tracer does, from the same spans but over its
    global step): the breakdown of those steps is then logged under
    :data:`OWN_SCALAR_NAMES` only."""
    _framework_perf.add(scope)


def forget_framework_perf() -> None:
    """Forget every :func:`declare_framework_perf` (a new run starts: its integrations
    declare again as their learner steps open)."""
    _framework_perf.clear()


def scalar_names(scope: str) -> tuple[str, Mapping[str, str]]:
    """The MetricsLogger names of a learner step of ``scope``: ``(step time, {part:
    name})``."""
    if scope in _framework_perf:
        return OWN_SCALAR_NAMES["step"], OWN_SCALAR_NAMES
    return STEP_TIME_SCALAR, SCALAR_NAMES


_WAIT: Final = re.compile(r"queue_(?:wait|get)|^wait$", re.I)
_REFERENCE: Final = re.compile(r"refer(?:ence)?_inference|(?:^|_)ref_(?:logp|forward)", re.I)
_OLD_ACTOR: Final = re.compile(r"old_(?:actor|policy)|old_logp", re.I)
_ROLLOUT: Final = re.compile(r"rollout|generat|sampling", re.I)

_NAME_RULES: Final = (
    (cat.WEIGHT_SYNC_NAMES, WEIGHT_SYNC),
    (_WAIT, ROLLOUT_WAIT),
    (cat.ROLLOUT_WAIT_NAMES, ROLLOUT_WAIT),
    (_REFERENCE, REFERENCE_INFERENCE),
    (_OLD_ACTOR, OLD_ACTOR_INFERENCE),
    (_ROLLOUT, ROLLOUT),
)
_BY_CATEGORY: Final[Mapping[str, str]] = {
    cat.WEIGHT_SYNC: WEIGHT_SYNC,
    cat.ROLLOUT_WAIT: ROLLOUT_WAIT,
    cat.DATA_STALL: ROLLOUT_WAIT,
    cat.PRODUCTIVE: TRAINING,
}


@lru_cache(maxsize=1024)
def rl_part(name: str, blocked: bool, category: str | None = None) -> str:
    """The part of a learner step a component of that name, kind and recorded category
    counts in: by name first (the rules in the module's table), else by its goodput
    category (:func:`~otel_tunix.accounting.categories.classify`)."""
    for rule, part in _NAME_RULES:
        if rule.search(name):
            return part
    return _BY_CATEGORY.get(cat.classify(name, blocked, category), OTHER)


def is_learner_step(scope: str, attributes: Mapping[str, object] | None) -> bool:
    """A step the breakdown is for: its scope's last part is ``learner`` (``rl/learner``),
    or it consumed rollouts or synced weights (``otel_tunix.rl`` set its attributes)."""
    if scope == "learner" or scope.endswith("/learner"):
        return True
    if not attributes:
        return False
    return RL_POLICY_VERSION in attributes or RL_WEIGHT_SYNCS in attributes


def step_parts(start_ns: int, end_ns: int, spans: Iterable[SpanInfo]) -> dict[str, float]:
    """Seconds of the window ``[start_ns, end_ns]`` in each of :data:`PARTS` (zeros
    included), from the step's component spans; they add up to the window."""
    intervals = [
        (rl_part(s.name, s.kind == KIND_BLOCKED, s.category), s.start_ns, s.end_ns)
        for s in spans
        if s.attributes.get(BACKGROUND) is not True
    ]
    got = cat.categorize_intervals(start_ns, end_ns, intervals, IDLE, PRECEDENCE)
    return {part: got.get(part, 0.0) for part in PARTS}


def summary_parts(summary: StepSummary) -> dict[str, float]:
    """:func:`step_parts` of a finished step (its host window and component spans)."""
    end = max(summary.end_ns, summary.start_ns + round(summary.step_time_sec * 1e9))
    return step_parts(summary.start_ns, end, summary.spans)
