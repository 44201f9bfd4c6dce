"""RL metrics from arrays (numpy, JAX, torch): rewards, advantages, values, KL, lengths.

Every helper returns ``{MetricsLogger name: float}`` with the names Tunix, TRL and Signal
users know (see the catalog for the OTel side)::

    from otel_tunix.metrics import rl

    metrics = rl.rl_metrics(
        rewards=rewards, reward_fns={"format": r_fmt, "math": r_math},
        advantages=adv, returns=ret, values=vals, mask=response_mask,
        completion_mask=response_mask, max_completion_length=512,
        pg_clipfrac=clipfrac, kl=kl, entropy=entropy, policy_loss=pl, value_loss=vl,
    )
    otel_tunix.get_metrics_logger().log_dict(metrics, step=n)

**Device syncs.** Each array crosses to the host once, whatever number of statistics is
taken from it (:func:`to_host`; JAX arrays of one call in a single ``jax.device_get``); the
statistics are then computed by numpy on the host. A 0-d device scalar is one transfer too.

**Texts.** Prompts and completions never go to metric backends: these helpers return numbers
only. :class:`SampleWriter` writes them to a local JSONL file, and only when the user turns
it on.
"""

from __future__ import annotations

import json
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from otel_tunix.recording.current_run import get_current

__all__ = [
    "SampleWriter",
    "approx_kl",
    "array_stats",
    "completion_metrics",
    "explained_variance",
    "pg_clip_fraction",
    "reward_metrics",
    "rl_metrics",
    "timed_get",
    "to_host",
    "value_metrics",
    "vf_clip_fraction",
]

Stat = Literal["sum", "mean", "std", "max", "min"]
_STATS: tuple[Stat, ...] = ("mean", "std", "max", "min")
_REWARD_STATS: tuple[Stat, ...] = ("sum", "mean", "std", "max", "min")

_SCALAR_NAMES: Mapping[str, str] = {
    "pg_clipfrac": "pg_clipfrac",
    "vf_clipfrac": "vf_clipfrac",
    "entropy": "loss/entropy",
    "policy_loss": "policy_loss",
    "value_loss": "value_loss",
    "kl": "kl",
    "actor_dequeue_time": "actor_dequeue_time",
}
"""Keyword of :func:`rl_metrics` -> MetricsLogger name, for values given as scalars."""


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def _is_jax(x: Any) -> bool:
    mod = type(x).__module__
    return (mod.startswith(("jax", "jaxlib"))) and hasattr(x, "addressable_shards")


def _torch_to_numpy(x: Any) -> np.ndarray:
    torch = sys.modules["torch"]
    t = x.detach()
    if t.dtype == torch.bfloat16 or "float8" in str(t.dtype):
        t = t.to(torch.float32)  # on the device: numpy has no bfloat16 / float8
    return np.asarray(t.cpu().numpy())


def to_host(*arrays: Any) -> list[np.ndarray | None]:
    """numpy copies of the arrays, with one device-to-host transfer per array.

    Accepts numpy arrays, torch tensors (any device), JAX arrays (all of one call fetched by one
    ``jax.device_get``), Python numbers and sequences. ``None`` stays ``None``. bfloat16 and
    float8 are widened to float32 (on the device for torch, on the host for JAX).
    """
    out: list[np.ndarray | None] = [None] * len(arrays)
    jax_idx: list[int] = []
    for i, x in enumerate(arrays):
        if x is None:
            continue
        if isinstance(x, np.ndarray):
            out[i] = x
        elif _is_torch(x):
            out[i] = _torch_to_numpy(x)
        elif _is_jax(x):
            jax_idx.append(i)
        else:
            out[i] = np.asarray(x)
    if jax_idx:
        import jax

        fetched = jax.device_get([arrays[i] for i in jax_idx])
        for i, a in zip(jax_idx, fetched, strict=True):
            arr = np.asarray(a)
            if arr.dtype.kind == "V" or arr.dtype.name == "bfloat16" or "float8" in arr.dtype.name:
                arr = arr.astype(np.float32)
            out[i] = arr
    return out


