"""The RL demo (``otel-tunix demo --rl``): a real asynchronous GRPO-style loop in PyTorch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("rich")

from run_files import read_jsonl

from otel_tunix.accounting import rl_steps
from otel_tunix.demos import rl as demo_rl


def test_async_rl_demo_traces_actor_and_learner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert demo_rl.main(["--steps", "12", "--output-dir", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "RL step-time breakdown" in text
    assert "rollout idle" in text and "learner blocked" in text
    assert "RL step added up: rl/learner" in text and "step time (12 steps)" in text

    records = read_jsonl(out / "spans.jsonl")
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
        "rollout_queue_wait", "actor_train_step", "forward", "backward", "optimizer_step",
        "weight_sync",
    }  # fmt: skip
    assert lr["components"]["rollout_queue_wait"]["blocked_time_sec"] > 0
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

    metrics = read_jsonl(out / "metrics.jsonl")
    # each learner step added up: its parts (docs/rl.md) are its components' times, the
    # torch forward / backward / optimizer_step nested in actor_train_step counted once
    parts = {
        m["step"]: m["metrics"] for m in metrics if "perf/global_step_time" in m.get("metrics", {})
    }
    assert sorted(parts) == list(range(12))
    for r in learner:
        p, c = parts[r["step"]], r["components"]
        assert p["perf/global_step_time"] == pytest.approx(r["step_time_sec"])
        total = sum(p[name] for name in rl_steps.SCALAR_NAMES.values())
        assert total == pytest.approx(r["step_time_sec"], rel=0.01)
        assert p["perf/sum/actor_train_time"] == pytest.approx(
            c["actor_train_step"]["busy_time_sec"], abs=1e-6
        )
        assert p["perf/weight_sync_time"] == pytest.approx(
            c["weight_sync"]["busy_time_sec"], abs=1e-6
        )
        assert p["rl/step/rollout_wait_time"] == pytest.approx(
            c["rollout_queue_wait"]["blocked_time_sec"], abs=1e-6
        )
        assert p["rl/step/idle_time"] == pytest.approx(r["idle_time_sec"], abs=1e-6)
    logged = {k for m in metrics for k in m.get("metrics", {})}
    assert {
        "rewards/mean", "rewards/std", "kl", "loss", "pg_clipfrac", "policy_lag",
        "completions/mean_length", "completions/max_length", "completions/clipped_ratio",
        "generation/time_to_first_token_sec", "generation/time_per_output_token_sec",
    } <= logged  # fmt: skip
    rows = [m["metrics"] for m in metrics if "rewards/mean" in m.get("metrics", {})]
    for r in rows:
        assert 0 <= r["rewards/min"] <= r["rewards/mean"] <= r["rewards/max"] <= 1
        assert 1 <= r["completions/min_length"] <= r["completions/max_length"] <= 34
        assert r["kl"] >= 0 and 0 <= r["pg_clipfrac"] <= 1
        assert r["generation/time_to_first_token_sec"] > 0
    # the policy starts as the reference: no divergence at the first step
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert {"perf/rl/learner/rollout_queue_wait/blocked_time_sec"} <= logged
    # the library's lag (otel_tunix.rl): learner step n trains version n on the batch of
    # actor step n, made with version n - max_staleness (1), or 0 for the first
    logged_lag = [m for m in metrics if "policy_lag" in m.get("metrics", {})]
    lag = {m["step"]: m["metrics"]["policy_lag"] for m in logged_lag}
    assert lag == {n: float(min(n, 1)) for n in range(12)}
    # each learner step links the rollout span of the actor step whose batch it trained on
    actor_by_step = {r["step"]: r for r in actor}
    for r in learner:
        (link,) = r["links"]
        n = r["step"]
        made = actor_by_step[n]
        (rollout,) = [s for s in made["spans"] if s["name"] == "rollout"]
        assert (link["trace_id"], link["span_id"]) == (made["trace_id"], rollout["span_id"])
        assert link["attributes"]["tunix.rl.policy_version"] == max(0, n - 1)
        assert link["attributes"]["tunix.rl.policy_lag"] == min(n, 1)
        assert r["attributes"]["tunix.rl.policy_lag"] == min(n, 1)

    # the goodput ledger: the learner's own waits for rollouts and its weight syncs, as the
    # spans measured them (its steps on their own), and the run's weight sync
    goodput = json.loads((out / "summary.json").read_text())["goodput"]
    own = goodput["scopes"]["rl/learner"]
    waited = sum(c["rollout_queue_wait"]["blocked_time_sec"] for c in _comps(learner))
    synced = sum(c["weight_sync"]["busy_time_sec"] for c in _comps(learner))
    assert own["rollout_wait"] == pytest.approx(waited, rel=1e-6)
    assert own["weight_sync"] == pytest.approx(synced, rel=1e-6)
    bad = goodput["badput_sec"]
    assert bad["weight_sync"] == pytest.approx(synced, rel=1e-6)
    # the run: a wait counts only while the actor computed nothing
    assert 0 <= bad["rollout_wait"] <= waited
    assert goodput["productive_time_sec"] + sum(bad.values()) == pytest.approx(
        goodput["wall_time_sec"], rel=1e-9
    )


def _comps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["components"] for r in steps]


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


def test_reward_is_one_for_the_right_count_and_answer() -> None:
    import torch

    eos, pad = demo_rl.EOS, demo_rl.PAD
    assert demo_rl.target(7, 4) == [8, 9, 0, 1, 2, eos]  # the chain wraps; answer 2
    assert demo_rl.target(0, 2) == [1, 2, 3, eos]
    tokens = torch.tensor(
        [
            [7, 8, 9, 0, 1, 2, eos],  # right
            [7, 8, 9, 0, 1, 5, eos],  # wrong answer
            [7, 8, 9, 1, 1, 2, eos],  # wrong chain
            [7, 8, 9, 0, 1, 2, 3],  # no end
            [7, 8, eos, pad, pad, pad, pad],  # stopped early
        ]
    )
    assert demo_rl.reward_fn(tokens, 4).tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    # what the learner trains on: up to and with the end token
    assert demo_rl.completion_mask(tokens).tolist() == [
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1],
        [1, 1, 0, 0, 0, 0],
    ]


def test_supervised_warm_start_teaches_the_chain_not_the_answer() -> None:
    import torch

    cfg = demo_rl.RLDemoConfig(chain=6)
    gen = torch.Generator().manual_seed(0)
    batch = demo_rl.sft_batch(cfg, gen, size=200)
    for row in batch.tolist():
        assert row[1:7] == demo_rl.target(row[0], 6)[:6] and row[-1] == demo_rl.EOS
    answers = batch[:, 7]
    assert len(set(answers.tolist())) == 10  # random answers: the data shows no rule
    right = (batch[:, 0] + 7) % 10
    assert (answers == right).float().mean() < 0.2
    torch.manual_seed(0)
    policy = demo_rl._policy(cfg)
    losses = demo_rl.warm_start(policy, cfg)
    assert len(losses) == cfg.sft_steps and losses[-1] < losses[0] / 5
    with torch.no_grad():
        table = demo_rl._logp_table(policy, demo_rl.sft_batch(cfg, gen, size=100)).exp()
    chain_p = table[:, :6].max(-1).values  # the next digit of the count: nearly sure
    answer_p = table[:, 6, :10]  # the answer: a guess among the ten digits
    assert chain_p.min() > 0.9
    assert answer_p.max() < 0.3 and answer_p.sum(-1).min() > 0.9


def test_generation_stops_each_completion_at_its_end_token() -> None:
    import torch

    cfg = demo_rl.RLDemoConfig(group_size=16, chain=4)
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
        again = demo_rl._pick(demo_rl._logp_table(model, tokens), tokens) * mask
    assert torch.allclose(again, logps, atol=1e-5)
    assert ttft > 0 and tpot > 0


def _alerts(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "alerts.jsonl"
    return read_jsonl(path) if path.exists() else []


def _learner_rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = [
        m for m in read_jsonl(run_dir / "metrics.jsonl") if "rewards/mean" in m.get("metrics", {})
    ]
    return [{"step": m["step"], **m["metrics"]} for m in rows]


# The step-time rule reads wall time, which on a shared machine is the neighbours' as much as
# the run's: the health rules are what these runs are about.
_TIMING_RULES = {"step_time_spike"}


@pytest.mark.slow
def test_default_run_learns_in_the_healthy_ranges_and_raises_no_alert(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["--output-dir", str(out), "--no-progress", "--console-interval", "0"]
    assert demo_rl.main(args) == 0
    rows = _learner_rows(out)
    assert [r["step"] for r in rows] == list(range(150))
    reward = [r["rewards/mean"] for r in rows]
    first, last = sum(reward[:15]) / 15, sum(reward[-15:]) / 15
    # the supervised start guesses the answer (1 in 10); GRPO teaches it
    assert first < 0.2 and last >= 0.5, (first, last)
    assert max(r["kl"] for r in rows) < 0.05  # Signal's "normal" KL, per token
    assert max(r["pg_clipfrac"] for r in rows) < 0.1
    assert all(r["learning_rate"] <= 3e-3 for r in rows)
    health = [a for a in _alerts(out) if a["tunix.alert.rule"] not in _TIMING_RULES]
    assert health == []


@pytest.mark.slow
def test_lr_blowup_fault_fires_the_kl_and_clip_alerts_after_its_step(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["--output-dir", str(out), "--no-progress", "--console-interval", "0"]
    assert demo_rl.main([*args, "--steps", "40", "--fault", "lr-blowup@30"]) == 0
    rows = _learner_rows(out)
    lr = [r["learning_rate"] for r in rows]
    assert lr[30] == pytest.approx(100 * lr[29]) and lr[-1] == lr[30]
    fired = [
        (a["tunix.alert.rule"], a["tunix.alert.severity"], a["tunix.alert.step"])
        for a in _alerts(out)
        if a["tunix.alert.rule"] not in _TIMING_RULES and a["tunix.alert.severity"] != "ok"
    ]
    assert fired and min(step for _, _, step in fired) >= 30, fired  # nothing before the fault
    # the first batches trained after the blow-up: the policy leaves its reference at once
    kl = [(step, sev) for rule, sev, step in fired if rule == "kl_divergence"]
    assert kl[0] == (kl[0][0], "critical") and kl[0][0] <= 32, fired
    assert any(rule == "clip_fraction" and sev == "critical" for rule, sev, _ in fired), fired
    reward = [r["rewards/mean"] for r in rows]
    assert sum(reward[-5:]) / 5 < sum(reward[25:30]) / 5  # and the reward falls


def test_fault_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo_rl.Fault.parse("lr-blowup@12") == demo_rl.Fault("lr-blowup", 12)
    for bad in ("lr-blowup", "lr-blowup@-1", "nan-loss@3", "@3"):
        with pytest.raises(ValueError, match="lr-blowup"):
            demo_rl.Fault.parse(bad)
    with pytest.raises(SystemExit) as exc:
        demo_rl.main(["--fault", "lr-blowup@x"])
    assert exc.value.code == 2 and "--fault must be <kind>@<step>" in capsys.readouterr().err
