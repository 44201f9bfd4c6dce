"""CUDA device timing of otel_tunix.instrumentation.torch, measured on a real GPU.

Prints a JSON object: the device time of a bf16 4096³ matmul (raw CUDA events, the
reference), the same matmul timed by ``device_component`` (span duration, host duration and
event-pair device duration), the host cost per timed component (with and without shared
boundary events) against a plain ``otel_tunix.component``, and the loop throughput of
instrumented against uninstrumented steps (no synchronize is added, so it must stay ~1.0).

    python bench/bench_torch_cuda.py          # needs a CUDA GPU
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import torch

import otel_tunix
from otel_tunix.instrumentation import torch as ott
from otel_tunix.settings import attributes as attr
from otel_tunix.testing import capture


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def raw_matmul_ms(a: Any, b: Any, reps: int = 50) -> float:
    """Device time of one matmul from a plain pair of CUDA events (the reference)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return _median(times)


def timed_matmuls(a: Any, b: Any, steps: int = 200) -> dict[str, float]:
    """One ``device_component`` around one matmul per step, GPU kept busy (no sync)."""
    durations: list[float] = []
    original = ott._record_attribute

    def capture_attrs(comp: Any) -> dict[str, Any]:
        d: dict[str, Any] = {}
        durations.append(d)  # type: ignore[arg-type]
        return d

    ott._record_attribute = capture_attrs  # collect tunix.device_duration_s per span
    try:
        with capture() as cap:
            for n in range(steps):
                with otel_tunix.step(n):
                    with ott.device_component("matmul"):
                        a @ b
            torch.cuda.synchronize()
            spans = [s for s in cap.spans() if s.name == "matmul"]
    finally:
        ott._record_attribute = original
    span_ms = [(s.end_time - s.start_time) * 1e-6 for s in spans]
    host_ms = [s.attributes[attr.HOST_DURATION] * 1e3 for s in spans]
    dev_ms = [d[ott.DEVICE_DURATION] * 1e3 for d in durations if ott.DEVICE_DURATION in d]  # type: ignore[operator]
    clock = ott._cuda_clock()
    return {
        "waiter_waits_total_so_far": clock.waits if clock else -1,
        "spans": len(spans),
        "device_end_spans": sum(1 for s in spans if s.attributes.get(attr.DEVICE_END)),
        "event_pair_device_ms_median": _median(dev_ms[10:]),
        "host_ms_median": _median(host_ms[10:]),
        "span_ms_median": _median(span_ms[10:]),
    }


def end_time_accuracy_us(a: Any, b: Any, reps: int = 30) -> dict[str, float]:
    """How close a span's device end is to the completion seen by a synchronize right after.

    Each step queues 20 matmuls in one component; the training thread then synchronizes
    (here only, to get a reference) and reads the clock: the device end must lie just before
    that reading. Reported: median and max of (reference - span end) in µs.
    """
    gaps = []
    with capture() as cap:
        to_perf = time.time_ns() - time.perf_counter_ns()
        refs = []
        for n in range(reps):
            with otel_tunix.step(n):
                with ott.device_component("matmuls"):
                    for _ in range(20):
                        a @ b
            torch.cuda.synchronize()
            refs.append(time.perf_counter_ns())
        spans = [s for s in cap.spans() if s.name == "matmuls"]
    for ref, span in zip(refs, spans, strict=True):
        gaps.append((ref - (span.end_time - to_perf)) / 1e3)
    return {"median_us": _median(gaps[5:]), "max_us": max(gaps[5:]), "min_us": min(gaps[5:])}


def host_cost_us(kind: str, n: int = 4000) -> float:
    """Host µs per component in sampled steps of 10 components, each around a tiny kernel."""
    x = torch.zeros(16, device="cuda")
    comps = {
        "none": None,
        "component": otel_tunix.component,
        "device_component": ott.device_component,
    }[kind]
    with capture():
        steps = n // 10
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for i in range(steps):
            with otel_tunix.step(i):
                for _ in range(10):
                    if comps is None:
                        x.add_(1)
                    else:
                        with comps("c"):
                            x.add_(1)
        t1 = time.perf_counter_ns()
        torch.cuda.synchronize()
    return (t1 - t0) / (steps * 10) / 1e3


