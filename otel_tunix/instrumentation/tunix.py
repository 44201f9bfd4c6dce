"""Tunix instrumentation: a drop-in perf tracer, a metrics backend, and an instrumentor.

* :class:`OTelPerfTracer` implements Tunix's tracer protocol — v1
  (``tunix.perf.trace``: ``span(name, devices)`` yielding ``device_end(arrays)``,
  ``span_group(name)``) and v2 (``tunix.perf.experimental.tracer``: ``span(name, devices,
  tags=...)`` yielding ``async_end(arrays)``) — and records otel-tunix components instead of
  Tunix timelines. A span ends when its arrays are ready on the device, resolved on
  otel-tunix's one device-waiter thread (Tunix starts a thread per device per span). Pass it
  as ``PeftTrainer(..., perf_tracer=tracer)`` (or ``perf_tracer_v2=tracer.v2``).
* :class:`OTelLoggingBackend` is a metrax ``LoggingBackend`` (``log_scalar`` / ``close``)
  for ``MetricsLoggerOptions(backend_kwargs={"custom_backend": [OTelLoggingBackend]})``. It
  turns Tunix's scalars (``loss``, ``perplexity``, ``learning_rate``, ``grad_norm``, RL
  metrics) into OTel instruments named ``tunix.<name>`` with real units, ``scope`` (train /
  eval) and ``role`` (actor / critic) as attributes, and forwards them to otel-tunix's
  MetricsLogger (``metrics.jsonl``).
* :class:`TunixInstrumentor` (entry point ``otel_tunix_tunix``) applies both to an unmodified Tunix
  program and adds the step structure: one ``train`` step per trainer iteration (``rl/actor``
  / ``rl/critic`` for RL trainers, ``rl/learner`` per RL global step, ``eval`` per
  evaluation batch) with ``train_data_load``, ``train_inflight_wait`` (blocked),
  ``peft_train_step`` (ends on the device), ``checkpoint_save`` and ``eval_step_compute``.

Usage::

    import otel_tunix
    from otel_tunix.instrumentation.tunix import TunixInstrumentor

    otel_tunix.configure(service_name="tunix-sft")
    TunixInstrumentor().instrument()
    trainer = peft_trainer.PeftTrainer(model, optimizer, config)   # unchanged
    trainer.train(train_ds, eval_ds)
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import itertools
import logging
import math
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import otel_tunix
from otel_tunix._errors import report_internal_error, warn_once
from otel_tunix.instrumentation import _base
from otel_tunix.instrumentation._base import step_is_open
from otel_tunix.instrumentation.jax import (
    device_end,
    ensure_compile_tracking,
    record_interval,
    run_meter,
)
from otel_tunix.logging_backend import PERF_SOURCE, LoggingBackend, to_scalar
from otel_tunix.metrics.catalog import SECONDS_BUCKETS

__all__ = [
    "OTelLoggingBackend",
    "OTelPerfTracer",
    "TunixInstrumentor",
    "TunixMetric",
    "parse_event",
]

_logger = logging.getLogger(__name__)

EXTRA_HINT = "pip install 'otel-tunix[tunix]'"

DEFAULT_STEP_GROUPS: Mapping[str, str] = {"global_step": "rl/learner"}
"""Tunix span groups that open an otel-tunix step, and the step's scope."""

_clock = time.perf_counter_ns


# --- the tracer ----------------------------------------------------------------------------


class _Waitlist:
    """What a tracer span yields: ``device_end(arrays)`` (v1) and ``async_end(arrays)``
    (v2) both add arrays whose readiness ends the span."""

    __slots__ = ("arrays",)

    def __init__(self) -> None:
        self.arrays: list[Any] = []

    def device_end(self, waitlist: Any) -> None:
        """Tunix v1: the span ends when ``waitlist`` (a pytree of arrays) is ready."""
        self.arrays.append(waitlist)

    def async_end(self, waitlist: Any) -> None:
        """Tunix v2: same as :meth:`device_end`."""
        self.arrays.append(waitlist)

    @property
    def waitlist(self) -> list[Any]:
        """The arrays added so far (Tunix v2's ``AsyncWaitlist.waitlist``)."""
        return self.arrays


