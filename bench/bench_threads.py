"""What carrying the step into pool tasks costs ``ThreadPoolExecutor.submit``.

While a framework integration is on, otel-tunix patches ``ThreadPoolExecutor.submit`` (and
``Thread.start``) so that a task submitted inside a sampled step runs in a copy of the
step's context (``otel_tunix/instrumentation/_threads.py``). This measures, in one run, an
unpatched ``submit`` against the patched one outside any step, inside a step that is not
sampled, and inside a sampled step (where the copy is made), and prints the extra time and
the ratio to the unpatched call.

Target (issue #27): <= 0.3 us extra per call outside sampled steps.

The pool's one worker is kept busy while the calls are timed, so ``submit`` only queues
(the task runs later): the worker thread does not compete for the GIL with the calls.
Rows are measured in rounds (each round measures every row once; a row's value is its
fastest round), so a burst of load on a shared machine lands on all rows alike and what is
left is the calls' own cost (load only ever adds to it).
Run: ``.venv/bin/python bench/bench_threads.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import otel_tunix
from otel_tunix.instrumentation import _threads as threads
from otel_tunix.instrumentation._threads import carry_into_threads, stop_carrying_into_threads


def _task() -> None:
    pass


_Around = Callable[[], contextlib.AbstractContextManager[object]]


def _timed_submits(n: int, around: _Around) -> float:
    """CPU seconds of the calling thread per ``submit``, over ``n`` calls made inside
    ``around()``, the pool's worker held busy meanwhile (the calls only queue). CPU time,
    not wall time: on a shared machine the wall time of a call also counts the time other
    processes had the CPU."""
    release = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        pool.submit(release.wait)
        with around():
            submit = pool.submit  # looked up once patched
            t0 = time.thread_time()
            for _ in range(n):
                submit(_task)
            elapsed = time.thread_time() - t0
        release.set()
    return elapsed / n


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextlib.contextmanager
def _patched(inner: _Around) -> Iterator[None]:
    carry_into_threads()
    try:
        with inner():
            yield
    finally:
        stop_carrying_into_threads()


class _DoNothing:
    """A stand-in pool whose ``submit`` does nothing: a patch laid over it costs only
    itself, so its cost is measured without the noise of a real ``submit``."""

    def submit(self, fn: object, /, *args: object, **kwargs: object) -> None:
        return None


def _wrapt_as_before() -> type[_DoNothing]:
    """The do-nothing pool with ``submit`` wrapped as otel-tunix wrapped it before: a wrapt
    function wrapper that asks for the context to carry on every call."""
    import wrapt

    from otel_tunix.recording.hot_path import carried_context

    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        ctx = carried_context()
        if ctx is None or not args:
            return wrapped(*args, **kwargs)
        return wrapped(ctx.run, *args, **kwargs)

    cls = type("_WraptPool", (_DoNothing,), {})
    wrapt.wrap_function_wrapper(cls, "submit", wrapper)
    return cls


@contextlib.contextmanager
def _ours_over_nothing() -> Iterator[_DoNothing]:
    """A do-nothing pool whose ``submit`` is otel-tunix's patched one, calling the
    do-nothing ``submit`` where it would call the real one."""
    saved = threads._original_submit
    threads._original_submit = _DoNothing.submit  # type: ignore[assignment]
    try:
        yield type("_OurPool", (_DoNothing,), {"submit": threads._submit})()
    finally:
        threads._original_submit = saved


def _timed_calls(n: int, pool: object) -> float:
    """CPU seconds per ``pool.submit(_task)`` over ``n`` calls, outside any step."""
    submit = pool.submit  # type: ignore[attr-defined]
    t0 = time.thread_time()
    for _ in range(n):
        submit(_task)
    return (time.thread_time() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=10000, help="submit calls per measurement")
    ap.add_argument("--rounds", type=int, default=25)
    args = ap.parse_args()

    otel_tunix.configure(
        output_dir="none",
        span_exporters=[],
        perf=otel_tunix.PerformanceMetricsConfig(sampling_rate=2),
    )
    rows: dict[str, Callable[[], contextlib.AbstractContextManager[object]]] = {
        "unpatched submit": _nothing,
        "patched, outside any step": lambda: _patched(_nothing),
        "patched, in a step not sampled": lambda: _patched(lambda: otel_tunix.step(1)),
        "patched, in a sampled step (carries)": lambda: _patched(lambda: otel_tunix.step(0)),
    }
    samples: dict[str, list[float]] = {name: [] for name in rows}
    alone: dict[str, list[float]] = {"do-nothing submit": [], "ours": [], "wrapt": []}
    wrapt_pool = _wrapt_as_before()()
    for _ in range(args.rounds):
        for name, around in rows.items():
            samples[name].append(_timed_submits(args.calls, around) * 1e6)
        with _ours_over_nothing() as ours:
            for name, pool in (("do-nothing submit", _DoNothing()), ("ours", ours),
                               ("wrapt", wrapt_pool)):  # fmt: skip
                alone[name].append(_timed_calls(args.calls * 10, pool) * 1e6)
    otel_tunix.shutdown()

    base = min(samples["unpatched submit"])
    print(
        f"ThreadPoolExecutor.submit, {args.calls} calls x {args.rounds} rounds "
        "(fastest round, CPU us/call)"
    )
    print(f"{'row':40s} {'us/call':>8s} {'extra us':>9s} {'ratio':>6s}")
    for name, values in samples.items():
        us = min(values)
        print(f"{name:40s} {us:8.3f} {us - base:9.3f} {us / base:6.2f}x")
    nothing = min(alone["do-nothing submit"])
    ours_extra = min(alone["ours"]) - nothing
    wrapt_extra = min(alone["wrapt"]) - nothing
    print()
    print("the patch alone, over a do-nothing submit, outside any step (CPU us/call):")
    print(f"{'do-nothing submit':40s} {nothing:8.3f}")
    print(f"{'+ otel-tunix patch (a plain function)':40s} {ours_extra:8.3f} extra")
    print(f"{'+ the wrapt wrapper used before':40s} {wrapt_extra:8.3f} extra")
    print(
        f"extra / unpatched submit: {ours_extra / base:.3f}x "
        f"(wrapt before: {wrapt_extra / base:.3f}x)"
    )
    verdict = "meets" if ours_extra <= 0.3 else "misses"
    print(f"extra outside sampled steps: {ours_extra:.3f} us ({verdict} the <= 0.3 us target)")


if __name__ == "__main__":
    main()
