"""Tracer and meter providers: join the application's, or build ours from ``OTEL_*``.

Exporters are resolved by name through the OTel entry-point groups
(``opentelemetry_traces_exporter`` / ``opentelemetry_metrics_exporter``), exactly as
``opentelemetry-instrument`` does, so ``otlp``, ``console``, ``prometheus`` and otel-tunix's
own ``perfetto`` and ``datadog`` all work with ``OTEL_TRACES_EXPORTER`` /
``OTEL_METRICS_EXPORTER``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from otel_tunix.exporters.otlp_tls import keep_certificate
from otel_tunix.pipeline.export_processor import BatchExportProcessor, ExportStats
from otel_tunix.run.signal_exports import (
    CountingLogExporter,
    CountingMetricExporter,
    SignalExportStats,
)
from otel_tunix.settings.parsing import ConfigurationError
from otel_tunix.settings.redact import RedactingFilter
from otel_tunix.settings.values import Settings
from otel_tunix.support.shortcuts import reset_global_providers

_logger = logging.getLogger(__name__)

_EXTRA_FOR = {
    "otlp_proto_grpc": "otlp",
    "otlp_proto_http": "otlp",
    "perfetto": "perfetto",
    "datadog": "datadog",
    "prometheus": "prometheus",
}


def _otlp_entry_point(settings: Settings, signal: str) -> str:
    """The entry point of the OTLP exporter of ``signal`` for its configured protocol."""
    protocol = settings.otlp_protocol_of(signal)
    return "otlp_proto_grpc" if protocol == "grpc" else "otlp_proto_http"


def _exporter_var(signal: str) -> str:
    return f"OTEL_{signal.upper()}_EXPORTER"


def _asked_by(settings: Settings, signal: str, name: str) -> str:
    """What the user set that asks for exporter ``name`` of ``signal``: its
    ``OTEL_<SIGNAL>_EXPORTER``, or, for ``otlp`` when that is unset, the OTLP endpoint."""
    if name == "otlp" and getattr(settings, f"{signal}_exporter") is None:
        own = f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
        var = own if getattr(settings, f"otlp_{signal}_endpoint") else "OTEL_EXPORTER_OTLP_ENDPOINT"
        return f"{var} is set, which sends {_WHAT[signal]} over OTLP"
    return f"{_exporter_var(signal)} names {name!r}"


_WHAT = {"traces": "spans", "metrics": "metrics", "logs": "log records"}


def load_exporter_class(group: str, name: str, why: str) -> Any:
    """Load an exporter class from its entry point, with a clear error when it is missing.

    ``why``: what the user set that asks for it (see :func:`_asked_by`), for the message.
    """
    found = list(entry_points(group=group, name=name))
    if not found:
        extra = _EXTRA_FOR.get(name)
        hint = f": pip install 'otel-tunix[{extra}]'" if extra else ""
        missing = (
            "the OTLP exporter is not installed"
            if extra == "otlp"
            else "no such exporter is installed"
        )
        raise ConfigurationError(f"{why}, but {missing}{hint}")
    try:
        cls = found[0].load()
    except ImportError as exc:  # our own entry point whose package is missing (perfetto)
        raise ConfigurationError(f"{why}, but {exc}") from exc
    redact_exporter_logs()
    return cls


_REDACTING = RedactingFilter()


def redact_exporter_logs() -> None:
    """Put :class:`~otel_tunix.settings.redact.RedactingFilter` on the OTel exporters' loggers
    (those of the modules imported so far): their retry and failure messages quote request
    URLs with their queries (``?sig=...``) as they are. A logger's filter sees only its own
    records, so each one gets it."""
    names = [n for n in logging.root.manager.loggerDict if n.startswith("opentelemetry.exporter")]
    for name in names:
        log = logging.getLogger(name)
        if _REDACTING not in log.filters:
            log.addFilter(_REDACTING)


def trace_exporters(settings: Settings) -> list[tuple[str, Any]]:
    """``(name, exporter)`` for each name in ``OTEL_TRACES_EXPORTER``, built from the env."""
    out = []
    for name in settings.exporters("traces"):
        ep = _otlp_entry_point(settings, "traces") if name == "otlp" else name
        why = _asked_by(settings, "traces", name)
        cls = load_exporter_class("opentelemetry_traces_exporter", ep, why)
        out.append((name, _otlp_span_exporter(cls, settings) if name == "otlp" else cls()))
    return out


def _otlp_span_exporter(cls: Any, settings: Settings) -> Any:
    """The OTLP span exporter: the SDK's class with otel-tunix's step encoder (issue #30's
    fast path; ``OTEL_TUNIX_OTLP_FAST_PATH=false`` for the SDK's as it is)."""
    from otel_tunix.exporters.otlp import otlp_span_exporter  # needs the otlp extra

    return otlp_span_exporter(cls, settings.otlp_fast_path)


def metric_readers(
    settings: Settings,
    urls: dict[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    counts: dict[str, SignalExportStats] | None = None,
) -> list[MetricReader]:
    """Metric readers for ``OTEL_METRICS_EXPORTER`` (a reader class is used as is).

    Endpoints that serve metrics (Prometheus) put their URL into ``urls`` and put
    ``labels`` on every series they serve. With ``counts``, each pushing exporter counts
    its exports and failures there, by exporter name.
    """
    out: list[MetricReader] = []
    var = _exporter_var("metrics")
    for name in settings.exporters("metrics"):
        if name == "prometheus":
            # Our endpoint rather than the stock one: a private registry, /healthz, loopback
            # by default, OTEL_TUNIX_PROMETHEUS_{HOST,PORT} (see exporters/prometheus.py).
            try:
                from otel_tunix.exporters.prometheus import PrometheusEndpoint
            except ImportError as exc:
                raise ConfigurationError(
                    f"{var}=prometheus needs pip install 'otel-tunix[prometheus]' ({exc})"
                ) from exc
            try:
                endpoint = PrometheusEndpoint(labels=labels)
            except OSError as exc:  # a taken port: said once, the run goes on without it
                _logger.warning(
                    "otel-tunix: %s; the run goes on without the Prometheus endpoint (set "
                    "OTEL_TUNIX_PROMETHEUS_PORT to a free port, or 0 for any)",
                    exc.strerror or exc,
                )
                continue
            if urls is not None:
                urls["prometheus"] = endpoint.url
            out.append(endpoint.reader)
            continue
        ep = _otlp_entry_point(settings, "metrics") if name == "otlp" else name
        why = _asked_by(settings, "metrics", name)
        cls = load_exporter_class("opentelemetry_metrics_exporter", ep, why)
        obj = cls()
        keep_certificate(obj)  # OTLP/HTTP: its CA over REQUESTS_CA_BUNDLE's
        if isinstance(obj, MetricReader):
            out.append(obj)
            continue
        if counts is not None:
            obj = CountingMetricExporter(obj, counts.setdefault(name, SignalExportStats()))
        out.append(PeriodicExportingMetricReader(obj))
    return out


def build_tracer_provider(
    resource: Resource,
    stats: dict[str, ExportStats],
    settings: Settings,
    built: list[BatchExportProcessor] | None = None,
) -> TracerProvider:
    """A new SDK TracerProvider with a counting batch processor per configured exporter
    (``stats`` gets one :class:`ExportStats` per exporter name; ``built`` each processor,
    for the run's consumers)."""
    tp = TracerProvider(resource=resource)
    for name, exporter in trace_exporters(settings):
        stat = stats.setdefault(name, ExportStats())
        processor = BatchExportProcessor(exporter, stat, settings=settings)
        tp.add_span_processor(processor)
        if built is not None:
            built.append(processor)
    return tp


def build_meter_provider(resource: Resource, readers: list[MetricReader]) -> MeterProvider:
    """A new SDK MeterProvider with these readers (see :func:`metric_readers`)."""
    return MeterProvider(resource=resource, metric_readers=readers)


def install_global_providers(
    tp: TracerProvider | None, mp: MeterProvider | None, replaceable: tuple[object, ...]
) -> None:
    """Make our providers the global ones, so other code's spans nest under ours.

    The OTel API lets a global provider be set once per process. A provider that otel-tunix
    itself installed in an earlier ``configure()`` (listed in ``replaceable``) is replaced by
    resetting the API's set-once guard, as OpenTelemetry's own test utilities do; a provider
    the application installed is never replaced (``configure()`` joins it instead).
    """
    if tp is not None:
        if trace.get_tracer_provider() in replaceable:
            reset_global_providers(meter=False)
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            trace.set_tracer_provider(tp)
    if mp is not None:
        if metrics.get_meter_provider() in replaceable:
            reset_global_providers(tracer=False)
        if not isinstance(metrics.get_meter_provider(), MeterProvider):  # the API's proxy
            metrics.set_meter_provider(mp)


def still_global(providers: tuple[object, ...]) -> list[object]:
    """Those of ``providers`` that are the API's global tracer or meter provider now."""
    current = (trace.get_tracer_provider(), metrics.get_meter_provider())
    return [c for c in current if any(c is p for p in providers)]


def build_logger_provider(
    resource: Resource, settings: Settings, counts: dict[str, SignalExportStats] | None = None
) -> Any:
    """A new SDK LoggerProvider with a batch processor per exporter named in
    ``OTEL_LOGS_EXPORTER`` (``otlp`` when only an OTLP endpoint is set), or ``None`` when
    no exporter is configured (log records then stay in process). With ``counts``, each
    exporter counts its exports and failures there, by exporter name."""
    names = settings.exporters("logs")
    if not names:
        return None

    provider = LoggerProvider(resource=resource)
    for name in names:
        ep = _otlp_entry_point(settings, "logs") if name == "otlp" else name
        why = _asked_by(settings, "logs", name)
        cls = load_exporter_class("opentelemetry_logs_exporter", ep, why)
        exporter = cls()
        keep_certificate(exporter)  # OTLP/HTTP: its CA over REQUESTS_CA_BUNDLE's
        if counts is not None:
            exporter = CountingLogExporter(exporter, counts.setdefault(name, SignalExportStats()))
        provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
    return provider
