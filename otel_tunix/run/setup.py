"""``configure()`` / ``shutdown()``: one run's providers, pipeline, processors and files."""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import _logs, metrics, trace
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_tunix import _ids, _recording, _resource
from otel_tunix import environment_variables as env
from otel_tunix._current import CurrentRun, RunInfo, get_current, set_current
from otel_tunix._current import meter as current_meter
from otel_tunix._linefile import record_write_error
from otel_tunix._resource import RankInfo, build_resource, detect_rank, new_run_id
from otel_tunix._shortcuts import (
    active_span_processor,
    remove_span_processors,
    silence_periodic_readers,
)
from otel_tunix._version import __version__
from otel_tunix.config import PerformanceMetricsConfig, load_callable
from otel_tunix.exporters.datadog import DatadogClient, DatadogMetricExporter, DatadogStepSink
from otel_tunix.exporters.jsonl import StepJsonlWriter
from otel_tunix.live_line import LiveLine
from otel_tunix.metrics.alerts import AlertEngine
from otel_tunix.metrics.stragglers import StragglerDetector
from otel_tunix.metrics.system import SystemMetricsSampler
from otel_tunix.metrics_logger import MetricsLogger, MetricsLoggerOptions, metrics_file_name
from otel_tunix.model import ScopeSession, StepSummary
from otel_tunix.pipeline.export_processor import BatchExportProcessor, ExportStats
from otel_tunix.pipeline.span_builder import SpanBuilder, epoch_offset_ns
from otel_tunix.pipeline.worker import Pipeline
from otel_tunix.processors import StepAccountingProcessor, StepSink
from otel_tunix.run import folders, notices, providers, signals
from otel_tunix.run import run_config as run_config_
from otel_tunix.run.paths import checked_dir, checked_file, path_component
from otel_tunix.run.perfetto_trace import (
    PERFETTO_AT_SHUTDOWN,
    perfetto_dir,
    perfetto_from_jsonl,
)
from otel_tunix.run.signal_exports import new_signal_stats
from otel_tunix.run.state import RunState, register_observables, write_summary
from otel_tunix.settings import ConfigurationError, Settings, load_settings
from otel_tunix.sinks import ExportFnSink, InstrumentSink, MetricsLoggerSink

_logger = logging.getLogger(__name__)


_lock = threading.RLock()
_state: RunState | None = None
_installed: list[object] = []  # providers otel-tunix made global (replaceable by a later run)
_forked_from_a_run = False  # this process is a forked child of one with a run configured


def _output_dir(
    arg: str | os.PathLike[str] | None, run_id: str, settings: Settings, rank_suffix: str = ""
) -> Path | None:
    raw = os.fspath(arg) if arg is not None else settings.output_dir
    if raw is not None and raw.strip().lower() == "none":
        return None
    if raw is None or not raw.strip():  # one folder per run, also for a reused job id
        return folders.fresh_folder(Path("otel-tunix-runs") / path_component(run_id), rank_suffix)
    return Path(raw)


