"""Finish the run when the process is asked to terminate (SIGTERM).

Python's default action for SIGTERM ends the process at once, without ``atexit``: a
preempted job (SLURM, Kubernetes) would lose the steps still queued for processing, the
``session`` lines and ``summary.json``. While otel-tunix is configured, and only when the
application has not set a SIGTERM handler of its own, this handler finishes the run (within
``OTEL_TUNIX_SHUTDOWN_TIMEOUT``, 5 s by default) and then lets SIGTERM end the process as
it would have: the default action is restored and the signal raised again, so the exit
status is unchanged.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from otel_tunix._errors import report_internal_error

_logger = logging.getLogger(__name__)

_handler: Callable[[int, FrameType | None], None] | None = None


def install(shutdown: Callable[[], Any]) -> bool:
    """Set the handler (main thread only, and only over the default action). Returns True
    when it is set."""
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
            try:
                # A forked child (a DataLoader worker that its parent terminates) inherits
                # the handler and a copy of the run: only the process that configured it
                # may finish it, or the files would get the parent's lines twice.
                if os.getpid() == pid:
                    shutdown()  # within OTEL_TUNIX_SHUTDOWN_TIMEOUT
            except OSError:  # a file of the run could not be written (once: the process ends)
                _logger.exception("otel-tunix: finishing the run on SIGTERM failed")
            except Exception:  # shutdown() reports what the exporters and sinks raise itself
                report_internal_error("finishing the run on SIGTERM")
            finally:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_sigterm)
        _handler = on_sigterm
        return True
    except (ValueError, OSError):  # no signals here (an embedded interpreter, a sandbox)
        return False


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
