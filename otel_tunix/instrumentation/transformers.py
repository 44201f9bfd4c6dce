"""Hugging Face Transformers / TRL integration: a ``Trainer``'s steps as otel-tunix spans, its
logs as MetricsLogger scalars and OTel gauges.

One line on an existing trainer::

    from otel_tunix.instrumentation.transformers import instrument_trainer

    instrument_trainer(trainer)        # or zero-code: opentelemetry-instrument python train.py
    trainer.train()

What a training step becomes (scope ``train``, step number = ``state.global_step`` before
the update)::

    train_step
    ├── train_data_load          fetching the step's micro-batches (blocked with workers)
    ├── train_step_compute       on_step_begin → on_step_end
    │   ├── micro_batch_step     one per gradient-accumulation micro-batch (if more than one)
    │   │   ├── forward          model forward hooks
    │   │   └── backward         loss.backward()
    │   └── optimizer_step       on_pre_optimizer_step → on_optimizer_step
    ├── evaluate                 Trainer.evaluate(), with one ``eval`` step per batch
    │                            (eval_data_load, eval_step_compute) inside
    └── checkpoint_save          saving the checkpoint (reported by on_save)

TRL's GRPO trainers add ``rollout`` (generation; the forward calls of generation are not
recorded one by one), ``reward`` and ``reference_inference``. ``on_log`` values go to the
MetricsLogger (and so to OTel gauges, JSONL, ...), with TRL's names mapped onto
otel-tunix's (:data:`METRIC_NAMES`). Device memory is published after every step on CUDA.
Needs the ``transformers`` extra.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import otel_tunix
from otel_tunix.accounting import categories
from otel_tunix.instrumentation import _base
from otel_tunix.instrumentation import torch as ott
from otel_tunix.instrumentation._threads import carry_into_threads, stop_carrying_into_threads
from otel_tunix.metrics.training import perplexity
from otel_tunix.support.errors import warn_once

_base.require("transformers", "transformers", "otel_tunix.instrumentation.transformers")

from transformers import TrainerCallback  # noqa: E402

__all__ = [
    "METRIC_NAMES",
    "OtelTunixCallback",
    "TransformersInstrumentor",
    "instrument_trainer",
    "map_metrics",
    "uninstrument_trainer",
]

_logger = logging.getLogger(__name__)

METRIC_NAMES: Mapping[str, str] = {
    # Trainer (also after an ``eval_`` / ``train_`` prefix, which becomes ``eval/`` / ``train/``)
    "runtime": "runtime_sec",
    "samples_per_second": "samples_per_sec",
    "steps_per_second": "steps_per_sec",
    # TRL GRPO / RLOO
    "reward": "rewards/mean",
    "reward_std": "rewards/std",
    "entropy": "loss/entropy",
    "policy_loss": "loss/policy",
    "clip_ratio/region_mean": "pg_clipfrac",
    "num_tokens": "tokens/total",
    # TRL PPO
    "objective/kl": "kl",
    "objective/entropy": "loss/entropy",
    "objective/rlhf_reward": "rewards/mean",
    "objective/scores": "rewards/score/mean",
    "policy/approxkl_avg": "approx_kl",
    "policy/clipfrac_avg": "pg_clipfrac",
    "policy/entropy_avg": "policy/entropy",
    "loss/policy_avg": "loss/policy",
    "loss/value_avg": "loss/value",
    "val/clipfrac_avg": "vf_clipfrac",
    "val/ratio": "ratio/mean",
}
"""TRL / Trainer log names that have an otel-tunix (Tunix) name. Names not listed keep
their own (``kl``, ``completions/mean_length``, ``clip_ratio/low_mean``, ...).
``rewards/<func>/mean`` becomes ``rewards/<func>``; ``eval_<name>`` and ``train_<name>``
become ``eval/<name>`` and ``train/<name>`` (``eval_runtime`` → ``eval/runtime_sec``)."""


def map_metrics(logs: Mapping[str, Any]) -> dict[str, float]:
    """Trainer / TRL ``logs`` with otel-tunix names; values that are not numbers are dropped.

    Adds ``perplexity`` (``exp(loss)``) beside ``loss``, as Tunix does, except in RL logs
    (with rewards, ``kl`` or a policy loss), where the loss is not a log-likelihood.
    """
    out: dict[str, float] = {}
    for key, value in logs.items():
        if isinstance(value, bool):
            continue  # not a metric (and ``True.item()`` does not exist)
        if not isinstance(value, int | float):
            try:
                value = float(value.item())  # a tensor or numpy scalar
            except Exception:  # not a number (a string, a list): dropped, as documented
                continue
        name = METRIC_NAMES.get(key)
        if name is None:
            if key.startswith("rewards/") and key.endswith("/mean") and key.count("/") == 2:
                name = key[: -len("/mean")]
            elif key.startswith(("eval_", "train_")):
                prefix, rest = key.split("_", 1)
                name = f"{prefix}/{METRIC_NAMES.get(rest, rest)}"
            else:
                name = key
        out[name] = float(value)
    loss = out.get("loss")
    rl = any(k in out for k in _RL_SIGNS)
    if loss is not None and math.isfinite(loss) and not rl:  # an RL loss is not an NLL
        out["perplexity"] = perplexity(loss)
    return out


_RL_SIGNS = ("rewards/mean", "kl", "loss/policy")


class OtelTunixCallback(TrainerCallback):
    """The ``TrainerCallback`` behind :func:`instrument_trainer`.

    Added on its own (``Trainer(callbacks=[OtelTunixCallback()])``) it records steps from
    ``on_step_begin`` to the next step, ``train_step_compute``, micro-batches, the optimizer,
    forward / backward, eval steps' compute, and ``on_log`` metrics. The data wait, the
    ``evaluate`` span and checkpoint timing need :func:`instrument_trainer`, which wraps the
    trainer's batch fetching, evaluation and checkpoint saving.

    Args:
        scope: Scope of training steps.
        eval_scope: Scope of evaluation steps.
        memory_stats: Publish CUDA memory stats after each step.
    """

    def __init__(
        self, *, scope: str = "train", eval_scope: str = "eval", memory_stats: bool = True
    ) -> None:
        self.scope = scope
        self.eval_scope = eval_scope
        self.memory_stats = memory_stats
        self.prefetching = False
        self._stack = _base.SpanStack()
        self._accumulation = 1
        self._eval_steps = 0
        self._step_number = -1
        self.trainer: weakref.ref[Any] | None = None

    # --- steps opened from wrapped trainer methods ----------------------------------------
    def begin_train_step(self, number: int) -> None:
        """Close the previous training step and open step ``number``."""
        self._stack.clear()
        ott.ensure_configured(asked=True)  # instrument_trainer() alone: from the environment
        self._stack.push("step", otel_tunix.step(number, scope=self.scope))
        self._step_number = number

    def begin_eval_step(self) -> bool:
        """Open the next evaluation step (closing the previous one if still open)."""
        self._stack.pop("eval_step")
        self._stack.push("eval_step", otel_tunix.step(self._eval_steps, scope=self.eval_scope))
        self._eval_steps += 1
        return True

    def begin_eval_compute(self) -> None:
        if "eval_step" in self._stack:
            self._stack.push("eval_compute", ott.device_component("eval_step_compute"))

    def end_eval_steps(self) -> None:
        self._stack.pop("eval_step")

    # --- TrainerCallback ------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        ott.ensure_configured(asked=True)  # instrument_trainer() alone: from the environment
        self._accumulation = max(1, int(getattr(args, "gradient_accumulation_steps", 1) or 1))
        self.prefetching = int(getattr(args, "dataloader_num_workers", 0) or 0) > 0
        model = kwargs.get("model")
        if model is not None:
            ott.instrument_model(model)
        trainer = self.trainer() if self.trainer is not None else None
        ref_model = getattr(trainer, "ref_model", None)
        if ref_model is not None and hasattr(ref_model, "register_forward_pre_hook"):
            ott.instrument_model(ref_model, forward="reference_inference")

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if "step" not in self._stack or self._step_number != state.global_step:
            self.begin_train_step(state.global_step)  # no fetch wrapper opened it
        self._stack.pop("compute")
        self._stack.push("compute", ott.device_component("train_step_compute"))
        if self._accumulation > 1:
            self._stack.push("micro", ott.device_component("micro_batch_step"))

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._stack.pop("micro"):
            self._stack.push("micro", ott.device_component("micro_batch_step"))

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stack.pop("micro")
        if "compute" in self._stack:
            self._stack.push("optimizer", ott.device_component("optimizer_step"))

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stack.pop("optimizer")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stack.pop("compute")
        if self.memory_stats:
            ott.record_memory_stats(step=max(0, state.global_step - 1), scope=self.scope)

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stack.pop("eval_step")

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if logs and otel_tunix.current_run() is not None:
            values = map_metrics(logs)
            if values:  # the step that just finished, numbered as its spans are
                step = max(0, int(state.global_step) - 1)
                otel_tunix.get_metrics_logger().log_dict(values, step=step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stack.clear()


# --- wrapping a trainer's methods -----------------------------------------------------
_ATTR = "_otel_tunix_callback"
_trainers: weakref.WeakSet[Any] = weakref.WeakSet()


_Wrapper = Callable[[Callable[..., Any]], Callable[..., Any]]


def _wrap(trainer: Any, name: str, make: _Wrapper) -> None:
    original = getattr(trainer, name, None)
    if original is None or getattr(original, "__otel_tunix_original__", None) is not None:
        return
    wrapper = functools.wraps(original)(make(original))
    wrapper.__otel_tunix_original__ = original  # type: ignore[attr-defined]
    setattr(trainer, name, wrapper)


def _in_component(name: str, quiet_forward: bool = False) -> Callable[..., Any]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with otel_tunix.component(name):
                if quiet_forward:
                    with ott.quiet_forward():
                        return original(*args, **kwargs)
                return original(*args, **kwargs)

        return wrapper

    return make


CATEGORY_OF: dict[str, str] = {
    "evaluate": categories.EVALUATION,
    "eval_step_compute": categories.EVALUATION,
    "checkpoint_save": categories.CHECKPOINT_SAVE,
}
"""The goodput category of the components :func:`instrument_trainer` records whose time is
not training (declared when a trainer is instrumented; their names count by the rules
already: the declaration keeps them so)."""


def instrument_trainer(trainer: Any, **callback_kwargs: Any) -> Any:
    """Instrument a ``transformers.Trainer`` (or a TRL trainer); returns ``trainer``.

    Adds an :class:`OtelTunixCallback` (``callback_kwargs`` go to it) and wraps the
    trainer's batch fetching (``get_batch_samples``: opens the step, records
    ``train_data_load``), ``get_eval_dataloader`` (eval steps), ``evaluate`` and
    ``_save_checkpoint`` (``checkpoint_save``), plus TRL's ``_generate`` (``rollout``) and
    ``_calculate_rewards`` (``reward``) and the reference model (``reference_inference``)
    when they exist. Idempotent; undo with :func:`uninstrument_trainer`. Without
    :func:`otel_tunix.configure`, training starts it from the environment.
    """
    if getattr(trainer, _ATTR, None) is not None:
        return trainer
    for name, category in CATEGORY_OF.items():
        categories.declare(name, category)
    cb = OtelTunixCallback(**callback_kwargs)
    cb.trainer = weakref.ref(trainer)
    trainer.add_callback(cb)
    setattr(trainer, _ATTR, cb)
    _trainers.add(trainer)

    def batches(original: Callable[..., Any]) -> Callable[..., Any]:
        def get_batch_samples(*args: Any, **kwargs: Any) -> Any:
            cb.begin_train_step(int(trainer.state.global_step))
            with otel_tunix.component("train_data_load", cb.prefetching):
                return original(*args, **kwargs)

        return get_batch_samples

    def eval_loader(original: Callable[..., Any]) -> Callable[..., Any]:
        def get_eval_dataloader(*args: Any, **kwargs: Any) -> Any:
            loader = original(*args, **kwargs)
            return ott.InstrumentedLoader(
                loader,
                "eval_data_load",
                before_fetch=cb.begin_eval_step,
                after_fetch=cb.begin_eval_compute,
            )

        return get_eval_dataloader

    def evaluate(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with otel_tunix.component("evaluate"):
                try:
                    return original(*args, **kwargs)
                finally:
                    cb.end_eval_steps()

        return wrapper

    _wrap(trainer, "get_batch_samples", batches)
    _wrap(trainer, "get_eval_dataloader", eval_loader)
    _wrap(trainer, "evaluate", evaluate)
    _wrap(trainer, "_save_checkpoint", _in_component("checkpoint_save"))
    _wrap(trainer, "_generate", _in_component("rollout", quiet_forward=True))
    _wrap(trainer, "_calculate_rewards", _in_component("reward"))
    return trainer


def uninstrument_trainer(trainer: Any) -> None:
    """Remove what :func:`instrument_trainer` added."""
    cb = getattr(trainer, _ATTR, None)
    if cb is None:
        return
    cb._stack.clear()
    trainer.remove_callback(cb)
    for name in (
        "get_batch_samples",
        "get_eval_dataloader",
        "evaluate",
        "_save_checkpoint",
        "_generate",
        "_calculate_rewards",
    ):
        if getattr(getattr(trainer, name, None), "__otel_tunix_original__", None) is not None:
            delattr(trainer, name)
    delattr(trainer, _ATTR)
    _trainers.discard(trainer)


# --- zero-code ----------------------------------------------------------------------------
class TransformersInstrumentor(_base.BaseInstrumentor):  # type: ignore[misc]
    """Zero-code Transformers / TRL instrumentation (entry point ``otel_tunix_transformers``).

    When ``transformers.trainer`` gets imported, ``Trainer.__init__`` is wrapped so that every
    trainer (TRL's included) is passed to :func:`instrument_trainer`; otel-tunix configures
    itself from the environment when training starts.
    """

    _active = False
    _original_init: Any = None

    def instrumentation_dependencies(self) -> tuple[str, ...]:
        return ("transformers >= 4.46",)

    def _instrument(self, **kwargs: Any) -> None:
        _base.enable_auto_configure()
        carry_into_threads()
        type(self)._active = True
        _base.when_imported("transformers.trainer", _patch_trainer, extra="transformers")

    def _uninstrument(self, **kwargs: Any) -> None:
        type(self)._active = False
        stop_carrying_into_threads()
        mod = sys.modules.get("transformers.trainer")
        original = TransformersInstrumentor._original_init
        if mod is not None and original is not None:
            mod.Trainer.__init__ = original
            TransformersInstrumentor._original_init = None
        for trainer in list(_trainers):
            uninstrument_trainer(trainer)


def _patch_trainer(module: Any) -> None:
    if not TransformersInstrumentor._active or TransformersInstrumentor._original_init is not None:
        return
    trainer_cls = module.Trainer
    original = TransformersInstrumentor._original_init = trainer_cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if TransformersInstrumentor._active:
            try:
                instrument_trainer(self)
            except Exception:  # a trainer (subclass) not shaped as transformers' own
                warn_once(
                    ("transformers", "instrument", type(self)),
                    "otel-tunix: instrumenting %s failed (reported once)",
                    type(self).__name__,
                    logger=_logger,
                    level=logging.ERROR,
                    exc_info=True,
                )

    trainer_cls.__init__ = __init__
