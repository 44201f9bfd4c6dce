"""Busy / blocked / idle counters: controlled sleeps, nesting, threads, published values."""

from __future__ import annotations

import threading
import time

import pytest

import otel_tunix
from otel_tunix.accounting.step_time import account_step, union_ns
from otel_tunix.model.metric_spec import SECONDS_BUCKETS
from otel_tunix.model.steps import SpanInfo
from otel_tunix.settings import attributes as attr
from otel_tunix.testing import capture

MS = 1_000_000


def _span(
    name: str,
    kind: str,
    start_ms: float,
    end_ms: float,
    attributes: dict[str, object] | None = None,
) -> SpanInfo:
    return SpanInfo(
        name=name,
        kind=kind,
        start_ns=int(start_ms * MS),
        end_ns=int(end_ms * MS),
        attributes=attributes or {},
    )


def test_union_counts_overlaps_once():
    assert union_ns([(0, 10), (5, 15), (20, 30), (25, 26)]) == 25
    assert union_ns([]) == 0
    assert union_ns([(5, 5), (7, 3)]) == 0


def test_account_step_partitions_the_window_exactly():
    spans = [
        _span("load", "busy", 0, 20),
        _span("wait", "blocked", 20, 50),
        _span("compute", "busy", 50, 90),
        _span("inner", "busy", 60, 70),  # nested in compute: not counted twice
        _span("other_thread_wait", "blocked", 55, 95),  # blocked only after compute ends
    ]
    s = account_step("train", 3, 0, 100 * MS, spans)
    assert s.busy_time_sec == pytest.approx(0.060)
    assert s.blocked_time_sec == pytest.approx(0.030 + 0.005)
    assert s.idle_time_sec == pytest.approx(0.005)
    assert s.step_time_sec == pytest.approx(0.100)
    assert s.busy_time_sec + s.blocked_time_sec + s.idle_time_sec == pytest.approx(s.step_time_sec)
    assert s.components["compute"].busy_time_sec == pytest.approx(0.040)
    assert s.components["inner"].busy_time_sec == pytest.approx(0.010)
    assert s.components["other_thread_wait"].blocked_time_sec == pytest.approx(0.040)
    assert s.components["wait"].count == 1


def test_account_intervals_matches_counting_every_nanosecond_on_random_steps():
    """The one-pass accounting against the definition applied instant by instant (busy if
    a busy component is open, else blocked if a blocked one is, else idle; per component the
    instants it is open), on random overlapping, nested, clipped and empty intervals."""
    import random

    from otel_tunix.accounting.step_time import account_intervals

    rng = random.Random(7)
    for case in range(300):
        start, end = 100, 100 + rng.randint(0, 120)
        intervals = []
        names = "abc"[: rng.randint(1, 3)]  # one name only, often: its own shortcut
        p_blocked = rng.choice((0.0, 0.4))  # all busy, often: another shortcut
        for _ in range(rng.randint(0, 9)):
            s = rng.randint(60, 230)
            e = s + rng.randint(-5, 60)  # some end before they start: empty
            intervals.append((rng.choice(names), rng.random() < p_blocked, s, e))
        presorted = case % 2 == 0
        given = sorted(intervals, key=lambda iv: iv[2]) if presorted else intervals
        got = account_intervals("train", case, start, end, given, presorted=presorted)

        # an interval that ends before it starts is empty, ending at its start
        # the step's own (host) window; a step of no length runs to its last component's end
        window_end = end if end > start else max([end, *(max(s, e) for _, _, s, e in intervals)])
        busy = blocked = idle = 0
        per: dict[tuple[str, bool], int] = {}
        for t in range(start, window_end):
            open_ = [(n, b) for n, b, s, e in intervals if s <= t < e]
            if any(not b for _, b in open_):
                busy += 1
            elif open_:
                blocked += 1
            else:
                idle += 1
            for key in set(open_):
                per[key] = per.get(key, 0) + 1
        assert got.end_ns == window_end
        assert round(got.step_time_sec * 1e9) == window_end - start
        assert (round(got.busy_time_sec * 1e9), round(got.blocked_time_sec * 1e9)) == (
            busy,
            blocked,
        ), intervals
        assert round(got.idle_time_sec * 1e9) == idle
        in_start_order = sorted(intervals, key=lambda iv: iv[2])
        assert list(got.components) == list(dict.fromkeys(n for n, *_ in in_start_order))
        for name, ct in got.components.items():
            assert round(ct.busy_time_sec * 1e9) == per.get((name, False), 0), (name, intervals)
            assert round(ct.blocked_time_sec * 1e9) == per.get((name, True), 0), (name, intervals)
            assert ct.count == sum(1 for n, *_ in intervals if n == name)


