"""Weight syncs per learner step (``otel_tunix.rl.weight_sync``): count, duration and bytes
against the test's own bookkeeping, and the alert when a step syncs more than once."""

from __future__ import annotations

import time
from typing import Any

import pytest
from run_files import read_jsonl

import otel_tunix
from otel_tunix import rl
from otel_tunix.testing import capture

LEARNER = "rl/learner"


def test_weight_syncs_are_counted_timed_and_sized_per_learner_step(local_run: Any) -> None:
    syncs = [[100], [200], [300, 50], [400]]  # bytes of each sync, per learner step
    run = local_run()
    timed: list[tuple[float, float]] = []  # each sync's window, by the test's clock
    for m, sizes in enumerate(syncs):
        with otel_tunix.step(m, scope=LEARNER):
            for nbytes in sizes:
                before = time.perf_counter()
                with rl.weight_sync(nbytes=nbytes):
                    time.sleep(0.002)
                timed.append((before, time.perf_counter()))
    otel_tunix.shutdown()
    steps = {r["step"]: r for r in run.steps()}
    for m, sizes in enumerate(syncs):
        a = steps[m]["attributes"]
        assert a["tunix.rl.weight_sync.count"] == len(sizes)
        assert a["tunix.rl.weight_sync.bytes"] == sum(sizes)
        comp = steps[m]["components"]["weight_sync"]
        assert comp["count"] == len(sizes)
    logged = [
        (r["step"], r["metrics"]["rl/weight_syncs_per_step"])
        for r in run.metrics()
        if "rl/weight_syncs_per_step" in r.get("metrics", {})
    ]
    assert logged == [(0, 1.0), (1, 1.0), (2, 1.0), (2, 2.0), (3, 1.0)]
    # the syncs' spans lie in the test's windows, and the ledger counts them as weight_sync
    spans = [s for m in sorted(steps) for s in steps[m]["spans"] if s["name"] == "weight_sync"]
    assert len(spans) == len(timed) == 5
    for s, (before, after) in zip(spans, timed, strict=True):
        assert 0.002 <= (s["end_ns"] - s["start_ns"]) / 1e9 <= after - before
    synced = sum(r["components"]["weight_sync"]["busy_time_sec"] for r in steps.values())
    assert run.summary()["goodput"]["badput_sec"]["weight_sync"] == pytest.approx(synced)
    # the alert: step 2 synced twice, step 3 once again
    alerts = [
        (a["tunix.alert.severity"], a["tunix.alert.step"])
        for a in read_jsonl(run.path / "alerts.jsonl")
        if a["tunix.alert.rule"] == "weight_sync_repeated"
    ]
    assert alerts == [("warning", 2), ("ok", 3)]


def test_weight_sync_instruments_count_every_sync_sampled_or_not() -> None:
    sizes = [10, 20, 30, 40, 50, 60]
    with capture(perf=otel_tunix.PerformanceMetricsConfig(sampling_rate=2)) as cap:
        longest = 0.0
        for m, nbytes in enumerate(sizes):
            with otel_tunix.step(m, scope=LEARNER):
                before = time.perf_counter()
                with rl.weight_sync() as sync:
                    sync.set_bytes(nbytes)
                longest = max(longest, time.perf_counter() - before)
        metrics = cap.metrics()
    (count,) = metrics["tunix.rl.weight_sync.count"]
    assert count.value == len(sizes)
    (size,) = metrics["tunix.rl.weight_sync.bytes"]
    assert size.count == len(sizes) and size.sum == sum(sizes)
    assert size.min == min(sizes) and size.max == max(sizes)
    (duration,) = metrics["tunix.rl.weight_sync.duration"]
    assert duration.count == len(sizes) and 0 < duration.max <= longest
