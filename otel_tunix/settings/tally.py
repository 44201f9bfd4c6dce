"""Counts of what otel-tunix refused, cleaned or redacted, for ``summary.json``.

Each is a process-wide count (``names_cleaned``, ``values_cleaned``, ``secrets_redacted``,
``metric_names_refused``, ``hook_calls_dropped``); a run reports what was added since its
``configure()`` began (:func:`start_run`, :func:`this_run`). Incremented on slow paths only (the
first sight of a name, a refusal), so a lock costs nothing that matters.
"""

from __future__ import annotations

import threading
from collections import Counter

__all__ = ["add", "since", "snapshot", "start_run", "this_run"]

_lock = threading.Lock()
_counts: Counter[str] = Counter()
_run_start: dict[str, int] = {}


def add(what: str, n: int = 1) -> None:
    """Count ``n`` more of ``what``."""
    if n:
        with _lock:
            _counts[what] += n


def snapshot() -> dict[str, int]:
    """Every count so far."""
    with _lock:
        return dict(_counts)


def since(before: dict[str, int]) -> dict[str, int]:
    """What was counted since ``before`` (a :func:`snapshot`), the counts that grew only."""
    now = snapshot()
    return {k: v - before.get(k, 0) for k, v in sorted(now.items()) if v > before.get(k, 0)}


def start_run() -> None:
    """A run begins (``configure()``): :func:`this_run` counts from now."""
    global _run_start
    _run_start = snapshot()


def this_run() -> dict[str, int]:
    """What was counted since the current run began."""
    return since(_run_start)
