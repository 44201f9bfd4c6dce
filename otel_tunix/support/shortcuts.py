"""Every private-API shortcut otel-tunix takes, in one place, each checked when it loads.

Each one reads or builds something through a private name of Python or the OpenTelemetry
SDK because the public way costs a Python call (or several) per span on the hot path or
the span builder. Each has a self-check at import (does the shortcut give exactly what the
public way gives, in the installed version?) and falls back to the public way when the
check fails or the private name is gone. docs/benchmarks.md says what each one buys.

* :data:`threads_by_ident`: ``threading._active``, what ``threading.current_thread()``
  reads, without its Python frame (a component in a thread other than the step's).
* :func:`otel_context`, :func:`attach_span`, :func:`detach`, :data:`SPAN_KEY`: the
  ``ContextVar`` behind OTel's runtime context and its span key, read and set directly (a
  step attaches its proxy span; a component reads the current span).
* :func:`new_span_context`: a ``SpanContext`` built as the tuple it is, without the
  constructor's range checks (ids otel-tunix drew itself).
* :func:`span_maker`: SDK ``ReadableSpan`` objects of a run made as a subclass whose shared
  fields are class attributes (six assignments instead of thirteen).
* :func:`span_processors_of` / :func:`span_processors_found` /
  :func:`remove_span_processors`: the processors inside an SDK ``TracerProvider`` (its
  multi-processor's tuple): an application's own span processors, which get otel-tunix's
  spans through ``on_end`` (``pipeline/consumers.ProviderSpans``; where the tuple cannot be
  read, only those given to ``configure``), the export locks a fork waits for, and a
  finished run's processors taken off a provider that outlives it.
* :func:`reset_global_providers`: the OTel API's set-once guards, reset as OpenTelemetry's
  own test utilities do, so a later ``configure()`` can replace a provider otel-tunix set.
* :data:`running_loop`: ``asyncio.events._get_running_loop`` (the C function behind
  ``asyncio.get_running_loop`` that returns ``None`` instead of raising).
* :data:`SUPPRESS_INSTRUMENTATION_KEY`: the context key the SDK's own batch processor sets
  while exporting, so instrumented HTTP / gRPC clients inside an exporter make no spans.
* :func:`produce_into`, :func:`metric_reader_histograms`, :func:`trace_based_exemplars`: a
  metric reader's collection callback wrapped so that points otel-tunix aggregated itself
  join what the SDK collected (the specification's ``MetricProducer``, which this SDK
  lacks), and how the reader and provider would aggregate a histogram (the step histograms,
  ``metrics/step_histograms.py``). Checked per reader when a run is assembled: a reader or
  provider without these names keeps the SDK's instruments.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context_api
from opentelemetry import trace
from opentelemetry.context import Context, attach, get_current
from opentelemetry.context import detach as _public_detach
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.sdk.metrics import (
    AlwaysOffExemplarFilter,
    TraceBasedExemplarFilter,
)
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import DefaultAggregation, ExplicitBucketHistogramAggregation
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    DEFAULT_TRACE_STATE,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)
from opentelemetry.util._once import Once

__all__ = [
    "HAS_SPAN_KEY",
    "SAMPLED",
    "SPAN_CONTEXT_AS_TUPLE",
    "SPAN_KEY",
    "SUPPRESS_INSTRUMENTATION_KEY",
    "SpanMaker",
    "attach_span",
    "detach",
    "metric_reader_histograms",
    "new_span_context",
    "otel_context",
    "produce_into",
    "remove_span_processors",
    "reset_global_providers",
    "running_loop",
    "sdk_span",
    "span_maker",
    "span_processors_found",
    "span_processors_of",
    "threads_by_ident",
    "trace_based_exemplars",
]

# --- threads ------------------------------------------------------------------------------

_active = getattr(threading, "_active", None)
threads_by_ident: dict[int, threading.Thread] = (
    _active if isinstance(_active, dict) and threading.get_ident() in _active else {}
)
"""Live threads by ident (``threading._active``); empty (callers then use
``threading.current_thread()``) when the private dict is gone."""


def _running_loop_public() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


_loop = getattr(asyncio.events, "_get_running_loop", None)
running_loop: Callable[[], asyncio.AbstractEventLoop | None] = (
    _loop if callable(_loop) and _loop() is None else _running_loop_public
)
"""The event loop running in this thread, or ``None``."""

try:  # the key the SDK's own batch processor sets while exporting
    from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY

    SUPPRESS_INSTRUMENTATION_KEY: str = _SUPPRESS_INSTRUMENTATION_KEY
except ImportError:  # pragma: no cover - a future API without it
    SUPPRESS_INSTRUMENTATION_KEY = "suppress_instrumentation"
"""The context key that tells instrumentations to make no spans (set while exporting)."""

# --- the current OTel span -----------------------------------------------------------------

try:  # the OTel context key of the current span: reading it directly saves an ABC check
    from opentelemetry.trace.propagation import _SPAN_KEY

    SPAN_KEY: str = _SPAN_KEY
    HAS_SPAN_KEY = True
except ImportError:  # pragma: no cover - a future API without the private key
    SPAN_KEY = "otel-tunix: no span key"  # never found: callers use get_current_span()
    HAS_SPAN_KEY = False
"""The key of the current span in an OTel ``Context``; without ``HAS_SPAN_KEY`` a key that
is never found (callers then use ``get_current_span()``)."""


def _runtime_context_var() -> contextvars.ContextVar[Any] | None:
    """The ContextVar behind OTel's runtime context when it is the standard contextvars one
    and reading it gives what ``get_current()`` gives."""
    runtime = getattr(otel_context_api, "_RUNTIME_CONTEXT", None)
    var = getattr(runtime, "_current_context", None)
    if not isinstance(var, contextvars.ContextVar):
        return None
    return var if var.get() is get_current() else None


_context_var = _runtime_context_var()

otel_context: Callable[[], Context] = _context_var.get if _context_var is not None else get_current
"""Reads the current OTel ``Context``."""


def _span_attacher() -> tuple[Callable[[Any], Any], Callable[[Any], None]]:
    """``(attach_span, detach)``: make a span the current OTel span and undo it.

    With the standard runtime context this is one ``ContextVar.set`` of a new ``Context``
    holding the span (what ``attach(set_span_in_context(span))`` does, without its four
    Python calls); otherwise the public API.
    """
    var, key = _context_var, SPAN_KEY
    if var is None or not HAS_SPAN_KEY:
        return (lambda span: attach(set_span_in_context(span))), _public_detach
    get, set_ = var.get, var.set

    def attach_span(span: Any) -> Any:
        return set_(Context({**get(), key: span}))

    return attach_span, var.reset


attach_span, detach = _span_attacher()
"""``attach_span(span) -> token`` makes ``span`` the current OTel span; ``detach(token)``
undoes it."""

# --- span contexts -------------------------------------------------------------------------

SAMPLED = TraceFlags(TraceFlags.SAMPLED)
"""The trace flags of every span otel-tunix records."""


def _span_context_factory() -> tuple[Callable[[int, int], SpanContext], bool]:
    """``(trace_id, span_id) -> SpanContext`` (local, sampled) for ids otel-tunix drew or
    took from a valid context, and whether it builds the tuple directly.

    ``SpanContext`` is a tuple; building the tuple directly skips the constructor's range
    checks (about half its cost, paid per span). Used only when it yields exactly what the
    constructor does in this version of the API; otherwise the constructor itself.
    """
    new, cls, flags, state = tuple.__new__, SpanContext, SAMPLED, DEFAULT_TRACE_STATE

    def fast(trace_id: int, span_id: int) -> SpanContext:
        return new(cls, (trace_id, span_id, False, flags, state, True))

    def slow(trace_id: int, span_id: int) -> SpanContext:
        return SpanContext(trace_id, span_id, False, SAMPLED)

    try:
        a, b = fast(3, 5), slow(3, 5)
        same = tuple(a) == tuple(b) and a.is_valid and a.trace_flags.sampled and not a.is_remote
    except Exception:  # pragma: no cover - a future API: the check failing means "not the same"
        same = False
    return (fast, True) if same else (slow, False)


new_span_context, SPAN_CONTEXT_AS_TUPLE = _span_context_factory()
"""``SPAN_CONTEXT_AS_TUPLE``: ``new_span_context(t, s)`` is ``tuple.__new__(SpanContext, (t, s,
False, SAMPLED, DEFAULT_TRACE_STATE, True))``, which a loop over many spans may write out to
save a Python call per span."""

# --- SDK spans -----------------------------------------------------------------------------

_UNSET = Status(StatusCode.UNSET)
_INTERNAL = SpanKind.INTERNAL

SpanMaker = Callable[..., ReadableSpan]
"""``(name, context, parent, attributes, start_time, end_time) -> ReadableSpan``: a span of
one run with internal kind, unset status, and no events or links."""


def sdk_span(
    resource: Resource,
    scope: InstrumentationScope,
    name: str,
    context: SpanContext,
    parent: SpanContext | None,
    attributes: dict[str, Any],
    start_time: int,
    end_time: int,
    events: tuple[Any, ...] = (),
    status: Status = _UNSET,
    links: tuple[Any, ...] = (),
) -> ReadableSpan:
    """A span of a run made by the SDK's own constructor (internal kind)."""
    return ReadableSpan(
        name,
        context=context,
        parent=parent,
        resource=resource,
        attributes=attributes,
        events=events,
        links=links,
        kind=_INTERNAL,
        status=status,
        start_time=start_time,
        end_time=end_time,
        instrumentation_scope=scope,
    )


