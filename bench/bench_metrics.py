"""Host cost of the metrics helpers on the training thread (one run, CPU).

Prints microseconds per call of: an alert evaluation for a name no rule watches, for a
threshold rule, for the step-time spike rule (median / MAD over 50 values); the
catalog-driven OTel backend; and ``rl.rl_metrics`` on a 64 x 512 token batch (numpy).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    n = args.calls
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