def configure(
    *,
    service_name: str | None = None,
    perf: PerformanceMetricsConfig | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    run_id: str | None = None,
    metrics_logger: MetricsLogger | MetricsLoggerOptions | None = None,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    span_exporters: Sequence[SpanExporter] = (),
    resource_attributes: dict[str, Any] | None = None,
    alerts: bool | Iterable[Any] | None = None,
    system_metrics: bool | float | None = None,
    logger_provider: Any = None,
    span_processors: Sequence[SpanProcessor] = (),
    metric_readers: Sequence[MetricReader] = (),
    step_sinks: Sequence[StepSink] = (),
    clock: Callable[[], int] | None = None,
    id_seed: int | None = None,
    console_interval: float | None = None,
    run_config: Mapping[str, Any] | None = None,
) -> RunInfo:
    """Set up otel-tunix for this process (keyword-only, idempotent, thread-safe).

    Calling it again shuts the previous run down first. Settings resolve argument, then
    environment, then default (see the README's configuration table).

    Args:
        service_name: ``service.name`` (else ``OTEL_SERVICE_NAME``).
        perf: What to record: sampling, component filter, JSONL path, export function.
        output_dir: Local run folder (else ``OTEL_TUNIX_OUTPUT_DIR``, else
            ``./otel-tunix-runs/<run id>``; ``"none"`` turns it off).
        run_id: ``tunix.run.id`` (else ``OTEL_TUNIX_RUN_ID``, else the launcher's job id,
            else a new id).
        metrics_logger: A :class:`MetricsLogger` to receive the ``perf/...`` scalars, or
            options for the default one (which writes ``metrics.jsonl`` in the run folder).
        tracer_provider: An SDK TracerProvider to use. Default: the application's global SDK
            provider if it set one (joined, its exporters reused, nothing exported twice),
            else a new one with the exporters of ``OTEL_TRACES_EXPORTER``.
        meter_provider: Likewise for metrics (``OTEL_METRICS_EXPORTER``).
        span_exporters: More OTel ``SpanExporter`` objects to send spans to (each behind
            otel-tunix's batch processor, its spans counted in ``summary.json``), besides
            those of ``OTEL_TRACES_EXPORTER``. They are added to the tracer provider in use
            (an application's one included) and shut down by :func:`shutdown`.
        resource_attributes: More resource attributes.
        alerts: ``True`` for the default alert rules, a list of
            :class:`~otel_tunix.metrics.alerts.Rule` for others, ``False`` for none (else
            ``OTEL_TUNIX_ALERTS``, default on). The engine watches every logged scalar.
        system_metrics: Seconds between GPU / process / host samples, ``True`` for 10,
            ``False`` or ``0`` for no sampler (else ``OTEL_TUNIX_SYSTEM_METRICS_INTERVAL``,
            default 10). In a distributed job only local rank 0 reads the GPUs.
        logger_provider: An SDK LoggerProvider for alert log records. Default: the
            application's global SDK provider if it set one, else a new one with the
            exporters of ``OTEL_LOGS_EXPORTER`` (none: records stay in process).
        span_processors: More OTel ``SpanProcessor`` objects, added to the tracer provider
            in use (they see otel-tunix's spans and every other span of the provider).
        metric_readers: More OTel ``MetricReader`` objects for the MeterProvider otel-tunix
            builds (an application's own provider keeps its readers; then this must be
            empty).
        step_sinks: More :class:`~otel_tunix.processors.StepSink` objects: each gets every
            :class:`~otel_tunix.model.StepSummary` and the session totals.
        clock: What step and component times are read from instead of
            ``time.perf_counter_ns`` (nanoseconds); span times are then the clock's values
            as they are (no offset to the Unix epoch). For deterministic tests.
        id_seed: Draw trace and span ids from ``random.Random(id_seed)`` instead of the
            OS's entropy. For deterministic tests.
        console_interval: Seconds between live lines on stderr (step, loss, tokens/s, step
            time, busy / blocked / idle %; :mod:`otel_tunix.live_line`), ``0`` for none
            (else ``OTEL_TUNIX_CONSOLE_INTERVAL``, default none). Rank 0, with otel-tunix's
            own MetricsLogger.
        run_config: The run's hyperparameters, as ``wandb.config``: written to
            ``config.json`` in the run folder, scalars (nested dicts flattened with dots) on
            the resource as ``tunix.config.<key>``; merged over what
            :func:`otel_tunix.set_config` kept before ``configure()``.

    Returns:
        The :class:`RunInfo` of the run.

    Raises:
        ConfigurationError: a value (argument or environment variable) is not allowed.
    """
    global _state
    with _lock:
        if _state is not None:
            shutdown()
        settings = load_settings()
        cfg = (perf if perf is not None else PerformanceMetricsConfig()).resolved(settings)
        if not isinstance(cfg, PerformanceMetricsConfig):  # pragma: no cover - typing guard
            raise ConfigurationError("perf must be a PerformanceMetricsConfig")
        export_fn = cfg.export_fn
        if isinstance(export_fn, str):
            export_fn = load_callable(export_fn, "export_fn / " + env.OTEL_TUNIX_EXPORT_FN)
        interval = _system_interval(system_metrics, settings)
        line_sec = _console_interval(console_interval, settings)
        if metrics_logger is not None and not isinstance(
            metrics_logger, MetricsLogger | MetricsLoggerOptions
        ):
            raise ConfigurationError(
                "metrics_logger must be a MetricsLogger or MetricsLoggerOptions, "
                f"got {metrics_logger!r}"
            )
        for sink in step_sinks:
            if not isinstance(sink, StepSink):
                raise ConfigurationError(
                    f"step_sinks: {sink!r} is not an otel_tunix.processors.StepSink"
                )
        for proc in span_processors:
            if not isinstance(proc, SpanProcessor):
                raise ConfigurationError(f"span_processors: {proc!r} is not a SpanProcessor")
        for reader in metric_readers:
            if not isinstance(reader, MetricReader):
                raise ConfigurationError(f"metric_readers: {reader!r} is not a MetricReader")
        if metric_readers and meter_provider is not None:
            raise ConfigurationError(
                "metric_readers: add them to the meter_provider given instead (an SDK "
                "MeterProvider takes its readers when it is made)"
            )
        if clock is not None and not callable(clock):
            raise ConfigurationError(f"clock must be a function returning ns, got {clock!r}")
        if id_seed is not None and (isinstance(id_seed, bool) or not isinstance(id_seed, int)):
            raise ConfigurationError(f"id_seed must be an int or None, got {id_seed!r}")
        span_exporters = tuple(span_exporters)
        for exporter in span_exporters:
            if not callable(getattr(exporter, "export", None)):
                raise ConfigurationError(
                    f"span_exporters: {exporter!r} is not a SpanExporter (it has no export method)"
                )
        rid = run_id or new_run_id(settings)
        rank = detect_rank(settings)
        config = run_config_.take_pending(rid, run_config)
        ours = _resource.resource_attributes(
            service_name=service_name,
            run_id=rid,
            rank=rank,
            extra={**run_config_.config_attributes(config), **(resource_attributes or {})},
        )
        resource = build_resource(ours)
        disabled = settings.sdk_disabled
        out_dir = None if disabled else _output_dir(output_dir, rid, settings, rank.file_suffix)
        if out_dir is not None and _forked_from_a_run:  # never the parent's files
            out_dir = out_dir / f"forked-{os.getpid()}"
        files: dict[str, Path] = {}
        if out_dir is not None:
            folders.note_made(out_dir)
            checked_dir(out_dir, "output_dir / " + env.OTEL_TUNIX_OUTPUT_DIR)
            if config:
                files["config"] = out_dir / run_config_.CONFIG_FILE
                run_config_.write_config(files["config"], config)
        if cfg.export_jsonl_path and not disabled:
            checked_file(
                cfg.export_jsonl_path, "export_jsonl_path / " + env.OTEL_TUNIX_EXPORT_JSONL_PATH
            )

        if disabled:
            logger = _make_logger(
                metrics_logger, None, rid, rank, None, enabled=False, settings=settings
            )
            info = RunInfo(rid, None, resource, rank, enabled=False)
            _recording.set_runtime(None)
            _state = RunState(
                info,
                cfg,
                settings,
                logger,
                owns_logger=not isinstance(metrics_logger, MetricsLogger),
            )
            set_current(CurrentRun(info, logger, cfg.otel_scope or "tunix"))
            return info

        # --- providers -------------------------------------------------------------------
        export_stats: dict[str, ExportStats] = {}
        signal_stats = new_signal_stats()  # metric and log exports, counted (signal_exports.py)
        datadog = _datadog_client(settings)
        endpoints: dict[str, str] = {}
        readers: list[Any] = []  # those of a MeterProvider otel-tunix builds

        series_labels = (
            {"service": str(resource.attributes.get("service.name", "")), "run_id": rid}
            if settings.prometheus_run_labels
            else None
        )

        def build_meter_provider() -> MeterProvider:
            readers.extend(
                [
                    *metric_readers,
                    *providers.metric_readers(
                        settings, endpoints, series_labels, signal_stats["metrics"]
                    ),
                    *_datadog_readers(datadog, settings),
                ]
            )
            return providers.build_meter_provider(resource, readers)

        tp, owns_tp = _provider(
            tracer_provider,
            trace.get_tracer_provider(),
            TracerProvider,
            lambda: providers.build_tracer_provider(resource, export_stats, settings),
        )
        mp, owns_mp = _provider(
            meter_provider,
            metrics.get_meter_provider(),
            MeterProvider,
            build_meter_provider,
        )
        providers.install_global_providers(
            tp if owns_tp else None, mp if owns_mp else None, tuple(_installed)
        )
        # Still replaceable later: what this run installed, and an earlier run's provider
        # that is still the global one (this run joined a provider it was given).
        _installed[:] = providers.still_global(
            (*_installed, tp if owns_tp else None, mp if owns_mp else None)
        )
        span_resource = resource if owns_tp else tp.resource.merge(Resource(ours))

        # --- sinks -----------------------------------------------------------------------
        logger = _make_logger(
            metrics_logger, out_dir, rid, rank, mp, enabled=True, settings=settings
        )
        if out_dir is not None and logger.backends:
            files["metrics"] = out_dir / metrics_file_name(rank.rank)
        processor = StepAccountingProcessor()
        header = {
            "run_id": rid,
            "start_ns": time.time_ns(),
            "sampling_rate": cfg.sampling_rate,
            "resource": dict(span_resource.attributes),
        }
        instruments = None
        # A provider otel-tunix built with no reader (no metrics exporter configured): every
        # point recorded into it would cost ~4 us for nothing.
        if not owns_mp or readers:
            instruments = InstrumentSink(mp.get_meter(cfg.otel_scope, __version__))
            processor.add_sink(instruments)
        processor.add_sink(MetricsLoggerSink(logger))
        if out_dir is not None:
            files["spans"] = out_dir / f"spans{rank.file_suffix}.jsonl"
            processor.add_sink(StepJsonlWriter(files["spans"], header))
        if cfg.export_jsonl_path:
            processor.add_sink(StepJsonlWriter(cfg.export_jsonl_path, header))
        if export_fn is not None:
            processor.add_sink(ExportFnSink(export_fn, instruments=instruments, logger=logger))
        if datadog is not None:
            processor.add_sink(DatadogStepSink(datadog, resource=resource))
        for sink in step_sinks:
            processor.add_sink(sink)
        slowest = notices.SlowestSteps()
        processor.add_sink(slowest)
        if out_dir is not None:
            files["summary"] = out_dir / f"summary{rank.file_suffix}.json"
        lp, owns_lp = logger_provider, False
        if lp is None:
            lp = _global_logger_provider()
            if lp is None:
                lp = providers.build_logger_provider(resource, settings, signal_stats["logs"])
                owns_lp = lp is not None
        alerts_path = out_dir / f"alerts{rank.file_suffix}.jsonl" if out_dir else None
        if alerts is None:
            alerts = settings.alerts
        engine = _alert_engine(alerts, logger, lp, mp, datadog, alerts_path)
        own_logger = not isinstance(metrics_logger, MetricsLogger)
        if line_sec is not None and rank.rank == 0 and own_logger:
            logger.backends.append(LiveLine(line_sec))
        if settings.straggler_window and rank.world_size > 1:
            processor.add_sink(
                StragglerDetector(
                    rank=rank.rank,
                    world_size=rank.world_size,
                    run_id=rid,
                    scope=settings.straggler_scope,
                    window=settings.straggler_window,
                    margin=settings.straggler_margin,
                    windows=settings.straggler_windows,
                    engine=engine,
                    logger=logger if logger.active else None,
                    meter_provider=mp,
                )
            )
        if engine is not None and alerts_path is not None:
            files["alerts"] = alerts_path
        sampler = None
        if interval is not None:
            sampler = SystemMetricsSampler(
                mp, interval_sec=interval, gpus=rank.local_rank in (None, 0)
            ).start()

        info = RunInfo(
            rid,
            out_dir,
            resource,
            rank,
            enabled=bool(cfg.enabled),
            files=files,
            endpoints=endpoints,
        )
        state = RunState(
            info,
            cfg,
            settings,
            logger,
            owns_logger=not isinstance(metrics_logger, MetricsLogger),
            processor=processor,
            tracer_provider=tp,
            owns_tracer_provider=owns_tp,
            meter_provider=mp,
            owns_meter_provider=owns_mp,
            offset_ns=0 if clock is not None else epoch_offset_ns(),
            datadog=datadog,
            export_stats=export_stats,
            signal_export_stats=signal_stats,
            alerts=engine,
            sampler=sampler,
            logger_provider=lp,
            owns_logger_provider=owns_lp,
        )
        tp.add_span_processor(processor)
        for proc in span_processors:
            tp.add_span_processor(proc)
        state.user_processors = tuple(span_processors)
        for exporter in span_exporters:
            name = type(exporter).__name__
            stats = export_stats.setdefault(name, ExportStats())
            state.export_processors.append(BatchExportProcessor(exporter, stats, settings=settings))
            tp.add_span_processor(state.export_processors[-1])
        trace_dir = perfetto_dir(cfg, out_dir, settings)
        state.perfetto_at_shutdown = trace_dir == PERFETTO_AT_SHUTDOWN
        if isinstance(trace_dir, Path):
            from otel_tunix.exporters.perfetto import PerfettoSpanExporter

            perfetto = PerfettoSpanExporter(directory=trace_dir)
            try:  # the file exists from the run's start: a kill early still leaves one
                perfetto.open_file(span_resource)
            except OSError as exc:  # said in words; the first export tries again
                record_write_error(trace_dir, exc, 0)
            stats = export_stats.setdefault("perfetto", ExportStats())
            # A local file: written as often as the steps are processed, so a hard kill
            # loses about OTEL_TUNIX_PROCESS_INTERVAL_MS of it (not OTEL_BSP_SCHEDULE_DELAY).
            every_ms = max(1, round(cfg.process_interval_ms or 250.0))
            state.export_processors.append(
                BatchExportProcessor(
                    perfetto, stats, schedule_delay_millis=every_ms, settings=settings
                )
            )
            tp.add_span_processor(state.export_processors[-1])
            state.perfetto = perfetto
        span_sink = active_span_processor(tp, processor)
        if cfg.enabled:
            pipeline = Pipeline(
                SpanBuilder(
                    span_sink,
                    span_resource,
                    InstrumentationScope(cfg.otel_scope or "tunix", __version__),
                    offset=state.offset_ns,
                ),
                after_batch=processor.flush_sinks,
                interval_sec=(cfg.process_interval_ms or 250.0) / 1e3,
            )
            job = settings.job_traces and rank.world_size > 1
            state.runtime = _recording.Runtime(
                cfg.sampling_rate or 1,
                cfg.components,
                pipeline,
                job_ids=_ids.JobStepIds(rid) if job else None,
                job_root=job and rank.rank == 0,
            )
        _recording.set_clock(clock)
        _ids.seed(id_seed)
        state.meter = mp.get_meter(cfg.otel_scope, __version__)
        register_observables(state.meter, state)
        _recording.set_runtime(state.runtime)
        _state = state
        set_current(
            CurrentRun(
                info,
                logger,
                cfg.otel_scope or "tunix",
                meter_provider=mp,
                last_step_summary=lambda: processor.last_summary,
                add_step_sink=processor.add_sink,
                process_steps=_process_steps(state.runtime),
            )
        )
        _register_atexit()
        signals.install(shutdown)
        _logger.info("otel-tunix: run %s, local folder %s", rid, out_dir)
        for kind, url in endpoints.items():
            _logger.info("otel-tunix: %s endpoint at %s", kind, url)
        state.slowest = slowest
        notices.at_configure(
            info,
            settings,
            cfg,
            notices.destinations(
                settings,
                output_dir=out_dir,
                jsonl_path=cfg.export_jsonl_path,
                own_tracer_provider=owns_tp,
                own_meter_provider=owns_mp,
                endpoints=endpoints,
                span_exporters=span_exporters,
                perfetto=str(trace_dir) if isinstance(trace_dir, Path) else None,
                datadog=datadog,
            ),
        )
        return info


