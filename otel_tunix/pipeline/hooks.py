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
What each call carries (a batch's steps, a row's scalars) is counted as it is queued and
as it is delivered: what a hook left behind had not been given is counted too
(``hook_<unit>_not_delivered`` in ``summary.json``, :meth:`HookRunner.left_behind`).
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from otel_tunix.pipeline.batch_queue import BatchQueue
from otel_tunix.settings import tally as _tally
from otel_tunix.support.errors import warn_once

__all__ = [
    "HookRunner",
    "close_hooks",
    "closing_threads",
    "count_left_behind",
    "flush_hooks",
    "runs_user_code",
]

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
        unit: What the calls carry (``"steps"``, ``"scalars"``): what was not delivered is
            counted as ``hook_<unit>_not_delivered``.
    """

    def __init__(self, name: str, report: Callable[[str], object], unit: str = "calls") -> None:
        self.name = name
        self.unit = unit
        self._report = report
        self._count_lock = threading.Lock()
        self._queued = 0
        """Items queued so far (callers' side, under ``_count_lock``)."""
        self._done = 0
        """Items whose call has run (written by the hook's thread only)."""
        self._left_counted = False
        self._queue: BatchQueue[tuple[int, Callable[[], object]]] = BatchQueue(
            self._run,
            name=f"otel-tunix-hook-{name}",
            capacity=CAPACITY,
            max_batch=64,
            interval_sec=INTERVAL_SEC,
        )
        self._closer: threading.Thread | None = None

    def call(self, fn: Callable[..., object], *args: Any, **kwargs: Any) -> bool:
        """Queue ``fn(*args, **kwargs)`` (False: the queue was full or closed; counted)."""
        return self.call_items(0, fn, *args, **kwargs)

    def call_items(self, items: int, fn: Callable[..., object], *args: Any, **kwargs: Any) -> bool:
        """Queue ``fn(*args, **kwargs)``, a call that carries ``items`` of the hook's unit
        (steps, scalars); a call that cannot be queued counts them as not delivered."""
        if items:
            with self._count_lock:
                self._queued += items
        if self._queue.put((items, functools.partial(fn, *args, **kwargs))):
            return True
        if items:
            with self._count_lock:
                self._queued -= items
            _tally.add(f"hook_{self.unit}_not_delivered", items)
        _tally.add("hook_calls_dropped")
        warn_once(
            ("hook-full", self.name),
            "otel-tunix: %s has not kept up (%d calls queued); later calls are dropped and "
            "counted in summary.json (hook_calls_dropped); the training loop goes on",
            self.name,
            CAPACITY,
        )
        return False

    def _run(self, calls: list[tuple[int, Callable[[], object]]]) -> None:
        for items, call in calls:
            try:
                call()
            except Exception:  # the hook's own failure: its owner reports it once
                self._report(_method_name(call))
            finally:
                self._done += items

    @property
    def pending(self) -> int:
        """Items queued whose call has not run yet (the one running included)."""
        with self._count_lock:
            return max(0, self._queued - self._done)

    def left_behind(self) -> int:
        """The hook is left behind (it had not finished at the deadline): count what it was
        not given (``hook_<unit>_not_delivered``, once) and return that."""
        pending = self.pending
        if not self._left_counted:
            self._left_counted = True
            _tally.add(f"hook_{self.unit}_not_delivered", pending)
        return pending

    def flush(self, timeout: float) -> bool:
        """Wait until every queued call has run (False: ``timeout`` passed first)."""
        return self._queue.flush(timeout)

    def start_closing(self, final: Callable[[], object] | None) -> threading.Thread:
        """Run the queued calls, then ``final`` (the hook's ``close``), on a daemon thread;
        returns it (alive while the hook has not finished)."""
        if self._closer is None:
            self._closer = _Closer(self, final)
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


class _Closer(threading.Thread):
    """The thread that closes a hook (its queued calls, then its ``close``), which knows
    its runner: a shutdown that leaves it behind counts what it had not delivered. (A weak
    reference: the runner holds its closer, and a cycle would be left to the garbage
    collector once the thread ends.)"""

    def __init__(self, runner: HookRunner, final: Callable[[], object] | None) -> None:
        name = f"otel-tunix-close-{runner.name}"
        super().__init__(target=runner._close, args=(final,), name=name, daemon=True)
        self.runner = weakref.ref(runner)


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
    return count_left_behind(threads)


def count_left_behind(closing: Iterable[tuple[str, threading.Thread]]) -> list[str]:
    """The names of the hooks of ``closing`` (``(name, closing thread)``) still running:
    each is counted (``hooks_unfinished``), with what it had not delivered
    (:meth:`HookRunner.left_behind`)."""
    unfinished = []
    for name, thread in closing:
        if thread.is_alive():
            unfinished.append(name)
            runner = thread.runner() if isinstance(thread, _Closer) else None
            if runner is not None:
                runner.left_behind()
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
