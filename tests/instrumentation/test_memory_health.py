"""Memory health per step (issue #39 item 6): torch's CUDA allocator retries and OOMs per
step, as OTel counters, MetricsLogger scalars and step-span attributes, and the
``alloc_retries_growing`` alert that asks for a profile capture.

No GPU here: the arithmetic and the publishing are fed dicts shaped like
``torch.cuda.memory_stats()``'s output (the function's input, not a mock of torch); the
reading itself is checked on CUDA only (and by ``bench/gpu_memory_check.py`` on a lent GPU).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from run_files import RunFolder, read_jsonl

import otel_tunix
from otel_tunix.instrumentation import _torch_device
from otel_tunix.settings import attributes as attr
from otel_tunix.testing import capture

torch = pytest.importorskip("torch")
from otel_tunix.instrumentation import torch as ott  # noqa: E402

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _allocator(retries: int, ooms: int = 0) -> dict[str, Any]:
    """A ``torch.cuda.memory_stats()`` dict (its flat key style) with these totals."""
    return {
        "active.all.current": 12,
        "allocated_bytes.all.current": 4096,
        "allocated_bytes.all.peak": 8192,
        "reserved_bytes.all.current": 2 << 20,
        "num_alloc_retries": retries,
        "num_ooms": ooms,
        "num_sync_all_streams": 0,
    }


@pytest.fixture(autouse=True)
def fresh_devices() -> None:
    """Each test starts with no previous reading of any device."""
    _torch_device._allocator_last.clear()


def test_allocator_step_counts_what_grew_since_the_last_reading() -> None:
    totals = [(0, 0), (0, 0), (3, 0), (5, 1), (5, 1), (0, 0), (2, 0)]  # the 6th: counters reset
    expected = [(0, 0), (0, 0), (3, 0), (2, 1), (0, 0), (0, 0), (2, 0)]
    last = None
    got = []
    for retries, ooms in totals:
        last = ott.allocator_step(_allocator(retries, ooms), last)
        got.append((last.alloc_retries, last.ooms))
        assert (last.total_alloc_retries, last.total_ooms) == (retries, ooms)
        assert last.retries_growing == (last.alloc_retries > 0)
    assert got == expected
    # the first reading counts everything since the process started; a missing key reads 0
    first = ott.allocator_step(_allocator(7, 2), None)
    assert (first.alloc_retries, first.ooms) == (7, 2)
    assert ott.allocator_step({}, first) == ott.AllocatorStep(0, 0, 0, 0)


def test_growing_retries_mark_the_steps_and_raise_one_alert_that_captures_a_profile(
    local_run: Callable[..., RunFolder], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TUNIX_PROFILER", "torch")
    monkeypatch.setenv("OTEL_TUNIX_PROFILE_STEPS", "2")
    totals = [0, 0, 0, 4, 9, 9, 9, 9, 9, 9]  # retries grow in steps 3 and 4
    ooms = [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]  # one OOM in step 4
    run = local_run()
    a = torch.randn(32, 32)
    for n, (retries, oom) in enumerate(zip(totals, ooms, strict=True)):
        with otel_tunix.step(n):
            (a @ a).sum().item()
            stats = {"allocated": 1000.0 + n, "reserved": 4096.0, "peak_allocated": 2000.0 + n}
            out = ott.publish_step_memory(stats, _allocator(retries, oom), device="cuda:0")
            assert out["alloc_retries"] == (retries - totals[n - 1] if n else retries)
    otel_tunix.shutdown()

    steps = {s["step"]: s["attributes"] for s in run.steps()}
    for n in range(len(totals)):
        grew = totals[n] - totals[n - 1] if n else totals[n]
        assert steps[n][attr.MEMORY_ALLOC_RETRIES] == grew
        assert steps[n][attr.MEMORY_OOMS] == (ooms[n] - ooms[n - 1] if n else ooms[n])
        assert steps[n][attr.MEMORY_PEAK_ALLOCATED] == 2000 + n
        assert steps[n][attr.MEMORY_RESERVED] == 4096
    logged = [
        (r["step"], r["metrics"]["memory/alloc_retries"])
        for r in run.metrics()
        if "memory/alloc_retries" in r.get("metrics", {})
    ]
    assert logged == [(0, 0.0), (1, 0.0), (2, 0.0), (3, 4.0), (4, 5.0)] + [
        (n, 0.0) for n in range(5, 10)
    ]

    alerts = [
        (a["tunix.alert.severity"], a["tunix.alert.step"])
        for a in read_jsonl(run.path / "alerts.jsonl")
        if a["tunix.alert.rule"] == "alloc_retries_growing"
    ]
    assert alerts == [("warning", 3), ("ok", 5)]  # one episode: steps 3 and 4
    (cap,) = run.summary()["profiles"]["captures"]
    assert cap["reason"]["rule"] == "alloc_retries_growing" and cap["reason"]["step"] == 3
    assert cap["status"] == "written" and cap["steps"] == [4, 5]
    assert (run.path / cap["path"]).is_file()
    assert steps[4][attr.PROFILE_PATH] == cap["path"]


def test_counters_add_each_steps_retries_and_ooms_per_device() -> None:
    readings = {"cuda:0": [1, 1, 6], "cuda:1": [0, 2, 2]}  # num_alloc_retries, per step
    with capture() as cap:
        for n in range(3):
            with otel_tunix.step(n):
                for device, totals in readings.items():
                    ott.publish_step_memory(
                        {"allocated": 1.0}, _allocator(totals[n], ooms=n), device=device
                    )
        metrics = cap.metrics()
    retries = {dict(p.attributes)["device"]: p.value for p in metrics["tunix.memory.alloc_retries"]}
    assert retries == {"cuda:0": 6, "cuda:1": 2}
    (scope,) = {dict(p.attributes)[attr.METRIC_SCOPE] for p in metrics["tunix.memory.ooms"]}
    assert scope == "train"
    assert {dict(p.attributes)["device"]: p.value for p in metrics["tunix.memory.ooms"]} == {
        "cuda:0": 2,
        "cuda:1": 2,
    }


def test_without_cuda_nothing_is_read_or_published() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("CUDA is in use in this process")
    with capture() as cap:
        with otel_tunix.step(0):
            assert ott.record_memory_stats() == {}
        metrics = cap.metrics()
        spans = cap.spans()
    assert not any(name.startswith("tunix.memory.") for name in metrics)
    assert not any(k.startswith("tunix.memory.") for s in spans for k in s.attributes or {})


@requires_cuda
def test_cuda_steps_carry_their_allocator_counts() -> None:
    with capture() as cap:
        for n in range(2):
            with otel_tunix.step(n):
                x = torch.randn(256, 256, device="cuda")
                (x @ x).sum().item()
                out = ott.record_memory_stats()
        spans = [s for s in cap.spans() if s.name == "train_step"]
    before = torch.cuda.memory_stats()
    assert out["alloc_retries"] == 0 and before["num_alloc_retries"] >= 0
    for s in spans:
        assert s.attributes[attr.MEMORY_PEAK_ALLOCATED] > 0
        assert attr.MEMORY_ALLOC_RETRIES in s.attributes


# --- out-of-memory errors -------------------------------------------------------------------
def _oom() -> BaseException:
    return torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_an_oom_marks_its_step_and_without_cuda_keeps_no_snapshot_said_once(
    local_run: Callable[..., RunFolder], caplog: pytest.LogCaptureFixture
) -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("CUDA is in use in this process")
    raised: dict[int, str] = {}  # step -> what the loop raised in it (its own bookkeeping)
    run = local_run()
    for n in range(6):
        try:
            with otel_tunix.step(n):
                with otel_tunix.component("forward"):
                    if n == 1:  # out of a component, caught in the step (a skipped batch)
                        raised[n] = "oom"
                        try:
                            with otel_tunix.component("backward"):
                                raise _oom()
                        except torch.cuda.OutOfMemoryError:
                            pass
                    if n == 3:  # out of a component and the step
                        raised[n] = "oom"
                        raise _oom()
                    if n == 4:
                        raised[n] = "value"
                        raise ValueError("not memory")
        except (torch.cuda.OutOfMemoryError, ValueError):
            pass
    otel_tunix.shutdown()

    steps = {s["step"]: s["attributes"] for s in run.steps()}
    oom_steps = sorted(n for n, what in raised.items() if what == "oom")
    assert sorted(n for n, a in steps.items() if a.get(attr.MEMORY_OOM)) == oom_steps
    assert not any(attr.PROFILE_PATH in a for a in steps.values())
    assert run.summary()["memory_snapshots"] == {
        "oom_steps": len(oom_steps),
        "snapshots": [],
        "skipped": {"no_cuda": len(oom_steps)},
    }
    said = [r for r in caplog.records if "no memory snapshot" in r.getMessage()]
    assert len(said) == 1
    assert not (run.path / "profiles").exists()


def test_an_oom_outside_any_torch_program_is_not_ours() -> None:
    from otel_tunix.metrics.memory_snapshots import is_out_of_memory

    assert is_out_of_memory(_oom())
    assert not is_out_of_memory(MemoryError("host memory"))
    assert not is_out_of_memory(RuntimeError("CUDA out of memory"))  # not torch's class


@requires_cuda
def test_cuda_oom_keeps_a_snapshot_linked_from_the_step(
    local_run: Callable[..., RunFolder],
) -> None:
    import pickle

    torch.cuda.memory._record_memory_history(max_entries=10_000)
    try:
        run = local_run()
        keep = torch.empty(1 << 20, device="cuda")
        free, _ = torch.cuda.mem_get_info()
        for n in range(2):
            try:
                with otel_tunix.step(n), otel_tunix.component("forward"):
                    if n == 1:
                        torch.empty(free * 4, dtype=torch.uint8, device="cuda")
            except torch.cuda.OutOfMemoryError:
                pass
        otel_tunix.shutdown()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    del keep
    steps = {s["step"]: s["attributes"] for s in run.steps()}
    assert steps[1][attr.MEMORY_OOM] is True and attr.MEMORY_OOM not in steps[0]
    (snap,) = run.summary()["memory_snapshots"]["snapshots"]
    assert steps[1][attr.PROFILE_PATH] == snap["path"] and snap["step"] == 1
    with open(run.path / snap["path"], "rb") as f:
        data = pickle.load(f)
    assert data["segments"] and "device_traces" in data
