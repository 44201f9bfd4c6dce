"""The live goodput ledger's share of otel-tunix's worker thread.

The ledger (``otel_tunix.consumers.live_ledger.LiveLedger``) runs on the worker beside the
accounting; this measures, in one run per case, the worker's CPU time per component (the
span builder's whole call: accounting, sinks, the ledger, queueing for export) and the
ledger's part of it, with thread CPU time (``time.thread_time``), which a loaded machine
disturbs less than the wall clock. Cases: ten components of one name, ten of ten names,
and ten names with a blocked wait per step (a ``data_stall`` the ledger weighs with
``categories.categorize_intervals``). Run: ``.venv/bin/python bench/bench_goodput.py``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OTEL_TUNIX_QUIET", "true")

import otel_tunix
from otel_tunix.consumers import live_ledger as goodput
from otel_tunix.pipeline import span_builder


def _timed(owner: Any, name: str, into: list[float]) -> Callable[[], None]:
    """Wrap ``owner.name`` to add its thread CPU time to ``into[0]``; returns the undo."""
    original = getattr(owner, name)

    def wrapper(self: Any, *args: Any) -> Any:
        t = time.thread_time()
        try:
            return original(self, *args)
        finally:
            into[0] += time.thread_time() - t

    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, original)


def case(steps: int, names: list[str], wait: bool) -> tuple[float, float]:
    """(worker CPU us per component, ledger CPU us per component)."""
    worker, ledger = [0.0], [0.0]
    undo = [
        _timed(span_builder.SpanBuilder, "__call__", worker),
        _timed(goodput.LiveLedger, "on_finished_steps", ledger),
    ]
    try:
        otel_tunix.configure(output_dir="none", run_id="bench-goodput", system_metrics=False)
        for n in range(steps):
            with otel_tunix.step(n):
                for i, name in enumerate(names):
                    with otel_tunix.component(name, blocked=wait and i == 0):
                        pass
        otel_tunix.shutdown()
    finally:
        for u in undo:
            u()
    per = 1e6 / (steps * len(names))
    return worker[0] * per, ledger[0] * per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=4000)
    args = ap.parse_args()
    cases = {
        "ten components, one name": (["compute"] * 10, False),
        "ten components, ten names": ([f"phase_{i}" for i in range(10)], False),
        "ten names, a blocked wait per step": (
            ["train_data_load", *(f"phase_{i}" for i in range(9))],
            True,
        ),
    }
    print(f"{'case':40s} {'worker us/comp':>15s} {'ledger us/comp':>15s} {'ledger/worker':>14s}")
    for label, (names, wait) in cases.items():
        w, g = case(args.steps, names, wait)
        print(f"{label:40s} {w:15.3f} {g:15.3f} {g / w if w else 0.0:14.2f}")


if __name__ == "__main__":
    main()
