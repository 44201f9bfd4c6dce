"""The parts a run is made of (see :mod:`otel_tunix.run.parts` for the interface).

In the order ``configure()`` lists them, which is the order they are closed in: the SIGTERM
handler, the system sampler, the steps (recording, pipeline, accounting processor and its
sinks: the JSONL files, the straggler exchange, ...), the MetricsLogger (its files, the alert
engine, the live line), the first ``summary.json``, then side by side the Perfetto
translation, the exporters and the providers (OTLP, Prometheus, ...), and last what only lets
go of the providers (span processors, observable callbacks, DogStatsD).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from otel_tunix.consumers import live_ledger as goodput
from otel_tunix.logger.metrics_logger import MetricsLogger
from otel_tunix.model.resource import RankInfo
from otel_tunix.pipeline.export_processor import BatchExportProcessor
from otel_tunix.pipeline.hooks import count_left_behind
from otel_tunix.recording import hot_path as _recording
from otel_tunix.recording.records import take_unsampled
from otel_tunix.run import signals
from otel_tunix.run.parts import Part, left
from otel_tunix.run.perfetto_trace import perfetto_from_jsonl
from otel_tunix.run.state import RunState, register_observables, write_summary
from otel_tunix.support import ids as _ids
from otel_tunix.support.shortcuts import remove_span_processors, silence_periodic_readers

__all__ = [
    "DatadogPart",
    "DetachPart",
    "ExporterPart",
    "LoggerPart",
    "ObservablesPart",
    "PerfettoTranslationPart",
    "ProviderPart",
    "SamplerPart",
    "SignalPart",
    "StepsPart",
    "StreamedPerfettoPart",
    "SummaryPart",
    "UserHooksPart",
]


class SignalPart(Part):
    """The SIGTERM handler (:mod:`otel_tunix.run.signals`): set at the start, given back
    first when the run ends."""

    name = "SIGTERM handler"

    def __init__(self, shutdown: Callable[[], object], budget: float) -> None:
        self._shutdown = shutdown
        self._budget = budget

    def start(self) -> None:
        signals.install(self._shutdown, self._budget)

    def close(self, deadline: float) -> bool:
        signals.uninstall()
        return True


class SamplerPart(Part):
    """The GPU / process / host sampler (:mod:`otel_tunix.metrics.system`)."""

    name = "system metrics"

    def __init__(self, sampler: Any) -> None:
        self._sampler = sampler

    def start(self) -> None:
        self._sampler.start()

    def close(self, deadline: float) -> bool:
        self._sampler.stop()
        return True


class StepsPart(Part):
    """The steps: recording (the hot path's runtime, clock and ids), the pipeline that
    processes them and the accounting processor with its sinks (``spans.jsonl``, the
    instruments, the MetricsLogger's ``perf/...`` scalars, the straggler exchange, ...).
    Closing processes every queued step and writes the session totals."""

    name = "steps"

    def __init__(
        self,
        state: RunState,
        runtime: _recording.Runtime | None,
        *,
        clock: Callable[[], int] | None = None,
        id_seed: int | None = None,
    ) -> None:
        self._state = state
        self._runtime = runtime
        self._clock = clock
        self._id_seed = id_seed

    def start(self) -> None:
        _recording.set_clock(self._clock)
        _ids.seed(self._id_seed)
        _recording.set_runtime(self._runtime)

    def flush(self, deadline: float) -> bool:
        if self._runtime is None:
            return True
        ok = self._runtime.pipeline.flush(left(deadline))
        if self._state.consumers is not None:  # users' consumers, on threads of their own
            ok = self._state.consumers.flush_hooks(left(deadline)) and ok
        return ok

    def close(self, deadline: float) -> bool:
        _recording.set_runtime(None)
        _recording.set_clock(None)
        _ids.seed(None)
        st, rt = self._state, self._runtime
        if rt is None or st.processor is None or st.consumers is None:
            return True
        rt.pipeline.close(left(deadline))
        counts = {
            scope: (
                s.count,
                s.first_start_ns + st.offset_ns,
                s.last_end_ns + st.offset_ns,
                s.active_ns,
            )
            for scope, s in rt.scopes.items()
        }
        # the badput time of the steps not sampled after the last sampled one: the scope
        # of the latest of them
        rest = take_unsampled()
        unsampled = {}
        if rest and rt.unsampled_scope is not None:
            unsampled[rt.unsampled_scope] = rest
        st.sessions = st.processor.sessions(counts, unsampled)
        # users' consumers start closing on their threads; UserHooksPart waits for them
        st.consumers.finish(st.sessions, 0.0)
        if st.ledger is not None:  # every step processed: the ledger's last figures
            st.ledger.finish(unsampled)
        return True

    def in_forked_child(self) -> None:
        _recording.set_runtime(None)
        _recording.set_clock(None)


class LoggerPart(Part):
    """The MetricsLogger and its backends (``metrics.jsonl``, the alert engine, the live
    line). An application's own logger is left open; only the alert engine otel-tunix
    added to it is taken off and closed."""

    name = "MetricsLogger"

    def __init__(self, logger: MetricsLogger, *, owned: bool, alerts: Any = None) -> None:
        self._logger = logger
        self._owned = owned
        self._alerts = alerts

    def flush(self, deadline: float) -> bool:
        return self._logger.flush(left(deadline))  # users' backends, on threads of their own

    def close(self, deadline: float) -> bool:
        if self._owned:
            # what is queued reaches the backends first; users' backends then start
            # closing, and UserHooksPart waits for them
            return not self._logger.close(0.0, drain_timeout=left(deadline))
        if self._alerts is not None:
            self._logger.flush(left(deadline), hooks=False)  # the engine sees every row
            if self._alerts in self._logger.backends:
                self._logger.backends.remove(self._alerts)
            self._alerts.close()
        return True


class UserHooksPart(Part):
    """The users' step sinks and MetricsLogger backends, closing on threads of their own
    (started by the steps and logger parts): waited for beside the exporters, left behind at
    the deadline, each named in ``summary.json`` then."""

    name = "user hooks"
    side_by_side = True

    def __init__(self, state: RunState, logger: MetricsLogger) -> None:
        self._state = state
        self._logger = logger
        self._closing: list[tuple[str, threading.Thread]] = []

    def close(self, deadline: float) -> bool:
        consumers = self._state.consumers
        self._closing = [
            *(consumers.hooks_closing() if consumers is not None else []),
            *self._logger.hooks_closing(),
        ]
        for _, thread in self._closing:
            # a little past the deadline: alive when close_parts looks, if a hook is stuck
            thread.join(left(deadline) + 0.5)
        return not any(thread.is_alive() for _, thread in self._closing)

    def unfinished(self) -> list[str]:
        return count_left_behind(self._closing)  # counted, with what they did not get


class ProfilesPart(Part):
    """The profile captures: one still running when the run ends stops and writes its file
    with the steps it has; none starts after."""

    name = "profiles"

    def __init__(self, profiles: Any) -> None:
        self._profiles = profiles

    def close(self, deadline: float) -> bool:
        self._profiles.close()
        return True


class SummaryPart(Part):
    """``summary.json``, written once the local files are done (``"complete": false``) and
    again when the run has ended: exporters may take the rest of the time to shut down (a
    collector that is down), and a job given a short grace period after SIGTERM keeps at
    least this one, with the export counts so far."""

    name = "summary"

    def __init__(self, state: RunState, path: Path) -> None:
        self._state = state
        self._path = path

    def close(self, deadline: float) -> bool:
        if self._state.runtime is not None:  # a run that records nothing writes none
            write_summary(self._path, self._state, self._state.sessions, complete=False)
        return True


class PerfettoTranslationPart(Part):
    """The run folder's Perfetto trace, translated from ``spans.jsonl`` in the time the
    shutdown has left; what does not fit is left to ``otel-tunix convert`` (the end notice
    says so)."""

    name = "perfetto translation"
    side_by_side = True

    def __init__(self, state: RunState, spans: Path, rank: RankInfo) -> None:
        self._state = state
        self._spans = spans
        self._rank = rank

    def close(self, deadline: float) -> bool:
        self._state.perfetto_left = self._spans  # until it is done (the notice may not wait)
        trace = perfetto_from_jsonl(self._spans, self._rank, deadline=deadline)
        if trace is None:
            return False
        self._state.info.files["perfetto"] = trace
        self._state.perfetto_left = None
        return True


class ExporterPart(Part):
    """One of otel-tunix's batch export processors in an application's TracerProvider
    (which is the application's to shut down; its own processors are left alone)."""

    side_by_side = True

    def __init__(self, processor: BatchExportProcessor) -> None:
        self._processor = processor
        self.name = f"exporter {type(processor.exporter).__name__}"

    def close(self, deadline: float) -> bool:
        self._processor.shutdown()
        return True


class ProviderPart(Part):
    """A tracer, meter or logger provider: shut down when otel-tunix made it, flushed when
    it is the application's."""

    side_by_side = True

    def __init__(self, provider: Any, *, owned: bool, what: str) -> None:
        self.provider = provider
        self._owned = owned
        self._what = what
        self.name = f"{what} ({type(provider).__name__})"

    def flush(self, deadline: float) -> bool:
        return bool(self.provider.force_flush(_millis(deadline)))

    def close(self, deadline: float) -> bool:
        if not self._owned:
            return bool(self.provider.force_flush(_millis(deadline)))
        # The SDK's own atexit handler would run this shutdown again at exit, blocked by
        # the same collector: it is ours to do, within the budget.
        atexit.unregister(self.provider.shutdown)
        self.provider.shutdown()
        return True

    def in_forked_child(self) -> None:
        if not self._owned:
            return
        # The SDK's exit hooks of the parent's providers would export the child's copy of
        # the parent's data at its exit (blocked for the exporters' timeouts when the
        # collector is down): those providers are the parent's to shut down.
        atexit.unregister(self.provider.shutdown)
        if self._what == "metrics":
            silence_periodic_readers(self.provider)


def _millis(deadline: float) -> int:
    return max(1, int(left(deadline) * 1000))


class DetachPart(Part):
    """Takes the run's span processors off the tracer provider. A provider can outlive the
    run (the application's, or ours made global, which OTel never replaces); it would
    otherwise keep the whole run (pipeline, steps, sinks) in memory for good."""

    name = "span processors"

    def __init__(self, provider: Any, processors: Sequence[object]) -> None:
        self._provider = provider
        self._processors = tuple(processors)

    def close(self, deadline: float) -> bool:
        remove_span_processors(self._provider, self._processors)
        return True


class ObservablesPart(Part):
    """The run's observable instruments (step counts and rates, dropped steps, span
    counts, the goodput ledger's): registered at the start, given nothing to report at the
    end."""

    name = "observable instruments"

    def __init__(self, meter: Any, state: RunState) -> None:
        self._meter = meter
        self._state = state
        self._ledger_meter: Any = None

    def start(self) -> None:
        register_observables(self._meter, self._state)
        if self._state.ledger is not None:
            self._ledger_meter = goodput.ledger_meter(self._state.meter_provider)
            goodput.observe(self._ledger_meter, self._state.ledger)

    def close(self, deadline: float) -> bool:
        register_observables(self._meter, None)
        if self._ledger_meter is not None:
            goodput.observe(self._ledger_meter, None)
        return True


class DatadogPart(Part):
    """The DogStatsD client."""

    name = "datadog"

    def __init__(self, client: Any) -> None:
        self._client = client

    def close(self, deadline: float) -> bool:
        self._client.close()
        return True


class StreamedPerfettoPart(Part):
    """The Perfetto trace streamed during the run: once its exporter has shut down, the
    run's files name it."""

    name = "perfetto"

    def __init__(self, state: RunState, exporter: Any) -> None:
        self._state = state
        self._exporter = exporter

    def close(self, deadline: float) -> bool:
        if self._exporter.path is not None:
            self._state.info.files["perfetto"] = self._exporter.path
        return True
