"""Metric catalog, metric helpers, system sampling, alerts and extra MetricsLogger backends.

One module per concept, all importable with only the OpenTelemetry SDK and numpy (torch,
JAX, transformers, nvidia-ml-py, psutil, tensorboardX and wandb are imported by the
functions that need them). The names below load when first used (PEP 562), so importing
this package, or one of its modules, imports none of the others:

* :mod:`~otel_tunix.model.catalog`: the one table of names, units, kinds, descriptions.
* :mod:`~otel_tunix.logger.instruments`: catalog instruments; a catalog-driven OTel backend.
* :mod:`~otel_tunix.metrics.training`: perplexity, throughput, TFLOPs, MFU.
* :mod:`~otel_tunix.metrics.flops`: FLOPs per token, measured FLOPs, peak FLOP/s table.
* :mod:`~otel_tunix.metrics.rl`: rewards, advantages, values, KL, clip fractions, lengths.
* :mod:`~otel_tunix.metrics.generation`: TTFT, TPOT, prefill / decode, tokens, requests.
* :mod:`~otel_tunix.metrics.system`: NVML GPU, process / host, framework memory, queues.
* :mod:`~otel_tunix.metrics.alerts`: threshold / drop / spike / NaN rules and actions.
* :mod:`~otel_tunix.metrics.profiling`: profile captures (torch, JAX) of the steps after an
  alert, or on demand.
* :mod:`~otel_tunix.logger.status`: ``get_metrics_summary()``.
* :mod:`~otel_tunix.logger.backends`: TensorBoard and W&B MetricsLogger backends.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otel_tunix.logger.backends import TensorBoardBackend, WandbBackend
    from otel_tunix.logger.instruments import CatalogInstruments, CatalogOTelBackend
    from otel_tunix.logger.status import MetricsSummary, get_metrics_summary
    from otel_tunix.metrics import rl
    from otel_tunix.metrics.flops import (
        PEAK_FLOPS,
        TransformerFlops,
        count_params,
        measure_jax_flops,
        measure_torch_flops,
        peak_flops,
    )
    from otel_tunix.metrics.generation import GenerationMetrics
    from otel_tunix.metrics.system import SystemMetricsSampler, instrument_queue
    from otel_tunix.metrics.training import TrainingMetrics, perplexity
    from otel_tunix.model.catalog import CATALOG, lookup
    from otel_tunix.model.metric_spec import Instrument, MetricSpec

_HOMES: dict[str, str] = {
    "CATALOG": "otel_tunix.model.catalog",
    "PEAK_FLOPS": "otel_tunix.metrics.flops",
    "CatalogInstruments": "otel_tunix.logger.instruments",
    "CatalogOTelBackend": "otel_tunix.logger.instruments",
    "GenerationMetrics": "otel_tunix.metrics.generation",
    "Instrument": "otel_tunix.model.metric_spec",
    "MetricSpec": "otel_tunix.model.metric_spec",
    "MetricsSummary": "otel_tunix.logger.status",
    "SystemMetricsSampler": "otel_tunix.metrics.system",
    "TensorBoardBackend": "otel_tunix.logger.backends",
    "TrainingMetrics": "otel_tunix.metrics.training",
    "TransformerFlops": "otel_tunix.metrics.flops",
    "WandbBackend": "otel_tunix.logger.backends",
    "count_params": "otel_tunix.metrics.flops",
    "get_metrics_summary": "otel_tunix.logger.status",
    "instrument_queue": "otel_tunix.metrics.system",
    "lookup": "otel_tunix.model.catalog",
    "measure_jax_flops": "otel_tunix.metrics.flops",
    "measure_torch_flops": "otel_tunix.metrics.flops",
    "peak_flops": "otel_tunix.metrics.flops",
    "perplexity": "otel_tunix.metrics.training",
}
"""Each public name's module; ``rl`` is the submodule :mod:`otel_tunix.metrics.rl`."""

__all__ = [
    "CATALOG",
    "PEAK_FLOPS",
    "CatalogInstruments",
    "CatalogOTelBackend",
    "GenerationMetrics",
    "Instrument",
    "MetricSpec",
    "MetricsSummary",
    "SystemMetricsSampler",
    "TensorBoardBackend",
    "TrainingMetrics",
    "TransformerFlops",
    "WandbBackend",
    "count_params",
    "get_metrics_summary",
    "instrument_queue",
    "lookup",
    "measure_jax_flops",
    "measure_torch_flops",
    "peak_flops",
    "perplexity",
    "rl",
]


if not TYPE_CHECKING:  # mypy sees the imports above: a misspelt name stays an error

    def __getattr__(name: str) -> Any:
        """Import a public name's module on first use (PEP 562) and keep the name here."""
        if name == "rl":
            value: Any = importlib.import_module("otel_tunix.metrics.rl")
        elif name in _HOMES:
            value = getattr(importlib.import_module(_HOMES[name]), name)
        else:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))