def _provider(given: Any, global_: Any, sdk_type: type, build: Any) -> tuple[Any, bool]:
    """The provider to use and whether otel-tunix owns it: the one given, else the
    application's global SDK provider (joined), else a new one (built from ``OTEL_*``)."""
    if given is not None:
        return given, False
    if isinstance(global_, sdk_type) and global_ not in _installed:
        return global_, False
    return build(), True


def _datadog_client(settings: Settings) -> Any:
    """A DatadogClient when ``DATADOG_ENABLED`` / ``OTEL_METRICS_EXPORTER=datadog`` ask for it.

    The settings are checked first so that the ``datadog`` package is imported only when used.
    """
    if not settings.datadog_wanted:
        return None
    try:
        return DatadogClient()
    except ImportError as exc:
        raise ConfigurationError(f"DATADOG_ENABLED / OTEL_METRICS_EXPORTER=datadog: {exc}") from exc


def _datadog_readers(client: Any, settings: Settings) -> list[Any]:
    """The Datadog metric reader, unless ``OTEL_METRICS_EXPORTER`` already names datadog."""
    if client is None or "datadog" in (settings.metrics_exporter or ()):
        return []
    return [PeriodicExportingMetricReader(DatadogMetricExporter(client))]


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


def _global_logger_provider() -> Any:
    """The application's global SDK LoggerProvider, if it set one."""
    provider = _logs.get_logger_provider()
    return provider if isinstance(provider, LoggerProvider) else None


