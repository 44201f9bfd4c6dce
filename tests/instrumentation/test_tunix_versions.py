"""The Tunix integration's tests against each Tunix a user may have: PyPI's (installed) and
upstream HEAD (``../shared/vendor/``), each in a pytest child process of its own (a process
imports one Tunix)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import UNDER_TEST

pytest.importorskip("tunix")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FILES = (
    "tests/instrumentation/test_tunix.py",  # SFT
    "tests/instrumentation/test_tunix_rl.py",  # RL: GRPO and PPO
    "tests/instrumentation/test_tunix_head.py",  # what only HEAD has
)


@pytest.mark.parametrize("tunix", ["installed", "head"])
def test_the_tunix_suite_passes_on(tunix: str, request: pytest.FixtureRequest) -> None:
    env = {k: v for k, v in os.environ.items() if k != UNDER_TEST}
    if tunix == "head":
        head: Path = request.getfixturevalue("tunix_head")
        env[UNDER_TEST] = str(head)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(head), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *FILES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout[-6000:]
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|skipped|failed)", out)}
    assert counts.get("passed", 0) >= 30, out
    skipped = [
        line
        for line in out.splitlines()
        if line.startswith("SKIPPED") and "entry points are not installed" not in line
    ]  # (the zero-code test needs ``pip install -e .``: not a matter of the Tunix version)
    if tunix == "head":  # everything runs on HEAD: the tests of what only HEAD has too
        assert not skipped, out
    else:
        assert all("test_tunix_head" in s for s in skipped), out
