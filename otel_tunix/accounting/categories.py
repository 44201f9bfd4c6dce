"""Goodput categories: the one place that says which kind of time a component is.

The job ledger (live: :mod:`otel_tunix.metrics`; offline: ``otel-tunix goodput``) gives
every instant of a run one category. A component's category comes from, in this order:

1. the category it was declared with (``component(name, category=...)``, or
   :func:`declare` by an integration for the names it records);
2. its name, by the rules below (:func:`classify`);
3. its kind: a busy component is ``productive``, a blocked one ``other``.

Where components of several categories are open at one instant, the first in
:data:`PRECEDENCE` wins: a checkpoint written inside a step is never productive, and a data
loader prefetching on another thread while the step computes costs nothing.

The categories of whole stretches of the job (no component decides them) are
``initialization`` (process start to the first step), ``wasted_progress`` (steps a restart
threw away), ``restart_gap`` (between one attempt's last record and the next one's start)
and ``other`` (the rest of the non-productive time: idle, unnamed waits). docs/goodput.md
gives each rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Final

from otel_tunix.accounting.step_time import union_ns

__all__ = [
    "BADPUT",
    "CHECKPOINT_RESTORE",
    "CHECKPOINT_SAVE",
    "COMPILATION",
    "COMPONENT_CATEGORIES",
    "DATA_STALL",
    "EVALUATION",
    "INITIALIZATION",
    "OTHER",
    "PRECEDENCE",
    "PRODUCTIVE",
    "PROFILING",
    "RESTART_GAP",
    "ROLLOUT_WAIT",
    "WASTED_PROGRESS",
    "WEIGHT_SYNC",
    "categorize_intervals",
    "check_category",
    "classify",
    "declare",
    "declared",
    "declared_now",
    "is_eval_scope",
]

PRODUCTIVE: Final = "productive"
INITIALIZATION: Final = "initialization"
COMPILATION: Final = "compilation"
DATA_STALL: Final = "data_stall"
CHECKPOINT_SAVE: Final = "checkpoint_save"
CHECKPOINT_RESTORE: Final = "checkpoint_restore"
EVALUATION: Final = "evaluation"
ROLLOUT_WAIT: Final = "rollout_wait"
WEIGHT_SYNC: Final = "weight_sync"
PROFILING: Final = "profiling"
WASTED_PROGRESS: Final = "wasted_progress"
RESTART_GAP: Final = "restart_gap"
OTHER: Final = "other"

BADPUT: Final = (
    INITIALIZATION,
    COMPILATION,
    DATA_STALL,
    CHECKPOINT_SAVE,
    CHECKPOINT_RESTORE,
    EVALUATION,
    ROLLOUT_WAIT,
    WEIGHT_SYNC,
    PROFILING,
    WASTED_PROGRESS,
    RESTART_GAP,
    OTHER,
)
"""Every badput category, in report order (the keys of ``badput_sec``)."""

PRECEDENCE: Final = (
    CHECKPOINT_RESTORE,
    CHECKPOINT_SAVE,
    EVALUATION,
    COMPILATION,
    INITIALIZATION,
    WEIGHT_SYNC,
    PROFILING,
    PRODUCTIVE,
    ROLLOUT_WAIT,
    DATA_STALL,
    OTHER,
)
"""Which category an instant gets when components of several are open (first wins). Waits
(``rollout_wait``, ``data_stall``, ``other``) come after ``productive``: a wait that overlaps
productive work on another thread costs nothing."""

COMPONENT_CATEGORIES: Final = frozenset(PRECEDENCE)
"""The categories a component can have or be declared with (the job-level
``wasted_progress`` and ``restart_gap`` are not a component's)."""

CHECKPOINT_RESTORE_NAMES: Final = re.compile(
    r"(?:checkpoint|ckpt).*(?:restore|load)|(?:restore|load).*(?:checkpoint|ckpt)", re.I
)
"""Names counted as ``checkpoint_restore`` (``checkpoint_restore``, ``load_checkpoint``)."""
CHECKPOINT_SAVE_NAMES: Final = re.compile(
    r"checkpoint|ckpt|save_model|model_save|save_state|save_pretrained", re.I
)
"""Names counted as ``checkpoint_save`` (the other checkpoint names: ``checkpoint_save``,
``ckpt_write``, ``save_model``)."""
EVAL_NAMES: Final = re.compile(
    r"(?:^|[_/.\-])(?:eval|evaluate|evaluation|val|valid|validation|test)(?:[_/.\-]|$)", re.I
)
"""Scope and component names counted as ``evaluation``: the word ``eval``, ``val``,
``validation``, ``test``, ... delimited by ``_ / . -`` or the ends of the name."""
COMPILE_NAMES: Final = re.compile(
    r"compil|(?:^|_)jit(?:_|$)|jax_trace|jax_lower|dynamo|warmup|warm_up", re.I
)
"""Names counted as ``compilation`` (``jax_compile``, ``jax_trace``, ``jax_lower``,
``torch_compile``, ``warmup``)."""
WEIGHT_SYNC_NAMES: Final = re.compile(r"weight_?sync|sync_?weights|weights_?sync", re.I)
"""Names counted as ``weight_sync`` (RL: publishing the learner's weights to the actors)."""
ROLLOUT_WAIT_NAMES: Final = re.compile(r"rollout.*(?:wait|idle)|(?:wait|idle).*rollout", re.I)
"""Names counted as ``rollout_wait`` (an RL learner waiting for rollouts)."""
DATA_NAMES: Final = re.compile(r"data|input|batch|prefetch|queue|loader", re.I)
"""Names counted as ``data_stall`` (``train_data_load``, ``train_queue_wait``, ...), where no
productive work overlaps them."""

_NAME_RULES: Final = (
    (CHECKPOINT_RESTORE_NAMES, CHECKPOINT_RESTORE),
    (CHECKPOINT_SAVE_NAMES, CHECKPOINT_SAVE),
    (EVAL_NAMES, EVALUATION),
    (COMPILE_NAMES, COMPILATION),
    (WEIGHT_SYNC_NAMES, WEIGHT_SYNC),
    (ROLLOUT_WAIT_NAMES, ROLLOUT_WAIT),
    (DATA_NAMES, DATA_STALL),
)

_declared: dict[str, str] = {}
"""Declared categories by component name (bounded: :data:`_MAX_DECLARED`)."""
_MAX_DECLARED = 4096


def check_category(category: str) -> str:
    """``category`` if it is one a component can have, else a ``ValueError`` naming it and
    the allowed ones."""
    if category not in COMPONENT_CATEGORIES:
        allowed = ", ".join(sorted(COMPONENT_CATEGORIES))
        raise ValueError(f"unknown goodput category {category!r}: expected one of {allowed}")
    return category


def declare(name: str, category: str) -> None:
    """Give every component called ``name`` the goodput category ``category`` (one of
    :data:`COMPONENT_CATEGORIES`; a ``ValueError`` otherwise). The latest declaration of a
    name wins. Integrations declare the names they record; users pass
    ``component(name, category=...)``."""
    check_category(category)
    if _declared.get(name) == category:
        return
    if len(_declared) < _MAX_DECLARED or name in _declared:
        _declared[name] = category
        classify.cache_clear()


def declared(name: str) -> str | None:
    """The category ``name`` was declared with, if any."""
    return _declared.get(name)


declared_now: Final = _declared.get
""":func:`declared` without a Python frame: what ``component()`` calls to capture a
component's category when it is recorded (the dict is never replaced, only updated)."""


@lru_cache(maxsize=4096)
def classify(name: str, blocked: bool, category: str | None = None) -> str:
    """The category of one component: ``category`` if given (as recorded with the span),
    else the one declared for ``name``, else by name, else ``productive`` (busy) or
    ``other`` (blocked)."""
    if category in COMPONENT_CATEGORIES:
        return category
    known = _declared.get(name)
    if known is not None:
        return known
    for rule, cat in _NAME_RULES:
        if rule.search(name):
            return cat
    return OTHER if blocked else PRODUCTIVE


@lru_cache(maxsize=1024)
def is_eval_scope(scope: str) -> bool:
    """True for scopes whose steps are evaluation as a whole (``eval``, ``val``, ...)."""
    return bool(EVAL_NAMES.search(scope))


def categorize_intervals(
    start_ns: int,
    end_ns: int,
    intervals: Iterable[tuple[str, int, int]],
    rest: str = PRODUCTIVE,
    precedence: Sequence[str] = PRECEDENCE,
) -> dict[str, float]:
    """Seconds of the window ``[start_ns, end_ns]`` in each category, from intervals already
    classified (``(category, start_ns, end_ns)``, clipped to the window here), each instant
    by :data:`PRECEDENCE`; the instants no interval covers are ``rest`` (``productive``
    inside a training step: its time not spent in a badput component is what it is for).
    They add up to the window. The live ledger and ``otel-tunix goodput`` both use it;
    :mod:`otel_tunix.accounting.rl_steps` with its own parts and ``precedence``."""
    window = max(0, end_ns - start_ns)
    by_cat: dict[str, list[tuple[int, int]]] = {}
    for cat, s0, s1 in intervals:
        s0, s1 = max(s0, start_ns), min(s1, end_ns)
        if s1 > s0:
            by_cat.setdefault(cat, []).append((s0, s1))
    out: dict[str, float] = {}
    covered: list[tuple[int, int]] = []
    before = 0
    for cat in precedence:
        ivs = by_cat.get(cat)
        if not ivs:
            continue
        covered.extend(ivs)
        after = union_ns(covered)
        if after > before:
            out[cat] = (after - before) * 1e-9
        before = after
    if window > before:
        out[rest] = out.get(rest, 0.0) + (window - before) * 1e-9
    return out