def _alert_engine(
    alerts: bool | Iterable[Any],
    logger: MetricsLogger,
    logger_provider: Any,
    meter_provider: Any,
    datadog: Any,
    jsonl_path: Path | None,
) -> Any:
    """The alert engine, added to the logger's backends (``None``: alerts off)."""
    if alerts is False or not logger.active:
        return None
    engine = AlertEngine(
        None if alerts is True else list(alerts),
        logger_provider=logger_provider,
        meter_provider=meter_provider,
        datadog=datadog if datadog is not None else False,
        jsonl_path=jsonl_path,
    )
    logger.backends.append(engine)
    return engine


def _make_logger(
    given: MetricsLogger | MetricsLoggerOptions | None,
    out_dir: Path | None,
    run_id: str,
    rank: RankInfo,
    meter_provider: Any,
    *,
    enabled: bool,
    settings: Settings,
) -> MetricsLogger:
    if isinstance(given, MetricsLogger):
        return given
    if not enabled:
        return MetricsLogger(
            MetricsLoggerOptions(default_backends=False),
            run_id=run_id,
            rank=rank.rank,
            settings=settings,
        )
    opts = given or MetricsLoggerOptions(log_dir=out_dir, run_name=run_id)
    return MetricsLogger(
        opts, run_id=run_id, rank=rank.rank, meter_provider=meter_provider, settings=settings
    )


