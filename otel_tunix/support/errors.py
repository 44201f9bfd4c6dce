"""One policy for errors that must not reach the training loop.

Two kinds, two functions, each reporting a thing once:

* :func:`report_internal_error`: a bug of otel-tunix's own (the hot path, the worker, the
  span builder). Logged once per place with its traceback, and the loop goes on; with
  ``OTEL_TUNIX_RAISE_INTERNAL_ERRORS=true`` (the test suite sets it) it is re-raised
  instead, so no test passes over a swallowed bug. As Logfire's
  ``handle_internal_errors`` does.
* :class:`ReportOnce` / :func:`warn_once`: a failure of someone else's code that otel-tunix
  calls (a user's export function or backend, an exporter whose collector is down, a bad
  value logged): reported once per part and never re-raised, whatever the setting.
"""

from __future__ import annotations

import logging
import os
import threading

from otel_tunix.settings import variables as env
from otel_tunix.settings.values import load_setting

__all__ = ["ReportOnce", "forget_reports", "report_internal_error", "warn_once"]

_logger = logging.getLogger("otel_tunix")
_lock = threading.Lock()
_reported: set[object] = set()
_warned: set[object] = set()


def raise_internal_errors() -> bool:
    """Whether internal errors are re-raised (``OTEL_TUNIX_RAISE_INTERNAL_ERRORS``)."""
    return bool(load_setting(env.OTEL_TUNIX_RAISE_INTERNAL_ERRORS))


def report_internal_error(where: str) -> None:
    """Report the exception being handled as an internal error of otel-tunix ``where``.

    Call it from an ``except`` block. Logged with its traceback the first time ``where``
    fails; re-raised when ``OTEL_TUNIX_RAISE_INTERNAL_ERRORS`` is true.
    """
    if raise_internal_errors():
        raise  # the exception the caller is handling
    with _lock:
        first = where not in _reported
        _reported.add(where)
    if first:
        _logger.exception(
            "otel-tunix: internal error in %s (reported once; the training loop goes on)",
            where,
        )


def warn_once(
    key: object,
    msg: str,
    *args: object,
    logger: logging.Logger = _logger,
    level: int = logging.WARNING,
    exc_info: bool = False,
) -> None:
    """Log ``msg % args`` (a warning, or ``level``) the first time ``key`` is seen in this
    process; ``exc_info`` adds the traceback of the exception being handled."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.log(level, msg, *args, exc_info=exc_info)


def forget_reports() -> None:
    """Report every internal error and warning again (tests start from a clean slate)."""
    with _lock:
        _reported.clear()
        _warned.clear()


def _new_lock_in_child() -> None:
    """A forked child: the lock another thread may have held at the fork is made anew."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_new_lock_in_child)


class ReportOnce:
    """``report(key, msg, *args)`` from an ``except`` block: logs ``msg`` with the traceback
    the first time ``key`` (e.g. ``id(part)``) fails, nothing after; at ``level`` (default
    ERROR). For failures of code otel-tunix calls, not of its own (never re-raised)."""

    __slots__ = ("_level", "_logger", "_seen")

    def __init__(self, logger: logging.Logger, level: int = logging.ERROR) -> None:
        self._logger = logger
        self._level = level
        self._seen: set[object] = set()

    def __call__(self, key: object, msg: str, *args: object) -> None:
        if key not in self._seen:
            self._seen.add(key)
            self._logger.log(self._level, msg, *args, exc_info=True)
