"""PyTorch integration: data wait, forward / backward / optimizer spans, CUDA device time,
device memory per step, and zero-code instrumentation of plain training loops.

Three lines in a loop that already calls :func:`otel_tunix.step`::

    from otel_tunix.instrumentation import torch as ott

    loader = ott.instrument_dataloader(loader)   # each next() is train_data_load
    ott.instrument_model(model)                  # forward and backward spans
    ott.instrument_optimizer(optimizer)          # optimizer_step span + memory stats

**Device time.** When CUDA is initialised, every span opened here (and every
:class:`device_component`) records a ``torch.cuda.Event`` on the current stream at its start
and end and hands otel-tunix a device-end resolver: the span then ends when the GPU finished
the component's work, ``tunix.host_duration_s`` keeps the host time, and
``tunix.device_duration_s`` gets the time between the two events (when the core stores
component attributes). Events come from a pool and are shared between adjacent boundaries: a
component starting right where the previous one ended, or right after its parent started,
with no program code in between that could queue GPU work, reuses that event, so N
back-to-back components record N + 1 events. Nothing synchronises the training thread: the
resolvers run on otel-tunix's device-waiter thread, which waits (blocking-sync, GIL released)
on the newest boundary of the stream when it must wait at all, and places every boundary on
the host clock from ``Event.elapsed_time`` against an anchor event.

**Collectives and compilations.** While a model is instrumented (or the instrumentor is
on), ``torch.distributed`` collectives are blocked components (``all_reduce``, ...; the
wait of async work: ``all_reduce_wait``), and each torch.compile compilation is the
component ``torch_compile`` and counts in ``tunix.compilations`` with its cause.

No CUDA: the same spans, host time only. Needs the ``torch`` extra.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any

from otel_tunix.instrumentation import _base
from otel_tunix.instrumentation._threads import carry_into_threads, stop_carrying_into_threads
from otel_tunix.instrumentation._torch_collectives import (
    COLLECTIVES,
    _collectives,
    instrument_collectives,
    uninstrument_collectives,
)
from otel_tunix.instrumentation._torch_compile import (
    _compile_hooks,
    instrument_compile,
    uninstrument_compile,
)
from otel_tunix.instrumentation._torch_device import ANCHOR_SLACK_NS as ANCHOR_SLACK_NS
from otel_tunix.instrumentation._torch_device import (
    DEVICE_DURATION,
    AllocatorStep,
    allocator_step,
    device_component,
    memory_stats,
    publish_step_memory,
    record_memory_stats,
)
from otel_tunix.instrumentation._torch_device import REANCHOR_NS as REANCHOR_NS
from otel_tunix.instrumentation._torch_device import SHARE_WINDOW_NS as SHARE_WINDOW_NS
from otel_tunix.instrumentation._torch_forward import RootForward
from otel_tunix.instrumentation._torch_hooks import (
    _backward,
    _OptimizerHooks,
    instrument_model,
    instrument_optimizer,
    quiet_forward,
    uninstrument_model,
    uninstrument_optimizer,
)
from otel_tunix.instrumentation._torch_loader import (
    InstrumentedLoader,
    _InstrumentedIterator,
    instrument_dataloader,
)
from otel_tunix.instrumentation._torch_steps import _auto, distributed_rank_attributes
from otel_tunix.instrumentation._torch_steps import ensure_configured as ensure_configured

__all__ = [
    "COLLECTIVES",
    "DEVICE_DURATION",
    "AllocatorStep",
    "InstrumentedLoader",
    "TorchInstrumentor",
    "allocator_step",
    "device_component",
    "distributed_rank_attributes",
    "instrument_collectives",
    "instrument_compile",
    "instrument_dataloader",
    "instrument_model",
    "instrument_optimizer",
    "memory_stats",
    "publish_step_memory",
    "quiet_forward",
    "record_memory_stats",
    "uninstrument_collectives",
    "uninstrument_compile",
    "uninstrument_model",
    "uninstrument_optimizer",
]


class TorchInstrumentor(_base.BaseInstrumentor):  # type: ignore[misc]
    """Zero-code PyTorch instrumentation (entry point ``otel_tunix_torch``).

    When ``torch`` gets imported: every ``optimizer.step()`` is an ``optimizer_step`` span
    and ends a step, every ``backward`` is a ``backward`` span, every DataLoader batch is a
    ``train_data_load`` span (blocked with worker processes), the outermost module call of
    the loop (the model's forward) is a ``forward`` span, every ``torch.distributed``
    collective a blocked span (see :func:`instrument_collectives`), every torch.compile
    compilation a ``torch_compile`` span and a count (see :func:`instrument_compile`), and a
    loop that opens no otel-tunix
    step of its own gets one per optimizer step (scope ``train``), from its first activity
    (a fetch, a forward with gradients on, a backward) to the end of ``optimizer.step()``.
    Inside steps opened by the program or the Transformers integration, only ``backward`` is
    added (the others are theirs; forward spans there need :func:`instrument_model`).
    """

    # Class-level state: BaseInstrumentor is a singleton whose __init__ runs on every call.
    _active = False
    _optimizer_hooks: _OptimizerHooks | None = None
    _forward: RootForward | None = None
    _original_iter: Any = None

    def instrumentation_dependencies(self) -> tuple[str, ...]:
        return ("torch >= 2.1",)

    def _instrument(self, **kwargs: Any) -> None:
        _base.enable_auto_configure()
        carry_into_threads()
        self._active = True
        _base.when_imported("torch", self._patch, extra="torch")

    def _patch(self, torch: Any) -> None:
        if not self._active or self._optimizer_hooks is not None:
            return
        import torch.optim.optimizer  # the global hook registry
        import torch.utils.data as data

        _auto.enabled = True
        _backward.acquire(torch)
        _collectives.acquire(torch)
        _compile_hooks.acquire()
        self._optimizer_hooks = _OptimizerHooks(None, "optimizer_step", memory=True, auto=True)
        self._forward = RootForward(torch)
        original = self._original_iter = data.DataLoader.__iter__

        @functools.wraps(original)
        def __iter__(loader: Any) -> Any:
            it = original(loader)
            if getattr(loader, "_otel_tunix_skip", False):
                return it
            owner = InstrumentedLoader(loader, before_fetch=_fetch_starts)
            try:
                length: int | None = len(loader)
            except TypeError:
                length = None
            return _InstrumentedIterator(it, owner, length)

        data.DataLoader.__iter__ = __iter__  # type: ignore[method-assign]

    def _uninstrument(self, **kwargs: Any) -> None:
        self._active = False
        _auto.enabled = False
        stop_carrying_into_threads()
        if self._optimizer_hooks is None:
            return
        torch = sys.modules["torch"]
        self._optimizer_hooks.remove()
        self._optimizer_hooks = None
        if self._forward is not None:
            self._forward.remove()
            self._forward = None
        _backward.release(torch)
        _collectives.release(torch)
        _compile_hooks.release()
        torch.utils.data.DataLoader.__iter__ = self._original_iter
        if _auto.current is not None and _auto.thread == threading.get_ident():
            _auto.step_done()


def _fetch_starts() -> bool:
    # Record the fetch only in auto steps; a program's own step decides for itself.
    return _auto.activity()
