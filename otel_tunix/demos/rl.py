"""``otel-tunix demo --rl``: GRPO on the demos' tiny transformer LM, on the CPU, instrumented.

The policy is :class:`otel_tunix.demos.tiny_lm.TinyLM` (the causal transformer of ``otel-tunix
demo``) over a vocabulary of the ten digits and an end token. Its task is verifiable, in the
shape of a reasoning trace and an answer: from a prompt digit ``p``, count up ``chain`` (32)
digits (wrapping after 9), then answer with the digit that comes next, then stop (``p = 7``,
chain 4: ``8 9 0 1`` answer ``2``, end). The reward is 1 for an exactly right completion,
else 0. As in real post-training, RL starts from a supervised model: before the RL loop the
policy is fine-tuned (``sft_steps``, not traced) on completions with the right chain and a
*random* answer, so it writes the trace but guesses the answer (reward ~0.1); that model is
also the frozen reference of the KL penalty. GRPO then teaches the answer (reward ~0.1 → over
0.5 in the default run) while most tokens stay as they were, so the per-token KL stays small,
as in an LLM whose reasoning tokens barely move, and the default alert rules stay quiet.
``--fault lr-blowup@N`` multiplies the learning rate by 100 from learner step ``N`` on: the
KL and clip-fraction alerts fire within a few steps and the reward collapses.

Two loops run:

* **Actor** (scope ``rl/actor``, its own thread): per step it waits until the published
  weights are recent enough, fans ``rollout`` out over a thread pool of rollout workers
  (``generate``, one prompt's group of completions each, decoded token by token: time to
  first token and time per output token are measured there), runs ``reference_inference``
  with the frozen reference model, scores completions (``reward``), normalises rewards
  within each group (``advantage_computation``) and puts the batch on a queue. Its waits for
  weights (and for room in the queue) are outside any component: that is the actor's
  **idle** time.
* **Learner** (scope ``rl/learner``, the main thread): ``rollout_queue_wait`` (blocked) for the
  next batch, ``actor_train_step`` (clipped policy-gradient loss with a KL penalty to the
  reference; its ``forward`` / ``backward`` / ``optimizer_step`` come from
  :mod:`otel_tunix.instrumentation.torch`), then ``weight_sync`` publishes the new weights.

Logged per learner step: ``rewards/{mean,std,max,min}``, ``kl``, ``pg_clipfrac``,
``completions/{mean,max,min}_length`` and ``completions/clipped_ratio``,
``generation/time_to_first_token_sec`` and ``generation/time_per_output_token_sec`` (means
over the step's groups), ``advantages/mean``, ``loss``, ``learning_rate``.

Lineage and policy lag come from the library (:mod:`otel_tunix.rl`, ``docs/rl.md``): the
actor puts the rollout's context (:func:`otel_tunix.rl.rollout_context`, taken inside its
``rollout`` component) on the queue with the batch, and the learner step that trains on it
calls :func:`otel_tunix.rl.consume`: its span links the ``rollout`` span, with the policy
version and lag, the ``tunix.rl.policy_lag`` histogram counts the lag and
``policy_lag`` is logged per learner step.

Rollouts of step n use the weights of version n - ``--max-staleness`` (waiting for them if
the learner is behind), so they are always that many updates old, whatever the threads'
timing: a seed gives one learning curve on a busy machine as on a quiet one. ``--sync``
runs actor and learner in turn in one thread instead. The summary shows both scopes, the
actor's idle time and the learner's blocked time. Needs the ``demo`` extra (torch, rich).
"""

from __future__ import annotations

import argparse
import contextvars
import copy
import math
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import otel_tunix
import otel_tunix.rl
from otel_tunix.analysis.breakdown import summarize
from otel_tunix.analysis.report import (
    breakdown_table,
    demo_service_name,
    print_run_files,
    progress_bar,
)
from otel_tunix.analysis.summary_tables import rl_parts_table
from otel_tunix.instrumentation import torch as ott
from otel_tunix.metrics.generation import GenerationMetrics
from otel_tunix.metrics.rl import rl_metrics
from otel_tunix.model.steps import ScopeSession

ACTOR = "rl/actor"
LEARNER = "rl/learner"


