"""Zero-code forward spans: the outermost module call of the training loop is one ``forward``
span and opens the automatic step, so a loop that feeds batches from a plain iterator has its
forward inside a step. Used by :class:`~otel_tunix.instrumentation.torch.TorchInstrumentor`.

The instrumentor cannot know which module is the model, so it starts with PyTorch's global
module hooks (``register_module_forward_pre_hook`` / ``register_module_forward_hook``): a
module called while no other module call is open on the training thread is a *root* (the
model, a loss module, ``DistributedDataParallel`` around the model). Global hooks put every
module call of the process on ``Module._call_impl``'s slow path (4 to 9 us a call on the
project's loaded 2-core VM: ``bench/bench_torch_zero_code.py``), so at the end of the first
automatic step the global hooks are replaced by hooks on the roots found: from then on a
forward costs two hook calls per root, and a module first called at the top level later is
not seen (its forward counts as the step's idle time, and the step opens at the next
activity instead).

``torch.compile(model)`` works (its wrapper is the root; inside the compiled code the hooks
do nothing, with no graph break). A model compiled in place (``model.compile()``) runs the
global hooks only inside compiled code, so it is not seen: use :func:`instrument_model` on it.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from typing import Any

from otel_tunix.instrumentation._torch_device import device_component
from otel_tunix.instrumentation._torch_hooks import _models, _open_models, _quiet
from otel_tunix.instrumentation._torch_steps import _auto
from otel_tunix.recording.hot_path import may_record

__all__ = ["RootForward"]


class _Depth(threading.local):
    def __init__(self) -> None:
        self.depth = 0
        self.comp: device_component | None = None


class RootForward:
    """``forward`` spans and step starts from the root module calls (see the module doc)."""

    def __init__(self, torch: Any, name: str = "forward") -> None:
        self.torch = torch
        self.name = name
        self.local = _Depth()
        self.roots: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
        """Root modules, and (once narrowed) the hooks on each."""
        self.narrowed = False
        compiler = getattr(torch, "compiler", None)
        self._compiling = getattr(compiler, "is_compiling", None) or (lambda: False)
        self._disable = getattr(compiler, "disable", None)
        # torch.compile(module) warns on each call while global hooks exist that they fire
        # once more for its wrapper: harmless here (the wrapper is the root; the module
        # inside runs compiled, where the hooks do nothing).
        warnings.filterwarnings(
            "ignore",
            message=r"Using `torch\.compile\(module\)` when there are global hooks",
            category=UserWarning,
        )
        hooks = torch.nn.modules.module
        self.global_handles = [
            hooks.register_module_forward_pre_hook(self._pre),
            hooks.register_module_forward_hook(self._post, always_call=True),
        ]
        _auto.on_step_done = self.narrow

    def _pre(self, module: Any, args: Any) -> None:
        # Traced by torch.compile inside compiled modules: there it must do nothing (and
        # is_compiling() is a constant to the tracer, so no graph break).
        if self._compiling():
            return
        local = self.local
        local.depth += 1
        if local.depth > 1 or _quiet.depth or _open_models.count:
            return  # nested, quiet, or inside a model of instrument_model's (its own span)
        if _auto.current is None and not self.torch.is_grad_enabled():
            return  # inference outside a step (a sanity check, generation) starts none
        if not _auto.activity():
            return  # a step of the program's own, or another thread's loop
        if not self.narrowed:
            self.roots.setdefault(module, [])
        if module in _models or not may_record():
            return  # instrument_model's own hooks record it; outside the recorded work
        comp = device_component(self.name)
        comp.__enter__()
        local.comp = comp

    def _post(self, module: Any, args: Any, output: Any) -> None:
        if self._compiling():
            return
        local = self.local
        if local.depth == 0:
            return
        local.depth -= 1
        comp = local.comp
        if local.depth == 0 and comp is not None:
            local.comp = None
            comp.__exit__(None, None, None)

    def narrow(self) -> None:
        """Replace the global hooks by hooks on the roots found (at the end of an automatic
        step, outside any forward on this thread)."""
        if self.narrowed or self.local.depth:
            return
        pre, post = self._pre, self._post
        if self._disable is not None:  # eager at the edge of a torch.compile'd root
            pre, post = self._disable(pre), self._disable(post)
        for module, handles in self.roots.items():
            handles[:] = [
                module.register_forward_pre_hook(pre),
                module.register_forward_hook(post, always_call=True),
            ]
        self._remove(self.global_handles)
        self.narrowed = True

    def remove(self) -> None:
        """Remove every hook this object added."""
        if _auto.on_step_done == self.narrow:
            _auto.on_step_done = None
        self._remove(self.global_handles)
        for handles in list(self.roots.values()):
            self._remove(handles)
        self.roots.clear()
        self.narrowed = True

    @staticmethod
    def _remove(handles: list[Any]) -> None:
        for handle in handles:
            handle.remove()
        handles.clear()
