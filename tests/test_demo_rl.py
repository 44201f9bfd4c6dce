"""The RL demo (``otel-tunix demo --rl``): a real asynchronous GRPO-style loop in PyTorch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("rich")

from otel_tunix import demo_rl


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_async_rl_demo_traces_actor_and_learner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert demo_rl.main(["--steps", "12", "--output-dir", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "RL step-time breakdown" in text
    assert "rollout idle" in text and "learner blocked" in text

    records = _lines(out / "spans.jsonl")
    steps = [r for r in records if r["type"] == "step"]
    actor = [r for r in steps if r["scope"] == "rl/actor"]
    learner = [r for r in steps if r["scope"] == "rl/learner"]
    assert sorted(r["step"] for r in actor) == list(range(12))
    assert [r["step"] for r in learner] == list(range(12))

    a = actor[3]
    assert {n: c["count"] for n, c in a["components"].items()} == {
        "rollout": 1,
        "generate": 4,  # one per prompt, on the rollout workers
        "reference_inference": 1,
        "reward": 1,
        "advantage_computation": 1,
    }
    by_id = {s["span_id"]: s for s in a["spans"]}
    gens = [s for s in a["spans"] if s["name"] == "generate"]
    assert all(by_id[s["parent"]]["name"] == "rollout" for s in gens)
    assert all(s["thread"].startswith("rollout-worker") for s in gens)

    lr = learner[3]
    assert set(lr["components"]) == {
        "train_queue_wait", "actor_train_step", "forward", "backward", "optimizer_step",
        "weight_sync",
    }  # fmt: skip
    assert lr["components"]["train_queue_wait"]["blocked_time_sec"] > 0
    by_id = {s["span_id"]: s for s in lr["spans"]}
    for s in lr["spans"]:
        if s["name"] in ("forward", "backward", "optimizer_step"):
            assert by_id[s["parent"]]["name"] == "actor_train_step"
    # the first learner step has to wait for the first rollout
    assert learner[0]["blocked_time_sec"] > 0

    sessions = {r["scope"]: r for r in records if r["type"] == "session"}
    assert set(sessions) == {"rl/actor", "rl/learner"}
    assert sessions["rl/learner"]["blocked_time_sec"] > 0
    assert sessions["rl/actor"]["idle_time_sec"] >= 0
    # the two loops overlap in time: the actor runs ahead of the learner
    assert min(r["start_ns"] for r in actor) < min(r["end_ns"] for r in learner)

    metrics = _lines(out / "metrics.jsonl")
    logged = {k for m in metrics for k in m.get("metrics", {})}
    assert {
        "rewards/mean", "rewards/std", "kl", "loss", "pg_clipfrac", "staleness",
        "completions/mean_length", "completions/max_length", "completions/clipped_ratio",
        "generation/time_to_first_token_sec", "generation/time_per_output_token_sec",
    } <= logged  # fmt: skip
    rows = [m["metrics"] for m in metrics if "rewards/mean" in m.get("metrics", {})]
    for r in rows:
        assert 0 <= r["rewards/min"] <= r["rewards/mean"] <= r["rewards/max"] <= 1
        assert 1 <= r["completions/min_length"] <= r["completions/max_length"] <= 6
        assert r["kl"] >= 0 and 0 <= r["pg_clipfrac"] <= 1
        assert r["generation/time_to_first_token_sec"] > 0
    # the policy starts as the reference: no divergence at the first step
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert {"perf/rl/learner/train_queue_wait/blocked_time_sec"} <= logged
    assert all(
        0 <= m["metrics"]["staleness"] <= 1 for m in metrics if "staleness" in m.get("metrics", {})
    )


def test_sync_mode_and_the_wait_summary(tmp_path: Path) -> None:
    import otel_tunix
    from otel_tunix.testing import capture

    cfg = demo_rl.RLDemoConfig(steps=4, sync=True, group_size=4)
    with capture(output_dir=tmp_path) as cap:
        rewards = demo_rl.run(cfg)
        otel_tunix.force_flush()
        metrics = cap.metrics()
    # one generation request per prompt's group: 4 steps x 4 prompts, timed from the model
    (ttft,) = metrics["gen_ai.server.time_to_first_token"]
    assert ttft.count == 16 and ttft.sum > 0
    requests = metrics["tunix.generation.requests"]
    assert sum(p.value for p in requests) == 16
    assert {p.attributes["finish_reason"] for p in requests} <= {"stop", "length"}
    assert len(rewards) == 4 and all(0 <= r <= 1 for r in rewards)
    waits = demo_rl.rollout_idle_and_learner_blocked(cap.sessions)
    assert set(waits) == {
        "rollout_idle_sec", "rollout_step_sec", "learner_blocked_sec", "learner_step_sec"
    }  # fmt: skip
    # in turn, in one thread: the batch is always there when the learner asks
    assert waits["learner_blocked_sec"] < waits["learner_step_sec"] / 2
    actor_steps = [s for s in cap.summaries if s.scope == "rl/actor"]
    learner_steps = [s for s in cap.summaries if s.scope == "rl/learner"]
    assert len(actor_steps) == len(learner_steps) == 4
    assert all(a.end_ns <= b.start_ns for a, b in zip(actor_steps, learner_steps, strict=True))


def test_reward_counts_up_to_nine_and_stops() -> None:
    import torch

    eos, pad = demo_rl.EOS, demo_rl.PAD
    assert demo_rl.target(6, 6) == [7, 8, 9, eos]
    assert demo_rl.target(0, 6) == [1, 2, 3, 4, 5, 6]  # longer than the limit: cut
    assert demo_rl.target(9, 6) == [eos]
    tokens = torch.tensor(
        [
            [6, 7, 8, 9, eos, pad, pad],  # right
            [6, 7, 0, 9, 5, 5, 5],  # 2 of 4 target positions
            [9, eos, pad, pad, pad, pad, pad],  # right
            [0, 1, 2, 3, 4, 5, eos],  # 5 of 6
        ]
    )
    assert demo_rl.reward_fn(tokens, 6).tolist() == pytest.approx([1.0, 0.5, 1.0, 5 / 6])
    # what the learner trains on: up to and with the end token
    assert demo_rl.completion_mask(tokens).tolist() == [
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1],
        [1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1],
    ]


def test_generation_stops_each_completion_at_its_end_token() -> None:
    import torch

    cfg = demo_rl.RLDemoConfig(group_size=16, completion_length=6)
    torch.manual_seed(0)
    model = demo_rl._policy(cfg).eval()
    actor = demo_rl.Actor(cfg, demo_rl._Shared(cfg, model.state_dict()), model)
    try:
        tokens, logps, ttft, tpot = actor._generate(model, 3, seed=1)
    finally:
        actor.close()
    assert tokens.shape == (16, 7) and (tokens[:, 0] == 3).all()
    mask = demo_rl.completion_mask(tokens)
    assert (tokens[:, 1:][mask == 1] <= demo_rl.EOS).all()  # digits and the end token
    assert (tokens[:, 1:][mask == 0] == demo_rl.PAD).all()  # nothing after the end
    assert (logps[mask == 0] == 0).all() and (logps[mask == 1] < 0).all()
    # the behaviour log-probs are the model's own, as the learner recomputes them
    with torch.no_grad():
        again = demo_rl._token_logps(model, tokens) * mask
    assert torch.allclose(again, logps, atol=1e-5)
    assert ttft > 0 and tpot > 0
