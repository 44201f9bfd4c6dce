"""The step and component histograms, aggregated by otel-tunix and handed to the readers whole.

Each sampled step gives ~14 histogram values (step time, busy / blocked / idle per step;
busy and blocked time per component; device times when there are any). Recorded through the
SDK's ``Histogram.record`` they cost ~8 us each on the worker (attribute hashing, locks,
the exemplar filter, one aggregation per reader; ``docs/benchmarks.md``, "Metrics"), about as
much as the rest of otel-tunix's processing of the step together. :class:`StepHistograms`
folds a batch of steps at once instead (per attribute set: count, sum, min, max, counts in
the catalog's buckets; ~0.25 us a value) and, when a reader collects, hands it finished
points: what the OpenTelemetry specification calls a ``MetricProducer``, which this SDK
does not have yet, so the reader's collection callback is wrapped
(:func:`otel_tunix.support.shortcuts.produce_into`).

What the readers get is what the SDK would have made of the same values: the same metric
names, descriptions, units, attributes and bucket boundaries; each reader's temporality
(cumulative: totals since the series began; delta: since the reader's last collection,
series without new values left out), its cardinality limit (an ``otel.metric.overflow``
series past it), and the exemplars of ``tunix.step.duration`` as the SDK's aligned-bucket
reservoir keeps them under the ``trace_based`` filter (per bucket, the last step in it since
the reader's last collection, with its trace and span ids; none under ``always_off``).
Non-finite and negative values are left out, as the SDK leaves them out.

It is used only where that holds: a MeterProvider otel-tunix built (readers known, no
views), every reader asking for the default histogram aggregation, and the ``trace_based``
or ``always_off`` exemplar filter (see :func:`step_histograms_for`). Anywhere else, and with
``OTEL_TUNIX_METRICS_FAST_PATH=false``, :class:`otel_tunix.consumers.sinks.InstrumentSink` records
through the SDK's instruments. A reader added to the provider later
(``MeterProvider.add_metric_reader``) does not get these histograms.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Final

from opentelemetry.sdk.metrics import Exemplar
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricReader,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_tunix.model.metric_spec import SECONDS_BUCKETS
from otel_tunix.model.steps import StepSummary
from otel_tunix.settings import attributes as attr
from otel_tunix.support.errors import report_internal_error
from otel_tunix.support.fork import at_fork_in_child
from otel_tunix.support.shortcuts import (
    metric_reader_histograms,
    produce_into,
    trace_based_exemplars,
)

__all__ = ["STEP_HISTOGRAMS", "StepHistograms", "step_histograms_for"]

STEP_HISTOGRAMS: Final[tuple[tuple[str, str], ...]] = (
    ("tunix.step.duration", "Wall time of a sampled step"),
    ("tunix.step.busy_time", "Time a step had a busy component open"),
    ("tunix.step.blocked_time", "Time a step was blocked (waiting) and not busy"),
    ("tunix.step.idle_time", "Time of a step in no component"),
    ("tunix.component.busy_time", "Busy time of a component in a step"),
    ("tunix.component.blocked_time", "Blocked time of a component in a step"),
    ("tunix.step.device_lag", "How long after a step's host window its device work finished"),
    ("tunix.component.device_time", "Time from a component's dispatch to its device completion"),
)
"""``(name, description)`` of each histogram made from the steps (unit ``s``, boundaries
:data:`~otel_tunix.model.metric_spec.SECONDS_BUCKETS`; attribute ``scope``, and ``component``
for ``tunix.component.*``). Both paths make them from this table."""

_DURATION, _BUSY, _BLOCKED, _IDLE, _C_BUSY, _C_BLOCKED, _DEVICE_LAG, _C_DEVICE = range(8)
_BOUNDS: Final = tuple(SECONDS_BUCKETS)
_OVERFLOW: Final = {"otel.metric.overflow": True}  # the SDK's overflow series
_INF = math.inf

Key = tuple[Any, ...]
"""A series: ``(instrument, scope)``, ``(instrument, scope, component)``, or
``(instrument,)`` for the overflow series."""


class _Series:
    """One series of one reader since its start (cumulative) or last collection (delta)."""

    __slots__ = ("attributes", "buckets", "count", "exemplars", "max", "min", "start_ns", "sum")

    def __init__(self, attributes: dict[str, Any], start_ns: int) -> None:
        self.attributes = attributes
        self.start_ns = start_ns
        self.count = 0
        self.sum = 0.0
        self.min = _INF
        self.max = -_INF
        self.buckets = [0] * (len(_BOUNDS) + 1)
        self.exemplars: dict[int, Exemplar] = {}


class _Reader:
    """What one reader has not collected yet, and how it collects."""

    __slots__ = ("cumulative", "last_collect_ns", "limit", "per_instrument", "series")

    def __init__(self, temporality: AggregationTemporality, limit: int) -> None:
        self.cumulative = temporality is AggregationTemporality.CUMULATIVE
        self.limit = limit
        self.series: dict[Key, _Series] = {}
        self.per_instrument = [0] * len(STEP_HISTOGRAMS)
        self.last_collect_ns = 0


class StepHistograms:
    """The step histograms of one run, folded per batch and produced for each reader.

    Args:
        readers: ``(reader, temporality, cardinality limit)`` for each reader to serve.
        scope: The instrumentation scope the histograms belong to (the meter's).
        resource: The provider's resource (for a collection that had nothing else).
        exemplars: Keep exemplars of ``tunix.step.duration`` (the ``trace_based`` filter).
    """

    def __init__(
        self,
        readers: Iterable[tuple[MetricReader, AggregationTemporality, int]],
        scope: InstrumentationScope,
        resource: Resource,
        *,
        exemplars: bool = True,
    ) -> None:
        self._readers = {r: _Reader(t, limit) for r, t, limit in readers}
        self._scope = scope
        self._resource = resource
        self._exemplars = exemplars
        self._attributes: dict[Key, dict[str, Any]] = {}
        self._lock = threading.Lock()
        at_fork_in_child(self._in_child)

    def _in_child(self) -> None:
        """A forked child: a fresh lock (the worker may have held it at the fork); its
        readers' collections, which the SDK restarts there, then never wait for it."""
        self._lock = threading.Lock()

    # --- the worker: a batch of steps ------------------------------------------------------
    def add(self, summaries: Sequence[StepSummary]) -> None:
        """Fold the values of a batch of steps into every reader's series."""
        values: dict[Key, list[float]] = {}
        samples: list[tuple[Key, float, int, int, int]] = []
        for s in summaries:
            sc = s.scope
            k = (_DURATION, sc)
            vs = values.get(k)
            if vs is None:
                vs = values[k] = []
                values[(_BUSY, sc)], values[(_BLOCKED, sc)], values[(_IDLE, sc)] = [], [], []
            vs.append(s.step_time_sec)
            values[(_BUSY, sc)].append(s.busy_time_sec)
            values[(_BLOCKED, sc)].append(s.blocked_time_sec)
            values[(_IDLE, sc)].append(s.idle_time_sec)
            if self._exemplars and s.span_id:
                tid = s.trace_id_int
                if tid:
                    samples.append((k, s.step_time_sec, s.end_ns, s.span_id, tid))
            for name, (busy, blocked, _) in s.component_times.items():
                if busy or not blocked:
                    _append(values, (_C_BUSY, sc, name), busy)
                if blocked:
                    _append(values, (_C_BLOCKED, sc, name), blocked)
            if s.device_end_ns:
                _append(values, (_DEVICE_LAG, sc), s.device_lag_sec)
                for name, seconds in (s.device_times or {}).items():
                    _append(values, (_C_DEVICE, sc, name), seconds)
        folded = [(k, *_fold(vs)) for k, vs in values.items()]
        exemplars = self._sample(samples)
        now = time.time_ns()
        with self._lock:
            for reader in self._readers.values():
                self._merge(reader, folded, exemplars, now)

    def _sample(self, samples: list[tuple[Key, float, int, int, int]]) -> dict[Key, dict[int, Any]]:
        """Per series and bucket, the last step that fell in it (the SDK's aligned-bucket
        reservoir: its last measurement per bucket)."""
        out: dict[Key, dict[int, Any]] = {}
        for k, v, t, sid, tid in samples:
            if 0 <= v < _INF:
                out.setdefault(k, {})[bisect.bisect_left(_BOUNDS, v)] = (v, t, sid, tid)
        return out

    def _merge(
        self,
        reader: _Reader,
        folded: list[tuple[Key, int, float, float, float, list[int]]],
        exemplars: dict[Key, dict[int, Any]],
        now: int,
    ) -> None:
        series = reader.series
        for k, count, total, lo, hi, buckets in folded:
            if not count:
                continue
            s = series.get(k)
            if s is None:
                s = self._new_series(reader, k, now)
            s.count += count
            s.sum += total
            if lo < s.min:
                s.min = lo
            if hi > s.max:
                s.max = hi
            s.buckets = [a + b for a, b in zip(s.buckets, buckets, strict=True)]
            for bucket, (v, t, sid, tid) in exemplars.get(k, {}).items():
                s.exemplars[bucket] = Exemplar({}, v, t, sid, tid)

    def _new_series(self, reader: _Reader, k: Key, now: int) -> _Series:
        i = k[0]
        if reader.per_instrument[i] >= reader.limit:  # as the SDK: one overflow series
            over = reader.series.get((i,))
            if over is not None:
                reader.series[k] = over
                return over
            k = (i,)
        a = self._attributes.get(k)
        if a is None:
            if len(k) == 1:
                a = dict(_OVERFLOW)
            elif len(k) == 2:
                a = {attr.METRIC_SCOPE: k[1]}
            else:
                a = {attr.METRIC_SCOPE: k[1], attr.METRIC_COMPONENT: k[2]}
            self._attributes[k] = a
        s = reader.series[k] = _Series(a, reader.last_collect_ns or now)
        reader.per_instrument[i] += 1
        return s

    # --- a reader collects -----------------------------------------------------------------
    def produce(self, reader: MetricReader, data: MetricsData | None) -> MetricsData | None:
        """``data`` (what the SDK collected for ``reader``) with the step histograms added
        to this scope's metrics. Never raises (an error is an internal one, reported once)."""
        try:
            metrics = self._collect(reader)
            return _with_metrics(data, metrics, self._scope, self._resource) if metrics else data
        except Exception:
            report_internal_error("the step histograms' collection")
            return data

    def _collect(self, reader: MetricReader) -> list[Metric]:
        state = self._readers.get(reader)
        if state is None:
            return []
        now = time.time_ns()
        with self._lock:
            series = state.series
            if state.cumulative:
                points = [(k, s, _point(s, now)) for k, s in series.items()]
                for s in series.values():
                    s.exemplars = {}
            else:
                points = [(k, s, _point(s, now)) for k, s in series.items()]
                state.series = {}
                state.per_instrument = [0] * len(STEP_HISTOGRAMS)
                state.last_collect_ns = now
        temporality = (
            AggregationTemporality.CUMULATIVE if state.cumulative else AggregationTemporality.DELTA
        )
        by_instrument: dict[int, list[HistogramDataPoint]] = {}
        seen: set[int] = set()
        for k, s, point in points:
            if id(s) in seen:  # an attribute set that went to the overflow series
                continue
            seen.add(id(s))
            by_instrument.setdefault(k[0], []).append(point)
        return [
            Metric(
                name=STEP_HISTOGRAMS[i][0],
                description=STEP_HISTOGRAMS[i][1],
                unit="s",
                data=Histogram(data_points=by_instrument[i], aggregation_temporality=temporality),
            )
            for i in sorted(by_instrument)
        ]


def _append(values: dict[Key, list[float]], k: Key, v: float) -> None:
    vs = values.get(k)
    if vs is None:
        values[k] = [v]
    else:
        vs.append(v)


def _fold(vs: list[float]) -> tuple[int, float, float, float, list[int]]:
    """count, sum, min, max and bucket counts of a series' values in a batch."""
    total = sum(vs)
    lo = min(vs)
    if not (lo >= 0 and math.isfinite(total)):  # NaN, an infinity or a negative among them
        vs = [v for v in vs if 0 <= v < _INF]
        if not vs:
            return 0, 0.0, _INF, -_INF, []
        total, lo = sum(vs), min(vs)
    buckets = [0] * (len(_BOUNDS) + 1)
    bl = bisect.bisect_left
    for v in vs:
        buckets[bl(_BOUNDS, v)] += 1
    return len(vs), total, lo, max(vs), buckets


def _point(s: _Series, now: int) -> HistogramDataPoint:
    return HistogramDataPoint(
        attributes=s.attributes,
        start_time_unix_nano=s.start_ns,
        time_unix_nano=now,
        count=s.count,
        sum=s.sum,
        bucket_counts=tuple(s.buckets),
        explicit_bounds=_BOUNDS,
        min=s.min,
        max=s.max,
        exemplars=[s.exemplars[b] for b in sorted(s.exemplars)],
    )


def _with_metrics(
    data: MetricsData | None,
    metrics: list[Metric],
    scope: InstrumentationScope,
    resource: Resource,
) -> MetricsData:
    """``data`` with ``metrics`` added to ``scope``'s metrics of its first resource."""
    if data is None or not data.resource_metrics:
        rm = ResourceMetrics(resource, [], resource.schema_url)
        rest: list[ResourceMetrics] = []
    else:
        rm, *rest = data.resource_metrics
    scopes = list(rm.scope_metrics)
    for i, sm in enumerate(scopes):
        if sm.scope == scope:
            scopes[i] = ScopeMetrics(sm.scope, [*sm.metrics, *metrics], sm.schema_url)
            break
    else:
        scopes.append(ScopeMetrics(scope, metrics, scope.schema_url))  # type: ignore[arg-type]
    return MetricsData([ResourceMetrics(rm.resource, scopes, rm.schema_url), *rest])


def step_histograms_for(
    meter_provider: Any,
    readers: Sequence[MetricReader],
    scope: InstrumentationScope,
    resource: Resource,
) -> StepHistograms | None:
    """Step histograms produced into ``readers`` (the readers ``meter_provider`` was built
    with), or ``None`` where they would not be what the SDK makes: views on the provider,
    an exemplar filter other than ``trace_based`` / ``always_off``, a reader asking for
    another histogram aggregation, or an SDK without the private names used."""
    exemplars = trace_based_exemplars(meter_provider)
    if exemplars is None or not readers:
        return None
    served = []
    for reader in readers:
        how = metric_reader_histograms(reader)
        if how is None:
            return None
        served.append((reader, *how))
    histograms = StepHistograms(served, scope, resource, exemplars=exemplars)
    for reader in readers:
        produce_into(reader, histograms.produce)
    return histograms
