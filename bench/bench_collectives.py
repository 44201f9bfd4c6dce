"""What the torch integration adds to a ``torch.distributed`` collective, on CPU.

Prints a JSON object: the time of a call of a collective wrapped by the integration (with a
no-op in place of the collective, so only the wrapper is timed) outside any step, in a step
that is not sampled and in a sampled one (where it records a blocked component), against a
plain call of the no-op; and the time of a real gloo ``all_reduce`` of 4 floats in a
one-process group, unwrapped, for scale. Best of five runs each.

    python bench/bench_collectives.py
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import otel_tunix
from otel_tunix.instrumentation._torch_collectives import _collectives, _is_compiling


def _best_ns(fn: Callable[[], Any], n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e9)
    return best


def main() -> None:
    def noop(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> None:
        return None

    wrapped = _collectives._wrap("all_reduce", noop, _is_compiling(torch))
    t = torch.ones(4)
    otel_tunix.configure(
        output_dir="none", perf=otel_tunix.PerformanceMetricsConfig(sampling_rate=10**9)
    )
    out: dict[str, float] = {"plain_call_ns": _best_ns(lambda: noop(t), 100_000)}
    out["wrapped_outside_a_step_ns"] = _best_ns(lambda: wrapped(t), 100_000)
    with otel_tunix.step(1):
        out["wrapped_in_an_unsampled_step_ns"] = _best_ns(lambda: wrapped(t), 100_000)
    with otel_tunix.step(0):
        out["wrapped_in_a_sampled_step_ns"] = _best_ns(lambda: wrapped(t), 2_000)
    otel_tunix.shutdown()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    out["gloo_all_reduce_one_process_ns"] = _best_ns(lambda: dist.all_reduce(t), 5_000)
    dist.destroy_process_group()
    out["unsampled_overhead_vs_all_reduce"] = (
        out["wrapped_in_an_unsampled_step_ns"] - out["plain_call_ns"]
    ) / out["gloo_all_reduce_one_process_ns"]
    print(json.dumps({k: round(v, 4) for k, v in out.items()}, indent=1))


if __name__ == "__main__":
    main()