def _process_steps(runtime: _recording.Runtime | None) -> Callable[[float], bool]:
    """``CurrentRun.process_steps`` of a run (nothing to wait for when it records nothing)."""
    if runtime is None:
        return lambda timeout: True
    return runtime.pipeline.flush


def _forget_run_in_child() -> None:
    """A forked child: the parent's run is not its own. It records nothing and writes none
    of the parent's files (its atexit finds no run to finish) unless it calls
    ``configure()`` itself, which then writes a folder of its own (``forked-<pid>`` in the
    run folder)."""
    global _lock, _state, _forked_from_a_run
    _lock = threading.RLock()  # another thread may have held it at the fork
    st = _state
    if st is not None:
        _forked_from_a_run = True
        _state = None
        _recording.set_runtime(None)
        _recording.set_clock(None)
        set_current(None)
        # The SDK's exit hooks of the parent's providers would export the child's copy of
        # the parent's data at its exit (blocked for the exporters' timeouts when the
        # collector is down): those providers are the parent's to shut down.
        for provider, owned in (
            (st.tracer_provider, st.owns_tracer_provider),
            (st.meter_provider, st.owns_meter_provider),
            (st.logger_provider, st.owns_logger_provider),
        ):
            if owned and provider is not None:
                atexit.unregister(provider.shutdown)
        if st.owns_meter_provider and st.meter_provider is not None:
            silence_periodic_readers(st.meter_provider)


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_forget_run_in_child)


