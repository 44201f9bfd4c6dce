"""The RL learner step's breakdown as MetricsLogger scalars, per sampled learner step.

For each learner step (:func:`~otel_tunix.accounting.rl_steps.is_learner_step`) it logs, at
the step's number, its wall time as ``perf/global_step_time`` and each part of
:func:`~otel_tunix.accounting.rl_steps.summary_parts` under
:data:`~otel_tunix.accounting.rl_steps.SCALAR_NAMES` (Tunix's ``perf/*`` names where Tunix
has one; ``rl/step/*`` ones where the framework logs Tunix's names itself:
:func:`~otel_tunix.accounting.rl_steps.declare_framework_perf`). The parts add up to the
step time. ``docs/rl.md`` has the table.
"""

from __future__ import annotations

from collections.abc import Sequence

from otel_tunix.accounting.rl_steps import (
    forget_framework_perf,
    is_learner_step,
    scalar_names,
    summary_parts,
)
from otel_tunix.consumers.step_accounting import StepSink
from otel_tunix.logger.backend import PERF_SOURCE
from otel_tunix.logger.metrics_logger import MetricsLogger
from otel_tunix.model.steps import ScopeSession, StepSummary

__all__ = ["RLStepSink", "rl_step_scalars"]


def rl_step_scalars(summary: StepSummary) -> dict[str, float]:
    """The scalars of one learner step: its time and its parts, by MetricsLogger name."""
    step_name, names = scalar_names(summary.scope)
    out = {step_name: summary.step_time_sec}
    for part, seconds in summary_parts(summary).items():
        out[names[part]] = seconds
    return out


class RLStepSink(StepSink):
    """Logs :func:`rl_step_scalars` of each sampled learner step (``source="perf"``: they
    go to the MetricsLogger's backends, not to OTel instruments)."""

    def __init__(self, logger: MetricsLogger) -> None:
        self._logger = logger
        forget_framework_perf()  # a new run: its integrations declare again

    def on_steps(self, summaries: Sequence[StepSummary]) -> None:
        """A batch of steps: the learner steps among them, logged in order."""
        if not any(is_learner_step(s.scope, s.attributes) for s in summaries):
            return
        if not self._logger.wants(PERF_SOURCE):
            return
        for s in summaries:
            if is_learner_step(s.scope, s.attributes):
                self._logger.log_dict(rl_step_scalars(s), step=s.step, source=PERF_SOURCE)

    def on_session(self, sessions: list[ScopeSession]) -> None:
        return None

    def close(self) -> None:
        return None
