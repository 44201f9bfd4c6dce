"""The OpenTelemetry metric exporter to DogStatsD (the mapping is in
:mod:`otel_tunix.exporters.datadog`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, Unpack

from opentelemetry.sdk.metrics import Counter, Histogram, ObservableCounter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    ExponentialHistogram,
    Gauge,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    Sum,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData
from opentelemetry.sdk.resources import Resource

from otel_tunix.exporters.datadog.client import (
    _CLOSE_TIMEOUT_SEC,
    DatadogClient,
    DatadogOptions,
    _Reporter,
    _resolve_client,
    _send,
)
from otel_tunix.exporters.datadog.tags import _tag_list, resource_tags

__all__ = ["DatadogMetricExporter"]

_DELTA_PREFERENCE: Final[Mapping[type, AggregationTemporality]] = {
    Counter: AggregationTemporality.DELTA,
    ObservableCounter: AggregationTemporality.DELTA,
    Histogram: AggregationTemporality.DELTA,
}
"""Counters and histograms as deltas; up-down counters and gauges stay cumulative (the SDK
default), which is their current value."""


def _bound(value: float) -> str:
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.15g}".replace("+", "")


def _stream_key(name: str, attributes: Mapping[str, Any] | None) -> tuple[object, ...]:
    return (name, *sorted((k, repr(v)) for k, v in (attributes or {}).items()))


class DatadogMetricExporter(MetricExporter):
    """OpenTelemetry metric exporter that writes DogStatsD (see the package docstring).

    Constructible with no arguments (the ``datadog`` entry point of
    ``opentelemetry_metrics_exporter``); wrap it in a ``PeriodicExportingMetricReader``.
    ``export()`` never raises and never waits on the network.

    Args:
        client: A shared :class:`DatadogClient`; it is flushed, not closed, on shutdown.
            Default: a new client built from ``options`` and the environment.
        histogram_buckets: Also send each non-empty bucket of explicit-bucket histograms as
            ``<name>.bucket`` counts tagged ``lower_bound`` / ``upper_bound``.
        **options: :class:`DatadogOptions` for a new client (``host``, ``port``,
            ``socket_path``, ``namespace``, ``constant_tags``, ``env``, ``service``,
            ``version``).

    Raises:
        ValueError: ``client`` combined with options, or an invalid option.
    """

    def __init__(
        self,
        client: DatadogClient | None = None,
        *,
        histogram_buckets: bool = False,
        **options: Unpack[DatadogOptions],
    ) -> None:
        super().__init__(preferred_temporality=dict(_DELTA_PREFERENCE))
        self._client, self._owns_client = _resolve_client(client, options, "DatadogMetricExporter")
        self._histogram_buckets = histogram_buckets
        self._report = _Reporter()
        self._shutdown = False
        self._last_resource: Resource | None = None
        self._last_resource_tags: list[str] = []
        # Last cumulative values per stream, used only if cumulative data arrives anyway.
        self._cumulative: dict[tuple[object, ...], tuple[int, tuple[float, ...]]] = {}

    @property
    def client(self) -> DatadogClient:
        """The DogStatsD client (for events and service checks)."""
        return self._client

    def export(
        self,
        metrics_data: MetricsData,
        timeout_millis: float = 10_000,
        **kwargs: Any,
    ) -> MetricExportResult:
        """Translate one collection to DogStatsD packets and hand them to the sender.

        Returns:
            ``SUCCESS``, or ``FAILURE`` (logged once) after shutdown or on an internal error.
        """
        if self._shutdown:
            return MetricExportResult.FAILURE
        try:
            for resource_metrics in metrics_data.resource_metrics:
                base_tags = self._tags_of(resource_metrics.resource)
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        self._export_metric(metric, base_tags)
            self._client.statsd.flush()
        except Exception:
            self._report("export", "Datadog metric export failed", exc_info=True)
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Wait until the packets handed over so far have left the process."""
        return self._client.flush(timeout_millis / 1000)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Flush and, if this exporter created its client, stop it (idempotent)."""
        if self._shutdown:
            return
        self._shutdown = True
        timeout = min(timeout_millis / 1000, _CLOSE_TIMEOUT_SEC)
        if self._owns_client:
            self._client.close(timeout)
        else:
            self._client.flush(timeout)

    # --- mapping -----------------------------------------------------------------------

    def _tags_of(self, resource: Resource) -> list[str]:
        if resource is not self._last_resource:
            self._last_resource = resource
            self._last_resource_tags = resource_tags(resource, exclude=self._client.tag_keys())
        return self._last_resource_tags

    def _export_metric(self, metric: Metric, base_tags: list[str]) -> None:
        statsd = self._client.statsd
        data = metric.data
        name = metric.name
        if isinstance(data, Sum):
            cumulative = data.aggregation_temporality == AggregationTemporality.CUMULATIVE
            for point in data.data_points:
                tags = _tag_list(point.attributes) + base_tags
                if not data.is_monotonic:
                    _send(statsd.gauge, name, point.value, tags)
                    continue
                value = point.value
                if cumulative:
                    value = self._delta(
                        name, point.attributes, point.start_time_unix_nano, (value,)
                    )[0]
                _send(statsd.count, name, value, tags)
        elif isinstance(data, Gauge):
            for point in data.data_points:
                _send(statsd.gauge, name, point.value, _tag_list(point.attributes) + base_tags)
        elif isinstance(data, HistogramData | ExponentialHistogram):
            cumulative = data.aggregation_temporality == AggregationTemporality.CUMULATIVE
            for hist_point in data.data_points:
                self._export_histogram_point(name, hist_point, cumulative, base_tags)
        else:
            self._report(
                f"type:{type(data).__name__}",
                "Datadog exporter skips metric %r: unsupported data type %s",
                name,
                type(data).__name__,
            )

    def _export_histogram_point(
        self, name: str, point: Any, cumulative: bool, base_tags: list[str]
    ) -> None:
        statsd = self._client.statsd
        tags = _tag_list(point.attributes) + base_tags
        buckets: tuple[float, ...] = ()
        if self._histogram_buckets and isinstance(point, HistogramDataPoint):
            buckets = tuple(float(c) for c in point.bucket_counts)
        count, total, *bucket_counts = (float(point.count), float(point.sum), *buckets)
        if cumulative:
            # min / max of a cumulative point cover the whole run, not this interval.
            count, total, *bucket_counts = self._delta(
                name, point.attributes, point.start_time_unix_nano, (count, total, *buckets)
            )
        _send(statsd.count, f"{name}.count", int(count), tags)
        _send(statsd.count, f"{name}.sum", total, tags)
        if count > 0:
            _send(statsd.gauge, f"{name}.avg", total / count, tags)
            if not cumulative:
                _send(statsd.gauge, f"{name}.min", float(point.min), tags)
                _send(statsd.gauge, f"{name}.max", float(point.max), tags)
        if bucket_counts:
            bounds = [-math.inf, *point.explicit_bounds, math.inf]
            for i, n in enumerate(bucket_counts):
                if n > 0:
                    bucket_tags = [
                        *tags,
                        f"lower_bound:{_bound(bounds[i])}",
                        f"upper_bound:{_bound(bounds[i + 1])}",
                    ]
                    _send(statsd.count, f"{name}.bucket", int(n), bucket_tags)

    def _delta(
        self,
        name: str,
        attributes: Mapping[str, Any] | None,
        start_time: int,
        values: tuple[float, ...],
    ) -> tuple[float, ...]:
        """Interval values from cumulative ones (a new start time means a reset)."""
        key = _stream_key(name, attributes)
        previous = self._cumulative.get(key)
        self._cumulative[key] = (start_time, values)
        if previous is None or previous[0] != start_time or len(previous[1]) != len(values):
            return values
        return tuple(v - p for v, p in zip(values, previous[1], strict=True))
