"""A run is a short list of parts, each with one small interface.

``configure()`` assembles the parts of a run (its files, the step pipeline, the logger, the
providers and their exporters, ...; see :mod:`otel_tunix.run.run_parts`) and starts them in
order. Whatever ends the run walks the same list: ``shutdown()`` (called by the program, by
``atexit``, or on SIGTERM) closes them in order before one deadline, ``force_flush()``
flushes them, and a forked child tells each what to do with its copy.

Closing goes in list order. A part that waits on the network (an exporter, a provider) is
``side_by_side``: consecutive such parts are closed together, each on a thread of its own,
and those still going at the deadline are left behind (named, so ``summary.json`` can say
which). Every other part is closed on the calling thread, given what time is left.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from otel_tunix.support.errors import report_internal_error

__all__ = ["Part", "close_parts", "flush_parts", "left", "parts_in_forked_child", "start_parts"]

_logger = logging.getLogger(__name__)


def left(deadline: float) -> float:
    """Seconds from now to ``deadline`` (a ``time.monotonic()`` value), never negative."""
    return max(0.0, deadline - time.monotonic())


class Part:
    """One thing a run starts and must stop. Every hook has a do-nothing default, and none
    may raise for someone else's failure (it reports it and goes on)."""

    name: str = "part"
    """What ``summary.json`` and the warnings call it."""
    side_by_side: bool = False
    """Closed on a thread of its own beside its neighbours that are too (it may wait on the
    network), and left behind at the deadline."""

    def start(self) -> None:
        """Begin working (after every part of the run has been made)."""

    def flush(self, deadline: float) -> bool:
        """Hand on what it holds, before ``deadline`` (monotonic). False if it could not."""
        return True

    def close(self, deadline: float) -> bool:
        """Hand on what it holds and stop, before ``deadline`` (monotonic). False if it
        could not finish in time."""
        return True

    def unfinished(self) -> list[str]:
        """What ``summary.json`` names when the part had not finished at the deadline."""
        return [self.name]

    def in_forked_child(self) -> None:
        """In a forked child: the part is the parent's; let go of it without touching what
        the parent still uses (files, sockets, exporters' connections)."""


def start_parts(parts: Sequence[Part]) -> None:
    """Start the parts in order."""
    for part in parts:
        part.start()


def flush_parts(parts: Sequence[Part], deadline: float) -> bool:
    """Flush the parts in order, before ``deadline``; False if one could not."""
    ok = True
    for part in parts:
        try:
            ok = part.flush(deadline) and ok
        except Exception:  # a part reports its own failures: this is a last guard
            report_internal_error(f"flushing {part.name}")
            ok = False
    return ok


def close_parts(parts: Sequence[Part], deadline: float) -> list[str]:
    """Close the parts in order before ``deadline`` (consecutive ``side_by_side`` parts
    together, on threads). Returns the names of the side-by-side parts that had not
    finished (they go on as daemon threads; the process may end under them)."""
    unfinished: list[str] = []
    group: list[Part] = []
    for part in [*parts, None]:
        if part is not None and part.side_by_side:
            group.append(part)
            continue
        if group:
            unfinished += _close_side_by_side(group, deadline)
            group = []
        if part is not None:
            try:
                part.close(deadline)
            except Exception:  # a part reports its own failures: this is a last guard
                report_internal_error(f"closing {part.name}")
    return unfinished


def _close_side_by_side(parts: Sequence[Part], deadline: float) -> list[str]:
    """Close the parts on threads; the unfinished ones are those still running at the
    deadline and those that stopped there themselves (``close`` answered False: a
    translation that gave up at the deadline ends before the wait for it does)."""
    finished: dict[int, bool] = {}
    threads = []
    for i, part in enumerate(parts):
        thread = threading.Thread(
            target=_close_one,
            args=(part, deadline, finished, i),
            name="otel-tunix-shutdown",
            daemon=True,
        )
        thread.start()
        threads.append((part, thread))
    for _, thread in threads:
        thread.join(left(deadline))
    return [
        name
        for i, (part, thread) in enumerate(threads)
        if thread.is_alive() or not finished.get(i, False)
        for name in part.unfinished()
    ]


def _close_one(part: Part, deadline: float, finished: dict[int, bool], i: int) -> None:
    try:
        finished[i] = part.close(deadline)
    except Exception:  # an exporter's or provider's own failure: reported, the run ends
        finished[i] = True  # (failed, not unfinished)
        _logger.exception("otel-tunix: shutting down %s failed", part.name)


def parts_in_forked_child(parts: Sequence[Part]) -> None:
    """Tell every part that this is a forked child (none may stop the others)."""
    for part in parts:
        try:
            part.in_forked_child()
        except Exception:  # a bug of ours; a fork handler must not stop the others
            report_internal_error(f"{part.name} in a forked child")
