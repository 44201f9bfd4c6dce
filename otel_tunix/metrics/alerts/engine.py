"""The alert engine: one state per (rule, metric name), transitions with ``consecutive`` and
hysteresis, and the :class:`Alert` each transition makes (what it then does is
:mod:`~otel_tunix.metrics.alerts.actions`).

The evaluation runs on every logged scalar some rule watches: keep it cheap.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import operator
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_tunix.logger.backend import LoggingBackend, row_names
from otel_tunix.logger.perf_rows import PerfRows, perf_value
from otel_tunix.metrics.alerts.actions import (
    LOGGER_NAME,
    AlertAction,
    ConsoleAction,
    CounterAction,
    DatadogAction,
    JsonlAction,
    LogRecordAction,
    SpanEventAction,
)
from otel_tunix.metrics.profiling import PROFILE_PATH
from otel_tunix.model.alert_rules import SAME_QUANTITY, Rule, Severity, _Window, default_rules
from otel_tunix.support.errors import ReportOnce

__all__ = ["Alert", "AlertEngine"]

_logger = logging.getLogger(LOGGER_NAME)

_OK = Severity.OK  # read per evaluated value: a module global is the cheapest lookup


# --- alerts and the engine -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Alert:
    """A transition of one rule on one metric."""

    rule: str
    metric: str
    severity: Severity
    previous: Severity
    value: float
    step: int | None
    condition: str
    message: str
    time_ns: int = field(default_factory=time.time_ns)
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Attributes of a detector's own (the straggler's slowest steps' trace ids)."""

    @property
    def fired(self) -> bool:
        """True for a new episode or an escalation."""
        return self.severity > self.previous

    @property
    def resolved(self) -> bool:
        """True when the metric is back to OK."""
        return self.severity is Severity.OK

    def attributes(self) -> dict[str, Any]:
        """Attributes of the span event and the log record."""
        a: dict[str, Any] = {
            "tunix.alert.rule": self.rule,
            "tunix.alert.metric": self.metric,
            "tunix.alert.severity": self.severity.name.lower(),
            "tunix.alert.previous_severity": self.previous.name.lower(),
            "tunix.alert.value": self.value,
            "tunix.alert.condition": self.condition,
        }
        if self.step is not None:
            a["tunix.alert.step"] = self.step
        if self.extra:
            a.update(self.extra)
        return a


@dataclass(slots=True)
class _Series:
    level: Severity = Severity.OK
    streak_warning: int = 0
    streak_critical: int = 0
    history: deque[float] = field(default_factory=deque)


_MAX_NAME_SETS = 1024
"""Sets of names whose watched names are kept (bounded: names made up per step)."""


