"""What a row of the metric catalog is: :class:`MetricSpec`, its :class:`Instrument` kinds,
the histogram boundaries rows share, and Tunix's mode attribute. The rows themselves are
:mod:`otel_tunix.model.catalog`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

__all__ = [
    "E2E_LATENCY_BUCKETS",
    "INTER_TOKEN_LATENCY_BUCKETS",
    "MODE_ATTRIBUTE",
    "POLICY_LAG_BUCKETS",
    "SECONDS_BUCKETS",
    "TIME_TO_FIRST_TOKEN_BUCKETS",
    "TOKEN_COUNT_BUCKETS",
    "WEIGHT_BYTES_BUCKETS",
    "Instrument",
    "MetricSpec",
]

SECONDS_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    25.0,
    50.0,
    100.0,
    250.0,
    500.0,
    1000.0,
)
"""Histogram boundaries for durations in seconds: 0.5 ms to ~17 min (the SDK's default
boundaries are shaped for milliseconds)."""


class Instrument(StrEnum):
    """OTel instrument kinds used by the catalog."""

    GAUGE = "gauge"
    COUNTER = "counter"
    UP_DOWN_COUNTER = "updowncounter"
    HISTOGRAM = "histogram"


TIME_TO_FIRST_TOKEN_BUCKETS: Final[tuple[float, ...]] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
"""vLLM's ``vllm:time_to_first_token_seconds`` boundaries."""

INTER_TOKEN_LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
"""vLLM's ``vllm:inter_token_latency_seconds`` boundaries (time per output token)."""

E2E_LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
"""vLLM's request-latency boundaries (end-to-end, prefill and decode time)."""

TOKEN_COUNT_BUCKETS: Final[tuple[float, ...]] = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)
"""The GenAI semantic conventions' advice for ``gen_ai.client.token.usage``."""


POLICY_LAG_BUCKETS: Final[tuple[float, ...]] = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128)
"""Boundaries of the policy lag (learner steps): one bucket per version up to 4, the
asynchronous RL trainers' usual bounds, then coarser."""


WEIGHT_BYTES_BUCKETS: Final[tuple[float, ...]] = tuple(float(2**20 * 4**k) for k in range(11))
"""Boundaries of a weight sync's size in bytes: 1 MiB to 1 TiB, a factor of 4 apart."""


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One row of the catalog.

    Attributes:
        otel_name: OTel instrument name (dotted).
        instrument: Instrument kind.
        unit: UCUM-style unit (``s``, ``By``, ``W``, ``Cel``, ``Hz``, ``1``, ``{token}``).
        description: What the number is.
        group: ``training``, ``rl``, ``generation``, ``gpu``, ``system``, ``alerts``,
            ``compilation`` or ``goodput``.
        logger_name: The MetricsLogger (slash-style) name, or ``None`` for instruments that
            are only recorded directly. ``{name}`` placeholders match one path segment and
            become the attribute ``name``.
        attributes: Constant attributes of the series.
        scale: The OTel value is the logged value times this (``tflops_per_step`` is logged
            in TFLOP and recorded in ``{flop}``).
        buckets: Histogram boundaries, in the unit.
        semconv: The name, kind and unit come from the OTel semantic conventions.
    """

    otel_name: str
    instrument: Instrument
    unit: str
    description: str
    group: str
    logger_name: str | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)
    scale: float = 1.0
    buckets: tuple[float, ...] | None = None
    semconv: bool = False


MODE_ATTRIBUTE: Final = "tunix.training.mode"
"""Tunix's attribute for its MetricsLogger mode (``train`` or ``eval``)."""
