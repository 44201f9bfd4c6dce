"""The DogStatsD connection: :class:`DatadogClient`, its options, and :func:`datadog_enabled`.

Also the helpers shared by the exporter and the step sink: the once-per-failure reporter,
the filter that rate-limits the ``datadog`` client's own warnings, and one guarded send.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Final, Literal, TypedDict

from otel_tunix.exporters.datadog.tags import TagsLike, _tag_key, _tag_list
from otel_tunix.settings.values import load_settings

if TYPE_CHECKING:
    from datadog.dogstatsd import DogStatsd

__all__ = [
    "DATADOG_ENABLED",
    "AlertType",
    "DatadogClient",
    "DatadogOptions",
    "ServiceCheckStatus",
    "datadog_enabled",
]

# The package's logger (as before it was split into modules), for every module of it.
_logger = logging.getLogger("otel_tunix.exporters.datadog")

DATADOG_ENABLED: Final = "DATADOG_ENABLED"
"""``true`` / ``1`` / ``yes`` / ``on``: send metrics to DogStatsD (the switch of Signal's
Datadog integration). ``OTEL_METRICS_EXPORTER`` naming ``datadog`` does the same.
Default: off."""

AlertType = Literal["error", "warning", "info", "success"]

_ALERT_TYPES: Final = frozenset({"error", "warning", "info", "success"})
_EVENT_TEXT_MAX: Final = 4000
"""Datadog truncates event text at 4000 characters; cut it here so the payload stays small."""
_SENDER_QUEUE_SIZE: Final = 4096
"""Packets the background sender may hold; a full queue drops instead of blocking."""
_CLOSE_TIMEOUT_SEC: Final = 5.0


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
    return load_settings().datadog_wanted


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
    :class:`otel_tunix.support.errors.ReportOnce` at warning level, the traceback optional."""

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