class _OpenSpan:
    __slots__ = ("api", "owner", "waitlist")

    def __init__(self, owner: _TracerState, api: str, waitlist: _Waitlist) -> None:
        self.owner = owner
        self.api = api
        self.waitlist = waitlist


_innermost: contextvars.ContextVar[_OpenSpan | None] = contextvars.ContextVar(
    "otel_tunix_tunix_span", default=None
)


class _TracerState:
    """What the v1 and v2 faces of one tracer share."""

    def __init__(
        self, scope: str, step_groups: Mapping[str, str], devices: Iterable[Any] | None
    ) -> None:
        self.scope = scope
        self.step_groups = dict(step_groups)
        self.devices: list[str] = [_device_id(d) for d in _flat(devices)]
        self.counters: dict[str, itertools.count[int]] = {}
        self.lock = threading.Lock()

    def next_number(self, scope: str) -> int:
        with self.lock:
            counter = self.counters.get(scope)
            if counter is None:
                counter = self.counters[scope] = itertools.count()
            return next(counter)

    def note_devices(self, devices: Any) -> None:
        if devices is None:
            return
        for d in _flat(devices):
            did = _device_id(d)
            if did not in self.devices:
                self.devices.append(did)


def _flat(devices: Any) -> list[Any]:
    if devices is None:
        return []
    flat = getattr(devices, "flat", None)  # numpy array of devices (mesh.devices)
    if flat is not None:
        return list(flat)
    return list(devices)


def _device_id(device: Any) -> str:
    if isinstance(device, str):
        return device
    platform, did = getattr(device, "platform", None), getattr(device, "id", None)
    return f"{platform}{did}" if platform is not None and did is not None else str(device)


