"""The MetricsLogger's backend interface, and the helpers backends share.

A backend is either

* a :class:`LoggingBackend` subclass: every method is declared here with a working default,
  so a subclass overrides what it can do cheaper (``log_rows`` for a batch of steps,
  ``log_scalars`` for one step) and nothing is looked up at run time; or
* any object with Tunix's / metrax's two methods, ``log_scalar(event, value, **kwargs)`` and
  ``close()`` (:class:`ScalarProtocol`): fed one scalar at a time.

The MetricsLogger hands the rows to its backends on a thread of its own, in order, shortly
after they are logged (a backend with ``on_callers_thread`` gets them where they are logged).

Contract (as the OTel SDK's ``SpanProcessor``): a backend should not raise: one that raises
is reported once and the other backends go on. A backend that is not otel-tunix's own runs on
a thread of its own (:class:`OffThreadBackend`, :mod:`otel_tunix.pipeline.hooks`): it gets
its calls in order, shortly after they are made (``MetricsLogger.flush()`` waits for them);
whatever it does (block, crawl, hang in ``close()``), the training loop never waits for it
and ``shutdown()`` waits for it at most until its deadline.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from otel_tunix.pipeline.hooks import HookRunner

__all__ = [
    "NUMBER_TYPES",
    "PERF_SOURCE",
    "BackendList",
    "LoggingBackend",
    "OffThreadBackend",
    "Row",
    "ScalarProtocol",
    "deliver_rows",
    "learn_scalar",
    "otel_metric_name",
    "row_names",
    "to_scalar",
    "unit_for",
]

PERF_SOURCE = "perf"
"""``source`` keyword of the perf/... scalars that the accounting processor logs: they are
already OTel histograms, so the OTel backends skip them."""

Row = tuple[int | None, Mapping[str, float]]
"""One step's scalars: ``(step, {name: value})``."""


class ScalarProtocol(Protocol):
    """Tunix's / metrax's ``LoggingBackend`` protocol, structurally: any object with these
    two methods is a backend."""

    def log_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        """Log one scalar; ``kwargs`` usually holds ``step``."""

    def close(self) -> None:
        """Flush and release resources."""


class LoggingBackend:
    """Base class of otel-tunix's backends: the protocol's methods and two batch methods,
    each with a default that calls the finer one.

    ``skip_sources``: the ``source`` keywords whose scalars this backend does not want (the
    MetricsLogger does not hand them to it).
    """

    skip_sources: tuple[str, ...] = ()
    on_callers_thread: bool = False
    """Run where the scalars are logged, not on the MetricsLogger's thread: for a backend
    that reads the caller's context (the alert engine: its events go on the step open
    there, its log records carry the trace, its times are the log call's). It must be
    cheap for the names it does not use."""

    def log_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        """Log one scalar; ``kwargs`` usually holds ``step``, and ``nonfinite=True`` marks
        NaN / Inf. Default: nothing."""

    def log_scalars(self, values: Mapping[str, float], **kwargs: Any) -> None:
        """Log one step's scalars. Default: :meth:`log_scalar` for each (a non-finite one
        with ``nonfinite=True``)."""
        for name, value in values.items():
            if math.isfinite(value):
                self.log_scalar(name, value, **kwargs)
            else:
                self.log_scalar(name, value, nonfinite=True, **kwargs)

    def log_rows(self, rows: Sequence[Row], **kwargs: Any) -> None:
        """Log several steps' scalars, in order (the worker's batches of ``perf/...`` rows
        come as a :class:`~otel_tunix.logger.perf_rows.PerfRows`, whose dicts are made on first
        read). Default: :meth:`log_scalars` for each row; a row that raises does not lose
        the others (the first error is raised at the end, for the logger to report)."""
        error: Exception | None = None
        for step, values in rows:
            try:
                self.log_scalars(values, step=step, **kwargs)
            except Exception as exc:  # the backend's code: raised below, the logger reports it
                error = error or exc
        if error is not None:
            raise error

    def active_alerts(self) -> list[dict[str, str]]:
        """Alerts this backend has firing now, for ``get_metrics_summary()``: ``{"rule",
        "metric", "severity"}`` each. Default: none (the alert engine has some)."""
        return []

    def close(self) -> None:
        """Flush and release resources. Default: nothing."""


