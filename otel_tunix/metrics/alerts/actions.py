"""What an alert transition does: the side effects of the engine, one :class:`AlertAction`
each.

The :class:`~otel_tunix.metrics.alerts.engine.AlertEngine` calls every action's
:meth:`~AlertAction.on_transition` with each :class:`~otel_tunix.metrics.alerts.engine.Alert`
(a fire, a downgrade or a resolve: see ``Alert.fired`` / ``Alert.resolved``), in order,
outside its lock, and :meth:`~AlertAction.close` when it closes. An action that raises is
reported once and never stops the others nor the training loop.
"""

from __future__ import annotations

import json
import logging
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from opentelemetry import _logs, trace
from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.context import get_current as current_context

from otel_tunix.exporters.datadog import DatadogClient, datadog_enabled
from otel_tunix.logger.instruments import CatalogInstruments
from otel_tunix.metrics.profiling import PROFILE_PATH
from otel_tunix.model.alert_rules import Severity
from otel_tunix.recording.hot_path import get_runtime
from otel_tunix.recording.step_view import add_step_event
from otel_tunix.settings.version import __version__
from otel_tunix.support.errors import ReportOnce
from otel_tunix.support.linefile import LineFile, record_write_error

if TYPE_CHECKING:
    from otel_tunix.metrics.alerts.engine import Alert

__all__ = [
    "EVENT_NAME",
    "LOGGER_NAME",
    "AlertAction",
    "ConsoleAction",
    "CounterAction",
    "DatadogAction",
    "JsonlAction",
    "LogRecordAction",
    "SpanEventAction",
]

LOGGER_NAME = "otel_tunix.metrics.alerts"
"""The Python logger of the console warnings and failure reports (and the OTel logger's
scope): the package's name, whatever module logs."""

_logger = logging.getLogger(LOGGER_NAME)

EVENT_NAME = "tunix.alert"
"""Name of the span event and of the log record's event."""

_LOG_SEVERITY = {
    Severity.OK: ("INFO", 9),
    Severity.WARNING: ("WARN", 13),
    Severity.CRITICAL: ("ERROR", 17),
}


class AlertAction(ABC):
    """One thing the engine does on each transition of a rule on a metric."""

    name: ClassVar[str] = "action"
    """Names the action in the report of its failure."""

    @abstractmethod
    def on_transition(self, alert: Alert) -> None:
        """Act on ``alert``: a fire (``alert.fired``), a downgrade or a resolve
        (``alert.resolved``)."""

    def close(self) -> None:  # noqa: B027 (a no-op default, on purpose)
        """Release what the action holds (the engine is closing). Default: nothing."""


class SpanEventAction(AlertAction):
    """A ``tunix.alert`` event on the step span: the step open in the calling context, else
    the next sampled step that starts (``otel_tunix.recording.step_view.add_step_event``); while
    otel-tunix is off, the current span when it is a recording span of the application's."""

    name = "span"

    def on_transition(self, alert: Alert) -> None:
        if get_runtime() is not None:
            add_step_event(EVENT_NAME, alert.attributes())
            return
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event(EVENT_NAME, alert.attributes())


class LogRecordAction(AlertAction):
    """An OTel log record (``event_name="tunix.alert"``, WARN / ERROR, INFO when resolved)
    through the logs API, with the current context (so the current trace and span).

    Args:
        logger_provider: Default: the global one, read at the first record.
    """

    name = "log"

    def __init__(self, logger_provider: Any = None) -> None:
        self._logger_provider = logger_provider
        self._otel_logger: Any = None

    def on_transition(self, alert: Alert) -> None:
        if self._otel_logger is None:
            provider = self._logger_provider or _logs.get_logger_provider()
            self._otel_logger = provider.get_logger(LOGGER_NAME, __version__)
        text, number = _LOG_SEVERITY[alert.severity]
        fields: dict[str, Any] = {
            "timestamp": alert.time_ns,
            "observed_timestamp": alert.time_ns,
            "severity_text": text,
            "severity_number": SeverityNumber(number),
            "body": alert.message,
            "attributes": alert.attributes(),
        }
        try:
            record = LogRecord(context=current_context(), event_name=EVENT_NAME, **fields)
        except TypeError:  # opentelemetry-api < 1.35: no context / event_name
            ctx = trace.get_current_span().get_span_context()
            record = LogRecord(
                trace_id=ctx.trace_id,
                span_id=ctx.span_id,
                trace_flags=ctx.trace_flags,
                **fields,
            )
        self._otel_logger.emit(record)


