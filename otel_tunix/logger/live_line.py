"""The live line: every N seconds one line on stderr with where training stands.

::

    otel-tunix step 120 | loss 2.4512 | tokens/s 57,855 | mfu 55.1% | step 20.2 ms |
    busy 89% blocked 11% idle 0%

(printed as one line). As torchtitan's logger prints it, from what the run already has:
:class:`LiveLine` is a MetricsLogger backend, so it sees the scalars the program logs (``loss``,
``tokens_per_sec``, ``mfu``...) and the ``perf/<scope>/...`` figures the step worker logs
(step time, busy / blocked / idle). Logging only stores the latest values under a lock; the
line is formatted and printed by a daemon thread of its own, never by the training thread.
Step time and the busy / blocked / idle shares are means over the steps recorded since the
previous line; the other values are the latest. Turned on by
``OTEL_TUNIX_CONSOLE_INTERVAL=SECONDS`` (or ``configure(console_interval=...)``); rank 0 only.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from otel_tunix.logger.backend import LoggingBackend, Row
from otel_tunix.logger.perf_rows import PerfRows

__all__ = ["LiveLine", "format_line"]

_PERF = "perf/"
_PREFERRED = ("train", "rl/learner")
_TOTALS = ("steps", "step_time_sec", "busy_time_sec", "blocked_time_sec", "idle_time_sec")
_SHOWN = (  # logged scalar, label, format
    ("loss", "loss", "{:.4f}"),
    ("reward", "reward", "{:.3f}"),
    ("rewards/mean", "reward", "{:.3f}"),
    ("tokens_per_sec", "tokens/s", "{:,.0f}"),
    ("mfu", "mfu", "{:.1%}"),
)


def format_line(
    step: int | None, values: Mapping[str, float], scope: str | None, totals: Mapping[str, float]
) -> str:
    """One live line: the step, the latest logged ``values`` shown (loss, reward, tokens/s,
    MFU), and ``scope``'s mean step time and busy / blocked / idle shares from ``totals``
    (``steps`` and the sums of their step, busy, blocked and idle times)."""
    parts = [f"otel-tunix step {step if step is not None else '?'}"]
    shown: set[str] = set()
    for name, label, fmt in _SHOWN:
        if name in values and label not in shown:
            shown.add(label)
            parts.append(f"{label} {fmt.format(values[name])}")
    steps = totals.get("steps", 0.0)
    step_sum = totals.get("step_time_sec", 0.0)
    if steps and step_sum > 0:
        prefix = "" if scope in (None, "train") else f"{scope} "
        parts.append(f"{prefix}step {step_sum / steps * 1e3:.1f} ms")
        parts.append(
            " ".join(
                f"{kind} {totals.get(f'{kind}_time_sec', 0.0) / step_sum:.0%}"
                for kind in ("busy", "blocked", "idle")
            )
        )
    return " | ".join(parts)


class LiveLine(LoggingBackend):
    """A MetricsLogger backend that prints :func:`format_line` every ``interval_sec``.

    Args:
        interval_sec: Seconds between lines (a line is printed only when something was
            logged since the previous one).
        write: Where a line goes (default: stderr, flushed).
    """

    def __init__(self, interval_sec: float, *, write: Callable[[str], None] | None = None) -> None:
        if not interval_sec > 0:
            raise ValueError(f"interval_sec must be > 0, got {interval_sec!r}")
        self.interval_sec = float(interval_sec)
        self._write = write or _to_stderr
        self._lock = threading.Lock()
        self._values: dict[str, float] = {}
        self._step: int | None = None
        self._totals: dict[str, dict[str, float]] = {}
        self._fresh = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel-tunix-live-line", daemon=True)
        self._thread.start()

    def log_scalars(self, values: Mapping[str, float], **kwargs: Any) -> None:
        """Keep the latest values the program logs (``perf/...`` ones come as rows)."""
        step = kwargs.get("step")
        plain = {k: v for k, v in values.items() if not k.startswith(_PERF)}
        if not plain:
            return
        with self._lock:
            self._values.update(plain)
            if isinstance(step, int):
                self._step = step if self._step is None else max(self._step, step)
            self._fresh = True

    def log_rows(self, rows: Sequence[Row], **kwargs: Any) -> None:
        """The step worker's batch: add each step's time and busy / blocked / idle time to
        its scope's totals (read from the step summaries, no dicts made)."""
        if not isinstance(rows, PerfRows):
            super().log_rows(rows, **kwargs)
            return
        with self._lock:
            for s in rows.summaries:
                t = self._totals.setdefault(s.scope, dict.fromkeys(_TOTALS, 0.0))
                t["steps"] += 1
                t["step_time_sec"] += s.step_time_sec
                t["busy_time_sec"] += s.busy_time_sec
                t["blocked_time_sec"] += s.blocked_time_sec
                t["idle_time_sec"] += s.idle_time_sec
            self._fresh = self._fresh or bool(rows.summaries)

    def log_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        """One scalar: as :meth:`log_scalars` with one value."""
        self.log_scalars({event: value}, **kwargs)

    def line(self) -> str | None:
        """The line for what was logged since the previous call (``None``: nothing new)."""
        with self._lock:
            if not self._fresh:
                return None
            self._fresh = False
            totals, self._totals = self._totals, {}
            values, step = dict(self._values), self._step
        # the training loop's scope when there is one (an RL run: its learner's)
        scope = next((s for s in _PREFERRED if s in totals), next(iter(totals), None))
        return format_line(step, values, scope, totals.get(scope, {}) if scope else {})

    def _run(self) -> None:
        while not self._stop.wait(self.interval_sec):
            self._emit()

    def _emit(self) -> None:
        text = self.line()
        if text is not None:
            self._write(text)

    def close(self) -> None:
        """Stop the thread; print a last line for what came since the previous one."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(timeout=self.interval_sec + 1.0)
            self._emit()


def _to_stderr(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # a closed or broken stderr: never worth a crash
        pass
