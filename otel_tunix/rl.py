"""RL you can follow: lineage from rollouts to the learner steps that trained on them, and
policy lag.

Actor side, inside the rollout's step (or its generation component)::

    out_queue.put((batch, otel_tunix.rl.rollout_context(policy_version)))

Learner side, inside the learner step::

    batch, ctx = in_queue.get()
    otel_tunix.rl.consume(ctx, policy_version=learner_version)
    ...
    with otel_tunix.rl.weight_sync(nbytes=state_bytes):
        publish(weights)

See :mod:`otel_tunix.metrics.lineage` and ``docs/rl.md``.
"""

from __future__ import annotations

from otel_tunix.metrics.lineage import (
    MAX_ROLLOUT_LINKS,
    POLICY_LAG,
    TRACEPARENT,
    VERSION,
    consume,
    rollout_context,
)
from otel_tunix.metrics.weight_sync import weight_sync
from otel_tunix.model.alert_rules import POLICY_LAG_METRIC, WEIGHT_SYNCS_METRIC, policy_lag_rule

__all__ = [
    "MAX_ROLLOUT_LINKS",
    "POLICY_LAG",
    "POLICY_LAG_METRIC",
    "TRACEPARENT",
    "VERSION",
    "WEIGHT_SYNCS_METRIC",
    "consume",
    "policy_lag_rule",
    "rollout_context",
    "weight_sync",
]
