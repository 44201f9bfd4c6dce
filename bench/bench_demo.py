"""Overhead of otel-tunix on the demo training loop (``otel-tunix demo``), sampling_rate=1.

Target (issue #2): instrumentation adds less than 1% to step time. Measured two ways, in one
run, with torch on one intra-op thread (the other core is left to the data prefetcher and
otel-tunix's threads, as a GPU job's host mostly is):

1. **What otel-tunix costs per step, measured directly** (the stable number): the CPU time
   of otel-tunix's own threads (span worker, device waiter, exporters) over the training
   loop, read from their thread CPU clocks, plus the training thread's hot-path cost of the
   demo's step (one step with five components, two nested) timed in a tight loop with the
   finished steps set aside. Divided by the median step time with instrumentation off.
   Start-up and shutdown (writing ``trace.pftrace``, the summary) are once per run and
   reported apart.
2. **The wall-clock difference, interleaved**: one demo run, instrumentation switched off
   and on in alternating blocks of steps (off: no runtime, so step/component calls are
   no-ops, as with ``enabled=False``; on: every step sampled, the default local run
   folder). Each "on" block ends with ``force_flush()``, so the processing of its steps is
   charged to it even though it would normally overlap the next steps: an upper bound.
   Adjacent blocks see the same machine state, which cancels most of this shared VM's
   drift; the median of the paired on/off block ratios is reported with its quartiles.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import otel_tunix
from otel_tunix.demos.sft import DemoConfig, train
from otel_tunix.recording import hot_path as _recording
from otel_tunix.testing import steps_set_aside


def _otel_threads_cpu() -> float:
    """CPU seconds used so far by otel-tunix's live threads (``otel-tunix-*``)."""
    total = 0.0
    for t in threading.enumerate():
        if t.name.startswith("otel-tunix") and t.ident is not None:
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except OSError:  # the thread ended meanwhile
                pass
    return total


class _Run:
    """One demo run: per-step wall times, otel-tunix threads' CPU during the loop, and
    start-up / shutdown time."""

    def __init__(self, cfg: DemoConfig, enabled: bool, out: Path) -> None:
        t0 = time.perf_counter()
        otel_tunix.configure(
            service_name="bench-demo",
            output_dir=out,
            perf=otel_tunix.PerformanceMetricsConfig(enabled=enabled, sampling_rate=1),
        )
        self.setup_sec = time.perf_counter() - t0
        self.step_sec: list[float] = []
        last = [time.perf_counter()]

        def tick(n: int, loss: float) -> None:
            now = time.perf_counter()
            self.step_sec.append(now - last[0])
            last[0] = now

        cpu0 = _otel_threads_cpu()
        last[0] = time.perf_counter()
        train(cfg, run_dir=None, progress=tick)
        otel_tunix.force_flush()  # the steps of the loop, processed: their cost is counted
        self.otel_cpu_per_step = (_otel_threads_cpu() - cpu0) / cfg.steps
        t1 = time.perf_counter()
        otel_tunix.shutdown()
        self.shutdown_sec = time.perf_counter() - t1

    @property
    def median_step(self) -> float:
        return statistics.median(self.step_sec[5:] or self.step_sec)  # skip warm-up steps


def hot_path_per_step(steps: int = 3000) -> float:
    """Training-thread seconds of the demo's step structure (a step with five components,
    two of them nested), with the finished steps set aside instead of processed: the cost
    the loop itself pays."""
    otel_tunix.configure(output_dir="none", perf=otel_tunix.PerformanceMetricsConfig())
    step, component = otel_tunix.step, otel_tunix.component
    best = float("inf")
    try:
        with steps_set_aside() as kept:
            for _ in range(5):
                kept.clear()
                t = time.perf_counter()
                for n in range(steps):
                    with step(n):
                        with component("train_data_load", blocked=True):
                            pass
                        with component("train_step_compute"):
                            with component("forward"):
                                pass
                            with component("backward"):
                                pass
                            with component("optimizer_step"):
                                pass
                best = min(best, (time.perf_counter() - t) / steps)
    finally:
        otel_tunix.shutdown()
    return best