def span_maker(resource: Resource, scope: InstrumentationScope) -> SpanMaker:
    """The :data:`SpanMaker` of a run.

    Every span of a run shares its resource, instrumentation scope, kind, status, events and
    links, so they are class attributes of a ``ReadableSpan`` subclass made for the run, and
    a span stores only its six own fields: about a quarter less of what making an SDK span
    costs (the SDK's ``__init__`` assigns thirteen). Used only when such a span answers every
    public property as ``ReadableSpan`` built by its own constructor does (checked here, for
    the installed SDK); otherwise the constructor itself.
    """
    shared = {
        "_resource": resource,
        "_instrumentation_scope": scope,
        "_instrumentation_info": None,
        "_kind": _INTERNAL,
        "_status": _UNSET,
        "_events": (),
        "_links": (),
    }
    cls = type("RunSpan", (ReadableSpan,), {**shared, "__slots__": ()})
    cls.__module__ = __name__
    new = object.__new__

    def make(
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: dict[str, Any],
        start_time: int,
        end_time: int,
    ) -> ReadableSpan:
        span: Any = new(cls)
        span._name = name
        span._context = context
        span._parent = parent
        span._attributes = attributes
        span._start_time = start_time
        span._end_time = end_time
        return span  # type: ignore[no-any-return]

    def by_constructor(
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: dict[str, Any],
        start_time: int,
        end_time: int,
    ) -> ReadableSpan:
        return sdk_span(resource, scope, name, context, parent, attributes, start_time, end_time)

    try:
        args = ("n", new_span_context(3, 5), new_span_context(3, 7), {"a": 1}, 11, 13)
        same = _same_span(make(*args), by_constructor(*args))
    except Exception:  # pragma: no cover - a future SDK: the check failing means "not the same"
        same = False
    return make if same else by_constructor


