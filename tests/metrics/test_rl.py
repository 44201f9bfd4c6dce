"""RL metrics from numpy / torch / JAX arrays, checked against numpy, with transfer counts."""

from __future__ import annotations

import json
import math
import queue
import threading
import time

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from otel_tunix.metrics import rl

RNG = np.random.default_rng(0)
B, T = 8, 12


@pytest.fixture
def batch():
    mask = np.zeros((B, T), dtype=bool)
    lengths = RNG.integers(3, T + 1, size=B)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    return {
        "rewards": RNG.normal(size=B),
        "fmt": RNG.integers(0, 2, size=B).astype(float),
        "acc": RNG.random(B),
        "scores": RNG.normal(size=B),
        "advantages": RNG.normal(size=(B, T)),
        "returns": RNG.normal(size=(B, T)),
        "values": RNG.normal(size=(B, T)),
        "mask": mask,
        "lengths": lengths,
    }


def _np_stats(x, prefix, stats=("mean", "std", "max", "min")):
    f = {"sum": np.sum, "mean": np.mean, "std": np.std, "max": np.max, "min": np.min}
    return {f"{prefix}/{s}": f[s](x) for s in stats}


def test_reward_metrics_match_numpy(batch):
    got = rl.reward_metrics(
        batch["rewards"], reward_fns={"format": batch["fmt"], "accuracy": batch["acc"]},
        scores=batch["scores"], kl_penalty=np.full((B, T), 0.01),
    )  # fmt: skip
    want = _np_stats(batch["rewards"], "rewards", ("sum", "mean", "std", "max", "min"))
    want |= _np_stats(batch["scores"], "score", ("mean", "max", "min"))
    want |= {"rewards/format": batch["fmt"].mean(), "rewards/accuracy": batch["acc"].mean()}
    want["reward_kl_penalty"] = 0.01
    assert got == pytest.approx(want)
    assert all(isinstance(v, float) for v in got.values())


def test_token_rewards_are_summed_per_trajectory():
    r = np.array([[1.0, 2.0, 0.0], [0.5, 0.5, 0.5]])
    got = rl.reward_metrics(r)
    assert got["rewards/mean"] == pytest.approx((3.0 + 1.5) / 2)
    assert got["rewards/sum"] == pytest.approx(4.5)
    assert got["rewards/max"] == 3.0


def test_a_reward_function_named_like_a_statistic_is_refused():
    with pytest.raises(ValueError, match="collides"):
        rl.reward_metrics([1.0], reward_fns={"mean": [1.0]})


def test_value_metrics_use_only_masked_tokens(batch):
    m = batch["mask"]
    got = rl.value_metrics(
        values=batch["values"], returns=batch["returns"], advantages=batch["advantages"], mask=m
    )
    want = (
        _np_stats(batch["advantages"][m], "advantages")
        | _np_stats(batch["returns"][m], "returns")
        | _np_stats(batch["values"][m], "values")
    )
    v, r = batch["values"][m], batch["returns"][m]
    want["explained_variance"] = 1 - np.var(r - v) / np.var(r)
    assert got == pytest.approx(want)


def test_explained_variance_formula():
    returns = np.array([1.0, 2.0, 3.0, 4.0])
    assert rl.explained_variance(returns, returns) == 1.0  # perfect critic
    assert rl.explained_variance(np.full(4, returns.mean()), returns) == pytest.approx(0.0)
    values = np.array([1.5, 1.5, 3.5, 3.5])
    # Var(returns) = 1.25; residuals [-.5, .5, -.5, .5] have variance 0.25 -> 1 - 0.2 = 0.8
    assert rl.explained_variance(values, returns) == pytest.approx(0.8)
    assert rl.explained_variance(-returns, returns) < 0  # worse than the mean
    assert math.isnan(rl.explained_variance([1.0, 2.0], [3.0, 3.0]))  # no variance
    mask = np.array([True, True, False, False])
    assert rl.explained_variance(values, returns, mask=mask) == pytest.approx(
        1 - np.var(returns[:2] - values[:2]) / np.var(returns[:2])
    )


