"""The batch span processor in front of every exporter otel-tunix configures, with counts.

Why not the SDK's ``BatchSpanProcessor``: it takes spans one ``on_end`` call at a time
(~0.8 us each, plus ~0.4 us for a locked counter per span here), and they must exist as SDK
span objects by then. otel-tunix's worker holds each sampled step whole:
:meth:`BatchExportProcessor.on_finished_steps` queues a batch of steps in one call, and
their SDK spans are built on the export thread, inside ``export()``, as the exporter
iterates over the batch (:class:`SpanBatch`), so each lives for microseconds instead of a
schedule delay or the length of a batch (fewer objects for Python's garbage collector to
walk and promote, which in a loop that records spans fast was a third of the cost). Spans
from other code still arrive one at a time through :meth:`on_end`. Otherwise it behaves like
the SDK's: the same ``OTEL_BSP_*`` settings, a bounded queue that drops (and counts) when
full, a daemon thread that exports in batches, exports with instrumentation suppressed,
``force_flush`` and ``shutdown``, and a fresh thread in a forked child.

A collector that is down or slow must never raise into or stall the training loop: the queue
is bounded, exports happen on the processor's own thread, and what is lost is counted in the
metric ``tunix.telemetry.spans`` (attribute ``result`` = ``exported`` | ``failed`` |
``dropped``) and in the run's ``summary.json``.
"""

from __future__ import annotations

import itertools
import logging
import operator
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, overload

from opentelemetry.context import Context, attach, detach, set_value
from opentelemetry.sdk.trace import ReadableSpan, Span
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_tunix.pipeline.batch_queue import BatchQueue
from otel_tunix.pipeline.span_builder import FinishedStep
from otel_tunix.pipeline.step_sinks import StepSpanProcessor
from otel_tunix.settings.values import Settings, load_settings
from otel_tunix.support.errors import warn_once
from otel_tunix.support.shortcuts import SUPPRESS_INSTRUMENTATION_KEY

_logger = logging.getLogger(__name__)


