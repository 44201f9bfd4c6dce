"""The cases where the live ledger (``summary.json``'s ``goodput``) and ``otel-tunix goodput``
once disagreed, or both missed the truth: each run in a child process that keeps its own
clocks (around each step, each component, a writer thread's start and end), then the two
ledgers compared with each other (within 1 ms per category or 0.1 % of the wall, whichever
is larger) and with those clocks.

The truths are shares of the same run (a category's seconds against the clocks' seconds of
the same run), so a loaded machine stretches both sides alike.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from processes import child_env

from otel_tunix.accounting import categories as cat
from otel_tunix.analysis.ledger import job_ledger

PREAMBLE = textwrap.dedent(
    """
    import json, sys, threading, time
    import otel_tunix

    clocks = {"steps": [], "components": {}, "threads": {}}

    def configure(**kw):
        otel_tunix.configure(output_dir=sys.argv[1], system_metrics=False, alerts=False,
                             perf=otel_tunix.PerformanceMetricsConfig(
                                 perfetto_trace_dir="none", **kw))

    class step:
        def __init__(self, n):
            self.s = otel_tunix.step(n)
        def __enter__(self):
            self.a = time.time_ns()
            return self.s.__enter__()
        def __exit__(self, *exc):
            self.s.__exit__(*exc)
            clocks["steps"].append((self.a, time.time_ns()))

    def timed(name, seconds, **kw):
        a = time.time_ns()
        with otel_tunix.component(name, **kw):
            time.sleep(seconds)
        clocks["components"].setdefault(name, []).append((a, time.time_ns()))

    def thread(name, seconds):
        def run():
            a = time.time_ns()
            with otel_tunix.component(name):
                time.sleep(seconds)
            clocks["threads"].setdefault(name, []).append((a, time.time_ns()))
        t = threading.Thread(target=run)
        t.start()
        return t

    def done():
        otel_tunix.shutdown()
        print(json.dumps(clocks))
    """
)


def _run(tmp_path: Path, body: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Run ``body`` after the preamble in a child; its clocks, the live figures and the
    offline ones, after checking that the two ledgers agree."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", PREAMBLE + textwrap.dedent(body), str(out)],
        env=child_env(OTEL_TUNIX_QUIET="true"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    clocks = json.loads(proc.stdout.strip().splitlines()[-1])
    live = json.loads((out / "summary.json").read_text())["goodput"]
    offline = job_ledger(out).to_json()
    wall = offline["wall_time_sec"]
    tol = max(1e-3, 1e-3 * wall)
    assert live["wall_time_sec"] == pytest.approx(wall, abs=tol)
    assert live["productive_time_sec"] == pytest.approx(offline["productive_time_sec"], abs=tol)
    for k in cat.BADPUT:
        assert live["badput_sec"][k] == pytest.approx(offline["badput_sec"][k], abs=tol), k
    assert live["compilations"] == offline["compilations"]
    total = live["productive_time_sec"] + sum(live["badput_sec"].values())
    assert total == pytest.approx(live["wall_time_sec"], rel=1e-9)
    return clocks, live, offline


def _outside(interval: list[int], steps: list[list[int]]) -> float:
    """Seconds of ``interval`` that no step window covers (the test's clocks)."""
    a, b = interval
    covered = 0
    for s0, s1 in steps:
        covered += max(0, min(b, s1) - max(a, s0))
    return (b - a - covered) * 1e-9


def _sum(intervals: list[list[int]]) -> float:
    return sum(b - a for a, b in intervals) * 1e-9


def test_a_writer_started_between_steps_costs_what_sticks_out_of_them(tmp_path: Path) -> None:
    """A checkpoint writer thread started between two steps, running beside the next ones:
    it costs only its time outside the step windows; the steps stay productive."""
    clocks, live, _ = _run(
        tmp_path,
        """
        configure()
        for n in range(60):
            if n == 10:
                writer = thread("checkpoint_save", 0.5)
                time.sleep(0.03)  # the loop waits a little for the writer to start copying
            with step(n):
                timed("train_step_compute", 0.02)
        writer.join()
        done()
        """,
    )
    steps = clocks["steps"]
    (writer,) = clocks["threads"]["checkpoint_save"]
    sticks_out = _outside(writer, steps)
    assert 0.03 <= sticks_out < 0.25  # the wait before step 10 and the gaps between steps
    saved = live["badput_sec"][cat.CHECKPOINT_SAVE]
    assert sticks_out - 0.002 <= saved <= sticks_out + 0.002
    # every step window is productive (the test's clock holds the SDK's window)
    assert live["productive_time_sec"] <= _sum(steps)
    assert live["productive_time_sec"] >= _sum(clocks["components"]["train_step_compute"])


def test_an_async_writer_still_running_after_the_last_step_is_counted(tmp_path: Path) -> None:
    """A writer started in the last steps runs on after the loop, which then waits for it:
    the wait after the last step is ``checkpoint_save``, and the wall time reaches its end."""
    clocks, live, _ = _run(
        tmp_path,
        """
        configure()
        for n in range(30):
            if n == 28:
                writer = thread("checkpoint_save", 0.6)
            with step(n):
                timed("train_step_compute", 0.01)
        writer.join()
        done()
        """,
    )
    steps = clocks["steps"]
    (writer,) = clocks["threads"]["checkpoint_save"]
    after = (writer[1] - steps[-1][1]) * 1e-9
    assert after > 0.3
    sticks_out = _outside(writer, steps)
    saved = live["badput_sec"][cat.CHECKPOINT_SAVE]
    assert sticks_out - 0.002 <= saved <= sticks_out + 0.002
    # the wall time runs to the writer's end: not dropped at shutdown
    assert live["badput_sec"][cat.OTHER] < 0.1


SAMPLED_LOOP = """
configure({rate})
for n in range(200):
    with step(n):
        if n == 0:
            timed("compile_model", 0.15, category="compilation")  # the first step compiles
        timed("train_data_load", 0.012 if n % 7 == 3 else 0.001, blocked=True)
        timed("train_step_compute", 0.004)
        if n % 40 == 39:
            timed("evaluate", 0.03)
        if n % 50 == 49:
            timed("checkpoint_save", 0.04)
done()
"""


@pytest.mark.slow
def test_sampling_does_not_blind_the_ledger(tmp_path: Path) -> None:
    """``sampling_rate=10``, a compilation in step 0, checkpoints every 50 steps,
    evaluations every 40 and data stalls, all inside steps that are mostly not sampled:
    each category within 5 % of the test's clocks around its components, goodput within
    0.02 of the truth (the steps' clocks less those components, over the wall)."""
    clocks, live, _ = _run(tmp_path, SAMPLED_LOOP.format(rate="sampling_rate=10"))
    comps = clocks["components"]
    truth = {
        cat.COMPILATION: _sum(comps["compile_model"]),
        cat.DATA_STALL: _sum(comps["train_data_load"]),
        cat.EVALUATION: _sum(comps["evaluate"]),
        cat.CHECKPOINT_SAVE: _sum(comps["checkpoint_save"]),
    }
    bad = live["badput_sec"]
    for k, v in truth.items():
        assert bad[k] == pytest.approx(v, rel=0.05), k
    wall = live["wall_time_sec"]
    productive = _sum(clocks["steps"]) - sum(truth.values())
    assert live["goodput"] == pytest.approx(productive / wall, abs=0.02)


@pytest.mark.slow
def test_torch_compile_with_a_lazily_compiled_backward_counts_dynamos_compilations(
    tmp_path: Path,
) -> None:
    """torch.compile (``aot_eager``) compiles each frame's forward, then its backward when
    that first runs (``lazy_backward``): the backward is time of the frame's compilation,
    not a compilation of its own; both ledgers count what dynamo counts."""
    pytest.importorskip("torch")
    clocks, live, offline = _run(
        tmp_path,
        """
        import torch
        from otel_tunix.instrumentation import torch as ott
        configure()
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        compiled = torch.compile(model, backend="aot_eager", dynamic=False)
        torch._dynamo.reset()
        torch._dynamo.utils.clear_compilation_metrics()
        ott.instrument_model(model)
        for n, rows in enumerate([4, 4, 6, 4, 6, 3]):
            with step(n):
                loss = compiled(torch.randn(rows, 8)).sum()
                loss.backward()
        # dynamo's own count of the frames it compiled (its compilation metrics also hold
        # an entry for each lazily compiled backward, with no frame)
        clocks["dynamo"] = torch._dynamo.utils.counters["frames"]["ok"]
        clocks["entries"] = len(torch._dynamo.utils.get_compilation_metrics())
        done()
        """,
    )
    assert clocks["dynamo"] >= 2 and clocks["entries"] > clocks["dynamo"]  # backwards too
    assert live["compilations"] == offline["compilations"] == clocks["dynamo"]
    assert live["badput_sec"][cat.COMPILATION] > 0


@pytest.mark.slow
def test_a_jax_loop_with_device_run_on(tmp_path: Path) -> None:
    """A JAX loop with ``instrument_jit`` that never waits for its device: both ledgers run
    the wall time to the device's completion and count the run-on as productive, as the
    test's clocks around the loop and ``block_until_ready`` say."""
    pytest.importorskip("jax")
    clocks, live, _ = _run(
        tmp_path,
        """
        import jax, jax.numpy as jnp
        from otel_tunix.instrumentation import jax as otj

        def chain(w, x):
            for _ in range(8):
                x = jnp.tanh(x @ w)
            return x

        configure()
        step_fn = otj.instrument_jit(jax.jit(chain), component="train_step_compute")
        w, x = jnp.full((512, 512), 0.01), jnp.ones((512, 512))
        step_fn(w, x).block_until_ready()  # compiled before the loop
        a = time.time_ns()
        for n in range(40):
            with step(n):
                x = step_fn(w, x)  # never waits for the device
        host_end = time.time_ns()
        x.block_until_ready()
        clocks["loop"] = [a, host_end, time.time_ns()]
        done()
        """,
    )
    start, host_end, end = clocks["loop"]
    loop, run_on = (end - start) * 1e-9, (end - host_end) * 1e-9
    assert run_on > 0.3 * loop  # the device did run on after the host loop
    assert live["productive_time_sec"] >= 0.9 * loop
    assert live["productive_time_sec"] <= loop + 0.05 * run_on
