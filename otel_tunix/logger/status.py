"""In-process metrics summary for scripts and notebooks: ``get_metrics_summary()``.

::

    import otel_tunix
    from otel_tunix.logger import status

    otel_tunix.configure()
    status.install()                      # counts from now on (optional)
    ...
    s = status.get_metrics_summary()
    print(s["last_step"], s["last_loss"], s["num_metrics"])

The summary reads what the run already keeps (the MetricsLogger's last values and step,
the step counts of each scope, the latest step accounting) and, when installed, a
:class:`MetricsSummary` backend that counts every logged value per name. Alert engines and
system samplers on the logger add their state.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from otel_tunix.logger.backend import LoggingBackend, row_names
from otel_tunix.logger.perf_rows import PerfRows
from otel_tunix.recording import hot_path as _recording
from otel_tunix.recording.current_run import get_current
from otel_tunix.support.json_lines import floats_finite

__all__ = ["MetricsSummary", "get_metrics_summary", "install", "track_sampler"]


_MAX_NAME_SETS = 1024
"""Distinct sets of names counted apart before they are folded into per-name counts."""


class MetricsSummary(LoggingBackend):
    """MetricsLogger backend that counts logged values per name (and non-finite ones)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Rows counted per tuple of names (a training loop logs the same few sets of names
        # every step: one dict update per row instead of one per value); see ``counts``.
        self._rows: dict[tuple[str, ...], int] = {}
        self._folded: Counter[str] = Counter()
        self.nonfinite: Counter[str] = Counter()
        self.first_time: float | None = None
        self.last_time: float | None = None

    @property
    def counts(self) -> Counter[str]:
        """Values logged per name (a new Counter)."""
        with self._lock:
            out = Counter(self._folded)
            for names, n in self._rows.items():
                for name in names:
                    out[name] += n
        return out

    def log_rows(
        self, rows: Sequence[tuple[int | None, Mapping[str, float]]], **kwargs: Any
    ) -> None:
        """Count the values of several steps (one ``(step, values)`` per step)."""
        now = time.time()
        with self._lock:
            if self.first_time is None:
                self.first_time = now
            self.last_time = now
            counts = self._rows
            if isinstance(rows, PerfRows):  # counted from the step summaries: no row made
                for names, steps in rows.runs():  # durations: always finite
                    counts[names] = counts.get(names, 0) + len(steps)
            else:
                for names, run in itertools.groupby(rows, row_names):  # counted once a run
                    n = 0
                    for _, values in run:
                        n += 1
                        if not floats_finite(values.values()):
                            self.nonfinite.update(
                                k for k, v in values.items() if not math.isfinite(v)
                            )
                    counts[names] = counts.get(names, 0) + n
            if len(counts) > _MAX_NAME_SETS:  # names that change from row to row
                for names, n in counts.items():
                    self._folded.update(dict.fromkeys(names, n))
                counts.clear()

    def log_scalars(self, values: Mapping[str, float], **kwargs: Any) -> None:
        """Count the values of one ``log_dict`` call."""
        self.log_rows(((None, values),))

    def log_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        """Count one value."""
        self.log_scalars({event: value}, **kwargs)

    def close(self) -> None:
        """Nothing to release; the counts stay readable."""
        return None


def install(logger: Any = None) -> MetricsSummary:
    """Add a :class:`MetricsSummary` to a MetricsLogger (default: the current run's).

    Idempotent: returns the one already there.
    """
    if logger is None:
        run = get_current()
        if run is None:  # before configure(): nothing to count into yet
            return MetricsSummary()
        logger = run.logger
    for b in logger.backends:
        if isinstance(b, MetricsSummary):
            return b
    s = MetricsSummary()
    logger.backends.append(s)
    return s


SUMMARY_FLUSH_SEC = 1.0
""":func:`get_metrics_summary` waits this long at most for the MetricsLogger's backends to
be handed what was logged (its counts then match ``last_values``)."""


def get_metrics_summary(logger: Any = None) -> dict[str, Any]:
    """A JSON-ready dict of where the run stands.

    Keys: ``run_id``, ``last_step``, ``last_loss``, ``last_values`` (every name's latest
    value), ``num_metric_names``; with :func:`install`: ``num_metrics`` (values logged),
    ``counts`` per name and ``nonfinite`` per name; ``steps`` per scope (all steps, sampled
    or not); ``last_step_time_sec`` per the latest sampled step's accounting; ``alerts``
    (active alerts of the logger's alert engines) and ``system`` (latest sample of a
    started system sampler, see :func:`track_sampler`).
    """
    current = get_current()
    if logger is None and current is not None:
        logger = current.logger
    if logger is not None:  # the counts of every value logged so far (a few ms at most)
        logger.flush(SUMMARY_FLUSH_SEC, hooks=False)
    values = dict(logger.last_values) if logger is not None else {}
    backends = list(logger.backends) if logger is not None else []
    out: dict[str, Any] = {
        "run_id": current.info.run_id if current is not None else None,
        "last_step": logger.last_step if logger is not None else None,
        "last_loss": values.get("loss"),
        "last_values": values,
        "num_metric_names": len(values),
        "num_metrics": None,
        "counts": {},
        "nonfinite": {},
    }
    for b in logger.backends:
        if isinstance(b, MetricsSummary):
            with b._lock:
                out["nonfinite"] = dict(b.nonfinite)
            counts = b.counts
            out["num_metrics"] = sum(counts.values())
            out["counts"] = dict(counts)
    rt = _recording.get_runtime()
    out["steps"] = {scope: s.count for scope, s in list(rt.scopes.items())} if rt else {}
    last = current.last_step_summary() if current is not None else None
    out["last_step_time_sec"] = (
        {"scope": last.scope, "step": last.step, "step_time_sec": last.step_time_sec}
        if last is not None
        else None
    )
    out["alerts"] = [
        alert for b in backends if isinstance(b, LoggingBackend) for alert in b.active_alerts()
    ]
    sampler = _sampler
    latest = sampler.latest if sampler is not None else None
    out["system"] = _system_dict(latest) if latest is not None else None
    return out


_sampler: Any = None


def track_sampler(sampler: Any) -> None:
    """Include this :class:`~otel_tunix.metrics.system.SystemMetricsSampler`'s latest
    sample in :func:`get_metrics_summary` (``None`` to stop)."""
    global _sampler
    _sampler = sampler


def _system_dict(sample: Any) -> dict[str, Any]:
    return dataclasses.asdict(sample)
