"""The exported step span carries its breakdown (busy / blocked / idle / duration) and each
component span its accounted time, as a real collector (rotel) receives them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import otel_tunix

MS = 1_000_000


def test_step_and_component_spans_carry_the_breakdown(
    rotel_collector, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rotel_collector.grpc_endpoint)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    now = [0]
    out = tmp_path / "run"
    otel_tunix.configure(output_dir=out, clock=lambda: now[0])

    def at(ms: float) -> None:
        now[0] = int(ms * MS)

    # step 0: 3 ms waiting for data (blocked), 7 ms of compute, 2 ms outside any component
    at(0)
    with otel_tunix.step(0):
        with otel_tunix.component("data_wait", blocked=True):
            at(3)
        with otel_tunix.component("compute"):
            at(10)
        at(12)
    # step 1: "generate" twice (2 ms and 3 ms, 1 ms apart), 1 ms idle at the end
    at(20)
    with otel_tunix.step(1):
        with otel_tunix.component("generate"):
            at(22)
        at(23)
        with otel_tunix.component("generate"):
            at(26)
        at(27)
    otel_tunix.shutdown()

    got = rotel_collector.wait_for_spans("train_step", "compute", "generate")
    steps = {s.attributes["tunix.step"]: s for s in got.spans_named("train_step")}
    expected = {  # step: (duration, busy, blocked, idle), ms
        0: (12, 7, 3, 2),
        1: (7, 5, 0, 2),
    }
    for number, (duration, busy, blocked, idle) in expected.items():
        a = steps[number].attributes
        assert a["tunix.step.duration"] == pytest.approx(duration / 1e3)
        assert a["tunix.step.busy_time"] == pytest.approx(busy / 1e3)
        assert a["tunix.step.blocked_time"] == pytest.approx(blocked / 1e3)
        assert a["tunix.step.idle_time"] == pytest.approx(idle / 1e3)
        # the span's own length, as the collector has it, is the duration
        assert (steps[number].end_ns - steps[number].start_ns) / 1e9 == pytest.approx(
            a["tunix.step.duration"]
        )
    wait, compute = got.span("data_wait"), got.span("compute")
    assert wait.attributes["tunix.component.blocked_time"] == pytest.approx(0.003)
    assert wait.attributes["tunix.component.busy_time"] == 0
    assert compute.attributes["tunix.component.busy_time"] == pytest.approx(0.007)
    assert compute.attributes["tunix.component.blocked_time"] == 0
    assert "tunix.component.count" not in compute.attributes
    gens = got.spans_named("generate")
    assert len(gens) == 2
    for g in gens:  # the name's time in the step: both spans together
        assert g.attributes["tunix.component.busy_time"] == pytest.approx(0.005)
        assert g.attributes["tunix.component.count"] == 2
    # the same figures as the run folder's step lines (the accounting's own)
    lines = [json.loads(x) for x in (out / "spans.jsonl").read_text().splitlines()]
    for line in (x for x in lines if x["type"] == "step"):
        a = steps[line["step"]].attributes
        for key in ("busy", "blocked", "idle"):
            assert a[f"tunix.step.{key}_time"] == pytest.approx(line[f"{key}_time_sec"])
