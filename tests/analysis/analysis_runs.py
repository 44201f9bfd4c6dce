"""Helpers of the analysis tests: run folders made by the real SDK (``otel_tunix.configure``
+ ``step`` / ``component`` + ``time.sleep``) and hand-written JSONL files."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import otel_tunix
from otel_tunix.testing import reset


@dataclass(frozen=True)
class Sleeps:
    """The sleeps of :func:`make_run`, in seconds."""

    startup: float = 0.050  # configure() -> first step
    data: float = 0.010  # train_data_load (blocked), every step
    compute: float = 0.020  # train_step_compute (busy), every step
    first_extra: float = 0.060  # more compute in step 0 ("compilation")
    slow_extra: float = 0.080  # more compute in the slow step
    checkpoint: float = 0.030  # checkpoint_save, in the checkpoint step
    eval: float = 0.015  # eval_step_compute, per eval step
    gap: float = 0.040  # outside any step, after step `gap_after`


SLEEPS = Sleeps()
STEPS = 12
SLOW_STEP = 5
CHECKPOINT_STEP = 9
GAP_AFTER = 6
EVAL_STEPS = 2


@dataclass
class Measured:
    """What :func:`make_run` measured with its own clock, as ``(low, high)`` brackets in
    seconds: ``low`` is the sleep itself (read inside the block), ``high`` is read around
    the ``with`` block, so the SDK's figure for that block lies between the two whatever
    the machine's load. Keys: ``data``, ``compute`` and ``step`` (per train step),
    ``checkpoint``, ``eval`` (per eval step, around the step) and ``startup``."""

    spans: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def __getitem__(self, key: str) -> list[tuple[float, float]]:
        return self.spans[key]

    @contextmanager
    def around(self, key: str, inner: list[float]) -> Iterator[None]:
        """Bracket a block; ``inner`` receives the durations of its sleeps (the low end)."""
        t0 = time.perf_counter()
        yield
        self.spans.setdefault(key, []).append((sum(inner), time.perf_counter() - t0))


def _sleep(seconds: float, into: list[float]) -> None:
    t0 = time.perf_counter()
    time.sleep(seconds)
    into.append(time.perf_counter() - t0)


def loss_at(n: int) -> float:
    """The loss that :func:`make_run` logs at step ``n``."""
    return 10.0 / (n + 1)


def make_run(
    out_dir: Path,
    *,
    run_id: str = "known-sleeps",
    sleeps: Sleeps = SLEEPS,
    steps: int = STEPS,
    slow: float | None = None,
    sampling_rate: int | None = None,
    measured: Measured | None = None,
) -> Path:
    """A real run with known sleeps; returns the run folder.

    Train steps 0..steps-1: ``train_data_load`` (blocked, ``data``) then
    ``train_step_compute`` (busy, ``compute``; plus ``first_extra`` in step 0 and
    ``slow_extra`` in step ``SLOW_STEP``); ``checkpoint_save`` in step ``CHECKPOINT_STEP``;
    a ``gap`` outside any step after step ``GAP_AFTER``; then ``EVAL_STEPS`` eval steps of
    ``eval_step_compute``. ``slow`` adds that much to every compute (a slow rank).
    Logs ``loss`` (:func:`loss_at`) and ``learning_rate`` every step. ``measured``, if
    given, receives the run's own clock readings around each block (:class:`Measured`).
    """
    m = measured if measured is not None else Measured()
    started = time.perf_counter()
    otel_tunix.configure(
        service_name="analysis-test",
        output_dir=out_dir,
        run_id=run_id,
        perf=otel_tunix.PerformanceMetricsConfig(
            sampling_rate=sampling_rate, perfetto_trace_dir="none"
        ),
    )
    logger = otel_tunix.get_metrics_logger()
    startup: list[float] = []
    _sleep(sleeps.startup, startup)
    m.spans["startup"] = [(startup[0], time.perf_counter() - started)]
    for n in range(steps):
        in_step: list[float] = []
        with m.around("step", in_step), otel_tunix.step(n, scope="train"):
            data: list[float] = []
            with m.around("data", data), otel_tunix.component("train_data_load", blocked=True):
                _sleep(sleeps.data, data)
            compute: list[float] = []
            with m.around("compute", compute), otel_tunix.component("train_step_compute"):
                extra = sleeps.first_extra if n == 0 else 0.0
                extra += sleeps.slow_extra if n == SLOW_STEP else 0.0
                _sleep(sleeps.compute + extra + (slow or 0.0), compute)
            in_step += data + compute
            if n == CHECKPOINT_STEP:
                ckpt: list[float] = []
                with m.around("checkpoint", ckpt), otel_tunix.component("checkpoint_save"):
                    _sleep(sleeps.checkpoint, ckpt)
                in_step += ckpt
        logger.log_dict({"loss": loss_at(n), "learning_rate": 1e-3 * (1 - n / steps)}, step=n)
        if n == GAP_AFTER:
            time.sleep(sleeps.gap)
    for i in range(EVAL_STEPS):
        ev: list[float] = []
        with m.around("eval", ev), otel_tunix.step(i, scope="eval"):
            with otel_tunix.component("eval_step_compute"):
                _sleep(sleeps.eval, ev)
    logger.log("eval/loss", 0.5, step=steps - 1)
    otel_tunix.shutdown()
    reset()
    return out_dir


def make_synced_rank(
    out_dir: Path, *, compute: float, wait: float, steps: int = 8, run_id: str = "synced"
) -> Path:
    """One rank of a synchronised job (the rank from ``RANK``): each train step computes
    ``compute`` s (``train_step_compute``, busy) then waits ``wait`` s in ``all_reduce``
    (blocked), as a rank waits there for the slowest one; the caller picks ``compute + wait``
    alike on every rank so that the step times are equal."""
    otel_tunix.configure(
        service_name="analysis-test",
        output_dir=out_dir,
        run_id=run_id,
        perf=otel_tunix.PerformanceMetricsConfig(perfetto_trace_dir="none"),
    )
    for n in range(steps):
        with otel_tunix.step(n, scope="train"):
            with otel_tunix.component("train_step_compute"):
                time.sleep(compute)
            with otel_tunix.component("all_reduce", blocked=True):
                time.sleep(wait)
    otel_tunix.shutdown()
    reset()
    return out_dir


def write_jsonl(
    path: Path, records: Iterable[Mapping[str, object] | str], *, newline_at_end: bool = True
) -> Path:
    """Write records (dicts, or raw text lines) as JSONL; a ``.gz`` path writes gzip."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    text = "\n".join(lines) + ("\n" if newline_at_end and lines else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path
