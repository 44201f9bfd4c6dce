"""Which Tunix the Tunix tests run against: the installed one, or upstream HEAD.

Upstream HEAD's ``tunix/`` package is kept beside the repository
(``../shared/vendor/tunix-<commit>.tar.gz``, see its README); the session fixture
:func:`tunix_head` extracts it. A pytest run with ``TUNIX_UNDER_TEST=<folder>`` in its
environment imports Tunix from that folder instead of the installed one
(``test_tunix_versions.py`` runs the Tunix tests so, in a child process).
"""

from __future__ import annotations

import os
import sys
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

UNDER_TEST = "TUNIX_UNDER_TEST"
"""Environment variable: a folder holding a ``tunix/`` package to test against."""

VENDOR = Path(__file__).resolve().parents[2].parent / "shared" / "vendor"
"""Where a checkout keeps third-party source for tests (absent in a user's clone)."""

_under_test = os.environ.get(UNDER_TEST)
if _under_test:  # before any test module imports tunix
    sys.path.insert(0, _under_test)


def head_tarball() -> Path | None:
    """Upstream HEAD's tarball, or ``None`` when ``../shared/vendor/`` does not hold one."""
    found = sorted(VENDOR.glob("tunix-*.tar.gz")) if VENDOR.is_dir() else []
    return found[-1] if found else None


@pytest.fixture(scope="session")
def tunix_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding upstream HEAD's ``tunix/`` package (extracted once per session);
    skips where the tarball is absent."""
    tarball = head_tarball()
    if tarball is None:
        pytest.skip(f"no upstream Tunix tarball in {VENDOR}")
    dest = tmp_path_factory.mktemp("tunix-head")
    with tarfile.open(tarball) as tar:
        tar.extractall(dest, filter="data")
    (package,) = dest.glob("**/tunix/__init__.py")
    return package.parent.parent


@contextmanager
def xprof_annotations() -> Iterator[list[tuple[str, Any]]]:
    """The ``(name, step_num)`` of each ``jax.profiler.StepTraceAnnotation`` made inside
    (Tunix looks the class up on ``jax.profiler`` at each use): the step numbers Tunix's
    XProf traces carry."""
    import jax

    real = jax.profiler.StepTraceAnnotation
    seen: list[tuple[str, Any]] = []

    class Recording(real):  # type: ignore[misc, valid-type]
        def __init__(self, name: str, **kwargs: Any) -> None:
            seen.append((name, kwargs.get("step_num")))
            super().__init__(name, **kwargs)

    jax.profiler.StepTraceAnnotation = Recording
    try:
        yield seen
    finally:
        jax.profiler.StepTraceAnnotation = real
