"""TensorBoard and Weights & Biases backends for the MetricsLogger.

Both follow the backend protocol (``log_scalar(event, value, **kwargs)``, ``log_scalars``,
``close()``) and are given to :class:`~otel_tunix.MetricsLoggerOptions` as factories::

    from otel_tunix import MetricsLoggerOptions, configure
    from otel_tunix.logger.backends import TensorBoardBackend, WandbBackend

    configure(metrics_logger=MetricsLoggerOptions(
        log_dir="runs/a",
        backend_factories=[
            lambda: TensorBoardBackend("runs/a/tb"),
            lambda: WandbBackend(project="my-rl", mode="offline"),
        ],
    ))

Both receive every scalar, ``perf/<scope>/...`` included (Tunix shows its perf metrics in
TensorBoard too). The libraries are imported when a backend is created:
``pip install 'otel-tunix[tensorboard]'`` (tensorboardX, the small standalone writer) and
``pip install 'otel-tunix[wandb]'``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from otel_tunix.logger.backend import LoggingBackend

__all__ = ["TensorBoardBackend", "WandbBackend"]

_logger = logging.getLogger(__name__)


class TensorBoardBackend(LoggingBackend):
    """Writes scalars to TensorBoard event files (``tensorboardX.SummaryWriter``).

    The writer queues events and writes them on its own thread, so logging never waits on
    the disk. A scalar logged without a step gets the latest step seen (0 before any).

    Args:
        log_dir: Folder of the event files (``tensorboard --logdir`` it).
        flush_every_n_steps: Flush when the step has advanced this far since the last flush
            (Tunix's option); also every ``flush_secs`` and at :meth:`close`.
        flush_secs: The writer's own periodic flush.

    Raises:
        ImportError: tensorboardX is not installed.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        *,
        flush_every_n_steps: int = 100,
        flush_secs: int = 30,
    ) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as exc:
            raise ImportError(
                "TensorBoardBackend needs tensorboardX: pip install 'otel-tunix[tensorboard]'"
            ) from exc
        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(logdir=str(self.log_dir), flush_secs=flush_secs)
        self._every = max(1, int(flush_every_n_steps))
        self._step = 0
        self._flushed_at = 0

    def log_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        """Add one scalar at ``kwargs["step"]``."""
        self.log_scalars({event: value}, **kwargs)

    def log_scalars(self, values: Mapping[str, float], **kwargs: Any) -> None:
        """Add several scalars of one step."""
        step = kwargs.get("step")
        if step is None:
            step = self._step
        else:
            step = int(step)
            self._step = max(self._step, step)
        for name, value in values.items():
            self._writer.add_scalar(name, float(value), global_step=step)
        if self._step - self._flushed_at >= self._every:
            self._flushed_at = self._step
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()


class WandbBackend(LoggingBackend):
    """Logs scalars to a Weights & Biases run.

    Each call logs ``{step_metric: step, **values}`` with every metric plotted against
    ``step_metric`` (``define_metric("*", step_metric=...)``), so values that arrive late
    (otel-tunix's ``perf/...`` scalars are computed off the training thread) or out of
    order are kept instead of being dropped by W&B's monotonic ``_step``.

    Args:
        project: W&B project.
        run_name: Run name (default: W&B's).
        mode: ``"online"``, ``"offline"`` (writes ``<dir>/wandb/offline-run-*``, sync later
            with ``wandb sync``) or ``"disabled"``; default: W&B's own choice
            (``WANDB_MODE``...).
        dir: Folder for W&B's files.
        config: Run config (hyperparameters).
        step_metric: Name of the x-axis metric.
        run: An already started ``wandb`` run to log into (not finished by :meth:`close`);
            by default the active ``wandb.run`` if there is one.
        **init_kwargs: More ``wandb.init`` arguments (``entity``, ``tags``, ``settings``...).

    Raises:
        ImportError: wandb is not installed.
    """

    def __init__(
        self,
        project: str = "otel-tunix",
        run_name: str | None = None,
        *,
        mode: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        config: Mapping[str, Any] | None = None,
        step_metric: str = "step",
        run: Any = None,
        **init_kwargs: Any,
    ) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ImportError("WandbBackend needs wandb: pip install 'otel-tunix[wandb]'") from exc
        self._step_metric = step_metric
        run = run if run is not None else wandb.run
        self._owns_run = run is None
        if run is None:
            if dir is not None:
                Path(dir).mkdir(parents=True, exist_ok=True)
            run = wandb.init(
                project=project,
                name=run_name,
                mode=mode,  # type: ignore[arg-type]
                dir=None if dir is None else os.fspath(dir),
                config=dict(config) if config else None,
                **init_kwargs,
            )
        self.run = run
        run.define_metric(step_metric)
        run.define_metric("*", step_metric=step_metric)
        self._step = 0
        self._closed = False

    def log_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        """Log one scalar at ``kwargs["step"]``."""
        self.log_scalars({event: value}, **kwargs)

    def log_scalars(self, values: Mapping[str, float], **kwargs: Any) -> None:
        """Log several scalars of one step as one W&B row."""
        step = kwargs.get("step")
        if step is None:
            step = self._step
        else:
            self._step = max(self._step, int(step))
        row: dict[str, Any] = {self._step_metric: int(step)}
        row.update((k, float(v)) for k, v in values.items())
        self.run.log(row)

    def close(self) -> None:
        """Finish the run if this backend started it (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._owns_run:
            self.run.finish()
