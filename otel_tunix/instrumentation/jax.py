"""JAX instrumentation: device-accurate step spans, compilation spans, device memory.

Three pieces, each usable alone:

* :func:`instrument_jit` / :func:`jit` wrap a jitted step function. Each call is the
  component ``train_step_compute`` (or the name you give): it starts when the call starts,
  records the host dispatch time as ``tunix.host_duration_s`` and ends when the outputs are
  ready on the device. The wait (``jax.block_until_ready``) runs on otel-tunix's single
  device-waiter thread, one resolver per call in FIFO order, never on the training thread.
* Compilation: tracing, lowering and XLA compilation are recorded as their own spans
  (``jax_trace``, ``jax_lower``, ``jax_compile``) wherever they happen inside a sampled step —
  the first call of a jitted function and every cache miss (a new shape or dtype) — nested
  under the component that triggered them. They come from JAX's own
  ``jax.monitoring`` time-span events, so the times are JAX's. Every compilation, sampled or
  not, also counts in ``tunix.compilations`` (``framework="jax"``, the jitted ``function``)
  with its ``cause`` (``first_call``, ``new_shapes``, ``new_dtypes``, ...; see
  ``_jax_causes``), and its phases' times in ``tunix.jax.compile.duration``.
* Device memory: once per sampled step, after the step's outputs are ready, the waiter
  thread reads ``device.memory_stats()`` (backends that report it: GPU, TPU; not CPU) and
  publishes it like the other integrations (``tunix.memory.allocated`` / ``.reserved`` /
  ``.peak_allocated`` gauges in bytes, ``memory/..._bytes`` scalars). With several local
  devices the largest value is reported (``device="<platform>:max"``).
* :class:`JaxInstrumentor` (entry point ``otel_tunix_jax``) turns compilation tracking on
  for an unmodified program, without importing JAX before the program does.

JAX's ``process_index()`` / ``process_count()`` go on the step span (``jax.process_index``,
``jax.process_count``) and on every JAX metric.

Usage::

    import otel_tunix
    from otel_tunix.instrumentation.jax import instrument_jit

    otel_tunix.configure(service_name="jax-train")
    train_step = instrument_jit(jax.jit(train_step, donate_argnums=0))
    for n in range(steps):
        with otel_tunix.step(n, scope="train"):
            state, loss = train_step(state, next(batches))
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import otel_tunix
from otel_tunix.accounting import categories
from otel_tunix.instrumentation import _base
from otel_tunix.instrumentation._jax_causes import CompileCauses
from otel_tunix.instrumentation._threads import carry_into_threads, stop_carrying_into_threads
from otel_tunix.metrics.compilations import count_compilation
from otel_tunix.model.metric_spec import SECONDS_BUCKETS
from otel_tunix.recording.hot_path import may_record
from otel_tunix.support.errors import report_internal_error, warn_once

__all__ = [
    "COMPILE_PHASES",
    "PROCESS_COUNT",
    "PROCESS_INDEX",
    "InstrumentedFunction",
    "JaxInstrumentor",
    "device_end",
    "instrument_jit",
    "jit",
    "memory_stats",
]

_logger = logging.getLogger(__name__)

EXTRA_HINT = "pip install 'otel-tunix[jax]'"

COMPILE_PHASES: dict[str, tuple[str, str]] = {
    "/jax/core/compile/jaxpr_trace_duration": ("jax_trace", "trace"),
    "/jax/core/compile/jaxpr_to_mlir_module_duration": ("jax_lower", "lower"),
    "/jax/core/compile/backend_compile_duration": ("jax_compile", "backend_compile"),
}
"""``jax.monitoring`` time-span event -> (span name, ``phase`` metric attribute)."""
for _name, _ in COMPILE_PHASES.values():  # goodput: their time is compilation
    categories.declare(_name, categories.COMPILATION)

PROCESS_INDEX = "jax.process_index"
"""Step-span and metric attribute: ``jax.process_index()``."""
PROCESS_COUNT = "jax.process_count"
"""Step-span and metric attribute: ``jax.process_count()``."""

_INSTRUMENTATION_SCOPE = "otel_tunix.instrumentation.jax"


def import_jax() -> Any:
    """``import jax``, or a ModuleNotFoundError that names the extra to install."""
    return _base.require("jax", "jax", "otel-tunix's JAX instrumentation")


# --- helpers shared with the Tunix integration ---------------------------------------------
# JAX reports compile phases after the fact, and the Tunix integration measures a data fetch
# before it knows the step goes on: both record intervals with given start/end times.


def record_interval(name: str, start_ns: int, end_ns: int, blocked: bool = False) -> None:
    """Record the component ``name`` over ``[start_ns, end_ns]`` (``perf_counter_ns``).

    See :func:`otel_tunix.record_component`; never raises.
    """
    try:
        otel_tunix.record_component(name, start_ns, end_ns, blocked=blocked)
    except Exception:  # record_component() never raises: a bug of ours
        report_internal_error("recording a component interval")


current_step_record = otel_tunix.current_step


def run_meter(name: str = _INSTRUMENTATION_SCOPE) -> Any:
    """A Meter of the configured otel-tunix run's MeterProvider (else the global one)."""
    return otel_tunix.get_meter(name)


