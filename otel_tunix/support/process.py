"""When this process started (wall clock, Unix ns): where a job's ``initialization`` begins."""

from __future__ import annotations

import os
import time
from functools import cache

_IMPORTED_NS = time.time_ns()
"""When otel-tunix was imported: the fallback where the process start cannot be read."""


@cache
def process_start_ns() -> int:
    """The process's start time in Unix ns, to the kernel's clock tick (10 ms on Linux).

    On Linux: ``/proc/self/stat``'s start time (ticks since boot) against
    ``CLOCK_BOOTTIME`` now (``/proc/stat``'s ``btime`` is whole seconds, so it is not used).
    Elsewhere, or if that cannot be read: when otel-tunix was imported.
    """
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # The command name (field 2) may hold spaces and parentheses: split after its end.
        fields = stat[stat.rindex(b")") + 2 :].split()
        ticks = int(fields[19])  # field 22, starttime
        hz = os.sysconf("SC_CLK_TCK")
        since_boot_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        now_ns = time.time_ns()
        start = now_ns - (since_boot_ns - ticks * 1_000_000_000 // hz)
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORTED_NS
    return start if 0 < start <= _IMPORTED_NS else _IMPORTED_NS
