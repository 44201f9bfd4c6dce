"""otel-tunix: OpenTelemetry-native observability for LLM training loops.

Quick start::

    import otel_tunix

    otel_tunix.configure(service_name="sft-demo")
    for n in range(steps):
        with otel_tunix.step(n, scope="train"):
            with otel_tunix.component("train_data_load"):
                batch = next(it)
            with otel_tunix.component("train_step_compute"):
                loss = train_step(batch)
    otel_tunix.shutdown()
"""

from __future__ import annotations

from otel_tunix import rl
from otel_tunix.logger.metrics_logger import MetricsLogger, MetricsLoggerOptions
from otel_tunix.metrics.profiling import capture_profile
from otel_tunix.model.steps import ComponentTime, ScopeSession, SpanInfo, StepSummary
from otel_tunix.pipeline.span_builder import FinishedStep
from otel_tunix.recording.hot_path import (
    Component,
    Unrecorded,
    component,
    in_step,
    record_component,
    step,
)
from otel_tunix.recording.step_view import StepView, current_step
from otel_tunix.run.log import log
from otel_tunix.run.run_config import set_config
from otel_tunix.run.setup import (
    RunInfo,
    configure,
    current_run,
    force_flush,
    get_meter,
    get_metrics_logger,
    last_step_summary,
    shutdown,
)
from otel_tunix.settings.config import ConfigurationError, PerformanceMetricsConfig
from otel_tunix.settings.version import __version__

__all__ = [
    "Component",
    "ComponentTime",
    "ConfigurationError",
    "FinishedStep",
    "MetricsLogger",
    "MetricsLoggerOptions",
    "PerformanceMetricsConfig",
    "RunInfo",
    "ScopeSession",
    "SpanInfo",
    "StepSummary",
    "StepView",
    "Unrecorded",
    "__version__",
    "capture_profile",
    "component",
    "configure",
    "current_run",
    "current_step",
    "force_flush",
    "get_meter",
    "get_metrics_logger",
    "in_step",
    "last_step_summary",
    "log",
    "record_component",
    "rl",
    "set_config",
    "shutdown",
    "step",
]