class ExportStats:
    """Thread-safe counters of one exporter's spans over a run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.offered = 0
        self.exported = 0
        self.failed = 0
        self.dropped_full = 0

    def add(self, offered: int = 0, exported: int = 0, failed: int = 0, dropped: int = 0) -> None:
        with self._lock:
            self.offered += offered
            self.exported += exported
            self.failed += failed
            self.dropped_full += dropped

    @property
    def dropped(self) -> int:
        """Offered but neither exported nor failed: the queue was full, or the spans were
        still queued when the run ended."""
        return max(0, self.offered - self.exported - self.failed)

    def to_json(self) -> dict[str, int]:
        return {
            "spans_offered": self.offered,
            "spans_exported": self.exported,
            "spans_failed": self.failed,
            "spans_dropped": self.dropped,
        }


def _span_count(item: ReadableSpan | FinishedStep) -> int:
    return 1 if isinstance(item, ReadableSpan) else item.span_count


def _spans_of(item: ReadableSpan | FinishedStep) -> Sequence[ReadableSpan]:
    """A queued item's spans for one export (a step's are built now)."""
    return (item,) if isinstance(item, ReadableSpan) else item.export_spans()


def _restart_weakly(ref: weakref.ref[BatchQueue[Any]]) -> Callable[[], None]:
    """What a forked child calls: restart the queue if it still exists (a fork handler
    cannot be removed, so it must not keep the processor alive)."""

    def restart() -> None:
        queue = ref()
        if queue is not None:
            queue.restart()

    return restart


class SpanBatch(Sequence[ReadableSpan]):
    """One ``export()`` batch: the spans of the queued items (whole steps and single spans),
    a step's SDK spans built as the exporter iterates over them.

    Why lazily: the spans of a step then live only while the exporter reads them. Built all
    at once, the hundreds of span objects of a batch were alive through several of Python's
    garbage collections, got promoted to its oldest generation and made full collections
    frequent: a third of the export path's cost in a loop that records spans fast. An
    exporter sees an ordinary sequence (``len``, iteration, indexing, slicing); iterating
    it again builds the spans again, with the same content.
    """

    __slots__ = ("_items", "_length")

    def __init__(self, items: list[ReadableSpan | FinishedStep], length: int) -> None:
        self._items = items
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[ReadableSpan]:
        # chain and map step from span to span in C: one Python call per step, not a
        # generator resumed per span (~5 % of the export path)
        return itertools.chain.from_iterable(map(_spans_of, self._items))

    @overload
    def __getitem__(self, index: int) -> ReadableSpan: ...

    @overload
    def __getitem__(self, index: slice) -> list[ReadableSpan]: ...

    def __getitem__(self, index: int | slice) -> ReadableSpan | list[ReadableSpan]:
        if isinstance(index, slice):
            return list(self)[index]
        i = operator.index(index)
        if i < 0:
            i += self._length
        if not 0 <= i < self._length:
            raise IndexError("span batch index out of range")
        for item in self._items:
            n = _span_count(item)
            if i < n:
                # spans(), not export_spans(): kept, so reading the batch afterwards does
                # not build this step twice (exporters peek at the first span).
                return item if isinstance(item, ReadableSpan) else item.spans()[i]
            i -= n
        raise IndexError("span batch index out of range")  # pragma: no cover


class StepSpanExporter(SpanExporter):
    """A span exporter that reads otel-tunix's queued steps whole, instead of their SDK
    spans: :class:`BatchExportProcessor` calls :meth:`export_items` with each batch as it
    was queued (whole steps and other code's single spans). The OTLP fast path
    (``otel_tunix.exporters.otlp``) is one: it encodes the steps' protobuf itself.
    """

    batch_size: int = 512
    """Spans per export when ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` is unset (the queue then
    holds four batches, at least the SDK's 2048 spans)."""

    def export_items(
        self, items: Sequence[ReadableSpan | FinishedStep], count: int
    ) -> SpanExportResult:
        """Export a batch of ``count`` spans: whole steps (their spans are the components
        in start order, then the step span; :meth:`FinishedStep.spans`) and single SDK
        spans, in order. An exporter that does not read a step's ``export_spans()`` calls
        ``step.queued_for_export(False)`` for it. Default: :meth:`export` of their spans."""
        return self.export(SpanBatch(list(items), count))


class BatchExportProcessor(StepSpanProcessor):
    """Queues ended spans and exports them in batches on a daemon thread; counts them.

    Args:
        exporter: Any OTel ``SpanExporter``.
        stats: Where the counts go (a new :class:`ExportStats` when omitted).
        max_queue_size: Spans held at most (``OTEL_BSP_MAX_QUEUE_SIZE``; default 2048, or
            four batches if more); past it new spans are dropped and counted.
        schedule_delay_millis: Longest wait between exports (``OTEL_BSP_SCHEDULE_DELAY``,
            5000).
        max_export_batch_size: Spans per ``export()`` call (``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``;
            default 512, or the exporter's :attr:`StepSpanExporter.batch_size`); a full batch
            wakes the thread early.
        export_timeout_millis: How long ``shutdown`` waits for the last export
            (``OTEL_BSP_EXPORT_TIMEOUT``, 30000).
        settings: Where the ``OTEL_BSP_*`` defaults come from (default: the environment,
            read by :func:`~otel_tunix.settings.values.load_settings`).
    """

    def __init__(
        self,
        exporter: SpanExporter,
        stats: ExportStats | None = None,
        *,
        max_queue_size: int | None = None,
        schedule_delay_millis: int | None = None,
        max_export_batch_size: int | None = None,
        export_timeout_millis: int | None = None,
        settings: Settings | None = None,
    ) -> None:
        s = settings if settings is not None else load_settings()
        self.exporter = exporter
        self.stats = stats if stats is not None else ExportStats()
        preferred = exporter.batch_size if isinstance(exporter, StepSpanExporter) else 512
        batch = max_export_batch_size or s.bsp_max_export_batch_size or preferred
        self._max_queue = max_queue_size or s.bsp_max_queue_size or max(2048, 4 * batch)
        self._delay = (schedule_delay_millis or s.bsp_schedule_delay_ms) / 1e3
        self._batch = min(batch, self._max_queue)
        self._timeout = (export_timeout_millis or s.bsp_export_timeout_ms) / 1e3
        self._shutdown = False
        self._queue: BatchQueue[ReadableSpan | FinishedStep] = BatchQueue(
            self._export_batch,
            name="otel-tunix-export",
            capacity=self._max_queue,
            max_batch=self._batch,
            interval_sec=self._delay,
            weight=_span_count,
        )
        if hasattr(os, "register_at_fork"):  # a forked child gets an empty queue and a thread
            os.register_at_fork(after_in_child=_restart_weakly(weakref.ref(self._queue)))

    @property
    def export_lock(self) -> threading.Lock:
        """Held while the exporter exports (a fork waits for it: see run/fork_guard.py)."""
        return self._queue.handling_lock

    # --- receiving ------------------------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        """One span from any code (otel-tunix's own steps come through
        :meth:`on_finished_steps`)."""
        ctx = span.context
        if ctx is not None and ctx.trace_flags.sampled:
            self._offer((span,))

    def on_finished_steps(self, steps: Sequence[FinishedStep]) -> None:
        """Finished otel-tunix steps, in order: queued whole, with one lock and one count
        for the lot; their spans are built as the exporter reads them."""
        for step in steps:
            step.queued_for_export()
        dropped = self._offer(steps)
        for step in dropped:
            step.queued_for_export(False)

    def _offer(self, items: Sequence[ReadableSpan | FinishedStep]) -> list[Any]:
        """Queue these items, in order, while they fit; returns those dropped."""
        first = self.stats.dropped_full == 0
        dropped = self._queue.offer(items)
        lost = sum(map(_span_count, dropped))
        self.stats.add(offered=sum(map(_span_count, items)), dropped=lost)
        if lost and first and not self._shutdown:  # the first loss of the run
            _logger.warning(
                "otel-tunix: the export queue of %s is full (%d spans); dropping spans "
                "(counted in summary.json and tunix.telemetry.spans)",
                type(self.exporter).__name__,
                self._max_queue,
            )
        return dropped

    # --- exporting (on the queue's thread) ------------------------------------------------
    def _export_batch(self, items: list[ReadableSpan | FinishedStep]) -> None:
        """Export one batch taken from the queue (a step with more spans than a batch comes
        alone and is exported in slices)."""
        count = sum(map(_span_count, items))
        if isinstance(self.exporter, StepSpanExporter):  # whole steps, in one request
            self._export(partial(self.exporter.export_items, items, count), count)
            return
        if count <= self._batch:
            self._export(partial(self.exporter.export, SpanBatch(items, count)), count)
            return
        spans = _spans_of(items[0])
        for start in range(0, count, self._batch):
            part = spans[start : start + self._batch]
            self._export(partial(self.exporter.export, part), len(part))

    def _export(self, export: Callable[[], SpanExportResult], n: int) -> None:
        """Run one export of ``n`` spans with instrumentation suppressed; count them as
        exported or failed."""
        token = attach(set_value(SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            result = export()
        except Exception:  # an exporter that raises counts as a failed export
            warn_once(
                (id(self), "export raised"),
                "otel-tunix: %s raised (reported once; failed spans are counted)",
                type(self.exporter).__name__,
                logger=_logger,
                level=logging.ERROR,
                exc_info=True,
            )
            result = SpanExportResult.FAILURE
        finally:
            detach(token)
        if result is SpanExportResult.SUCCESS:
            self.stats.add(exported=n)
        else:
            self.stats.add(failed=n)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export everything queued now, on the calling thread."""
        if self._shutdown:
            return False
        if not self._queue.drain_here(timeout_millis / 1e3):
            return False
        flush = getattr(self.exporter, "force_flush", None)
        # The SDK's base exporter answers None: only an explicit False is a failure.
        return flush is None or flush(timeout_millis) is not False

    def shutdown(self) -> None:
        """Export what is left (within the export timeout), stop the thread, shut the
        exporter down. Spans still queued after the timeout count as dropped."""
        if self._shutdown:
            return
        self._shutdown = True
        self._queue.close(self._timeout)
        try:
            self.exporter.shutdown()
        except Exception:  # the exporter's own shutdown: reported, the run still ends
            _logger.exception("otel-tunix: shutting down %s failed", type(self.exporter).__name__)
