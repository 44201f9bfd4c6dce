"""torch.distributed collectives as blocked components (one gloo process: the recording,
not the waiting, is under test here; tests/test_stragglers.py runs three ranks)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import otel_tunix  # noqa: E402
from otel_tunix.instrumentation import torch as ott  # noqa: E402
from otel_tunix.testing import capture  # noqa: E402


@pytest.fixture
def group(tmp_path: Path) -> Iterator[None]:
    if not dist.is_available():
        pytest.skip("torch without distributed")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)  # fmt: skip
    ott.instrument_collectives()
    try:
        yield
    finally:
        ott.uninstrument_collectives()
        dist.destroy_process_group()


def _components(cap: Any) -> list[tuple[int, str, bool]]:
    return [
        (s.step, name, t[1] > 0 and t[0] == 0)
        for s in cap.summaries
        for name, t in s.component_times.items()
    ]


def test_blocking_and_async_collectives_are_blocked_components(group: None) -> None:
    t = torch.ones(4)
    with capture(perf=otel_tunix.PerformanceMetricsConfig(sampling_rate=2)) as cap:
        for n in range(3):
            with otel_tunix.step(n):
                t0 = time.perf_counter_ns()
                dist.all_reduce(t)
                took = time.perf_counter_ns() - t0
                dist.barrier()
                out = [torch.zeros(4)]
                work = dist.all_gather(out, t, async_op=True)
                work.wait()
        cap.flush()
        comps = _components(cap)
    # sampled steps 0 and 2 only; each collective once, blocked, nothing nested inside
    # (a blocking call waits on its own work: that wait is part of it)
    assert comps == [
        (n, name, True) for n in (0, 2) for name in ("all_reduce", "barrier", "all_gather_wait")
    ]
    last = cap.summaries[-1]
    assert 0 < last.component_times["all_reduce"][1] <= took / 1e9
    assert last.blocked_time_sec > 0 and last.busy_time_sec == 0


def test_uninstrument_puts_the_originals_back(group: None) -> None:
    assert hasattr(dist.all_reduce, "__otel_tunix_original__")
    ott.instrument_collectives()
    ott.uninstrument_collectives()
    assert hasattr(dist.all_reduce, "__otel_tunix_original__")  # one user left
    ott.uninstrument_collectives()
    assert not hasattr(dist.all_reduce, "__otel_tunix_original__")
    assert not hasattr(dist.Work.wait, "__otel_tunix_original__")
    ott.instrument_collectives()  # for the fixture's release