def test_clip_fractions_and_kl_estimators():
    ratio = np.array([0.7, 0.9, 1.0, 1.1, 1.25, 1.3])
    assert rl.pg_clip_fraction(ratio, 0.2) == pytest.approx(3 / 6)  # 0.7, 1.25, 1.3
    assert rl.pg_clip_fraction(ratio, 0.2, mask=[1, 1, 1, 1, 0, 0]) == pytest.approx(1 / 4)
    v = np.array([1.0, 2.0, 0.0])
    old = np.array([0.0, 1.9, 0.0])
    ret = np.array([1.0, 2.0, 1.0])
    # clipped value: [0.2, 2.0, 0.0] (eps 0.2): (0.2-1)^2 > 0, 0 == 0, 1 == 1 -> 1/3
    assert rl.vf_clip_fraction(v, old, ret, 0.2) == pytest.approx(1 / 3)
    lp = np.log(np.array([0.5, 0.2, 0.9]))
    ref = np.log(np.array([0.4, 0.3, 0.9]))
    d = lp - ref
    assert rl.approx_kl(lp, ref, estimator="k1") == pytest.approx(d.mean())
    assert rl.approx_kl(lp, ref, estimator="k2") == pytest.approx((0.5 * d**2).mean())
    assert rl.approx_kl(lp, ref) == pytest.approx((np.exp(-d) - 1 + d).mean())
    with pytest.raises(ValueError):
        rl.approx_kl(lp, ref, estimator="k9")  # type: ignore[arg-type]


def test_completion_metrics_from_lengths_or_a_mask(batch):
    got = rl.completion_metrics(mask=batch["mask"], max_length=T)
    n = batch["lengths"]
    assert got == pytest.approx({
        "completions/mean_length": n.mean(), "completions/max_length": n.max(),
        "completions/min_length": n.min(), "completions/clipped_ratio": np.mean(n >= T),
    })  # fmt: skip
    assert rl.completion_metrics([4, 6]) == {
        "completions/mean_length": 5.0, "completions/max_length": 6.0,
        "completions/min_length": 4.0,
    }  # fmt: skip
    assert rl.completion_metrics() == {}


def test_rl_metrics_in_one_call_equals_the_parts(batch):
    got = rl.rl_metrics(
        rewards=batch["rewards"], reward_fns={"fmt": batch["fmt"]}, scores=batch["scores"],
        advantages=batch["advantages"], returns=batch["returns"], values=batch["values"],
        mask=batch["mask"], completion_mask=batch["mask"], max_completion_length=T,
        pg_clipfrac=0.2, vf_clipfrac=np.float32(0.1), entropy=torch.tensor(1.5), kl=0.03,
        policy_loss=-0.5, value_loss=0.25, actor_dequeue_time=0.01,
    )  # fmt: skip
    want = rl.reward_metrics(batch["rewards"], reward_fns={"fmt": batch["fmt"]},
                             scores=batch["scores"])  # fmt: skip
    want |= rl.value_metrics(values=batch["values"], returns=batch["returns"],
                             advantages=batch["advantages"], mask=batch["mask"])  # fmt: skip
    want |= rl.completion_metrics(mask=batch["mask"], max_length=T)
    want |= {"pg_clipfrac": 0.2, "vf_clipfrac": 0.1, "loss/entropy": 1.5, "kl": 0.03,
             "policy_loss": -0.5, "value_loss": 0.25, "actor_dequeue_time": 0.01}  # fmt: skip
    assert got == pytest.approx(want, rel=1e-6)
    with pytest.raises(TypeError, match="klx"):
        rl.rl_metrics(klx=1.0)


class _HostTransfers(TorchFunctionMode):
    """Counts the torch calls that move data to the host (or read one element)."""

    NAMES = ("cpu", "numpy", "item", "tolist", "to")

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.NAMES:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def test_torch_arrays_cross_to_the_host_once_each(batch):
    t = {k: torch.as_tensor(v) for k, v in batch.items() if k != "lengths"}
    with _HostTransfers() as mode:
        got = rl.rl_metrics(
            rewards=t["rewards"], advantages=t["advantages"], returns=t["returns"],
            values=t["values"], mask=t["mask"], completion_mask=t["mask"],
            kl=torch.tensor(0.02),
        )  # fmt: skip
    # 6 arrays (mask given twice counts twice) + 1 scalar: one .cpu() each, no .item()
    assert mode.calls.count("cpu") == 7
    assert "item" not in mode.calls and "tolist" not in mode.calls
    assert len(got) == 5 + 12 + 1 + 3 + 1  # rewards, adv/ret/val, ev, lengths, kl
    numpy_got = rl.rl_metrics(
        rewards=batch["rewards"], advantages=batch["advantages"], returns=batch["returns"],
        values=batch["values"], mask=batch["mask"], completion_mask=batch["mask"], kl=0.02,
    )  # fmt: skip
    assert got == pytest.approx(numpy_got)


