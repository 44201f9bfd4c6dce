"""The process start time (where ``initialization`` begins) against a clock the test reads."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from processes import child_env

CHILD = """
import json, time
from otel_tunix.support.process import process_start_ns
print(json.dumps({"start": process_start_ns(), "now": time.time_ns()}))
"""


def test_process_start_is_when_the_child_was_launched() -> None:
    before = time.time_ns()
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=child_env(), capture_output=True, text=True, check=True
    )
    after = time.time_ns()
    got = json.loads(out.stdout)
    tick = 20_000_000  # the kernel's start time is in clock ticks (10 ms), rounded down
    assert before - tick <= got["start"] <= got["now"] <= after
    # before otel-tunix's import: the interpreter's own start-up lies between
    assert got["start"] < got["now"]
