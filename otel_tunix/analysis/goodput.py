"""Goodput: which part of a run's wall time was productive training, and where the rest went.

Every instant of a step window gets one category, by the components open at that instant
(on any thread), in this order of precedence:

1. ``checkpointing``: a component whose name matches :data:`CHECKPOINT_NAMES`;
2. ``evaluation``: a component whose name matches :data:`EVAL_NAMES`; every step of a scope
   whose name matches it (``eval``, ``val``, ``validation``, ``test``) counts as evaluation
   as a whole;
3. ``compilation``: a component whose name matches :data:`COMPILE_NAMES`;
4. ``productive``: any other busy component;
5. ``data_wait``: a component (busy or blocked) whose name matches :data:`DATA_NAMES`;
6. ``other_blocked``: any other blocked component;
7. ``idle``: no component open.

So a data loader running on a prefetch thread while the step computes costs nothing, and a
checkpoint written inside a step is never productive. The run-level figures
(:class:`~otel_tunix.analysis.breakdown.Goodput`) add ``startup`` (from the run's start to its
first step) and, for the first step of each non-evaluation scope, its time beyond the
scope's median step time as ``compilation`` (JIT compilation, warm-up); time between steps,
in no step at all, is ``idle``. The device's run-on after the last host step (an
asynchronous loop's dispatched work still running when its host loop ends) is part of the
wall time, each instant by the components still running on the device then
(:func:`categorize_intervals`). The exact rules are in ``docs/local-analysis.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Final

from otel_tunix.accounting import union_ns
from otel_tunix.attributes import KIND_BLOCKED

__all__ = [
    "BADPUT",
    "CATEGORIES",
    "CHECKPOINTING",
    "COMPILATION",
    "DATA_WAIT",
    "EVALUATION",
    "IDLE",
    "LABELS",
    "OTHER_BLOCKED",
    "PRODUCTIVE",
    "STARTUP",
    "categorize_intervals",
    "categorize_step",
    "classify_component",
    "is_eval_scope",
]

PRODUCTIVE: Final = "productive"
STARTUP: Final = "startup"
COMPILATION: Final = "compilation"
DATA_WAIT: Final = "data_wait"
CHECKPOINTING: Final = "checkpointing"
EVALUATION: Final = "evaluation"
OTHER_BLOCKED: Final = "other_blocked"
IDLE: Final = "idle"

BADPUT: Final = (STARTUP, COMPILATION, DATA_WAIT, CHECKPOINTING, EVALUATION, OTHER_BLOCKED, IDLE)
"""The badput categories, in report order."""
CATEGORIES: Final = (PRODUCTIVE, *BADPUT)
LABELS: Final = {
    PRODUCTIVE: "productive",
    STARTUP: "start-up",
    COMPILATION: "compilation / warm-up",
    DATA_WAIT: "data wait",
    CHECKPOINTING: "checkpointing",
    EVALUATION: "evaluation",
    OTHER_BLOCKED: "other blocked",
    IDLE: "idle",
}

CHECKPOINT_NAMES: Final = re.compile(r"checkpoint|ckpt|save_model|model_save|save_state", re.I)
"""Component names counted as checkpointing (``checkpoint_save``, ``ckpt_restore``, ...)."""
EVAL_NAMES: Final = re.compile(
    r"(?:^|[_/.\-])(?:eval|evaluate|evaluation|val|valid|validation|test)(?:[_/.\-]|$)", re.I
)
"""Scope and component names counted as evaluation: the word ``eval``, ``val``,
``validation``, ``test``, ... delimited by ``_ / . -`` or the ends of the name."""
COMPILE_NAMES: Final = re.compile(r"compil|(?:^|_)jit(?:_|$)|warmup|warm_up", re.I)
"""Component names counted as compilation / warm-up (``xla_compile``, ``jit_trace``, ...)."""
DATA_NAMES: Final = re.compile(r"data|input|batch|prefetch|queue|loader", re.I)
"""Component names counted as data wait (``train_data_load``, ``train_queue_wait``, ...)."""

_PRECEDENCE: Final = (CHECKPOINTING, EVALUATION, COMPILATION, PRODUCTIVE, DATA_WAIT, OTHER_BLOCKED)


@lru_cache(maxsize=4096)
def classify_component(name: str, kind: str) -> str:
    """The category of a component span (before precedence; see the module docstring)."""
    if CHECKPOINT_NAMES.search(name):
        return CHECKPOINTING
    if EVAL_NAMES.search(name):
        return EVALUATION
    if COMPILE_NAMES.search(name):
        return COMPILATION
    if DATA_NAMES.search(name):
        return DATA_WAIT
    return OTHER_BLOCKED if kind == KIND_BLOCKED else PRODUCTIVE


@lru_cache(maxsize=1024)
def is_eval_scope(scope: str) -> bool:
    """True for scopes whose steps are evaluation as a whole (``eval``, ``val``, ...)."""
    return bool(EVAL_NAMES.search(scope))


def categorize_step(
    scope: str, start_ns: int, end_ns: int, spans: Iterable[Mapping[str, object]]
) -> dict[str, float]:
    """Seconds of one step window in each category (``idle`` included; they add up to the
    window).

    Args:
        scope: The step's scope.
        start_ns: Start of the step window (Unix ns).
        end_ns: End of the step window (the JSONL's ``end_ns``, which already covers late
            components).
        spans: The step's component spans as written in the spans JSONL (``name``, ``kind``,
            ``start_ns``, ``end_ns``).
    """
    window = max(0, end_ns - start_ns)
    if is_eval_scope(scope):
        return {EVALUATION: window * 1e-9} if window else {}
    intervals: list[tuple[str, int, int]] = []
    for s in spans:
        try:
            s0, s1 = int(s["start_ns"]), int(s["end_ns"])  # type: ignore[call-overload]
        except (KeyError, TypeError, ValueError):
            continue
        cat = classify_component(str(s.get("name", "")), str(s.get("kind", "")))
        intervals.append((cat, s0, s1))
    return categorize_intervals(start_ns, end_ns, intervals)


def categorize_intervals(
    start_ns: int, end_ns: int, intervals: Iterable[tuple[str, int, int]]
) -> dict[str, float]:
    """Seconds of the window in each category, from intervals already classified
    (``(category, start_ns, end_ns)``, clipped to the window), by the precedence of
    :func:`categorize_step`; ``idle`` where none is open. They add up to the window."""
    window = max(0, end_ns - start_ns)
    by_cat: dict[str, list[tuple[int, int]]] = {}
    for cat, s0, s1 in intervals:
        s0, s1 = max(s0, start_ns), min(s1, end_ns)
        if s1 > s0:
            by_cat.setdefault(cat, []).append((s0, s1))
    out: dict[str, float] = {}
    covered: list[tuple[int, int]] = []
    before = 0
    for cat in _PRECEDENCE:
        ivs = by_cat.get(cat)
        if not ivs:
            continue
        covered.extend(ivs)
        after = union_ns(covered)
        if after > before:
            out[cat] = (after - before) * 1e-9
        before = after
    if window > before:
        out[IDLE] = (window - before) * 1e-9
    return out
