"""Alert rules on any logged metric, with the defaults of Signal's RL monitoring guide.

A rule watches MetricsLogger names (glob patterns) and has a level per observation: OK,
WARNING or CRITICAL. :class:`AlertEngine` keeps one state per (rule, metric name) and acts
only on **transitions**:

* it **fires** when a level is reached for ``consecutive`` observations in a row (a new
  episode, or an escalation from warning to critical);
* it **resolves** (or downgrades) when the value is back inside the threshold by the
  rule's ``hysteresis`` margin, so a value hovering at the line does not flap.

Each transition

1. adds a ``tunix.alert`` **event to the step span**: the step open in the calling context
   when the metric was logged inside ``otel_tunix.step(...)``; otherwise (a metric logged
   after the step, or a ``perf/...`` metric logged by otel-tunix's worker) the next sampled
   step that starts, with ``tunix.alert.step`` naming the step the value belongs to.
   This is the core hook ``otel_tunix.recording.step_view.add_step_event`` (see ``docs/alerts.md``);
   while otel-tunix is off the event goes on the current span only when that span is a
   recording span of the application's own;
2. emits an **OTel log record** (``event_name="tunix.alert"``, severity WARN / ERROR, INFO
   when resolved) through the logs API, correlated with the current trace and span;
3. sends a **Datadog event and service check** (``tunix.alert.<rule>``) when Datadog is on
   (``DATADOG_ENABLED`` or ``OTEL_METRICS_EXPORTER=datadog``, or a client given);
4. **warns on the console** once when an episode starts (and once more if it escalates to
   critical), never per step;
5. counts ``tunix.alert.firings{rule, severity}`` when it fires;
6. appends a JSON line to ``alerts.jsonl`` in the run folder (local-first: no collector
   needed to see what fired).

Hook it up as a MetricsLogger backend, so it sees every logged scalar including otel-tunix's
``perf/<scope>/step_time_sec``::

    from otel_tunix.metrics import alerts
    engine = alerts.install()          # default rules, on the current run's MetricsLogger

No method raises into the training loop; a failing action is reported once.

The package, one concept per module:

* :mod:`~otel_tunix.model.alert_rules`: thresholds, the rule kinds, :func:`default_rules`;
* :mod:`~otel_tunix.metrics.alerts.engine`: :class:`Alert` and :class:`AlertEngine` (evaluation,
  state, hysteresis);
* :mod:`~otel_tunix.metrics.alerts.actions`: what a transition does, one
  :class:`AlertAction` per side effect above.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from otel_tunix.metrics.alerts.actions import EVENT_NAME, AlertAction
from otel_tunix.metrics.alerts.engine import Alert, AlertEngine
from otel_tunix.model.alert_rules import (
    DropRule,
    NonFiniteRule,
    Rule,
    Severity,
    SpikeRule,
    Threshold,
    ThresholdRule,
    above,
    below,
    default_rules,
    outside,
)
from otel_tunix.recording.current_run import get_current

__all__ = [
    "EVENT_NAME",
    "Alert",
    "AlertAction",
    "AlertEngine",
    "DropRule",
    "NonFiniteRule",
    "Rule",
    "Severity",
    "SpikeRule",
    "Threshold",
    "ThresholdRule",
    "above",
    "below",
    "default_rules",
    "install",
    "outside",
]

_logger = logging.getLogger(__name__)


def install(
    rules: Iterable[Rule] | None = None,
    *,
    logger: Any = None,
    **engine_kwargs: Any,
) -> AlertEngine:
    """Create an :class:`AlertEngine` and add it to a MetricsLogger's backends, replacing
    an engine already there (``configure()`` may have added the default one).

    Args:
        rules: Default: :func:`default_rules`.
        logger: The MetricsLogger; default: the current run's (call after ``configure()``).
        **engine_kwargs: More :class:`AlertEngine` arguments.

    Returns:
        The engine (closed with the logger at ``otel_tunix.shutdown()``).
    """
    if logger is None:
        run = get_current()
        if run is None:
            _logger.warning(
                "otel-tunix: alerts.install() before otel_tunix.configure(): pass logger= "
                "or call it after configure(); the engine is not attached"
            )
            return AlertEngine(rules, **engine_kwargs)
        logger = run.logger
        # Where the run's own engine sends its alerts: the run's providers (the global ones
        # may be unset: the alerts would go nowhere while the start notice names them).
        engine_kwargs.setdefault("logger_provider", run.logger_provider)
        engine_kwargs.setdefault("meter_provider", run.meter_provider)
        if run.datadog is not None:
            engine_kwargs.setdefault("datadog", run.datadog)
        path = run.info.rank_file("alerts", ".jsonl")
        if path is not None:
            engine_kwargs.setdefault("jsonl_path", path)
    engine = AlertEngine(rules, **engine_kwargs)
    if not getattr(logger, "active", True):
        _logger.info("otel-tunix: alerts not installed: this rank's MetricsLogger is inactive")
        return engine
    for old in [b for b in logger.backends if isinstance(b, AlertEngine)]:
        logger.backends.remove(old)  # one engine per logger: the new rules replace the old
        old.close()
    logger.backends.append(engine)
    return engine