class DatadogAction(AlertAction):
    """A Datadog service check ``tunix.alert.<rule>`` per transition, and an event when it
    fires or resolves.

    Args:
        datadog: A :class:`~otel_tunix.exporters.datadog.DatadogClient` (flushed at
            :meth:`close`), ``True`` (a client created at the first alert, closed at
            :meth:`close`), or ``None`` to create one only when ``datadog_enabled()``.
    """

    name = "datadog"

    def __init__(self, datadog: Any = None) -> None:
        self._opt = datadog
        self._client: Any = None
        self._owns_client = False
        self._resolved = datadog is False
        self._report = ReportOnce(_logger, logging.WARNING)

    def client(self) -> Any:
        """The client (``None``: Datadog is off)."""
        if not self._resolved:
            self._resolved = True
            opt = self._opt
            if opt is None or opt is True:
                if opt is True or datadog_enabled():
                    try:
                        self._client = DatadogClient()
                        self._owns_client = True
                    except ImportError as exc:
                        self._report("dd-import", f"otel-tunix: no Datadog alerts: {exc}")
            else:
                self._client = opt
        return self._client

    def on_transition(self, alert: Alert) -> None:
        dd = self.client()
        if dd is None:
            return
        tags = {"rule": alert.rule, "metric": alert.metric, "severity": alert.severity.name.lower()}
        if alert.step is not None:
            tags["step"] = str(alert.step)
        dd.service_check(
            f"tunix.alert.{alert.rule}", int(alert.severity), tags=tags, message=alert.message
        )
        if alert.fired or alert.resolved:
            kind = {Severity.CRITICAL: "error", Severity.WARNING: "warning"}.get(
                alert.severity, "success"
            )
            title = (
                f"otel-tunix: {alert.rule} {alert.severity.name.lower()}"
                if alert.fired
                else f"otel-tunix: {alert.rule} resolved"
            )
            profile = alert.extra.get(PROFILE_PATH)
            dd.event(
                title,
                alert.message + (f" (profile: {profile})" if profile else ""),
                alert_type=kind,
                tags=tags,
                aggregation_key=f"tunix.alert.{alert.rule}.{alert.metric}",
            )

    def close(self) -> None:
        """Flush the client given, close the one created here."""
        dd = self._client
        if dd is not None:
            try:
                dd.close() if self._owns_client else dd.flush()
            except Exception:
                self._report("dd-close", "otel-tunix: closing the alerts' Datadog client failed")


class ConsoleAction(AlertAction):
    """A warning (an error when critical) on the Python logger ``otel_tunix.metrics.alerts``
    when an episode starts or escalates, never per step."""

    name = "console"

    def on_transition(self, alert: Alert) -> None:
        if alert.fired:
            log = _logger.error if alert.severity is Severity.CRITICAL else _logger.warning
            log("%s", alert.message)


class CounterAction(AlertAction):
    """Counts ``tunix.alert.firings{rule, severity}`` when an alert fires.

    Args:
        meter_provider: Default: the current run's, read at the first firing.
    """

    name = "counter"

    def __init__(self, meter_provider: Any = None) -> None:
        self._meter_provider = meter_provider
        self._counter: CatalogInstruments | None = None

    def on_transition(self, alert: Alert) -> None:
        if not alert.fired:
            return
        if self._counter is None:
            self._counter = CatalogInstruments(self._meter_provider)
        self._counter.record(
            "tunix.alert.firings",
            1,
            {"rule": alert.rule, "severity": alert.severity.name.lower()},
        )


class JsonlAction(AlertAction):
    """Appends each transition as a JSON line to ``path`` (opened at the first one; the run
    folder's ``alerts.jsonl`` when installed with ``alerts.install()``)."""

    name = "jsonl"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: LineFile | None = None
        self._lock = threading.Lock()

    def on_transition(self, alert: Alert) -> None:
        with self._lock:
            if self._file is None:
                try:
                    self._file = LineFile(self.path)
                except OSError as exc:  # counted and reported once; tried again next time
                    record_write_error(self.path, exc, 1)
                    return
            rec = {"time_ns": alert.time_ns, **alert.attributes(), "message": alert.message}
            self._file.write(json.dumps(rec) + "\n")
            self._file.flush()  # whole lines; a full disk is counted, never raised

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
