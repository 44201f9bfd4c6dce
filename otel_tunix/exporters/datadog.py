"""Datadog through DogStatsD: an OTel metric exporter, per-step distributions, events.

Everything here talks to a Datadog Agent's DogStatsD server (UDP or a Unix socket) through
the official ``datadog`` package (``pip install 'otel-tunix[datadog]'``); no API key is
needed in the training process, the Agent holds it.

* :class:`DatadogMetricExporter` is a real OpenTelemetry ``MetricExporter`` (entry point
  ``datadog`` of ``opentelemetry_metrics_exporter``, so ``OTEL_METRICS_EXPORTER=datadog``
  works). It prefers DELTA temporality for counters and histograms and maps:

  ============================== =========================================================
  OTel data                      DogStatsD
  ============================== =========================================================
  monotonic Sum (Counter)        ``<name>`` count (``c``) of the interval's delta
  non-monotonic Sum, Gauge       ``<name>`` gauge (``g``) of the current value
  Histogram, ExponentialHisto.   ``<name>.count`` and ``<name>.sum`` counts;
                                 ``<name>.min``, ``<name>.max``, ``<name>.avg`` gauges;
                                 optionally ``<name>.bucket`` counts (``histogram_buckets``)
  ============================== =========================================================

  A DogStatsD ``distribution`` needs raw samples and an OTel histogram point only holds
  count / sum / min / max / bucket counts, so the exporter never invents samples; the names
  and types follow Datadog's own mapping of Prometheus histograms (``.count`` / ``.sum`` /
  ``.bucket`` as counts). True percentiles come from :class:`DatadogStepSink`.
* :class:`DatadogStepSink` sends each sampled step's busy / blocked / idle times as raw
  ``distribution`` samples, so Datadog computes exact percentiles across steps and hosts.
* :class:`DatadogClient` is the one configured DogStatsD connection; it also sends events
  and service checks (used by alerts).
* :func:`datadog_enabled` tells the core whether to add the exporter.

Tags: a data point's attributes become ``key:value`` tags, then a few resource attributes
(:data:`RESOURCE_TAGS`: ``service.name`` -> ``service``, ``deployment.environment(.name)``
-> ``env``, ``service.version`` -> ``version``, ``tunix.run.id`` -> ``run_id``,
``tunix.rank`` -> ``rank``, ``host.name`` -> ``host``), then the client's constant tags. For
``env`` / ``service`` / ``version`` (and any other key), a constructor argument or a
``constant_tags`` entry beats ``DD_ENV`` / ``DD_SERVICE`` / ``DD_VERSION`` (which the
``datadog`` client turns into constant tags itself), which beat the resource, so every key
appears once.

Connection: arguments ``host`` / ``port`` / ``socket_path``, else ``DD_DOGSTATSD_URL``
(``udp://host:port``, ``unix:///path``), else ``DD_AGENT_HOST`` / ``DD_DOGSTATSD_PORT``,
else ``localhost:8125``, as resolved by the ``datadog`` client. Sends are buffered and
handed to the client's background sender thread, so neither the training loop nor the
metric reader ever waits on the network; an Agent that is down only drops packets.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Final, Literal, TypedDict, Unpack

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
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource

from otel_tunix import attributes as attr
from otel_tunix.processors import StepSink
from otel_tunix.settings import load_settings

if TYPE_CHECKING:
    from datadog.dogstatsd import DogStatsd

    from otel_tunix.model import ScopeSession, StepSummary

__all__ = [
    "DATADOG_ENABLED",
    "RESOURCE_TAGS",
    "DatadogClient",
    "DatadogMetricExporter",
    "DatadogOptions",
    "DatadogStepSink",
    "ServiceCheckStatus",
    "datadog_enabled",
    "resource_tags",
]

_logger = logging.getLogger(__name__)

DATADOG_ENABLED: Final = "DATADOG_ENABLED"
"""``true`` / ``1`` / ``yes`` / ``on``: send metrics to DogStatsD (the switch of Signal's
Datadog integration). ``OTEL_METRICS_EXPORTER`` naming ``datadog`` does the same.
Default: off."""

RESOURCE_TAGS: Final[Mapping[str, str]] = {
    SERVICE_NAME: "service",
    "deployment.environment.name": "env",
    "deployment.environment": "env",
    SERVICE_VERSION: "version",
    attr.RUN_ID: "run_id",
    attr.RANK: "rank",
    "host.name": "host",
}
"""Resource attribute -> Datadog tag key. The first attribute present wins for a tag key;
``service``, ``env`` and ``version`` are Datadog's reserved unified-service tags and
``host`` sets the metric's host in the Agent."""

