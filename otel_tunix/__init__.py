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

The public names below load when first used (PEP 562): ``import otel_tunix`` imports none of
the package's modules, and ``configure()`` imports what a run uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOMES: dict[str, str] = {
    "__version__": "otel_tunix.settings.version",
    "capture_profile": "otel_tunix.metrics.profiling",
    "Component": "otel_tunix.recording.hot_path",
    "component": "otel_tunix.recording.hot_path",
    "ComponentTime": "otel_tunix.model.steps",
    "ConfigurationError": "otel_tunix.settings.config",
    "configure": "otel_tunix.run.setup",
    "current_run": "otel_tunix.run.setup",
    "current_step": "otel_tunix.recording.step_view",
    "FinishedStep": "otel_tunix.pipeline.span_builder",
    "force_flush": "otel_tunix.run.setup",
    "get_meter": "otel_tunix.run.setup",
    "get_metrics_logger": "otel_tunix.run.setup",
    "in_step": "otel_tunix.recording.hot_path",
    "last_step_summary": "otel_tunix.run.setup",
    "log": "otel_tunix.run.log",
    "MetricsLogger": "otel_tunix.logger.metrics_logger",
    "MetricsLoggerOptions": "otel_tunix.logger.metrics_logger",
    "PerformanceMetricsConfig": "otel_tunix.settings.config",
    "record_component": "otel_tunix.recording.hot_path",
    "RunInfo": "otel_tunix.run.setup",
    "ScopeSession": "otel_tunix.model.steps",
    "set_config": "otel_tunix.run.run_config",
    "shutdown": "otel_tunix.run.setup",
    "SpanInfo": "otel_tunix.model.steps",
    "step": "otel_tunix.recording.hot_path",
    "StepSummary": "otel_tunix.model.steps",
    "StepView": "otel_tunix.recording.step_view",
    "Unrecorded": "otel_tunix.recording.hot_path",
}
"""Each public name's module; ``rl`` is the submodule :mod:`otel_tunix.rl`."""

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


if not TYPE_CHECKING:  # mypy sees the imports above: a misspelt name stays an error

    def __getattr__(name: str) -> Any:
        """Import a public name's module on first use (PEP 562) and keep the name here."""
        if name == "rl":
            value: Any = importlib.import_module("otel_tunix.rl")
        elif name in _HOMES:
            value = getattr(importlib.import_module(_HOMES[name]), name)
        else:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))
