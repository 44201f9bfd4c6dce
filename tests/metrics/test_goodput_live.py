"""The live goodput ledger (``tunix.run.goodput``, ``tunix.run.badput_time``): real runs
against their own clocks, the values a real collector received against ``summary.json``
and ``metrics.jsonl``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from run_files import read_jsonl

import otel_tunix
from otel_tunix.accounting import categories
from otel_tunix.support.process import process_start_ns


class _Clock:
    """Seconds of each category by the test's own clock: a lower bound (the sleeps) and an
    upper bound (perf_counter around each block)."""

    def __init__(self) -> None:
        self.low: dict[str, float] = {}
        self.high: dict[str, float] = {}

    def timed(self, category: str, sleep: float, block: Any) -> None:
        t0 = time.perf_counter()
        with block:
            time.sleep(sleep)
        self.high[category] = self.high.get(category, 0.0) + time.perf_counter() - t0
        self.low[category] = self.low.get(category, 0.0) + sleep


def test_live_goodput_at_the_collector_matches_summary_metrics_and_the_clocks(
    rotel_collector: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rotel_collector.grpc_endpoint)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "60000")  # one export, at shutdown
    out = tmp_path / "run"
    otel_tunix.configure(output_dir=out, run_id="goodput-live")
    clock = _Clock()
    first_step_wall = [0, 0]
    step_high = 0.0
    loop_start = time.perf_counter()
    for n in range(12):
        if n == 0:
            first_step_wall[0] = time.time_ns()
        t0 = time.perf_counter()
        with otel_tunix.step(n):
            if n == 0:
                first_step_wall[1] = time.time_ns()
            clock.timed(
                categories.DATA_STALL, 0.02, otel_tunix.component("train_data_load", blocked=True)
            )
            clock.timed(categories.PRODUCTIVE, 0.03, otel_tunix.component("train_step_compute"))
            if n % 4 == 3:
                clock.timed(
                    categories.CHECKPOINT_SAVE, 0.05, otel_tunix.component("checkpoint_save")
                )
        step_high += time.perf_counter() - t0
        if n in (5, 11):
            for e in range(2):
                clock.timed(categories.EVALUATION, 0.02, otel_tunix.step(e, scope="eval"))
    loop_wall = time.perf_counter() - loop_start
    otel_tunix.shutdown()

    summary = json.loads((out / "summary.json").read_text())["goodput"]
    bad = summary["badput_sec"]
    assert set(bad) == set(categories.BADPUT)
    # productive + badput is the wall time, from the process's start to the last step
    assert summary["productive_time_sec"] + sum(bad.values()) == pytest.approx(
        summary["wall_time_sec"], rel=1e-9
    )
    # each category against the test's clocks
    for category in (categories.DATA_STALL, categories.CHECKPOINT_SAVE, categories.EVALUATION):
        assert clock.low[category] <= bad[category] <= clock.high[category], category
    assert clock.low[categories.PRODUCTIVE] <= summary["productive_time_sec"]
    others = clock.low[categories.DATA_STALL] + clock.low[categories.CHECKPOINT_SAVE]
    assert summary["productive_time_sec"] <= step_high - others
    start = process_start_ns()
    init = bad[categories.INITIALIZATION]
    assert (first_step_wall[0] - start) / 1e9 - 0.01 <= init <= (first_step_wall[1] - start) / 1e9
    # between steps: a few statements (the loop's time less what its steps slept at least)
    assert bad[categories.OTHER] <= loop_wall - sum(clock.low.values())
    # and against the spans as written: each category the time of its components
    spans = [
        s for r in read_jsonl(out / "spans.jsonl") if r.get("type") == "step" for s in r["spans"]
    ]
    for name, category in (
        ("train_data_load", "data_stall"),
        ("checkpoint_save", "checkpoint_save"),
    ):
        spent = sum(s["end_ns"] - s["start_ns"] for s in spans if s["name"] == name) / 1e9
        assert bad[category] == pytest.approx(spent, abs=1e-6), category
    assert summary["goodput"] == pytest.approx(
        summary["productive_time_sec"] / summary["wall_time_sec"]
    )
    assert summary["scopes"]["eval"] == {categories.EVALUATION: pytest.approx(bad["evaluation"])}

    # the same figures as MetricsLogger scalars (the last row that has them)
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "goodput" in r.get("metrics", {})]
    last = rows[-1]["metrics"]
    assert last["goodput"] == pytest.approx(summary["goodput"], rel=1e-12)
    assert last["productive_time_sec"] == pytest.approx(summary["productive_time_sec"])
    for category, seconds in bad.items():
        assert last[f"badput_time/{category}"] == pytest.approx(seconds, rel=1e-12, abs=1e-12)

    # and as the collector received them: the gauge and the counter by category
    got = rotel_collector.wait_for_metrics("tunix.run.goodput", "tunix.run.badput_time")
    gauge = got.metric("tunix.run.goodput")
    assert gauge.unit == "1"
    assert gauge.points[-1].value == pytest.approx(summary["goodput"], rel=1e-9)
    counter = got.metric("tunix.run.badput_time")
    assert counter.unit == "s" and counter.is_monotonic
    received = {p.attributes["category"]: p.value for p in counter.points}
    assert received == {k: pytest.approx(v, rel=1e-9, abs=1e-9) for k, v in bad.items()}


def test_overlapping_steps_productive_work_beside_a_wait_costs_nothing(tmp_path: Path) -> None:
    """An RL-shaped run: the learner waits for a rollout (blocked) while an actor thread's
    step computes it, then syncs weights; the actor then idles in its step. The learner's own
    steps show its whole wait as ``rollout_wait``; the run's timeline only the part where
    the actor was not computing."""
    import threading

    out = tmp_path / "run"
    otel_tunix.configure(output_dir=out, run_id="goodput-rl")
    go, done = threading.Event(), threading.Event()
    compute = []

    def actor() -> None:
        with otel_tunix.step(0, scope="rl/actor"):
            go.wait()
            t0 = time.perf_counter()
            with otel_tunix.component("rollout"):
                time.sleep(0.1)
            compute.append(time.perf_counter() - t0)
            done.set()
            time.sleep(0.15)  # idle in its step: nothing computes while the learner syncs

    thread = threading.Thread(target=actor)
    thread.start()
    with otel_tunix.step(0, scope="rl/learner"):
        t0 = time.perf_counter()
        with otel_tunix.component("rollout_queue_wait", blocked=True):
            go.set()
            done.wait()
            time.sleep(0.05)  # waiting on past the rollout: the actor idles meanwhile
        wait = time.perf_counter() - t0
        t1 = time.perf_counter()
        with otel_tunix.component("weight_sync"):
            time.sleep(0.05)
        sync = time.perf_counter() - t1
    thread.join()
    otel_tunix.shutdown()

    summary = json.loads((out / "summary.json").read_text())["goodput"]
    learner = summary["scopes"]["rl/learner"]
    assert 0.15 <= learner[categories.ROLLOUT_WAIT] <= wait
    assert 0.05 <= learner[categories.WEIGHT_SYNC] <= sync
    bad = summary["badput_sec"]
    assert 0.05 <= bad[categories.WEIGHT_SYNC] <= sync
    # the run: the wait while the actor computed is productive, the rest is rollout_wait
    assert 0.05 <= bad[categories.ROLLOUT_WAIT] <= wait - 0.1  # the rollout slept 0.1 s
    assert compute[0] >= 0.1
    assert summary["productive_time_sec"] + sum(bad.values()) == pytest.approx(
        summary["wall_time_sec"], rel=1e-9
    )


def test_outside_components_count_where_no_step_covers_them() -> None:
    """The consumer of the recording layer's outside spans: a restore before the first step
    is ``checkpoint_restore``, not initialization; an evaluation between steps is
    ``evaluation``, not ``other``."""
    from otel_tunix.consumers.live_ledger import LiveLedger

    base = time.time_ns()
    ledger = LiveLedger(start_ns=base)
    s = 1_000_000_000
    ledger.add_outside("restore_model", False, base + s, base + 2 * s, "checkpoint_restore")
    ledger.add_outside("evaluate", False, base + 4 * s, base + 5 * s)
    ledger.add_outside("load_checkpoint", False, base + 7 * s, base + 8 * s)
    ledger.finish()
    f = ledger.figures()
    assert f["wall_time_sec"] == pytest.approx(8.0)
    assert f["badput_sec"]["checkpoint_restore"] == pytest.approx(2.0)
    assert f["badput_sec"]["evaluation"] == pytest.approx(1.0)
    # no step yet: the rest is initialization
    assert f["badput_sec"]["initialization"] == pytest.approx(5.0)


def test_with_sampling_the_steps_not_recorded_count_with_their_own_waits(tmp_path: Path) -> None:
    """``sampling_rate=4``: three steps in four are not recorded; the time between two
    recorded steps ran them and is step time, and their data waits (timed on the hot path)
    are ``data_stall``, as the test's clock around each wait says."""
    out = tmp_path / "run"
    otel_tunix.configure(
        perf=otel_tunix.PerformanceMetricsConfig(sampling_rate=4),
        output_dir=out,
        run_id="goodput-sampled",
    )
    waited = 0.0
    t0 = time.perf_counter()
    for n in range(16):
        with otel_tunix.step(n):
            a = time.perf_counter()
            with otel_tunix.component("train_data_load", blocked=True):
                time.sleep(0.01)
            waited += time.perf_counter() - a
            with otel_tunix.component("train_step_compute"):
                time.sleep(0.02)
    loop = time.perf_counter() - t0
    otel_tunix.shutdown()
    summary = json.loads((out / "summary.json").read_text())["goodput"]
    bad = summary["badput_sec"]
    # the steps not recorded are not "in no step": only the statements between steps are
    assert bad["other"] <= loop - 16 * 0.03
    stalled, productive = bad["data_stall"], summary["productive_time_sec"]
    # all sixteen steps' time, not the four recorded ones'
    assert 0.9 * loop <= stalled + productive <= loop
    # every step's wait, recorded or not, within the test's clock around it
    assert 16 * 0.01 <= stalled <= waited