STEP_DURATION: Final = "tunix.step.duration"
STEP_BUSY_TIME: Final = "tunix.step.busy_time"
STEP_BLOCKED_TIME: Final = "tunix.step.blocked_time"
STEP_IDLE_TIME: Final = "tunix.step.idle_time"
COMPONENT_BUSY_TIME: Final = "tunix.component.busy_time"
COMPONENT_BLOCKED_TIME: Final = "tunix.component.blocked_time"

AlertType = Literal["error", "warning", "info", "success"]
TagsLike = Iterable[str] | Mapping[str, object] | None
"""Tags as ``"key:value"`` strings or as a mapping of key to value."""

_ALERT_TYPES: Final = frozenset({"error", "warning", "info", "success"})
_EVENT_TEXT_MAX: Final = 4000
"""Datadog truncates event text at 4000 characters; cut it here so the payload stays small."""
_SENDER_QUEUE_SIZE: Final = 4096
"""Packets the background sender may hold; a full queue drops instead of blocking."""
_CLOSE_TIMEOUT_SEC: Final = 5.0
_DELTA_PREFERENCE: Final[Mapping[type, AggregationTemporality]] = {
    Counter: AggregationTemporality.DELTA,
    ObservableCounter: AggregationTemporality.DELTA,
    Histogram: AggregationTemporality.DELTA,
}
"""Counters and histograms as deltas; up-down counters and gauges stay cumulative (the SDK
default), which is their current value."""


class ServiceCheckStatus(IntEnum):
    """Status of a Datadog service check."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3


class DatadogOptions(TypedDict, total=False):
    """Keyword options of :class:`DatadogClient`, also accepted by the exporter and sink."""

    host: str
    """DogStatsD host. Default: ``DD_AGENT_HOST`` or ``localhost``."""
    port: int
    """DogStatsD UDP port. Default: ``DD_DOGSTATSD_PORT`` or ``8125``."""
    socket_path: str
    """Unix socket path, or a ``unix://``, ``unixgram://`` or ``unixstream://`` URL."""
    namespace: str
    """Prefix of every metric name (``<namespace>.<name>``). Default: none."""
    constant_tags: Iterable[str] | Mapping[str, object]
    """Tags added to every metric, event and service check."""
    env: str
    """The ``env`` tag. Default: ``DD_ENV``, else the resource's deployment environment."""
    service: str
    """The ``service`` tag. Default: ``DD_SERVICE``, else the resource's ``service.name``."""
    version: str
    """The ``version`` tag. Default: ``DD_VERSION``, else the resource's ``service.version``."""


def datadog_enabled() -> bool:
    """Whether the environment asks for metrics in Datadog.

    True when ``DATADOG_ENABLED`` is truthy (``1``, ``true``, ``yes``, ``on``) or when
    ``OTEL_METRICS_EXPORTER`` (a comma-separated list) names ``datadog``.

    Returns:
        True if a :class:`DatadogMetricExporter` should be added.
    """
    settings = load_settings()
    return settings.datadog_enabled or "datadog" in (settings.metrics_exporter or ())


