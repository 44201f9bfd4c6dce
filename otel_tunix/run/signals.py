"""Finish the run when the process is asked to terminate (SIGTERM).

Python's default action for SIGTERM ends the process at once, without ``atexit``: a
preempted job (SLURM, Kubernetes) would lose the steps still queued for processing, the
``session`` lines and ``summary.json``. While otel-tunix is configured, and only when the
application has not set a SIGTERM handler of its own, this handler finishes the run (within
``OTEL_TUNIX_SHUTDOWN_TIMEOUT``, 5 s by default) and then lets SIGTERM end the process as
it would have: the default action is restored and the signal raised again, so the exit
status is unchanged.

A Python signal handler runs on the main thread, between two bytecodes of whatever the main
thread was doing, which may hold a lock the shutdown needs (the MetricsLogger's, the step
queue's, the logging module's). So the handler takes no lock: the run is finished on a
thread of its own. When the handler is the process's, it restores the default action and
returns at once, so the interrupted code goes on and lets go of its locks; the thread ends
the process with SIGTERM once the run is finished (or the budget and a grace are spent).
When an application's handler installed later calls it as its previous handler, it waits
for that thread, at most the budget and the grace, and returns, so the application's own
clean-up after the call runs.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from otel_tunix.support.errors import report_internal_error

__all__ = ["GRACE_SEC", "after_shutdown", "install", "terminating", "uninstall"]

_logger = logging.getLogger(__name__)

GRACE_SEC = 1.0
"""What the SIGTERM path waits beyond the shutdown's budget before it gives up on it."""

_handler: Callable[[int, FrameType | None], None] | None = None
_finisher: threading.Thread | None = None
_finished = threading.Event()
_end_process = False  # the handler was the process's: the finisher ends the process


def install(shutdown: Callable[[], Any], budget: float) -> bool:
    """Set the handler (main thread only, and only over the default action). ``budget``:
    the seconds ``shutdown`` takes at most. Returns True when it is set."""
    global _handler
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        current = signal.getsignal(signal.SIGTERM)
        if current is _handler and _handler is not None:
            return True
        if current is not signal.SIG_DFL:  # the application handles SIGTERM itself
            return False

        pid = os.getpid()

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            global _end_process
            chained = signal.getsignal(signal.SIGTERM) is not on_sigterm
            if not chained:  # a second SIGTERM ends the process at once, as before
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            # A forked child (a DataLoader worker that its parent terminates) inherits the
            # handler and a copy of the run: only the process that configured it may finish
            # it, or the files would get the parent's lines twice.
            if os.getpid() != pid:
                if not chained:
                    os.kill(os.getpid(), signal.SIGTERM)
                return
            if not chained:
                _end_process = True
            done = _finish(shutdown, budget)
            if chained:
                done.wait(budget + GRACE_SEC)

        signal.signal(signal.SIGTERM, on_sigterm)
        _handler = on_sigterm
        return True
    except (ValueError, OSError):  # no signals here (an embedded interpreter, a sandbox)
        return False


def _finish(shutdown: Callable[[], Any], budget: float) -> threading.Event:
    """Start finishing the run on a thread (once); the event is set when it has finished
    or the budget and the grace are spent."""
    global _finisher
    if _finisher is None:
        _finished.clear()
        _finisher = threading.Thread(
            target=_finish_run, args=(shutdown, budget), name="otel-tunix-sigterm", daemon=True
        )
        _finisher.start()
    return _finished


def _finish_run(shutdown: Callable[[], Any], budget: float) -> None:
    global _finisher
    worker = threading.Thread(
        target=_shutdown_once, args=(shutdown,), name="otel-tunix-sigterm-shutdown", daemon=True
    )
    worker.start()
    worker.join(budget + GRACE_SEC)
    if worker.is_alive():
        _logger.warning(
            "otel-tunix: finishing the run on SIGTERM took more than %g s; left unfinished",
            budget + GRACE_SEC,
        )
    _finished.set()
    if _end_process:
        os.kill(os.getpid(), signal.SIGTERM)  # the default action again: the status is -15
        return
    _finisher = None  # a chained call: a later SIGTERM finishes a later run


def _shutdown_once(shutdown: Callable[[], Any]) -> None:
    try:
        shutdown()  # within OTEL_TUNIX_SHUTDOWN_TIMEOUT
    except OSError:  # a file of the run could not be written (once: the process ends)
        _logger.exception("otel-tunix: finishing the run on SIGTERM failed")
    except Exception:  # shutdown() reports what the exporters and sinks raise itself
        report_internal_error("finishing the run on SIGTERM")


def terminating() -> bool:
    """Whether a SIGTERM is finishing the run (the program may go on a moment meanwhile)."""
    return _finisher is not None


def after_shutdown() -> None:
    """Called at the end of every ``shutdown()``: on the main thread, while a SIGTERM that
    ours handled is finishing the run on the thread, wait for that thread (which ends the
    process), so the program does not exit with another status under it."""
    finisher = _finisher
    if (
        finisher is not None
        and _end_process
        and threading.current_thread() is threading.main_thread()
    ):
        finisher.join()


def uninstall() -> None:
    """Give SIGTERM its default action back if the handler is still the one set here."""
    global _handler
    if _handler is None or threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is _handler:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):
        return
    _handler = None