def _masked(x: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if mask is None:
        return x.ravel()
    m = np.asarray(mask).astype(bool)
    if m.shape != x.shape:
        m = np.broadcast_to(m, x.shape)
    selected: np.ndarray = x[m]
    return selected


def _stats_of(flat: np.ndarray, prefix: str, stats: Sequence[Stat]) -> dict[str, float]:
    if flat.size == 0:
        return {}
    fns: dict[str, Callable[[np.ndarray], Any]] = {
        "sum": np.sum,
        "mean": np.mean,
        "std": np.std,
        "max": np.max,
        "min": np.min,
    }
    return {f"{prefix}/{s}": float(fns[s](flat)) for s in stats}


def array_stats(
    x: Any, prefix: str, *, stats: Sequence[Stat] = _STATS, mask: Any = None
) -> dict[str, float]:
    """``{prefix}/{stat}`` of an array over the entries where ``mask`` is true.

    ``std`` is the population standard deviation. An empty selection gives ``{}``.
    """
    host, m = to_host(x, mask)
    assert host is not None
    return _stats_of(_masked(host, m), prefix, stats)


def _per_sequence(rewards: np.ndarray) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    return r.sum(axis=-1) if r.ndim > 1 else r.ravel()


def _reward_part(
    rewards: np.ndarray | None,
    fns: Mapping[str, np.ndarray],
    scores: np.ndarray | None,
    kl_penalty: np.ndarray | None,
) -> dict[str, float]:
    out: dict[str, float] = {}
    if rewards is not None:
        out.update(_stats_of(_per_sequence(rewards), "rewards", _REWARD_STATS))
    for name, r in fns.items():
        if name in _REWARD_STATS:
            raise ValueError(f"reward function name {name!r} collides with rewards/{name}")
        flat = _per_sequence(r)
        if flat.size:
            out[f"rewards/{name}"] = float(flat.mean())
    if scores is not None:
        out.update(_stats_of(_per_sequence(scores), "score", ("mean", "max", "min")))
    if kl_penalty is not None:
        flat = np.asarray(kl_penalty, dtype=np.float64).ravel()
        if flat.size:
            out["reward_kl_penalty"] = float(flat.mean())
    return out


def reward_metrics(
    rewards: Any = None,
    *,
    reward_fns: Mapping[str, Any] | None = None,
    scores: Any = None,
    kl_penalty: Any = None,
) -> dict[str, float]:
    """``rewards/{sum,mean,std,max,min}``, ``rewards/<fn>``, ``score/*``, ``reward_kl_penalty``.

    Args:
        rewards: Reward per sequence (1-d); a 2-d array of token rewards is summed over its
            last axis first (one return per trajectory).
        reward_fns: Per reward function, its rewards per sequence; ``rewards/<name>`` is
            their mean. A name equal to a statistic (``mean``...) is refused.
        scores: Raw reward-model scores (before the KL penalty): ``score/{mean,max,min}``.
        kl_penalty: The KL penalty subtracted from the rewards (any shape): its mean.

    Raises:
        ValueError: a reward function is named ``sum``, ``mean``, ``std``, ``max``, ``min``.
    """
    names = list(reward_fns or {})
    host = to_host(rewards, scores, kl_penalty, *(reward_fns or {}).values())
    fns = {n: h for n, h in zip(names, host[3:], strict=True) if h is not None}
    return _reward_part(host[0], fns, host[1], host[2])


def _ev(values: np.ndarray, returns: np.ndarray) -> float:
    var = float(np.var(returns))
    if var == 0.0 or not math.isfinite(var):
        return math.nan
    return 1.0 - float(np.var(returns - values)) / var


def explained_variance(values: Any, returns: Any, *, mask: Any = None) -> float:
    """``1 - Var(returns - values) / Var(returns)`` over the masked entries.

    1 is a perfect value function, 0 is no better than predicting the mean return, negative
    is worse. ``nan`` when the returns have no variance (or there are none).
    """
    v, r, m = to_host(values, returns, mask)
    assert v is not None and r is not None
    vv, rr = _masked(v, m), _masked(r, m)
    return _ev(vv, rr) if rr.size else math.nan


def _value_part(
    values: np.ndarray | None,
    returns: np.ndarray | None,
    advantages: np.ndarray | None,
    mask: np.ndarray | None,
) -> dict[str, float]:
    out: dict[str, float] = {}
    for arr, prefix in ((advantages, "advantages"), (returns, "returns"), (values, "values")):
        if arr is not None:
            out.update(_stats_of(_masked(arr, mask), prefix, _STATS))
    if values is not None and returns is not None:
        rr = _masked(returns, mask)
        if rr.size:
            out["explained_variance"] = _ev(_masked(values, mask), rr)
    return out


def value_metrics(
    *, values: Any = None, returns: Any = None, advantages: Any = None, mask: Any = None
) -> dict[str, float]:
    """``advantages/*``, ``returns/*``, ``values/*`` (mean, std, max, min) and
    ``explained_variance`` (when both values and returns are given), over masked tokens."""
    v, r, a, m = to_host(values, returns, advantages, mask)
    return _value_part(v, r, a, m)


def pg_clip_fraction(ratio: Any, clip_eps: float, *, mask: Any = None) -> float:
    """Fraction of tokens whose probability ratio left ``[1 - eps, 1 + eps]`` (PPO clipfrac)."""
    r, m = to_host(ratio, mask)
    assert r is not None
    flat = _masked(r, m)
    return float(np.mean(np.abs(flat - 1.0) > clip_eps)) if flat.size else math.nan


def vf_clip_fraction(
    values: Any, old_values: Any, returns: Any, clip_eps: float, *, mask: Any = None
) -> float:
    """Fraction of tokens where the clipped value loss exceeded the unclipped one (TRL)."""
    v, old, r, m = to_host(values, old_values, returns, mask)
    assert v is not None and old is not None and r is not None
    vv, oo, rr = _masked(v, m), _masked(old, m), _masked(r, m)
    if not vv.size:
        return math.nan
    clipped = oo + np.clip(vv - oo, -clip_eps, clip_eps)
    return float(np.mean((clipped - rr) ** 2 > (vv - rr) ** 2))


def approx_kl(
    logprobs: Any,
    ref_logprobs: Any,
    *,
    mask: Any = None,
    estimator: Literal["k1", "k2", "k3"] = "k3",
) -> float:
    """Mean per-token KL(policy || reference) from log-probabilities of the sampled tokens.

    Estimators (Schulman, "Approximating KL divergence"): ``k1 = log p - log q``,
    ``k2 = (log p - log q)^2 / 2``, ``k3 = exp(log q - log p) - 1 - (log q - log p)``
    (unbiased and never negative; the default).
    """
    lp, ref, m = to_host(logprobs, ref_logprobs, mask)
    assert lp is not None and ref is not None
    d = _masked(lp, m) - _masked(ref, m)
    if not d.size:
        return math.nan
    if estimator == "k1":
        return float(d.mean())
    if estimator == "k2":
        return float((0.5 * d**2).mean())
    if estimator == "k3":
        return float((np.exp(-d) - 1.0 + d).mean())
    raise ValueError(f"estimator must be 'k1', 'k2' or 'k3', got {estimator!r}")


def _completion_part(
    lengths: np.ndarray | None, mask: np.ndarray | None, max_length: int | None
) -> dict[str, float]:
    if lengths is None and mask is not None:
        lengths = np.asarray(mask).astype(bool).sum(axis=-1)
    if lengths is None:
        return {}
    flat = np.asarray(lengths, dtype=np.float64).ravel()
    if not flat.size:
        return {}
    out = {
        "completions/mean_length": float(flat.mean()),
        "completions/max_length": float(flat.max()),
        "completions/min_length": float(flat.min()),
    }
    if max_length is not None:
        out["completions/clipped_ratio"] = float(np.mean(flat >= max_length))
    return out


def completion_metrics(
    lengths: Any = None, *, mask: Any = None, max_length: int | None = None
) -> dict[str, float]:
    """``completions/{mean,max,min}_length`` (tokens), and ``completions/clipped_ratio``
    (fraction at ``max_length``) when ``max_length`` is given.

    Args:
        lengths: Completion length per sequence; or
        mask: A (batch, tokens) completion mask whose row sums are the lengths.
        max_length: The generation limit.
    """
    ln, m = to_host(lengths, mask)
    return _completion_part(ln, m, max_length)


def rl_metrics(
    *,
    rewards: Any = None,
    reward_fns: Mapping[str, Any] | None = None,
    scores: Any = None,
    kl_penalty: Any = None,
    advantages: Any = None,
    returns: Any = None,
    values: Any = None,
    mask: Any = None,
    completion_lengths: Any = None,
    completion_mask: Any = None,
    max_completion_length: int | None = None,
    **scalars: Any,
) -> dict[str, float]:
    """Every RL metric of a step in one call, with one host transfer per array.

    Array arguments are those of :func:`reward_metrics`, :func:`value_metrics` (``mask`` is
    the token mask of advantages / returns / values) and :func:`completion_metrics`.
    Keyword scalars (Python numbers or 0-d arrays, or arrays whose mean is taken):
    ``pg_clipfrac``, ``vf_clipfrac``, ``entropy`` (logged as ``loss/entropy``),
    ``policy_loss``, ``value_loss``, ``kl``, ``actor_dequeue_time``.

    Raises:
        TypeError: an unknown keyword (a typo would otherwise drop a metric silently).
    """
    unknown = sorted(set(scalars) - set(_SCALAR_NAMES))
    if unknown:
        raise TypeError(
            f"rl_metrics() got unknown metrics {unknown}; known: {sorted(_SCALAR_NAMES)}"
        )
    fn_names = list(reward_fns or {})
    scalar_names = [k for k, v in scalars.items() if v is not None]
    host = to_host(
        rewards,
        scores,
        kl_penalty,
        advantages,
        returns,
        values,
        mask,
        completion_lengths,
        completion_mask,
        *(reward_fns or {}).values(),
        *(scalars[k] for k in scalar_names),
    )
    r, sc, klp, adv, ret, val, m, ln, cm = host[:9]
    fn_arrays = host[9 : 9 + len(fn_names)]
    scalar_arrays = host[9 + len(fn_names) :]
    fns = {n: a for n, a in zip(fn_names, fn_arrays, strict=True) if a is not None}
    out = _reward_part(r, fns, sc, klp)
    out.update(_value_part(val, ret, adv, m))
    out.update(_completion_part(ln, cm, max_completion_length))
    for key, arr in zip(scalar_names, scalar_arrays, strict=True):
        assert arr is not None
        flat = np.asarray(arr, dtype=np.float64).ravel()
        if flat.size:
            out[_SCALAR_NAMES[key]] = float(flat.mean())
    return out


def timed_get(
    q: queue.Queue[Any] | Any, *, block: bool = True, timeout: float | None = None
) -> tuple[Any, float]:
    """``q.get()`` and the seconds it waited: log the second as ``actor_dequeue_time``.

    Works with ``queue.Queue`` and anything with the same ``get(block, timeout)``.
    """
    t0 = time.perf_counter()
    item = q.get(block=block, timeout=timeout)
    return item, time.perf_counter() - t0


class SampleWriter:
    """Writes prompts and completions to a local JSONL file, only when ``enabled``.

    Texts are kept out of every metric backend (OTel, Datadog, TensorBoard, W&B): this
    writer is the one place they go, a file on the local disk. Disabled (the default), it
    creates no file and :meth:`write` does nothing.

    One line per sample: ``{"step", "index", "prompt", "completion"}`` plus ``reward`` and
    ``trajectory_id`` when given.

    Args:
        path: The file; default ``samples.jsonl`` in the run folder (``samples-rank<r>.jsonl``
            in a distributed job; nothing is written when the run has no folder).
        enabled: Opt in to writing texts.
        max_chars: Cut each text to this many characters (``None`` keeps it whole).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        enabled: bool = False,
        max_chars: int | None = None,
    ) -> None:
        self.enabled = enabled
        self._max = max_chars
        self._lock = threading.Lock()
        self._file: Any = None
        self.path: Path | None = None
        if not enabled:
            return
        if path is None:
            current = get_current()
            path = current.info.rank_file("samples", ".jsonl") if current is not None else None
            if path is None:
                self.enabled = False
                return
        self.path = Path(path)

    def _cut(self, text: Any) -> str:
        s = str(text)
        return s if self._max is None else s[: self._max]

    def write(
        self,
        step: int,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        *,
        rewards: Any = None,
        trajectory_ids: Sequence[Any] | None = None,
    ) -> int:
        """Append one line per (prompt, completion) pair; returns the lines written."""
        if not self.enabled or self.path is None:
            return 0
        (rw,) = to_host(rewards)
        rw_list = _per_sequence(rw).tolist() if rw is not None else None
        lines = []
        for i, (p, c) in enumerate(zip(prompts, completions, strict=False)):
            rec: dict[str, Any] = {
                "step": step,
                "index": i,
                "prompt": self._cut(p),
                "completion": self._cut(c),
            }
            if rw_list is not None and i < len(rw_list):
                rec["reward"] = rw_list[i]
            if trajectory_ids is not None and i < len(trajectory_ids):
                rec["trajectory_id"] = str(trajectory_ids[i])
            lines.append(json.dumps(rec, ensure_ascii=False))
        with self._lock:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")
            self._file.write("\n".join(lines) + "\n")
            self._file.flush()
        return len(lines)

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