# --- process attributes --------------------------------------------------------------------


def _backends_ready(jax: Any) -> bool:
    """True once JAX has initialised its backends (asking earlier would start them, which
    must not happen before ``jax.distributed.initialize()``)."""
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except Exception:  # an older/newer JAX without the helper: be conservative
        return _process.attrs is not None


class _ProcessAttributes:
    """``jax.process_index()`` / ``process_count()``, read once the backends are up."""

    def __init__(self) -> None:
        self.attrs: dict[str, int] | None = None

    def get(self) -> dict[str, int]:
        attrs = self.attrs
        if attrs is not None:
            return attrs
        jax = sys.modules.get("jax")
        if jax is None or not _backends_ready(jax):
            return {}
        try:
            attrs = {
                PROCESS_INDEX: int(jax.process_index()),
                PROCESS_COUNT: int(jax.process_count()),
            }
        except Exception:  # JAX up but not answering: the steps go without these attributes
            attrs = {}
        self.attrs = attrs
        return attrs


_process = _ProcessAttributes()


def _tag_step() -> None:
    rec = current_step_record()
    if rec is not None and PROCESS_INDEX not in rec.attributes:
        rec.attributes.update(_process.get())


# --- device completion ---------------------------------------------------------------------


def device_end(tree: Any, *, step_memory: bool = False) -> Callable[[], int | None]:
    """A device-end resolver for ``component(...).end_on_device(...)``.

    It waits until every JAX array in ``tree`` is ready and returns
    ``time.perf_counter_ns()``. Arrays deleted in the meantime (donated to the next step)
    are skipped; if none could be waited on, it returns ``None`` (the host end is kept).
    It runs on otel-tunix's device-waiter thread, never on the training thread. With
    ``step_memory=True`` it then reads device memory for the step open at creation (once
    per step).
    """
    rec = current_step_record() if step_memory else None

    def resolve() -> int | None:
        jax = sys.modules.get("jax")
        if jax is None:
            return None
        try:
            jax.block_until_ready(tree)
            end: int | None = time.perf_counter_ns()
        except Exception:  # some array was deleted (donated): wait on the others
            waited = False
            for leaf in jax.tree_util.tree_leaves(tree):
                wait = getattr(leaf, "block_until_ready", None)
                if wait is None:
                    continue
                try:
                    if leaf.is_deleted():
                        continue
                    wait()
                    waited = True
                except Exception:  # deleted between the check and the wait: skip it too
                    continue
            end = time.perf_counter_ns() if waited else None
        if rec is not None:
            _step_memory.after(rec)
        return end

    return resolve


# --- compilation tracking ------------------------------------------------------------------


