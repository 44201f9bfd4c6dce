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
  metrics) into OTel instruments with real units, named as Tunix's own OTel double-write
  names them (``tunix.training.loss``, ``tunix.training.gradient.norm``; any other metric
  ``tunix.<name>``), with Tunix's attributes ``tunix.training.mode`` (train / eval) and
  ``tunix.metrics.prefix`` (actor / critic), and forwards them to otel-tunix's
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

import importlib.util
import itertools
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import otel_tunix
from otel_tunix.accounting import categories
from otel_tunix.instrumentation import _base
from otel_tunix.instrumentation import _tunix_orchestrator as _orchestrator
from otel_tunix.instrumentation._base import step_is_open
from otel_tunix.instrumentation._threads import carry_into_threads, stop_carrying_into_threads
from otel_tunix.instrumentation._tunix_metrics import CATEGORIES as CATEGORIES
from otel_tunix.instrumentation._tunix_metrics import MODES as MODES
from otel_tunix.instrumentation._tunix_metrics import (
    OTelLoggingBackend,
    StepGaugeOnly,
    TunixMetric,
    parse_event,
)
from otel_tunix.instrumentation._tunix_perf import LEARNER_SCOPE
from otel_tunix.instrumentation._tunix_steps import _LoopSteps
from otel_tunix.instrumentation._tunix_tracer import COMPONENT_NAMES as COMPONENT_NAMES
from otel_tunix.instrumentation._tunix_tracer import DEFAULT_STEP_GROUPS as DEFAULT_STEP_GROUPS
from otel_tunix.instrumentation._tunix_tracer import TAG_ATTRIBUTES as TAG_ATTRIBUTES
from otel_tunix.instrumentation._tunix_tracer import OTelPerfTracer, TeeTracer
from otel_tunix.instrumentation.jax import device_end, ensure_compile_tracking
from otel_tunix.settings import tally as _tally
from otel_tunix.support.errors import warn_once

__all__ = [
    "OTelLoggingBackend",
    "OTelPerfTracer",
    "TeeTracer",
    "TunixInstrumentor",
    "TunixMetric",
    "parse_event",
]

_logger = logging.getLogger(__name__)

EXTRA_HINT = "pip install 'otel-tunix[tunix]'"

PROFILER_STEP = "tunix.profiler_step"
"""Step attribute: the number Tunix's XProf annotations give the same step
(``StepTraceAnnotation(step_num=...)``: the trainer's ``_iter_steps`` as the iteration
starts, 0-based; the learner's ``_iter_steps`` as an RL global step starts), beside
``tunix.step``, the number Tunix's MetricsLogger logs the step's metrics at."""


