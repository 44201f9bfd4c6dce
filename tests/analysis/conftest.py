"""Fixtures of the analysis tests (helpers in ``analysis_runs.py``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from analysis_runs import Measured, make_run, write_jsonl

from otel_tunix.testing import reset


@pytest.fixture(scope="module")
def known_measured() -> Measured:
    """What :func:`make_run` measured while making ``known_run`` (ask for ``known_run`` too)."""
    return Measured()


@pytest.fixture(scope="module")
def known_run(tmp_path_factory: pytest.TempPathFactory, known_measured: Measured) -> Path:
    """One run of :func:`make_run`, shared by a module's tests (it takes about a second)."""
    with pytest.MonkeyPatch.context() as mp:  # the autouse env cleanup is per test
        for name in list(os.environ):
            if name.startswith(("OTEL_", "DD_")) or name in ("RANK", "WORLD_SIZE"):
                mp.delenv(name)
        reset()
        return make_run(tmp_path_factory.mktemp("run") / "known-sleeps", measured=known_measured)


@pytest.fixture
def jsonl_writer() -> Callable[..., Path]:
    """:func:`write_jsonl` as a fixture."""
    return write_jsonl