def _tag_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _tag_list(tags: TagsLike) -> list[str]:
    """``"key:value"`` strings from a list of tags or a mapping (sequence values repeat)."""
    if tags is None:
        return []
    if isinstance(tags, str):
        return [tags]
    if isinstance(tags, Mapping):
        out: list[str] = []
        for key, value in tags.items():
            if isinstance(value, list | tuple):
                out.extend(f"{key}:{_tag_value(v)}" for v in value)
            else:
                out.append(f"{key}:{_tag_value(value)}")
        return out
    return [str(tag) for tag in tags]


def _tag_key(tag: str) -> str:
    return tag.split(":", 1)[0]


def resource_tags(resource: Resource | None, *, exclude: Iterable[str] = ()) -> list[str]:
    """Datadog tags of a resource, following :data:`RESOURCE_TAGS`.

    The SDK's placeholder ``unknown_service...`` service name is not turned into a tag.

    Args:
        resource: The OTel resource (``None`` gives no tags).
        exclude: Tag keys that are already set elsewhere (constant tags), skipped here.

    Returns:
        ``"key:value"`` strings, at most one per tag key.
    """
    if resource is None:
        return []
    taken = set(exclude)
    out: list[str] = []
    for key, tag in RESOURCE_TAGS.items():
        value = resource.attributes.get(key)
        if tag in taken or value is None or value == "":
            continue
        if key == SERVICE_NAME and str(value).startswith("unknown_service"):
            continue
        taken.add(tag)
        out.append(f"{tag}:{_tag_value(value)}")
    return out


class _RepeatFilter(logging.Filter):
    """Lets one WARNING per message through per interval on the ``datadog.dogstatsd`` logger.

    With no Agent listening, the client warns on every failed send (several times a second
    with per-step distributions); one line every few minutes says the same.
    """

    def __init__(self, interval_sec: float = 300.0) -> None:
        super().__init__()
        self._interval = interval_sec
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        key = str(record.msg)
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._interval:
                return False
            self._last[key] = now
        return True


_repeat_filter_lock = threading.Lock()
_repeat_filter: _RepeatFilter | None = None


def _install_repeat_filter() -> None:
    global _repeat_filter
    with _repeat_filter_lock:
        if _repeat_filter is None:
            _repeat_filter = _RepeatFilter()
            logging.getLogger("datadog.dogstatsd").addFilter(_repeat_filter)


