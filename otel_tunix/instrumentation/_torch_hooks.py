"""Forward / backward / optimizer spans of the PyTorch integration: hooks on a model and an
optimizer, and the ``torch.autograd.backward`` wrapper. Re-exported by
:mod:`otel_tunix.instrumentation.torch`.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from typing import Any

from otel_tunix.instrumentation import _base
from otel_tunix.instrumentation._torch_collectives import _collectives
from otel_tunix.instrumentation._torch_compile import _compile_hooks
from otel_tunix.instrumentation._torch_device import device_component, record_memory_stats
from otel_tunix.instrumentation._torch_steps import _auto
from otel_tunix.recording.hot_path import may_record


def _torch() -> Any:
    mod = sys.modules.get("torch")
    if mod is None:
        mod = _base.require("torch", "torch", "otel_tunix.instrumentation.torch")
    return mod


# --- forward / backward -----------------------------------------------------------------
class _PerThread(threading.local):
    def __init__(self) -> None:
        self.open: dict[int, tuple[int, device_component | None]] = {}


class _Quiet(threading.local):
    depth = 0


_quiet = _Quiet()


class _OpenModels(threading.local):
    count = 0
    """Forward spans of :func:`instrument_model` open in this thread."""


_open_models = _OpenModels()


class quiet_forward:
    """Inside this block (in this thread) forward hooks record nothing: generation loops
    call ``forward`` once per token, and the enclosing span (``rollout``) says enough."""

    def __enter__(self) -> None:
        _quiet.depth += 1

    def __exit__(self, *exc: object) -> None:
        _quiet.depth -= 1


class _ModelHooks:
    """Forward pre/post hooks on one module: the outermost call is one ``forward`` span."""

    def __init__(self, torch: Any, model: Any, name: str) -> None:
        self.name = name
        self.torch = torch
        self.local = _PerThread()
        disable = getattr(getattr(torch, "compiler", None), "disable", None)
        pre, post = self._pre, self._post
        if disable is not None:  # run the hooks eagerly inside torch.compile'd modules
            pre, post = disable(pre), disable(post)
        self.handles = [
            model.register_forward_pre_hook(pre),
            model.register_forward_hook(post, always_call=True),
        ]

    def _pre(self, module: Any, args: Any) -> None:
        if _quiet.depth:
            return
        key = id(module)
        depth, comp = self.local.open.get(key, (0, None))
        if depth == 0:
            if _auto.current is not None or self.torch.is_grad_enabled():
                _auto.activity()  # under the instrumentor, a training forward opens a step
            if may_record():  # outside the steps: only inside a component that is recorded
                comp = device_component(self.name)
                comp.__enter__()
            _open_models.count += 1
        self.local.open[key] = (depth + 1, comp)

    def _post(self, module: Any, args: Any, output: Any) -> None:
        key = id(module)
        depth, comp = self.local.open.get(key, (0, None))
        if depth == 0:
            return
        if depth == 1:
            self.local.open.pop(key, None)
            _open_models.count -= 1
            if comp is not None:
                comp.__exit__(None, None, None)
        else:
            self.local.open[key] = (depth - 1, comp)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


_models: weakref.WeakKeyDictionary[Any, _ModelHooks] = weakref.WeakKeyDictionary()


class _BackwardPatch:
    """Wraps ``torch.autograd.backward`` (which ``Tensor.backward`` calls) in a span."""

    def __init__(self) -> None:
        self.users = 0
        self.name = "backward"
        self.original: Any = None
        self.lock = threading.Lock()

    def acquire(self, torch: Any) -> None:
        with self.lock:
            self.users += 1
            if self.original is not None:
                return
            original = self.original = torch.autograd.backward

            @functools.wraps(original)
            def backward(*args: Any, **kwargs: Any) -> Any:
                if self.users <= 0:
                    return original(*args, **kwargs)
                _auto.activity()
                if not may_record():  # outside the steps and any recorded component
                    return original(*args, **kwargs)
                with device_component(self.name):
                    return original(*args, **kwargs)

            backward.__otel_tunix_original__ = original  # type: ignore[attr-defined]
            torch.autograd.backward = backward

    def release(self, torch: Any) -> None:
        with self.lock:
            self.users = max(0, self.users - 1)
            if self.users == 0 and self.original is not None:
                if getattr(torch.autograd.backward, "__otel_tunix_original__", None) is not None:
                    torch.autograd.backward = self.original
                self.original = None


_backward = _BackwardPatch()


def instrument_model(model: Any, *, forward: str = "forward", backward: str = "backward") -> Any:
    """Record the model's forward pass and every backward pass as spans.

    ``forward``: a forward pre-hook and an ``always_call`` forward hook on ``model`` open and
    close one span for the outermost call (nested or recursive calls of the same module are
    inside it). Works on ``torch.compile``'d modules (the hooks run eagerly).
    ``backward``: ``torch.autograd.backward`` (what ``loss.backward()`` calls) runs inside a
    span while any model is instrumented. Both get CUDA device time when CUDA is in use.
    While any model is instrumented, ``torch.distributed`` collectives are blocked
    components too (see :func:`instrument_collectives`), and torch.compile's compilations
    are recorded and counted (see :func:`instrument_compile`).
    Idempotent; returns ``model``. Undo with :func:`uninstrument_model`.
    """
    torch = _torch()
    if model in _models:
        return model
    _models[model] = _ModelHooks(torch, model, forward)
    _backward.name = backward
    _backward.acquire(torch)
    _collectives.acquire(torch)
    _compile_hooks.acquire()
    return model


def uninstrument_model(model: Any) -> None:
    """Remove what :func:`instrument_model` added."""
    hooks = _models.pop(model, None)
    if hooks is not None:
        hooks.remove()
        _backward.release(_torch())
        _collectives.release(_torch())
        _compile_hooks.release()


# --- optimizer --------------------------------------------------------------------------
class _OptimizerHooks:
    """``optimizer_step`` around each ``optimizer.step()`` call.

    The optimizer instance's ``step`` is wrapped, so the span covers the whole call:
    PyTorch's own ``step`` wrapper (profiler scope, step hooks, grad-mode switch) included,
    about 0.2 ms a call that step hooks miss. For one optimizer
    (:func:`instrument_optimizer`) at once; for every optimizer (the instrumentor, ``auto``)
    as each is made (``Optimizer.__init__``), with PyTorch's global step pre/post hooks for
    the optimizers made before. In ``auto`` mode a call opens no span inside a step of the
    program's own, and ends the automatic step otherwise; ``zero_grad()`` may start it.
    """

    def __init__(self, optimizer: Any, name: str, memory: bool, auto: bool = False) -> None:
        self.name = name
        self.memory = memory
        self.auto = auto
        self.local = _PerThread()
        self.handles: list[Any] = []
        self.active = True
        self.wrapped: weakref.WeakKeyDictionary[Any, tuple[Any, Any]] = weakref.WeakKeyDictionary()
        """Per optimizer, our wrapper and the instance's own ``step`` it replaced."""
        self.original_init: Any = None
        self.original_zero_grad: Any = None
        if auto:
            mod = sys.modules["torch.optim.optimizer"]
            self.handles = [
                mod.register_optimizer_step_pre_hook(self._pre),
                mod.register_optimizer_step_post_hook(self._post),
            ]
            self._wrap_new_optimizers(mod.Optimizer)
        else:
            self.wrap(optimizer)

    def wrap(self, optimizer: Any) -> None:
        """Wrap the instance's ``step`` (kept: an LR scheduler's wrapper, say)."""
        own_step = optimizer.__dict__.get("step")
        wrapper = self._wrap(optimizer.step)
        optimizer.step = wrapper
        self.wrapped[optimizer] = (wrapper, own_step)

    def _wrap_new_optimizers(self, optimizer_cls: Any) -> None:
        hooks = self
        original = self.original_init = optimizer_cls.__init__

        @functools.wraps(original)
        def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            original(optimizer, *args, **kwargs)
            if hooks.active and optimizer not in hooks.wrapped:
                hooks.wrap(optimizer)

        optimizer_cls.__init__ = __init__

        # zero_grad() may start the automatic step: in the usual loop it comes first, and
        # freeing the gradients is the iteration's own work (not a span: idle in the step).
        original_zero_grad = self.original_zero_grad = optimizer_cls.zero_grad

        @functools.wraps(original_zero_grad)
        def zero_grad(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if hooks.active:
                _auto.may_start()
            return original_zero_grad(optimizer, *args, **kwargs)

        optimizer_cls.zero_grad = zero_grad

    def _wrap(self, step: Any) -> Any:
        hooks = self

        @functools.wraps(step)
        def instrumented_step(*args: Any, **kwargs: Any) -> Any:
            if not hooks.active or (hooks.auto and not _auto.activity()) or not may_record():
                return step(*args, **kwargs)
            with device_component(hooks.name):
                out = step(*args, **kwargs)
            if hooks.memory:
                record_memory_stats()
            if hooks.auto:
                _auto.step_done()
            return out

        return instrumented_step

    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if optimizer in self.wrapped or not _auto.activity():
            return  # wrapped (made after the instrumentor): its wrapper records the call
        key = id(optimizer)
        stale = self.local.open.pop(key, None)
        if stale is not None and stale[1] is not None:  # the last step() raised
            stale[1].__exit__(None, None, None)
        comp = device_component(self.name) if may_record() else None
        if comp is not None:
            comp.__enter__()
        self.local.open[key] = (1, comp)

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        entry = self.local.open.pop(id(optimizer), None)
        if entry is None:
            return
        if entry[1] is not None:
            entry[1].__exit__(None, None, None)
        if self.memory:
            record_memory_stats()
        _auto.step_done()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        if self.original_init is not None:
            optimizer_cls = sys.modules["torch.optim.optimizer"].Optimizer
            optimizer_cls.__init__ = self.original_init
            optimizer_cls.zero_grad = self.original_zero_grad
        self.active = False  # a wrapper of ours that another wrapped stays, inactive
        for optimizer, (wrapper, own_step) in list(self.wrapped.items()):
            if optimizer.__dict__.get("step") is wrapper:
                if own_step is not None:
                    optimizer.step = own_step
                else:
                    del optimizer.step  # the class's step again


_optimizers: weakref.WeakKeyDictionary[Any, _OptimizerHooks] = weakref.WeakKeyDictionary()


def instrument_optimizer(
    optimizer: Any, *, name: str = "optimizer_step", memory_stats: bool = True
) -> Any:
    """Record each ``optimizer.step()`` as a span (with CUDA device time).

    With ``memory_stats`` (default), device memory is published after each step (see
    :func:`record_memory_stats`; nothing without CUDA). Idempotent; returns ``optimizer``.
    """
    _torch()
    if optimizer not in _optimizers:
        _optimizers[optimizer] = _OptimizerHooks(optimizer, name, memory_stats)
    return optimizer


def uninstrument_optimizer(optimizer: Any) -> None:
    """Remove what :func:`instrument_optimizer` added."""
    hooks = _optimizers.pop(optimizer, None)
    if hooks is not None:
        hooks.remove()
