"""``otel-tunix demo``: a small, fully instrumented PyTorch training run on the CPU.

An MLP regression model trains on synthetic data: a background thread prefetches batches into
a queue (the wait for the next batch is ``train_data_load``, a *blocked* component), the step
is ``train_step_compute`` with ``forward`` / ``backward`` / ``optimizer_step`` nested inside, a
checkpoint is saved every ``--checkpoint-every`` steps (``checkpoint_save``) and an evaluation
under the ``eval`` scope runs every ``--eval-every`` steps. Loss, learning rate and gradient
norm go to the MetricsLogger. Needs the ``demo`` extra (torch, rich).
"""

from __future__ import annotations

import argparse
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import otel_tunix
from otel_tunix.metrics.training import perplexity
from otel_tunix.report import breakdown_table, print_run_files, progress_bar


@dataclass(kw_only=True)
class DemoConfig:
    """Knobs of the demo run."""

    steps: int = 300
    batch_size: int = 64
    features: int = 256
    hidden: int = 1024
    lr: float = 1e-3
    checkpoint_every: int = 100
    eval_every: int = 100
    eval_steps: int = 5
    prefetch: int = 4
    seed: int = 0


def _batches(cfg: DemoConfig, stop: threading.Event, q: queue.Queue[Any]) -> None:
    import torch

    gen = torch.Generator().manual_seed(cfg.seed)
    w_true = torch.randn(cfg.features, 1, generator=gen)
    while not stop.is_set():
        x = torch.randn(cfg.batch_size, cfg.features, generator=gen)
        y = x @ w_true + 0.1 * torch.randn(cfg.batch_size, 1, generator=gen)
        while not stop.is_set():
            try:
                q.put((x, y), timeout=0.1)
                break
            except queue.Full:
                continue


def train(cfg: DemoConfig, *, run_dir: Path | None, progress: Any = None) -> list[float]:
    """Run the demo loop (instrumented when otel-tunix is configured); return the losses."""
    import torch
    from torch import nn

    torch.manual_seed(cfg.seed)
    model = nn.Sequential(
        nn.Linear(cfg.features, cfg.hidden),
        nn.GELU(),
        nn.Linear(cfg.hidden, cfg.hidden),
        nn.GELU(),
        nn.Linear(cfg.hidden, 1),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, cfg.steps))
    loss_fn = nn.MSELoss()
    logger = otel_tunix.get_metrics_logger()
    component, step = otel_tunix.component, otel_tunix.step

    q: queue.Queue[Any] = queue.Queue(maxsize=cfg.prefetch)
    stop = threading.Event()
    producer = threading.Thread(target=_batches, args=(cfg, stop, q), name="prefetch", daemon=True)
    producer.start()
    losses: list[float] = []
    try:
        for n in range(cfg.steps):
            with step(n, scope="train"):
                with component("train_data_load", blocked=True):
                    x, y = q.get()
                with component("train_step_compute"):
                    with component("forward"):
                        loss = loss_fn(model(x), y)
                    with component("backward"):
                        opt.zero_grad(set_to_none=True)
                        loss.backward()
                    with component("optimizer_step"):
                        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), 1e9)
                        opt.step()
                        sched.step()
                if (
                    run_dir is not None
                    and cfg.checkpoint_every
                    and (n + 1) % cfg.checkpoint_every == 0
                ):
                    with component("checkpoint_save"):
                        torch.save(model.state_dict(), run_dir / "checkpoint.pt")
            value = loss.item()
            losses.append(value)
            logger.log_dict(
                {
                    "loss": value,
                    "perplexity": perplexity(value),
                    "learning_rate": sched.get_last_lr()[0],
                    "grad_norm": grad_norm,
                },
                step=n,
            )
            if cfg.eval_every and (n + 1) % cfg.eval_every == 0:
                _evaluate(model, loss_fn, q, cfg, n)
            if progress is not None:
                progress(n + 1, value)
    finally:
        stop.set()
        producer.join(timeout=2)
    return losses


def _evaluate(model: Any, loss_fn: Any, q: queue.Queue[Any], cfg: DemoConfig, n: int) -> None:
    import torch

    total = 0.0
    with torch.no_grad():
        for i in range(cfg.eval_steps):
            with otel_tunix.step(n * cfg.eval_steps + i, scope="eval"):
                with otel_tunix.component("eval_data_load", blocked=True):
                    x, y = q.get()
                with otel_tunix.component("eval_step_compute"):
                    total += float(loss_fn(model(x), y))
    otel_tunix.get_metrics_logger().log("eval/loss", total / cfg.eval_steps, step=n)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``otel-tunix demo``."""
    ap = argparse.ArgumentParser(prog="otel-tunix demo", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    ap.add_argument("--sampling-rate", type=int, default=None, help="record every N-th step")
    ap.add_argument("--output-dir", default=None, help="run folder (default ./otel-tunix-runs/ID)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    try:
        import torch  # noqa: F401
        from rich.console import Console
    except ImportError as exc:
        ap.exit(
            2, f"otel-tunix demo needs torch and rich: pip install 'otel-tunix[demo]' ({exc})\n"
        )

    perf = otel_tunix.PerformanceMetricsConfig(sampling_rate=args.sampling_rate)
    info = otel_tunix.configure(
        service_name="otel-tunix-demo", perf=perf, output_dir=args.output_dir
    )
    cfg = DemoConfig(steps=args.steps, batch_size=args.batch_size, hidden=args.hidden)
    console = Console(stderr=False)
    console.print(f"[bold]otel-tunix demo[/]: run [cyan]{info.run_id}[/], {cfg.steps} steps")
    with progress_bar(console, "training", cfg.steps, "loss", enabled=not args.no_progress) as up:
        losses = train(cfg, run_dir=info.output_dir, progress=up)
    sessions = otel_tunix.shutdown()

    console.print(breakdown_table(sessions))
    console.print(f"final loss {losses[-1]:.4f} (first {losses[0]:.4f})")
    print_run_files(console, info)
    return 0