class _Reporter:
    """Logs each kind of failure (of DogStatsD, or of a value given) once per owner object:
    :class:`otel_tunix._errors.ReportOnce` at warning level, the traceback optional."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, key: str, msg: str, *args: object, exc_info: bool = False) -> None:
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        _logger.warning(msg, *args, exc_info=exc_info)


class DatadogClient:
    """One configured DogStatsD connection, shared by the exporter, the step sink and alerts.

    Sends are buffered into datagrams and handed to the ``datadog`` client's background
    sender thread (a bounded queue that drops when full), so no call here waits on the
    network. Events and service checks never raise.

    Args:
        host: DogStatsD host. Default: ``DD_AGENT_HOST`` or ``localhost``.
        port: DogStatsD UDP port. Default: ``DD_DOGSTATSD_PORT`` or ``8125``.
        socket_path: Unix socket path or ``unix://`` URL; used instead of UDP.
        namespace: Prefix of every metric name.
        constant_tags: Tags on every metric, event and service check.
        env: The ``env`` tag; beats ``DD_ENV``.
        service: The ``service`` tag; beats ``DD_SERVICE``.
        version: The ``version`` tag; beats ``DD_VERSION``.
        statsd: An already configured ``datadog.dogstatsd.DogStatsd`` to use as it is
            (no other argument may be given with it); it is flushed but not stopped by
            :meth:`close`.

    Raises:
        ImportError: The ``datadog`` package is not installed.
        ValueError: ``port`` is out of range, or ``statsd`` is combined with other options.
    """

    def __init__(
        self,
        *,
        host: str | None = None,
        port: int | None = None,
        socket_path: str | None = None,
        namespace: str | None = None,
        constant_tags: Iterable[str] | Mapping[str, object] | None = None,
        env: str | None = None,
        service: str | None = None,
        version: str | None = None,
        statsd: DogStatsd | None = None,
    ) -> None:
        self._report = _Reporter()
        self._closed = False
        if statsd is not None:
            given = {
                "host": host,
                "port": port,
                "socket_path": socket_path,
                "namespace": namespace,
                "constant_tags": constant_tags,
                "env": env,
                "service": service,
                "version": version,
            }
            extra = sorted(k for k, v in given.items() if v is not None)
            if extra:
                raise ValueError(
                    f"DatadogClient: statsd= is an already configured client; "
                    f"do not also pass {', '.join(extra)}"
                )
            self._statsd = statsd
            self._owns_statsd = False
            return
        if port is not None and not 0 < int(port) < 65536:
            raise ValueError(f"DatadogClient: port must be 1..65535, got {port!r}")
        try:
            from datadog.dogstatsd import DogStatsd
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "the Datadog exporter needs the datadog package: pip install 'otel-tunix[datadog]'"
            ) from exc
        _install_repeat_filter()
        self._statsd = DogStatsd(
            host=host,
            port=port,
            socket_path=socket_path,
            namespace=namespace,
            disable_buffering=False,
            disable_background_sender=False,
            sender_queue_size=_SENDER_QUEUE_SIZE,
            sender_queue_timeout=0,
        )
        self._owns_statsd = True
        # The client already added DATADOG_TAGS and DD_ENV / DD_SERVICE / DD_VERSION; our
        # arguments replace any of those with the same key instead of adding a second value.
        ours = _tag_list(constant_tags)
        ours += [
            f"{key}:{value}"
            for key, value in (("env", env), ("service", service), ("version", version))
            if value
        ]
        ours_keys = {_tag_key(t) for t in ours}
        from_env = [t for t in self._statsd.constant_tags if _tag_key(t) not in ours_keys]
        self._statsd.constant_tags = ours + from_env

    @property
    def statsd(self) -> DogStatsd:
        """The underlying ``datadog.dogstatsd.DogStatsd``."""
        return self._statsd

    @property
    def constant_tags(self) -> list[str]:
        """Tags the client adds to everything it sends."""
        return list(self._statsd.constant_tags or [])

    def tag_keys(self) -> set[str]:
        """Keys of :attr:`constant_tags` (resource tags with these keys are not added)."""
        return {_tag_key(t) for t in self.constant_tags}

    def event(
        self,
        title: str,
        text: str,
        *,
        alert_type: AlertType = "info",
        tags: TagsLike = None,
        aggregation_key: str | None = None,
        priority: Literal["normal", "low"] | None = None,
        source_type_name: str | None = None,
        hostname: str | None = None,
        date_happened: int | None = None,
    ) -> None:
        """Send a Datadog event (it shows in the event stream and can feed monitors).

        Never raises: an unknown ``alert_type`` is sent as ``info`` and a send error is
        logged once.

        Args:
            title: Event title.
            text: Event body; newlines are kept, text past 4000 characters is cut.
            alert_type: ``error``, ``warning``, ``info`` or ``success``.
            tags: Extra tags (strings or a mapping), added to the constant tags.
            aggregation_key: Events with the same key are grouped in the event stream.
            priority: ``normal`` or ``low``.
            source_type_name: Source type shown in Datadog.
            hostname: Host to attach the event to (default: the Agent's host).
            date_happened: Unix seconds; default now.
        """
        try:
            if alert_type not in _ALERT_TYPES:
                self._report(
                    f"alert_type:{alert_type}",
                    "Datadog event alert_type %r is not one of %s; sent as 'info'",
                    alert_type,
                    sorted(_ALERT_TYPES),
                )
                alert_type = "info"
            self._statsd.event(
                title,
                text[:_EVENT_TEXT_MAX],
                alert_type=alert_type,
                aggregation_key=aggregation_key,
                source_type_name=source_type_name,
                date_happened=date_happened,
                priority=priority,
                tags=_tag_list(tags) or None,
                hostname=hostname,
            )
        except Exception:
            self._report("event", "could not send Datadog event %r", title, exc_info=True)

    def service_check(
        self,
        name: str,
        status: ServiceCheckStatus | int | str,
        *,
        tags: TagsLike = None,
        message: str | None = None,
        hostname: str | None = None,
        timestamp: int | None = None,
    ) -> None:
        """Send a Datadog service check run.

        Never raises: an unknown status is sent as ``UNKNOWN`` and a send error is logged
        once.

        Args:
            name: Check name, e.g. ``tunix.rl.kl_divergence``.
            status: 0..3 or ``OK`` / ``WARNING`` / ``CRITICAL`` / ``UNKNOWN`` (any case).
            tags: Extra tags (strings or a mapping), added to the constant tags.
            message: Text shown with the check.
            hostname: Host to attach the check to (default: the Agent's host).
            timestamp: Unix seconds; default now.
        """
        try:
            try:
                if isinstance(status, str):
                    level = ServiceCheckStatus[status.strip().upper()]
                else:
                    level = ServiceCheckStatus(int(status))
            except (KeyError, ValueError, TypeError):
                self._report(
                    f"status:{status}",
                    "Datadog service check status %r is not 0..3 or OK/WARNING/CRITICAL/"
                    "UNKNOWN; sent as UNKNOWN",
                    status,
                )
                level = ServiceCheckStatus.UNKNOWN
            self._statsd.service_check(
                name,
                int(level),
                tags=_tag_list(tags) or None,
                timestamp=timestamp,
                hostname=hostname,
                message=message,
            )
        except Exception:
            self._report(
                "service_check", "could not send Datadog service check %r", name, exc_info=True
            )

    def flush(self, timeout_sec: float | None = _CLOSE_TIMEOUT_SEC) -> bool:
        """Send what is buffered and wait (at most ``timeout_sec``) until it left the process.

        Returns:
            True if everything was sent or dropped in time.
        """
        try:
            return bool(self._statsd.wait_for_pending(timeout_sec))
        except Exception:
            self._report("flush", "flushing the DogStatsD client failed", exc_info=True)
            return False

    def close(self, timeout_sec: float | None = _CLOSE_TIMEOUT_SEC) -> bool:
        """Flush, then stop the client's threads and close its socket (idempotent).

        A client passed in as ``statsd=`` is only flushed.

        Returns:
            True if everything pending was sent in time.
        """
        if self._closed:
            return True
        self._closed = True
        if not self._owns_statsd:
            return self.flush(timeout_sec)
        try:
            return bool(self._statsd.stop(timeout_sec))
        except Exception:
            self._report("close", "stopping the DogStatsD client failed", exc_info=True)
            return False


def _resolve_client(
    client: DatadogClient | None, options: DatadogOptions, owner: str
) -> tuple[DatadogClient, bool]:
    """The client to use and whether the caller owns (and so closes) it."""
    if client is not None:
        if options:
            raise ValueError(
                f"{owner}: pass either client= or connection options "
                f"({', '.join(sorted(options))}), not both"
            )
        return client, False
    return DatadogClient(**options), True


def _send(method: Callable[..., Any], name: str, value: float, tags: list[str]) -> None:
    """One DogStatsD call; NaN and infinities are skipped (DogStatsD cannot parse them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return
    method(name, value, tags=tags)


def _bound(value: float) -> str:
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.15g}".replace("+", "")


def _stream_key(name: str, attributes: Mapping[str, Any] | None) -> tuple[object, ...]:
    return (name, *sorted((k, repr(v)) for k, v in (attributes or {}).items()))


class DatadogMetricExporter(MetricExporter):
    """OpenTelemetry metric exporter that writes DogStatsD (see the module docstring).

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


class DatadogStepSink(StepSink):
    """Sends every sampled step's times as raw DogStatsD ``distribution`` samples.

    Datadog builds the distribution from every sample of every rank and host, so p50 / p95 /
    p99 of step and component times are exact, which OTel histograms cannot give over
    DogStatsD. Metrics (seconds): ``tunix.step.duration``, ``tunix.step.busy_time``,
    ``tunix.step.blocked_time``, ``tunix.step.idle_time`` tagged ``scope``, and
    ``tunix.component.busy_time`` / ``tunix.component.blocked_time`` tagged ``scope`` and
    ``component`` (only the kinds a component had in that step). No method raises.

    Args:
        client: A shared :class:`DatadogClient` (flushed, not closed, by :meth:`close`).
            Default: a new client from ``options`` and the environment.
        resource: The run's OTel resource; mapped to tags as in :func:`resource_tags`.
        tags: Extra tags on every sample.
        **options: :class:`DatadogOptions` for a new client.

    Raises:
        ValueError: ``client`` combined with options, or an invalid option.
    """

    def __init__(
        self,
        client: DatadogClient | None = None,
        *,
        resource: Resource | None = None,
        tags: TagsLike = None,
        **options: Unpack[DatadogOptions],
    ) -> None:
        self._client, self._owns_client = _resolve_client(client, options, "DatadogStepSink")
        extra = _tag_list(tags)
        taken = self._client.tag_keys() | {_tag_key(t) for t in extra}
        self._base_tags = extra + resource_tags(resource, exclude=taken)
        self._scope_tags: dict[str, list[str]] = {}
        self._component_tags: dict[tuple[str, str], list[str]] = {}
        self._report = _Reporter()
        self._closed = False

    @property
    def client(self) -> DatadogClient:
        """The DogStatsD client (for events and service checks)."""
        return self._client

    def on_step(self, summary: StepSummary) -> None:
        """Send the step's busy / blocked / idle times and its components' times."""
        if self._closed:
            return
        try:
            send = self._client.statsd.distribution
            scope = summary.scope
            tags = self._scope_tags.get(scope)
            if tags is None:
                tags = self._scope_tags.setdefault(
                    scope, [*self._base_tags, f"{attr.METRIC_SCOPE}:{scope}"]
                )
            _send(send, STEP_DURATION, summary.step_time_sec, tags)
            _send(send, STEP_BUSY_TIME, summary.busy_time_sec, tags)
            _send(send, STEP_BLOCKED_TIME, summary.blocked_time_sec, tags)
            _send(send, STEP_IDLE_TIME, summary.idle_time_sec, tags)
            kinds: dict[str, set[str]] = {}
            for span in summary.spans:
                kinds.setdefault(span.name, set()).add(span.kind)
            for component, (busy, blocked, _) in summary.component_times.items():
                ctags = self._component_tags.get((scope, component))
                if ctags is None:
                    ctags = self._component_tags.setdefault(
                        (scope, component), [*tags, f"{attr.METRIC_COMPONENT}:{component}"]
                    )
                seen = kinds.get(component)
                if seen is None:  # no span list: infer the kinds from the times
                    seen = set()
                    if busy > 0 or blocked == 0:
                        seen.add(attr.KIND_BUSY)
                    if blocked > 0:
                        seen.add(attr.KIND_BLOCKED)
                if attr.KIND_BUSY in seen:
                    _send(send, COMPONENT_BUSY_TIME, busy, ctags)
                if attr.KIND_BLOCKED in seen:
                    _send(send, COMPONENT_BLOCKED_TIME, blocked, ctags)
        except Exception:
            self._report("on_step", "Datadog step sink failed to send a step", exc_info=True)

    def on_session(self, sessions: list[ScopeSession]) -> None:
        """Nothing to send: session totals are sums of the per-step samples already sent."""
        return None

    def close(self) -> None:
        """Flush and, if this sink created its client, stop it (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            self._client.close()
        else:
            self._client.flush()