class _CompileTracker:
    """One ``jax.monitoring`` time-span listener for the process: compile phases become
    spans (inside sampled steps) and metrics (always)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._listener_list: Any = None  # the listener list we registered into
        self._jm: Any = None  # jax._src.monitoring, once imported
        self._instruments: tuple[Any, Any] | None = None  # (provider, histogram)

    @property
    def active(self) -> bool:
        return self._users > 0

    def acquire(self) -> None:
        with self._lock:
            self._users += 1
        self.ensure()

    def release(self) -> None:
        with self._lock:
            self._users = max(0, self._users - 1)
            if self._users:
                return
        jax = sys.modules.get("jax")
        if jax is None:
            return
        try:
            if self._on_time_span in jax.monitoring.get_event_time_span_listeners():
                jax.monitoring.unregister_event_time_span_listener(self._on_time_span)
        except Exception:
            _logger.debug("otel-tunix: removing the JAX listener failed", exc_info=True)
        self._listener_list = None

    def ensure(self) -> None:
        """(Re-)register the listener if someone cleared JAX's listeners (Tunix's
        ``MetricsLogger.close()`` calls ``jax.monitoring.clear_event_listeners()``, which
        replaces the listener list)."""
        if not self._users:
            return
        jm = self._jm
        if jm is None:
            import_jax()
            from jax._src import monitoring as jm

            self._jm = jm
        if jm._event_time_span_listeners is self._listener_list:
            return
        with self._lock:
            if self._on_time_span not in jm.get_event_time_span_listeners():
                jm.register_event_time_span_listener(self._on_time_span)
            self._listener_list = jm._event_time_span_listeners

    def _histogram(self) -> Any:
        provider = otel_tunix.current_run()
        inst = self._instruments
        if inst is None or inst[0] is not provider:
            hist = run_meter().create_histogram(
                "tunix.jax.compile.duration",
                unit="s",
                description="time spent tracing, lowering and compiling, by phase",
                explicit_bucket_boundaries_advisory=list(SECONDS_BUCKETS),
            )
            inst = self._instruments = (provider, hist)
        return inst[1]

    def _on_time_span(self, event: str, start: float, end: float, **kwargs: Any) -> None:
        phase = COMPILE_PHASES.get(event)
        if phase is None or not self._users:
            return
        try:
            span_name, phase_attr = phase
            offset = time.time_ns() - time.perf_counter_ns()
            record_interval(span_name, int(start * 1e9) - offset, int(end * 1e9) - offset)
            process = _process.get()
            self._histogram().record(max(0.0, end - start), {"phase": phase_attr, **process})
            if phase_attr == "backend_compile":
                fun = kwargs.get("fun_name")
                function = str(fun) if fun else "unknown"
                # the jitted function's name (``jit(train_step)``): bounded by the program's
                # code, as the compile cache's keys are
                attrs = {**process, "function": function}
                count_compilation("jax", _causes.cause(function), attrs)
        except Exception:  # our handler (record_interval and _process guard JAX's parts)
            report_internal_error("handling a JAX compile event")


_compile_tracker = _CompileTracker()
_causes = CompileCauses()


def ensure_compile_tracking() -> None:
    """Re-register the compile listener if JAX's listeners were cleared (no-op when off)."""
    try:
        _compile_tracker.ensure()
    except Exception:  # JAX's private monitoring module changed
        warn_once(
            ("jax", "ensure-listener"),
            "otel-tunix: re-registering the JAX listener failed (reported once)",
            logger=_logger,
            level=logging.DEBUG,
            exc_info=True,
        )


# --- the wrapper ---------------------------------------------------------------------------


class InstrumentedFunction:
    """A jitted function whose calls are recorded as a component ending on the device.

    Calls go straight to the wrapped function; everything else (``lower``, ``trace``,
    ``_cache_size``, ...) is forwarded to it. Use :func:`instrument_jit` to build one.
    """

    def __init__(self, fn: Callable[..., Any], component: str, blocked: bool = False) -> None:
        self.__wrapped__ = fn
        self._component = component
        self._blocked = blocked
        self._started = False
        functools.update_wrapper(self, fn, updated=())
        _compile_tracker.acquire()
        weakref.finalize(self, _compile_tracker.release)

    @property
    def component(self) -> str:
        """The component (span) name of each call."""
        return self._component

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self._started:
            self._started = True
            _base.ensure_configured()
        _compile_tracker.ensure()
        calls = _causes.calls
        outer, calls.call = calls.call, (self, args, kwargs)  # read only if JAX compiles
        try:
            if not may_record():  # outside the steps and any recorded component: no span
                return self.__wrapped__(*args, **kwargs)  # (its compilations still are)
            with otel_tunix.component(self._component, self._blocked) as c:
                out = self.__wrapped__(*args, **kwargs)
                if c.recording:
                    _tag_step()
                    c.end_on_device(device_end(out, step_memory=True))
        finally:
            calls.call = outer
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """Bind like a function when used as a method decorator."""
        if obj is None:
            return self
        return functools.partial(self.__call__, obj)

    def __repr__(self) -> str:
        return f"InstrumentedFunction({self.__wrapped__!r}, component={self._component!r})"


def instrument_jit(
    fn: Callable[..., Any], *, component: str = "train_step_compute", blocked: bool = False
) -> InstrumentedFunction:
    """Record each call of the jitted function ``fn`` as the component ``component``.

    The span starts at the call, ends when the outputs are ready on the device (resolved
    off the training thread), and carries the host dispatch time as
    ``tunix.host_duration_s``. Tracing, lowering and compilation inside the call (first
    call, new shapes) appear as child spans ``jax_trace``, ``jax_lower``, ``jax_compile``.
    Outside a sampled ``otel_tunix.step`` the call costs about a microsecond extra.

    Args:
        fn: A ``jax.jit`` / ``nnx.jit`` / ``pjit`` function (any callable returning JAX
            arrays works).
        component: Span name of each call.
        blocked: Count the call as blocked instead of busy time.
    """
    import_jax()
    return InstrumentedFunction(fn, component, blocked)


