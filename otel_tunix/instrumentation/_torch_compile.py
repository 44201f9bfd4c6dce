"""torch.compile's compilations: each one a ``torch_compile`` component and a count in
``tunix.compilations``. Re-exported by :mod:`otel_tunix.instrumentation.torch`.

Dynamo runs the callbacks of ``torch._dynamo.callback_handler`` around each compilation, on
the thread that called the compiled function: a frame it compiles (``CallbackTrigger.DYNAMO``:
the first call, a recompilation after a guard failed, each frame after a graph break) and a
backward graph compiled when the first backward runs (``LAZY_BACKWARD``). Each is the
component ``torch_compile`` (busy) over the compilation, in the step open there (nested in
the component that called the function), with the attributes ``tunix.compile.trigger``
(``dynamo`` / ``lazy_backward``), ``tunix.compile.cause`` and ``tunix.compile.reason`` (the
guard that failed, as dynamo words it). A frame compiled counts once in
``tunix.compilations`` (``framework="torch"``) with its ``cause``
(:func:`~otel_tunix.metrics.compilations.cause_of_guard_failure`). Dynamo hands its
callbacks no reason: it is read from dynamo's metrics context for the compilation (a private
structure, read defensively: without it the cause of a recompilation is ``other``).

Nothing runs while no compilation happens; the callbacks are registered when
``torch._dynamo`` is imported (``torch.compile`` imports it), not before.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import otel_tunix
from otel_tunix.accounting import categories
from otel_tunix.instrumentation import _base
from otel_tunix.metrics.compilations import cause_of_guard_failure, count_compilation
from otel_tunix.settings.attributes import COMPILE_TRIGGER
from otel_tunix.support.errors import report_internal_error, warn_once

COMPONENT = "torch_compile"
categories.declare(COMPONENT, categories.COMPILATION)  # goodput: its time is compilation
"""The component (span) name of a compilation."""

MAX_REASON = 256
"""Longest ``tunix.compile.reason`` kept (a guard's text can name long expressions)."""


class _Starts(threading.local):
    def __init__(self) -> None:
        self.starts: dict[str, int] = {}


class _CompileHooks:
    """The dynamo callbacks, shared by every user (reference counted)."""

    def __init__(self) -> None:
        self.users = 0
        self.lock = threading.Lock()
        self.handler: Any = None  # dynamo's callback handler, while registered
        self.hooked = False
        self.local = _Starts()

    def acquire(self) -> None:
        with self.lock:
            self.users += 1
            hooked, self.hooked = self.hooked, True
        if not hooked:  # once: registers now if dynamo is imported, else when it is
            try:
                _base.when_imported("torch._dynamo", self._register, extra="torch")
            except ModuleNotFoundError as exc:  # no wrapt: the model is timed all the same
                with self.lock:
                    self.hooked = False
                warn_once(
                    "torch-compile-hooks", "torch.compile's compilations are not recorded: %s", exc
                )
        elif "torch._dynamo" in sys.modules:  # acquired again after the last release
            self._register(sys.modules["torch._dynamo"])

    def release(self) -> None:
        with self.lock:
            self.users = max(0, self.users - 1)
            handler = self.handler if not self.users else None
            if handler is None:
                return
            self.handler = None
        try:
            handler.remove_start_callback(self._start)
            handler.remove_end_callback(self._end)
        except Exception:  # dynamo's handler changed under us: nothing left to remove
            pass

    def _register(self, dynamo: Any) -> None:
        with self.lock:
            if not self.users or self.handler is not None:
                return
            handler = getattr(dynamo, "callback_handler", None)
            if handler is None:  # a torch without compilation callbacks (< 2.6)
                return
            handler.register_start_callback(self._start)
            handler.register_end_callback(self._end)
            self.handler = handler

    def _start(self, args: Any) -> None:
        self.local.starts[str(getattr(args, "compile_id", ""))] = time.perf_counter_ns()

    def _end(self, args: Any) -> None:
        end = time.perf_counter_ns()
        try:
            start = self.local.starts.pop(str(getattr(args, "compile_id", "")), None)
            trigger = getattr(getattr(args, "callback_trigger", None), "name", "DYNAMO").lower()
            attrs: dict[str, Any] = {COMPILE_TRIGGER: trigger}
            if trigger == "dynamo":
                reason = _recompile_reason()
                cause = cause_of_guard_failure(reason)
                attrs["tunix.compile.cause"] = cause
                if reason:
                    attrs["tunix.compile.reason"] = reason[:MAX_REASON]
                count_compilation("torch", cause)
            if start is not None:
                otel_tunix.record_component(COMPONENT, start, end, attributes=attrs)
        except Exception:  # our handler (count and record never raise into dynamo)
            report_internal_error("recording a torch.compile compilation")


def _recompile_reason() -> str | None:
    """The failed guard that made dynamo compile again (``None``: a first compilation)."""
    utils = sys.modules.get("torch._dynamo.utils")
    get = getattr(utils, "get_metrics_context", None)
    if get is None:
        return None
    metrics = getattr(get(), "_metrics", None)
    reason = metrics.get("recompile_reason") if isinstance(metrics, dict) else None
    return str(reason) if reason else None


_compile_hooks = _CompileHooks()


def instrument_compile() -> None:
    """Record torch.compile's compilations (see the module docstring).
    :func:`instrument_model` and the zero-code instrumentor call it; undo with
    :func:`uninstrument_compile` (reference counted)."""
    _compile_hooks.acquire()


def uninstrument_compile() -> None:
    """Undo one :func:`instrument_compile`."""
    _compile_hooks.release()
