"""What the step histograms cost the worker: the SDK's instruments against otel-tunix's fold.

Batches of 64 steps of 10 components (one name each, busy only; trace and span ids, so the
step time keeps exemplars) go to the run's ``InstrumentSink`` both ways, in the same process,
interleaved: through the SDK's ``Histogram.record`` (``OTEL_TUNIX_METRICS_FAST_PATH=false``)
and folded per batch by :mod:`otel_tunix.consumers.step_histograms` (the default), with one and
with two in-memory readers. Each figure is the median over the batches, in µs a step; then
what a collection with the points added costs. ``bench/bench_export.py`` measures the whole
trainer process with a real OTLP exporter and collector.

Run: ``.venv/bin/python bench/bench_step_histograms.py`` (``--batches``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

from otel_tunix.consumers.sinks import InstrumentSink, instrument_sink
from otel_tunix.model.steps import StepSummary

STEPS = 64
COMPONENTS = 10


def _batch(rng: random.Random, first: int) -> list[StepSummary]:
    out = []
    for n in range(first, first + STEPS):
        times = {f"phase_{i}": (rng.uniform(1e-4, 3e-3), 0.0, 1) for i in range(COMPONENTS)}
        step = sum(b for b, _, _ in times.values()) * 1.1
        start = time.time_ns()
        out.append(
            StepSummary(
                "train",
                n,
                start,
                start + int(step * 1e9),
                step,
                step * 0.9,
                0.0,
                step * 0.1,
                times,
                trace_id=rng.getrandbits(128),
                span_id=rng.getrandbits(64),
            )
        )
    return out


def _sinks(readers: int) -> tuple[InstrumentSink, InstrumentSink, list[InMemoryMetricReader]]:
    resource = Resource.create()
    sdk_readers = [InMemoryMetricReader() for _ in range(readers)]
    sdk = instrument_sink(
        MeterProvider(resource=resource, metric_readers=sdk_readers), "bench", "1",
        readers=sdk_readers, resource=resource, fast=False,
    )  # fmt: skip
    ours_readers = [InMemoryMetricReader() for _ in range(readers)]
    ours = instrument_sink(
        MeterProvider(resource=resource, metric_readers=ours_readers), "bench", "1",
        readers=ours_readers, resource=resource, fast=True,
    )  # fmt: skip
    return sdk, ours, ours_readers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", type=int, default=30)
    args = ap.parse_args()
    rng = random.Random(1)
    for readers in (1, 2):
        sdk, ours, ours_readers = _sinks(readers)
        took: dict[str, list[float]] = {"sdk": [], "ours": []}
        for i in range(args.batches + 2):
            batch = _batch(rng, i * STEPS)
            for name, sink in (("sdk", sdk), ("ours", ours)):
                t = time.perf_counter()
                sink.on_steps(batch)
                if i >= 2:  # the first two: instruments and series made
                    took[name].append((time.perf_counter() - t) / STEPS)
        a, b = (statistics.median(took[k]) * 1e6 for k in ("sdk", "ours"))
        collects = []
        for _ in range(20):
            t = time.perf_counter()
            ours_readers[0].get_metrics_data()
            collects.append(time.perf_counter() - t)
        print(
            f"{readers} reader(s): SDK instruments {a:.1f} us a step, otel-tunix's fold "
            f"{b:.2f} us a step: {a / b:.0f}x less; a collection with its points "
            f"{statistics.median(collects) * 1e6:.0f} us"
        )


if __name__ == "__main__":
    main()
