"""A fork waits for the exports in flight over gRPC.

gRPC's core prepares itself for ``fork()`` (its own fork handlers pause and reset its
pollers and threads) only when no other thread is inside a gRPC call at that moment; when
one is, it logs ``Other threads are currently calling into gRPC, skipping fork() handlers``
and the child inherits a poller in the middle of its work. A child that then uses gRPC (a
DataLoader worker that configures a run of its own, exporting over OTLP/gRPC) may abort
(``ev_epoll1_linux.cc: Check failed``, SIGABRT): 2 of 100 such children did.

So while a run's exporters may use gRPC (``grpc`` is imported), a fork first takes the locks
its exporters hold while they export (otel-tunix's batch processors, the SDK's batch
processors and periodic metric readers): it happens between two exports, never during one,
and gRPC's handlers run. It waits at most :data:`FORK_WAIT_SEC` for them. A lock it waited
for in vain (an export to a collector that hangs, or one slow fork on a loaded machine) is
waited for at most :data:`STUCK_WAIT_SEC` at the next forks, until a fork gets it again:
a hung collector costs each fork that much, and the guard never gives up on the lock (it
did: after one wait in vain, the next 96-98 of 100 forks went through mid-export and 6 of
400 children aborted). The locks are let go of in the parent and the child right after the
fork. gRPC's Python-level fork
support (``GRPC_ENABLE_FORK_SUPPORT``) is not turned on: with it, forks under a busy
exporter hung.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from otel_tunix.pipeline.export_processor import BatchExportProcessor
from otel_tunix.run.parts import Part
from otel_tunix.support.shortcuts import sdk_export_locks, span_processors_of

__all__ = ["FORK_WAIT_SEC", "STUCK_WAIT_SEC", "ForkGuardPart", "export_locks"]

FORK_WAIT_SEC = 1.0
"""The longest a fork waits for the exports in flight, all together."""

STUCK_WAIT_SEC = 0.25
"""The longest a fork waits for a lock that an earlier fork waited for in vain (an export
takes milliseconds; one that hangs costs each fork this much, not :data:`FORK_WAIT_SEC`)."""

_guards: list[ForkGuardPart] = []
_held: list[Any] = []
_stuck: set[int] = set()  # ids of the locks a fork waited for in vain


class ForkGuardPart(Part):
    """Makes a fork wait for the run's exports in flight (see the module's docstring)."""

    name = "fork guard"

    def __init__(self, locks: Callable[[], list[Any]]) -> None:
        self._locks = locks

    def start(self) -> None:
        _guards.append(self)

    def close(self, deadline: float) -> bool:
        if self in _guards:
            _guards.remove(self)
        return True

    def in_forked_child(self) -> None:
        _guards.clear()

    def locks(self) -> list[Any]:
        """The locks to take before a fork."""
        return self._locks()


def export_locks(*providers: Any) -> Callable[[], list[Any]]:
    """What the exporters of these providers hold while they export (read at each fork:
    processors are added and readers restarted as the run goes)."""

    def locks() -> list[Any]:
        out: list[Any] = []
        for provider in providers:
            if provider is None:
                continue
            if hasattr(provider, "_active_span_processor"):
                out += [
                    p.export_lock
                    for p in span_processors_of(provider)
                    if isinstance(p, BatchExportProcessor)
                ]
            out += sdk_export_locks(provider)
        return out

    return locks


def _before_fork() -> None:
    if not _guards or "grpc" not in sys.modules:
        return
    deadline = time.monotonic() + FORK_WAIT_SEC
    for guard in list(_guards):
        try:
            locks = guard.locks()
        except Exception:  # a provider of an unexpected shape: the fork goes on unguarded
            continue
        for lock in locks:
            # One that made an earlier fork wait in vain (an export to a collector that
            # hangs) is waited for a shorter time until a fork gets it again.
            wait = max(0.0, deadline - time.monotonic())
            if id(lock) in _stuck:
                wait = min(wait, STUCK_WAIT_SEC)
            if lock.acquire(timeout=wait) if wait else lock.acquire(blocking=False):
                _held.append(lock)
                _stuck.discard(id(lock))
            else:
                _stuck.add(id(lock))


def _after_fork() -> None:
    # In the child, the objects are the child's copies of the same locks, held by this
    # thread (the one that forked): let go of them too (the SDK makes new ones for its
    # restarted threads; otel-tunix's queues are restarted with new ones).
    while _held:
        lock = _held.pop()
        try:
            lock.release()
        except RuntimeError:  # released already
            pass


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork
    )