class OTelPerfTracer:
    """Tunix's perf tracer protocol, recorded as otel-tunix steps and components.

    * ``span(name, devices=None, tags=None)`` is the component ``name``. Arrays given to the
      yielded object's ``device_end`` (v1) / ``async_end`` (v2) end it on the device. A
      span opened when no ``otel_tunix.step`` is open gets a step of its own in ``scope``,
      numbered by ``tags["step"]`` when that is an int, else by a counter.
    * ``span_group(name)`` opens a step when ``name`` is in ``step_groups``
      (``global_step`` -> ``rl/learner``) and no step is open; otherwise it is a component.
    * ``synchronize()``, ``print()`` do nothing (device ends resolve on their own);
      ``export()`` returns ``{}``: the ``perf/...`` metrics come from otel-tunix's accounting.

    ``tracer`` speaks v1 and ``tracer.v2`` v2; both record into the same steps. A v2 span
    opened directly inside a v1 span of the same tracer (Tunix opens both around one
    computation) is merged into it instead of doubling it. Never raises into Tunix.

    Args:
        devices: Devices to list in ``all_devices`` (others are added as spans name them).
        scope: Scope of the steps that spans open on their own.
        step_groups: ``{group name: scope}`` of span groups that open steps.
    """

    api = "v1"

    def __init__(
        self,
        devices: Iterable[Any] | None = None,
        *,
        scope: str = "train",
        step_groups: Mapping[str, str] = DEFAULT_STEP_GROUPS,
        _state: _TracerState | None = None,
    ) -> None:
        self._state = _state or _TracerState(scope, step_groups, devices)

    @property
    def v2(self) -> OTelPerfTracer:
        """The same tracer, for ``perf_tracer_v2=`` (Tunix's experimental protocol)."""
        if self.api == "v2":
            return self
        return _V2Tracer(_state=self._state)

    @property
    def v1(self) -> OTelPerfTracer:
        """The same tracer, for ``perf_tracer=`` (Tunix's v1 protocol)."""
        if self.api == "v1":
            return self
        return OTelPerfTracer(_state=self._state)

    @property
    def scope(self) -> str:
        """Scope of the steps that spans open when no step is open."""
        return self._state.scope

    @property
    def all_devices(self) -> list[str]:
        """Ids of the devices seen so far (``"cpu0"``, ``"tpu3"``, ...)."""
        return list(self._state.devices)

    def synchronize(self) -> None:
        """Nothing to do: device ends resolve on otel-tunix's waiter thread."""

    def print(self) -> None:
        """Nothing to print: the spans go to otel-tunix's exporters."""

    def export(self) -> dict[str, Any]:
        """No metrics: otel-tunix's accounting publishes ``perf/<scope>/...`` itself."""
        return {}

    def process_and_commit_timelines(self) -> None:
        """Tunix v2 API; nothing to commit."""

    @contextlib.contextmanager
    def span_group(self, name: str) -> Iterator[None]:
        """A Tunix span group: a step (see ``step_groups``) or a component."""
        st = self._state
        scope = st.step_groups.get(name)
        try:
            if scope is not None and not step_is_open():
                _base.ensure_configured()
                cm: Any = otel_tunix.step(st.next_number(scope), scope=scope)
            else:
                cm = otel_tunix.component(name)
        except Exception:  # only our own code above
            cm = contextlib.nullcontext()
            report_internal_error("opening a Tunix span group")
        with cm:
            yield

    @contextlib.contextmanager
    def span(
        self,
        name: str,
        devices: Any = None,
        tags: Mapping[str, Any] | None = None,
    ) -> Iterator[_Waitlist]:
        """A Tunix span: the component ``name``, ending when its waitlist is ready."""
        st = self._state
        outer = _innermost.get()
        if outer is not None and outer.owner is st and outer.api != self.api:
            # ``with tracer.span(a) as s, tracer_v2.span(b) as s2``: one computation.
            yield outer.waitlist
            return
        waitlist = _Waitlist()
        step_cm: Any = None
        comp: Any = None
        token = None
        try:
            st.note_devices(devices)
        except Exception:  # devices as Tunix gave them, not readable: the span is not recorded
            warn_once(
                (id(st), "devices"),
                "otel-tunix: Tunix span %r: devices not readable",
                name,
                logger=_logger,
                level=logging.DEBUG,
                exc_info=True,
            )
        else:
            try:
                if not step_is_open():
                    _base.ensure_configured()
                    n = tags.get("step") if tags else None
                    if not isinstance(n, int) or isinstance(n, bool):
                        n = st.next_number(st.scope)
                    step_cm = otel_tunix.step(n, scope=st.scope)
                    step_cm.__enter__()
                comp = otel_tunix.component(name)
                comp.__enter__()
                token = _innermost.set(_OpenSpan(st, self.api, waitlist))
            except Exception:  # only our own code above
                report_internal_error("opening a Tunix span")
        try:
            yield waitlist
        except BaseException as exc:  # the traced code's own error: on the span, then raised on
            _close_span(comp, step_cm, token, waitlist, exc)
            raise
        _close_span(comp, step_cm, token, waitlist, None)


class _V2Tracer(OTelPerfTracer):
    api = "v2"


def _close_span(
    comp: Any, step_cm: Any, token: Any, waitlist: _Waitlist, exc: BaseException | None
) -> None:
    try:
        if token is not None:
            _innermost.reset(token)
        if comp is not None:
            if waitlist.arrays and comp.recording:
                comp.end_on_device(device_end(list(waitlist.arrays)))
            comp.__exit__(type(exc) if exc else None, exc, None)
        if step_cm is not None:
            step_cm.__exit__(type(exc) if exc else None, exc, None)
    except ValueError:  # reset() in another context (thread or task) than the span was opened in
        warn_once(
            ("tunix", "span-context"),
            "otel-tunix: closing a Tunix span failed: it was left in another context than it "
            "was entered in",
            logger=_logger,
            level=logging.DEBUG,
            exc_info=True,
        )
    except Exception:  # the step and component close themselves without raising
        report_internal_error("closing a Tunix span")


# --- the metrics backend -------------------------------------------------------------------