def jit(
    fun: Callable[..., Any] | None = None,
    *,
    component: str = "train_step_compute",
    **jit_kwargs: Any,
) -> Any:
    """``jax.jit`` plus :func:`instrument_jit`; also a decorator:
    ``@jit(component="train_step_compute", donate_argnums=0)``."""
    jax = import_jax()
    if fun is None:
        return lambda f: instrument_jit(jax.jit(f, **jit_kwargs), component=component)
    return instrument_jit(jax.jit(fun, **jit_kwargs), component=component)


# --- device memory ---------------------------------------------------------------------

_MEMORY_KEYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("allocated", ("bytes_in_use",)),
    ("reserved", ("pool_bytes", "bytes_reserved")),
    ("peak_allocated", ("peak_bytes_in_use",)),
    ("limit", ("bytes_limit",)),
)
"""otel-tunix memory key -> ``memory_stats()`` keys, first present wins."""


def memory_stats() -> tuple[dict[str, float], str] | None:
    """Device memory of this process's local devices as ``({key: bytes}, device label)``.

    Keys are otel-tunix's (``allocated``, ``reserved``, ``peak_allocated``, ``limit``: from
    ``bytes_in_use``, ``pool_bytes``, ``peak_bytes_in_use``, ``bytes_limit``); with several
    local devices each is the largest over them (the one that runs out first; ``limit``: the
    smallest) and the label is ``"<platform>:max"``. ``None`` before JAX started its
    backends, or when no device reports memory (CPU).
    """
    jax = sys.modules.get("jax")
    if jax is None or not _backends_ready(jax):
        return None
    try:
        devices = list(jax.local_devices())
    except Exception:  # JAX's backend not usable: no memory to report
        return None
    out: dict[str, float] = {}
    reporting = []
    for d in devices:
        try:
            stats = d.memory_stats()
        except Exception:  # a device that does not report memory: as if it had no stats
            stats = None
        if not stats:
            continue
        reporting.append(d)
        for key, names in _MEMORY_KEYS:
            for name in names:
                if name in stats:
                    value = float(stats[name])
                    if key == "limit":  # the smallest: the device that runs out first
                        out[key] = min(out.get(key, value), value)
                    else:
                        out[key] = max(out.get(key, 0.0), value)
                    break
    if not out:
        return None
    first = reporting[0]
    label = f"{first.platform}{first.id}" if len(reporting) == 1 else f"{first.platform}:max"
    return out, label


class _StepMemory:
    """Reads device memory once per sampled step, on the device-waiter thread."""

    def __init__(self) -> None:
        self._last: int | None = None

    def after(self, rec: Any) -> None:
        if rec is None or id(rec) == self._last:
            return
        self._last = id(rec)
        try:
            found = memory_stats()
            if found is not None:
                stats, label = found
                _base.record_device_memory(  # the span waits for this device end: its
                    stats,  # attributes are still the step's to add
                    device=label,
                    step=rec.number,
                    scope=rec.scope,
                    span_attributes=rec.attributes,
                )
        except Exception:  # memory_stats() guards JAX's calls: a bug of ours
            report_internal_error("reading JAX device memory after a step")


_step_memory = _StepMemory()


class JaxInstrumentor(_base.BaseInstrumentor):  # type: ignore[misc]
    """Compilation spans and metrics for any JAX program (entry point ``otel_tunix_jax``).

    ``JaxInstrumentor().instrument()`` (the ``opentelemetry-instrument`` command calls it at
    start). It does not import JAX: tracking starts when the program imports it. Under
    ``opentelemetry-instrument`` it also lets the integrations configure otel-tunix when
    training starts. Wrap the step function with :func:`instrument_jit` for device-accurate
    step spans and per-step device memory.
    """

    _acquired = False

    def instrumentation_dependencies(self) -> tuple[str, ...]:
        return ("jax >= 0.4.30",)

    def _instrument(self, **kwargs: Any) -> None:
        if importlib.util.find_spec("jax") is None:
            raise ModuleNotFoundError(f"No module named 'jax' ({EXTRA_HINT})", name="jax")
        _base.enable_auto_configure()
        carry_into_threads()
        JaxInstrumentor._active = True
        _base.when_imported("jax", _start_tracking, extra="jax")

    def _uninstrument(self, **kwargs: Any) -> None:
        JaxInstrumentor._active = False
        stop_carrying_into_threads()
        if JaxInstrumentor._acquired:
            JaxInstrumentor._acquired = False
            _compile_tracker.release()

    _active = False


def _start_tracking(_module: Any) -> None:
    if JaxInstrumentor._active and not JaxInstrumentor._acquired:
        JaxInstrumentor._acquired = True
        try:
            _compile_tracker.acquire()
        except Exception:
            _logger.debug("otel-tunix: starting JAX compile tracking failed", exc_info=True)