def _register_atexit() -> None:
    # Again at every configure(): atexit runs the last registered first, and the SDK
    # registers each provider's shutdown as the provider is made. Ours must run before
    # those of this run's providers (a tracer provider shut down first drops the run's
    # last steps: a second configure() whose run ended at exit lost them all).
    atexit.unregister(shutdown)
    atexit.register(shutdown)


def force_flush(timeout: float = 10.0) -> bool:
    """Process every finished step and flush the providers' exporters."""
    with _lock:
        st = _state
    if st is None or st.runtime is None:
        return True
    ok = st.runtime.pipeline.flush(timeout)
    if st.tracer_provider is not None:
        ok = st.tracer_provider.force_flush(int(timeout * 1000)) and ok
    if st.meter_provider is not None:
        ok = st.meter_provider.force_flush(int(timeout * 1000)) and ok
    return bool(ok)


def shutdown(timeout: float | None = None) -> list[ScopeSession]:
    """Finish the run: process queued steps, write the session lines and summary, flush.

    Takes at most ``timeout`` seconds (default: ``OTEL_TUNIX_SHUTDOWN_TIMEOUT``, 5 s)
    whatever the collector does: the queued steps and the local files come first, then the
    exporters and providers get what time is left, side by side; those that have not
    finished by then are left behind (their unsent spans count as dropped) and
    ``summary.json`` names them under ``"shutdown"``. Idempotent; registered with
    ``atexit`` and called by the SIGTERM handler. Returns the per-scope session totals.
    """
    global _state
    with _lock:
        st = _state
        if st is None:
            return []
        budget = st.settings.shutdown_timeout if timeout is None else max(0.0, timeout)
        deadline = time.monotonic() + budget

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        _state = None
        _recording.set_runtime(None)
        _recording.set_clock(None)
        _ids.seed(None)
        set_current(None)
        signals.uninstall()
        sessions: list[ScopeSession] = []
        if st.sampler is not None:
            st.sampler.stop()
        rt = st.runtime
        if rt is not None and st.processor is not None:
            rt.pipeline.close(left())
            counts = {
                scope: (
                    s.count,
                    s.first_start_ns + st.offset_ns,
                    s.last_end_ns + st.offset_ns,
                    s.active_ns,
                )
                for scope, s in rt.scopes.items()
            }
            st.processor.finish_session(counts)
            sessions = st.processor.sessions(counts)
        if st.owns_logger:
            st.logger.close()
        elif st.alerts is not None:  # the application's own logger: detach the engine
            if st.alerts in st.logger.backends:
                st.logger.backends.remove(st.alerts)
            st.alerts.close()
        summary_path = st.info.files.get("summary")
        if summary_path is not None and rt is not None:
            # Written now and again below: exporters may take the rest of the time to shut
            # down (a collector that is down), and a job given a short grace period after
            # SIGTERM keeps at least this one, with the export counts so far.
            write_summary(summary_path, st, sessions, complete=False)
        spans_file = st.info.files.get("spans")
        if st.perfetto_at_shutdown and spans_file is not None and rt is not None:
            trace_file = perfetto_from_jsonl(spans_file, st.info.rank)  # a local file: first
            if trace_file is not None:
                st.info.files["perfetto"] = trace_file
        unfinished = _stop_exporters(st, left())
        # A provider can outlive the run (the application's, or ours made global, which
        # OTel never replaces): it lets go of this run's processors and callbacks, which
        # would otherwise keep the whole run (pipeline, steps, sinks) in memory for good.
        if st.tracer_provider is not None and st.processor is not None:
            remove_span_processors(
                st.tracer_provider, (st.processor, *st.export_processors, *st.user_processors)
            )
        if st.meter is not None:
            register_observables(st.meter, None)
        if st.datadog is not None:
            st.datadog.close()
        if st.perfetto is not None and st.perfetto.path is not None:
            st.info.files["perfetto"] = st.perfetto.path
        if summary_path is not None and rt is not None:
            write_summary(
                summary_path, st, sessions, complete=True, timeout=budget, unfinished=unfinished
            )
        for name, stats in st.export_stats.items():
            if stats.failed or stats.dropped:
                _logger.warning(
                    "otel-tunix: exporter %s: %d spans failed and %d were dropped (%s)",
                    name,
                    stats.failed,
                    stats.dropped,
                    "the trace file could not be written"
                    if name == "perfetto"
                    else "collector down or slow?",
                )
        if unfinished:
            _logger.warning(
                "otel-tunix: %s had not finished after %g s (OTEL_TUNIX_SHUTDOWN_TIMEOUT); "
                "left behind, what they held is not sent",
                ", ".join(unfinished),
                budget,
            )
        folders.drop_if_empty(st.info, sessions)
        notices.at_shutdown(st, sessions)
        return sessions