MODES = ("train", "eval")

CATEGORIES = frozenset(
    {
        "advantages", "clip_ratio", "completions", "loss", "objective", "perf", "policy",
        "returns", "reward", "rewards", "sample", "score", "scores", "val", "values",
    }
)  # fmt: skip
"""First name parts that Tunix's RL cluster splits off as a "prefix" but that belong to the
metric name (``rewards/mean`` is logged as ``rewards/train/mean``). Other prefixes are
trainer roles (``actor``, ``critic``, a ``metrics_prefix``)."""


class TunixMetric:
    """A Tunix scalar event, parsed: ``<prefix>/<mode>/<name>``."""

    __slots__ = ("mode", "name", "role")

    def __init__(self, name: str, mode: str | None, role: str | None) -> None:
        self.name = name
        self.mode = mode
        self.role = role

    @property
    def instrument_name(self) -> str:
        """``tunix.`` + the name with ``/`` as ``.`` (``tunix.rewards.mean``)."""
        return ("tunix." + _NOT_NAME.sub("_", self.name).replace("/", "."))[:255]

    @property
    def logger_name(self) -> str:
        """Slash-style name for otel-tunix's MetricsLogger (``loss``, ``eval/loss``,
        ``actor/kl``)."""
        parts = [p for p in (self.role, "eval" if self.mode == "eval" else None) if p]
        return "/".join([*parts, self.name])

    @property
    def unit(self) -> str:
        """The UCUM unit: ``s`` for times, ``{token}`` for lengths, else ``1``."""
        leaf = self.name.rsplit("/", 1)[-1]
        if self.name.startswith("perf/") or leaf.endswith(
            ("_time", "_sec", "_secs", "_seconds", "_time_sec")
        ):
            return "s"
        if leaf.endswith("per_sec"):
            return "1/s"
        if "length" in leaf or "tokens" in leaf:
            return "{token}"
        return "1"

    @property
    def attributes(self) -> dict[str, str]:
        attrs = {"scope": self.mode or "train"}
        if self.role:
            attrs["role"] = self.role
        return attrs

    def __repr__(self) -> str:
        return f"TunixMetric({self.name!r}, mode={self.mode!r}, role={self.role!r})"


_NOT_NAME = re.compile(r"[^A-Za-z0-9_./\-]")


def parse_event(event: str) -> TunixMetric:
    """Parse Tunix's ``f"{metrics_prefix}/{mode}/{name}"`` event names.

    ``/train/loss`` -> ``loss`` (train); ``actor/train/kl`` -> ``kl`` (train, role actor);
    ``rewards/eval/mean`` -> ``rewards/mean`` (eval); ``global/train/kl`` -> ``kl``. Anything
    else is taken as a plain name.
    """
    parts = event.split("/")
    if len(parts) >= 3 and parts[1] in MODES:
        prefix, mode, name = parts[0], parts[1], "/".join(parts[2:])
        if prefix in ("", "global"):
            return TunixMetric(name, mode, None)
        if prefix in CATEGORIES:
            return TunixMetric(f"{prefix}/{name}", mode, None)
        return TunixMetric(name, mode, prefix)
    return TunixMetric(event.strip("/") or event, None, None)


_live_backends: list[OTelLoggingBackend] = []
_live_lock = threading.Lock()


