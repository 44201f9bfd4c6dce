"""Datadog through DogStatsD: an OTel metric exporter, per-step distributions, events.

Everything here talks to a Datadog Agent's DogStatsD server (UDP or a Unix socket) through
the official ``datadog`` package (``pip install 'otel-tunix[datadog]'``); no API key is
needed in the training process, the Agent holds it.

* :class:`DatadogMetricExporter` is a real OpenTelemetry ``MetricExporter`` (entry point
  ``datadog`` of ``opentelemetry_metrics_exporter``, so ``OTEL_METRICS_EXPORTER=datadog``
  works). It prefers DELTA temporality for counters and histograms and maps:

  ============================== =========================================================
  OTel data                      DogStatsD
  ============================== =========================================================
  monotonic Sum (Counter)        ``<name>`` count (``c``) of the interval's delta
  non-monotonic Sum, Gauge       ``<name>`` gauge (``g``) of the current value
  Histogram, ExponentialHisto.   ``<name>.count`` and ``<name>.sum`` counts;
                                 ``<name>.min``, ``<name>.max``, ``<name>.avg`` gauges;
                                 optionally ``<name>.bucket`` counts (``histogram_buckets``)
  ============================== =========================================================

  A DogStatsD ``distribution`` needs raw samples and an OTel histogram point only holds
  count / sum / min / max / bucket counts, so the exporter never invents samples; the names
  and types follow Datadog's own mapping of Prometheus histograms (``.count`` / ``.sum`` /
  ``.bucket`` as counts). True percentiles come from :class:`DatadogStepSink`.
* :class:`DatadogStepSink` sends each sampled step's busy / blocked / idle times as raw
  ``distribution`` samples, so Datadog computes exact percentiles across steps and hosts.
* :class:`DatadogClient` is the one configured DogStatsD connection; it also sends events
  and service checks (used by alerts).
* :func:`datadog_enabled` tells the core whether to add the exporter.

Tags: a data point's attributes become ``key:value`` tags, then a few resource attributes
(:data:`RESOURCE_TAGS`: ``service.name`` -> ``service``, ``deployment.environment(.name)``
-> ``env``, ``service.version`` -> ``version``, ``tunix.run.id`` -> ``run_id``,
``tunix.rank`` -> ``rank``, ``host.name`` -> ``host``), then the client's constant tags. For
``env`` / ``service`` / ``version`` (and any other key), a constructor argument or a
``constant_tags`` entry beats ``DD_ENV`` / ``DD_SERVICE`` / ``DD_VERSION`` (which the
``datadog`` client turns into constant tags itself), which beat the resource, so every key
appears once.

Connection: arguments ``host`` / ``port`` / ``socket_path``, else ``DD_DOGSTATSD_URL``
(``udp://host:port``, ``unix:///path``), else ``DD_AGENT_HOST`` / ``DD_DOGSTATSD_PORT``,
else ``localhost:8125``, as resolved by the ``datadog`` client. Sends are buffered and
handed to the client's background sender thread, so neither the training loop nor the
metric reader ever waits on the network; an Agent that is down only drops packets.
"""

from __future__ import annotations

# The `X as X` imports are importable from here too, as before the split, but not in __all__.
from otel_tunix.exporters.datadog.client import (
    DATADOG_ENABLED,
    DatadogClient,
    DatadogOptions,
    ServiceCheckStatus,
    datadog_enabled,
)
from otel_tunix.exporters.datadog.client import AlertType as AlertType
from otel_tunix.exporters.datadog.metrics import DatadogMetricExporter
from otel_tunix.exporters.datadog.steps import COMPONENT_BLOCKED_TIME as COMPONENT_BLOCKED_TIME
from otel_tunix.exporters.datadog.steps import COMPONENT_BUSY_TIME as COMPONENT_BUSY_TIME
from otel_tunix.exporters.datadog.steps import STEP_BLOCKED_TIME as STEP_BLOCKED_TIME
from otel_tunix.exporters.datadog.steps import STEP_BUSY_TIME as STEP_BUSY_TIME
from otel_tunix.exporters.datadog.steps import STEP_DURATION as STEP_DURATION
from otel_tunix.exporters.datadog.steps import STEP_IDLE_TIME as STEP_IDLE_TIME
from otel_tunix.exporters.datadog.steps import DatadogStepSink
from otel_tunix.exporters.datadog.tags import RESOURCE_TAGS, resource_tags
from otel_tunix.exporters.datadog.tags import TagsLike as TagsLike

__all__ = [
    "DATADOG_ENABLED",
    "RESOURCE_TAGS",
    "DatadogClient",
    "DatadogMetricExporter",
    "DatadogOptions",
    "DatadogStepSink",
    "ServiceCheckStatus",
    "datadog_enabled",
    "resource_tags",
]