class AlertEngine(LoggingBackend):
    """Evaluates rules on logged scalars and acts on transitions (see
    :mod:`otel_tunix.metrics.alerts`).

    It is a MetricsLogger backend (``log_scalar`` / ``log_scalars`` / ``close``) and can also
    be fed directly with :meth:`observe`.

    As a MetricsLogger backend it runs on the caller's thread (``on_callers_thread``): an
    alert's event goes on the step open where the value was logged, its log record carries
    that context, its time is the log call's.

    Args:
        rules: Default: :func:`default_rules`.
        logger_provider: OTel ``LoggerProvider`` for the log records; default: the global
            one (a no-op until the application or otel-tunix sets an SDK provider).
        meter_provider: For ``tunix.alert.firings``; default: the current run's.
        datadog: A :class:`~otel_tunix.exporters.datadog.DatadogClient`, ``True``/``False``,
            or ``None`` to follow ``datadog_enabled()``.
        console: Warn on the console (Python logging, logger ``otel_tunix.metrics.alerts``)
            when an episode starts or escalates.
        span_events: Add ``tunix.alert`` events to step spans.
        history_size: Transitions kept in :attr:`history`.
        jsonl_path: Also append each transition as a JSON line to this file (the run
            folder's ``alerts.jsonl`` when installed with
            :func:`~otel_tunix.metrics.alerts.install`).
    """

    on_callers_thread = True

    def __init__(
        self,
        rules: Iterable[Rule] | None = None,
        *,
        logger_provider: Any = None,
        meter_provider: Any = None,
        datadog: Any = None,
        console: bool = True,
        span_events: bool = True,
        history_size: int = 1000,
        jsonl_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.rules: list[Rule] = list(default_rules() if rules is None else rules)
        names = [r.name for r in self.rules]
        if len(set(names)) != len(names):
            raise ValueError(f"rule names must be unique: {names}")
        self._series: dict[tuple[str, str], _Series] = {}
        self._routes: dict[str, list[tuple[Rule, _Series]]] = {}
        """Per metric name: the rules that watch it, each with its series."""
        self._watched_by_names: dict[tuple[str, ...], list[tuple[str, Any]]] = {}
        """Per set of names logged together: those some rule watches, with their rules."""
        self._lock = threading.Lock()  # never taken twice: actions run outside it
        self.history: deque[Alert] = deque(maxlen=history_size)
        self.jsonl_path = Path(jsonl_path) if jsonl_path is not None else None
        self.actions: list[AlertAction] = []
        """What each transition does, in order (see :mod:`~otel_tunix.metrics.alerts.actions`)."""
        if span_events:
            self.actions.append(SpanEventAction())
        self.actions.append(LogRecordAction(logger_provider))
        if datadog is not False:
            self.actions.append(DatadogAction(datadog))
        if console:
            self.actions.append(ConsoleAction())
        self.actions.append(CounterAction(meter_provider))
        if self.jsonl_path is not None:
            self.actions.append(JsonlAction(self.jsonl_path))
        self._report = ReportOnce(_logger, logging.WARNING)
        self._closed = False
        self.profiles: Any = None
        """The run's profile captures (:class:`~otel_tunix.metrics.profiling.ProfileCaptures`):
        an alert that fires asks for one, and names it (``tunix.profile.path``) in every
        action. ``None``: alerts capture nothing."""

    # --- evaluation ---------------------------------------------------------------------
    def _routes_for(self, metric: str) -> list[tuple[Rule, _Series]]:
        routes = self._routes.get(metric)
        if routes is None:
            routes = []
            with self._lock:
                for rule in self.rules:
                    if rule.matches(metric):
                        key = (rule.name, metric)
                        s = self._series.get(key)
                        if s is None:
                            s = self._series[key] = _Series(history=_Window(max(rule.window, 1)))
                        routes.append((rule, s))
            self._routes[metric] = routes
        return routes

    def observe(self, metric: str, value: float, step: int | None = None) -> list[Alert]:
        """Evaluate one value; returns the transitions it caused (usually none)."""
        return self._evaluate_rows(((step, {metric: value}),))

    def _evaluate_rows(self, rows: Iterable[tuple[int | None, Mapping[str, float]]]) -> list[Alert]:
        """Evaluate the values of several steps, in order, under one lock; act on the
        transitions afterwards and return them."""
        if self._closed:
            return []
        by_names = self._watched_by_names
        watched = []  # the values some rule watches
        runs: Iterable[tuple[tuple[str, ...], Iterable[tuple[int | None, Any]]]]
        if isinstance(rows, PerfRows):  # the worker's: values read from the step summaries
            runs = ((names, [(s.step, s) for s in steps]) for names, steps in rows.runs())
            value_of: Any = perf_value
        else:
            runs = itertools.groupby(rows, row_names)
            value_of = operator.getitem
        # A loop logs the same few sets of names step after step: which of them some rule
        # watches is looked up once per set and run of rows, not once per name and step.
        for names, run in runs:
            found = by_names.get(names)
            for step, values in run:
                watch = found
                if watch is None:  # a set not seen yet, or one with a name that failed to
                    watch = self._watched_of(names)  # route: routed (again) for this row
                    found = by_names.get(names)  # kept once every name routed
                for name, rules in watch:
                    watched.append((name, value_of(values, name), step, rules))
        return self._evaluate_watched(watched) if watched else []

    def _evaluate_watched(self, watched: list[tuple[str, Any, int | None, Any]]) -> list[Alert]:
        """Evaluate these ``(name, value, step, rules)`` under one lock; act on the
        transitions afterwards and return them."""
        out: list[Alert] = []
        prof = self.profiles
        skip = prof.profiled_value if prof is not None and prof.profiled else None
        with self._lock:
            for name, value, step, rules in watched:
                if skip is not None and skip(name, step):
                    continue  # a profiled step's timing: slowed by the profiler
                try:  # a value that cannot be evaluated does not stop the others
                    v = value if type(value) is float else float(value)
                    for rule, series in rules:
                        alert = self._evaluate(rule, series, name, v, step)
                        if alert is not None:
                            if alert.fired and self.profiles is not None and rule.profile:
                                alert = self._with_profile(alert)
                            out.append(alert)
                            self.history.append(alert)
                except Exception:
                    self._failed()
        for alert in out:
            self._act(alert)
        return out

    def _watched_of(self, names: tuple[str, ...]) -> list[tuple[str, Any]]:
        """The names of this set that some rule watches, with their rules (names seen
        first are routed here; a name that fails to route is left out of the set)."""
        found = []
        complete = True
        for name in names:
            try:
                rules = self._routes_for(name)
            except Exception:
                self._failed()
                complete = False
                continue
            if rules:
                found.append((name, rules))
        if complete:  # a set with a name that failed is routed again next time
            if len(self._watched_by_names) >= _MAX_NAME_SETS:  # names that change per step
                self._watched_by_names.clear()
            self._watched_by_names[names] = found
        return found

    def _failed(self) -> None:
        self._report("observe", "otel-tunix: alert evaluation failed (reported once)")

    def _evaluate(
        self, rule: Rule, s: _Series, metric: str, v: float, step: int | None
    ) -> Alert | None:
        hist = s.history  # the values before this one (v is appended on the way out)
        try:
            raw = rule.level(v, hist)
            if raw is _OK and s.level is _OK:  # the quiet case: no change
                s.streak_warning = s.streak_critical = 0
                return None
            return self._transition(rule, s, metric, v, step, hist, raw)
        finally:
            if rule.window and v - v == 0.0:  # finite
                hist.append(v)

    def _transition(
        self,
        rule: Rule,
        s: _Series,
        metric: str,
        v: float,
        step: int | None,
        hist: Sequence[float],
        raw: Severity,
    ) -> Alert | None:
        s.streak_warning = s.streak_warning + 1 if raw >= Severity.WARNING else 0
        s.streak_critical = s.streak_critical + 1 if raw >= Severity.CRITICAL else 0
        target = Severity.OK
        if s.streak_critical >= rule.consecutive:
            target = Severity.CRITICAL
        elif s.streak_warning >= rule.consecutive:
            target = Severity.WARNING
        previous = s.level
        if target > previous:
            new = target
        elif previous > Severity.OK and raw < previous and rule.clears(v, hist, previous):
            new = raw if raw > Severity.OK else Severity.OK
        else:
            return None
        s.level = new
        if self._said_already(rule, metric, new):
            return None
        cond = rule.condition(new if new > Severity.OK else previous, hist)
        return Alert(
            rule=rule.name,
            metric=metric,
            severity=new,
            previous=previous,
            value=v,
            step=step,
            condition=cond,
            message=_message(rule, metric, v, step, new, previous, cond),
        )

    def _said_already(self, rule: Rule, metric: str, new: Severity) -> bool:
        """True when another name of the same quantity (:data:`SAME_QUANTITY`) already
        says what this transition would: it fires at ``new`` or above, or (for a
        resolution) still fires. One event, one alert."""
        q = SAME_QUANTITY.get(metric, metric)
        for (name, other), series in self._series.items():
            if name != rule.name or other == metric or SAME_QUANTITY.get(other, other) != q:
                continue
            if series.level > Severity.OK and (new == Severity.OK or series.level >= new):
                return True
        return False

    def report(
        self,
        rule: str,
        metric: str,
        severity: Severity,
        value: float,
        step: int | None,
        condition: str,
        message: str,
        attributes: Mapping[str, Any] | None = None,
    ) -> Alert | None:
        """Act on a transition decided elsewhere: a detector with logic of its own (the
        straggler detector). Kept like a rule's (``history``, :meth:`active_alerts`), then
        every action runs. ``None`` (nothing done) when the series is already at
        ``severity``. ``attributes`` go on the alert besides the ``tunix.alert.*`` ones."""
        if self._closed:
            return None
        with self._lock:
            s = self._series.get((rule, metric))
            if s is None:
                s = self._series[(rule, metric)] = _Series()
            previous = s.level
            if previous is severity:
                return None
            s.level = severity
            alert = Alert(
                rule,
                metric,
                severity,
                previous,
                value,
                step,
                condition,
                message,
                extra=dict(attributes or {}),
            )
            if alert.fired and self.profiles is not None:
                alert = self._with_profile(alert)
            self.history.append(alert)
        self._act(alert)
        return alert

    def _with_profile(self, alert: Alert) -> Alert:
        """Ask for a profile capture of the next steps; the alert, naming it when one will
        be made (a capture already running, the cap or the cooldown: none)."""
        path = self.profiles.request(
            reason={
                "rule": alert.rule,
                "metric": alert.metric,
                "severity": alert.severity.name.lower(),
                "step": alert.step,
                "time_ns": alert.time_ns,
            },
            from_alert=True,
        )
        if path is None:
            return alert
        return dataclasses.replace(alert, extra={**alert.extra, PROFILE_PATH: path})

    def active(self) -> dict[tuple[str, str], Severity]:
        """``{(rule, metric): severity}`` of every series not OK now."""
        with self._lock:
            return {k: s.level for k, s in self._series.items() if s.level > Severity.OK}

    def active_alerts(self) -> list[dict[str, str]]:
        """The firing alerts as ``{"rule", "metric", "severity"}`` (``get_metrics_summary``)."""
        return [
            {"rule": rule, "metric": metric, "severity": sev.name.lower()}
            for (rule, metric), sev in self.active().items()
        ]

    # --- MetricsLogger backend ----------------------------------------------------------
    def log_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        """Backend protocol: evaluate ``event`` at ``kwargs["step"]``."""
        self.observe(event, value, kwargs.get("step"))

    def log_scalars(self, values: Mapping[str, float], **kwargs: Any) -> None:
        """Backend protocol: evaluate several scalars of one step."""
        self.log_rows(((kwargs.get("step"), values),))

    def log_rows(
        self, rows: Sequence[tuple[int | None, Mapping[str, float]]], **kwargs: Any
    ) -> None:
        """Backend protocol: evaluate the scalars of several steps, in order (those no rule
        watches cost one dict lookup)."""
        if type(rows) is tuple and len(rows) == 1:  # a log() call, on the caller's thread
            step, values = rows[0]
            watch = self._watched_by_names.get(tuple(values))
            if watch is not None:  # a set of names seen before: only its watched ones
                if watch and not self._closed:
                    self._evaluate_watched([(n, values[n], step, rules) for n, rules in watch])
                return
        self._evaluate_rows(rows)

    def close(self) -> None:
        """Stop evaluating; close the actions (the JSONL file; flush, and close if created
        here, the Datadog client)."""
        if self._closed:
            return
        self._closed = True
        for action in self.actions:
            try:
                action.close()
            except Exception:
                self._report(
                    ("close", id(action)),
                    f"otel-tunix: closing alert action {action.name!r} failed (reported once)",
                )

    # --- actions ------------------------------------------------------------------------
    def _act(self, alert: Alert) -> None:
        for action in self.actions:
            try:
                action.on_transition(alert)
            except Exception:
                self._report(
                    id(action), f"otel-tunix: alert action {action.name!r} failed (reported once)"
                )


def _message(
    rule: Rule,
    metric: str,
    value: float,
    step: int | None,
    new: Severity,
    previous: Severity,
    condition: str,
) -> str:
    at = f" at step {step}" if step is not None else ""
    if new > previous:
        head = f"otel-tunix alert [{new.name}] {rule.name}: {metric} = {value:.6g} {condition}"
        hint = f" ({rule.description})" if rule.description else ""
        return f"{head}{at}{hint}"
    if new is Severity.OK:
        return f"otel-tunix alert [RESOLVED] {rule.name}: {metric} = {value:.6g}{at}"
    return (
        f"otel-tunix alert [{new.name}] {rule.name}: {metric} = {value:.6g}{at} "
        f"(down from {previous.name.lower()})"
    )
