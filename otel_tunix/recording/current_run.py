"""The current run, as the layers below run setup see it.

``configure()`` (run setup, the layer above) registers what it started here with
:func:`set_current`; metric helpers, alerts and summaries read it with :func:`get_current`
instead of importing run setup (which would make the layers a cycle). The same inversion
the OpenTelemetry API uses for its global providers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics
from opentelemetry.metrics import Meter
from opentelemetry.sdk.resources import Resource

from otel_tunix.model.job import JobInfo
from otel_tunix.model.resource import RankInfo
from otel_tunix.settings.table import DEFAULT_SCOPE
from otel_tunix.settings.version import __version__

if TYPE_CHECKING:
    from otel_tunix.consumers.step_accounting import StepSink
    from otel_tunix.logger.metrics_logger import MetricsLogger
    from otel_tunix.model.steps import StepSummary

__all__ = [
    "CurrentRun",
    "RunInfo",
    "forget_shutdown",
    "get_current",
    "meter",
    "set_current",
    "shut_down",
]


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What ``configure()`` set up: the run id, the local folder and its files, the resource,
    the URLs of endpoints it serves (``endpoints["prometheus"]``), and the job (its id and
    the run's attempt)."""

    run_id: str
    output_dir: Path | None
    resource: Resource
    rank: RankInfo
    enabled: bool
    files: dict[str, Path] = field(default_factory=dict)
    endpoints: dict[str, str] = field(default_factory=dict)
    job: JobInfo | None = None
    """The job the run is an attempt of (:class:`otel_tunix.model.job.JobInfo`)."""

    def rank_file(self, stem: str, suffix: str) -> Path | None:
        """``<output_dir>/<stem>[-rank<r>]<suffix>`` (``None`` without a local folder)."""
        if self.output_dir is None:
            return None
        return self.output_dir / f"{stem}{self.rank.file_suffix}{suffix}"


@dataclass(frozen=True, slots=True)
class CurrentRun:
    """The parts of the current run that code below run setup may use."""

    info: RunInfo
    logger: MetricsLogger
    scope: str
    """Instrumentation scope (tracer and meter name) of the run."""
    meter_provider: Any = None
    """The run's MeterProvider (``None``: the global one)."""
    logger_provider: Any = None
    """The run's LoggerProvider (``None``: the global one)."""
    datadog: Any = None
    """The run's Datadog client (``None``: none)."""
    profiles: Any = None
    """The run's profile captures (:class:`otel_tunix.metrics.profiling.ProfileCaptures`;
    ``None``: none, no run folder)."""
    last_step_summary: Callable[[], StepSummary | None] = lambda: None
    add_step_sink: Callable[[StepSink], None] = lambda sink: None
    """Send the run's step summaries to one more sink from now on (an integration's)."""
    process_steps: Callable[[float], bool] = lambda timeout: True
    """Process every finished step now (device ends included), without flushing the
    exporters (which may wait on a collector); False if ``timeout`` (s) passed first."""


_current: CurrentRun | None = None
_ended = False  # a run was current and has been shut down (none since)


def set_current(run: CurrentRun | None) -> None:
    """Register the run ``configure()`` started (``None`` when it shuts down)."""
    global _current, _ended
    _ended = run is None and (_current is not None or _ended)
    _current = run


def forget_shutdown() -> None:
    """As if no run had ever been configured (``otel_tunix.testing.reset()``)."""
    global _ended
    _ended = False


def shut_down() -> bool:
    """Whether there is no current run because the last one was shut down (rather than
    because ``configure()`` never ran): what a call that needs a run tells the user."""
    return _current is None and _ended


def get_current() -> CurrentRun | None:
    """The current run, or ``None`` before ``configure()`` / after ``shutdown()``."""
    return _current


def meter(name: str | None = None) -> Meter:
    """A Meter of the current run's MeterProvider (the global one before ``configure()``)."""
    run = _current
    provider = run.meter_provider if run is not None else None
    if provider is None:
        provider = metrics.get_meter_provider()
    scope = name or (run.scope if run is not None else None) or DEFAULT_SCOPE
    return provider.get_meter(scope, __version__)