def test_a_component_that_outlives_the_step_counts_inside_its_host_window_only():
    """Host and device are two timelines: the step's window is its own (host) one; a
    component ending on the device after it counts inside it, and its device figures are
    reported apart."""
    spans = [
        _span("dispatch", "busy", 10, 150, attributes={attr.DEVICE_END: True}),
        _span("upload", "busy", 95, 130),  # another thread, past the step's end
    ]
    s = account_step("train", 0, 0, 100 * MS, spans)
    assert s.end_ns == 100 * MS and s.step_time_sec == pytest.approx(0.100)
    assert s.busy_time_sec == pytest.approx(0.090)
    assert s.idle_time_sec == pytest.approx(0.010)
    assert s.components["dispatch"].busy_time_sec == pytest.approx(0.090)
    assert s.components["upload"].busy_time_sec == pytest.approx(0.005)
    assert s.device_end_ns == 150 * MS
    assert s.device_lag_sec == pytest.approx(0.050)
    assert s.device_times == {"dispatch": pytest.approx(0.140)}
    line = s.to_json()
    assert line["device_lag_sec"] == pytest.approx(0.050) and line["end_ns"] == 100 * MS
    assert "device_end_ns" not in account_step("train", 1, 0, 100 * MS, spans[1:]).to_json()


def test_a_trace_id_given_as_an_int_reads_as_32_hex_digits():
    spans = [SpanInfo("load", "busy", 10, 30)]
    given_int = account_step("train", 3, 0, 40, spans, trace_id=0xABC)
    given_str = account_step("train", 3, 0, 40, spans, trace_id="0" * 29 + "abc")
    assert given_int.trace_id == given_str.trace_id == "0" * 29 + "abc"
    assert given_int.to_json() == given_str.to_json()
    assert given_int.to_json()["trace_id"] == "0" * 29 + "abc"


def test_counters_on_controlled_sleeps():
    """20 ms busy load, 30 ms blocked wait, 40 ms busy compute, 10 ms gap."""
    with capture() as cap:
        with otel_tunix.step(0):
            with otel_tunix.component("train_data_load"):
                time.sleep(0.020)
            with otel_tunix.component("train_queue_wait", blocked=True):
                time.sleep(0.030)
            with otel_tunix.component("train_step_compute"):
                time.sleep(0.040)
            time.sleep(0.010)
        spans = {s.name: s for s in cap.spans()}
        s = cap.summaries[0]

    def dur(name: str) -> float:
        return (spans[name].end_time - spans[name].start_time) / 1e9

    # Exactly what the spans say ...
    assert s.busy_time_sec == pytest.approx(dur("train_data_load") + dur("train_step_compute"))
    assert s.blocked_time_sec == pytest.approx(dur("train_queue_wait"))
    assert s.step_time_sec == pytest.approx(dur("train_step"))
    assert s.idle_time_sec == pytest.approx(
        s.step_time_sec - s.busy_time_sec - s.blocked_time_sec, abs=1e-9
    )
    # ... and at least the sleeps (sleeps only ever run long: a loaded CI machine stretches
    # them by tens of milliseconds, so the upper bounds only catch gross errors).
    assert 0.060 <= s.busy_time_sec < 0.060 + 0.25
    assert 0.030 <= s.blocked_time_sec < 0.030 + 0.25
    assert 0.010 <= s.idle_time_sec < 0.010 + 0.25
    assert s.components["train_data_load"].busy_time_sec == pytest.approx(dur("train_data_load"))
    assert s.components["train_queue_wait"].blocked_time_sec == pytest.approx(
        dur("train_queue_wait")
    )


