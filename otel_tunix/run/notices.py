"""What a run says on stderr: where its data goes (at ``configure()``) and where it went,
with what to run next (at ``shutdown()``).

A few lines each, printed by rank 0 only and never when ``OTEL_TUNIX_QUIET=true``. The text
is built from plain values (:func:`start_notice`, :func:`end_notice`) so that what it says
can be checked against what the run did.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_tunix.consumers.step_accounting import StepSink
from otel_tunix.model.job import JobInfo
from otel_tunix.model.steps import ScopeSession, StepSummary
from otel_tunix.pipeline.export_processor import ExportStats
from otel_tunix.recording.current_run import RunInfo
from otel_tunix.run.perfetto_trace import convert_hint
from otel_tunix.run.signal_exports import failures
from otel_tunix.run.state import RunState, own_write_errors
from otel_tunix.settings import attributes as attr
from otel_tunix.settings import tally as _tally
from otel_tunix.settings.config import PerformanceMetricsConfig
from otel_tunix.settings.redact import redact_url
from otel_tunix.settings.values import Settings

__all__ = [
    "Destination",
    "SlowestSteps",
    "at_configure",
    "at_shutdown",
    "destinations",
    "emit",
    "end_notice",
    "otlp_endpoint",
    "start_notice",
]

_OTLP_DEFAULT = {"grpc": "http://localhost:4317", "http/protobuf": "http://localhost:4318"}


@dataclass(frozen=True, slots=True)
class Destination:
    """One place the run's data goes: ``signal`` (``spans``, ``metrics``, ``files``...),
    ``name`` (``otlp``, ``prometheus``, ...) and where (``target``: URL, address, path)."""

    signal: str
    name: str
    target: str = ""


def otlp_endpoint(settings: Settings, signal: str) -> str:
    """The endpoint the OTLP exporter of ``signal`` sends to, as the exporter resolves it:
    the signal's own variable, else the shared one (with ``/v1/<signal>`` for HTTP), else
    the protocol's default on localhost."""
    protocol = settings.otlp_protocol_of(signal)
    own: str | None = getattr(settings, f"otlp_{signal}_endpoint")
    if own:
        return own
    base = settings.otlp_endpoint or _OTLP_DEFAULT.get(protocol, _OTLP_DEFAULT["grpc"])
    if protocol == "http/protobuf":
        return f"{base.rstrip('/')}/v1/{signal}"
    return base


def _described(settings: Settings, signal: str, name: str, endpoints: Mapping[str, str]) -> str:
    if name == "otlp":  # an endpoint's user info and query can hold credentials
        return (
            f"{redact_url(otlp_endpoint(settings, signal))} ({settings.otlp_protocol_of(signal)})"
        )
    return redact_url(endpoints.get(name, ""))


def destinations(
    settings: Settings,
    *,
    output_dir: Path | None,
    jsonl_path: str | os.PathLike[str] | None,
    own_tracer_provider: bool,
    own_meter_provider: bool,
    endpoints: Mapping[str, str],
    span_exporters: Sequence[object] = (),
    perfetto: str | None = None,
    datadog: Any = None,
) -> list[Destination]:
    """Every destination of a run, from its settings and what ``configure()`` built."""
    out: list[Destination] = []
    if output_dir is not None:
        out.append(Destination("files", "run folder", str(output_dir)))
    if jsonl_path:
        out.append(Destination("spans", "jsonl", str(jsonl_path)))
    if own_tracer_provider:
        for name in settings.exporters("traces"):
            out.append(Destination("spans", name, _described(settings, "traces", name, endpoints)))
        if not settings.exporters("traces") and not span_exporters:
            out.append(
                Destination(
                    "spans",
                    "no exporter",
                    "(OTEL_EXPORTER_OTLP_ENDPOINT sends them to a collector)",
                )
            )
    else:
        out.append(Destination("spans", "the application's TracerProvider"))
    for exporter in span_exporters:
        out.append(Destination("spans", type(exporter).__name__))
    if perfetto:
        out.append(Destination("spans", "perfetto", perfetto))
    if own_meter_provider:
        for name in settings.exporters("metrics"):
            if name != "datadog":
                out.append(
                    Destination("metrics", name, _described(settings, "metrics", name, endpoints))
                )
    else:
        out.append(Destination("metrics", "the application's MeterProvider"))
    if datadog is not None:
        statsd = getattr(datadog, "statsd", None)
        where = getattr(statsd, "socket_path", None) or (
            f"{getattr(statsd, 'host', '?')}:{getattr(statsd, 'port', '?')}"
        )
        out.append(Destination("metrics", "datadog", f"DogStatsD {where}"))
    for name in settings.exporters("logs"):
        out.append(Destination("alerts", name, _described(settings, "logs", name, endpoints)))
    return out


