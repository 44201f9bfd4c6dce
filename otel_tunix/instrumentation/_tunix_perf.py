"""Tunix's own perf metrics, computed from otel-tunix's spans of the last RL global step.

What :meth:`OTelPerfTracer.export` returns to Tunix after each global step, so Tunix logs
``perf/global_step_time``, ``perf/weight_sync_time`` and
``perf/{sum,mean}/{rollout,refer_inference,actor_train,actor_train_step}_time`` to all its
backends as its own ``PerfMetricsExport`` does (its colocated form), with no Tunix
``perf_config``. The figures come from the ``rl/learner`` step and the ``rl/actor`` steps
inside its window:

* ``global_step_time``: the learner step's host window (Tunix's ``global_step`` group);
* ``weight_sync_time``: its last ``weight_sync`` component (0 when weights were not synced);
* ``rollout_time`` / ``refer_inference_time``: each ``rollout`` / ``reference_inference``
  component, from its start to its device end;
* ``actor_train_time``: each ``actor_training`` component (host);
* ``actor_train_step_time``: each ``peft_train_step`` of the actor's steps, on the host (as
  Tunix reads it from its thread timeline).

A ``mean`` is left out when there was no such span (Tunix would log NaN).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from otel_tunix.accounting.rl_steps import declare_framework_perf
from otel_tunix.consumers.step_accounting import StepSink
from otel_tunix.model.steps import SpanInfo, StepSummary
from otel_tunix.recording.current_run import CurrentRun, get_current
from otel_tunix.settings import attributes as attr
from otel_tunix.support.errors import warn_once

_logger = logging.getLogger("otel_tunix.instrumentation.tunix")  # the public module's logger

LEARNER_SCOPE = "rl/learner"
ACTOR_SCOPE = "rl/actor"
EXPORT_WAIT_SEC = 10.0
"""How long ``export()`` waits for the global step's device work and processing."""
_MAX_KEPT = 4096
"""Actor steps kept while their learner step is being processed (memory stays bounded)."""

MetricsT = dict[str, tuple[float, None]]


class _RecentSteps(StepSink):
    """The latest learner step with the actor steps inside its window."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._actor: list[StepSummary] = []
        self.latest: tuple[StepSummary, list[StepSummary]] | None = None

    def on_step(self, summary: StepSummary) -> None:
        scope = summary.scope
        if scope == ACTOR_SCOPE:
            with self._lock:
                self._actor.append(summary)
                del self._actor[:-_MAX_KEPT]
        elif scope == LEARNER_SCOPE:
            start, end = summary.start_ns, summary.end_ns
            with self._lock:
                inside = [s for s in self._actor if start <= s.start_ns and s.end_ns <= end]
                self._actor = [s for s in self._actor if s.start_ns > end]
                self.latest = (summary, inside)


class LearnerExport:
    """Keeps the steps ``export()`` reads, from the run in which a learner step opened."""

    def __init__(self) -> None:
        self._sink: _RecentSteps | None = None
        self._run: CurrentRun | None = None
        self.closed: int | None = None
        """Number of the learner step the tracer closed last."""

    def watch(self) -> None:
        """Follow the current run's steps (called as a learner step opens)."""
        declare_framework_perf(LEARNER_SCOPE)  # Tunix logs its perf/* names itself
        run = get_current()
        if run is not None and run is not self._run:
            sink = _RecentSteps()
            run.add_step_sink(sink)
            self._sink, self._run = sink, run

    def metrics(self, timeout: float = EXPORT_WAIT_SEC) -> MetricsT:
        """Tunix's perf metrics of the learner step closed last ({} when it was not
        sampled, or not processed within ``timeout``)."""
        run, sink, number = self._run, self._sink, self.closed
        if run is None or sink is None or number is None or run is not get_current():
            return {}
        if not run.process_steps(timeout):
            warn_once(
                ("tunix", "export-wait"),
                "otel-tunix: Tunix perf metrics of a global step were not ready within %.0f s; "
                "not logged for that step (reported once)",
                timeout,
                logger=_logger,
            )
        latest = sink.latest
        if latest is None or latest[0].step != number:
            return {}
        return perf_metrics(*latest)


def _seconds(span: SpanInfo) -> float:
    return (span.end_ns - span.start_ns) * 1e-9


def _host_seconds(span: SpanInfo) -> float:
    host: Any = span.attributes.get(attr.HOST_DURATION)
    return float(host) if host is not None else _seconds(span)


def perf_metrics(learner: StepSummary, actor_steps: Sequence[StepSummary]) -> MetricsT:
    """Tunix's ``PerfMetricsExport`` figures (colocated form) from otel-tunix's steps."""
    spans = learner.spans
    weight_sync = [_seconds(s) for s in spans if s.name == "weight_sync"]
    lists = {
        "rollout_time": [_seconds(s) for s in spans if s.name == "rollout"],
        "refer_inference_time": [_seconds(s) for s in spans if s.name == "reference_inference"],
        "actor_train_time": [_seconds(s) for s in spans if s.name == "actor_training"],
        "actor_train_step_time": [
            _host_seconds(s) for a in actor_steps for s in a.spans if s.name == "peft_train_step"
        ],
    }
    out: MetricsT = {
        "perf/global_step_time": (learner.step_time_sec, None),
        "perf/weight_sync_time": (weight_sync[-1] if weight_sync else 0.0, None),
    }
    for key, values in lists.items():
        out[f"perf/sum/{key}"] = (float(sum(values)), None)
        if values:
            out[f"perf/mean/{key}"] = (sum(values) / len(values), None)
    return out
