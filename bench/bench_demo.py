"""Overhead of otel-tunix on the demo training loop (``otel-tunix demo``), sampling_rate=1.

Runs the same loop with instrumentation off (``enabled=False``: the step/component calls are
no-ops) and on (every step sampled, local run folder written), interleaved, and prints the
median step-time ratio measured in this one run. Target (issue #2): < 1% added.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import otel_tunix
from otel_tunix.demo import DemoConfig, train


def one_run(cfg: DemoConfig, enabled: bool, tmp: Path) -> tuple[float, float]:
    """Wall seconds per step and process CPU seconds per step (all threads, shutdown
    included, so the worker's processing is counted)."""
    out = tmp / ("on" if enabled else "off")
    otel_tunix.configure(
        service_name="bench-demo",
        output_dir=out,
        perf=otel_tunix.PerformanceMetricsConfig(enabled=enabled, sampling_rate=1),
    )
    t, c = time.perf_counter(), time.process_time()
    train(cfg, run_dir=None)
    elapsed = time.perf_counter() - t
    otel_tunix.shutdown()
    cpu = time.process_time() - c
    return elapsed / cfg.steps, cpu / cfg.steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads (1 leaves a core free, as a GPU job's host mostly is)",
    )
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.torch_threads)
    print(f"torch threads: {torch.get_num_threads()}, hidden {args.hidden}, {args.steps} steps")
    cfg = DemoConfig(steps=args.steps, hidden=args.hidden, eval_every=0, checkpoint_every=0)
    off: list[float] = []
    on: list[float] = []
    cpu_off: list[float] = []
    cpu_on: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        one_run(cfg, True, Path(tmp))  # warm-up (imports, allocator)
        for _ in range(args.rounds):
            for enabled, wall, cpu in ((False, off, cpu_off), (True, on, cpu_on)):
                w, c = one_run(cfg, enabled, Path(tmp))
                wall.append(w)
                cpu.append(c)
    m_off, m_on = statistics.median(off), statistics.median(on)
    ratios = sorted(b / a for a, b in zip(off, on, strict=True))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(f"step time, instrumentation off: {m_off * 1e3:.3f} ms (median of {args.rounds})")
    print(f"step time, every step sampled:  {m_on * 1e3:.3f} ms")
    print(
        f"added by otel-tunix: {(statistics.median(ratios) - 1) * 100:+.2f}% median of paired "
        f"rounds (quartiles {(q[0] - 1) * 100:+.2f}% .. {(q[2] - 1) * 100:+.2f}%; target < 1%)"
    )
    extra_cpu = statistics.median(cpu_on) - statistics.median(cpu_off)
    print(
        f"process CPU per step: off {statistics.median(cpu_off) * 1e3:.3f} ms, on "
        f"{statistics.median(cpu_on) * 1e3:.3f} ms: otel-tunix uses {extra_cpu * 1e6:.0f} us "
        f"of CPU per step ({extra_cpu / m_off * 100:.2f}% of the step time)"
    )


if __name__ == "__main__":
    main()
