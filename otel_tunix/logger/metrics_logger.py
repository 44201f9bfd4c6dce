"""``MetricsLogger``: scalars (loss, rewards, perf/...) to pluggable backends.

A backend is a :class:`~otel_tunix.logger.backend.LoggingBackend` subclass, or any object
with Tunix's / metrax's ``log_scalar(event, value, **kwargs)`` and ``close()``
(:mod:`otel_tunix.logger.backend`). Backends are given as *factories* (a class or a lambda)
so that :class:`MetricsLoggerOptions` stays copyable. Built in: :class:`JsonlBackend`
(``<log_dir>/metrics.jsonl``), :class:`OTelBackend` (OTel gauges) and
:class:`ConsoleBackend`.

The caller's thread only checks and converts the values and queues them (a
:class:`~otel_tunix.pipeline.batch_queue.BatchQueue`, the pipeline's one queue engine): the
backends get them in order, in batches, on the logger's thread (``otel-tunix-metrics``),
within ``OTEL_TUNIX_PROCESS_INTERVAL_MS`` (250 ms). :meth:`MetricsLogger.flush`
waits until they were handed over; :meth:`MetricsLogger.close` hands over everything queued
before it closes the backends.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import operator
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from opentelemetry import metrics

from otel_tunix.logger.backend import (
    NUMBER_TYPES,
    PERF_SOURCE,
    BackendList,
    LoggingBackend,
    OffThreadBackend,
    Row,
    ScalarProtocol,
    deliver_rows,
    learn_scalar,
    otel_metric_name,
    row_names,
    to_scalar,
    unit_for,
)
from otel_tunix.logger.instruments import CatalogOTelBackend
from otel_tunix.logger.perf_rows import PerfRows, perf_metrics
from otel_tunix.logger.status import MetricsSummary
from otel_tunix.model.resource import detect_rank
from otel_tunix.pipeline.batch_queue import BatchQueue
from otel_tunix.pipeline.hooks import (
    HookRunner,
    close_hooks,
    closing_threads,
    flush_hooks,
    runs_user_code,
)
from otel_tunix.settings import tally as _tally
from otel_tunix.settings.parsing import ConfigurationError
from otel_tunix.settings.values import Settings, load_settings
from otel_tunix.support.errors import ReportOnce, warn_once
from otel_tunix.support.fork import at_fork_in_child, silence_file
from otel_tunix.support.json_lines import dumps_line, floats_finite
from otel_tunix.support.linefile import LineFile
from otel_tunix.support.text import clean_name

__all__ = [
    "ConsoleBackend",
    "JsonlBackend",
    "LoggingBackend",
    "MetricsLogger",
    "MetricsLoggerOptions",
    "OTelBackend",
    "to_scalar",
]

_logger = logging.getLogger(__name__)

Backend = LoggingBackend | ScalarProtocol
"""A backend: a :class:`LoggingBackend` subclass, or any object with ``log_scalar`` and
``close`` (Tunix's protocol)."""
BackendFactory = Callable[[], Backend]

QUEUE_CAPACITY = 16384
"""Rows (one step's scalars each) queued for the backends at most; past it new rows are
dropped and counted (``metric_rows_dropped`` in ``summary.json``)."""
_QUEUE_BATCH = 1024
"""Rows handed to the backends in one pass at most."""

_Queued = tuple[Sequence[Row], Mapping[str, Any], float, bool]
"""One call's rows, its keywords (``source``), its ``time.time()`` and whether it is one
``log_dict`` row (the backends get consecutive ones together; a ``log_rows`` batch stays
one call)."""


@dataclass(kw_only=True)
class MetricsLoggerOptions:
    """Options of a :class:`MetricsLogger` (Tunix's ``MetricsLoggerOptions`` and more).

    Attributes:
        log_dir: Folder for ``metrics.jsonl`` (``metrics-rank<r>.jsonl`` on rank r > 0; the
            JSONL backend is added when it is set).
        project_name: Project name, written into the JSONL header and passed to backends.
        run_name: Run name; defaults to the run id.
        backend_factories: Extra backends, as factories (a class or ``lambda: Backend(...)``).
        flush_every_n_steps: The JSONL backend flushes when the step has advanced this far
            since its last flush, and at ``close()``.
        log_all_ranks: Log on every rank (default: rank 0 only; ``OTEL_TUNIX_LOG_ALL_RANKS``).
        default_backends: Add the built-in JSONL (if ``log_dir``) backend, the catalog-driven
            OTel backend (:class:`otel_tunix.logger.instruments.CatalogOTelBackend`) and the
            counts of :func:`otel_tunix.metrics.get_metrics_summary`.
        backend_kwargs: Tunix-style extras; ``{"custom_backend": [factory, ...]}`` is
            accepted as more backend factories.
    """

    log_dir: str | os.PathLike[str] | None = None
    project_name: str = "otel-tunix"
    run_name: str | None = None
    backend_factories: Sequence[BackendFactory] = field(default_factory=list)
    flush_every_n_steps: int = 100
    log_all_ranks: bool | None = None
    default_backends: bool = True
    backend_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (
            isinstance(self.flush_every_n_steps, bool)
            or not isinstance(self.flush_every_n_steps, int)
            or self.flush_every_n_steps < 1
        ):
            raise ConfigurationError(
                "MetricsLoggerOptions.flush_every_n_steps must be a positive integer, "
                f"got {self.flush_every_n_steps!r}"
            )
        for f in [*self.backend_factories, *self.backend_kwargs.get("custom_backend", [])]:
            if not callable(f):
                raise ConfigurationError(
                    "MetricsLoggerOptions.backend_factories must hold factories (a class or "
                    f"a lambda returning a backend), got {f!r}"
                )


class MetricsLogger:
    """Logs scalars to every configured backend.

    Only rank 0 logs by default (see ``log_all_ranks``). ``log`` never raises: a value that is
    not a number is reported once per metric name and skipped; NaN and Inf are logged as such
    and flagged with one warning per name; a backend that fails is reported once. Names are
    cleaned on first use (control characters and lone surrogates replaced, at most 255
    characters) and bounded: past ``OTEL_TUNIX_MAX_METRIC_NAMES`` distinct names (2000)
    the values of new names are refused, with one warning, and counted.
    """

    def __init__(
        self,
        metrics_logger_options: MetricsLoggerOptions | None = None,
        *,
        run_id: str | None = None,
        rank: int | None = None,
        meter_provider: Any = None,
        settings: Settings | None = None,
        run_identity: Mapping[str, Any] | None = None,
    ) -> None:
        """Args:
        metrics_logger_options: The options (default: all defaults).
        run_id: Written into the JSONL header.
        run_identity: More fields of the JSONL header (run setup's: ``job_id``,
            ``attempt``, ``process_start_ns``).
        rank: This process's rank (default: the launcher's); only rank 0 logs unless
            ``log_all_ranks``.
        meter_provider: For the OTel backend (default: the global one).
        settings: Where ``OTEL_TUNIX_LOG_ALL_RANKS`` and the launcher's rank come from
            (default: the environment).
        """
        self.options = opts = metrics_logger_options or MetricsLoggerOptions()
        self.run_id = run_id
        s = settings if settings is not None else load_settings()
        self.rank = detect_rank(s).rank if rank is None else rank
        log_all = opts.log_all_ranks if opts.log_all_ranks is not None else s.log_all_ranks
        self.active = log_all or self.rank == 0
        self._lock = threading.Lock()
        self._names: dict[str, str] = {}
        """Each name logged so far -> the name it is logged under (cleaned)."""
        self._names_lock = threading.Lock()
        self._max_names = s.max_metric_names
        self._close_timeout = s.shutdown_timeout
        self._interval = s.process_interval_ms / 1e3  # longest wait of a row for the backends
        self.refused_values = 0
        """Values refused because their name came past ``OTEL_TUNIX_MAX_METRIC_NAMES``."""
        self._report = ReportOnce(_logger)
        self._closed = False
        self._queue: BatchQueue[_Queued] | None = None  # started by the first row
        self._queue_lock = threading.Lock()
        self.last_values: dict[str, float] = {}
        self.last_step: int | None = None
        self._backends = BackendList()
        self._sorted: tuple[int, tuple[Backend, ...], tuple[Backend, ...]] = (-1, (), ())
        """``(version, on the caller's thread, on the logger's)`` of the backends."""
        at_fork_in_child(self._after_fork_in_child)
        if not self.active:
            return
        if opts.default_backends:
            if opts.log_dir is not None:
                self.backends.append(
                    JsonlBackend(
                        Path(opts.log_dir) / metrics_file_name(self.rank),
                        flush_every_n_steps=opts.flush_every_n_steps,
                        header={
                            "project": opts.project_name,
                            "run": opts.run_name or run_id,
                            "run_id": run_id,
                            "rank": self.rank,
                            **(run_identity or {}),
                        },
                    )
                )
            self.backends.append(CatalogOTelBackend(meter_provider))
            self.backends.append(MetricsSummary())
        factories = [*opts.backend_factories, *opts.backend_kwargs.get("custom_backend", [])]
        for factory in factories:
            backend = factory()
            if not isinstance(backend, LoggingBackend) and not callable(
                getattr(backend, "log_scalar", None)
            ):
                raise ConfigurationError(
                    f"backend factory {factory!r} returned {backend!r}, which has no "
                    "log_scalar(event, value, **kwargs) method"
                )
            if runs_user_code(backend):  # its own thread: see logging_backend
                backend = OffThreadBackend(backend, self._failed)
            self.backends.append(backend)

    @property
    def backends(self) -> BackendList:
        """The backends, in the order they get each row (a list: append or remove one at
        any time)."""
        return self._backends

    @backends.setter
    def backends(self, backends: Sequence[Backend]) -> None:
        self._backends = BackendList(backends)
        self._sorted = (-1, (), ())  # sorted again at the next row

    def _by_thread(self) -> tuple[tuple[Backend, ...], tuple[Backend, ...]]:
        """The backends run on the caller's thread, and those run on the logger's."""
        version, callers, own = self._sorted
        backends = self._backends
        if version != backends.version:
            version = backends.version
            listed = list(backends)
            callers = tuple(b for b in listed if getattr(b, "on_callers_thread", False) is True)
            own = tuple(b for b in listed if b not in callers)
            self._sorted = (version, callers, own)
        return callers, own

    def log(self, name: str, value: Any, step: int | None = None, **kwargs: Any) -> None:
        """Log one scalar under ``name`` (e.g. ``"loss"``, ``"rewards/mean"``) at ``step``."""
        self.log_dict({name: value}, step=step, **kwargs)

    def _convert(self, metrics: Mapping[str, Any], step: int | None) -> dict[str, float]:
        out: dict[str, float] = {}
        names = self._names
        for name, value in metrics.items():
            logged = names.get(name)
            if logged is None:  # a name not seen before (or refused)
                logged = self._admit(name)
                if logged is None:
                    continue
            if type(value) is float and value - value == 0.0:  # finite float: the usual case
                out[logged] = value
                continue
            try:
                v = float(value) if type(value) in NUMBER_TYPES else learn_scalar(value)
            except Exception:  # not a number: report once, never raise, never echo the text
                warn_once(
                    (id(self), "type", logged),
                    "otel-tunix: metric %r skipped: a %s is not a number (%s)",
                    logged,
                    type(value).__name__,
                    _shape_of(value),
                )
                continue
            if not math.isfinite(v):
                warn_once(
                    (id(self), "nan", logged),
                    "otel-tunix: metric %r is %s at step %s",
                    logged,
                    v,
                    step,
                )
            out[logged] = v
        return out

    def _admit(self, name: object) -> str | None:
        """The slow path of a name's first use: the name as logged (cleaned: no control
        characters or lone surrogates, at most 255 characters), or ``None`` when it is
        refused (not a string, or past ``OTEL_TUNIX_MAX_METRIC_NAMES`` distinct names:
        each holds an OTel instrument and per-name state for the rest of the run)."""
        if not isinstance(name, str):
            warn_once(
                (id(self), "name", type(name)),
                "otel-tunix: a metric name must be a string, got a %s; its values are skipped",
                type(name).__name__,
            )
            return None
        with self._names_lock:
            names = self._names
            if name in names:
                return names[name]
            if len(names) >= self._max_names:
                self.refused_values += 1
                _tally.add("metric_names_refused")
                warn_once(
                    (id(self), "max-names"),
                    "otel-tunix: %d distinct metric names logged (OTEL_TUNIX_MAX_METRIC_NAMES); "
                    "values of new names, from %r on, are refused (counted in summary.json)",
                    self._max_names,
                    clean_name(name),
                )
                return None
            logged = names[name] = clean_name(name)
        if logged != name:
            _tally.add("names_cleaned")
        return logged

    def wants(self, source: str) -> bool:
        """False when no backend takes scalars of this ``source`` (they can be skipped)."""
        return self.active and any(not _skips(b, source) for b in self.backends)

    def log_dict(self, metrics: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log several scalars at one step (one record in the JSONL backend).

        On the caller's thread the values are checked and converted, ``last_values`` and
        ``last_step`` updated, and the row queued; the backends get it on the logger's
        thread (:meth:`flush` waits for that)."""
        if not self.active or self._closed:
            return
        if step is not None and type(step) is not int:
            step = _step_number(step)
        values = self._convert(metrics, step)
        if values:
            # dict.update from a dict of str keys holds the GIL throughout: no lock needed
            # beside the worker's updates
            self.last_values.update(values)
            if step is not None:
                self.last_step = step
            self._hand_on(((step, values),), kwargs, True)

    def log_rows(self, rows: Sequence[tuple[int | None, dict[str, float]]], **kwargs: Any) -> None:
        """Several steps' scalars at once, ``(step, values)`` in order, the values Python
        floats already (no conversion or checks per value; kept as given, not to be changed
        after the call): queued as one item, handed to each backend in one call (the worker
        logs a batch of steps' ``perf/...`` scalars this way)."""
        if not self.active or self._closed or not rows:
            return
        # The last values: of a run of rows with the same names only the run's last row
        # counts (it overwrites every value of the others), so only it is copied.
        last = self.last_values
        if isinstance(rows, PerfRows):  # the worker's: no row made for this
            for _, steps in rows.runs():
                last.update(perf_metrics(steps[-1]))
            self.last_step = rows.summaries[-1].step
        else:
            for _, run in itertools.groupby(rows, row_names):
                for row in run:
                    if row[0] is not None:
                        self.last_step = row[0]
                last.update(row[1])
        self._hand_on(rows, kwargs, False)

    def _hand_on(self, rows: Sequence[Row], kwargs: Mapping[str, Any], single: bool) -> None:
        """Hand a call's rows to the backends on the caller's thread, and queue them for the
        others (a full queue drops them, counted)."""
        t = time.time()  # the records' time: before the alert engine's
        version, callers, _ = self._sorted
        if version != self._backends.version:
            callers = self._by_thread()[0]
        if callers:
            self._deliver(callers, rows, kwargs)
        queue = self._queue or self._start_queue()
        if queue.put((rows, kwargs, t, single), count_late=False) or queue.closed:
            return  # queued, or logged while the logger closes (not a row lost for room)
        _tally.add("metric_rows_dropped", len(rows))
        warn_once(
            (id(self), "queue-full"),
            "otel-tunix: the MetricsLogger's backends have not kept up (%d rows queued); "
            "later rows are dropped and counted in summary.json (metric_rows_dropped)",
            QUEUE_CAPACITY,
        )

    def _start_queue(self) -> BatchQueue[_Queued]:
        with self._queue_lock:
            if self._queue is None:
                self._queue = BatchQueue(
                    self._deliver_batch,
                    name="otel-tunix-metrics",
                    capacity=QUEUE_CAPACITY,
                    max_batch=_QUEUE_BATCH,
                    interval_sec=self._interval,
                    weight=lambda item: len(item[0]),  # rows
                    wake_when_full=False,  # woken every interval: fewer, larger batches
                )
                if self._closed:  # closed meanwhile (close() saw no queue): takes no row
                    self._queue.close(0.0)
            return self._queue

    def _deliver_batch(self, items: list[_Queued]) -> None:
        """On the logger's thread: hand the queued calls to its backends, in order; the
        ``log_dict`` rows of consecutive calls with the same keywords in one pass."""
        own = self._by_thread()[1]
        i, n = 0, len(items)
        while i < n:
            rows, kwargs, t, single = items[i]
            i += 1
            times = [t] * len(rows)
            if single:
                merged: list[Row] | None = None
                while i < n and items[i][3] and items[i][1] == kwargs:
                    if merged is None:
                        merged = list(rows)
                    merged.extend(items[i][0])
                    times.append(items[i][2])
                    i += 1
                if merged is not None:
                    rows = merged
            self._deliver(own, rows, kwargs, times)

    def _deliver(
        self,
        backends: Sequence[Backend],
        rows: Sequence[Row],
        kwargs: Mapping[str, Any],
        times: list[float] | None = None,
    ) -> None:
        """Hand ``rows`` to ``backends``; ``times``: when each row was logged (the JSONL
        backend's record times)."""
        source = kwargs.get("source")
        for backend in backends:
            if isinstance(backend, LoggingBackend):  # the usual case, inline
                if source is not None and source in backend.skip_sources:
                    continue
                try:  # one that raises loses this batch, for itself only
                    if times is not None and type(backend) is JsonlBackend:
                        backend.log_rows(rows, times=times, **kwargs)
                        continue
                    backend.log_rows(rows, **kwargs)
                except Exception:
                    self._failed(backend)
                continue
            deliver_rows(backend, rows, kwargs, self._failed)

    def _after_fork_in_child(self) -> None:
        """A forked child logs nothing through its copy of the parent's logger (whose lock
        another thread may have held at the fork, and whose files are the parent's)."""
        self._lock = threading.Lock()
        self._names_lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queue = None  # the parent's thread does not exist here
        self.active = False
        self._closed = True

    def _failed(self, backend: object) -> None:
        self._report(
            id(backend), "otel-tunix: backend %s failed (reported once)", type(backend).__name__
        )

    def flush(self, timeout: float = 10.0, *, hooks: bool = True) -> bool:
        """Wait until the backends were handed every value logged so far, those on threads
        of their own (not otel-tunix's) included unless ``hooks`` is false (False:
        ``timeout`` passed first)."""
        deadline = time.monotonic() + timeout
        queue = self._queue
        ok = queue is None or queue.flush(timeout)
        if not hooks:
            return ok
        return flush_hooks(self._runners(), max(0.0, deadline - time.monotonic())) and ok

    def hooks_closing(self) -> list[tuple[str, threading.Thread]]:
        """``(name, thread)`` of each backend being closed on a thread of its own: for a
        shutdown that waits for them beside other work."""
        return closing_threads(self._runners(), "backend")

    def _runners(self) -> list[HookRunner]:
        return [b.runner for b in list(self.backends) if isinstance(b, OffThreadBackend)]

    def close(
        self, timeout: float | None = None, *, drain_timeout: float | None = None
    ) -> list[str]:
        """Hand what is queued to the backends (waiting at most ``drain_timeout``, default
        ``OTEL_TUNIX_SHUTDOWN_TIMEOUT``), then flush and close every backend (idempotent).
        Backends on threads of their own are closed side by side and waited for at most
        ``timeout`` seconds (default: ``OTEL_TUNIX_SHUTDOWN_TIMEOUT``; ``0``: not at all, see
        :meth:`hooks_closing`). Returns the names of what had not finished (left behind on
        its thread, with one warning)."""
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            backends = list(self.backends)
        with self._queue_lock:
            queue = self._queue
        drain = self._close_timeout if drain_timeout is None else drain_timeout
        if queue is not None and not queue.close(drain):
            # the logger's thread still hands rows to the backends: they stay open under it
            _logger.warning(
                "otel-tunix: the MetricsLogger's queue was not handed to its backends within "
                "%g s; left behind",
                drain,
            )
            return ["MetricsLogger queue"]
        own = [b for b in backends if not isinstance(b, OffThreadBackend)]
        for backend in own:
            try:
                backend.close()
            except Exception:
                _logger.exception("otel-tunix: closing %s failed", type(backend).__name__)
        hooks = [(b.runner, b.backend.close) for b in backends if isinstance(b, OffThreadBackend)]
        if not hooks:
            return []
        unfinished = close_hooks(hooks, self._close_timeout if timeout is None else timeout)
        if unfinished:
            _logger.warning(
                "otel-tunix: backend %s had not finished closing after %g s; left behind",
                ", ".join(unfinished),
                self._close_timeout if timeout is None else timeout,
            )
        return unfinished


def _step_number(step: Any) -> int | None:
    """``step`` as an ``int`` (numpy, JAX and torch integers keep their value); anything
    else is reported once and logged with no step."""
    try:
        if isinstance(step, bool):
            raise TypeError
        return operator.index(step)
    except Exception:
        warn_once(
            ("log-step", type(step)),
            "otel-tunix: a logged step must be an integer, got a %s; logged with no step",
            type(step).__name__,
        )
        return None


def _shape_of(value: Any) -> str:
    """What a value that is not a number is, without its contents (a prompt or a
    completion logged by mistake must not reach the logs)."""
    if isinstance(value, str | bytes):
        return f"{len(value)} characters" if isinstance(value, str) else f"{len(value)} bytes"
    size = getattr(value, "size", None)
    if isinstance(size, int):
        return f"{size} elements"
    return "not a scalar"


def _skips(backend: Backend, source: str) -> bool:
    """Whether ``backend`` does not take scalars of ``source``."""
    return isinstance(backend, LoggingBackend) and source in backend.skip_sources


FLUSH_INTERVAL_SEC = 0.25
"""Longest time a record logged to ``metrics.jsonl`` waits for its flush while records
keep coming (the default ``OTEL_TUNIX_PROCESS_INTERVAL_MS``)."""


def metrics_file_name(rank: int) -> str:
    """``metrics.jsonl`` on rank 0; ``metrics-rank<r>.jsonl`` on the other ranks that log
    (``log_all_ranks``), so ranks sharing a run folder never mix their rows in one file."""
    return "metrics.jsonl" if rank == 0 else f"metrics-rank{rank}.jsonl"


class JsonlBackend(LoggingBackend):
    """One JSON object per ``log``/``log_dict`` call: ``{"step": s, "time": t, "metrics":
    {name: value, ...}}``.

    The first line is a header, ``{"type": "meta", ...}``. NaN / Inf are written as the
    JSON extensions ``NaN`` / ``Infinity`` (Python's ``json`` and pandas read them) and the
    record gets ``"nonfinite": true``. ``time`` is when the values were logged. Records
    reach the file after each batch the MetricsLogger hands over (within
    :data:`FLUSH_INTERVAL_SEC` of being logged: a hard kill loses about that much), called
    directly when the step has advanced ``flush_every_n_steps`` since the last flush or
    :data:`FLUSH_INTERVAL_SEC` has passed, and at ``close()``; always as whole lines, a full
    disk included (:class:`otel_tunix.support.linefile.LineFile`: what cannot be written is counted
    in ``summary.json``, never raised).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        flush_every_n_steps: int = 100,
        header: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        self._file = LineFile(self.path)
        at_fork_in_child(self._after_fork_in_child)
        self._every = flush_every_n_steps
        self._last_flush_step: int | None = None
        self._flush_at = 0.0  # time.time() past which the next record flushes
        if header is not None:
            meta = {"type": "meta", "time": time.time(), **header}
            self._file.write(json.dumps(meta, default=str) + "\n")
            self._file.flush()

    def log_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        self.log_scalars({event: value}, **kwargs)

    def log_rows(
        self, rows: Sequence[Row], *, times: Sequence[float] | None = None, **kwargs: Any
    ) -> None:
        """Write each row as one record; ``times``: when each was logged (the MetricsLogger's
        batches: the file is flushed after the batch). Default: now."""
        if times is None or not rows:
            super().log_rows(rows, **kwargs)
            return
        step: int | None = None
        for (step, values), t in zip(rows, times, strict=True):
            self._write(values, step, t)
        self._last_flush_step = step
        self._flush(time.time())

    def log_scalars(self, values: Mapping[str, float], **kwargs: Any) -> None:
        """Write several scalars of one step as one record."""
        step = kwargs.get("step")
        now = time.time()
        self._write(values, step, now)
        if step is None or self._last_flush_step is None:
            self._last_flush_step = step if step is not None else self._last_flush_step
            self._flush(now)
        elif step - self._last_flush_step >= self._every or now >= self._flush_at:
            self._last_flush_step = step
            self._flush(now)

    def _write(self, values: Mapping[str, float], step: int | None, t: float) -> None:
        rec: dict[str, Any] = {"step": step, "time": t, "metrics": dict(values)}
        finite = floats_finite(values.values())
        if not finite:
            rec["nonfinite"] = True
        self._file.write(dumps_line(rec, finite=finite) + "\n")

    def _flush(self, now: float) -> None:
        self._flush_at = now + FLUSH_INTERVAL_SEC
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def _after_fork_in_child(self) -> None:
        silence_file(self._file)  # the parent's file: the child's copy of its buffer goes nowhere


class OTelBackend(LoggingBackend):
    """Each scalar name becomes an OTel gauge (last value wins), step as no attribute.

    The perf/... scalars (``source="perf"``) are skipped: the accounting processor already
    publishes them as histograms in seconds.
    """

    skip_sources = (PERF_SOURCE,)

    def __init__(self, meter_provider: Any = None, scope: str = "otel_tunix.metrics") -> None:
        provider = meter_provider or metrics.get_meter_provider()
        self._meter = provider.get_meter(scope)
        self._gauges: dict[str, Any] = {}

    def log_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        if kwargs.get("source") in self.skip_sources:
            return
        gauge = self._gauges.get(event)
        if gauge is None:
            gauge = self._gauges[event] = self._meter.create_gauge(
                otel_metric_name(event), unit=unit_for(event), description=f"logged {event}"
            )
        gauge.set(value)

    def close(self) -> None:
        return None


class ConsoleBackend(LoggingBackend):
    """Prints ``[step N] name = value`` lines to stderr (or the given stream)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream or sys.stderr

    def log_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        step = kwargs.get("step")
        prefix = f"[step {step}] " if step is not None else ""
        self._stream.write(f"{prefix}{event} = {value:.6g}\n")

    def close(self) -> None:
        self._stream.flush()