def _stop_exporters(st: RunState, timeout: float) -> list[str]:
    """Shut down the run's export processors and providers (or flush the application's
    providers), each on a thread of its own, side by side; wait at most ``timeout``.
    Returns the names of those that had not finished (they go on as daemon threads; the
    process may end under them)."""
    parts: list[tuple[str, Callable[[], object]]] = []
    if not st.owns_tracer_provider:  # ours in an application's provider: close them
        parts += [
            (f"exporter {type(p.exporter).__name__}", p.shutdown) for p in st.export_processors
        ]
    for provider, owned, what in (
        (st.tracer_provider, st.owns_tracer_provider, "spans"),
        (st.meter_provider, st.owns_meter_provider, "metrics"),
        (st.logger_provider, st.owns_logger_provider, "log records"),
    ):
        if provider is None:
            continue
        name = f"{what} ({type(provider).__name__})"
        if owned:
            # The SDK's own atexit handler would run this shutdown again at exit, blocked
            # by the same collector: it is ours to do, within the budget.
            atexit.unregister(provider.shutdown)
            parts.append((name, provider.shutdown))
        else:
            millis = max(1, int(timeout * 1000))
            parts.append((name, functools.partial(provider.force_flush, millis)))
    threads = []
    for name, stop in parts:
        thread = threading.Thread(
            target=_stop_one, args=(name, stop), name="otel-tunix-shutdown", daemon=True
        )
        thread.start()
        threads.append((name, thread))
    deadline = time.monotonic() + timeout
    for _, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [name for name, thread in threads if thread.is_alive()]


def _stop_one(name: str, stop: Callable[[], object]) -> None:
    try:
        stop()
    except Exception:  # an exporter's or provider's own failure: reported, the run ends
        _logger.exception("otel-tunix: shutting down %s failed", name)


def get_metrics_logger() -> MetricsLogger:
    """The MetricsLogger of the current run (an inactive one before ``configure()``)."""
    with _lock:
        if _state is not None:
            return _state.logger
    return MetricsLogger(MetricsLoggerOptions(default_backends=False), rank=0)


def get_meter(name: str | None = None) -> Any:
    """A Meter of the current run's MeterProvider (the global one before ``configure()``).

    Integrations use it so their instruments go wherever otel-tunix's go.
    """
    return current_meter(name)


def current_run() -> RunInfo | None:
    """The :class:`RunInfo` of the current run, or ``None``."""
    run = get_current()
    return run.info if run is not None else None


def last_step_summary() -> StepSummary | None:
    """The latest :class:`~otel_tunix.model.StepSummary` (or ``None``)."""
    run = get_current()
    return run.last_step_summary() if run is not None else None
