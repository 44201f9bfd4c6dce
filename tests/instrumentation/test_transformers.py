"""otel_tunix.instrumentation.transformers on real Trainer / TRL runs of tiny models on CPU
(built from configs in the test: nothing is downloaded)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import otel_tunix  # noqa: E402
from otel_tunix.instrumentation import transformers as otf  # noqa: E402
from otel_tunix.settings import attributes as attr  # noqa: E402
from otel_tunix.testing import capture  # noqa: E402


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


class TokenDataset(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, n: int, vocab: int = 64, length: int = 16) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def tiny_gpt2() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def trainer(tmp_path: Path, *, callbacks: list[Any] | None = None, **overrides: Any) -> Any:
    from transformers import Trainer, TrainingArguments

    kwargs: dict[str, Any] = dict(
        output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=2,
        gradient_accumulation_steps=2, logging_steps=1, eval_strategy="steps", eval_steps=2,
        per_device_eval_batch_size=4, save_strategy="steps", save_steps=2, save_only_model=True,
        report_to=[], use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    kwargs.update(overrides)
    return Trainer(
        model=tiny_gpt2(),
        args=TrainingArguments(**kwargs),
        train_dataset=TokenDataset(32),
        eval_dataset=TokenDataset(8),
        callbacks=callbacks,
    )


def _parents(spans: list[Any]) -> dict[int, str | None]:
    by_id = {s.context.span_id: s.name for s in spans}
    return {s.context.span_id: by_id.get(s.parent.span_id) if s.parent else None for s in spans}


def test_instrument_trainer_without_configure_configures_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    monkeypatch.setenv("OTEL_SERVICE_NAME", "hf-run")
    monkeypatch.setenv("OTEL_TUNIX_OUTPUT_DIR", str(tmp_path / "run"))
    tr = otf.instrument_trainer(trainer(tmp_path, max_steps=2, eval_strategy="no"))
    assert otel_tunix.current_run() is None  # nothing configured yet
    tr.train()
    run = otel_tunix.current_run()
    assert run is not None and run.output_dir == tmp_path / "run"
    otel_tunix.shutdown()
    otf.uninstrument_trainer(tr)
    otf.ott.uninstrument_model(tr.model)  # the callback instrumented it (torch's backward)
    lines = [json.loads(x) for x in (tmp_path / "run" / "spans.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["type"] == "step" and x["scope"] == "train"]
    assert [x["step"] for x in steps] == [0, 1]
    assert lines[0]["resource"]["service.name"] == "hf-run"


@pytest.mark.slow
def test_trainer_steps_components_and_metrics(tmp_path: Path) -> None:
    with capture() as cap:
        tr = otf.instrument_trainer(trainer(tmp_path))
        assert otf.instrument_trainer(tr) is tr  # idempotent
        tr.train()
        spans = cap.spans()
        metrics = cap.metrics()
        logged = dict(otel_tunix.get_metrics_logger().last_values)
    parent = _parents(spans)
    train = [s for s in spans if s.attributes.get(attr.SCOPE) == "train"]
    assert [s.attributes[attr.STEP] for s in train if s.name == "train_step"] == [0, 1, 2, 3]
    step1 = [s.name for s in train if s.attributes[attr.STEP] == 1]
    assert step1 == [
        "train_data_load",
        "train_step_compute",
        "micro_batch_step",
        "forward",
        "backward",
        "micro_batch_step",
        "forward",
        "backward",
        "optimizer_step",
        "evaluate",
        "checkpoint_save",
        "train_step",
    ]
    assert [s.name for s in train if s.attributes[attr.STEP] == 0][-1] == "train_step"
    assert "checkpoint_save" not in [s.name for s in train if s.attributes[attr.STEP] == 0]
    for s in train:
        expected = {
            "train_data_load": "train_step",
            "train_step_compute": "train_step",
            "micro_batch_step": "train_step_compute",
            "forward": "micro_batch_step",
            "backward": "micro_batch_step",
            "optimizer_step": "train_step_compute",
            "evaluate": "train_step",
            "checkpoint_save": "train_step",
            "train_step": None,
        }[s.name]
        assert parent[s.context.span_id] == expected, s.name
    # two evaluations of 8 samples in batches of 4: eval steps 0..3 inside "evaluate"
    evals = [s for s in spans if s.name == "eval_step"]
    assert [s.attributes[attr.STEP] for s in evals] == [0, 1, 2, 3]
    assert all(parent[s.context.span_id] == "evaluate" for s in evals)
    eval_children = [s.name for s in spans if s.attributes.get(attr.SCOPE) == "eval"]
    assert eval_children[:4] == ["eval_data_load", "eval_step_compute", "forward", "eval_step"]
    assert (tmp_path / "out" / "checkpoint-2").is_dir()
    # the eval scope's rate counts its own time, not the training between evaluations:
    # against the time inside Trainer.evaluate (which also builds its loader and metrics)
    evaluating = sum(s.end_time - s.start_time for s in spans if s.name == "evaluate") / 1e9
    session = next(x for x in cap.sessions if x.scope == "eval")
    assert 4 / evaluating <= session.steps_per_sec <= 2 * 4 / evaluating
    # derived counters: micro-batches and forward passes per step, busy <= step time
    [s1] = [x for x in cap.summaries if x.scope == "train" and x.step == 1]
    assert s1.components["forward"].count == 2
    assert s1.components["micro_batch_step"].count == 2
    assert 0 < s1.busy_time_sec <= s1.step_time_sec
    assert s1.components["checkpoint_save"].busy_time_sec > 0
    # on_log values: MetricsLogger scalars (Tunix names) and OTel gauges
    assert math.isfinite(logged["loss"]) and logged["perplexity"] == pytest.approx(
        math.exp(logged["loss"])
    )
    assert {"grad_norm", "learning_rate", "eval/loss", "train/runtime_sec"} <= set(logged)
    loss = {p.attributes["tunix.training.mode"]: p.value for p in metrics["tunix.training.loss"]}
    assert loss == pytest.approx({"train": logged["loss"], "eval": logged["eval/loss"]})
    assert {"tunix.step.duration", "tunix.component.busy_time"} <= set(metrics)


@pytest.mark.slow
def test_callback_alone_and_uninstrument(tmp_path: Path) -> None:
    with capture() as cap:
        tr = trainer(
            tmp_path,
            callbacks=[otf.OtelTunixCallback()],
            max_steps=2,
            gradient_accumulation_steps=1,
            eval_strategy="no",
            save_strategy="no",
        )
        tr.train()
        spans = cap.spans()
    names = [s.name for s in spans if s.attributes[attr.STEP] == 1]
    # no data wait (the callback alone cannot see the fetch), no micro-batch spans
    assert names == ["train_step_compute", "forward", "backward", "optimizer_step", "train_step"]

    tr2 = otf.instrument_trainer(trainer(tmp_path, max_steps=1, eval_strategy="no"))
    otf.uninstrument_trainer(tr2)
    assert not hasattr(tr2, "_otel_tunix_callback")
    assert "get_batch_samples" not in vars(tr2)
    assert not any(isinstance(cb, otf.OtelTunixCallback) for cb in tr2.callback_handler.callbacks)


def test_metric_names_map_onto_ours() -> None:
    grpo = {
        "loss": 0.5, "reward": 1.5, "reward_std": 0.25, "rewards/accuracy/mean": 0.75,
        "rewards/accuracy/std": 0.1, "kl": 0.01, "entropy": 2.0, "clip_ratio/region_mean": 0.05,
        "clip_ratio/low_mean": 0.0, "completions/mean_length": 12.0, "num_tokens": 300.0,
        "eval_loss": 0.7, "eval_runtime": 1.5, "train_samples_per_second": 9.0,
        "learning_rate": torch.tensor(1e-5), "note": "text", "flag": True,
    }  # fmt: skip
    out = otf.map_metrics(grpo)
    assert out == {
        "loss": 0.5,
        "rewards/mean": 1.5,
        "rewards/std": 0.25,
        "rewards/accuracy": 0.75,
        "rewards/accuracy/std": 0.1,
        "kl": 0.01,
        "loss/entropy": 2.0,
        "pg_clipfrac": 0.05,
        "clip_ratio/low_mean": 0.0,
        "completions/mean_length": 12.0,
        "tokens/total": 300.0,
        "eval/loss": 0.7,
        "eval/runtime_sec": 1.5,
        "train/samples_per_sec": 9.0,
        "learning_rate": pytest.approx(1e-5),
    }  # fmt: skip  (RL losses are not NLL: no perplexity next to a reward)
    ppo = otf.map_metrics(
        {"objective/kl": 0.2, "objective/entropy": 3.0, "objective/rlhf_reward": 1.0,
         "objective/scores": 0.5, "policy/clipfrac_avg": 0.1, "val/clipfrac_avg": 0.2,
         "loss/policy_avg": -0.1, "loss/value_avg": 0.3, "policy/entropy_avg": 2.5}
    )  # fmt: skip
    assert ppo == {
        "kl": 0.2, "loss/entropy": 3.0, "rewards/mean": 1.0, "rewards/score/mean": 0.5,
        "pg_clipfrac": 0.1, "vf_clipfrac": 0.2, "loss/policy": -0.1, "loss/value": 0.3,
        "policy/entropy": 2.5,
    }  # fmt: skip
    sft = otf.map_metrics({"loss": 2.0, "grad_norm": 1.0})
    assert sft["perplexity"] == pytest.approx(math.exp(2.0))


def _tiny_tokenizer_and_model(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i + 2 for i in range(30)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(vocab),
            n_positions=32,
            n_embd=16,
            n_layer=1,
            n_head=2,
            bos_token_id=1,
            eos_token_id=1,
            pad_token_id=0,
        )
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


@pytest.mark.slow
def test_trl_grpo_rollout_reward_reference_and_rl_metrics(tmp_path: Path) -> None:
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from transformers import AutoTokenizer

    model_dir = tmp_path / "tiny"
    _tiny_tokenizer_and_model(model_dir)

    def reward_len(completions: list[str], **kwargs: Any) -> list[float]:
        return [float(len(c.split())) for c in completions]

    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "grpo"), max_steps=2, per_device_train_batch_size=4,
        num_generations=2, max_completion_length=4, logging_steps=1, report_to=[],
        use_cpu=True, disable_tqdm=True, save_strategy="no", beta=0.1,
    )  # fmt: skip
    prompts = datasets.Dataset.from_dict({"prompt": [f"t{i} t{i + 1}" for i in range(8)]})
    with capture() as cap:
        tr = trl.GRPOTrainer(
            model=str(model_dir),
            reward_funcs=reward_len,
            args=args,
            train_dataset=prompts,
            processing_class=AutoTokenizer.from_pretrained(model_dir),
        )
        otf.instrument_trainer(tr)
        tr.train()
        spans = cap.spans()
        logged = dict(otel_tunix.get_metrics_logger().last_values)
    # the steps tile TRL's own training time (its train_runtime, logged at the end)
    train = [s for s in cap.summaries if s.scope == "train"]
    assert len(train) == 2
    runtime = logged["train/runtime_sec"]
    # (TRL rounds it to 0.1 ms)
    assert sum(s.step_time_sec for s in train) == pytest.approx(runtime, rel=0.02)
    session = next(s for s in cap.sessions if s.scope == "train")
    assert session.wall_time_sec == pytest.approx(runtime, rel=0.02)
    parent = _parents(spans)
    step0 = [s for s in spans if s.attributes[attr.STEP] == 0]
    names = [s.name for s in step0]
    assert names[0] == "train_data_load" and names[-1] == "train_step"
    for name in ("rollout", "reward", "reference_inference", "forward", "backward"):
        assert name in names, name
        span = next(s for s in step0 if s.name == name)
        assert parent[span.context.span_id] == "train_step_compute", name
    # generation's per-token forward calls are inside "rollout", not spans of their own
    assert names.count("forward") == 1
    assert {"rewards/mean", "rewards/std", "rewards/reward_len", "kl", "loss/entropy"} <= set(
        logged
    )
    assert "completions/mean_length" in logged and "perplexity" not in logged


@pytest.mark.slow
def test_trainer_checkpoints_and_evaluation_are_their_goodput_categories(tmp_path: Path) -> None:
    """A tiny Trainer run with ``save_steps`` and evaluation: the live ledger's
    ``checkpoint_save`` and ``evaluation`` are the time of the trainer's ``_save_checkpoint``
    and ``evaluate`` as their spans measured it, and productive plus badput is the wall time."""
    import json

    out = tmp_path / "run"
    otel_tunix.configure(output_dir=out, run_id="hf-goodput", system_metrics=False)
    try:
        otf.instrument_trainer(trainer(tmp_path)).train()
    finally:
        otel_tunix.shutdown()
    lines = [json.loads(x) for x in (out / "spans.jsonl").read_text().splitlines() if x.strip()]
    spans = [s for r in lines if r.get("type") == "step" for s in r["spans"]]

    def seconds(name: str) -> float:
        return sum(s["end_ns"] - s["start_ns"] for s in spans if s["name"] == name) / 1e9

    goodput = json.loads((out / "summary.json").read_text())["goodput"]
    bad = goodput["badput_sec"]
    assert seconds("checkpoint_save") > 0 and seconds("evaluate") > 0
    assert bad["checkpoint_save"] == pytest.approx(seconds("checkpoint_save"), abs=1e-6)
    # the eval steps run inside Trainer.evaluate: its time, once
    assert bad["evaluation"] == pytest.approx(seconds("evaluate"), abs=1e-6)
    assert goodput["productive_time_sec"] > 0
    assert goodput["productive_time_sec"] + sum(bad.values()) == pytest.approx(
        goodput["wall_time_sec"], rel=1e-9
    )
