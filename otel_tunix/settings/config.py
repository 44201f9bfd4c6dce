"""The configuration object of what otel-tunix records (``PerformanceMetricsConfig``).

Fields are validated when a config is built, never per step: a bad value raises
:class:`ConfigurationError` naming the field and what is allowed. Fields left unset are
filled from the environment (:mod:`otel_tunix.settings.table`, the one table of variables) by
:meth:`PerformanceMetricsConfig.resolved`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

from otel_tunix.settings.parsing import MAX_INTERVAL_MS, ConfigurationError
from otel_tunix.settings.values import Settings, load_settings

__all__ = ["ConfigurationError", "PerformanceMetricsConfig"]

_UNSET: Any = object()


@dataclass(kw_only=True, slots=True)
class PerformanceMetricsConfig:
    """What otel-tunix records, field for field like Tunix's ``PerformanceMetricsConfig``.

    Fields left as ``None`` are filled from the ``OTEL_TUNIX_*`` environment variables, then
    from the defaults, by :meth:`resolved` (``configure()`` calls it).

    Attributes:
        enabled: Record step and component spans at all (``OTEL_TUNIX_ENABLED``, default
            ``True``). When false, ``step()`` and ``component()`` are no-ops.
        sampling_rate: Instrument step ``n`` iff ``n % sampling_rate == 0``; every component
            of the step follows that decision (``OTEL_TUNIX_SAMPLING_RATE``, default 1).
        components: Names of the components to record, or ``None`` for all
            (``OTEL_TUNIX_COMPONENTS``, comma-separated).
        otel_scope: Instrumentation scope: tracer and meter name (``OTEL_TUNIX_SCOPE``,
            default ``"otel_tunix"``).
        export_jsonl_path: Extra spans JSONL file, one line per sampled step and one
            ``session`` line per scope at shutdown; ``.gz`` writes gzip
            (``OTEL_TUNIX_EXPORT_JSONL_PATH``).
        export_fn: Custom export function, or its import path ``"pkg.mod:fn"``
            (``OTEL_TUNIX_EXPORT_FN``): called with each finished
            :class:`~otel_tunix.model.steps.StepSummary`, it returns ``{name: value}``,
            published like otel-tunix's own metrics.
        perfetto_trace_dir: Directory for a Perfetto trace translated from the spans
            (``OTEL_TUNIX_PERFETTO_DIR``).
        process_interval_ms: Longest time, in milliseconds, between two batches of finished
            steps being processed off the training thread (spans built, counters derived,
            local files written and flushed); a step longer than this is processed as soon
            as it ends. Shorter: a hard kill (SIGKILL) loses fewer recent steps; longer:
            fewer, cheaper wake-ups (``OTEL_TUNIX_PROCESS_INTERVAL_MS``, default 250). A
            Python exception or a normal exit loses nothing: shutdown processes every step.
    """

    enabled: bool | None = None
    sampling_rate: int | None = None
    components: tuple[str, ...] | None = _UNSET
    otel_scope: str | None = None
    export_jsonl_path: str | os.PathLike[str] | None = None
    export_fn: Callable[..., Any] | str | None = None
    perfetto_trace_dir: str | os.PathLike[str] | None = None
    process_interval_ms: float | None = None

    def __post_init__(self) -> None:
        if self.enabled is not None and not isinstance(self.enabled, bool):
            raise ConfigurationError(
                f"PerformanceMetricsConfig.enabled must be True or False, got {self.enabled!r}"
            )
        if self.sampling_rate is not None:
            _check_sampling_rate(self.sampling_rate, "PerformanceMetricsConfig.sampling_rate")
        if self.components is not _UNSET and self.components is not None:
            self.components = _check_components(
                self.components, "PerformanceMetricsConfig.components"
            )
        if self.otel_scope is not None and (
            not isinstance(self.otel_scope, str) or not self.otel_scope
        ):
            raise ConfigurationError(
                "PerformanceMetricsConfig.otel_scope must be a non-empty string, "
                f"got {self.otel_scope!r}"
            )
        if self.process_interval_ms is not None:
            _check_interval(
                self.process_interval_ms, "PerformanceMetricsConfig.process_interval_ms"
            )
        if self.export_fn is not None and not (
            callable(self.export_fn) or isinstance(self.export_fn, str)
        ):
            raise ConfigurationError(
                "PerformanceMetricsConfig.export_fn must be a callable or an import path "
                f"'pkg.module:function', got {self.export_fn!r}"
            )

    def resolved(self, settings: Settings | None = None) -> PerformanceMetricsConfig:
        """A copy with every unset field taken from ``settings`` (default: the environment,
        read by :func:`~otel_tunix.settings.values.load_settings`)."""
        s = settings if settings is not None else load_settings()
        return PerformanceMetricsConfig(
            enabled=self.enabled if self.enabled is not None else s.enabled,
            sampling_rate=self.sampling_rate if self.sampling_rate is not None else s.sampling_rate,
            components=s.components if self.components is _UNSET else self.components,
            otel_scope=self.otel_scope or s.scope,
            export_jsonl_path=self.export_jsonl_path or s.export_jsonl_path,
            export_fn=self.export_fn or s.export_fn,
            perfetto_trace_dir=self.perfetto_trace_dir or s.perfetto_dir,
            process_interval_ms=self.process_interval_ms
            if self.process_interval_ms is not None
            else s.process_interval_ms,
        )


def _check_sampling_rate(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"{field} must be a positive integer (1 = every step, N = every N-th step), "
            f"got {value!r}"
        )
    return value


def _check_interval(value: object, field: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value <= MAX_INTERVAL_MS
    ):
        raise ConfigurationError(
            f"{field} must be a number of milliseconds in (0, {MAX_INTERVAL_MS:g}], got {value!r}"
        )
    return float(value)


def _check_components(value: object, field: str) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ConfigurationError(
            f"{field} must be a tuple of component names (strings) or None for all, got {value!r}"
        )
    items = tuple(value)
    bad = [c for c in items if not isinstance(c, str) or not c]
    if bad:
        raise ConfigurationError(
            f"{field} must be a tuple of non-empty strings, got {value!r} (not allowed: {bad!r})"
        )
    return items


def load_callable(path: str, field: str) -> Callable[..., Any]:
    """Import ``"pkg.module:function"`` (or ``pkg.module.function``) and return it."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ConfigurationError(f"{field}={path!r} must look like 'pkg.module:function'")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"{field}={path!r} cannot be imported: {exc}") from exc
    if not callable(obj):
        raise ConfigurationError(f"{field}={path!r} is not callable")
    return cast("Callable[..., Any]", obj)