def test_nested_and_concurrent_busy_time_is_not_double_counted():
    def worker() -> None:
        with otel_tunix.component("shard"):
            time.sleep(0.03)

    with capture() as cap:
        with otel_tunix.step(0):
            with otel_tunix.component("outer"):
                with otel_tunix.component("inner"):
                    time.sleep(0.02)
                threads = [threading.Thread(target=worker) for _ in range(3)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
        spans = {s.name: s for s in cap.spans()}
        s = cap.summaries[0]

    def dur(span) -> float:
        return (span.end_time - span.start_time) / 1e9

    outer = dur(spans["outer"])
    assert s.busy_time_sec == pytest.approx(outer, abs=2e-4)
    # three concurrent shards of ~30 ms count their union (~30 ms), not their sum (~90 ms)
    shards = sorted((sp.start_time, sp.end_time) for sp in cap.spans() if sp.name == "shard")
    union_ns, reach = 0, 0
    for start, end in shards:  # merged by hand here, independently of the processor
        union_ns += max(0, end - max(start, reach))
        reach = max(reach, end)
    shard = s.components["shard"].busy_time_sec
    assert shard >= 0.03
    assert shard == pytest.approx(union_ns / 1e9, abs=1e-6)
    assert shard < sum(dur(sp) for sp in cap.spans() if sp.name == "shard") - 0.02
    assert s.components["shard"].count == 3


def test_instruments_are_histograms_in_seconds_with_scope_and_component_attributes():
    perf = otel_tunix.PerformanceMetricsConfig(sampling_rate=2)
    with capture(perf=perf) as cap:
        for n in range(4):
            with otel_tunix.step(n, scope="rl/learner"):
                with otel_tunix.component("train_queue_wait", blocked=True):
                    time.sleep(0.002)
                with otel_tunix.component("actor_train_step"):
                    time.sleep(0.002)
        metrics = cap.metrics()
        units = cap.metric_units()
    for name in (
        "tunix.step.duration",
        "tunix.step.busy_time",
        "tunix.step.blocked_time",
        "tunix.step.idle_time",
        "tunix.component.busy_time",
        "tunix.component.blocked_time",
    ):
        assert units[name] == "s", name
        points = metrics[name]
        assert sum(p.count for p in points) == 2  # two sampled steps
        assert list(points[0].explicit_bounds) == list(SECONDS_BUCKETS)
    assert dict(metrics["tunix.step.busy_time"][0].attributes) == {"scope": "rl/learner"}
    comp = {p.attributes["component"]: p for p in metrics["tunix.component.busy_time"]}
    assert set(comp) == {"actor_train_step"}
    assert dict(comp["actor_train_step"].attributes) == {
        "scope": "rl/learner",
        "component": "actor_train_step",
    }
    blocked = metrics["tunix.component.blocked_time"][0]
    assert blocked.attributes["component"] == "train_queue_wait"
    assert blocked.sum >= 0.004  # two sampled steps of >= 2 ms
    assert units["tunix.steps"] == "{step}"
    assert metrics["tunix.steps"][0].value == 4
    assert metrics["tunix.session.steps_per_second"][0].value > 0


def test_perf_scalars_reach_the_metrics_logger_with_tunix_names():
    logged: list[tuple[str, float, int | None]] = []

    class Recorder:
        def log_scalar(self, event: str, value: float, **kwargs: object) -> None:
            logged.append((event, value, kwargs.get("step")))  # type: ignore[arg-type]

        def close(self) -> None:
            pass

    opts = otel_tunix.MetricsLoggerOptions(backend_factories=[Recorder])
    perf = otel_tunix.PerformanceMetricsConfig(sampling_rate=2)
    with capture(perf=perf, metrics_logger=opts) as cap:
        for n in range(3):
            with otel_tunix.step(n):
                with otel_tunix.component("train_queue_wait", blocked=True):
                    time.sleep(0.001)
                with otel_tunix.component("checkpoint_save"):
                    time.sleep(0.001)
        cap.flush()
    names = {e for e, _, _ in logged}
    assert {
        "perf/train/step_time_sec",
        "perf/train/busy_time_sec",
        "perf/train/blocked_time_sec",
        "perf/train/idle_time_sec",
        "perf/train/checkpoint_save/busy_time_sec",
        "perf/train/train_queue_wait/blocked_time_sec",
        "perf/train/steps_per_sec",
    } <= names
    assert "perf/train/train_queue_wait/busy_time_sec" not in names
    steps = sorted({s for e, _, s in logged if e == "perf/train/busy_time_sec"})
    assert steps == [0, 2]
    rate = [v for e, v, _ in logged if e == "perf/train/steps_per_sec"]
    assert rate and rate[0] > 0


def test_perf_scalars_of_a_step_by_scope_and_component_and_the_names_kept_are_bounded(
    monkeypatch,
):
    from otel_tunix.accounting.step_time import account_intervals
    from otel_tunix.logger import perf_rows

    def step(scope: str, *components: tuple[str, bool, int, int]) -> dict[str, float]:
        return perf_rows.perf_metrics(account_intervals(scope, 1, 0, 100, list(components)))

    got = step("rl/learner", ("load", False, 0, 10), ("wait", True, 10, 30))
    assert got == pytest.approx({
        "perf/rl/learner/step_time_sec": 100e-9,
        "perf/rl/learner/busy_time_sec": 10e-9,
        "perf/rl/learner/blocked_time_sec": 20e-9,
        "perf/rl/learner/idle_time_sec": 70e-9,
        "perf/rl/learner/load/busy_time_sec": 10e-9,
        "perf/rl/learner/wait/blocked_time_sec": 20e-9,
    })  # fmt: skip
    # the same component name in another scope gets that scope's names
    assert "perf/eval/load/busy_time_sec" in step("eval", ("load", False, 0, 10))
    # names made up per step (a component named after its step) do not pile up
    monkeypatch.setattr(perf_rows, "_MAX_NAMES", 8)
    for i in range(50):
        got = step("eval", (f"batch_{i}", False, 0, 5))
        assert got[f"perf/eval/batch_{i}/busy_time_sec"] == pytest.approx(5e-9)
        assert len(perf_rows._NAMES["eval"]) <= 8


def test_custom_export_fn_object_is_published_like_ours():
    seen = []

    def my_fn(summary):
        seen.append(summary)
        return {"perf/custom/compute_share": summary.busy_time_sec / summary.step_time_sec}

    logged = {}

    class Recorder:
        def log_scalar(self, event, value, **kwargs):
            logged[(event, kwargs.get("step"))] = value

        def close(self):
            pass

    opts = otel_tunix.MetricsLoggerOptions(backend_factories=[Recorder])
    with capture(
        perf=otel_tunix.PerformanceMetricsConfig(export_fn=my_fn), metrics_logger=opts
    ) as cap:
        with otel_tunix.step(0), otel_tunix.component("train_step_compute"):
            time.sleep(0.002)
        metrics = cap.metrics()
    assert len(seen) == 1
    assert [s.name for s in seen[0].spans] == ["train_step_compute"]
    value = logged[("perf/custom/compute_share", 0)]
    assert 0 < value <= 1
    assert metrics["perf/custom/compute_share"][0].sum == pytest.approx(value)


def test_export_fn_that_raises_is_reported_once_and_never_reaches_the_loop(caplog):
    calls = []

    def broken(summary):
        calls.append(summary.step)
        raise ZeroDivisionError("oops")

    with capture(perf=otel_tunix.PerformanceMetricsConfig(export_fn=broken)) as cap:
        for n in range(3):
            with otel_tunix.step(n), otel_tunix.component("x"):
                pass
        cap.flush()
        assert len(cap.summaries) == 3  # other sinks still work
    assert calls == [0, 1, 2]
    reports = [r for r in caplog.records if "export function" in r.getMessage()]
    assert len(reports) == 1
    assert "ZeroDivisionError" in (reports[0].exc_text or "")


def test_the_processor_gives_the_same_summary_from_sdk_spans_as_from_whole_steps():
    """StepAccountingProcessor is a real SpanProcessor: fed the SDK spans of a step one at a
    time (as from any span pipeline) it derives what it derives from the step itself."""
    from otel_tunix.consumers.step_accounting import StepAccountingProcessor
    from otel_tunix.testing import steps_set_aside

    otel_tunix.configure(output_dir="none")
    with steps_set_aside() as kept, otel_tunix.step(9, scope="rl/learner"):
        with otel_tunix.component("outer"):
            time.sleep(0.003)
            with otel_tunix.component("inner"):
                time.sleep(0.002)
        with otel_tunix.component("wait", blocked=True):
            time.sleep(0.002)
    (step,) = kept.finished()
    otel_tunix.shutdown()

    whole, by_span = StepAccountingProcessor(), StepAccountingProcessor()
    whole.on_finished_steps([step])
    for span in reversed(step.spans()[:-1]):  # any order of components, the step last
        by_span.on_end(span)
    by_span.on_end(step.spans()[-1])
    a, b = whole.last_summary, by_span.last_summary
    assert a is not None and b is not None
    assert a.to_json() == b.to_json()
    # the inner span lies within the outer one, so busy time is the outer span's length (not
    # the sum); read from the spans, not the sleeps, which a loaded machine stretches
    outer = next(s for s in step.spans() if s.name == "outer")
    assert a.busy_time_sec == pytest.approx((outer.end_time - outer.start_time) / 1e9, abs=1e-9)
    assert a.busy_time_sec >= 0.005
    assert set(a.components) == {"outer", "inner", "wait"}


def test_a_session_whose_first_step_is_not_sampled_starts_at_that_step():
    perf = otel_tunix.PerformanceMetricsConfig(sampling_rate=2)
    with capture(perf=perf) as cap:
        for n in (1, 2, 3):  # resumed at step 1: the first step is not sampled
            with otel_tunix.step(n):
                time.sleep(0.02)
    (session,) = cap.sessions
    assert (session.steps, session.sampled_steps) == (3, 1)
    # From the start of step 1 to the end of step 3: three 20 ms sleeps, not one.
    # (A start never set would read from the clock's zero: far more than a second.)
    assert 0.06 <= session.wall_time_sec < 5.0
    assert session.steps_per_sec <= 3 / 0.06


def test_component_times_as_tuples_and_as_objects_agree():
    """Sinks read a step's component times as plain tuples; ``components`` (made on first
    access) and the JSON line give the same numbers."""
    from otel_tunix.accounting.step_time import account_intervals
    from otel_tunix.model.steps import ComponentTime

    ivs = [("load", True, 0, 20), ("compute", False, 20, 60), ("compute", False, 30, 70)]
    s = account_intervals("train", 1, 0, 100, ivs)
    assert s.component_times == {"load": (0.0, 20 * 1e-9, 1), "compute": (50 * 1e-9, 0.0, 2)}
    comps = s.components
    assert comps is s.components  # made once
    assert comps == {
        "load": ComponentTime(0.0, 20 * 1e-9, 1),
        "compute": ComponentTime(50 * 1e-9, 0.0, 2),
    }
    assert s.to_json()["components"] == {k: v.to_json() for k, v in comps.items()}


def test_session_totals_of_batches_with_changing_component_names_match_step_by_step_sums():
    """The worker adds a batch of steps a column at a time, over runs of steps whose
    components have the same names in the same order; every mix of orders, new names, steps
    without components and scopes must give what adding each step's times one by one gives."""
    import random

    from otel_tunix.accounting.step_time import account_intervals
    from otel_tunix.consumers.step_accounting import StepAccountingProcessor
    from otel_tunix.model.steps import ScopeSession

    rng = random.Random(7)
    layouts = [("load", "compute"), ("compute", "load"), ("load", "compute", "save"), ()]
    summaries = []
    for n in range(300):
        t, comps = 0, []
        for name in rng.choice(layouts) if rng.random() < 0.8 else layouts[0]:
            d = rng.randrange(1, 1000)
            comps.append((name, name == "save" and rng.random() < 0.5, t, t + d))
            t += d + rng.randrange(0, 50)
        summaries.append(account_intervals(rng.choice(("train", "eval")), n, 0, t + 10, comps))
    expected: dict[str, dict[str, list[float]]] = {}
    for s in summaries:
        totals = expected.setdefault(s.scope, {})
        for name, (busy, blocked, count) in s.component_times.items():
            acc = totals.setdefault(name, [0.0, 0.0, 0])
            acc[0] += busy
            acc[1] += blocked
            acc[2] += count

    proc = StepAccountingProcessor()
    for i in range(0, len(summaries), 37):  # batches of several scopes and layouts
        proc._publish(summaries[i : i + 37])
    one_call = ScopeSession("train")
    one_call.add_all(s for s in summaries if s.scope == "train")
    sessions = {s.scope: s for s in proc.sessions()}
    assert set(sessions) == {"train", "eval"}
    for scope, session in [*sessions.items(), ("train", one_call)]:
        mine = [s for s in summaries if s.scope == scope]
        assert session.sampled_steps == len(mine)
        assert session.step_time_sec == pytest.approx(sum(s.step_time_sec for s in mine))
        assert session.idle_time_sec == pytest.approx(sum(s.idle_time_sec for s in mine))
        got = {
            k: [v.busy_time_sec, v.blocked_time_sec, v.count] for k, v in session.components.items()
        }
        assert set(got) == set(expected[scope])
        for name, times in got.items():
            assert times == pytest.approx(expected[scope][name]), name
        assert got["save"][1] > 0 and got["save"][0] > 0  # both kinds under one name
