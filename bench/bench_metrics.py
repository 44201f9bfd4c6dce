"""Host cost of the metrics helpers on the training thread (one run, CPU).

Prints microseconds per call of: ``otel_tunix.log()`` of a 10-key dict in a configured run
(the default run folder: ``metrics.jsonl``, the OTel gauges, the summary counts, the alert
rules), as the training thread's CPU time: ten floats no rule watches, the same as numpy
float32s, and with ``loss`` among them (which the alert engine evaluates on the caller's
thread); the backends' work that the logger's thread does for it, and what it cost when it
ran on the caller's thread; the ratio to the budget (<= 5 us, issue #35). Then an alert
evaluation for a name no rule watches, for a threshold rule, for the step-time spike rule
(median / MAD over 50 values); the catalog-driven OTel backend; and ``rl.rl_metrics`` on a
64 x 512 token batch (numpy).

Run: ``.venv/bin/python bench/bench_metrics.py`` (``--calls``, ``--rounds``; ``--log-only``).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from opentelemetry.sdk.metrics import MeterProvider

from otel_tunix.logger.instruments import CatalogOTelBackend
from otel_tunix.metrics import rl
from otel_tunix.metrics.alerts import AlertEngine


def per_call_us(fn: Callable[[int], object], n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t) / n * 1e6


LOG_BUDGET_US = 5.0
"""``log()`` of a 10-key dict on the training thread (issue #35)."""


def log_rows(calls: int, rounds: int) -> dict[str, tuple[float, float, float]]:
    """``otel_tunix.log()`` in a configured run: per row, the median and min-max over the
    rounds of µs a call. Each round logs ``calls`` dicts (fewer than the logger's queue
    holds, so nothing is dropped), then flushes outside the measurement."""
    import otel_tunix

    os.environ.setdefault("OTEL_TUNIX_QUIET", "true")
    otel_tunix.configure(output_dir=tempfile.mkdtemp(prefix="bench-metrics-"), system_metrics=False)
    logger = otel_tunix.get_metrics_logger()
    floats = {f"train/metric_{i}": 0.5 + i for i in range(10)}
    numpy = {k: np.float32(v) for k, v in floats.items()}
    with_loss = {"loss": 0.25, **dict(list(floats.items())[1:])}  # a name a rule watches
    cases: dict[str, Mapping[str, Any]] = {
        "floats": floats,
        "numpy float32": numpy,
        "with loss": with_loss,
    }
    caller: dict[str, list[float]] = {k: [] for k in cases}
    behind: list[float] = []
    inline: list[float] = []
    step = 0
    for r in range(rounds + 1):  # the first round warms up
        for case, values in cases.items():
            gc.collect()
            p0, t0 = time.process_time(), time.thread_time()
            for _ in range(calls):
                otel_tunix.log(values, step=step)
                step += 1
            t1 = time.thread_time()
            logger.flush()
            p1 = time.process_time()
            if r:
                caller[case].append((t1 - t0) / calls * 1e6)
                if case == "floats":  # the logger's thread (and the rest of the process)
                    behind.append(((p1 - p0) - (t1 - t0)) / calls * 1e6)
        # what the backends' work cost the caller when it ran on the caller's thread
        rows = [((step + i, floats),) for i in range(calls)]
        t0 = time.thread_time()
        for row in rows:
            logger._deliver(logger.backends, row, {})
        if r:
            inline.append((time.thread_time() - t0) / calls * 1e6)
    otel_tunix.shutdown()

    def stat(xs: list[float]) -> tuple[float, float, float]:
        return statistics.median(xs), min(xs), max(xs)

    return {
        "log() 10 floats, training thread": stat(caller["floats"]),
        "log() 10 numpy float32, training thread": stat(caller["numpy float32"]),
        "log() 10 floats, one is loss (an alert rule's)": stat(caller["with loss"]),
        "  the backends' work, on the logger's thread": stat(behind),
        "  the backends' work, called inline (as before)": stat(inline),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=7, help="rounds of the log() rows")
    ap.add_argument("--log-only", action="store_true", help="only the log() rows")
    args = ap.parse_args()
    n = args.calls
    logged = log_rows(min(n, 4000), args.rounds)
    print(f"median of {args.rounds} rounds (min - max), CPU us/call")
    for name, (med, lo, hi) in logged.items():
        print(f"{name:48s} {med:7.2f}  ({lo:.2f} - {hi:.2f})")
    med = logged["log() 10 floats, training thread"][0]
    print(f"log() / budget ({LOG_BUDGET_US:g} us) = {med / LOG_BUDGET_US:.2f}  (target <= 1)")
    if args.log_only:
        return
    print()
    engine = AlertEngine(datadog=False, console=False)
    backend = CatalogOTelBackend(MeterProvider())
    batch = np.random.default_rng(0).normal(size=(64, 512))
    mask = np.ones((64, 512), dtype=bool)
    rows = {
        "alert engine, unwatched name": per_call_us(
            lambda i: engine.observe("eval/accuracy", 0.5, i), n
        ),
        "alert engine, kl threshold rule": per_call_us(lambda i: engine.observe("kl", 0.01, i), n),
        "alert engine, step-time spike rule": per_call_us(
            lambda i: engine.observe("step_time_sec", 0.1 + 1e-4 * (i % 7), i), n // 4
        ),
        "CatalogOTelBackend gauge": per_call_us(
            lambda i: backend.log_scalar("rewards/mean", 0.5, step=i), n
        ),
        "rl.rl_metrics 64x512 (numpy)": per_call_us(
            lambda i: rl.rl_metrics(
                rewards=batch[:, 0],
                advantages=batch,
                returns=batch,
                values=batch,
                mask=mask,
                completion_mask=mask,
            ),
            max(1, n // 100),
        ),
    }
    for name, us in rows.items():
        print(f"{name:40s} {us:10.2f} us/call")


if __name__ == "__main__":
    main()
