"""``torch.distributed`` collectives as blocked components. Re-exported by
:mod:`otel_tunix.instrumentation.torch`.

In a data-parallel job a collective in every step makes every rank wait for the slowest one
there: the wait is time the rank does not spend on its own work, so it is recorded as
``blocked`` (the straggler comparison subtracts it; see ``otel_tunix.consumers.stragglers``).

* A blocking call of one of :data:`COLLECTIVES` (``torch.distributed.all_reduce``, ...) is the
  blocked component of its name (``all_reduce``), from the call to its return.
* With CUDA in use each of them ends when the GPU finished the work queued inside it (as
  every span of the torch integration: ``device_component``): a NCCL collective returns to
  the host at once, and its span then shows the time the GPU waited for the other ranks.
* With ``async_op=True`` the call returns at once; the ``wait()`` of the work it returned is
  the blocked component ``<name>_wait`` (``all_reduce_wait``); the ``wait()`` of any other
  work (``isend`` / ``irecv``) is ``dist_wait``.

The functions are replaced on the ``torch.distributed`` module (what ``dist.all_reduce(...)``
and FSDP's ``dist.all_gather_into_tensor(...)`` look up at each call), ``Work.wait`` on its
class. A name imported before (``from torch.distributed import all_reduce``) keeps the
original, and so do collectives issued from C++ (DDP's gradient buckets, which it waits for
inside ``backward``) and the functional collectives of ``torch.compile``'d code. Outside a
sampled step a call costs a ``torch.compiler.is_compiling()`` check and a look at the
calling context (a few hundred nanoseconds, against tens of microseconds for the smallest
collective); under ``torch.compile`` tracing the original is called, so the graph is the same.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from otel_tunix.instrumentation._torch_device import device_component
from otel_tunix.recording.hot_path import may_record

COLLECTIVES: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "all_to_all",
    "all_to_all_single",
    "reduce",
    "gather",
    "scatter",
)
"""The ``torch.distributed`` functions recorded (those the installed torch has)."""

UNKNOWN_WAIT = "dist_wait"
"""Component of a ``Work.wait()`` whose work came from no recorded collective."""


class _Depth(threading.local):
    depth = 0


_inside = _Depth()
"""Inside a recorded collective on this thread: its own ``Work.wait()`` (a blocking call
waits on its work) and nested collectives (``all_gather_object`` calls ``all_gather``) are
part of it."""


class _CollectivePatch:
    """The replaced functions and ``Work.wait``, shared by every user (reference counted)."""

    def __init__(self) -> None:
        self.users = 0
        self.lock = threading.Lock()
        self.originals: dict[str, Callable[..., Any]] = {}
        self.original_wait: Any = None
        self.work_cls: Any = None
        self.names: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        """The collective of each outstanding async work."""

    def acquire(self, torch: Any) -> None:
        with self.lock:
            self.users += 1
            if self.users > 1:
                return
            dist = getattr(torch, "distributed", None)
            if dist is None or not dist.is_available():
                return
            compiling = _is_compiling(torch)
            for name in COLLECTIVES:
                original = getattr(dist, name, None)
                if original is None or hasattr(original, "__otel_tunix_original__"):
                    continue
                self.originals[name] = original
                setattr(dist, name, self._wrap(name, original, compiling))
            work = getattr(dist, "Work", None)
            if work is not None:
                self.work_cls, self.original_wait = work, work.wait
                work.wait = self._wrap_wait(work.wait, compiling)

    def release(self, torch: Any) -> None:
        with self.lock:
            self.users = max(0, self.users - 1)
            if self.users:
                return
            dist = torch.distributed
            for name, original in self.originals.items():
                if getattr(getattr(dist, name, None), "__otel_tunix_original__", None):
                    setattr(dist, name, original)
            self.originals.clear()
            if self.work_cls is not None:
                self.work_cls.wait = self.original_wait
                self.work_cls = self.original_wait = None

    def _wrap(
        self, name: str, original: Callable[..., Any], compiling: Callable[[], bool]
    ) -> Callable[..., Any]:
        try:
            params = list(inspect.signature(original).parameters)
        except (TypeError, ValueError):  # no signature: every call counts as blocking
            params = []
        at = params.index("async_op") if "async_op" in params else -1
        names = self.names

        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            # is_compiling() first: under dynamo's tracing it is a constant and the rest of
            # this function is not traced (the original alone is, as without us)
            if compiling() or not may_record() or _inside.depth:
                return original(*args, **kwargs)
            if kwargs.get("async_op") or (0 <= at < len(args) and args[at]):
                work = original(*args, **kwargs)
                if work is not None:
                    try:
                        names[work] = name
                    except TypeError:  # a work object without weak references
                        pass
                return work
            _inside.depth += 1
            try:
                with device_component(name, True):
                    return original(*args, **kwargs)
            finally:
                _inside.depth -= 1

        collective.__otel_tunix_original__ = original  # type: ignore[attr-defined]
        return collective

    def _wrap_wait(self, original: Any, compiling: Callable[[], bool]) -> Any:
        names = self.names

        @functools.wraps(original)
        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            if compiling() or not may_record() or _inside.depth:
                return original(work, *args, **kwargs)
            try:
                name = names.pop(work, None)
            except TypeError:
                name = None
            _inside.depth += 1
            try:
                with device_component(f"{name}_wait" if name else UNKNOWN_WAIT, True):
                    return original(work, *args, **kwargs)
            finally:
                _inside.depth -= 1

        wait.__otel_tunix_original__ = original  # type: ignore[attr-defined]
        return wait


def _is_compiling(torch: Any) -> Callable[[], bool]:
    compiler = getattr(torch, "compiler", None)
    check = getattr(compiler, "is_compiling", None)
    return check if check is not None else (lambda: False)


_collectives = _CollectivePatch()


def instrument_collectives() -> None:
    """Record ``torch.distributed`` collectives as blocked components (see the module
    docstring). :func:`instrument_model` and the zero-code instrumentor call it; idempotent
    per caller (reference counted: undo with :func:`uninstrument_collectives`)."""
    torch = sys.modules.get("torch")
    if torch is None:
        import torch
    _collectives.acquire(torch)


def uninstrument_collectives() -> None:
    """Undo one :func:`instrument_collectives`; the last one puts the originals back."""
    torch = sys.modules.get("torch")
    if torch is not None:
        _collectives.release(torch)
