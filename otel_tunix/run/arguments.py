"""``configure()``'s arguments, checked in one place before anything is started."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

from otel_tunix.consumers.step_accounting import StepSink
from otel_tunix.logger.metrics_logger import MetricsLogger, MetricsLoggerOptions
from otel_tunix.settings import variables as env
from otel_tunix.settings.config import PerformanceMetricsConfig, load_callable
from otel_tunix.settings.parsing import ConfigurationError
from otel_tunix.settings.values import Settings

__all__ = ["RunArguments"]


@dataclass(kw_only=True, slots=True)
class RunArguments:
    """The arguments of ``configure()`` (see its docstring), and what they resolve to
    against the settings (:meth:`check`)."""

    service_name: str | None = None
    perf: PerformanceMetricsConfig | None = None
    output_dir: str | os.PathLike[str] | None = None
    run_id: str | None = None
    metrics_logger: MetricsLogger | MetricsLoggerOptions | None = None
    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    span_exporters: Sequence[SpanExporter] = ()
    resource_attributes: dict[str, Any] | None = None
    alerts: bool | Iterable[Any] | None = None
    system_metrics: bool | float | None = None
    logger_provider: Any = None
    span_processors: Sequence[SpanProcessor] = ()
    metric_readers: Sequence[MetricReader] = ()
    step_sinks: Sequence[StepSink] = ()
    clock: Callable[[], int] | None = None
    id_seed: int | None = None
    console_interval: float | None = None
    run_config: Mapping[str, Any] | None = None

    # Resolved by check():
    cfg: PerformanceMetricsConfig | None = None
    """``perf`` resolved against the settings."""
    export_fn: Callable[..., Any] | None = None
    system_interval: float | None = None
    """Seconds between system samples (``None``: no sampler)."""
    line_interval: float | None = None
    """Seconds between live lines (``None``: none)."""

    @property
    def owns_logger(self) -> bool:
        """Whether otel-tunix makes (and closes) the MetricsLogger."""
        return not isinstance(self.metrics_logger, MetricsLogger)

    def check(self, settings: Settings) -> PerformanceMetricsConfig:
        """Check every argument and resolve ``perf``, the export function and the intervals.

        Raises:
            ConfigurationError: naming the argument and what is allowed.
        """
        perf = self.perf if self.perf is not None else PerformanceMetricsConfig()
        cfg = perf.resolved(settings)
        if not isinstance(cfg, PerformanceMetricsConfig):  # pragma: no cover - typing guard
            raise ConfigurationError("perf must be a PerformanceMetricsConfig")
        export_fn = cfg.export_fn
        if isinstance(export_fn, str):
            export_fn = load_callable(export_fn, "export_fn / " + env.OTEL_TUNIX_EXPORT_FN)
        self.cfg, self.export_fn = cfg, export_fn
        self.system_interval = _system_interval(self.system_metrics, settings)
        self.line_interval = _console_interval(self.console_interval, settings)
        if self.metrics_logger is not None and not isinstance(
            self.metrics_logger, MetricsLogger | MetricsLoggerOptions
        ):
            raise ConfigurationError(
                "metrics_logger must be a MetricsLogger or MetricsLoggerOptions, "
                f"got {self.metrics_logger!r}"
            )
        for sink in self.step_sinks:
            if not isinstance(sink, StepSink):
                raise ConfigurationError(
                    f"step_sinks: {sink!r} is not an otel_tunix.consumers.step_accounting.StepSink"
                )
        for proc in self.span_processors:
            if not isinstance(proc, SpanProcessor):
                raise ConfigurationError(f"span_processors: {proc!r} is not a SpanProcessor")
        for reader in self.metric_readers:
            if not isinstance(reader, MetricReader):
                raise ConfigurationError(f"metric_readers: {reader!r} is not a MetricReader")
        if self.metric_readers and self.meter_provider is not None:
            raise ConfigurationError(
                "metric_readers: add them to the meter_provider given instead (an SDK "
                "MeterProvider takes its readers when it is made)"
            )
        if self.clock is not None and not callable(self.clock):
            raise ConfigurationError(f"clock must be a function returning ns, got {self.clock!r}")
        seed = self.id_seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigurationError(f"id_seed must be an int or None, got {seed!r}")
        self.span_exporters = tuple(self.span_exporters)
        for exporter in self.span_exporters:
            if not callable(getattr(exporter, "export", None)):
                raise ConfigurationError(
                    f"span_exporters: {exporter!r} is not a SpanExporter (it has no export method)"
                )
        return cfg


def _system_interval(arg: bool | float | None, settings: Settings) -> float | None:
    """Seconds between system samples, or ``None`` for no sampler."""
    if arg is None:
        return settings.system_metrics_interval
    if arg is True:
        return 10.0
    if arg is False or arg == 0:
        return None
    if isinstance(arg, int | float) and arg > 0:
        return float(arg)
    raise ConfigurationError(f"system_metrics must be True, False or seconds > 0, got {arg!r}")


def _console_interval(arg: float | None, settings: Settings) -> float | None:
    """Seconds between live lines, or ``None`` for none."""
    if arg is None:
        return settings.console_interval
    if isinstance(arg, int | float) and not isinstance(arg, bool) and arg >= 0:
        return float(arg) or None
    raise ConfigurationError(f"console_interval must be seconds > 0 or 0 (off), got {arg!r}")