def _same_span(a: ReadableSpan, b: ReadableSpan) -> bool:
    """Whether two spans answer every public property alike."""
    props = (
        "name",
        "context",
        "parent",
        "resource",
        "attributes",
        "events",
        "links",
        "kind",
        "start_time",
        "end_time",
        "instrumentation_scope",
        "dropped_attributes",
        "dropped_events",
        "dropped_links",
    )
    return (
        all(getattr(a, p) == getattr(b, p) for p in props)
        and (a.status.status_code, a.status.description)
        == (b.status.status_code, b.status.description)
        and a.to_json() == b.to_json()
    )


# --- the processors inside an SDK TracerProvider ------------------------------------------


def _multi(provider_or_processor: Any) -> Any:
    """The SDK multi-processor of a TracerProvider (or the processor given)."""
    return getattr(provider_or_processor, "_active_span_processor", provider_or_processor)


def span_processors_of(provider_or_processor: Any) -> tuple[SpanProcessor, ...]:
    """The span processors a TracerProvider (or multi-processor) dispatches to, in order;
    a processor that is neither is its own only one."""
    multi = _multi(provider_or_processor)
    procs = getattr(multi, "_span_processors", None)
    return procs if isinstance(procs, tuple) else (multi,)


def span_processors_found(provider: Any) -> tuple[SpanProcessor, ...] | None:
    """The span processors of an SDK TracerProvider, in order, or ``None`` where its
    multi-processor's tuple cannot be read (a provider of another kind, another SDK)."""
    multi = getattr(provider, "_active_span_processor", None)
    procs = getattr(multi, "_span_processors", None)
    return procs if isinstance(procs, tuple) else None