def interleaved(cfg: DemoConfig, out: Path, block: int) -> list[float]:
    """On/off block-time ratios of one run with instrumentation toggled every ``block``
    steps (see the module docstring)."""
    otel_tunix.configure(
        service_name="bench-demo",
        output_dir=out,
        perf=otel_tunix.PerformanceMetricsConfig(sampling_rate=1),
    )
    runtime = _recording.get_runtime()
    times: dict[bool, list[float]] = {True: [], False: []}
    state = {"on": False, "t": time.perf_counter()}
    _recording.set_runtime(None)

    def tick(n: int, loss: float) -> None:
        if n % block:
            return
        if state["on"]:
            otel_tunix.force_flush()  # this block's processing is charged to it
        now = time.perf_counter()
        times[bool(state["on"])].append(now - state["t"])
        state["on"] = not state["on"]
        _recording.set_runtime(runtime if state["on"] else None)
        state["t"] = time.perf_counter()

    try:
        train(cfg, run_dir=None, progress=tick)
    finally:
        _recording.set_runtime(runtime)
        otel_tunix.shutdown()
    pairs = zip(times[False][1:], times[True][1:], strict=False)  # the first: warm-up
    return [on / off for off, on in pairs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=100, help="steps per run (measurement 1)")
    ap.add_argument("--rounds", type=int, default=7, help="runs on and off (measurement 1)")
    ap.add_argument("--block", type=int, default=20, help="steps per block (measurement 2)")
    ap.add_argument("--blocks", type=int, default=100, help="block pairs (measurement 2)")
    ap.add_argument("--d-model", type=int, default=64, help="width of the demo's tiny LM")
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads (1 leaves a core free, as a GPU job's host mostly is)",
    )
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.torch_threads)
    print(f"torch threads: {torch.get_num_threads()}, d_model {args.d_model}")
    cfg = DemoConfig(steps=args.steps, d_model=args.d_model, eval_every=0, checkpoint_every=0)
    off: list[_Run] = []
    on: list[_Run] = []
    with tempfile.TemporaryDirectory() as tmp:
        _Run(cfg, True, Path(tmp) / "warm-up")  # imports, allocator
        for i in range(args.rounds):
            off.append(_Run(cfg, False, Path(tmp) / f"off{i}"))
            on.append(_Run(cfg, True, Path(tmp) / f"on{i}"))
        long = DemoConfig(
            steps=args.block * (2 * args.blocks + 2),
            d_model=args.d_model,
            eval_every=0,
            checkpoint_every=0,
        )
        ratios = sorted(interleaved(long, Path(tmp) / "blocks", args.block))
    hot = hot_path_per_step()

    m_off = statistics.median(r.median_step for r in off)
    worker = statistics.median(r.otel_cpu_per_step for r in on)
    direct = hot + worker
    print(f"median step time, instrumentation off: {m_off * 1e3:.3f} ms")
    print()
    print("1. measured cost per step (every step sampled, 5 components):")
    print(f"   training thread, hot path:        {hot * 1e6:7.1f} us")
    print(f"   otel-tunix threads (CPU):          {worker * 1e6:7.1f} us")
    print(
        f"   total:                             {direct * 1e6:7.1f} us = "
        f"{direct / m_off * 100:.2f}% of the step (target < 1%)"
    )
    setup = statistics.median(r.setup_sec for r in on)
    down = statistics.median(r.shutdown_sec for r in on)
    print(f"   once per run: configure {setup * 1e3:.1f} ms, shutdown {down * 1e3:.1f} ms")
    print()
    lo, hi = median_ci(ratios)
    print(
        f"2. wall clock, interleaved blocks of {args.block} steps, processing charged to its "
        f"block: {(statistics.median(ratios) - 1) * 100:+.2f}% median of {len(ratios)} "
        f"pairs (95% CI {(lo - 1) * 100:+.2f}% .. {(hi - 1) * 100:+.2f}%; target < 1%)"
    )


def median_ci(values: list[float]) -> tuple[float, float]:
    """Distribution-free 95% confidence interval of the median (binomial order statistics:
    ranks n/2 -+ 0.98 sqrt(n))."""
    v = sorted(values)
    n = len(v)
    k = max(0, int(n / 2 - 0.98 * n**0.5))
    return v[k], v[min(n - 1, n - 1 - k)]


if __name__ == "__main__":
    main()