def shared_vs_unshared_us(n: int = 2000) -> dict[str, float]:
    """Host µs per component: back-to-back (boundaries shared) vs separated by a launch."""
    x = torch.zeros(16, device="cuda")
    out = {}
    for label, gap in (("adjacent", False), ("separated", True)):
        with capture():
            clock_before = ott._cuda_clock()
            rec0 = clock_before.events_recorded if clock_before else 0
            t0 = time.perf_counter_ns()
            for i in range(n // 10):
                with otel_tunix.step(i):
                    for _ in range(10):
                        with ott.device_component("c"):
                            pass
                        if gap:
                            x.add_(1)
            t1 = time.perf_counter_ns()
            torch.cuda.synchronize()
            clock = ott._cuda_clock()
            events = (clock.events_recorded - rec0) if clock else 0
        per = (t1 - t0) / n / 1e3
        if gap:  # remove the launch itself
            t2 = time.perf_counter_ns()
            for _ in range(n):
                x.add_(1)
            torch.cuda.synchronize()
            per -= (time.perf_counter_ns() - t2) / n / 1e3
        out[f"{label}_us_per_component"] = per
        out[f"{label}_events_per_component"] = events / n
    return out


def call_costs_us(n: int = 2000) -> dict[str, float]:
    """Host µs of the CUDA calls a boundary makes (median of n), and of a tiny op launch."""
    c = torch._C
    dev = torch.cuda.current_device()
    stream = torch.cuda.current_stream()
    blocking = torch.cuda.Event(enable_timing=True, blocking=True)
    plain = torch.cuda.Event(enable_timing=True)
    x = torch.zeros(1, device="cuda")

    def each(fn: Any) -> float:
        times = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            fn()
            times.append(time.perf_counter_ns() - t0)
        torch.cuda.synchronize()
        return _median(times) / 1e3

    return {
        "_cuda_getCurrentStream": each(lambda: c._cuda_getCurrentStream(dev)),
        "torch.cuda.current_stream": each(torch.cuda.current_stream),
        "_cuda_isCurrentStreamCapturing": each(c._cuda_isCurrentStreamCapturing),
        "record_blocking_event_C": each(lambda: c._CudaEventBase.record(blocking, stream)),
        "record_event_C": each(lambda: c._CudaEventBase.record(plain, stream)),
        "Event.record_python": each(plain.record),
        "tiny_op_launch_x.add_": each(lambda: x.add_(1)),
    }


def host_cost_without_resolving_us(n: int = 4000) -> float:
    """Like host_cost_us('device_component') with the device-end resolution switched off."""
    original = ott._resolver

    def no_resolve(clock: Any, start: Any, end: Any, host_end: int, attrs: Any) -> Any:
        clock.release(start)
        clock.release(end)
        return lambda: None

    ott._resolver = no_resolve
    try:
        return host_cost_us("device_component", n)
    finally:
        ott._resolver = original


def loop_throughput(a: Any, b: Any, steps: int = 300) -> dict[str, float]:
    """Wall time of a loop of matmul steps, plain vs fully instrumented (3 components)."""

    def run(instrumented: bool) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for n in range(steps):
            if instrumented:
                with otel_tunix.step(n):
                    with ott.device_component("forward"):
                        a @ b
                    with ott.device_component("backward"):
                        a @ b
                        a @ b
                    with ott.device_component("optimizer_step"):
                        a @ b
            else:
                a @ b
                a @ b
                a @ b
                a @ b
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    run(False)
    plain = min(run(False) for _ in range(3))
    with capture():
        run(True)
        inst = min(run(True) for _ in range(3))
    return {"plain_s": plain, "instrumented_s": inst, "ratio": inst / plain}


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    ref = raw_matmul_ms(a, b)
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "raw_event_pair_matmul_ms": ref,
        "matmul_tflops": 2 * 4096**3 / (ref * 1e-3) / 1e12,
        "device_component_matmul": timed_matmuls(a, b),
        "device_end_before_reference_sync": end_time_accuracy_us(a, b),
        "host_us_per_component": {
            k: host_cost_us(k) for k in ("none", "component", "device_component")
        },
        "host_us_device_component_without_resolving": host_cost_without_resolving_us(),
        "boundary_sharing": shared_vs_unshared_us(),
        "call_costs_us": call_costs_us(),
        "loop": loop_throughput(a, b),
    }
    h = result["host_us_per_component"]
    h["device_component_extra_over_component"] = h["device_component"] - h["component"]
    clock = ott._cuda_clock()
    if clock is not None:
        result["clock"] = {
            "sharing_window_ns": clock.window_ns,
            "events_created": clock.events_created,
            "events_recorded": clock.events_recorded,
            "waits": clock.waits,
        }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
