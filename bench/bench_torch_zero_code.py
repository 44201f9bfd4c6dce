"""What zero-code PyTorch costs a plain training loop: the module hooks that find the model's
forward, and a whole iteration with and without the instrumentor. CPU; one run, ratios.

Run: ``.venv/bin/python bench/bench_torch_zero_code.py``. Rows:

* a module call with the global forward hooks on (the first automatic step, while roots are
  found) against none: the slow path of ``Module._call_impl`` plus our two hooks, per call;
* one iteration (``zero_grad``, forward, backward, ``step``) of a loop fed from a plain
  iterator, under ``TorchInstrumentor`` once the hooks sit on the root only, against the same
  loop uninstrumented, and against the instrumentor without the forward hooks (the steps
  then open at ``backward``, as before issue #27): what the forward span adds.

Rows are measured in rounds (each round measures every row once; a row's value is its median
over the rounds), so a burst of load on a shared machine lands on all rows alike.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

import otel_tunix
from otel_tunix.instrumentation import torch as ott
from otel_tunix.instrumentation._torch_forward import RootForward


def _model(layers: int, width: int) -> Any:
    torch.manual_seed(0)
    mods: list[Any] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods, torch.nn.Linear(width, 1))


def module_call_us(model: Any, x: Any, reps: int) -> float:
    """Microseconds per module call of a no-grad forward (every submodule is one call)."""
    calls = sum(1 for _ in model.modules())
    with torch.no_grad():
        model(x)
        t0 = time.perf_counter_ns()
        for _ in range(reps):
            model(x)
        return (time.perf_counter_ns() - t0) / reps / calls / 1e3


def iteration_ms(model: Any, opt: Any, batches: list[tuple[Any, Any]]) -> float:
    """Milliseconds per iteration of a plain-iterator loop."""
    t0 = time.perf_counter_ns()
    for x, y in iter(batches):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return (time.perf_counter_ns() - t0) / len(batches) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=24, help="Linear+ReLU pairs (24)")
    ap.add_argument("--width", type=int, default=64, help="layer width (64)")
    ap.add_argument("--iterations", type=int, default=200, help="iterations per round (200)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (5)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = _model(args.layers, args.width)
    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(8, args.width, generator=g), torch.randn(8, 1, generator=g))
        for _ in range(args.iterations)
    ]
    x = batches[0][0]
    rows: dict[str, list[float]] = {
        k: [] for k in ("bare", "hooked", "loop", "instrumented", "no_forward")
    }
    otel_tunix.configure(output_dir="none", system_metrics=False, alerts=False)
    instrumentor = ott.TorchInstrumentor()
    try:
        for _ in range(args.rounds):
            rows["bare"].append(module_call_us(model, x, 50))
            roots = RootForward(torch)  # the global hooks, as in the first automatic step
            rows["hooked"].append(module_call_us(model, x, 50))
            roots.remove()
            opt = torch.optim.SGD(model.parameters(), lr=1e-4)
            rows["loop"].append(iteration_ms(model, opt, batches))
            instrumentor.instrument()
            try:
                opt = torch.optim.SGD(model.parameters(), lr=1e-4)
                iteration_ms(model, opt, batches[:2])  # first step: roots found, narrowed
                rows["instrumented"].append(iteration_ms(model, opt, batches))
                forward = instrumentor._forward
                if forward is not None:  # as before issue #27: no forward span, no hooks
                    forward.remove()
                rows["no_forward"].append(iteration_ms(model, opt, batches))
            finally:
                instrumentor.uninstrument()
    finally:
        otel_tunix.shutdown()
    med = {k: statistics.median(v) for k, v in rows.items()}
    calls = sum(1 for _ in model.modules())
    print(f"model: {calls} modules per forward, CPU, {args.rounds} rounds (medians)")
    print(f"module call, no hooks                    {med['bare']:8.3f} us")
    print(f"module call, global hooks (first step)   {med['hooked']:8.3f} us")
    print(f"  added per module call                  {med['hooked'] - med['bare']:8.3f} us")
    print(f"iteration, uninstrumented                {med['loop']:8.3f} ms")
    print(f"iteration, TorchInstrumentor (narrowed)  {med['instrumented']:8.3f} ms")
    print(f"  ratio instrumented / uninstrumented    {med['instrumented'] / med['loop']:8.3f}")
    print(f"iteration, same without the forward span {med['no_forward']:8.3f} ms")
    fwd = (med["instrumented"] - med["no_forward"]) * 1e3
    print(f"  the forward span and its hooks         {fwd:8.3f} us per iteration")


if __name__ == "__main__":
    main()