class OTelLoggingBackend(LoggingBackend):
    """A metrax ``LoggingBackend`` that publishes Tunix's scalars as OTel instruments.

    Tunix's ``MetricsLogger`` hands every backend to ``jax.monitoring`` as a scalar
    listener, so each backend sees every Tunix metric of the process (and JAX's own
    ``/jax/...`` scalars, which are ignored). When several are alive, only the oldest
    publishes, so nothing is counted twice.

    Times (unit ``s``) become histograms, everything else gauges (last value per ``scope`` /
    ``role``). Each scalar is also logged to otel-tunix's MetricsLogger under its
    slash-style name (``loss``, ``eval/loss``, ``actor/kl``) at its step. Never raises.

    Args:
        forward: Also log to otel-tunix's MetricsLogger (``metrics.jsonl``, console).
        meter_provider: Where the instruments live (default: the otel-tunix run's).
    """

    def __init__(self, *, forward: bool = True, meter_provider: Any = None) -> None:
        self._forward = forward
        self._provider = meter_provider
        self._meter: Any = None
        self._meter_from: Any = None
        self._instruments: dict[str, Any] = {}
        self._parsed: dict[str, TunixMetric] = {}
        self._closed = False
        with _live_lock:
            _live_backends.append(self)

    def _instrument(self, metric: TunixMetric) -> Any:
        meter = self._current_meter()
        key = metric.instrument_name
        inst = self._instruments.get(key)
        if inst is None:
            unit = metric.unit
            desc = f"Tunix metric {metric.name}"
            if unit == "s":
                inst = meter.create_histogram(
                    key,
                    unit=unit,
                    description=desc,
                    explicit_bucket_boundaries_advisory=list(SECONDS_BUCKETS),
                )
            else:
                inst = meter.create_gauge(key, unit=unit, description=desc)
            self._instruments[key] = inst
        return inst

    def _current_meter(self) -> Any:
        if self._provider is not None:
            if self._meter is None:
                self._meter = self._provider.get_meter(
                    "otel_tunix.instrumentation.tunix", otel_tunix.__version__
                )
            return self._meter
        source = otel_tunix.current_run()
        if self._meter is None or source is not self._meter_from:
            self._meter = run_meter("otel_tunix.instrumentation.tunix")
            self._meter_from = source
            self._instruments = {}
        return self._meter

    def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
        """Publish one Tunix scalar (``kwargs`` carries ``step``)."""
        if self._closed or event.startswith("/jax/"):
            return
        try:
            if _live_backends and _live_backends[0] is not self:
                return
            metric = self._parsed.get(event)
            if metric is None:
                metric = self._parsed[event] = parse_event(event)
            try:
                v = to_scalar(value)
            except Exception as exc:
                self._warn_once(event, "otel-tunix: Tunix metric %r skipped: %s", event, exc)
                return
            inst = self._instrument(metric)
            if math.isfinite(v):
                if metric.unit == "s":
                    inst.record(v, metric.attributes)
                else:
                    inst.set(v, metric.attributes)
            if self._forward:
                step = kwargs.get("step")
                otel_tunix.get_metrics_logger().log(
                    metric.logger_name,
                    v,
                    step=int(step) if step is not None else None,
                    source=PERF_SOURCE,  # already an OTel instrument: OTelBackend skips it
                )
        except Exception:
            self._warn_once("!" + event, "otel-tunix: Tunix metric %r failed", event)

    def _warn_once(self, key: str, msg: str, *args: Any) -> None:
        warn_once(
            (id(self), key), msg, *args, logger=_logger,
            exc_info=_logger.isEnabledFor(logging.DEBUG),
        )  # fmt: skip

    def close(self) -> None:
        """Stop publishing (Tunix calls it when its MetricsLogger closes)."""
        self._closed = True
        with _live_lock:
            if self in _live_backends:
                _live_backends.remove(self)


# --- trainer loops (used by the instrumentor) ----------------------------------------------


def _open_step_at(n: int, scope: str, start_ns: int) -> Any:
    """Enter ``otel_tunix.step(n, scope)`` as if it had been entered at ``start_ns``."""
    s = otel_tunix.step(n, scope=scope, start_ns=start_ns)
    s.__enter__()
    return s


