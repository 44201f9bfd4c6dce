"""Training metrics of a step: loss, perplexity, throughput, TFLOPs and MFU.

::

    from otel_tunix.metrics import TrainingMetrics, TransformerFlops

    tm = TrainingMetrics(
        flops_per_token=TransformerFlops.from_config(model.config, n_params, seq_len).per_token(),
        dtype="bf16",                 # the peak of the detected device for this dtype
    )
    tm.start()
    for n, batch in enumerate(loader):
        loss = train_step(batch)
        tm.log(n, loss=loss, learning_rate=lr, samples=B, tokens=B * T)

Names (MetricsLogger, see the catalog for the OTel side): ``loss``, ``perplexity``,
``learning_rate``, ``grad_norm``, ``step_time_sec``, ``steps_per_sec``, ``samples_per_sec``,
``tokens_per_sec``, ``tflops_per_step`` (all devices), ``tflops_per_sec`` (per device) and
``mfu`` (0..1). MFU = achieved FLOP/s per device / the device's dense peak for ``dtype``;
when the device or dtype has no figure in :data:`~otel_tunix.metrics.flops.PEAK_FLOPS`, MFU
is left out and one warning says so.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

from otel_tunix.logger.backend import to_scalar
from otel_tunix.metrics.flops import detect_device_name, peak_flops
from otel_tunix.recording.current_run import get_current
from otel_tunix.support.errors import warn_once

if TYPE_CHECKING:
    from otel_tunix.logger.metrics_logger import MetricsLogger

__all__ = ["TrainingMetrics", "perplexity"]

_logger = logging.getLogger(__name__)

_MAX_EXP = math.log(1.7976931348623157e308)  # ~709.78: exp() of more overflows a float
_AUTO: Any = object()


def perplexity(loss: Any) -> float:
    """``exp(loss)`` that never raises: ``inf`` past float range, ``nan`` for ``nan``.

    Args:
        loss: A Python, numpy, JAX or torch scalar (mean token cross-entropy in nats).
    """
    v = to_scalar(loss)
    if math.isnan(v):
        return math.nan
    if v > _MAX_EXP:
        return math.inf
    return math.exp(v)


def _warn_once(device: str | None, dtype: str) -> None:
    warn_once(
        ("mfu", device, dtype),
        "otel-tunix: MFU left out: no peak FLOP/s known for device %r and dtype %s "
        "(pass peak_flops_per_device= to TrainingMetrics to set it)",
        device,
        dtype,
        logger=_logger,
    )


class TrainingMetrics:
    """Computes the per-step training metrics; one instance per training loop.

    Args:
        flops_per_token: Model FLOPs per trained token (e.g.
            :meth:`TransformerFlops.per_token`); FLOPs of a step = this x ``tokens``.
        flops_per_step: Model FLOPs of one whole step (all devices), e.g. measured once with
            :func:`~otel_tunix.metrics.flops.measure_torch_flops`; used when given.
        dtype: Compute dtype for the peak lookup (``"bf16"``, ``torch.bfloat16``...).
        num_devices: Devices the step runs on (MFU is per device).
        device_name: Accelerator name for the peak lookup; default: detected from torch,
            JAX or NVML at the first step that needs it.
        peak_flops_per_device: Peak FLOP/s of one device, overriding the table.
    """

    def __init__(
        self,
        *,
        flops_per_token: float | None = None,
        flops_per_step: float | None = None,
        dtype: Any = "bf16",
        num_devices: int = 1,
        device_name: str | None = _AUTO,
        peak_flops_per_device: float | None = None,
    ) -> None:
        if num_devices < 1:
            raise ValueError(f"num_devices must be >= 1, got {num_devices!r}")
        self.flops_per_token = flops_per_token
        self.flops_per_step = flops_per_step
        self.dtype = dtype
        self.num_devices = num_devices
        self._device_name = device_name
        self._peak = peak_flops_per_device
        self._peak_resolved = peak_flops_per_device is not None
        self._last: float | None = None

    @property
    def device_name(self) -> str | None:
        """The device name used for the peak lookup (detected on first access)."""
        if self._device_name is _AUTO:
            self._device_name = detect_device_name()
        return self._device_name

    @property
    def peak_flops_per_device(self) -> float | None:
        """Peak FLOP/s of one device for :attr:`dtype`, or ``None`` if not known."""
        if not self._peak_resolved:
            self._peak_resolved = True
            self._peak = peak_flops(self.device_name, self.dtype)
            if self._peak is None:
                _warn_once(self.device_name, str(self.dtype))
        return self._peak

    def start(self) -> None:
        """Start the clock: the next :meth:`step` measures its time from now."""
        self._last = time.perf_counter()

    def step(
        self,
        *,
        loss: Any = None,
        learning_rate: Any = None,
        grad_norm: Any = None,
        samples: float | None = None,
        tokens: float | None = None,
        step_time_sec: float | None = None,
    ) -> dict[str, float]:
        """The metrics of one finished step, as ``{MetricsLogger name: value}``.

        Args:
            loss: Loss of the step; adds ``loss`` and ``perplexity``.
            learning_rate: Adds ``learning_rate``.
            grad_norm: Adds ``grad_norm``.
            samples: Sequences in the step, all devices; adds ``samples_per_sec``.
            tokens: Tokens in the step, all devices; adds ``tokens_per_sec`` and, with a
                FLOPs figure, ``tflops_per_step``, ``tflops_per_sec`` and ``mfu``.
            step_time_sec: Wall time of the step; default: the time since the previous
                call (or :meth:`start`). Without either, throughput is left out.
        """
        now = time.perf_counter()
        if step_time_sec is None and self._last is not None:
            step_time_sec = now - self._last
        self._last = now
        out: dict[str, float] = {}
        if loss is not None:
            out["loss"] = to_scalar(loss)
            out["perplexity"] = perplexity(out["loss"])
        if learning_rate is not None:
            out["learning_rate"] = to_scalar(learning_rate)
        if grad_norm is not None:
            out["grad_norm"] = to_scalar(grad_norm)
        flops = self.flops_per_step
        if flops is None and self.flops_per_token is not None and tokens is not None:
            flops = self.flops_per_token * float(tokens)
        if flops is not None:
            out["tflops_per_step"] = flops / 1e12
        if step_time_sec is None or step_time_sec <= 0:
            return out
        out["step_time_sec"] = float(step_time_sec)
        out["steps_per_sec"] = 1.0 / step_time_sec
        if samples is not None:
            out["samples_per_sec"] = float(samples) / step_time_sec
        if tokens is not None:
            out["tokens_per_sec"] = float(tokens) / step_time_sec
        if flops is not None:
            per_device = flops / step_time_sec / self.num_devices
            out["tflops_per_sec"] = per_device / 1e12
            peak = self.peak_flops_per_device
            if peak:
                out["mfu"] = per_device / peak
        return out

    def log(
        self, step: int, *, logger: MetricsLogger | None = None, **values: Any
    ) -> dict[str, float]:
        """:meth:`step`, then log the result at ``step`` (default: the run's MetricsLogger).

        Never raises: a value that is not a number skips the step's metrics with a warning.

        Returns:
            The logged metrics.
        """
        try:
            out = self.step(**values)
        except Exception:  # a value the caller passed that is not a number: never hurt the loop
            warn_once(
                (id(self), "log"),
                "otel-tunix: training metrics of step %s skipped (reported once)",
                step,
                logger=_logger,
                exc_info=True,
            )
            return {}
        if logger is None:
            current = get_current()
            if current is None:  # before configure(): nowhere to log
                return out
            logger = current.logger
        logger.log_dict(out, step=step)
        return out
