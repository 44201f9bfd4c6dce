"""What a forked child does with the otel-tunix objects it inherited.

``os.fork()`` copies the whole process but only the thread that called it: a lock that
another thread (the step worker, a logging thread) held at that moment stays held for ever
in the child, and the child's copy of a file's write buffer holds the parent's lines. So in
a forked child every object that registered here gets a fresh lock and stops writing
(:func:`at_fork_in_child`), and each inherited file is pointed at ``/dev/null``
(:func:`silence_file`): what the child's copy of its buffer flushes at exit goes nowhere,
never into the parent's file. The run itself is forgotten by run setup's own handler: a
child records nothing unless it calls ``configure()`` itself.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Protocol

from otel_tunix.support.errors import report_internal_error

__all__ = ["at_fork_in_child", "silence_file"]


class HasFileno(Protocol):
    """A file, or anything with a descriptor."""

    def fileno(self) -> int: ...


_lock = threading.Lock()
_handlers: list[weakref.WeakMethod[Callable[[], None]]] = []


def at_fork_in_child(method: Callable[[], None]) -> None:
    """Call the bound ``method`` in every forked child while its object lives (it is held
    weakly: registering keeps nothing alive; handlers of dead objects are dropped)."""
    ref = weakref.WeakMethod(method)
    with _lock:
        _handlers[:] = [r for r in _handlers if r() is not None]
        _handlers.append(ref)


def silence_file(file: HasFileno | None) -> None:
    """Point ``file``'s descriptor, in this process only, at ``/dev/null`` (a forked child's
    copy of the parent's file: its buffered lines and its later flushes land nowhere)."""
    if file is None:
        return
    try:
        fd = file.fileno()
    except (OSError, ValueError):  # closed, or no descriptor (an in-memory stream)
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def _in_child() -> None:
    global _lock
    _lock = threading.Lock()
    for ref in list(_handlers):
        method = ref()
        if method is None:
            continue
        try:
            method()
        except Exception:  # a bug of ours; a fork handler must not stop the others
            report_internal_error("a forked child's handler")


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_in_child)
