"""Ray tasks and actors that join the learner's trace.

Ray carries OpenTelemetry context into tasks and actor calls once its tracing is on, which
``ray.init`` turns on with a startup hook that Ray runs in the driver and in every worker::

    ray.init(_tracing_startup_hook="otel_tunix.instrumentation.ray:tracing_startup_hook")

A task called inside a learner component (``rollout``) then runs under Ray's spans, children
of that component, and an ``otel_tunix.step(...)`` it opens joins the learner's trace. The
hook configures otel-tunix in each worker from the environment the workers inherit
(``OTEL_EXPORTER_OTLP_ENDPOINT`` and the rest: set them before ``ray.init``, or pass them in
``runtime_env={"env_vars": ...}``); in a process where otel-tunix is already configured
(the driver) it does nothing. Ray may stop its workers without running their exit
handlers: a task that records a step calls ``otel_tunix.force_flush()`` before it returns.

This module does not import Ray; Ray imports it (by the hook's name) in its processes.
"""

from __future__ import annotations

import logging

import otel_tunix
from otel_tunix.support.errors import warn_once

__all__ = ["tracing_startup_hook"]

_logger = logging.getLogger(__name__)


def tracing_startup_hook() -> None:
    """Ray's tracing startup hook: otel-tunix configured in this Ray process (from the
    environment) unless it is already; never raises into Ray."""
    if otel_tunix.current_run() is not None:
        return
    try:
        otel_tunix.configure()
    except Exception:  # the settings the worker inherited: say so, and let Ray run on
        warn_once(
            ("ray", "configure"),
            "otel-tunix: configure() in a Ray worker failed; its steps are not recorded",
            logger=_logger,
            level=logging.ERROR,
            exc_info=True,
        )
