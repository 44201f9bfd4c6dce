"""Report a failing part once.

Work off the training thread (span processors, step sinks, MetricsLogger backends) must never
raise into the loop, nor fill the log with the same traceback at every step: the first
failure of each part is logged with its traceback, later ones are not.
"""

from __future__ import annotations

import logging


class ReportOnce:
    """``report(key, msg, *args)`` from an ``except`` block: logs ``msg`` with the traceback
    the first time ``key`` (e.g. ``id(part)``) fails, nothing after; at ``level`` (default
    ERROR)."""

    __slots__ = ("_level", "_logger", "_seen")

    def __init__(self, logger: logging.Logger, level: int = logging.ERROR) -> None:
        self._logger = logger
        self._level = level
        self._seen: set[object] = set()

    def __call__(self, key: object, msg: str, *args: object) -> None:
        if key not in self._seen:
            self._seen.add(key)
            self._logger.log(self._level, msg, *args, exc_info=True)