def deliver_rows(
    backend: LoggingBackend | ScalarProtocol,
    rows: Sequence[Row],
    kwargs: Mapping[str, Any],
    failed: Callable[[object], object],
) -> None:
    """Hand ``rows`` to ``backend``: its ``log_rows`` (a :class:`LoggingBackend`), else one
    ``log_scalar`` per value (Tunix's protocol; a row that fails does not lose the others).
    ``failed(backend)`` is called for each failure."""
    if isinstance(backend, LoggingBackend):
        try:  # one that raises loses this batch, for itself only
            backend.log_rows(rows, **kwargs)
        except Exception:
            failed(backend)
        return
    for step, values in rows:
        try:
            for name, v in values.items():
                if math.isfinite(v):
                    backend.log_scalar(name, v, step=step, **kwargs)
                else:
                    backend.log_scalar(name, v, step=step, nonfinite=True, **kwargs)
        except Exception:
            failed(backend)


class OffThreadBackend(LoggingBackend):
    """A backend that is not otel-tunix's own, run on a thread of its own (see the module
    docstring): ``log_rows`` queues the rows and returns. Attributes it does not have are
    the backend's (``.backend`` is the backend itself)."""

    def __init__(
        self, backend: LoggingBackend | ScalarProtocol, failed: Callable[[object], object]
    ) -> None:
        """``failed(backend)`` reports a failure of the backend (on its thread)."""
        self.backend = backend
        self.skip_sources = backend.skip_sources if isinstance(backend, LoggingBackend) else ()
        self._failed = failed
        self.runner = HookRunner(
            type(backend).__name__, lambda method: failed(backend), unit="scalars"
        )

    def log_rows(self, rows: Sequence[Row], **kwargs: Any) -> None:
        scalars = sum(len(values) for _, values in rows)
        self.runner.call_items(scalars, deliver_rows, self.backend, rows, kwargs, self._failed)

    def log_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        self.log_rows(((kwargs.pop("step", None), {event: value}),), **kwargs)

    def active_alerts(self) -> list[dict[str, str]]:
        if isinstance(self.backend, LoggingBackend):
            return self.backend.active_alerts()
        return []

    def close(self) -> None:
        """Close it on its thread, waiting as long as it takes (``MetricsLogger.close``
        gives it a deadline instead)."""
        self.runner.start_closing(self.backend.close).join()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["backend"], name)


class BackendList(list[LoggingBackend | ScalarProtocol]):
    """A MetricsLogger's backends: a list that counts its changes (``version``), so that the
    logger knows when to sort them again into those run on the caller's thread and those run
    on its own."""

    version = 0


def _counting(name: str) -> Any:
    change = getattr(list, name)

    def changed(self: BackendList, *args: Any) -> Any:
        self.version += 1
        return change(self, *args)

    changed.__name__ = name
    return changed


_CHANGES = "append extend insert remove pop clear sort reverse __setitem__ __delitem__ __iadd__"
for _name in _CHANGES.split():
    setattr(BackendList, _name, _counting(_name))


def row_names(row: Row) -> tuple[str, ...]:
    """The names of a ``(step, values)`` row, in order: the key that splits rows into runs
    with the same names (``itertools.groupby(rows, row_names)``). A loop logs the same set of
    names step after step, so a backend does once per run what does not change within one.
    """
    return tuple(row[1])


def to_scalar(value: Any) -> float:
    """A Python float from a Python, numpy, JAX or torch scalar (or 1-element array).

    Raises:
        TypeError: the value is not a number or has more than one element.
    """
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    item = getattr(value, "item", None)
    if item is not None:
        numel = getattr(value, "numel", None)  # torch; numpy and JAX have an int .size
        size = numel() if callable(numel) else getattr(value, "size", 1)
        if isinstance(size, int) and size != 1:
            raise TypeError(f"expected a scalar, got an array with {size} elements")
        return float(item())
    return float(value)


NUMBER_TYPES: set[type] = {int, float, bool}
"""Types whose values are numbers that ``float()`` converts as :func:`to_scalar` does: Python's,
and each numpy scalar type once seen (a numpy float32 costs ~0.2 us instead of ~1 us)."""


def learn_scalar(value: Any) -> float:
    """:func:`to_scalar`, learning numpy's scalar types (never arrays: their size varies)."""
    v = to_scalar(value)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.integer | numpy.floating | numpy.bool_):
        NUMBER_TYPES.add(type(value))
    return v


_NAME_OK = re.compile(r"[^A-Za-z0-9_./\-]")


def otel_metric_name(event: str) -> str:
    """A valid OTel instrument name for a logged scalar (``/`` is kept)."""
    name = _NAME_OK.sub("_", event)
    if not name or not name[0].isalpha():
        name = "m_" + name
    return name[:255]


def unit_for(event: str) -> str:
    """The OTel unit a logged scalar's name implies (``s``, ``{token}``, else ``1``)."""
    if event.endswith(("_sec", "_time", "_seconds")):
        return "s"
    if "tokens" in event and not event.endswith("per_sec"):
        return "{token}"
    return "1"
