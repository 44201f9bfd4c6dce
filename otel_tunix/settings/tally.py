"""Counts of what otel-tunix refused, cleaned or redacted, for ``summary.json``.

Each is a process-wide count (``names_cleaned``, ``values_cleaned``, ``secrets_redacted``,
``metric_names_refused``, ``hook_calls_dropped``); a run reports what was added since its
``configure()`` began (:func:`start_run`, :func:`this_run`), and the counts that describe the
process as it is (:func:`hold`: ``tunix_patches_missing``). Incremented on slow paths only (the
first sight of a name, a refusal), so a lock costs nothing that matters.
"""

from __future__ import annotations

import threading
from collections import Counter

__all__ = ["add", "hold", "since", "snapshot", "start_run", "this_run"]

_lock = threading.Lock()
_counts: Counter[str] = Counter()
_run_start: dict[str, int] = {}
_held: dict[str, int] = {}


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


def hold(what: str, n: int) -> None:
    """Set a count that describes the process as it is, not events (``tunix_patches_missing``:
    integration patches that found nothing to patch): every run reports it while it is above
    0, whenever it was set."""
    with _lock:
        if n > 0:
            _held[what] = n
        else:
            _held.pop(what, None)


def this_run() -> dict[str, int]:
    """What was counted since the current run began, and the counts :func:`hold` sets."""
    counted = since(_run_start)
    with _lock:
        counted.update(_held)
    return dict(sorted(counted.items()))
