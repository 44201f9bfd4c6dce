"""What the framework integrations share: optional imports, lazy configuration under
zero-code instrumentation, the ``BaseInstrumentor`` base class, an LIFO stack of spans opened
from framework callbacks, and the per-step device memory gauges.

Framework modules (``torch``, ``transformers``, ``jax``, ``tunix``) build on these helpers;
nothing here imports a framework.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any, cast

import otel_tunix
from otel_tunix.logger.backend import PERF_SOURCE
from otel_tunix.settings import attributes as attr
from otel_tunix.support.errors import report_internal_error, warn_once

_logger = logging.getLogger(__name__)

__all__ = [
    "BaseInstrumentor",
    "SpanStack",
    "enable_auto_configure",
    "ensure_configured",
    "record_allocator_counts",
    "record_device_memory",
    "require",
    "step_is_open",
]


def require(module: str, extra: str, purpose: str) -> Any:
    """Import ``module`` or raise a ``ModuleNotFoundError`` that names the extra to install.

    ``ModuleNotFoundError`` (not a plain ``ImportError``) lets ``opentelemetry-instrument``
    skip an integration whose framework is not installed, quietly, as it does for its own.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{purpose} needs {module.split('.')[0]}: pip install 'otel-tunix[{extra}]'",
            name=exc.name,
        ) from exc


def _base_instrumentor() -> type:
    try:
        from opentelemetry.instrumentation.instrumentor import BaseInstrumentor as _Base
    except ModuleNotFoundError:  # the optional opentelemetry-instrumentation package

        class _Base:  # type: ignore[no-redef]
            """Stand-in for ``opentelemetry.instrumentation.instrumentor.BaseInstrumentor``."""

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                raise ModuleNotFoundError(
                    f"{type(self).__name__} needs opentelemetry-instrumentation: "
                    "pip install 'otel-tunix[instrument]'",
                    name="opentelemetry.instrumentation",
                )

    return cast(type, _Base)  # Any when imported: mypy skips that module (see pyproject.toml)


BaseInstrumentor: Any = _base_instrumentor()
"""OpenTelemetry's ``BaseInstrumentor`` (or a stand-in that explains how to install it)."""


# --- lazy configuration ----------------------------------------------------------------
_auto_configure = False
_configure_lock = threading.Lock()


def enable_auto_configure() -> None:
    """Let the integrations call :func:`otel_tunix.configure` themselves when training starts.

    Set by otel-tunix's OpenTelemetry configurator and by every instrumentor's
    ``instrument()``: a process run under ``opentelemetry-instrument`` is configured the first
    time a training loop starts, not at interpreter start, so helper processes (DataLoader
    workers, compile workers, tokenizer children) that never train write no run folder.
    """
    global _auto_configure
    _auto_configure = True


def auto_configure_enabled() -> bool:
    """True once :func:`enable_auto_configure` ran in this process."""
    return _auto_configure


def ensure_configured(
    resource_attributes: Mapping[str, Any] | None = None, *, asked: bool = False
) -> bool:
    """Configure otel-tunix now if zero-code mode asked for it, or the user did (``asked``:
    ``instrument_trainer()`` called without ``configure()``), and nothing configured it yet:
    from the environment, as ``configure()`` with no arguments.

    Returns True when otel-tunix is configured (already, or by this call). Never raises: a
    configuration error is logged once and the training loop runs on uninstrumented.
    """
    if otel_tunix.current_run() is not None:
        return True
    if not (_auto_configure or asked):
        return False
    with _configure_lock:
        if otel_tunix.current_run() is not None:
            return True
        try:
            otel_tunix.configure(
                resource_attributes=dict(resource_attributes) if resource_attributes else None
            )
        except Exception:  # the settings the user gave (environment, config file)
            warn_once(
                "auto-configure",
                "otel-tunix: automatic configure() failed; not recording",
                logger=_logger,
                level=logging.ERROR,
                exc_info=True,
            )
            return False
    return True


def step_is_open() -> bool:
    """True when an otel-tunix step (sampled or not) is open in the calling context."""
    return otel_tunix.in_step()


def current_scope() -> str | None:
    """The scope of the sampled step open in the calling context, if any."""
    view = otel_tunix.current_step()
    return view.scope if view is not None else None


# --- spans opened and closed from framework callbacks ----------------------------------
class SpanStack:
    """Steps and components opened from separate framework callbacks, closed in LIFO order.

    Callbacks such as ``on_step_begin`` / ``on_step_end`` open and close spans from different
    calls, so no ``with`` block can hold them. Context variables must be reset in the reverse
    order of setting; closing an entry here first closes every entry opened after it, so a
    callback that never fired (an exception, an early ``break``) cannot leave the context in
    a wrong state. Use from one thread.
    """

    def __init__(self) -> None:
        self._entries: list[tuple[str, Any]] = []

    def push(self, key: str, cm: Any) -> Any:
        """Enter ``cm`` (a step or component) and remember it under ``key``."""
        try:
            cm.__enter__()
        except Exception:  # pragma: no cover - the core never raises here: a bug of ours
            report_internal_error("opening a span of framework callbacks")
            return cm
        self._entries.append((key, cm))
        return cm

    def __contains__(self, key: str) -> bool:
        return any(k == key for k, _ in self._entries)

    def pop(self, key: str) -> bool:
        """Close ``key`` and everything opened after it. False when ``key`` is not open."""
        for i in range(len(self._entries) - 1, -1, -1):
            if self._entries[i][0] == key:
                self._close_down_to(i)
                return True
        return False

    def clear(self) -> None:
        """Close everything."""
        self._close_down_to(0)

    def _close_down_to(self, index: int) -> None:
        while len(self._entries) > index:
            _, cm = self._entries.pop()
            try:
                cm.__exit__(None, None, None)
            except Exception:  # pragma: no cover - the core never raises here: a bug of ours
                report_internal_error("closing a span of framework callbacks")


