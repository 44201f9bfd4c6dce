"""The ``otel-tunix demo`` command, run for real as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_demo_cli_trains_and_writes_the_run_folder(tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [sys.executable, "-m", "otel_tunix.cli", "demo", "--steps", "30", "--hidden", "64",
         "--output-dir", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "Step-time breakdown" in text
    for name in ("train_step_compute", "forward", "backward", "optimizer_step", "train_data_load"):
        assert name in text
    assert str(out.resolve()) in text
    lines = [json.loads(x) for x in (out / "spans.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["type"] == "step" and x["scope"] == "train"]
    assert [x["step"] for x in steps] == list(range(30))
    names = {s["name"] for s in steps[0]["spans"]}
    assert names == {
        "train_data_load",
        "train_step_compute",
        "forward",
        "backward",
        "optimizer_step",
    }
    # nested forward/backward/optimizer are inside train_step_compute: busy is not inflated
    for x in steps:
        assert x["busy_time_sec"] <= x["step_time_sec"] + 1e-9
        assert x["busy_time_sec"] >= x["components"]["train_step_compute"]["busy_time_sec"] - 1e-9
    sessions = {x["scope"]: x for x in lines if x["type"] == "session"}
    assert sessions["train"]["steps"] == 30
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [m["metrics"]["loss"] for m in metrics if "loss" in m.get("metrics", {})]
    assert len(losses) == 30 and losses[-1] < losses[0]
    assert json.loads((out / "summary.json").read_text())["scopes"]


def test_demo_sampling_rate_flag_and_usage_errors(tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    cmd = [sys.executable, "-m", "otel_tunix.cli", "demo", "--steps", "8", "--hidden", "32",
           "--sampling-rate", "4", "--output-dir", str(out), "--no-progress"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    steps = [json.loads(x) for x in (out / "spans.jsonl").read_text().splitlines()]
    assert [x["step"] for x in steps if x["type"] == "step"] == [0, 4]
    bad = subprocess.run(
        [sys.executable, "-m", "otel_tunix.cli", "demo", "--steps", "0"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert bad.returncode == 2 and "--steps must be at least 1" in bad.stderr
    unknown = subprocess.run(
        [sys.executable, "-m", "otel_tunix.cli", "nope"], capture_output=True, text=True, timeout=60
    )
    assert unknown.returncode == 2 and "unknown command 'nope'" in unknown.stderr
