"""``configure()`` / ``shutdown()``: one run, assembled from parts (:mod:`otel_tunix.run.parts`).

``configure()`` checks its arguments, makes the run's parts (:mod:`otel_tunix.run.assemble`)
and starts them; ``shutdown()`` (the program's call, ``atexit``, the SIGTERM handler) closes
them in order before one deadline, ``force_flush()`` flushes them, and a forked child tells
each of them that it is one.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

from otel_tunix.consumers.step_accounting import StepSink
from otel_tunix.logger.metrics_logger import MetricsLogger, MetricsLoggerOptions
from otel_tunix.model import resource as _resource
from otel_tunix.model.resource import build_resource, detect_rank
from otel_tunix.model.steps import ScopeSession, StepSummary
from otel_tunix.recording import hot_path as _recording
from otel_tunix.recording.current_run import CurrentRun, RunInfo, get_current, set_current
from otel_tunix.recording.current_run import meter as current_meter
from otel_tunix.run import assemble, folders, notices, signals
from otel_tunix.run import job as job_
from otel_tunix.run import run_config as run_config_
from otel_tunix.run.arguments import RunArguments
from otel_tunix.run.parts import close_parts, flush_parts, parts_in_forked_child, start_parts
from otel_tunix.run.state import RunState, write_summary
from otel_tunix.settings import tally as _tally
from otel_tunix.settings import variables as env
from otel_tunix.settings.config import PerformanceMetricsConfig
from otel_tunix.settings.parsing import ConfigurationError
from otel_tunix.settings.table import DEFAULT_SCOPE
from otel_tunix.settings.values import check_sdk_files, load_settings

_logger = logging.getLogger(__name__)


_lock = threading.RLock()
_state: RunState | None = None
_forked_from_a_run = False  # this process is a forked child of one with a run configured


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
        run_id: ``tunix.run.id`` (else ``OTEL_TUNIX_RUN_ID``, else the job id for a job's
            first attempt and ``<job id>-attempt<n>`` for a later one, else a new id; see
            :mod:`otel_tunix.run.job`).
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
        step_sinks: More :class:`~otel_tunix.consumers.step_accounting.StepSink` objects: each gets
        every
            :class:`~otel_tunix.model.steps.StepSummary` and the session totals.
        clock: What step and component times are read from instead of
            ``time.perf_counter_ns`` (nanoseconds); span times are then the clock's values
            as they are (no offset to the Unix epoch). For deterministic tests.
        id_seed: Draw trace and span ids from ``random.Random(id_seed)`` instead of the
            OS's entropy. For deterministic tests.
        console_interval: Seconds between live lines on stderr (step, loss, tokens/s, step
            time, busy / blocked / idle %; :mod:`otel_tunix.logger.live_line`), ``0`` for none
            (else ``OTEL_TUNIX_CONSOLE_INTERVAL``, default none). Rank 0, with otel-tunix's
            own MetricsLogger.
        run_config: The run's hyperparameters, as ``wandb.config``: written to
            ``config.json`` in the run folder (secret-looking keys' values redacted); the
            scalars whose keys ``OTEL_TUNIX_RESOURCE_CONFIG_KEYS`` names (none by default;
            nested dicts flattened with dots) also on the resource as
            ``tunix.config.<key>``; merged over what :func:`otel_tunix.set_config` kept
            before ``configure()``.

    Returns:
        The :class:`RunInfo` of the run.

    Raises:
        ConfigurationError: a value (argument or environment variable) is not allowed.
    """
    global _state
    with _lock:
        if _state is not None:
            shutdown()
        _tally.start_run()  # summary.json's "safety" counts from here
        settings = load_settings()
        check_sdk_files()
        args = RunArguments(
            service_name=service_name,
            perf=perf,
            output_dir=output_dir,
            run_id=run_id,
            metrics_logger=metrics_logger,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            span_exporters=span_exporters,
            resource_attributes=resource_attributes,
            alerts=alerts,
            system_metrics=system_metrics,
            logger_provider=logger_provider,
            span_processors=span_processors,
            metric_readers=metric_readers,
            step_sinks=step_sinks,
            clock=clock,
            id_seed=id_seed,
            console_interval=console_interval,
            run_config=run_config,
        )
        cfg = args.check(settings)
        rank = detect_rank(settings)
        job, rid, claimed = job_.identify(
            settings,
            run_id=run_id,
            rank=rank,
            resource_attributes=resource_attributes,
            output_dir=output_dir,
            forked=_forked_from_a_run,
        )
        config = run_config_.take_pending(rid, run_config)
        ours = _resource.resource_attributes(
            service_name=service_name,
            run_id=rid,
            rank=rank,
            job=job,
            extra={
                **run_config_.config_attributes(config, settings.resource_config_keys),
                **(resource_attributes or {}),
            },
        )
        resource = build_resource(ours)
        out_dir, files = assemble.run_folder(
            args, settings, job.job_id, rank, config, claimed=claimed, forked=_forked_from_a_run
        )
        if settings.sdk_disabled:
            _recording.set_runtime(None)
            _state = assemble.disabled_run(args, settings, rid, rank, resource, job)
            set_current(CurrentRun(_state.info, _state.logger, cfg.otel_scope or DEFAULT_SCOPE))
            return _state.info
        info = RunInfo(
            rid, out_dir, resource, rank, enabled=bool(cfg.enabled), files=files, job=job
        )
        try:
            state = assemble.assemble(args, settings, info, ours, shutdown)
        except OSError as exc:  # a run file that cannot be made: no space or inodes left
            raise ConfigurationError(
                f"output_dir / {env.OTEL_TUNIX_OUTPUT_DIR}: cannot make {exc.filename} "
                f"({exc.strerror or exc})"
            ) from None
        _state = state
        start_parts(state.parts)
        set_current(
            CurrentRun(
                info,
                state.logger,
                cfg.otel_scope or DEFAULT_SCOPE,
                meter_provider=state.meter_provider,
                logger_provider=state.logger_provider,
                datadog=state.datadog,
                profiles=state.profiles,
                last_step_summary=_last_summary(state),
                add_step_sink=_add_step_sink(state),
                process_steps=_process_steps(state.runtime),
            )
        )
        _register_atexit()
        _logger.info("otel-tunix: run %s, local folder %s", rid, out_dir)
        for kind, url in info.endpoints.items():
            _logger.info("otel-tunix: %s endpoint at %s", kind, url)
        notices.at_configure(info, settings, cfg, state.destinations)
        return info