def start_notice(
    run_id: str,
    *,
    service_name: str,
    rank: int | None,
    world_size: int | None,
    sampling_rate: int,
    components: Sequence[str] | None,
    dests: Sequence[Destination],
    job: JobInfo | None = None,
) -> str:
    """The lines printed at ``configure()``."""
    who = f"service {service_name}"
    if world_size is not None and world_size > 1:
        who += f", rank {rank if rank is not None else 0} of {world_size}"
    lines = [f"otel-tunix: run {run_id} ({who})"]
    if job is not None and (job.job_id != run_id or job.attempt > 1):
        lines.append(_job_line(job))
    if not dests:
        lines.append("  nowhere: no run folder and no exporter (spans are counted only)")
    for d in dests:
        label = f"{d.signal} -> {d.name}"
        lines.append(f"  {label:<24} {d.target}".rstrip())
    every = "every step" if sampling_rate == 1 else f"one step in {sampling_rate}"
    which = f"components {', '.join(components)}" if components else "all components"
    lines.append(f"  recording {every} (sampling_rate={sampling_rate}), {which}")
    lines.append("  (OTEL_TUNIX_QUIET=true silences these notes)")
    return "\n".join(lines)


def _job_line(job: JobInfo) -> str:
    """Which attempt of which job the run is, and what its first step span links."""
    line = f"  job {job.job_id}, attempt {job.attempt} (from {job.attempt_from})"
    if job.previous is not None:
        line += f", after attempt {job.previous.attempt}"
    prev = job.previous
    if prev is None:
        return line
    if prev.step is not None:
        return f"{line}; linking its step {prev.step}"
    return f"{line}; linking it by derived ids (no local record of it)"


class SlowestSteps(StepSink):
    """Remembers the slowest sampled step of each scope, with its trace id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.slowest: dict[str, StepSummary] = {}

    def on_step(self, summary: StepSummary) -> None:
        """Keep ``summary`` if it is its scope's slowest so far."""
        best = self.slowest.get(summary.scope)
        if best is None or summary.step_time_sec > best.step_time_sec:
            with self._lock:
                self.slowest[summary.scope] = summary


def _trace_hex(trace_id: Any) -> str:
    return f"{trace_id:032x}" if isinstance(trace_id, int) else str(trace_id)


def _where(attributes: Mapping[str, Any]) -> str:
    """``; evaluation 1, batch 3, after train step 199`` for an evaluation step that says
    so in its ``tunix.eval.*`` attributes, else nothing."""
    parts = []
    if attr.EVAL_ROUND in attributes:
        parts.append(f"evaluation {attributes[attr.EVAL_ROUND]}")
    if attr.EVAL_BATCH in attributes:
        parts.append(f"batch {attributes[attr.EVAL_BATCH]}")
    if attr.EVAL_AFTER_STEP in attributes:
        parts.append(f"after train step {attributes[attr.EVAL_AFTER_STEP]}")
    return f"; {', '.join(parts)}" if parts else ""