# --- trainer patches (applied by the instrumentor) -----------------------------------------


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
    # Numbered as Tunix logs the iteration's metrics: one past its update count, so
    # ``loss`` at step n in metrics.jsonl is the step n span's (``tunix.train_step`` too,
    # which with gradient accumulation several iterations share).
    steps = _LoopSteps(
        _trainer_scope(instance),
        "train_data_load",
        number=lambda: int(instance._iter_steps) + 1,
        stop=lambda: _will_stop(instance),
        attributes=lambda: {
            "tunix.train_step": int(instance._train_steps) + 1,
            PROFILER_STEP: int(instance._iter_steps),
        },
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
    eval_steps = _LoopSteps(
        "eval",
        "eval_data_load",
        number=lambda: next(counter),
        attributes=lambda: {"tunix.train_step": int(instance._train_steps)},
    )
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


def _orbax(manager: Any) -> Any:
    """The Orbax object a Tunix ``CheckpointManager`` saves with: ``_checkpoint_manager``
    (google-tunix 0.1.7, Orbax's ``CheckpointManager``) or ``_checkpointer`` (Tunix HEAD,
    Orbax v1's ``training.Checkpointer``); both answer ``should_save(step)``."""
    return getattr(manager, "_checkpoint_manager", None) or getattr(manager, "_checkpointer", None)


def _wrap_checkpoint_save(
    wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any
) -> Any:
    if not _active.is_set() or not step_is_open():
        return wrapped(*args, **kwargs)
    try:
        orbax = _orbax(instance)
        step = args[0] if args else kwargs.get("step")
        force = kwargs.get("force", args[4] if len(args) > 4 else False)
        saves = orbax is not None and (force or orbax.should_save(step))
    except Exception:  # Tunix's private checkpoint API changed: time the call all the same
        saves = True
    if not saves:
        return wrapped(*args, **kwargs)
    with otel_tunix.component("checkpoint_save"):
        return wrapped(*args, **kwargs)


def _wrap_checkpoint_restore(
    wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any
) -> Any:
    """``checkpoint_restore`` around a restore that has a checkpoint to read (before the
    loop: a component outside any step)."""
    if not _active.is_set():
        return wrapped(*args, **kwargs)
    try:
        step = args[2] if len(args) > 2 else kwargs.get("step")
        restores = _orbax(instance) is not None and (
            step is not None or instance.latest_step() is not None
        )
    except Exception:  # Tunix's private checkpoint API changed: time the call all the same
        restores = True
    if not restores:
        return wrapped(*args, **kwargs)
    with otel_tunix.component("checkpoint_restore"):
        return wrapped(*args, **kwargs)


def _wrap_wait_for_next(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    q = getattr(instance, "_inflight_queue", None)
    if not _active.is_set() or q is None or not q.full():
        return wrapped(*args, **kwargs)
    with otel_tunix.component("train_inflight_wait", blocked=True):
        return wrapped(*args, **kwargs)


def _set_tracers(instance: Any, v1_attr: str, v2_attr: str) -> None:
    """Give ``instance`` the shared OTel tracer: in place of Tunix's default no-op tracers,
    or beside Tunix's own (a :class:`TeeTracer` feeding both)."""
    ours = _shared_tracer
    if not (_active.is_set() and ours is not None):
        return
    try:
        from tunix.perf import trace as v1
        from tunix.perf.experimental import tracer as v2

        for name, module, face in ((v1_attr, v1, ours), (v2_attr, v2, ours.v2)):
            current = getattr(instance, name, None)
            if type(current) is module.NoopTracer:
                setattr(instance, name, face)
            elif isinstance(current, module.PerfTracer):
                setattr(instance, name, TeeTracer(current, face))
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
    _set_tracers(instance, "_perf_tracer", "_perf_tracer_v2")
    return result


def _wrap_init_cluster(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    result = wrapped(*args, **kwargs)
    _set_tracers(instance, "_perf", "_perf_v2")
    return result


def _wrap_rl_train(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    """Number the ``rl/learner`` steps by Tunix's ``global_steps``: the step Tunix logs the
    global step's rewards and other RL metrics under."""
    tracer = _shared_tracer
    # ``rl_engine`` in Tunix after 0.1.7 (``rl_cluster`` is its alias there)
    cluster = getattr(instance, "rl_engine", None) or getattr(instance, "rl_cluster", None)
    if not _active.is_set() or tracer is None or cluster is None:
        return wrapped(*args, **kwargs)
    tracer.number_steps(
        LEARNER_SCOPE,
        lambda: int(cluster.global_steps),
        attributes=lambda: {PROFILER_STEP: int(instance._iter_steps)},
    )
    try:
        return wrapped(*args, **kwargs)
    finally:
        tracer.number_steps(LEARNER_SCOPE, None)


def _wrap_metrics_logger_init(
    wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any
) -> Any:
    result = wrapped(*args, **kwargs)
    if not _active.is_set():
        return result
    try:
        import jax

        backends = getattr(instance, "_backends", None)
        if jax.process_index() != 0 or not isinstance(backends, list):
            return result
        if not any(isinstance(b, OTelLoggingBackend) for b in backends):
            backend = OTelLoggingBackend()
            backends.append(backend)
            jax.monitoring.register_scalar_listener(backend.log_scalar)
        _one_writer(instance)
    except Exception:  # Tunix's MetricsLogger internals or jax.monitoring changed
        warn_once(
            ("tunix", "metrics-backend"),
            "otel-tunix: adding the Tunix metrics backend failed (reported once)",
            logger=_logger,
            level=logging.DEBUG,
            exc_info=True,
        )
    return result


def _one_writer(logger: Any) -> None:
    """With Tunix's own OpenTelemetry path on (``enable_opentelemetry``, Tunix after 0.1.7),
    Tunix's meter keeps only its step gauge: otel-tunix's backend publishes every scalar
    already, under one name with its unit (see docs/tunix.md)."""
    meter = getattr(logger, "_otel_meter", None)
    if meter is not None and not isinstance(meter, StepGaugeOnly):
        logger._otel_meter = StepGaugeOnly(meter)


# --- the instrumentor ----------------------------------------------------------------------

CATEGORY_OF: dict[str, str] = {
    "checkpoint_save": categories.CHECKPOINT_SAVE,
    "checkpoint_restore": categories.CHECKPOINT_RESTORE,
    "eval_step_compute": categories.EVALUATION,
    "weight_sync": categories.WEIGHT_SYNC,
}
"""The goodput category of the components this integration records whose kind is not
plain training work (declared when it is instrumented; their names count by the rules
already: the declaration keeps them so)."""


def declare_categories() -> None:
    """Declare :data:`CATEGORY_OF` (:func:`otel_tunix.accounting.categories.declare`)."""
    for name, category in CATEGORY_OF.items():
        categories.declare(name, category)


_active = threading.Event()
_shared_tracer: OTelPerfTracer | None = None


def _if_active(
    wrapper: Callable[..., Any],
    wrapped: Callable[..., Any],
    instance: Any,
    args: Any,
    kwargs: Any,
) -> Any:
    """``wrapper`` while the instrumentor is on, else the call as it is."""
    if not _active.is_set():
        return wrapped(*args, **kwargs)
    return wrapper(wrapped, instance, args, kwargs)


@dataclass(frozen=True, slots=True)
class Patch:
    """One patch: the first of ``targets`` (``Class.method`` in ``module``) that the
    installed Tunix has is wrapped with ``wrapper``; ``missing`` says what a run lacks when
    none is there."""

    module: str
    targets: tuple[str, ...]
    wrapper: Callable[..., Any]
    missing: str


PATCHES: tuple[Patch, ...] = (
    Patch(
        "tunix.sft.peft_trainer",
        ("PeftTrainer.__init__",),
        _wrap_peft_init,
        "otel-tunix's perf tracer in Tunix's trainers (no train step components)",
    ),
    Patch(
        "tunix.sft.peft_trainer",
        ("PeftTrainer.train",),
        _wrap_train,
        "the train steps (one per trainer iteration)",
    ),
    Patch("tunix.sft.peft_trainer", ("PeftTrainer._run_eval",), _wrap_run_eval, "the eval steps"),
    Patch(
        "tunix.sft.checkpoint_manager",
        ("CheckpointManager.save",),
        _wrap_checkpoint_save,
        "the checkpoint_save components",
    ),
    Patch(
        "tunix.sft.checkpoint_manager",
        ("CheckpointManager.maybe_restore",),
        _wrap_checkpoint_restore,
        "the checkpoint_restore components",
    ),
    Patch(
        "tunix.sft.inflight_throttler",
        ("InflightThrottler.wait_for_next",),
        _wrap_wait_for_next,
        "the train_inflight_wait components",
    ),
    Patch(
        "tunix.sft.metrics_logger",
        ("MetricsLogger.__init__",),
        _wrap_metrics_logger_init,
        "Tunix's scalars as OTel instruments and in metrics.jsonl",
    ),
    # Tunix after 0.1.7 renamed RLCluster to RLEngine (RLCluster is an alias) and
    # _init_cluster to _init_engine.
    Patch(
        "tunix.rl.rl_cluster",
        ("RLEngine._init_engine", "RLCluster._init_cluster"),
        _wrap_init_cluster,
        "the RL step breakdown (rollout, reference_inference, weight_sync, ...) and "
        "Tunix's perf metrics computed from it; Tunix keeps its own tracers",
    ),
    # Tunix after 0.1.7: the experimental control plane (absent before: never imported)
    Patch(
        "tunix.experimental.orchestrator.rl_program",
        ("StandardRLProgram.__init__",),
        lambda *a: _if_active(_orchestrator.wrap_program_init, *a),
        "the orchestrator's rl/learner steps with their policy version and policy lag",
    ),
    Patch(
        "tunix.experimental.orchestrator.health_monitor",
        ("HealthMonitor.poll",),
        lambda *a: _if_active(_orchestrator.wrap_poll, *a),
        "the time of each worker in each state (worker_<state> components)",
    ),
    Patch(
        "tunix.experimental.orchestrator.health_monitor",
        ("HealthMonitor.close",),
        lambda *a: _if_active(_orchestrator.wrap_monitor_close, *a),
        "the last state of each worker when the health monitor closes",
    ),
    Patch(
        "tunix.rl.rl_learner",
        ("RLLearner.train",),
        _wrap_rl_train,
        "rl/learner steps numbered as Tunix logs their metrics (a counter instead)",
    ),
)
"""Everything the instrumentor patches, chosen by what the installed Tunix has."""

_patched: set[tuple[str, str]] = set()
_missing: set[tuple[str, tuple[str, ...]]] = set()
_hooked: set[str] = set()
_patch_lock = threading.Lock()

MISSING_COUNT = "tunix_patches_missing"
"""The ``summary.json`` ``safety`` count of patches that found no target in this Tunix."""


def _resolve(module: Any, targets: tuple[str, ...]) -> str | None:
    """The first of ``targets`` that ``module`` has (``Class.method``), else ``None``."""
    for target in targets:
        owner_name, _, attr_name = target.rpartition(".")
        owner = getattr(module, owner_name, None)
        if owner is not None and callable(getattr(owner, attr_name, None)):
            return target
    return None


def _apply_on_import(module_name: str) -> _base.OnImport:
    """A post-import hook that patches ``module_name``."""
    return lambda _module: _apply(module_name)


def _apply(module_name: str) -> None:
    """Patch what lives in ``module_name`` (now imported); idempotent."""
    module = sys.modules.get(module_name)
    if module is None or not _active.is_set():
        return
    import wrapt

    with _patch_lock:
        for patch in PATCHES:
            if patch.module != module_name or any(
                (patch.module, t) in _patched for t in patch.targets
            ):
                continue
            target = _resolve(module, patch.targets)
            if target is None:
                _missing.add((patch.module, patch.targets))
                _tally.hold(MISSING_COUNT, len(_missing))
                warn_once(
                    ("tunix", "patch", patch.module, patch.targets),
                    "otel-tunix: this Tunix has no %s in %s; missing from the run: %s "
                    "(counted in summary.json, safety.%s)",
                    " or ".join(patch.targets),
                    patch.module,
                    patch.missing,
                    MISSING_COUNT,
                    logger=_logger,
                )
                continue
            wrapt.wrap_function_wrapper(module, target, patch.wrapper)
            _patched.add((patch.module, target))


class TunixInstrumentor(_base.BaseInstrumentor):  # type: ignore[misc]
    """Applies :class:`OTelPerfTracer` and :class:`OTelLoggingBackend` to an unmodified
    Tunix program, with one otel-tunix step per trainer iteration.

    Patches (:data:`PATCHES`), applied when the Tunix modules are imported (importing
    otel-tunix never imports Tunix), each target chosen by what the installed Tunix has; one
    that is not there is one warning naming what the run lacks, counted in ``summary.json``:

    * ``PeftTrainer`` (and the RL ``Trainer``) / ``RLEngine`` (``RLCluster``): the default
      no-op perf tracers become one shared :class:`OTelPerfTracer` (an explicit Tunix
      ``PerfTracer`` is teed with it); ``train()`` opens a step per iteration (scope
      ``train``, or ``rl/actor`` / ``rl/critic`` by ``metrics_prefix``) with
      ``train_data_load``; evaluation runs as ``eval`` steps with ``eval_data_load`` and
      ``eval_step_compute`` (device end).
    * ``InflightThrottler.wait_for_next``: ``train_inflight_wait`` (blocked) when it waits.
    * ``CheckpointManager.save``: ``checkpoint_save`` when it saves;
      ``CheckpointManager.maybe_restore``: ``checkpoint_restore`` when there is a checkpoint
      to restore (before the loop).
    * Goodput categories (:mod:`otel_tunix.accounting.categories`): ``checkpoint_save``,
      ``checkpoint_restore``, ``eval_step_compute`` and ``weight_sync`` are declared
      (:data:`CATEGORY_OF`); the ``eval`` steps are evaluation as a whole.
    * Tunix's ``MetricsLogger``: gains an :class:`OTelLoggingBackend` (process 0); with
      Tunix's own OpenTelemetry path on, Tunix's meter keeps only ``tunix.training.step``
      (:class:`~otel_tunix.instrumentation._tunix_metrics.StepGaugeOnly`).
    * Tunix's orchestrator, where it exists: ``StandardRLProgram`` steps with their policy
      version and lag, ``HealthMonitor`` worker states as components
      (:mod:`otel_tunix.instrumentation._tunix_orchestrator`).

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
        declare_categories()
        carry_into_threads()
        _active.set()
        for module_name in dict.fromkeys(patch.module for patch in PATCHES):
            if module_name not in _hooked:
                _hooked.add(module_name)
                _base.when_imported(module_name, _apply_on_import(module_name), extra="tunix")
            else:
                _apply(module_name)

    def _uninstrument(self, **kwargs: Any) -> None:
        from opentelemetry.instrumentation.utils import unwrap

        global _shared_tracer
        _active.clear()
        stop_carrying_into_threads()
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
            _missing.clear()
            _tally.hold(MISSING_COUNT, 0)
        _shared_tracer = None
