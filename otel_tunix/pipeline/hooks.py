"""A user's hook on a thread of its own: whatever it does, the training loop and the
shutdown budget hold.

A MetricsLogger backend, a step sink or an export function is someone else's code: it may
block (a network call with no timeout, a full pipe), be slow (5 ms a call), or hang in its
``close()``. Called inline, such a hook hung the training loop (a blocked backend: no step
in 45 s), slowed it 14 times (a backend slow on the worker thread only: the loop waited on the
MetricsLogger's lock held across the call), or kept ``shutdown()`` from returning. A
:class:`HookRunner` makes each call an item of its own bounded queue
(:class:`~otel_tunix.pipeline.batch_queue.BatchQueue`), run in order on its own daemon
thread: the caller only appends (never blocks, takes no lock the hook holds); a full queue
drops the call and counts it (``hook_calls_dropped`` in ``summary.json``); closing waits
for the hook at most until a deadline (:func:`close_hooks`) and names those left behind.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from otel_tunix.pipeline.batch_queue import BatchQueue
from otel_tunix.settings import tally as _tally
from otel_tunix.support.errors import warn_once

__all__ = ["HookRunner", "close_hooks", "closing_threads", "flush_hooks", "runs_user_code"]

CAPACITY = 4096
"""Calls queued for one hook at most (a batch of the worker's steps is one call)."""
INTERVAL_SEC = 0.25
"""Longest wait before queued calls run (the worker's default interval)."""


def runs_user_code(hook: object) -> bool:
    """Whether ``hook`` is someone else's code (not a class of otel-tunix's, or one of
    ours that calls the user's code: ``runs_user_code = True``, an export function's sink)."""
    if getattr(hook, "runs_user_code", False):
        return True
    return type(hook).__module__.partition(".")[0] != "otel_tunix"


class HookRunner:
    """The calls of one hook, in order, on a daemon thread of its own.

    Args:
        name: What the hook is (its class name): the thread's name and in messages.
        report: Called on the hook's thread, while the exception is handled, with the
            name of the hook's method that raised (the owner reports it once).
    """

    def __init__(self, name: str, report: Callable[[str], object]) -> None:
        self.name = name
        self._report = report
        self._queue: BatchQueue[Callable[[], object]] = BatchQueue(
            self._run,
            name=f"otel-tunix-hook-{name}",
            capacity=CAPACITY,
            max_batch=64,
            interval_sec=INTERVAL_SEC,
        )
        self._closer: threading.Thread | None = None

    def call(self, fn: Callable[..., object], *args: Any, **kwargs: Any) -> bool:
        """Queue ``fn(*args, **kwargs)`` (False: the queue was full or closed; counted)."""
        if self._queue.put(functools.partial(fn, *args, **kwargs)):
            return True
        _tally.add("hook_calls_dropped")
        warn_once(
            ("hook-full", self.name),
            "otel-tunix: %s has not kept up (%d calls queued); later calls are dropped and "
            "counted in summary.json (hook_calls_dropped); the training loop goes on",
            self.name,
            CAPACITY,
        )
        return False

    def _run(self, calls: list[Callable[[], object]]) -> None:
        for call in calls:
            try:
                call()
            except Exception:  # the hook's own failure: its owner reports it once
                self._report(_method_name(call))

    def flush(self, timeout: float) -> bool:
        """Wait until every queued call has run (False: ``timeout`` passed first)."""
        return self._queue.flush(timeout)

    def start_closing(self, final: Callable[[], object] | None) -> threading.Thread:
        """Run the queued calls, then ``final`` (the hook's ``close``), on a daemon thread;
        returns it (alive while the hook has not finished)."""
        if self._closer is None:
            self._closer = threading.Thread(
                target=self._close,
                args=(final,),
                name=f"otel-tunix-close-{self.name}",
                daemon=True,
            )
            self._closer.start()
        return self._closer

    def closing(self) -> threading.Thread | None:
        """The thread closing the hook, once :meth:`start_closing` ran."""
        return self._closer

    def _close(self, final: Callable[[], object] | None) -> None:
        self._queue.close(timeout=1e9)  # this thread waits for the hook as long as it takes
        if final is not None:
            try:
                final()
            except Exception:  # the hook's own failure: its owner reports it once
                self._report(_method_name(final))


def _method_name(call: Callable[..., object]) -> str:
    fn = call.func if isinstance(call, functools.partial) else call
    return str(getattr(fn, "__name__", "call"))


def close_hooks(
    hooks: Sequence[tuple[HookRunner, Callable[[], object] | None]], timeout: float
) -> list[str]:
    """Close these hooks side by side (each: its queued calls, then its ``close``); wait at
    most ``timeout``. Returns the names of those that had not finished (left running on
    their daemon threads; the process may end under them). ``timeout`` 0: only start
    closing them (whoever waits joins :meth:`HookRunner.closing` later)."""
    deadline = time.monotonic() + timeout
    threads = [(runner.name, runner.start_closing(final)) for runner, final in hooks]
    if timeout <= 0:
        return []
    for _, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    unfinished = [name for name, thread in threads if thread.is_alive()]
    if unfinished:
        _tally.add("hooks_unfinished", len(unfinished))
    return unfinished


def flush_hooks(runners: Iterable[HookRunner], timeout: float) -> bool:
    """Wait until these hooks have run every call queued so far, all within ``timeout``
    (False: it passed first)."""
    deadline = time.monotonic() + timeout
    ok = True
    for runner in runners:
        ok = runner.flush(max(0.0, deadline - time.monotonic())) and ok
    return ok


def closing_threads(runners: Iterable[HookRunner], kind: str) -> list[tuple[str, threading.Thread]]:
    """``("<kind> <name>", thread)`` of each of these hooks being closed on its thread (once
    :meth:`HookRunner.start_closing` ran): for a shutdown that waits for them beside other
    work."""
    out = []
    for runner in runners:
        thread = runner.closing()
        if thread is not None:
            out.append((f"{kind} {runner.name}", thread))
    return out
