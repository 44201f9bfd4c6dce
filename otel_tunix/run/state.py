"""A run's state, and what it reports about itself while it runs and when it ends: the
observable instruments (step counts and rates, dropped steps, span counts) and
``summary.json``."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from otel_tunix.consumers.step_accounting import StepAccountingProcessor
from otel_tunix.logger.instruments import observable
from otel_tunix.logger.metrics_logger import MetricsLogger
from otel_tunix.model.metric_spec import Instrument
from otel_tunix.model.steps import ScopeSession
from otel_tunix.pipeline.export_processor import ExportStats
from otel_tunix.pipeline.step_sinks import Consumers
from otel_tunix.recording import hot_path as _recording
from otel_tunix.recording.current_run import RunInfo
from otel_tunix.run.signal_exports import SignalExportStats
from otel_tunix.settings import attributes as attr
from otel_tunix.settings import tally as _tally
from otel_tunix.settings.config import PerformanceMetricsConfig
from otel_tunix.settings.values import Settings
from otel_tunix.support.linefile import record_write_error, replace_file, write_errors

__all__ = ["RunState", "register_observables", "write_summary"]


@dataclass(slots=True)
class RunState:
    """One run: what ``configure()`` started, as a list of parts (``shutdown()``, the
    SIGTERM handler, ``atexit`` and a forked child walk it), and what its summary and end
    notice report."""

    info: RunInfo
    config: PerformanceMetricsConfig
    settings: Settings
    logger: MetricsLogger
    parts: list[Any] = field(default_factory=list)
    """The run's :class:`~otel_tunix.run.parts.Part` objects, in the order they close."""
    runtime: _recording.Runtime | None = None
    processor: StepAccountingProcessor | None = None
    """The accounting processor: session totals, the latest step summary."""
    consumers: Consumers | None = None
    """The worker's consumers, in order (:mod:`otel_tunix.pipeline.step_sinks`)."""
    offset_ns: int = 0
    meter_provider: Any = None
    logger_provider: Any = None
    """The run's LoggerProvider (alert log records; ``None``: the global one)."""
    datadog: Any = None
    """The run's Datadog client, if any (alerts as Datadog events)."""
    export_stats: dict[str, ExportStats] = field(default_factory=dict)
    sessions: list[ScopeSession] = field(default_factory=list)
    """The per-scope totals, once the steps part has closed."""
    signal_export_stats: dict[str, dict[str, SignalExportStats]] = field(default_factory=dict)
    """Exports of the metrics and log records by signal (``metrics``, ``logs``), then by
    exporter name."""
    slowest: Any = None
    """The step sink that keeps each scope's slowest step, for the end notice."""
    destinations: list[Any] = field(default_factory=list)
    """Where its data goes (the start notice's :class:`~otel_tunix.run.notices.Destination`
    list)."""
    perfetto_left: Path | None = None
    """The spans JSONL whose Perfetto translation did not fit in the shutdown's budget
    (left to ``otel-tunix convert``)."""
    ledger: Any = None
    """The live goodput ledger (:class:`otel_tunix.consumers.live_ledger.LiveLedger`)."""
    profiles: Any = None
    """The run's profile captures (:class:`otel_tunix.metrics.profiling.ProfileCaptures`;
    ``None`` without a run folder)."""
    memory_snapshots: Any = None
    """The run's out-of-memory marks and snapshots
    (:class:`otel_tunix.metrics.memory_snapshots.OomSnapshots`)."""


def register_observables(meter: Any, state: RunState | None) -> None:
    """The run's observable instruments (step counts and rates, dropped steps, span counts,
    records not written), reading ``state``; ``None`` (a disabled run) leaves them nothing
    to report. A later run on the same meter takes them over
    (:func:`~otel_tunix.logger.instruments.observable`).
    """
    counter, gauge = Instrument.COUNTER, Instrument.GAUGE
    instruments = (
        (counter, "tunix.steps", "{step}", "Steps run (sampled or not)"),
        (
            counter,
            "tunix.telemetry.spans",
            "{span}",
            "Spans given to otel-tunix's batch exporters, by result",
        ),
        (
            gauge,
            "tunix.session.steps_per_second",
            "{step}/s",
            "Steps per second from the first to the latest step of a scope",
        ),
        (
            counter,
            "tunix.telemetry.dropped_steps",
            "{step}",
            "Sampled steps otel-tunix could not record",
        ),
        (
            counter,
            "tunix.telemetry.records_not_written",
            "{record}",
            "Records a run file could not take (a full disk), by file name",
        ),
    )
    if state is None or state.runtime is None:
        for kind, name, unit, desc in instruments:
            observable(meter, kind, name, None, unit=unit, description=desc)
        return
    runtime = state.runtime

    def steps(_: CallbackOptions) -> list[Observation]:
        return [
            Observation(s.count, {attr.METRIC_SCOPE: scope})
            for scope, s in list(runtime.scopes.items())
        ]

    def rate(_: CallbackOptions) -> list[Observation]:
        out = []
        for scope, s in list(runtime.scopes.items()):
            active = s.active_ns * 1e-9  # the scope's own time (see ScopeStepCounts)
            if active > 0:
                out.append(Observation(s.count / active, {attr.METRIC_SCOPE: scope}))
        return out

    def dropped(_: CallbackOptions) -> list[Observation]:
        p = runtime.pipeline
        return [
            Observation(p.dropped_steps, {"reason": "queue_full"}),
            Observation(p.failed_steps, {"reason": "processing_error"}),
        ]

    def spans(_: CallbackOptions) -> list[Observation]:
        out = []
        for name, stats in list(state.export_stats.items()):
            out += [
                Observation(stats.exported, {"exporter": name, "result": "exported"}),
                Observation(stats.failed, {"exporter": name, "result": "failed"}),
                Observation(stats.dropped, {"exporter": name, "result": "dropped"}),
            ]
        return out

    def not_written(_: CallbackOptions) -> list[Observation]:
        return [
            Observation(int(str(e["records_lost"])), {"file": Path(f).name})
            for f, e in own_write_errors(state).items()
        ]

    callbacks = (steps, spans, rate, dropped, not_written)
    for (kind, name, unit, desc), callback in zip(instruments, callbacks, strict=True):
        observable(meter, kind, name, callback, unit=unit, description=desc)


