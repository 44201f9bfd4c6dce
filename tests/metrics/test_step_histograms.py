"""The step histograms made by otel-tunix (metrics/step_histograms.py) are the points the
SDK's instruments make of the same steps: compared field by field, in memory (several
readers, both temporalities, a cardinality limit, several collections) and as a real
collector (rotel) receives them from two runs of the same steps."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    InMemoryMetricReader,
    MetricsData,
)
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

import otel_tunix
from otel_tunix.consumers.sinks import InstrumentSink, instrument_sink
from otel_tunix.consumers.step_histograms import STEP_HISTOGRAMS
from otel_tunix.model.metric_spec import SECONDS_BUCKETS
from otel_tunix.model.steps import StepSummary
from otel_tunix.run import setup

NAMES = [name for name, _ in STEP_HISTOGRAMS]


def _readers() -> list[InMemoryMetricReader]:
    """A cumulative reader, a delta one, and one whose limit sends components to the
    overflow series."""
    return [
        InMemoryMetricReader(),
        InMemoryMetricReader(preferred_temporality={Histogram: AggregationTemporality.DELTA}),
        InMemoryMetricReader(cardinality_limits={Histogram: 3}),
    ]


def _steps(rng: random.Random, first: int, count: int) -> list[StepSummary]:
    """Steps of several shapes: two scopes, blocked and busy components, a name both busy
    and blocked, device work, a step without ids, a value the SDK refuses (NaN)."""
    out = []
    for n in range(first, first + count):
        scope = "train" if n % 3 else "rl/actor"
        times: dict[str, tuple[float, float, int]] = {}
        for i in range(rng.randint(1, 6)):
            busy = rng.choice([0.0, rng.uniform(1e-4, 3.0)])
            blocked = 0.0 if busy and i % 2 else rng.choice([0.0, rng.uniform(1e-4, 0.2)])
            times[f"phase_{i}"] = (busy, blocked, 1)
        if n == first + 5:
            times["phase_nan"] = (math.nan, 0.0, 1)
        step = rng.uniform(1e-4, 5.0)
        busy = sum(b for b, _, _ in times.values() if not math.isnan(b))
        start = 1_700_000_000_000_000_000 + n * 10**10
        end = start + int(step * 1e9)
        device = n % 4 == 1
        ids = n % 7 != 3
        out.append(
            StepSummary(
                scope,
                n,
                start,
                end,
                step,
                busy,
                rng.uniform(0, 0.1),
                rng.uniform(0, 0.1),
                times,
                trace_id=rng.getrandbits(128) if ids else "",
                span_id=rng.getrandbits(64) if ids else 0,
                device_end_ns=end + rng.randint(-(10**6), 10**8) if device else 0,
                device_times={"phase_0": rng.uniform(1e-3, 0.5)} if device else None,
            )
        )
    return out


def _by_series(data: MetricsData | None) -> dict[tuple[str, frozenset[Any]], Any]:
    out: dict[tuple[str, frozenset[Any]], Any] = {}
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    key = (m.name, frozenset(p.attributes.items()))
                    assert key not in out, f"{key} twice"
                    out[key] = (m, sm.scope, rm.resource, p)
    return out


def _same(old: MetricsData | None, new: MetricsData | None) -> None:
    a, b = _by_series(old), _by_series(new)
    assert a.keys() == b.keys()
    for key, (m, scope, resource, p) in a.items():
        m2, scope2, resource2, q = b[key]
        assert (m2.name, m2.description, m2.unit) == (m.name, m.description, m.unit)
        assert m2.data.aggregation_temporality == m.data.aggregation_temporality
        assert (scope2, resource2) == (scope, resource)
        assert q.attributes == p.attributes
        if m.name == "other":  # the SDK's own counter, next to them
            assert q.value == p.value
            continue
        assert (q.count, q.bucket_counts, q.min, q.max) == (p.count, p.bucket_counts, p.min, p.max)
        assert tuple(q.explicit_bounds) == tuple(p.explicit_bounds) == SECONDS_BUCKETS
        assert q.sum == pytest.approx(p.sum, rel=1e-12)
        assert q.start_time_unix_nano <= q.time_unix_nano
        # exemplars: the same steps (time: the step's end here, the record's there)
        assert [(e.value, e.span_id, e.trace_id, e.filtered_attributes) for e in q.exemplars] == [
            (e.value, e.span_id, e.trace_id, e.filtered_attributes) for e in p.exemplars
        ]


RESOURCE = Resource.create({"service.name": "t"})


def _provider(readers: list[InMemoryMetricReader]) -> MeterProvider:
    return MeterProvider(resource=RESOURCE, metric_readers=readers)


def test_the_same_points_as_the_sdk_in_every_reader_over_several_collections() -> None:
    old_readers, new_readers = _readers(), _readers()
    old_mp, new_mp = _provider(old_readers), _provider(new_readers)
    old = InstrumentSink(old_mp.get_meter("otel_tunix", "1.0"))
    new = instrument_sink(
        new_mp, "otel_tunix", "1.0", readers=new_readers, resource=RESOURCE, fast=True
    )
    assert new._histograms is not None  # the fast path, not the SDK's instruments
    # one more instrument on the same meter: the step histograms join its scope
    for mp in (old_mp, new_mp):
        mp.get_meter("otel_tunix", "1.0").create_counter("other").add(1)
    rng = random.Random(5)
    first = 0
    seen_delta_gap = exemplars = False
    for batches in ([12, 30], [1], [], [40, 7, 2]):  # collections with 0..3 batches between
        for size in batches:
            steps = _steps(rng, first, size)
            first += size
            old.on_steps(steps)
            new.on_steps(steps)
        for r_old, r_new in zip(old_readers, new_readers, strict=True):
            got_old, got_new = r_old.get_metrics_data(), r_new.get_metrics_data()
            _same(got_old, got_new)
            exemplars |= any(p.exemplars for *_, p in _by_series(got_new).values())
            seen_delta_gap |= not batches and not any(k[0] in NAMES for k in _by_series(got_new))
    assert seen_delta_gap  # the delta reader, with nothing new: no step histogram at all
    # what the test means to cover did happen
    final = _by_series(new_readers[0].get_metrics_data())
    assert {name for name, _ in final} >= set(NAMES)
    overflow = _by_series(new_readers[2].get_metrics_data())
    assert ("tunix.component.busy_time", frozenset({("otel.metric.overflow", True)})) in overflow
    assert exemplars


def test_without_the_fast_path_setting_or_with_views_the_sdk_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader], views=[View(instrument_name="tunix.step.*")])
    sink = instrument_sink(mp, "s", "1", readers=[reader], resource=Resource.create(), fast=True)
    assert sink._histograms is None
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    sink = instrument_sink(mp, "s", "1", readers=[reader], resource=Resource.create(), fast=False)
    assert sink._histograms is None
    exp = InMemoryMetricReader(
        preferred_aggregation={Histogram: ExponentialBucketHistogramAggregation()}
    )
    mp = MeterProvider(metric_readers=[exp])
    sink = instrument_sink(mp, "s", "1", readers=[exp], resource=Resource.create(), fast=True)
    assert sink._histograms is None


# --- a real collector ----------------------------------------------------------------------


def _ticks() -> Iterator[int]:
    """A clock whose steps move by scripted, varied amounts (the same in both runs)."""
    rng = random.Random(11)
    now = 0
    while True:
        now += int(rng.choice([1e5, 7e5, 3e6, 2e7, 1.2e8, 9e8]))
        yield now


def _run(fast: bool, temporality: str, collector: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.grpc_endpoint)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "60000")  # one export, at shutdown
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", temporality)
    monkeypatch.setenv("OTEL_TUNIX_METRICS_FAST_PATH", str(fast).lower())
    run_id = f"hist-{temporality}-{'fast' if fast else 'sdk'}"
    ticks = _ticks()
    otel_tunix.configure(output_dir="none", run_id=run_id, clock=lambda: next(ticks), id_seed=3)
    (sink,) = [s for s in setup._state.consumers.sinks if isinstance(s, InstrumentSink)]
    assert (sink._histograms is not None) is fast  # the path the run took
    for n in range(40):
        with otel_tunix.step(n, scope="train" if n % 5 else "eval"):
            with otel_tunix.component("data_wait", blocked=True):
                pass
            with otel_tunix.component("compute"):
                with otel_tunix.component("forward"):
                    pass
            if n % 3 == 0:
                with otel_tunix.component("compute", blocked=True):  # busy and blocked
                    pass
    otel_tunix.shutdown()
    return run_id


@pytest.mark.parametrize("temporality", ["cumulative", "delta"])
def test_a_collector_receives_the_same_histograms_from_both_paths(
    rotel_collector, monkeypatch: pytest.MonkeyPatch, temporality: str
) -> None:
    runs = [_run(fast, temporality, rotel_collector, monkeypatch) for fast in (False, True)]
    names = [n for n in NAMES if "device" not in n]
    got = rotel_collector.wait_for_metrics(*names)
    by_run: dict[str, dict[tuple[str, frozenset[Any]], Any]] = {r: {} for r in runs}
    for m in got.metrics:
        if m.name not in names:
            continue
        run = m.resource.get("tunix.run.id")
        for p in m.points:
            by_run[run][(m.name, frozenset(p.attributes.items()))] = (m, p)
    old, new = (by_run[r] for r in runs)
    assert len(old) > 12 and old.keys() == new.keys()
    want = temporality.upper()
    steps = spans = 0
    for key, (m, p) in old.items():
        m2, q = new[key]
        assert (m2.description, m2.unit, m2.data_type, m2.scope_name, m2.scope_version) == (
            m.description, m.unit, m.data_type, m.scope_name, m.scope_version,
        )  # fmt: skip
        assert m.temporality == m2.temporality and want in m.temporality
        assert (q.count, q.bucket_counts, q.explicit_bounds) == (
            p.count, p.bucket_counts, p.explicit_bounds,
        )  # fmt: skip
        assert (q.min, q.max) == (p.min, p.max)
        assert q.sum == pytest.approx(p.sum, rel=1e-12)
        assert [(e.trace_id, e.span_id, e.value) for e in q.exemplars] == [
            (e.trace_id, e.span_id, e.value) for e in p.exemplars
        ]
        if m.name == "tunix.step.duration":
            steps += q.count
            spans += len(q.exemplars)
    assert steps == 40 and spans >= 4  # every step, and exemplars in several buckets
