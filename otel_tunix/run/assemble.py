"""How ``configure()`` makes a run's parts from its arguments and the settings.

Each function makes one group of parts; :func:`assemble` puts them together in the order
they are closed (see :mod:`otel_tunix.run.run_parts`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry import _logs, metrics, trace
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_tunix.consumers.jsonl import StepJsonlWriter
from otel_tunix.consumers.live_ledger import FIRST_STEP, LiveLedger
from otel_tunix.consumers.rl_steps import RLStepSink
from otel_tunix.consumers.sinks import ExportFnSink, MetricsLoggerSink, instrument_sink
from otel_tunix.consumers.step_accounting import StepAccountingProcessor
from otel_tunix.consumers.stragglers import StragglerDetector
from otel_tunix.exporters.datadog import DatadogClient, DatadogMetricExporter, DatadogStepSink
from otel_tunix.logger.live_line import LiveLine
from otel_tunix.logger.metrics_logger import MetricsLogger, MetricsLoggerOptions, metrics_file_name
from otel_tunix.metrics.alerts import AlertEngine
from otel_tunix.metrics.memory_snapshots import OomSnapshots
from otel_tunix.metrics.profiling import ProfileCaptures, ProfileFileTrigger
from otel_tunix.metrics.system import SystemMetricsSampler
from otel_tunix.model.alert_rules import default_rules
from otel_tunix.model.job import JobInfo
from otel_tunix.model.resource import RankInfo
from otel_tunix.pipeline.export_processor import BatchExportProcessor, ExportStats
from otel_tunix.pipeline.span_builder import SpanBuilder, epoch_offset_ns
from otel_tunix.pipeline.step_sinks import Consumers, ProviderSpans, StepSink
from otel_tunix.pipeline.worker import Pipeline
from otel_tunix.recording import hot_path as _recording
from otel_tunix.recording.current_run import RunInfo
from otel_tunix.run import folders, notices, providers
from otel_tunix.run import run_config as run_config_
from otel_tunix.run.arguments import RunArguments
from otel_tunix.run.fork_guard import ForkGuardPart, export_locks
from otel_tunix.run.parts import Part
from otel_tunix.run.paths import checked_dir, checked_file
from otel_tunix.run.perfetto_trace import PERFETTO_AT_SHUTDOWN, perfetto_dir
from otel_tunix.run.run_parts import (
    DatadogPart,
    DetachPart,
    ExporterPart,
    LoggerPart,
    ObservablesPart,
    PerfettoTranslationPart,
    ProfilesPart,
    ProviderPart,
    SamplerPart,
    SignalPart,
    StepsPart,
    StreamedPerfettoPart,
    SummaryPart,
    UserHooksPart,
)
from otel_tunix.run.signal_exports import SignalExportStats, new_signal_stats
from otel_tunix.run.state import RunState
from otel_tunix.settings import variables as env
from otel_tunix.settings.parsing import ConfigurationError
from otel_tunix.settings.table import DEFAULT_SCOPE
from otel_tunix.settings.values import Settings
from otel_tunix.settings.version import __version__
from otel_tunix.support import ids as _ids
from otel_tunix.support.linefile import record_write_error

__all__ = ["Providers", "assemble", "disabled_run", "run_folder"]

_installed: list[object] = []  # providers otel-tunix made global (replaceable by a later run)


def run_folder(
    args: RunArguments,
    settings: Settings,
    job_id: str,
    rank: RankInfo,
    config: dict[str, Any],
    *,
    claimed: Path | None,
    forked: bool,
) -> tuple[Path | None, dict[str, Path]]:
    """The run folder (``None``: none) and the files written in it so far (``config.json``):
    the one ``claimed`` (:func:`otel_tunix.run.job.identify`); a forked child of a run gets
    ``forked-<pid>`` in its parent's, never the parent's files."""
    cfg = args.cfg
    assert cfg is not None
    if settings.sdk_disabled:
        return None, {}
    raw = os.fspath(args.output_dir) if args.output_dir is not None else settings.output_dir
    out_dir: Path | None = claimed
    if not forked or (raw is not None and raw.strip().lower() == "none"):
        pass
    elif raw is None or not raw.strip():  # the parent's job's next folder: forked-<pid> in it
        out_dir = folders.fresh_folder(folders.default_base(job_id), rank.file_suffix)
        out_dir = out_dir / f"forked-{os.getpid()}"
    else:  # the parent's folder: the child goes in forked-<pid> below
        out_dir = Path(raw) / f"forked-{os.getpid()}"
    files: dict[str, Path] = {}
    setting = "output_dir / " + env.OTEL_TUNIX_OUTPUT_DIR
    if out_dir is not None:
        folders.note_made(out_dir)
        checked_dir(out_dir, setting)
        links = folders.planted_links(out_dir)
        if links:
            folders.release(out_dir, rank.file_suffix)
            raise ConfigurationError(
                f"{setting}: the run folder {os.fspath(out_dir)!r} holds symbolic links where "
                f"run files go ({', '.join(links)}); run files are never written through a "
                "link: remove them or give another folder"
            )
        if config:
            files["config"] = out_dir / run_config_.CONFIG_FILE
            try:
                run_config_.write_config(files["config"], config)
            except OSError as exc:  # no space or inodes left, a link where config.json goes
                raise ConfigurationError(
                    f"{setting}: cannot write {files['config']} ({exc.strerror or exc})"
                ) from None
    if cfg.export_jsonl_path:
        checked_file(
            cfg.export_jsonl_path, "export_jsonl_path / " + env.OTEL_TUNIX_EXPORT_JSONL_PATH
        )
    return out_dir, files


def disabled_run(
    args: RunArguments,
    settings: Settings,
    run_id: str,
    rank: RankInfo,
    resource: Resource,
    job: JobInfo | None = None,
) -> RunState:
    """A run under ``OTEL_SDK_DISABLED``: an inactive logger, nothing else."""
    assert args.cfg is not None
    logger = _make_logger(args, None, run_id, rank, None, enabled=False, settings=settings)
    info = RunInfo(run_id, None, resource, rank, enabled=False, job=job)
    state = RunState(info, args.cfg, settings, logger)
    state.parts = [LoggerPart(logger, owned=args.owns_logger)]
    return state


@dataclass(slots=True)
class Providers:
    """The run's tracer, meter and logger providers (joined or built), with what they
    serve."""

    tracer: Any
    owns_tracer: bool
    meter: Any
    owns_meter: bool
    span_resource: Resource
    readers: list[Any] = field(default_factory=list)
    """The readers of a MeterProvider otel-tunix built."""
    exporters: list[BatchExportProcessor] = field(default_factory=list)
    """The export processors of a TracerProvider otel-tunix built (``OTEL_TRACES_EXPORTER``)."""
    endpoints: dict[str, str] = field(default_factory=dict)
    export_stats: dict[str, ExportStats] = field(default_factory=dict)
    signal_stats: dict[str, dict[str, SignalExportStats]] = field(default_factory=new_signal_stats)
    """Metric and log exports, counted by signal, then exporter name (signal_exports.py)."""
    datadog: Any = None
    logger: Any = None
    owns_logger: bool = False


def _providers(
    args: RunArguments, settings: Settings, resource: Resource, ours: dict[str, Any], rid: str
) -> Providers:
    export_stats: dict[str, ExportStats] = {}
    signal_stats = new_signal_stats()
    datadog = _datadog_client(settings)
    endpoints: dict[str, str] = {}
    readers: list[Any] = []
    built: list[BatchExportProcessor] = []
    series_labels = (
        {"service": str(resource.attributes.get("service.name", "")), "run_id": rid}
        if settings.prometheus_run_labels
        else None
    )

    def build_meter_provider() -> MeterProvider:
        readers.extend(
            [
                *args.metric_readers,
                *providers.metric_readers(
                    settings, endpoints, series_labels, signal_stats["metrics"]
                ),
                *_datadog_readers(datadog, settings),
            ]
        )
        return providers.build_meter_provider(resource, readers)

    tp, owns_tp = _provider(
        args.tracer_provider,
        trace.get_tracer_provider(),
        TracerProvider,
        lambda: providers.build_tracer_provider(resource, export_stats, settings, built),
    )
    mp, owns_mp = _provider(
        args.meter_provider, metrics.get_meter_provider(), MeterProvider, build_meter_provider
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
    return Providers(
        tp,
        owns_tp,
        mp,
        owns_mp,
        span_resource,
        readers,
        built,
        endpoints,
        export_stats,
        signal_stats,
        datadog,
    )


def _provider(given: Any, global_: Any, sdk_type: type, build: Any) -> tuple[Any, bool]:
    """The provider to use and whether otel-tunix owns it: the one given, else the
    application's global SDK provider (joined), else a new one (built from ``OTEL_*``)."""
    if given is not None:
        return given, False
    if isinstance(global_, sdk_type) and global_ not in _installed:
        return global_, False
    return build(), True