def write_summary(
    path: Path,
    st: RunState,
    sessions: list[ScopeSession],
    *,
    complete: bool,
    timeout: float | None = None,
    unfinished: Sequence[str] = (),
) -> None:
    """``summary.json``; ``complete`` is false while exporters are still shutting down
    (spans still queued then count as dropped). ``timeout``: the shutdown's budget in
    seconds; ``unfinished``: the exporters and providers it left behind when that ran out
    (``"shutdown"``; what they held was not sent)."""
    rt = st.runtime
    data = {
        "complete": complete,
        "run_id": st.info.run_id,
        **(st.info.job.header() if st.info.job is not None else {}),
        "resource": dict(st.info.resource.attributes),
        "sampling_rate": st.config.sampling_rate,
        "dropped_steps": rt.pipeline.dropped_steps if rt else 0,
        "failed_steps": rt.pipeline.failed_steps if rt else 0,
        "unprocessed_steps": rt.pipeline.unprocessed_steps if rt else 0,
        "export": {name: stats.to_json() for name, stats in st.export_stats.items()},
        "export_by_signal": {
            signal: {name: stats.to_json() for name, stats in by_name.items()}
            for signal, by_name in st.signal_export_stats.items()
            if by_name
        },
        "scopes": [s.to_json() for s in sessions],
    }
    if st.ledger is not None:
        data["goodput"] = st.ledger.figures()
    if st.profiles is not None:
        data["profiles"] = st.profiles.to_json()
    if st.memory_snapshots is not None:
        data["memory_snapshots"] = st.memory_snapshots.to_json()
    if timeout is not None:
        data["shutdown"] = {"timeout_sec": timeout, "unfinished": list(unfinished)}
    data["write_errors"] = own_write_errors(st)
    # names and values cleaned, secrets redacted, metric names refused, hook calls dropped
    data["safety"] = _tally.this_run()
    lost = losses(data, unfinished)
    if lost:  # "complete" says nothing was lost
        data["complete"] = False
        data["lost"] = lost
    try:
        replace_file(path, json.dumps(data, indent=2, default=str))
    except OSError as exc:  # a full disk: reported once, never raised into the program
        said = ", ".join(f"{n} {what.replace('_', ' ')}" for what, n in lost.items())
        record_write_error(
            path,
            exc,
            1,
            said=f"what the run lost is counted here and in the end notice, not in {path.name}: "
            + (said or "nothing else so far"),
        )


def own_write_errors(st: RunState) -> dict[str, dict[str, object]]:
    """The write errors of the run's own files
    (:func:`otel_tunix.support.linefile.write_errors`)."""
    own = {os.fspath(p) for p in st.info.files.values()}
    if st.config.export_jsonl_path:
        own.add(os.fspath(st.config.export_jsonl_path))
    return {f: e for f, e in write_errors().items() if f in own}


def losses(data: Mapping[str, Any], unfinished: Sequence[str]) -> dict[str, int]:
    """What the run lost, by kind, from the figures of its summary ``data``: records not
    written (``write_errors``), steps dropped or failed, spans an exporter did not send,
    steps the worker never processed, steps and scalars a consumer or backend left behind
    at shutdown never got, parts the shutdown left behind (not the Perfetto translation:
    ``otel-tunix convert`` makes the trace from ``spans.jsonl``). Empty: nothing was lost."""
    out: dict[str, int] = {}
    errors: Mapping[str, Mapping[str, Any]] = data.get("write_errors", {})
    records = sum(int(e.get("records_lost", 0)) for e in errors.values())
    if records:
        out["records_not_written"] = records
    steps = int(data.get("dropped_steps", 0)) + int(data.get("failed_steps", 0))
    if steps:
        out["steps_dropped_or_failed"] = steps
    if unprocessed := int(data.get("unprocessed_steps", 0)):
        out["steps_unprocessed"] = unprocessed
    safety: Mapping[str, Any] = data.get("safety", {})
    for key in ("hook_steps_not_delivered", "hook_scalars_not_delivered"):
        if count := int(safety.get(key, 0)):
            out[key] = count
    export: Mapping[str, Mapping[str, Any]] = data.get("export", {})
    spans = sum(
        int(e.get("spans_dropped", 0)) + int(e.get("spans_failed", 0)) for e in export.values()
    )
    if spans:
        out["spans_not_exported"] = spans
    parts = [u for u in unfinished if u != "perfetto translation"]
    if parts:
        out["parts_unfinished"] = len(parts)
    return out