def test_an_outside_component_handed_on_after_the_next_step_still_counts(tmp_path: Path) -> None:
    """The hook the recording layer hands outside components to
    (``LiveLedger.on_outside_spans``): one between steps 2 and 3 that arrives after step 3 was
    processed is still ``evaluation``, not ``other`` (the ledger settles one batch behind)."""
    from otel_tunix.run import setup

    out = tmp_path / "run"
    otel_tunix.configure(output_dir=out, run_id="goodput-outside")
    ledger = setup._state.ledger  # type: ignore[union-attr]
    t0 = time.perf_counter()
    for n in range(5):
        if n == 3:
            a = time.time_ns()
            time.sleep(0.1)  # an evaluation between steps, recorded outside them
            b = time.time_ns()
        with otel_tunix.step(n):
            with otel_tunix.component("train_step_compute"):
                time.sleep(0.01)
        if n == 3:
            otel_tunix.force_flush()  # step 3 processed before the outside span arrives
            ledger.add_outside("evaluate", False, a, b)
    loop = time.perf_counter() - t0
    otel_tunix.shutdown()
    bad = json.loads((out / "summary.json").read_text())["goodput"]["badput_sec"]
    assert bad["evaluation"] == pytest.approx((b - a) / 1e9, abs=1e-6)
    assert bad["other"] <= loop - 5 * 0.01 - (b - a) / 1e9


