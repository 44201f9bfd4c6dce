"""Helpers shared by the benchmarks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from otel_tunix import _tracer


@contextmanager
def steps_set_aside() -> Iterator[list[object]]:
    """While active, finished sampled steps go to the yielded list instead of otel-tunix's
    worker: what remains is the training thread's own cost (the hot path)."""
    runtime = _tracer.get_runtime()
    if runtime is None:
        raise RuntimeError("otel_tunix.configure() first")
    kept: list[object] = []
    submit = runtime.pipeline.submit
    runtime.pipeline.submit = kept.append  # type: ignore[method-assign]
    try:
        yield kept
    finally:
        runtime.pipeline.submit = submit  # type: ignore[method-assign]
