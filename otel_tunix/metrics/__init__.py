"""Metric catalog, metric helpers, system sampling, alerts and extra MetricsLogger backends.

One module per concept, all importable with only the OpenTelemetry SDK and numpy (torch,
JAX, transformers, nvidia-ml-py, psutil, tensorboardX and wandb are imported by the
functions that need them):

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
