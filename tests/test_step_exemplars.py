"""Exemplars on the step-time histogram: from a bucket to the trace of a step in it, as a
real collector receives them."""

from __future__ import annotations

import bisect
import time

import pytest

import otel_tunix


def test_step_duration_exemplars_point_at_real_step_traces(rotel_collector, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rotel_collector.grpc_endpoint)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "60000")  # one export, at shutdown
    otel_tunix.configure(output_dir="none", run_id="exemplars")
    sleeps = [0.001, 0.003, 0.012, 0.03, 0.07, 0.003, 0.012]  # several buckets, two twice
    measured = []
    for n, sec in enumerate(sleeps):
        t0 = time.perf_counter()
        with otel_tunix.step(n):
            with otel_tunix.component("train_step_compute"):
                time.sleep(sec)
        measured.append(time.perf_counter() - t0)
    otel_tunix.shutdown()
    out = rotel_collector.wait_for_spans("train_step")
    out = rotel_collector.wait_for_metrics("tunix.step.duration")
    steps = {(s.trace_id, s.span_id): s for s in out.spans_named("train_step")}
    assert len(steps) == len(sleeps)
    point = out.metric("tunix.step.duration").points[-1]
    assert point.count == len(sleeps)
    buckets = {bisect.bisect_left(point.explicit_bounds, m) for m in measured}
    # one exemplar per bucket that got a step (the SDK's aligned-bucket reservoir)
    assert len(point.exemplars) == len(buckets)
    seen = set()
    for ex in point.exemplars:
        step = steps[(ex.trace_id, ex.span_id)]  # a real step span, received as such
        n = step.attributes["tunix.step"]
        seen.add(n)
        assert ex.value == pytest.approx((step.end_ns - step.start_ns) / 1e9, abs=1e-6)
        # the step's time against the test's own clock around it, and the sleep inside it
        assert sleeps[n] <= ex.value <= measured[n]
        assert bisect.bisect_left(point.explicit_bounds, ex.value) in buckets
    assert {bisect.bisect_left(point.explicit_bounds, measured[n]) for n in seen} == buckets