def remove_span_processors(provider: Any, processors: tuple[Any, ...]) -> None:
    """Take ``processors`` off an SDK TracerProvider. The SDK has no public way to remove a
    processor: its multi-processor's tuple is replaced under its lock, as
    ``add_span_processor`` itself does; a provider without that shape keeps them."""
    multi = _multi(provider)
    lock = getattr(multi, "_lock", None)
    if lock is None or not isinstance(getattr(multi, "_span_processors", None), tuple):
        return
    with lock:
        multi._span_processors = tuple(
            p for p in multi._span_processors if all(p is not ours for ours in processors)
        )


# --- the OTel API's global providers -------------------------------------------------------


class _NoMetricExport(MetricExporter):
    """Sends nothing: what a forked child's copies of the parent's periodic readers get."""

    def export(
        self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def silence_periodic_readers(meter_provider: Any) -> None:
    """In a forked child: the SDK's own fork hook restarts the thread of each periodic
    reader of the parent's ``MeterProvider``, which would then export the child's copy of
    the parent's metrics every interval. Each gets an exporter that sends nothing. (Private
    SDK attributes, ``_metric_readers`` and ``_exporter``; nothing is done where they are
    missing.)"""
    for reader in getattr(meter_provider, "_metric_readers", ()):
        if isinstance(reader, PeriodicExportingMetricReader) and hasattr(reader, "_exporter"):
            reader._exporter = _NoMetricExport()


def sdk_export_locks(provider: Any) -> list[Any]:
    """The locks the SDK holds while an exporter of ``provider`` exports: each batch
    processor's (spans, log records) and each periodic metric reader's (private SDK
    attributes ``_batch_processor``, ``_export_lock``, ``_metric_readers``,
    ``_multi_log_record_processor``; none where they are missing)."""
    processors: list[Any] = []
    if hasattr(provider, "_active_span_processor"):
        processors += span_processors_of(provider)
    logs = getattr(provider, "_multi_log_record_processor", None)
    processors += list(getattr(logs, "_log_record_processors", ()))
    holders = [getattr(p, "_batch_processor", None) for p in processors]
    holders += list(getattr(provider, "_metric_readers", ()))
    locks = [getattr(h, "_export_lock", None) for h in holders]
    return [lock for lock in locks if hasattr(lock, "acquire")]


def reset_global_providers(*, tracer: bool = True, meter: bool = True) -> None:
    """Let the API's global tracer / meter provider be set again (its set-once guard reset,
    as OpenTelemetry's own test utilities do)."""
    if tracer:
        trace._TRACER_PROVIDER_SET_ONCE = Once()
        trace._TRACER_PROVIDER = None
    if meter:
        metrics_internal._METER_PROVIDER_SET_ONCE = Once()
        metrics_internal._METER_PROVIDER = None


# --- metric readers: points aggregated by otel-tunix --------------------------------------

_SDK_CARDINALITY_LIMIT = 2000
"""The SDK's default cardinality limit per metric stream (older SDKs have no other)."""


def metric_reader_histograms(reader: MetricReader) -> tuple[AggregationTemporality, int] | None:
    """How ``reader`` collects a synchronous histogram: its temporality and cardinality
    limit, where it makes explicit-bucket histograms at the instrument's advisory boundaries
    (:func:`_advisory_buckets`) and has a collection callback :func:`produce_into` can wrap;
    ``None`` otherwise (private SDK attributes ``_instrument_class_temporality``,
    ``_instrument_class_aggregation``, ``_instrument_class_cardinality_limit``,
    ``_collect``)."""
    temporality = getattr(reader, "_instrument_class_temporality", None)
    aggregation = getattr(reader, "_instrument_class_aggregation", None)
    limits = getattr(reader, "_instrument_class_cardinality_limit", None)
    if not (isinstance(temporality, dict) and isinstance(aggregation, dict)):
        return None
    if not callable(getattr(reader, "_collect", None)):
        return None
    cls = next(
        (k for k in temporality if isinstance(k, type) and issubclass(k, SdkHistogram)), None
    )
    if cls is None or not _advisory_buckets(aggregation.get(cls)):
        return None
    limit = limits.get(cls, _SDK_CARDINALITY_LIMIT) if isinstance(limits, dict) else None
    t = temporality[cls]
    if not isinstance(t, AggregationTemporality) or not isinstance(limit, int):
        return None
    return t, limit


def _advisory_buckets(aggregation: Any) -> bool:
    """Whether ``aggregation`` makes explicit-bucket histograms at the instrument's advisory
    boundaries with min and max: the default one, or an ``ExplicitBucketHistogramAggregation``
    with no boundaries of its own (what the OTLP exporters ask for by default; private
    ``_boundaries`` and ``_record_min_max``)."""
    if type(aggregation) is DefaultAggregation:
        return True
    return (
        type(aggregation) is ExplicitBucketHistogramAggregation
        and getattr(aggregation, "_boundaries", ()) is None
        and getattr(aggregation, "_record_min_max", False) is True
    )


def trace_based_exemplars(meter_provider: Any) -> bool | None:
    """Whether an SDK ``MeterProvider`` keeps exemplars of measurements made in a sampled
    span's context (``trace_based``: ``True``) or none (``always_off``: ``False``); ``None``
    for any other filter, a provider with views, or one without the private
    ``_sdk_config``."""
    config = getattr(meter_provider, "_sdk_config", None)
    if config is None or getattr(config, "views", True):
        return None
    kind = type(getattr(config, "exemplar_filter", None))
    if kind is TraceBasedExemplarFilter:
        return True
    if kind is AlwaysOffExemplarFilter:
        return False
    return None


def produce_into(
    reader: MetricReader,
    produce: Callable[[MetricReader, MetricsData | None], MetricsData | None],
) -> None:
    """Pass what ``reader`` collects through ``produce`` from now on: the reader's
    collection callback (set by its ``MeterProvider`` with ``_set_collect_callback``) is
    wrapped. Check the reader with :func:`metric_reader_histograms` first."""
    collect: Any = reader._collect  # typed in the SDK as an older signature

    def collect_and_produce(r: MetricReader, timeout_millis: float = 10_000) -> Any:
        return produce(r, collect(r, timeout_millis=timeout_millis))

    reader._set_collect_callback(collect_and_produce)