class _LoopSteps:
    """One otel-tunix step per iteration of a trainer loop over an iterator.

    A step starts when the iteration's batch fetch starts (the fetch is its
    ``<prefix>_data_load`` component) and ends when the next fetch starts, or when the loop
    ends. A fetch that finds the data exhausted, or that the trainer will not train on
    (``max_steps`` reached), opens no step.
    """

    def __init__(
        self,
        scope: str,
        data_component: str,
        number: Callable[[], int],
        stop: Callable[[], bool] | None = None,
    ) -> None:
        self.scope = scope
        self.data_component = data_component
        self._number = number
        self._stop = stop
        self._open: Any = None

    def close(self) -> None:
        s, self._open = self._open, None
        if s is not None:
            try:
                s.__exit__(None, None, None)
            except Exception:  # a step closes itself without raising: a bug of ours
                report_internal_error("closing a Tunix step")

    def wrap(self, iterable: Iterable[Any]) -> Iterator[Any]:
        return _StepIterator(iter(iterable), self)

    def fetched(self, start_ns: int, end_ns: int) -> None:
        try:
            if self._stop is not None and self._stop():
                return
            n = self._number()
        except Exception:  # the trainer's private attributes (_iter_steps, max_steps) changed
            warn_once(
                ("tunix", "step-number"),
                "otel-tunix: reading the Tunix trainer's step failed; steps not recorded",
                logger=_logger,
                level=logging.DEBUG,
                exc_info=True,
            )
            return
        try:
            self._open = _open_step_at(n, self.scope, start_ns)
            record_interval(self.data_component, start_ns, end_ns)
        except Exception:  # only our own code: a bug of ours
            report_internal_error("opening a Tunix step")


class _StepIterator:
    __slots__ = ("_inner", "_steps")

    def __init__(self, inner: Iterator[Any], steps: _LoopSteps) -> None:
        self._inner = inner
        self._steps = steps

    def __iter__(self) -> _StepIterator:
        return self

    def __next__(self) -> Any:
        self._steps.close()
        start = _clock()
        item = next(self._inner)
        self._steps.fetched(start, _clock())
        return item

    def __getattr__(self, name: str) -> Any:  # get_state / set_state of grain iterators
        return getattr(self._inner, name)


def _trainer_scope(trainer: Any) -> str:
    prefix = getattr(trainer, "metrics_prefix", "") or ""
    return f"rl/{prefix}" if prefix in ("actor", "critic") else "train"


def _will_stop(trainer: Any) -> bool:
    cfg = getattr(trainer, "config", None)
    max_steps = getattr(cfg, "max_steps", None)
    return (
        not getattr(trainer, "is_managed_externally", False)
        and max_steps is not None
        and getattr(trainer, "_train_steps", 0) >= max_steps
    )