EOS = 10
"""The end token; tokens 0-9 are the digits."""
PAD = 11
"""Fills a completion after its end token (never sampled, never trained on)."""
VOCAB = 12


@dataclass(frozen=True)
class Fault:
    """A fault injected into the run: ``kind`` from learner step ``step`` on."""

    kind: str
    step: int

    KINDS = ("lr-blowup",)
    LR_FACTOR = 100.0
    """``lr-blowup``: the learning rate is multiplied by this."""

    @classmethod
    def parse(cls, text: str) -> Fault:
        """``lr-blowup@N``: the learning rate x 100 from learner step N on.

        Raises:
            ValueError: not ``<kind>@<step>`` with a known kind and a step >= 0.
        """
        kind, _, step = text.partition("@")
        if kind not in cls.KINDS or not step.isdigit():
            raise ValueError(f"--fault must be <kind>@<step>, kind one of {cls.KINDS}: {text!r}")
        return cls(kind, int(step))


@dataclass(kw_only=True)
class RLDemoConfig:
    """Knobs of the RL demo."""

    steps: int = 150
    prompts_per_step: int = 4
    group_size: int = 8
    chain: int = 32
    """Digits of the counting trace before the answer."""
    d_model: int = 32
    rollout_workers: int = 2
    max_staleness: int = 1
    sft_steps: int = 80
    """Supervised steps that give RL its starting (and reference) model."""
    sft_lr: float = 1e-2
    lr: float = 3e-3
    warmup: int = 20
    """Learner steps of linear learning-rate warm-up (Adam's first steps are as large as
    its later ones, whatever the gradient: without it they shake the chain loose)."""
    kl_coef: float = 0.75
    """Weight of the KL penalty: it sets where the reward levels off (~0.6 here; with 0.4 the
    policy learns every answer and the KL nears log(10) per completion, 0.07 per token)."""
    clip: float = 0.2
    fault: Fault | None = None
    sync: bool = False
    seed: int = 0

    @property
    def completion_length(self) -> int:
        """Tokens of a completion at most: the chain, the answer and the end token."""
        return self.chain + 2


@dataclass
class Batch:
    """One actor step's output: what the learner trains on."""

    step: int
    version: int
    tokens: Any  # (B, 1 + L): prompt token then completion (PAD after the end token)
    mask: Any  # (B, L): 1 for the completion's tokens up to and with its end token
    old_logps: Any  # (B, L) behaviour-policy log-probs of the completion tokens
    ref_logps: Any  # (B, L, EOS + 1): the reference's log-probs of every token, per position
    rewards: Any  # (B,)
    advantages: Any  # (B,)
    ttft_sec: float  # mean over the step's groups
    tpot_sec: float
    lineage: dict[str, Any]  # otel_tunix.rl.rollout_context(): the rollout span and version


def _policy(cfg: RLDemoConfig) -> Any:
    from otel_tunix.demos.tiny_lm import TinyLM, TinyLMConfig

    return TinyLM(
        TinyLMConfig(vocab=VOCAB, seq_len=1 + cfg.completion_length, d_model=cfg.d_model, n_heads=4)
    )


def _logp_table(model: Any, tokens: Any) -> Any:
    """Log-probs of every token at each position of tokens[:, 1:] (teacher forcing)."""
    return model(tokens[:, :-1])[..., : EOS + 1].log_softmax(-1)  # as sampled: no PAD


def _pick(table: Any, tokens: Any) -> Any:
    """The log-probs of tokens[:, 1:] from a :func:`_logp_table`."""
    return table.gather(-1, tokens[:, 1:].clamp(max=EOS).unsqueeze(-1)).squeeze(-1)


def target(prompt: int, chain: int) -> list[int]:
    """The right completion of ``prompt``: ``chain`` digits counting up from it (9 wraps to
    0), the answer (the digit that comes next), then the end token."""
    return [(prompt + i) % 10 for i in range(1, chain + 2)] + [EOS]


def reward_fn(tokens: Any, chain: int) -> Any:
    """1.0 for each completion equal to its :func:`target`, else 0.0."""
    import torch

    rows = tokens.tolist()
    return torch.tensor([float(row[1:] == target(row[0], chain)) for row in rows])


