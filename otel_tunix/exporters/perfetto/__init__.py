"""Perfetto exporter: finished OpenTelemetry spans → a native Perfetto protobuf trace.

:class:`PerfettoSpanExporter` is a real OpenTelemetry
:class:`~opentelemetry.sdk.trace.export.SpanExporter`. It streams every exported batch into
one ``.pftrace`` file per process (packet by packet, never rewriting the file), so a run of
any length uses constant memory and a crash leaves a file that loads up to the last batch.
Open the file in https://ui.perfetto.dev.

Layout of the trace:

* one process track per OTel ``Resource`` (``service.name``, ``host.name``, ``tunix.rank``);
* one thread track per ``thread.id`` / ``thread.name``; spans without thread info go on their
  parent's track (a component on its step's thread, a foreign span on its component's);
* extra lanes (child tracks ``<thread> #1``, ``#2``, ...) wherever spans on one thread overlap
  without nesting, so that the slices of every track nest strictly;
* step slices carry their attributes and their busy / blocked / idle times as arguments, and
  three counter tracks per scope (``perf/<scope>/busy_time_sec``, ``.../blocked_time_sec``,
  ``.../idle_time_sec``) get one value per step: the step's own accounting, as its span
  (``tunix.step.busy_time``, ...) or its spans JSONL line carries it (a step span made by
  other code, with none, is accounted from its components by
  :func:`otel_tunix.accounting.step_time.account_step`);
* span events (exceptions, alerts) are instants on their span's track.

The translation works on plain :class:`TraceSpan` records, so the same code converts a
finished run's spans JSONL (:func:`convert_jsonl_to_perfetto`).

Timestamps are the spans' Unix-epoch nanoseconds, written as-is on the ``REALTIME`` clock,
which a ``ClockSnapshot`` at the head of the file declares the trace's clock.
"""

from otel_tunix.exporters.perfetto.converter import ConversionTimeout, convert_jsonl_to_perfetto
from otel_tunix.exporters.perfetto.exporter import PerfettoSpanExporter, default_directory
from otel_tunix.exporters.perfetto.model import ProcessInfo, SpanEventRecord, TraceSpan
from otel_tunix.exporters.perfetto.writer import PerfettoTraceWriter

__all__ = [
    "ConversionTimeout",
    "PerfettoSpanExporter",
    "PerfettoTraceWriter",
    "ProcessInfo",
    "SpanEventRecord",
    "TraceSpan",
    "convert_jsonl_to_perfetto",
    "default_directory",
]
