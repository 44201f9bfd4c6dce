"""The live goodput ledger (summary.json, tunix.run.goodput) and the offline one
(``otel-tunix goodput``) read the same run the same way: a real run with a restore before the
loop, an evaluation between steps and an asynchronous checkpoint writer beside the steps,
against the run's own clocks."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from processes import child_env

from otel_tunix.accounting import categories as cat
from otel_tunix.analysis.ledger import job_ledger

PROGRAM = textwrap.dedent(
    """
    import json, sys, threading, time
    import otel_tunix

    otel_tunix.configure(output_dir=sys.argv[1], system_metrics=False, alerts=False,
                         perf=otel_tunix.PerformanceMetricsConfig(perfetto_trace_dir="none"))
    said = {}

    def timed(name, seconds):
        a = time.time_ns()
        with otel_tunix.component(name):
            time.sleep(seconds)
        said.setdefault(name, []).append((time.time_ns() - a) * 1e-9)

    def writer():  # an asynchronous checkpoint: the steps go on beside it
        timed("checkpoint_save", 0.06)

    timed("checkpoint_restore", 0.05)  # before the loop, outside any step
    for n in range(20):
        if n == 10:
            timed("evaluate", 0.04)  # between two steps, on the training thread
        with otel_tunix.step(n):
            if n == 12:  # (after the evaluation: the writer ends within the steps)
                thread = threading.Thread(target=writer)
                thread.start()
            timed("train_step_compute", 0.01)
    thread.join()
    otel_tunix.shutdown()
    print(json.dumps(said))
    """
)


def test_the_live_and_the_offline_ledger_agree(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(out)],
        env=child_env(OTEL_TUNIX_QUIET="true"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout)
    live = json.loads((out / "summary.json").read_text())["goodput"]
    offline = job_ledger(out).to_json()
    bad_live, bad_off = live["badput_sec"], offline["badput_sec"]
    # the components outside the steps count where they ran, in both
    (restore,) = said["checkpoint_restore"]
    (evaluate,) = said["evaluate"]
    for bad in (bad_live, bad_off):
        assert restore - 0.002 <= bad[cat.CHECKPOINT_RESTORE] <= restore + 0.002
        assert evaluate - 0.002 <= bad[cat.EVALUATION] <= evaluate + 0.002
        # the writer ran beside 20 ms-ish steps: it costs only what stuck out of them
        assert bad[cat.CHECKPOINT_SAVE] < said["checkpoint_save"][0] / 2
    for k in cat.BADPUT:
        assert bad_live.get(k, 0.0) == pytest.approx(bad_off[k], abs=0.003), k
    assert live["productive_time_sec"] == pytest.approx(offline["productive_time_sec"], abs=0.003)
    assert sum(said["train_step_compute"]) - 0.003 <= live["productive_time_sec"]
    assert live["wall_time_sec"] == pytest.approx(offline["wall_time_sec"], abs=0.005)
