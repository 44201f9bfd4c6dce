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


def one_run(cfg: DemoConfig, enabled: bool, tmp: Path) -> float:
    out = tmp / ("on" if enabled else "off")
    otel_tunix.configure(
        service_name="bench-demo",
        output_dir=out,
        perf=otel_tunix.PerformanceMetricsConfig(enabled=enabled, sampling_rate=1),
    )
    t = time.perf_counter()
    train(cfg, run_dir=None)
    elapsed = time.perf_counter() - t
    otel_tunix.shutdown()
    return elapsed / cfg.steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=1024)
    args = ap.parse_args()
    cfg = DemoConfig(steps=args.steps, hidden=args.hidden, eval_every=0, checkpoint_every=0)
    off: list[float] = []
    on: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        one_run(cfg, True, Path(tmp))  # warm-up (imports, allocator)
        for _ in range(args.rounds):
            off.append(one_run(cfg, False, Path(tmp)))
            on.append(one_run(cfg, True, Path(tmp)))
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(f"step time, instrumentation off: {m_off * 1e3:.3f} ms (median of {args.rounds})")
    print(f"step time, every step sampled:  {m_on * 1e3:.3f} ms")
    print(f"added by otel-tunix: {(m_on / m_off - 1) * 100:+.2f}%  (target < 1%)")


if __name__ == "__main__":
    main()