def _wrap_train(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    if not _active.is_set():
        return wrapped(*args, **kwargs)
    _base.ensure_configured()
    ensure_compile_tracking()
    steps = _LoopSteps(
        _trainer_scope(instance),
        "train_data_load",
        number=lambda: int(getattr(instance, "_iter_steps", 0)),
        stop=lambda: _will_stop(instance),
    )
    args = list(args)
    if args:
        args[0] = steps.wrap(args[0])
    elif "train_ds" in kwargs:
        kwargs["train_ds"] = steps.wrap(kwargs["train_ds"])
    instance._otel_tunix_steps = steps
    try:
        return wrapped(*args, **kwargs)
    finally:
        steps.close()
        instance._otel_tunix_steps = None


def _wrap_run_eval(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    if not _active.is_set():
        return wrapped(*args, **kwargs)
    train_steps = getattr(instance, "_otel_tunix_steps", None)
    if train_steps is not None:
        train_steps.close()  # evaluation is its own scope, not part of the train step
    counter = getattr(instance, "_otel_tunix_eval_count", None)
    if counter is None:
        counter = instance._otel_tunix_eval_count = itertools.count()
    eval_steps = _LoopSteps("eval", "eval_data_load", number=lambda: next(counter))
    args = list(args)
    if args:
        args[0] = eval_steps.wrap(args[0])
    if len(args) > 1:
        args[1] = _eval_step_fn(args[1])
    elif "eval_step_fn" in kwargs:
        kwargs["eval_step_fn"] = _eval_step_fn(kwargs["eval_step_fn"])
    try:
        return wrapped(*args, **kwargs)
    finally:
        eval_steps.close()


def _eval_step_fn(fn: Callable[..., Any]) -> Callable[..., Any]:
    def eval_step(*args: Any, **kwargs: Any) -> Any:
        with otel_tunix.component("eval_step_compute") as c:
            out = fn(*args, **kwargs)
            if c.recording:
                c.end_on_device(device_end(out[0] if isinstance(out, tuple) else out))
        return out

    return eval_step


def _wrap_checkpoint_save(
    wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any
) -> Any:
    if not _active.is_set() or not step_is_open():
        return wrapped(*args, **kwargs)
    try:
        manager = getattr(instance, "_checkpoint_manager", None)
        step = args[0] if args else kwargs.get("step")
        force = kwargs.get("force", args[4] if len(args) > 4 else False)
        saves = manager is not None and (force or manager.should_save(step))
    except Exception:  # Tunix's private checkpoint API changed: time the call all the same
        saves = True
    if not saves:
        return wrapped(*args, **kwargs)
    with otel_tunix.component("checkpoint_save"):
        return wrapped(*args, **kwargs)


def _wrap_wait_for_next(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    q = getattr(instance, "_inflight_queue", None)
    if not _active.is_set() or q is None or not q.full():
        return wrapped(*args, **kwargs)
    with otel_tunix.component("train_inflight_wait", blocked=True):
        return wrapped(*args, **kwargs)


def _swap_noop_tracers(instance: Any, v1_attr: str, v2_attr: str) -> None:
    """Replace Tunix's default no-op tracers on ``instance`` with the shared OTel tracer."""
    if not (_active.is_set() and _shared_tracer is not None):
        return
    try:
        from tunix.perf import trace as v1
        from tunix.perf.experimental import tracer as v2

        if type(getattr(instance, v1_attr, None)) is v1.NoopTracer:
            setattr(instance, v1_attr, _shared_tracer)
        if type(getattr(instance, v2_attr, None)) is v2.NoopTracer:
            setattr(instance, v2_attr, _shared_tracer.v2)
    except Exception:  # Tunix's private tracer modules or attributes changed
        warn_once(
            ("tunix", "tracer"),
            "otel-tunix: setting the Tunix tracer failed (reported once)",
            logger=_logger,
            level=logging.DEBUG,
            exc_info=True,
        )


def _wrap_peft_init(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    result = wrapped(*args, **kwargs)
    _swap_noop_tracers(instance, "_perf_tracer", "_perf_tracer_v2")
    return result


def _wrap_init_cluster(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    result = wrapped(*args, **kwargs)
    _swap_noop_tracers(instance, "_perf", "_perf_v2")
    return result


def _wrap_metrics_logger_init(
    wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any
) -> Any:
    result = wrapped(*args, **kwargs)
    if not _active.is_set():
        return result
    try:
        import jax

        backends = getattr(instance, "_backends", None)
        if (
            jax.process_index() == 0
            and isinstance(backends, list)
            and not any(isinstance(b, OTelLoggingBackend) for b in backends)
        ):
            backend = OTelLoggingBackend()
            backends.append(backend)
            jax.monitoring.register_scalar_listener(backend.log_scalar)
    except Exception:  # Tunix's MetricsLogger internals or jax.monitoring changed
        warn_once(
            ("tunix", "metrics-backend"),
            "otel-tunix: adding the Tunix metrics backend failed (reported once)",
            logger=_logger,
            level=logging.DEBUG,
            exc_info=True,
        )
    return result


# --- the instrumentor ----------------------------------------------------------------------

_active = threading.Event()
_shared_tracer: OTelPerfTracer | None = None

_PATCHES: tuple[tuple[str, str, Callable[..., Any]], ...] = (
    ("tunix.sft.peft_trainer", "PeftTrainer.__init__", _wrap_peft_init),
    ("tunix.sft.peft_trainer", "PeftTrainer.train", _wrap_train),
    ("tunix.sft.peft_trainer", "PeftTrainer._run_eval", _wrap_run_eval),
    ("tunix.sft.checkpoint_manager", "CheckpointManager.save", _wrap_checkpoint_save),
    ("tunix.sft.inflight_throttler", "InflightThrottler.wait_for_next", _wrap_wait_for_next),
    ("tunix.sft.metrics_logger", "MetricsLogger.__init__", _wrap_metrics_logger_init),
    ("tunix.rl.rl_cluster", "RLCluster._init_cluster", _wrap_init_cluster),
)
_patched: set[tuple[str, str]] = set()
_hooked: set[str] = set()
_patch_lock = threading.Lock()


def _apply_on_import(module_name: str) -> _base.OnImport:
    """A post-import hook that patches ``module_name``."""
    return lambda _module: _apply(module_name)


def _apply(module_name: str) -> None:
    """Patch what lives in ``module_name`` (now imported); idempotent."""
    module = sys.modules.get(module_name)
    if module is None or not _active.is_set():
        return
    with _patch_lock:
        for mod, target, wrapper in _PATCHES:
            if mod != module_name or (mod, target) in _patched:
                continue
            try:
                import wrapt

                wrapt.wrap_function_wrapper(module, target, wrapper)
                _patched.add((mod, target))
            except Exception:  # this Tunix version has no such target
                warn_once(
                    ("tunix", "patch", mod, target),
                    "otel-tunix: could not patch %s.%s",
                    mod,
                    target,
                    logger=_logger,
                    exc_info=True,
                )


class TunixInstrumentor(_base.BaseInstrumentor):  # type: ignore[misc]
    """Applies :class:`OTelPerfTracer` and :class:`OTelLoggingBackend` to an unmodified
    Tunix program, with one otel-tunix step per trainer iteration.

    Patches, applied when the Tunix modules are imported (importing otel-tunix never
    imports Tunix):

    * ``PeftTrainer`` (and the RL ``Trainer``) / ``RLCluster``: the default no-op perf
      tracers become one shared :class:`OTelPerfTracer` (an explicit Tunix ``PerfTracer`` is
      left alone); ``train()`` opens a step per iteration (scope ``train``, or ``rl/actor``
      / ``rl/critic`` by ``metrics_prefix``) with ``train_data_load``; evaluation runs
      as ``eval`` steps with ``eval_data_load`` and ``eval_step_compute`` (device end).
    * ``InflightThrottler.wait_for_next``: ``train_inflight_wait`` (blocked) when it waits.
    * ``CheckpointManager.save``: ``checkpoint_save`` when it saves.
    * Tunix's ``MetricsLogger``: gains an :class:`OTelLoggingBackend` (process 0).

    Options of ``instrument()``: ``tracer`` (an :class:`OTelPerfTracer` to use instead).
    Combine with :class:`otel_tunix.instrumentation.jax.JaxInstrumentor` for compilation
    spans and device memory.
    """

    def instrumentation_dependencies(self) -> tuple[str, ...]:
        return ("google-tunix >= 0.1.7",)

    def _instrument(self, **kwargs: Any) -> None:
        if importlib.util.find_spec("tunix") is None:
            raise ModuleNotFoundError(f"No module named 'tunix' ({EXTRA_HINT})", name="tunix")
        global _shared_tracer
        tracer = kwargs.get("tracer")
        _shared_tracer = tracer if isinstance(tracer, OTelPerfTracer) else OTelPerfTracer()
        _base.enable_auto_configure()
        _active.set()
        for module_name in dict.fromkeys(mod for mod, _, _ in _PATCHES):
            if module_name not in _hooked:
                _hooked.add(module_name)
                _base.when_imported(module_name, _apply_on_import(module_name))
            else:
                _apply(module_name)

    def _uninstrument(self, **kwargs: Any) -> None:
        from opentelemetry.instrumentation.utils import unwrap

        global _shared_tracer
        _active.clear()
        with _patch_lock:
            for mod, target in list(_patched):
                module = sys.modules.get(mod)
                if module is None:
                    continue
                owner_name, _, attr = target.rpartition(".")
                owner = getattr(module, owner_name, None)
                if owner is not None:
                    unwrap(owner, attr)
                _patched.discard((mod, target))
        _shared_tracer = None
