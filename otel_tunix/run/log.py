"""``otel_tunix.log({...}, step=n)``: log a step's scalars in one call, as ``wandb.log`` does."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from otel_tunix.recording.current_run import get_current, shut_down
from otel_tunix.run import signals
from otel_tunix.support.errors import warn_once

__all__ = ["log"]

_logger = logging.getLogger(__name__)


def log(values: Mapping[str, Any], step: int | None = None) -> None:
    """Log scalars (``{"loss": loss, "learning_rate": lr}``) at ``step`` to every backend of
    the current run's MetricsLogger (``metrics.jsonl``, OTel gauges, alert rules, ...).

    Values may be Python, numpy, JAX or torch scalars; NaN / Inf are logged and flagged, a
    value that is not a number is skipped with one warning. Before ``configure()`` or after
    ``shutdown()`` nothing is logged, and one warning says which.

    Raises:
        TypeError: ``values`` is not a mapping (``log("loss", x)`` is
            ``get_metrics_logger().log("loss", x, step=n)``).
    """
    if not isinstance(values, Mapping):
        raise TypeError(
            f"otel_tunix.log() takes a dict of name -> value, got a {type(values).__name__} "
            "(one scalar: otel_tunix.get_metrics_logger().log(name, value, step=n))"
        )
    run = get_current()
    if run is None and shut_down():
        warn_once(
            "log-after-shutdown",
            "otel_tunix.log() was called after otel_tunix.shutdown(); nothing is logged "
            "until the next configure()",
            logger=_logger,
        )
        return
    if run is None:
        if signals.terminating():  # the run ended on SIGTERM; the loop goes on a moment
            return
        warn_once(
            "log-before-configure",
            "otel_tunix.log() was called before otel_tunix.configure(); nothing is logged "
            "until configure() runs",
            logger=_logger,
        )
        return
    run.logger.log_dict(values, step=step)