def _process_steps(runtime: _recording.Runtime | None) -> Callable[[float], bool]:
    """``CurrentRun.process_steps`` of a run (nothing to wait for when it records nothing)."""
    if runtime is None:
        return lambda timeout: True
    return runtime.pipeline.flush


def _last_summary(state: RunState) -> Callable[[], StepSummary | None]:
    processor = state.processor
    return (lambda: processor.last_summary) if processor is not None else (lambda: None)


def _add_step_sink(state: RunState) -> Callable[[StepSink], None]:
    consumers = state.consumers
    return consumers.add if consumers is not None else (lambda sink: None)


def _forget_run_in_child() -> None:
    """A forked child: the parent's run is not its own. It records nothing and writes none
    of the parent's files (its atexit finds no run to finish) unless it calls
    ``configure()`` itself, which then writes a folder of its own (``forked-<pid>`` in the
    run folder). Each part of the run lets go of its copy (:meth:`Part.in_forked_child`)."""
    global _lock, _state, _forked_from_a_run
    _lock = threading.RLock()  # another thread may have held it at the fork
    st = _state
    if st is not None:
        _forked_from_a_run = True
        _state = None
        set_current(None)
        parts_in_forked_child(st.parts)


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
    return flush_parts(st.parts, time.monotonic() + timeout)


def shutdown(timeout: float | None = None) -> list[ScopeSession]:
    """Finish the run: process queued steps, write the session lines and summary, flush.

    Takes at most ``timeout`` seconds (default: ``OTEL_TUNIX_SHUTDOWN_TIMEOUT``, 5 s)
    whatever the collector does: the queued steps and the local files come first, then the
    exporters and providers get what time is left, side by side; those that have not
    finished by then are left behind (their unsent spans count as dropped) and
    ``summary.json`` names them under ``"shutdown"``. Idempotent; registered with
    ``atexit`` and called by the SIGTERM handler. Returns the per-scope session totals.
    """
    try:
        return _shutdown(timeout)
    finally:
        signals.after_shutdown()


def _shutdown(timeout: float | None) -> list[ScopeSession]:
    global _state
    with _lock:
        st = _state
        if st is None:
            return []
        budget = st.settings.shutdown_timeout if timeout is None else max(0.0, timeout)
        deadline = time.monotonic() + budget
        _state = None
        set_current(None)
        unfinished = close_parts(st.parts, deadline)
        sessions = st.sessions
        summary_path = st.info.files.get("summary")
        if summary_path is not None and st.runtime is not None:
            write_summary(
                summary_path, st, sessions, complete=True, timeout=budget, unfinished=unfinished
            )
        _report(st, unfinished, budget)
        folders.drop_if_empty(st.info, sessions)
        notices.at_shutdown(st, sessions)
        return sessions


def _report(st: RunState, unfinished: list[str], budget: float) -> None:
    """Warn of spans not sent and of what the shutdown left behind."""
    # where each went, as the start notice said it (credentials redacted there)
    targets = {d.name: d.target for d in st.destinations if d.signal == "spans" and d.target}
    for name, stats in st.export_stats.items():
        if stats.failed or stats.dropped:
            _logger.warning(
                "otel-tunix: exporter %s%s: %d spans failed and %d were dropped (%s)",
                name,
                f" to {targets[name]}" if name in targets else "",
                stats.failed,
                stats.dropped,
                "the trace file could not be written"
                if name == "perfetto"
                else "collector down or slow, or its TLS certificate not trusted?",
            )
    unfinished = [u for u in unfinished if u != "perfetto translation"]
    if unfinished:
        _logger.warning(
            "otel-tunix: %s had not finished after %g s (OTEL_TUNIX_SHUTDOWN_TIMEOUT); "
            "left behind, what they held is not sent",
            ", ".join(unfinished),
            budget,
        )


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
    """The latest :class:`~otel_tunix.model.steps.StepSummary` (or ``None``)."""
    run = get_current()
    return run.last_step_summary() if run is not None else None
