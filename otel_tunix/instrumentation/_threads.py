"""Carry the open step into the threads and pool tasks started inside it.

A thread does not inherit the context of the code that starts it, nor does a
``ThreadPoolExecutor`` task inherit the context of ``submit()``: their components would
see no step, and a framework tracer would open a stray step of its own for them (Tunix's
GRPO learner runs rollout, reference inference and advantage computation on its executor).
While a framework integration is on, ``ThreadPoolExecutor.submit`` and ``Thread.start``
called inside a sampled step run the task (the thread) in a copy of the caller's context,
so its components are the step's, under the component that started it.

Outside a sampled step nothing is carried and nothing is wrapped: the patched ``submit``
costs one Python call and a context-variable read more than the original there (measured by
``bench/bench_threads.py``). The executor's own worker threads are left alone: each task
carries its own context.

A thread or task that outlives the step (a long-lived RL actor thread started in learner
step 0) no longer has that step as parent once it ended: its own steps start traces of their
own (linked to the step it was started in), other code's spans too, and its components go to
the step open at the time, or count as background work between steps.

OpenTelemetry's ``opentelemetry-instrumentation-threading`` does the same for the OTel
context only; otel-tunix's step lives in its own context variable as well, so a copy of the
whole context is what is carried here.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from collections.abc import Callable
from typing import Any

from otel_tunix.recording.hot_path import CONTEXT_OUTSIDE_STEPS, carried_context, step_context_var
from otel_tunix.support.errors import report_internal_error

__all__ = ["carry_into_threads", "stop_carrying_into_threads"]

_lock = threading.Lock()
_users = 0
_POOL_MODULE = concurrent.futures.thread.__name__
_Pool = concurrent.futures.ThreadPoolExecutor
_original_submit: Callable[..., Any] = _Pool.submit
_original_start: Callable[..., Any] = threading.Thread.start
_where = step_context_var.get
_OUTSIDE = CONTEXT_OUTSIDE_STEPS


# Plain functions set on the classes, not wrapt wrappers: outside a sampled step the patched
# submit costs one Python frame and a context-variable read more than the original, whatever
# wrapt build is installed (bench/bench_threads.py, on the project's VM: 0.14 us; the wrapt
# wrapper used before, 0.17 us with wrapt's C extension and 0.49 us without it).
@functools.wraps(_original_submit)
def _submit(self: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    cur = _where()
    if cur is _OUTSIDE or cur is None:  # outside a step, or in one not sampled
        return _original_submit(self, fn, *args, **kwargs)
    ctx = carried_context()
    if ctx is None:
        return _original_submit(self, fn, *args, **kwargs)
    return _original_submit(self, ctx.run, fn, *args, **kwargs)


@functools.wraps(_original_start)
def _start(self: Any) -> None:
    cur = _where()
    if cur is not _OUTSIDE and cur is not None:
        ctx = carried_context()
        if ctx is not None:
            try:
                target = getattr(self, "_target", None)
                if getattr(target, "__module__", None) != _POOL_MODULE:  # not a pool's worker
                    run = self.run
                    self.run = lambda: ctx.run(run)
            except Exception:  # a Thread subclass that does not take the attribute
                report_internal_error("carrying the step into a thread")
    _original_start(self)


def carry_into_threads() -> None:
    """Start carrying (reference-counted: each integration that turns it on turns it off)."""
    global _users
    with _lock:
        _users += 1
        if _users == 1:
            _Pool.submit = _submit  # type: ignore[method-assign]
            threading.Thread.start = _start  # type: ignore[method-assign]


def stop_carrying_into_threads() -> None:
    """Stop carrying once the last integration that turned it on turns it off. (Where other
    code wrapped either method since, its wrapper is left in place, and ours under it.)"""
    global _users
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0:
            if _Pool.__dict__.get("submit") is _submit:
                _Pool.submit = _original_submit  # type: ignore[method-assign]
            if threading.Thread.__dict__.get("start") is _start:
                threading.Thread.start = _original_start  # type: ignore[method-assign]