# --- device memory gauges --------------------------------------------------------------
class _MemoryGauges:
    """OTel gauges of device memory, created on the run's meter provider."""

    def __init__(self, provider: Any) -> None:
        meter = otel_tunix.get_meter("otel_tunix.instrumentation")
        self.provider = provider
        self.gauges = {
            key: meter.create_gauge(name, unit="By", description=desc)
            for key, name, desc in (
                ("allocated", "tunix.memory.allocated", "Device memory held by tensors"),
                ("reserved", "tunix.memory.reserved", "Device memory held by the allocator"),
                (
                    "peak_allocated",
                    "tunix.memory.peak_allocated",
                    "Peak device memory held by tensors during the step",
                ),
                ("limit", "tunix.memory.limit", "Device memory the framework may use"),
            )
        }


_gauges: _MemoryGauges | None = None


class _AllocatorCounters:
    """OTel counters of the allocator's retries and OOMs, on the run's meter provider."""

    def __init__(self, provider: Any) -> None:
        meter = otel_tunix.get_meter("otel_tunix.instrumentation")
        self.provider = provider
        self.counters = {
            "alloc_retries": meter.create_counter(
                "tunix.memory.alloc_retries",
                unit="{retry}",
                description="Allocation retries of the device memory allocator",
            ),
            "ooms": meter.create_counter(
                "tunix.memory.ooms",
                unit="{error}",
                description="Out-of-memory errors of the device memory allocator",
            ),
        }


_counters: _AllocatorCounters | None = None


def record_allocator_counts(
    counts: Mapping[str, int], *, device: str, step: int | None, scope: str = "train"
) -> None:
    """Publish the device allocator's ``alloc_retries`` / ``ooms`` during one step: the OTel
    counters ``tunix.memory.<key>`` (attributes ``device`` and ``scope``) grow by them, and
    the MetricsLogger scalars ``memory/<key>`` (perf scalars: the alert rules see them, the
    logger's OTel backend does not publish them again) are them."""
    global _counters
    if not counts:
        return
    provider = _run_meter_provider()
    if provider is not None:
        if _counters is None or _counters.provider is not provider:
            _counters = _AllocatorCounters(provider)
        labels = {"device": device, attr.METRIC_SCOPE: scope}
        for key, value in counts.items():
            counter = _counters.counters.get(key)
            if counter is not None and value > 0:
                counter.add(value, labels)
    otel_tunix.get_metrics_logger().log_dict(
        {f"memory/{key}": float(value) for key, value in counts.items()},
        step=step,
        source=PERF_SOURCE,
    )


def _run_meter_provider() -> Any:
    """The current run (its identity changes with each ``configure()``), or ``None``."""
    return otel_tunix.current_run()


_SPAN_KEYS = (
    ("peak_allocated", attr.MEMORY_PEAK_ALLOCATED),
    ("reserved", attr.MEMORY_RESERVED),
    ("limit", attr.MEMORY_LIMIT),
)
"""Memory readings that also go on the step span, and their attributes."""


def record_device_memory(
    stats: Mapping[str, float],
    *,
    device: str,
    step: int | None,
    scope: str = "train",
    span_attributes: dict[str, Any] | None = None,
) -> None:
    """Publish device memory readings (bytes) of one step.

    ``stats`` holds any of ``allocated``, ``reserved``, ``peak_allocated``, ``limit``. They
    become the OTel gauges ``tunix.memory.<key>`` (unit ``By``, attributes ``device`` and
    ``scope``) and the MetricsLogger scalars ``memory/<key>_bytes`` (logged as perf scalars,
    so the logger's OTel backend does not publish them a second time); ``peak_allocated``,
    ``reserved`` and ``limit`` also go into ``span_attributes`` (the step span's, when given)
    as ``tunix.memory.<key>``.
    """
    global _gauges
    if not stats:
        return
    if span_attributes is not None:
        for key, name in _SPAN_KEYS:
            if key in stats:
                span_attributes[name] = int(stats[key])
    provider = _run_meter_provider()
    if provider is not None:
        if _gauges is None or _gauges.provider is not provider:
            _gauges = _MemoryGauges(provider)
        labels = {"device": device, attr.METRIC_SCOPE: scope}
        for key, value in stats.items():
            gauge = _gauges.gauges.get(key)
            if gauge is not None:
                gauge.set(value, labels)
    otel_tunix.get_metrics_logger().log_dict(
        {f"memory/{key}_bytes": value for key, value in stats.items()},
        step=step,
        source=PERF_SOURCE,
    )


def instrumentation_dependencies(*requirements: str) -> Collection[str]:
    """Helper for ``BaseInstrumentor.instrumentation_dependencies``."""
    return tuple(requirements)


OnImport = Callable[[Any], None]


def when_imported(module: str, hook: OnImport, *, extra: str = "instrument") -> None:
    """Run ``hook(module)`` once ``module`` is imported (now, if it already is).

    Uses wrapt's post-import hooks (wrapt comes with opentelemetry-instrumentation), so an
    instrumentor loaded at interpreter start does not import the framework itself: processes
    that never use it pay nothing. Without wrapt, a module already imported gets its hook
    now; for one not imported yet a ``ModuleNotFoundError`` names ``extra`` (the extra that
    installs wrapt with the framework).
    """
    try:
        import wrapt
    except ModuleNotFoundError:
        loaded = sys.modules.get(module)
        if loaded is not None:
            hook(loaded)
            return
        require("wrapt", extra, f"otel-tunix's {module.split('.')[0]} integration")
        raise  # not reached: require() raised
    wrapt.register_post_import_hook(hook, module)