def test_each_steps_categories_are_categorize_intervals_of_its_spans(tmp_path: Path) -> None:
    """Whatever shortcut the ledger takes for a step (productive work only, waits of one
    category), each scope's figures are ``categories.categorize_intervals`` of its steps'
    spans as written: steps with nested waits, waits of two kinds, a wait on another
    thread, a checkpoint."""
    import random
    import threading

    rng = random.Random(7)
    out = tmp_path / "run"
    otel_tunix.configure(output_dir=out, run_id="goodput-shapes")

    def nap() -> None:
        time.sleep(rng.choice((0.0005, 0.001, 0.002)))

    for n in range(40):
        shape = n % 5
        with otel_tunix.step(n):
            if shape in (0, 2):
                with otel_tunix.component("train_data_load", blocked=True):
                    nap()
            with otel_tunix.component("train_step_compute"):
                nap()
                if shape == 1:  # a wait inside productive work: productive
                    with otel_tunix.component("train_data_load", blocked=True):
                        nap()
            if shape == 2:  # a second kind of wait
                with otel_tunix.component("all_reduce", blocked=True):
                    nap()
            if shape == 3:  # a wait on another thread while this one computes, then alone

                def waiter() -> None:
                    with otel_tunix.component("rollout_queue_wait", blocked=True):
                        time.sleep(0.003)

                t = threading.Thread(target=waiter)
                t.start()
                with otel_tunix.component("forward"):
                    nap()
                t.join()
            if shape == 4:
                with otel_tunix.component("checkpoint_save"):
                    nap()
    otel_tunix.shutdown()

    expected: dict[str, float] = {}
    for r in read_jsonl(out / "spans.jsonl"):
        if r.get("type") != "step":
            continue
        intervals = [
            (categories.classify(s["name"], s["kind"] == "blocked"), s["start_ns"], s["end_ns"])
            for s in r["spans"]
        ]
        for k, v in categories.categorize_intervals(r["start_ns"], r["end_ns"], intervals).items():
            expected[k] = expected.get(k, 0.0) + v
    got = json.loads((out / "summary.json").read_text())["goodput"]["scopes"]["train"]
    assert set(got) == set(expected) >= {"productive", "data_stall", "other", "rollout_wait"}
    for k, v in expected.items():
        assert got[k] == pytest.approx(v, abs=1e-6), k


def test_a_run_on_its_own_clock_starts_its_wall_time_at_its_first_step(tmp_path: Path) -> None:
    """``configure(clock=...)`` (deterministic times, not Unix time): no process start on
    that clock, so the ledger's wall time runs from the first step; the figures are exact."""
    ticks = iter(range(10**9, 10**12, 10**6))  # each reading 1 ms after the one before
    out = tmp_path / "run"
    otel_tunix.configure(output_dir=out, run_id="goodput-clock", clock=lambda: next(ticks))
    for n in range(4):
        with otel_tunix.step(n):
            with otel_tunix.component("train_data_load", blocked=True):
                pass
            with otel_tunix.component("train_step_compute"):
                pass
    otel_tunix.shutdown()
    goodput = json.loads((out / "summary.json").read_text())["goodput"]
    # per step: six readings (step, two components, each in and out): 5 ms of window, of
    # which the data load's 1 ms; 1 ms from one step's end to the next one's start
    assert goodput["badput_sec"]["initialization"] == 0
    assert goodput["badput_sec"]["data_stall"] == pytest.approx(4 * 0.001)
    assert goodput["productive_time_sec"] == pytest.approx(4 * 0.004)
    assert goodput["badput_sec"]["other"] == pytest.approx(3 * 0.001)
    assert goodput["wall_time_sec"] == pytest.approx(4 * 0.005 + 3 * 0.001)