def end_notice(
    run_id: str,
    sessions: Sequence[ScopeSession],
    *,
    output_dir: Path | None,
    files: Mapping[str, Path],
    dropped_steps: int,
    failed_steps: int,
    export_stats: Mapping[str, ExportStats],
    slowest: Mapping[str, StepSummary],
    perfetto_left: str | None = None,
    safety: Mapping[str, int] | None = None,
    signal_failures: Sequence[str] = (),
    cli_installed: bool = True,
    write_errors: Mapping[str, Mapping[str, object]] | None = None,
    cli: str = "otel-tunix",
    trace_ids: bool = True,
) -> str:
    """The lines printed at ``shutdown()``. ``perfetto_left``: the command that makes the
    Perfetto trace that did not fit in the shutdown's budget; ``safety``: what was cleaned,
    redacted or refused (``summary.json``'s ``safety``); ``signal_failures``: one phrase per
    metric or log exporter that failed exports; ``cli_installed``: whether ``otel-tunix
    summary`` can run here (it needs the ``cli`` extra); ``write_errors``: per file of the
    run, the error and the records lost (``summary.json`` too, when it could not be
    written: then this notice is where the counts are); ``cli``: how to run ``otel-tunix``
    here (:func:`cli_command`); ``trace_ids``: whether the spans went where a trace id finds
    them (a trace exporter or the application's provider), else the slowest steps are named
    without one."""
    scopes = ", ".join(f"{s.scope} {s.steps} steps ({s.sampled_steps} recorded)" for s in sessions)
    lines = [f"otel-tunix: run {run_id} finished: {scopes or 'no steps'}"]
    problems = []
    if dropped_steps:
        problems.append(f"{dropped_steps} steps dropped (queue full)")
    if failed_steps:
        problems.append(f"{failed_steps} steps failed in processing")
    for name, st in export_stats.items():
        if st.failed or st.dropped:
            problems.append(f"{name}: {st.failed} spans failed, {st.dropped} dropped")
    problems.extend(signal_failures)
    for file, error in sorted((write_errors or {}).items()):
        if file.endswith(".json"):
            problems.append(f"{file} not written ({error.get('error')})")
        else:
            problems.append(
                f"{file}: {error.get('records_lost')} records not written ({error.get('error')})"
            )
    lines.append("  " + ("; ".join(problems) if problems else "nothing dropped or failed"))
    if safety:
        said = ", ".join(f"{n} {what.replace('_', ' ')}" for what, n in sorted(safety.items()))
        lines.append(f"  {said} (see summary.json)")
    if output_dir is not None and any(s.sampled_steps for s in sessions):
        needs = "" if cli_installed else "   (needs pip install 'otel-tunix[cli]')"
        lines.append(f"  next: {cli} summary {output_dir}{needs}")
    trace = files.get("perfetto")
    if trace is not None:
        lines.append(f"        open {trace} in https://ui.perfetto.dev")
    elif perfetto_left is not None:
        lines.append(f"  the Perfetto trace did not fit in the shutdown's time: {perfetto_left}")
    for scope, s in sorted(slowest.items()):
        lines.append(
            f"  slowest {scope} step: {s.step} ({s.step_time_sec * 1e3:.1f} ms"
            f"{_where(s.attributes)})"
            + (f", trace id {_trace_hex(s.trace_id)}" if trace_ids else "")
        )
    return "\n".join(lines)


_NO_TRACE_IDS = frozenset({"jsonl", "no exporter", "perfetto"})
"""Span destinations of :func:`destinations` where nobody looks a trace id up."""


def cli_command() -> str:
    """How to run ``otel-tunix`` from the working folder: its name when the one on ``PATH``
    is this environment's, else this environment's script (``.venv/bin/otel-tunix`` after
    ``make demo``, relative to the working folder when it is under it), else ``python -m
    otel_tunix.cli`` with this interpreter."""
    script = Path(sys.executable).parent / "otel-tunix"
    on_path = shutil.which("otel-tunix")
    try:
        if on_path is not None and script.is_file() and os.path.samefile(on_path, script):
            return "otel-tunix"
    except OSError:
        pass
    if script.is_file():
        try:
            return str(script.absolute().relative_to(Path.cwd()))
        except (ValueError, OSError):
            return str(script)
    return "otel-tunix" if on_path else f"{sys.executable} -m otel_tunix.cli"


def emit(text: str, settings: Settings, rank: int | None) -> None:
    """Print ``text`` on stderr: rank 0 only, never with ``OTEL_TUNIX_QUIET=true``."""
    if settings.quiet or (rank or 0) != 0:
        return
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # a closed or broken stderr: the notes are not worth a crash
        pass


def at_configure(
    info: RunInfo, settings: Settings, cfg: PerformanceMetricsConfig, dests: list[Destination]
) -> None:
    """Print the start notice of the run ``info``."""
    text = start_notice(
        info.run_id,
        service_name=str(info.resource.attributes.get("service.name", "")),
        rank=info.rank.rank,
        world_size=info.rank.world_size,
        sampling_rate=cfg.sampling_rate or 1,
        components=cfg.components,
        dests=dests,
        job=info.job,
    )
    emit(text, settings, info.rank.rank)


def at_shutdown(st: RunState, sessions: Sequence[ScopeSession]) -> None:
    """Print the end notice of the run ``st`` (a run that recorded nothing says nothing)."""
    rt = st.runtime
    if rt is None:
        return
    slowest = st.slowest.slowest if isinstance(st.slowest, SlowestSteps) else {}
    text = end_notice(
        st.info.run_id,
        sessions,
        output_dir=st.info.output_dir,
        files=st.info.files,
        dropped_steps=rt.pipeline.dropped_steps,
        failed_steps=rt.pipeline.failed_steps,
        export_stats=st.export_stats,
        slowest=slowest,
        perfetto_left=None
        if st.perfetto_left is None
        else convert_hint(st.perfetto_left, st.info.rank),
        safety=_tally.this_run(),
        signal_failures=failures(st.signal_export_stats),
        cli_installed=importlib.util.find_spec("rich") is not None,
        write_errors=own_write_errors(st),
        cli=cli_command(),
        trace_ids=any(d.signal == "spans" and d.name not in _NO_TRACE_IDS for d in st.destinations),
    )
    emit(text, st.settings, st.info.rank.rank)
