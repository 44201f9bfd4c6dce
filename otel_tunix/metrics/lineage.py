"""RL lineage and policy lag: which rollouts a learner step trained on, and how old they were.

In asynchronous RL an actor generates rollouts with the policy it has (version ``v``) while
the learner keeps training; the learner step that consumes them runs at a later version. Two
calls tie them together, whatever carries the batch between them (a ``queue.Queue`` between
threads, a ``multiprocessing`` queue, a Ray object, an HTTP body):

* :func:`rollout_context` on the actor side, inside the rollout's step or generation
  component: a small dict, the W3C ``traceparent`` of the span open there and the policy
  version, to put in the queue with the batch (plain strings and ints: it pickles and
  serialises to JSON);
* :func:`consume` on the learner side, inside the learner step: for each context, a link
  from the step span to the rollout span (at most :data:`MAX_ROLLOUT_LINKS` per step, the
  rest counted in ``tunix.rl.links_dropped``), each with the rollout's version and lag; the
  ``tunix.rl.policy_lag`` histogram (every rollout, every step, sampled or not); the step's
  largest lag on its span (``tunix.rl.policy_lag``) and as the MetricsLogger scalar
  ``policy_lag``, which the ``policy_lag`` alert rule watches
  (``OTEL_TUNIX_MAX_POLICY_LAG``).

Neither call raises into the training loop. ``docs/rl.md`` has the trace picture.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.trace import Link
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_tunix.logger.instruments import CatalogInstruments
from otel_tunix.model.alert_rules import POLICY_LAG_METRIC
from otel_tunix.recording.current_run import CurrentRun, get_current
from otel_tunix.recording.hot_path import StepRecord, context_step
from otel_tunix.settings import attributes as attr
from otel_tunix.support.errors import report_internal_error, warn_once

__all__ = [
    "MAX_ROLLOUT_LINKS",
    "POLICY_LAG",
    "TRACEPARENT",
    "VERSION",
    "consume",
    "rollout_context",
]

_logger = logging.getLogger(__name__)

MAX_ROLLOUT_LINKS: Final = 64
"""Links a learner step span carries to the rollouts it consumed; the rollouts past it are
counted (``tunix.rl.links_dropped``), their lag recorded all the same. Under the SDK's own
bound (``OTEL_SPAN_LINK_COUNT_LIMIT``, 128)."""

TRACEPARENT: Final = "traceparent"
"""Key of a rollout context holding the W3C ``traceparent`` of the rollout's span."""
VERSION: Final = "policy_version"
"""Key of a rollout context holding the policy version the rollout was generated with."""
POLICY_LAG: Final = "tunix.rl.policy_lag"
"""The histogram of policy lags (catalog row), in learner steps."""

_propagator = TraceContextTextMapPropagator()
_instruments: tuple[CurrentRun | None, CatalogInstruments] | None = None


def rollout_context(policy_version: int) -> dict[str, Any]:
    """What to put in the queue with a rollout: ``{"policy_version": v, "traceparent": ...}``.

    Call it where the rollout was made: inside the actor's step, or inside the component
    that generated it (a ``generate`` component on a rollout worker that carried the step's
    context). ``traceparent`` is the W3C trace context of the span open in the calling
    context (the innermost otel-tunix component, else the step, else the application's
    current span); it is left out when no span is recording there (a step not sampled),
    and the lag is still counted.

    Args:
        policy_version: The version of the policy weights that generated the rollout (the
            learner's count of weight updates it has published, say).
    """
    carrier: dict[str, Any] = {VERSION: policy_version}
    try:
        carrier[VERSION] = int(policy_version)
        _propagator.inject(carrier)
    except Exception:
        report_internal_error("otel_tunix.rl.rollout_context()")
    return carrier