def sft_batch(cfg: RLDemoConfig, gen: Any, size: int = 32) -> Any:
    """Supervised examples: prompt, the right chain, a random answer, the end token."""
    import torch

    prompts = torch.randint(0, 10, (size, 1), generator=gen)
    chain = (prompts + torch.arange(1, cfg.chain + 1)) % 10
    answers = torch.randint(0, 10, (size, 1), generator=gen)
    return torch.cat([prompts, chain, answers, torch.full((size, 1), EOS)], 1)


def warm_start(policy: Any, cfg: RLDemoConfig) -> list[float]:
    """Supervised fine-tuning of ``policy`` on :func:`sft_batch` (not traced); the losses."""
    import torch

    gen = torch.Generator().manual_seed(cfg.seed + 2)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.sft_lr)
    losses = []
    for _ in range(cfg.sft_steps):
        tokens = sft_batch(cfg, gen)
        loss = policy.loss(tokens[:, :-1], tokens[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def completion_mask(tokens: Any) -> Any:
    """1 for each completion token up to and with the first end token, else 0."""
    comp = tokens[:, 1:]
    ended_before = (comp == EOS).long().cumsum(1) - (comp == EOS).long()
    return ((ended_before == 0) & (comp != PAD)).float()


class _Shared:
    """Weights published by the learner, read by the actor: the last ``max_staleness + 1``
    versions, so the actor can take the exact one its step is due."""

    def __init__(self, cfg: RLDemoConfig, state: dict[str, Any]) -> None:
        self.cfg = cfg
        self.version = -1
        self._models: dict[int, Any] = {}
        self._changed = threading.Condition()
        self.publish(state)

    def publish(self, state: dict[str, Any]) -> None:
        """A fresh inference copy of the weights becomes version ``version + 1``."""
        model = _policy(self.cfg).eval().requires_grad_(False)
        model.load_state_dict(state)
        with self._changed:
            self.version += 1
            self._models[self.version] = model
            # the actor is never more than max_staleness versions behind the newest
            self._models.pop(self.version - self.cfg.max_staleness - 1, None)
            self._changed.notify_all()

    def wait_for(self, version: int) -> Any:
        """Block until weights of ``version`` are published; those weights."""
        with self._changed:
            self._changed.wait_for(lambda: self.version >= version)
            return self._models[version]


class Actor:
    """Produces rollout batches (scope ``rl/actor``)."""

    def __init__(self, cfg: RLDemoConfig, shared: _Shared, reference: Any) -> None:
        import torch

        self.cfg = cfg
        self.shared = shared
        self.reference = reference
        self.pool = ThreadPoolExecutor(cfg.rollout_workers, thread_name_prefix="rollout-worker")
        self.gen = torch.Generator().manual_seed(cfg.seed + 1)
        # TTFT, TPOT, tokens: gen_ai.* histograms on the run's meter (OTLP, Prometheus...)
        self.generation = GenerationMetrics(model_name="otel-tunix-tiny-lm", provider="otel_tunix")

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def _generate(self, model: Any, prompt: int, seed: int) -> tuple[Any, Any, float, float]:
        """One group: tokens, log-probs, time to first token, mean time per later token."""
        import torch

        with otel_tunix.component("generate"), torch.no_grad():
            gen = torch.Generator().manual_seed(seed)
            g, length = self.cfg.group_size, self.cfg.completion_length
            tokens = torch.full((g, 1), prompt, dtype=torch.long)
            done = torch.zeros(g, dtype=torch.bool)
            logps = []
            stamp = time.perf_counter()
            # one request per group: its sequences decode together, a token each per step
            timer = self.generation.request(prompt_tokens=1, start=stamp)
            gaps = []
            for _ in range(length):
                logits = model(tokens)[:, -1, : EOS + 1]  # digits and the end token
                dist = logits.log_softmax(-1)
                nxt = torch.multinomial(dist.exp(), 1, generator=gen)
                logps.append(dist.gather(-1, nxt).masked_fill(done.unsqueeze(1), 0.0))
                tokens = torch.cat([tokens, nxt.masked_fill(done.unsqueeze(1), PAD)], 1)
                now = time.perf_counter()
                timer.token(1, now=now)
                gaps.append(now - stamp)
                stamp = now
                done |= nxt.squeeze(1) == EOS
                if bool(done.all()):
                    break
            timer.finish("stop" if bool(done.all()) else "length", now=stamp)
            pad = torch.full((g, 1 + length - tokens.shape[1]), PAD, dtype=torch.long)
            lp = torch.cat(logps, 1)
            lp = torch.cat([lp, torch.zeros(g, length - lp.shape[1])], 1)
            tpot = sum(gaps[1:]) / (len(gaps) - 1) if len(gaps) > 1 else 0.0
            return torch.cat([tokens, pad], 1), lp, gaps[0], tpot

    def step(self, n: int, version: int) -> Batch:
        """One actor step on the weights of ``version``: rollout, reference inference,
        reward, advantages."""
        import torch

        cfg = self.cfg
        model = self.shared.wait_for(version)
        prompts = torch.randint(0, 10, (cfg.prompts_per_step,), generator=self.gen)
        with otel_tunix.component("rollout"):
            futures = [
                self.pool.submit(
                    contextvars.copy_context().run, self._generate, model, int(p), n * 1000 + i
                )
                for i, p in enumerate(prompts)
            ]
            groups = [f.result() for f in futures]
            lineage = otel_tunix.rl.rollout_context(version)  # links the rollout span
        tokens = torch.cat([grp[0] for grp in groups])
        mask = completion_mask(tokens)
        old_logps = torch.cat([grp[1] for grp in groups])
        with otel_tunix.component("reference_inference"), torch.no_grad():
            ref_logps = _logp_table(self.reference, tokens)
        with otel_tunix.component("reward"):
            rewards = reward_fn(tokens, cfg.chain)
        with otel_tunix.component("advantage_computation"):
            grouped = rewards.view(cfg.prompts_per_step, cfg.group_size)
            adv = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)
        ttft = sum(grp[2] for grp in groups) / len(groups)
        tpot = sum(grp[3] for grp in groups) / len(groups)
        return Batch(
            n,
            version,
            tokens,
            mask,
            old_logps,
            ref_logps,
            rewards,
            adv.flatten(),
            ttft,
            tpot,
            lineage,
        )

    def run(self, out: queue.Queue[Batch | None], steps: int) -> None:
        """The asynchronous actor loop: ``steps`` batches onto ``out`` (``None`` on error)."""
        try:
            for n in range(steps):
                with otel_tunix.step(n, scope=ACTOR):
                    # Idle (no component open) while the learner is behind: rollouts of step
                    # n use the weights of version n - max_staleness, whatever the threads'
                    # timing, so a run's learning curve does not depend on the machine's load.
                    out.put(self.step(n, max(0, n - self.cfg.max_staleness)))
        except BaseException:  # tell the learner, then raised on
            out.put(None)
            raise


class Learner:
    """Trains on rollout batches and publishes weights (scope ``rl/learner``)."""

    def __init__(self, cfg: RLDemoConfig, policy: Any, shared: _Shared) -> None:
        import torch

        self.cfg = cfg
        self.policy = ott.instrument_model(policy)
        self.opt = ott.instrument_optimizer(torch.optim.Adam(policy.parameters(), lr=cfg.lr))
        self.shared = shared
        self.logger = otel_tunix.get_metrics_logger()

    def close(self) -> None:
        ott.uninstrument_model(self.policy)
        ott.uninstrument_optimizer(self.opt)

    def train(self, batch: Batch, n: int) -> dict[str, float]:
        """``actor_train_step`` and ``weight_sync``; returns the step's metrics."""
        import torch

        cfg = self.cfg
        mask = batch.mask
        tokens = mask.sum()
        lr = cfg.lr * min(1.0, (n + 1) / cfg.warmup) if cfg.warmup else cfg.lr
        if cfg.fault is not None and cfg.fault.kind == "lr-blowup" and n >= cfg.fault.step:
            lr *= Fault.LR_FACTOR
        for group in self.opt.param_groups:
            group["lr"] = lr
        with otel_tunix.component("actor_train_step"):
            table = _logp_table(self.policy, batch.tokens)
            logps = _pick(table, batch.tokens) * mask
            ratio = (logps - batch.old_logps).exp()
            adv = batch.advantages.unsqueeze(1)
            clipped = ratio.clamp(1 - cfg.clip, 1 + cfg.clip)
            pg = -(torch.min(ratio * adv, clipped * adv) * mask).sum() / tokens
            # The exact KL over the 11 tokens at each position, not an estimate from the
            # sampled token (the k3 estimator of LLM trainers, whose vocabularies make the sum
            # dear): the quantity k3 estimates, without its heavy tail on single steps.
            per_token = (table.exp() * (table - batch.ref_logps)).sum(-1)
            kl = (per_token * mask).sum() / tokens
            loss = pg + cfg.kl_coef * kl
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        state = self.policy.state_dict()
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        with otel_tunix.rl.weight_sync(nbytes=nbytes):  # a weight_sync component, counted
            self.shared.publish(state)
        out = rl_metrics(
            rewards=batch.rewards,
            advantages=batch.advantages,
            completion_mask=mask,
            max_completion_length=cfg.completion_length,
            kl=kl.detach(),
            pg_clipfrac=(((ratio - 1).abs() > cfg.clip).float() * mask).sum() / tokens,
        )
        out["loss"] = loss.item()
        out["learning_rate"] = lr
        out["generation/time_to_first_token_sec"] = batch.ttft_sec
        out["generation/time_per_output_token_sec"] = batch.tpot_sec
        return out


def run(cfg: RLDemoConfig, *, progress: Any = None, lags: list[int] | None = None) -> list[float]:
    """Run the RL demo loop (instrumented when otel-tunix is configured); mean rewards.
    ``lags``: each learner step's policy lag is appended to it."""
    import torch

    torch.manual_seed(cfg.seed)
    policy = _policy(cfg)
    warm_start(policy, cfg)
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    shared = _Shared(cfg, policy.state_dict())
    actor = Actor(cfg, shared, reference)
    learner = Learner(cfg, policy, shared)
    logger = otel_tunix.get_metrics_logger()
    rewards: list[float] = []
    q: queue.Queue[Batch | None] = queue.Queue(maxsize=max(1, cfg.max_staleness))
    thread = None
    if not cfg.sync:
        thread = threading.Thread(
            target=actor.run, args=(q, cfg.steps), name="rl-actor", daemon=True
        )
        thread.start()
    try:
        for n in range(cfg.steps):
            if cfg.sync:
                with otel_tunix.step(n, scope=ACTOR):
                    q.put(actor.step(n, shared.version))
            with otel_tunix.step(n, scope=LEARNER):
                with otel_tunix.component("rollout_queue_wait", blocked=True):
                    batch = q.get()
                if batch is None:
                    raise RuntimeError("the actor thread failed")
                # the step trains version n (shared.version) on a batch made with version
                # n - max_staleness (0 at first): lag min(n, max_staleness)
                lag = otel_tunix.rl.consume(batch.lineage, policy_version=shared.version)
                if lags is not None:
                    lags.extend(lag)
                metrics = learner.train(batch, n)
            logger.log_dict(metrics, step=n)
            rewards.append(metrics["rewards/mean"])
            if progress is not None:
                progress(n + 1, metrics["rewards/mean"])
    finally:
        if thread is not None:
            thread.join(timeout=10)
        actor.close()
        learner.close()
    return rewards


def rollout_idle_and_learner_blocked(sessions: list[ScopeSession]) -> dict[str, float]:
    """Mean seconds per step: the actor's idle time and the learner's blocked time."""
    by_scope = {s.scope: s for s in sessions}
    out = {}
    actor, learner = by_scope.get(ACTOR), by_scope.get(LEARNER)
    if actor is not None:
        out["rollout_idle_sec"] = actor.mean(actor.idle_time_sec)
        out["rollout_step_sec"] = actor.mean(actor.step_time_sec)
    if learner is not None:
        out["learner_blocked_sec"] = learner.mean(learner.blocked_time_sec)
        out["learner_step_sec"] = learner.mean(learner.step_time_sec)
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``otel-tunix demo --rl``."""
    ap = argparse.ArgumentParser(prog="otel-tunix demo --rl", description=__doc__.splitlines()[0])
    ap.add_argument("--rl", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=150, help="learner steps (default 150)")
    ap.add_argument("--sampling-rate", type=int, default=None, help="record every N-th step")
    ap.add_argument("--output-dir", default=None, help="run folder (default ./otel-tunix-runs/ID)")
    ap.add_argument("--rollout-workers", type=int, default=2, help="rollout threads (default 2)")
    ap.add_argument("--group-size", type=int, default=8, help="completions per prompt")
    ap.add_argument(
        "--max-staleness", type=int, default=1, help="batches the actor may run ahead (default 1)"
    )
    ap.add_argument("--sync", action="store_true", help="actor and learner in turn, one thread")
    ap.add_argument(
        "--fault",
        default=None,
        metavar="KIND@STEP",
        help="inject a fault: lr-blowup@N (learning rate x 100 from learner step N on)",
    )
    ap.add_argument(
        "--console-interval",
        type=float,
        default=2.0,
        help="seconds between live lines on stderr (default 2; 0: none)",
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    if args.console_interval < 0:
        ap.error("--console-interval must be 0 or more")
    if args.rollout_workers < 1 or args.group_size < 2 or args.max_staleness < 1:
        ap.error("--rollout-workers and --max-staleness must be >= 1, --group-size >= 2")
    try:
        fault = Fault.parse(args.fault) if args.fault is not None else None
    except ValueError as exc:
        ap.error(str(exc))
    try:
        import torch
        from rich.console import Console
    except ImportError as exc:
        ap.exit(
            2,
            f"otel-tunix demo --rl needs torch and rich: pip install 'otel-tunix[demo]' ({exc})\n",
        )
    torch.set_num_threads(1)  # the rollout workers are the parallelism here
    cfg = RLDemoConfig(
        steps=args.steps,
        rollout_workers=args.rollout_workers,
        group_size=args.group_size,
        max_staleness=args.max_staleness,
        fault=fault,
        sync=args.sync,
    )
    info = otel_tunix.configure(
        service_name=demo_service_name("otel-tunix-demo-rl"),
        perf=otel_tunix.PerformanceMetricsConfig(sampling_rate=args.sampling_rate),
        output_dir=args.output_dir,
        console_interval=args.console_interval,
    )
    console = Console()
    mode = "synchronous" if cfg.sync else f"asynchronous, staleness <= {cfg.max_staleness}"
    console.print(
        f"[bold]otel-tunix RL demo[/]: run [cyan]{info.run_id}[/], {cfg.sft_steps} supervised "
        f"warm-up steps, then {cfg.steps} learner steps, {cfg.rollout_workers} rollout workers, "
        f"{mode}" + (f", fault: {fault.kind} at step {fault.step}" if fault else "")
    )
    lags: list[int] = []
    with progress_bar(console, "GRPO", cfg.steps, "reward", enabled=not args.no_progress) as up:
        rewards = run(cfg, progress=up, lags=lags)
    sessions = otel_tunix.shutdown()

    console.print(breakdown_table(sessions, title="RL step-time breakdown"))
    if info.output_dir is not None:  # the learner step added up, as otel-tunix summary shows it
        for x in summarize(info.output_dir).rl:
            if x.scope == LEARNER and x.breakdown_steps:
                console.print(rl_parts_table(x))
    waits = rollout_idle_and_learner_blocked(sessions)
    for label, key, step_key in (
        ("rollout idle", "rollout_idle_sec", "rollout_step_sec"),
        ("learner blocked", "learner_blocked_sec", "learner_step_sec"),
    ):
        if key in waits:
            share = waits[key] / waits[step_key] if waits[step_key] > 0 else 0.0
            console.print(
                f"{label:<16} {waits[key] * 1e3:8.3f} ms/step  ({share * 100:.1f}% of the step)"
            )
    if lags:
        console.print(
            f"{'policy lag':<16} {sum(lags) / len(lags):8.3f} steps mean, max {max(lags)} "
            "(learner spans link their rollouts)"
        )
    k = max(1, len(rewards) // 10)
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    console.print(f"mean reward {first:.3f} → {last:.3f} (first / last {k} steps)")
    if not math.isfinite(last):
        return 1
    print_run_files(console, info)
    return 0