def _logger_provider(
    given: Any,
    resource: Resource,
    settings: Settings,
    counts: dict[str, SignalExportStats] | None = None,
) -> tuple[Any, bool]:
    """The LoggerProvider for alert records: the one given, else the application's global
    SDK one, else one built from ``OTEL_LOGS_EXPORTER`` (``None``: records stay in process)."""
    if given is not None:
        return given, False
    provider = _logs.get_logger_provider()
    if isinstance(provider, LoggerProvider):
        return provider, False
    built = providers.build_logger_provider(resource, settings, counts)
    return built, built is not None


def assemble(
    args: RunArguments,
    settings: Settings,
    info: RunInfo,
    ours: dict[str, Any],
    shutdown: Callable[[], object],
) -> RunState:
    """Make every part of an enabled run (nothing is started yet but the providers and the
    MetricsLogger's files); ``shutdown`` is what the SIGTERM handler calls."""
    cfg, rid, rank, out_dir, files = args.cfg, info.run_id, info.rank, info.output_dir, info.files
    assert cfg is not None
    prov = _providers(args, settings, info.resource, ours, rid)
    tp, mp = prov.tracer, prov.meter
    service = str(info.resource.attributes.get("service.name", ""))
    logger = _make_logger(
        args,
        out_dir,
        rid,
        rank,
        mp,
        enabled=True,
        settings=settings,
        job=info.job,
        service=service,
    )
    if out_dir is not None and logger.backends:
        files["metrics"] = out_dir / metrics_file_name(rank.rank)
    processor, consumers, slowest = _step_consumers(args, info, prov, logger, settings)
    if out_dir is not None:
        files["summary"] = out_dir / f"summary{rank.file_suffix}.json"
    prov.logger, prov.owns_logger = _logger_provider(
        args.logger_provider, info.resource, settings, prov.signal_stats["logs"]
    )
    alerts_path = out_dir / f"alerts{rank.file_suffix}.jsonl" if out_dir else None
    alerts = settings.alerts if args.alerts is None else args.alerts
    if alerts is True:  # the defaults, with the settings' bounds
        alerts = default_rules(max_policy_lag=settings.max_policy_lag)
    engine = _alert_engine(alerts, logger, prov.logger, mp, prov.datadog, alerts_path)
    if args.line_interval is not None and rank.rank == 0 and args.owns_logger:
        logger.backends.append(LiveLine(args.line_interval))
    if settings.straggler_window and rank.world_size > 1:
        consumers.add(
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
    info.endpoints.update(prov.endpoints)
    state = RunState(
        info,
        cfg,
        settings,
        logger,
        processor=processor,
        consumers=consumers,
        offset_ns=0 if args.clock is not None else epoch_offset_ns(),
        export_stats=prov.export_stats,
        signal_export_stats=prov.signal_stats,
        slowest=slowest,
        meter_provider=mp,
        logger_provider=prov.logger,
        datadog=prov.datadog,
    )
    state.ledger = _ledger(cfg, logger, own_clock=args.clock is not None)
    if state.ledger is not None:
        consumers.add(state.ledger)
    exporters, trace_dir, perfetto = _span_exporters(args, settings, prov, out_dir)
    for consumer in (*prov.exporters, *exporters):
        consumers.add(consumer)
    for proc in args.span_processors:  # other code's spans; otel-tunix's: as consumers
        tp.add_span_processor(proc)
        if isinstance(proc, StepSink):
            consumers.add(proc)
    consumers.add(ProviderSpans(tp, args.span_processors, consumers))  # the provider's others
    state.runtime = _runtime(args, settings, info, prov, consumers, state.offset_ns)
    if state.runtime is not None:
        state.memory_snapshots = state.runtime.error_watch = OomSnapshots(out_dir)
    if out_dir is not None and state.runtime is not None:
        state.profiles = ProfileCaptures(
            state.runtime,
            out_dir,
            on_alert=settings.profile_on_alert,
            steps=settings.profile_steps,
            max_captures=settings.profile_max_captures,
            cooldown_steps=settings.profile_cooldown_steps,
            framework=None if settings.profiler == "auto" else settings.profiler,
        )
        if engine is not None:
            engine.profiles = state.profiles
        consumers.add(ProfileFileTrigger(state.profiles, out_dir, rank.file_suffix))
    meter = mp.get_meter(cfg.otel_scope, __version__)

    parts: list[Part] = [
        SignalPart(shutdown, settings.shutdown_timeout),
        ForkGuardPart(export_locks(tp, mp, prov.logger)),
    ]
    if args.system_interval is not None:
        gpus = rank.local_rank in (None, 0)
        parts.append(
            SamplerPart(SystemMetricsSampler(mp, interval_sec=args.system_interval, gpus=gpus))
        )
    if state.profiles is not None:
        parts.append(ProfilesPart(state.profiles))
    parts.append(StepsPart(state, state.runtime, clock=args.clock, id_seed=args.id_seed))
    parts.append(LoggerPart(logger, owned=args.owns_logger, alerts=engine))
    if "summary" in files:
        parts.append(SummaryPart(state, files["summary"]))
    spans_file = files.get("spans")
    if trace_dir == PERFETTO_AT_SHUTDOWN and spans_file is not None:
        parts.append(PerfettoTranslationPart(state, spans_file, rank))
    parts.append(UserHooksPart(state, logger))
    if not prov.owns_tracer:  # ours in an application's provider: close them
        parts += [ExporterPart(p) for p in exporters]
    parts += [
        ProviderPart(provider, owned=owned, what=what)
        for provider, owned, what in (
            (tp, prov.owns_tracer, "spans"),
            (mp, prov.owns_meter, "metrics"),
            (prov.logger, prov.owns_logger, "log records"),
        )
        if provider is not None
    ]
    parts.append(DetachPart(tp, (*exporters, *args.span_processors)))
    parts.append(ObservablesPart(meter, state))
    if prov.datadog is not None:
        parts.append(DatadogPart(prov.datadog))
    if perfetto is not None:
        parts.append(StreamedPerfettoPart(state, perfetto))
    state.parts = parts
    state.destinations = notices.destinations(
        settings,
        output_dir=out_dir,
        jsonl_path=cfg.export_jsonl_path,
        own_tracer_provider=prov.owns_tracer,
        own_meter_provider=prov.owns_meter,
        endpoints=prov.endpoints,
        span_exporters=args.span_exporters,
        perfetto=str(trace_dir) if isinstance(trace_dir, Path) else None,
        datadog=prov.datadog,
    )
    return state


def _step_consumers(
    args: RunArguments, info: RunInfo, prov: Providers, logger: MetricsLogger, settings: Settings
) -> tuple[StepAccountingProcessor, Consumers, Any]:
    """The worker's consumers, first the accounting processor and the sinks (the instruments,
    the MetricsLogger, the JSONL files, an export function, DogStatsD, the application's
    sinks, the slowest steps); returns the accounting processor, the list, and the sink that
    keeps the slowest steps (for the end notice)."""
    cfg, out_dir, files, rank = args.cfg, info.output_dir, info.files, info.rank
    assert cfg is not None
    processor = StepAccountingProcessor()
    consumers = Consumers((processor,))
    header = {
        "run_id": info.run_id,
        "start_ns": time.time_ns(),
        "sampling_rate": cfg.sampling_rate,
        "resource": dict(prov.span_resource.attributes),
        **(info.job.header() if info.job is not None else {}),
    }
    instruments = None
    # A provider otel-tunix built with no reader (no metrics exporter configured): every
    # point recorded into it would cost ~4 us for nothing.
    if not prov.owns_meter or prov.readers:
        instruments = instrument_sink(
            prov.meter,
            cfg.otel_scope or DEFAULT_SCOPE,
            __version__,
            readers=prov.readers if prov.owns_meter else None,
            resource=info.resource,
            fast=settings.metrics_fast_path,
        )
        consumers.add(instruments)
    consumers.add(MetricsLoggerSink(logger))
    consumers.add(RLStepSink(logger))
    if out_dir is not None:
        files["spans"] = out_dir / f"spans{rank.file_suffix}.jsonl"
        consumers.add(StepJsonlWriter(files["spans"], header))
    if cfg.export_jsonl_path:
        consumers.add(StepJsonlWriter(cfg.export_jsonl_path, header))
    if args.export_fn is not None:
        consumers.add(ExportFnSink(args.export_fn, instruments=instruments, logger=logger))
    if prov.datadog is not None:
        consumers.add(DatadogStepSink(prov.datadog, resource=info.resource))
    for sink in args.step_sinks:
        consumers.add(sink)
    slowest = notices.SlowestSteps()
    consumers.add(slowest)
    return processor, consumers, slowest


def _ledger(cfg: Any, logger: MetricsLogger, *, own_clock: bool) -> LiveLedger | None:
    """The live goodput ledger (:mod:`otel_tunix.consumers.live_ledger`), one of the worker's
    consumers (``None`` for a run that records nothing). A run on a clock of its own
    (``clock=``) has no process start on that clock: its wall time starts at its first
    step."""
    if not cfg.enabled:
        return None
    start = FIRST_STEP if own_clock else None
    return LiveLedger(logger if logger.active else None, start_ns=start)


def _span_exporters(
    args: RunArguments, settings: Settings, prov: Providers, out_dir: Path | None
) -> tuple[list[BatchExportProcessor], Path | str | None, Any]:
    """otel-tunix's batch processors for the ``span_exporters`` given and the streamed
    Perfetto trace, added to the tracer provider (other code's spans; the steps reach them
    as consumers); where the Perfetto trace goes (a folder,
    :data:`PERFETTO_AT_SHUTDOWN`, or ``None``); and its exporter when it is streamed."""
    cfg, tp = args.cfg, prov.tracer
    assert cfg is not None
    out: list[BatchExportProcessor] = []
    for exporter in args.span_exporters:
        stats = prov.export_stats.setdefault(type(exporter).__name__, ExportStats())
        out.append(BatchExportProcessor(exporter, stats, settings=settings))
        tp.add_span_processor(out[-1])
    trace_dir = perfetto_dir(cfg, out_dir, settings)
    if not isinstance(trace_dir, Path):
        return out, trace_dir, None
    from otel_tunix.exporters.perfetto import PerfettoSpanExporter

    perfetto = PerfettoSpanExporter(directory=trace_dir)
    try:  # the file exists from the run's start: a kill early still leaves one
        perfetto.open_file(prov.span_resource)
    except OSError as exc:  # said in words; the first export tries again
        record_write_error(trace_dir, exc, 0)
    stats = prov.export_stats.setdefault("perfetto", ExportStats())
    # A local file: written as often as the steps are processed, so a hard kill loses
    # about OTEL_TUNIX_PROCESS_INTERVAL_MS of it (not OTEL_BSP_SCHEDULE_DELAY).
    every_ms = max(1, round(cfg.process_interval_ms or 250.0))
    out.append(
        BatchExportProcessor(perfetto, stats, schedule_delay_millis=every_ms, settings=settings)
    )
    tp.add_span_processor(out[-1])
    return out, trace_dir, perfetto


def _runtime(
    args: RunArguments,
    settings: Settings,
    info: RunInfo,
    prov: Providers,
    consumers: Consumers,
    offset_ns: int,
) -> _recording.Runtime | None:
    """The hot path's runtime and its pipeline (``None`` when the run records nothing)."""
    cfg, rank = args.cfg, info.rank
    assert cfg is not None
    if not cfg.enabled:
        return None
    builder = SpanBuilder(
        consumers,
        prov.span_resource,
        InstrumentationScope(cfg.otel_scope or DEFAULT_SCOPE, __version__),
        offset=offset_ns,
    )
    pipeline = Pipeline(
        builder,
        after_batch=consumers.flush,
        finish=builder.finish,
        interval_sec=(cfg.process_interval_ms or 250.0) / 1e3,
    )
    if info.job is not None:  # a later attempt's first step links the previous one
        builder.first_link = info.job.link()
    job = settings.job_traces and rank.world_size > 1
    attempt = info.job.attempt if info.job is not None else 1
    return _recording.Runtime(
        cfg.sampling_rate or 1,
        cfg.components,
        pipeline,
        job_ids=_ids.JobStepIds(info.run_id, attempt) if job else None,
        job_root=job and rank.rank == 0,
    )


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
    args: RunArguments,
    out_dir: Path | None,
    run_id: str,
    rank: RankInfo,
    meter_provider: Any,
    *,
    enabled: bool,
    settings: Settings,
    job: JobInfo | None = None,
    service: str = "",
) -> MetricsLogger:
    given = args.metrics_logger
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
        opts,
        run_id=run_id,
        rank=rank.rank,
        meter_provider=meter_provider,
        settings=settings,
        run_identity={  # the metrics file's header (plot legends name the service)
            **(job.header() if job is not None else {}),
            **({"service": service} if service else {}),
        },
    )