def consume(
    rollouts: Mapping[str, Any] | Iterable[Mapping[str, Any]],
    policy_version: int,
    *,
    step: int | None = None,
) -> list[int]:
    """The learner step open in the calling context trains on these rollouts.

    Call it once per learner step, inside the step, with the contexts of every rollout the
    step trains on (one :func:`rollout_context` or a list of them). For each: its lag,
    ``policy_version`` minus the rollout's, goes to the ``tunix.rl.policy_lag`` histogram;
    when the step is sampled, its span gets a link to the rollout's span (attributes
    ``tunix.link.type=rollout``, ``tunix.rl.policy_version``, ``tunix.rl.policy_lag``; at
    most :data:`MAX_ROLLOUT_LINKS`) and the attributes ``tunix.rl.policy_version``,
    ``tunix.rl.policy_lag``, ``tunix.rl.rollouts`` and, past the bound,
    ``tunix.rl.links_dropped``. The step's largest lag is logged as ``policy_lag``
    (called again in the same step: the largest so far).

    Args:
        rollouts: One rollout context or several.
        policy_version: The learner's policy version now (the one the step trains).
        step: The step number the scalar is logged at (default: the sampled step's).

    Returns:
        The lags, one per context that carried a version.
    """
    lags: list[int] = []
    try:
        items = [rollouts] if isinstance(rollouts, Mapping) else list(rollouts)
        version = int(policy_version)
        st = context_step()
        record = _histogram()
        dropped = 0
        for item in items:
            raw = item.get(VERSION) if isinstance(item, Mapping) else None
            if raw is None:
                warn_once(
                    "rl-no-version",
                    "otel-tunix: otel_tunix.rl.consume() got a %s without a %r: give it what "
                    "rollout_context() returned (skipped)",
                    type(item).__name__,
                    VERSION,
                )
                continue
            lag = version - int(raw)
            lags.append(lag)
            if lag >= 0:
                record(POLICY_LAG, lag)
            else:
                warn_once(
                    "rl-negative-lag",
                    "otel-tunix: a rollout of policy version %s was consumed at version %s "
                    "(newer than the learner's): its lag is not recorded",
                    raw,
                    version,
                )
            if st is not None and not _link(st, item, int(raw), lag):
                dropped += 1
        if st is not None:
            _mark_step(st, version, len(lags), dropped, lags)
        if lags:
            _log_max(st, lags, step)
    except Exception:
        report_internal_error("otel_tunix.rl.consume()")
    return lags


def _histogram() -> Any:
    """``CatalogInstruments.record`` on the current run's meter (made once per run)."""
    global _instruments
    run = get_current()
    made = _instruments
    if made is None or made[0] is not run:
        made = _instruments = (run, CatalogInstruments())
    return made[1].record


def _link(st: StepRecord, item: Mapping[str, Any], version: int, lag: int) -> bool:
    """Link the step to the rollout's span; False only when past the bound (a context
    without a span to link, from a step not sampled, is no dropped link)."""
    if TRACEPARENT not in item:
        return True
    ctx = trace.get_current_span(_propagator.extract(item)).get_span_context()
    if not ctx.is_valid:
        return True
    links = st.links
    if links is None:
        links = st.links = []
    if len(links) >= MAX_ROLLOUT_LINKS:
        return False
    links.append(
        Link(
            ctx,
            {
                attr.LINK_TYPE: attr.LINK_TYPE_ROLLOUT,
                attr.RL_POLICY_VERSION: version,
                attr.RL_POLICY_LAG: lag,
            },
        )
    )
    return True


def _mark_step(st: StepRecord, version: int, consumed: int, dropped: int, lags: list[int]) -> None:
    """The learner step's attributes: its version, its largest lag, rollouts consumed and,
    past the link bound, how many were not linked."""
    a = st.attributes
    a[attr.RL_POLICY_VERSION] = version
    a[attr.RL_ROLLOUTS] = int(a.get(attr.RL_ROLLOUTS, 0)) + consumed
    if lags:
        prev = a.get(attr.RL_POLICY_LAG)
        a[attr.RL_POLICY_LAG] = max(lags) if prev is None else max(int(prev), *lags)
    if dropped:
        a[attr.RL_LINKS_DROPPED] = int(a.get(attr.RL_LINKS_DROPPED, 0)) + dropped


def _log_max(st: StepRecord | None, lags: list[int], step: int | None) -> None:
    """``policy_lag`` to the run's MetricsLogger (the alert rule reads it there)."""
    run = get_current()
    if run is None:
        return
    worst = max(lags)
    if st is not None:
        worst = max(worst, int(st.attributes.get(attr.RL_POLICY_LAG, worst)))
        if step is None:
            step = st.number
    run.logger.log_dict({POLICY_LAG_METRIC: float(worst)}, step=step)
