"""Carry the open step into the threads and pool tasks started inside it.

A thread does not inherit the context of the code that starts it, nor does a
``ThreadPoolExecutor`` task inherit the context of ``submit()``: their components would
see no step, and a framework tracer would open a stray step of its own for them (Tunix's
GRPO learner runs rollout, reference inference and advantage computation on its executor).
While a framework integration is on, ``ThreadPoolExecutor.submit`` and ``Thread.start``
called inside a sampled step run the task (the thread) in a copy of the caller's context,
so its components are the step's, under the component that started it.

Outside a sampled step nothing is carried and nothing is wrapped. A thread that outlives
the step it was started in (a long-lived loader thread) records into the latest open step
from then on, as any thread without the context does. The executor's own worker threads
are left alone: each task carries its own context.

OpenTelemetry's ``opentelemetry-instrumentation-threading`` does the same for the OTel
context only; otel-tunix's step lives in its own context variable as well, so a copy of the
whole context is what is carried here.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

from otel_tunix._errors import report_internal_error
from otel_tunix._recording import carried_context

__all__ = ["carry_into_threads", "stop_carrying_into_threads"]

_lock = threading.Lock()
_users = 0
_POOL_MODULE = concurrent.futures.thread.__name__


def _wrap_submit(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    ctx = carried_context()
    if ctx is None or not args:
        return wrapped(*args, **kwargs)
    return wrapped(ctx.run, *args, **kwargs)


def _wrap_start(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    ctx = carried_context()
    if ctx is not None:
        try:
            target = getattr(instance, "_target", None)
            if getattr(target, "__module__", None) != _POOL_MODULE:  # not a pool's worker
                run = instance.run
                instance.run = lambda: ctx.run(run)
        except Exception:  # a Thread subclass that does not take the attribute: not carried
            report_internal_error("carrying the step into a thread")
    return wrapped(*args, **kwargs)


def carry_into_threads() -> None:
    """Start carrying (reference-counted: each integration that turns it on turns it off)."""
    global _users
    import wrapt

    with _lock:
        _users += 1
        if _users == 1:
            wrapt.wrap_function_wrapper(
                concurrent.futures.ThreadPoolExecutor, "submit", _wrap_submit
            )
            wrapt.wrap_function_wrapper(threading.Thread, "start", _wrap_start)


def stop_carrying_into_threads() -> None:
    """Stop carrying once the last integration that turned it on turns it off."""
    global _users
    from opentelemetry.instrumentation.utils import unwrap

    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0:
            unwrap(concurrent.futures.ThreadPoolExecutor, "submit")
            unwrap(threading.Thread, "start")