def test_bfloat16_tensors_are_widened_on_the_device():
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    assert rl.array_stats(x, "advantages") == pytest.approx(
        {"advantages/mean": 2.0, "advantages/std": np.std([1, 2, 3]), "advantages/max": 3.0,
         "advantages/min": 1.0}
    )  # fmt: skip


def test_jax_arrays_are_fetched_in_one_device_get(monkeypatch):
    jax = pytest.importorskip("jax")
    calls = []
    real = jax.device_get
    monkeypatch.setattr(jax, "device_get", lambda x: calls.append(len(x)) or real(x))
    a = jax.numpy.arange(6.0).reshape(2, 3)
    got = rl.rl_metrics(advantages=a, returns=a, values=a * 0.5, kl=jax.numpy.float32(0.1))
    assert calls == [4]
    assert got["advantages/mean"] == pytest.approx(2.5)
    assert got["kl"] == pytest.approx(0.1)


def test_empty_selection_gives_no_metric():
    assert rl.array_stats([1.0, 2.0], "values", mask=[False, False]) == {}


def test_texts_never_reach_metric_backends_and_go_to_local_jsonl_only_when_opted_in(tmp_path):
    off = rl.SampleWriter(tmp_path / "off.jsonl")
    assert off.write(0, ["p"], ["c"]) == 0
    assert not (tmp_path / "off.jsonl").exists()
    on = rl.SampleWriter(tmp_path / "samples.jsonl", enabled=True, max_chars=4)
    assert on.write(3, ["prompt one", "p2"], ["completion", "c2"], rewards=np.array([1.0, 0.0]),
                    trajectory_ids=["a", "b"]) == 2  # fmt: skip
    on.close()
    lines = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert lines == [
        {"step": 3, "index": 0, "prompt": "prom", "completion": "comp", "reward": 1.0,
         "trajectory_id": "a"},
        {"step": 3, "index": 1, "prompt": "p2", "completion": "c2", "reward": 0.0,
         "trajectory_id": "b"},
    ]  # fmt: skip
    # the metric helpers only ever return numbers
    metrics = rl.rl_metrics(rewards=[1.0, 0.0], completion_lengths=[3, 5])
    assert all(isinstance(v, float) for v in metrics.values())


def test_sample_writer_defaults_to_the_run_folder(tmp_path):
    from otel_tunix.testing import capture

    with capture(output_dir=tmp_path / "run"):
        w = rl.SampleWriter(enabled=True)
        w.write(0, ["p"], ["c"])
        w.close()
    assert (tmp_path / "run" / "samples.jsonl").read_text().count("\n") == 1
    with capture():  # no run folder: nothing is written anywhere
        assert rl.SampleWriter(enabled=True).write(0, ["p"], ["c"]) == 0


def test_timed_get_measures_the_wait():
    q: queue.Queue[int] = queue.Queue()
    threading.Timer(0.05, q.put, args=(7,)).start()
    item, waited = rl.timed_get(q)
    assert item == 7 and 0.04 <= waited < 1.0
    q.put(8)
    t0 = time.perf_counter()
    assert rl.timed_get(q)[0] == 8 and time.perf_counter() - t0 < 0.5  # did not wait


def test_sample_writer_names_the_file_per_rank_in_a_distributed_job(tmp_path, monkeypatch):
    from otel_tunix.testing import capture

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with capture(output_dir=tmp_path / "run"):
        w = rl.SampleWriter(enabled=True)
        assert w.write(0, ["p"], ["c"]) == 1
        w.close()
    assert (tmp_path / "run" / "samples-rank1.jsonl").exists()
