"""Counting what reaches the exporters: exported, failed and dropped spans.

A collector that is down or slow must never raise into or stall the training loop; the
batch processor drops spans when its queue is full and the exporter gives up after its
retries. These wrappers count both, so the loss is visible: in the metric
``tunix.telemetry.spans`` (attribute ``result`` = ``exported`` | ``failed`` | ``dropped``)
and in the run's ``summary.json``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


class ExportStats:
    """Thread-safe counters of one run's span exports."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.offered = 0
        self.exported = 0
        self.failed = 0

    def add(self, offered: int = 0, exported: int = 0, failed: int = 0) -> None:
        with self._lock:
            self.offered += offered
            self.exported += exported
            self.failed += failed

    @property
    def dropped(self) -> int:
        """Offered to a batch processor but neither exported nor failed (queue full, or
        still queued when the run ended)."""
        return max(0, self.offered - self.exported - self.failed)

    def to_json(self) -> dict[str, int]:
        return {
            "spans_offered": self.offered,
            "spans_exported": self.exported,
            "spans_failed": self.failed,
            "spans_dropped": self.dropped,
        }


class CountingSpanExporter(SpanExporter):
    """Wraps an exporter; counts spans whose export succeeded or failed. Never raises."""

    def __init__(self, inner: SpanExporter, stats: ExportStats) -> None:
        self.inner = inner
        self._stats = stats

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:  # an exporter that raises counts as a failed export
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self._stats.add(exported=len(spans))
        else:
            self._stats.add(failed=len(spans))
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class CountingBatchSpanProcessor(BatchSpanProcessor):
    """A BatchSpanProcessor that counts the sampled spans offered to it."""

    def __init__(self, exporter: SpanExporter, stats: ExportStats) -> None:
        super().__init__(CountingSpanExporter(exporter, stats))
        self._stats = stats

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            self._stats.add(offered=1)
        super().on_end(span)
