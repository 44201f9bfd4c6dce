"""The ``otel-tunix demo`` command, run for real as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from processes import child_env

from otel_tunix.run.notices import cli_command


def test_demo_cli_trains_a_language_model_and_writes_the_run_folder(tmp_path):
    pytest.importorskip("torch")
    from otel_tunix.demos.tiny_lm import TinyLM, TinyLMConfig

    out = tmp_path / "run"
    env = child_env()
    proc = subprocess.run(
        [sys.executable, "-m", "otel_tunix.cli", "demo", "--steps", "40", "--d-model", "32",
         "--eval-every", "20", "--peak-tflops", "0.05", "--output-dir", str(out),
         "--no-progress"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "Step-time breakdown" in text
    for name in ("train_step_compute", "forward", "backward", "optimizer_step", "train_data_load"):
        assert name in text
    assert "tokens/s" in text and "MFU" in text and "0.05 TFLOP/s (--peak-tflops)" in text
    assert str(out.resolve()) in text
    # it lists the files it wrote: no alert fires in 40 steps (the step-time rule's warm-up
    # is 50), so no alerts.jsonl is listed
    assert "  spans    " in text and "  alerts " not in text and not (out / "alerts.jsonl").exists()
    # on stderr: where the data goes, the live line (at least its last one), where it went
    err = proc.stderr
    assert f"files -> run folder      {out}" in err
    assert "otel-tunix step 39 | loss " in err and " | tokens/s " in err and " | mfu " in err
    assert "finished: eval 8 steps (8 recorded), train 40 steps (40 recorded)" in err
    cli = cli_command()  # the child's: same interpreter, PATH and working folder
    assert f"next: {cli} summary {out}" in err
    # the demo's last line: what to run next, as a command that runs from here
    assert text.strip().splitlines()[-1] == f"next: {cli} summary {out}   ·   {cli} goodput {out}"
    lines = [json.loads(x) for x in (out / "spans.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["type"] == "step" and x["scope"] == "train"]
    assert [x["step"] for x in steps] == list(range(40))
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
    assert sessions["train"]["steps"] == 40
    assert sessions["eval"]["steps"] == 2 * 4  # two evaluations of four held-out batches
    # eval steps are numbered in the order they ran, and say which evaluation and batch
    evals = [x for x in lines if x["type"] == "step" and x["scope"] == "eval"]
    assert [x["step"] for x in evals] == list(range(8))
    assert [
        (x["attributes"]["tunix.eval.round"], x["attributes"]["tunix.eval.batch"],
         x["attributes"]["tunix.eval.train_step"]) for x in evals
    ] == [(k, i, 20 * k + 19) for k in range(2) for i in range(4)]  # fmt: skip
    slowest = max(evals, key=lambda x: x["step_time_sec"])
    a = slowest["attributes"]
    assert (
        f"slowest eval step: {slowest['step']} ({slowest['step_time_sec'] * 1e3:.1f} ms; "
        f"evaluation {a['tunix.eval.round']}, batch {a['tunix.eval.batch']}, after train step "
        f"{a['tunix.eval.train_step']})\n" in err  # no trace id: no trace exporter to find it
    )
    assert "trace id" not in err

    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [m["metrics"] for m in metrics if "loss" in m.get("metrics", {})]
    assert len(rows) == 40
    # bytes: a model that knows nothing starts at ln(256) nats, and it learns
    assert rows[0]["loss"] == pytest.approx(math.log(256), abs=0.05)
    assert rows[-1]["loss"] < rows[0]["loss"] - 1.0
    flops_per_token = TinyLM(TinyLMConfig(d_model=32)).flops().per_token()
    for r in rows:
        assert r["perplexity"] == pytest.approx(math.exp(r["loss"]))
        assert r["tokens_per_sec"] == pytest.approx(16 * 64 / r["step_time_sec"])
        assert r["mfu"] == pytest.approx(r["tokens_per_sec"] * flops_per_token / 0.05e12)
        assert 0 < r["learning_rate"] <= 3e-3 and r["grad_norm"] > 0
    assert rows[0]["learning_rate"] == pytest.approx(3e-3 / 20)  # linear warm-up
    evals = [m["metrics"] for m in metrics if "eval/loss" in m.get("metrics", {})]
    assert len(evals) == 2 and evals[1]["eval/loss"] < evals[0]["eval/loss"]
    assert evals[1]["eval/perplexity"] == pytest.approx(math.exp(evals[1]["eval/loss"]))
    assert json.loads((out / "summary.json").read_text())["scopes"]
    assert not (out / "checkpoint.pt").exists()  # one every 100 steps: none in 40


def test_demo_checkpoint_loads_back_into_the_model(tmp_path):
    torch = pytest.importorskip("torch")
    import otel_tunix
    from otel_tunix.demos.sft import DemoConfig, train
    from otel_tunix.demos.tiny_lm import TinyLM, TinyLMConfig
    from otel_tunix.testing import capture

    cfg = DemoConfig(steps=4, d_model=16, checkpoint_every=2, eval_every=0, workers=0)
    with capture(output_dir=tmp_path) as cap:
        result = train(cfg, run_dir=tmp_path, progress=None)
        otel_tunix.force_flush()
    saved = torch.load(tmp_path / "checkpoint.pt")
    assert saved["step"] == 3
    model = TinyLM(TinyLMConfig(d_model=16))
    model.load_state_dict(saved["model"])
    assert [s.step for s in cap.summaries if s.scope == "train"] == [0, 1, 2, 3]
    saves = [s for s in cap.summaries if "checkpoint_save" in s.components]
    assert [s.step for s in saves] == [1, 3]
    assert len(result.losses) == 4 and result.mfu > 0


def test_demo_sampling_rate_flag_and_usage_errors(tmp_path):
    out = tmp_path / "run"
    env = {**child_env(), "OTEL_SERVICE_NAME": "my-sft"}  # the service the user names
    cmd = [sys.executable, "-m", "otel_tunix.cli", "demo", "--steps", "8", "--d-model", "16",
           "--sampling-rate", "4", "--output-dir", str(out), "--no-progress"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    steps = [json.loads(x) for x in (out / "spans.jsonl").read_text().splitlines()]
    assert [x["step"] for x in steps if x["type"] == "step"] == [0, 4]
    assert steps[0]["resource"]["service.name"] == "my-sft"  # taken, not otel-tunix-demo
    bad = subprocess.run(
        [sys.executable, "-m", "otel_tunix.cli", "demo", "--steps", "0"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert bad.returncode == 2 and "--steps must be at least 1" in bad.stderr
    unknown = subprocess.run(
        [sys.executable, "-m", "otel_tunix.cli", "nope"], capture_output=True, text=True, timeout=60
    )
    assert unknown.returncode == 2 and "unknown command 'nope'" in unknown.stderr


def test_the_demo_names_a_loss_spike_above_the_uniform_guess() -> None:
    from otel_tunix.demos.sft import spike_note

    uniform = math.log(256)
    losses = [uniform - 0.01 * n for n in range(30)]  # learning, never above the guess
    assert spike_note(losses, uniform) is None
    losses[0] = uniform + 0.2  # the first steps may start above it: not a spike
    assert spike_note(losses, uniform) is None
    losses[25] = 10.02
    note = spike_note(losses, uniform)
    assert note is not None
    assert note.startswith(
        f"loss spike: 10.02 at step 25 (above the uniform guess {uniform:.2f}, "
        f"{losses[26]:.2f} the step after)"
    )


def test_the_demos_own_service_name_unless_the_environment_names_one(monkeypatch) -> None:
    from otel_tunix.analysis.report import demo_service_name

    assert demo_service_name("otel-tunix-demo") == "otel-tunix-demo"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=theirs")
    assert demo_service_name("otel-tunix-demo") is None  # the SDK's rules pick "theirs"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "mine")
    assert demo_service_name("otel-tunix-demo-rl") is None
