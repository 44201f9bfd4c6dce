"""Counted exports of the metrics and log records a run sends (spans are counted by
:class:`~otel_tunix.pipeline.export_processor.BatchExportProcessor`).

The SDK's periodic metric reader and batch log processor log a failed export and go on;
nothing else keeps it. An endpoint that takes spans but not metrics (Jaeger's OTLP port)
fails every metric export, so the run's end notice and ``summary.json`` would say "nothing
failed" while the log said otherwise. Each exporter otel-tunix builds for these two signals
is wrapped in a forwarding exporter that counts its exports and their failures.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

__all__ = [
    "CountingLogExporter",
    "CountingMetricExporter",
    "SignalExportStats",
    "failures",
    "new_signal_stats",
]


class SignalExportStats:
    """Thread-safe counters of one exporter's exports of one signal over a run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.exports = 0
        self.failed = 0

    def add(self, *, failed: bool) -> None:
        with self._lock:
            self.exports += 1
            self.failed += int(failed)

    def to_json(self) -> dict[str, int]:
        return {"exports": self.exports, "exports_failed": self.failed}


def new_signal_stats() -> dict[str, dict[str, SignalExportStats]]:
    """Empty counters of a run's metric and log exports, by signal, then exporter name."""
    return {"metrics": {}, "logs": {}}


def failures(by_signal: Mapping[str, Mapping[str, SignalExportStats]]) -> list[str]:
    """One phrase per exporter that failed exports (``"metrics otlp: 3 of 5 exports
    failed"``), for the end notice and the shutdown warning."""
    return [
        f"{signal} {name}: {st.failed} of {st.exports} exports failed"
        for signal, by_name in by_signal.items()
        for name, st in by_name.items()
        if st.failed
    ]


def _failed(result: Any) -> bool:
    # MetricExportResult / LogExportResult / LogRecordExportResult (its name in newer SDKs)
    # all have a FAILURE member; comparing names works with each SDK version.
    return getattr(result, "name", "") == "FAILURE"


class CountingMetricExporter(MetricExporter):
    """Forwards to ``inner`` and counts each export in ``stats`` (an exception counts as
    a failure and is re-raised for the reader to log, as it would be without us)."""

    def __init__(self, inner: MetricExporter, stats: SignalExportStats) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self.inner = inner
        self.stats = stats

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except BaseException:
            self.stats.add(failed=True)
            raise
        self.stats.add(failed=_failed(result))
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


class CountingLogExporter:
    """Forwards to the log record exporter ``inner`` and counts each export in ``stats``.

    Duck-typed (export, shutdown, force_flush) rather than a subclass: the SDK renamed the
    base class (``LogExporter`` to ``LogRecordExporter``) between the versions we support.
    """

    def __init__(self, inner: Any, stats: SignalExportStats) -> None:
        self.inner = inner
        self.stats = stats

    def export(self, batch: Sequence[Any]) -> Any:
        try:
            result = self.inner.export(batch)
        except BaseException:
            self.stats.add(failed=True)
            raise
        self.stats.add(failed=_failed(result))
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))
