"""The benchmark scripts run (tiny sizes) and print their ratios. No timing is asserted:
these machines are shared and noisy; the numbers live in docs/benchmarks.md."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _run(script: str, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_bench_overhead_prints_every_row_and_ratio():
    text = _run("bench_overhead.py", "--spans", "400", "--repeats", "1")
    for row in (
        "OTel SDK, ALWAYS_ON + batch(null)",
        "otel-tunix, step not sampled",
        "component alone, in one step not sampled",
        "otel-tunix, sampled: training thread alone",
        "otel-tunix, sampled (+ processing)",
        "same, each component its own name",
        "same, joined to an app provider + SDK batch(null)",
        "same, no span exporter",
        "same, threads on one CPU (diagnostic)",
        "own names, threads on one CPU (diagnostic)",
        "same, every stage on the training thread (diagnostic)",
    ):
        assert re.search(re.escape(row) + r"\s+\d+\.\d{3}", text), row
    assert re.search(r"sampled\+processing / SDK ALWAYS_ON = \d+\.\d{3}", text)
    assert re.search(r"unsampled / SDK ALWAYS_OFF\s+= \d+\.\d{3}", text)
    assert re.search(r"component alone, without its step's share = \d+\.\d{3} us", text)
    if "google-tunix not installed" not in text:  # both Tunix rows and both ratios
        for row in ("Tunix PerfTracer.span", "Tunix, as its RL learner uses it"):
            assert re.search(re.escape(row) + r".*?\s+\d+\.\d{3}", text), row
        assert re.search(r"sampled\+processing / Tunix\s+= \d+\.\d{3}", text)
        assert re.search(r"each component its own name / Tunix = \d+\.\d{3}", text)
        assert re.search(r"/ Tunix with its per-step export = \d+\.\d{3}", text)
        assert re.search(r"threads on one CPU / Tunix\s+= \d+\.\d{3}", text)
        assert re.search(r"own names, threads on one CPU / Tunix = \d+\.\d{3}", text)
        assert re.search(r"every stage on one thread / Tunix = \d+\.\d{3}", text)


def test_bench_goodput_prints_the_ledgers_share_of_the_worker():
    text = _run("bench_goodput.py", "--steps", "50")
    for row in (
        "ten components, one name",
        "ten components, ten names",
        "ten names, a blocked wait per step",
    ):
        assert re.search(re.escape(row) + r"\s+\d+\.\d{3}\s+\d+\.\d{3}\s+\d+\.\d{2}", text), row


def test_bench_threads_prints_every_row_and_the_extra_cost():
    text = _run("bench_threads.py", "--calls", "200", "--rounds", "1")
    for row in (
        "unpatched submit",
        "patched, outside any step",
        "patched, in a step not sampled",
        "patched, in a sampled step (carries)",
    ):
        assert re.search(re.escape(row) + r"\s+\d+\.\d{3}\s+-?\d+\.\d{3}\s+\d+\.\d{2}x", text), row
    assert re.search(r"\+ otel-tunix patch \(a plain function\)\s+-?\d+\.\d{3} extra", text)
    assert re.search(r"\+ the wrapt wrapper used before\s+-?\d+\.\d{3} extra", text)
    assert re.search(r"extra outside sampled steps: -?\d+\.\d{3} us", text)


@pytest.mark.filterwarnings("ignore")
def test_bench_demo_prints_the_direct_and_wall_clock_measurements():
    pytest.importorskip("torch")
    text = _run(
        "bench_demo.py", "--steps", "6", "--rounds", "1", "--block", "2", "--blocks", "2",
        "--d-model", "16",
    )  # fmt: skip
    assert re.search(r"otel-tunix threads \(CPU\):\s+\d+\.\d us", text)
    assert re.search(r"total:\s+\d+\.\d us = \d+\.\d\d% of the step", text)
    assert re.search(r"wall clock, interleaved blocks of 2 steps.*median of \d+ pairs", text)


def test_bench_torch_zero_code_prints_the_hook_cost_and_the_loop_ratio():
    pytest.importorskip("torch")
    pytest.importorskip("opentelemetry.instrumentation")
    text = _run("bench_torch_zero_code.py", "--layers", "2", "--iterations", "5", "--rounds", "1")
    assert re.search(r"added per module call\s+-?\d+\.\d{3} us", text)
    assert re.search(r"ratio instrumented / uninstrumented\s+\d+\.\d{3}", text)


def test_bench_instructions_child_runs_every_stage_without_valgrind():
    for stage, names in (("hot", []), ("process", []), ("export", ["--distinct"])):
        out = subprocess.run(
            [sys.executable, str(BENCH / "bench_instructions.py"), "--child", stage,
             "--spans", "200", *names],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]


def test_bench_instructions_says_when_valgrind_is_missing(tmp_path):
    out = subprocess.run(
        [sys.executable, str(BENCH / "bench_instructions.py")],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": str(tmp_path)},  # no valgrind on it
    )  # fmt: skip
    assert out.returncode != 0
    assert "needs valgrind" in out.stderr


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_bench_instructions_counts_grow_with_the_spans_recorded():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_instructions
    finally:
        sys.path.remove(str(BENCH))
    with ThreadPoolExecutor(2) as pool:
        none, some = pool.map(lambda n: bench_instructions.count("hot", n, 10, False), (0, 3000))
    # A recorded component costs thousands of instructions (about 15k here), never nothing.
    assert 3000 * 5_000 < some - none < 3000 * 100_000


def test_bench_collectives_prints_the_wrapper_cost_against_a_collective():
    pytest.importorskip("torch.distributed")
    import json

    out = json.loads(_run("bench_collectives.py"))
    for key in (
        "plain_call_ns",
        "wrapped_outside_a_step_ns",
        "wrapped_in_an_unsampled_step_ns",
        "wrapped_in_a_sampled_step_ns",
        "gloo_all_reduce_one_process_ns",
        "unsampled_overhead_vs_all_reduce",
    ):
        assert out[key] > 0, key


def test_bench_export_prints_its_ratios_and_every_span_reaches_the_collector():
    text = _run(
        "bench_export.py",
        *("--steps", "40", "--rounds", "1", "--cpu-work", "200"),
        *("--whole-steps", "50", "--whole-rounds", "1"),
    )
    for line in (
        "whole process, grpc: otel-tunix / SDK OTLP path = ",
        "grpc: otel-tunix / SDK OTLP path = ",
        "http: otel-tunix / SDK OTLP path = ",
        "metrics: otel-tunix's OTLP metrics = ",
        "gil: CPU-bound step, median ",
    ):
        assert line in text, text
    # the collector counted every span each row sent (a count, not a timing)
    assert "spans lost at the collector, all rows: 0 " in text, text
    # and every metric data point; its last step-time point counted every step
    assert (
        "metric points lost at the collector, all rows: 0; steps its last "
        "tunix.step.duration did not count: 0 " in text
    ), text


def test_bench_step_histograms_prints_both_paths():
    text = _run("bench_step_histograms.py", "--batches", "2")
    for readers in ("1 reader(s): SDK instruments ", "2 reader(s): SDK instruments "):
        assert readers in text, text
    assert text.count("otel-tunix's fold") == 2, text
