"""Work on other threads that outlives its step (an async checkpoint writer, an RL actor
thread): no finished step waits for it, its time is counted in the steps where it ran, and
a thread started inside a step does not stay in that step's trace.

Ground truths are read by the tests' own clock around each step and each component: the
readings just inside a ``with`` and just outside it bracket what otel-tunix records, so the
time a component ran inside the steps lies between the overlaps of the inner readings and
those of the outer ones, however loaded the machine.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import otel_tunix
from otel_tunix.analysis.report import breakdown_rows
from otel_tunix.exporters.perfetto.converter import convert_jsonl_to_perfetto
from otel_tunix.instrumentation._threads import carry_into_threads, stop_carrying_into_threads
from otel_tunix.settings import attributes as attr
from otel_tunix.testing import capture

clock = time.perf_counter_ns
Window = tuple[int, int, int, int]
"""(before entering, just inside, just before leaving, after leaving), by the test's clock."""


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> int:
    return max(0, min(a[1], b[1]) - max(a[0], b[0]))


def _bracket(steps: list[Window], work: list[Window]) -> tuple[float, float]:
    """The least and the most time ``work`` can have run inside ``steps``: the overlaps of
    the inner readings, and of the outer ones (seconds)."""
    inner = sum(_overlap((s[1], s[2]), (w[1], w[2])) for s in steps for w in work)
    outer = sum(_overlap((s[0], s[3]), (w[0], w[3])) for s in steps for w in work)
    return inner / 1e9, outer / 1e9


def _timed_step(n: int, body: Callable[[int], None], windows: list[Window]) -> None:
    before = clock()
    with otel_tunix.step(n):
        inside = clock()
        body(n)
        leaving = clock()
    windows.append((before, inside, leaving, clock()))


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _component_total(summaries: list[Any], name: str) -> float:
    return sum(s.component_times[name][0] for s in summaries if name in s.component_times)


def test_a_long_component_on_another_thread_holds_no_step_back(tmp_path: Path) -> None:
    """One component open on a writer thread while 5,000 steps of 0.15 ms run: more steps
    than the worker's queue holds (4,096) finish behind it, none is dropped, and each is
    processed while the component still runs."""
    steps = 5000
    started, finish = threading.Event(), threading.Event()
    work: list[Window] = []

    def writer() -> None:
        before = clock()
        with otel_tunix.component("ckpt_write"):
            inside = clock()
            started.set()
            finish.wait(60)
            leaving = clock()
        work.append((before, inside, leaving, clock()))

    windows: list[Window] = []
    thread = threading.Thread(target=writer, name="ckpt-writer")

    def body(n: int) -> None:
        if n == 10:
            thread.start()
            assert started.wait(10)
        with otel_tunix.component("compute"):
            _spin(0.00015)  # a pace the worker keeps up with on a loaded machine
        if n == steps - 500:  # the writer ends while steps still run
            finish.set()

    with capture(output_dir=tmp_path) as cap:
        for n in range(steps):
            _timed_step(n, body, windows)
            if n == 100:  # the writer's component is open: the steps before are processed
                cap.flush()
                assert [s.step for s in cap.summaries] == list(range(101))
        thread.join()
        cap.flush()
        spans = cap.spans()
    summaries = cap.summaries
    assert [s.step for s in summaries] == list(range(steps))  # none dropped, in order
    low, high = _bracket(windows, work)
    counted = _component_total(summaries, "ckpt_write")
    assert low - 1e-9 <= counted <= high + 1e-9, (low, counted, high)
    assert high - low < 0.25 * low  # the bracket is tight: the check means something
    (session,) = cap.sessions
    assert session.components["ckpt_write"].busy_time_sec == pytest.approx(counted)
    assert session.background_time_sec == pytest.approx(counted)
    table = {r.name: r for r in breakdown_rows(cap.sessions)}  # the demo's terminal table
    assert table["background"].mean_sec == pytest.approx(counted / steps)
    for s in summaries:  # the training thread's own breakdown still fits its window
        total = s.busy_time_sec + s.blocked_time_sec + s.idle_time_sec
        assert total == pytest.approx(s.step_time_sec, abs=1e-9)
        if "ckpt_write" in s.component_times:
            assert s.background_time_sec == pytest.approx(s.component_times["ckpt_write"][0])
            assert s.busy_time_sec <= s.step_time_sec
    # one span, its real length, in the trace of the step it started in
    (span,) = [sp for sp in spans if sp.name == "ckpt_write"]
    (w,) = work
    assert w[2] - w[1] <= span.end_time - span.start_time <= w[3] - w[0]  # type: ignore[operator]
    assert span.attributes[attr.BACKGROUND] is True
    step10 = next(sp for sp in spans if sp.name == "train_step" and sp.attributes[attr.STEP] == 10)
    assert span.context.trace_id == step10.context.trace_id
    assert span.parent is not None and span.parent.span_id == step10.context.span_id
    # the local files: the steps it overlapped count it, its span has a line of its own
    lines = [json.loads(x) for x in (tmp_path / "spans.jsonl").read_text().splitlines()]
    in_file = [x for x in lines if x["type"] == "step"]
    assert len(in_file) == steps
    assert sum(
        x["components"]["ckpt_write"]["busy_time_sec"]
        for x in in_file
        if "ckpt_write" in x["components"]
    ) == pytest.approx(counted)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()[1:]]
    perf = [r["metrics"] for r in rows if "perf/train/step_time_sec" in r.get("metrics", {})]
    assert len(perf) == steps
    assert sum(m.get("perf/train/ckpt_write/busy_time_sec", 0.0) for m in perf) == (
        pytest.approx(counted)
    )
    assert sum(m.get("perf/train/background_time_sec", 0.0) for m in perf) == (
        pytest.approx(counted)
    )
    (line,) = [x for x in lines if x["type"] == "span"]
    assert (line["name"], line["step"], line["scope"]) == ("ckpt_write", 10, "train")
    assert line["end_ns"] - line["start_ns"] == span.end_time - span.start_time  # type: ignore[operator]
    # a Perfetto trace made from the file has every slice, the span line's included
    slices = convert_jsonl_to_perfetto(tmp_path / "spans.jsonl", tmp_path / "t.pftrace")
    assert slices == 2 * steps + 1


@pytest.mark.parametrize(("step_sec", "chunk_sec"), [(0.0003, 0.1), (0.03, 0.1), (0.03, 0.005)])
def test_chunks_written_on_another_thread_count_where_they_ran(
    step_sec: float, chunk_sec: float
) -> None:
    """A writer thread writes chunks beside a fast loop (steps of 0.3 ms) and a slow one
    (30 ms): each chunk's time is counted in the steps it overlaps, chunks that start
    between two steps included; none is lost, none counted twice."""
    stop = threading.Event()
    work: list[Window] = []

    def writer() -> None:
        while not stop.is_set():
            before = clock()
            with otel_tunix.component("ckpt_chunk"):
                inside = clock()
                time.sleep(chunk_sec)
                leaving = clock()
            work.append((before, inside, leaving, clock()))

    windows: list[Window] = []
    thread = threading.Thread(target=writer, name="ckpt-writer")

    def body(n: int) -> None:
        if n == 1:
            thread.start()
        with otel_tunix.component("compute"):
            _spin(step_sec)

    with capture() as cap:
        end = time.perf_counter() + 0.6
        n = 0
        while time.perf_counter() < end:
            _timed_step(n, body, windows)
            n += 1
        _timed_step(n, body, windows)
        stop.set()
        thread.join()
        cap.flush()
        spans = [sp for sp in cap.spans() if sp.name == "ckpt_chunk"]
    summaries = cap.summaries
    assert len(summaries) == n + 1
    low, high = _bracket(windows, work)
    counted = _component_total(summaries, "ckpt_chunk")
    assert low - 1e-9 <= counted <= high + 1e-9, (low, counted, high)
    assert counted > 0.5 * sum(w[2] - w[1] for w in work) / 1e9  # most of it ran in steps
    assert len(spans) == len(work)  # each chunk once, with its real length
    for sp, w in zip(sorted(spans, key=lambda sp: sp.start_time or 0), work, strict=True):
        assert w[2] - w[1] <= (sp.end_time or 0) - (sp.start_time or 0) <= w[3] - w[0]
    for s in summaries:
        total = s.busy_time_sec + s.blocked_time_sec + s.idle_time_sec
        assert total == pytest.approx(s.step_time_sec, abs=1e-9)
        assert s.background_time_sec <= s.step_time_sec + 1e-9


@pytest.fixture
def carrying() -> Iterator[None]:
    carry_into_threads()
    yield
    stop_carrying_into_threads()


@pytest.mark.usefixtures("carrying")
def test_an_actor_thread_started_in_a_step_has_traces_of_its_own() -> None:
    """An RL actor thread started inside learner step 0 (its context copied there) runs its
    own steps after step 0 ended: each is a trace of its own, linked to step 0."""
    go = threading.Event()
    done = threading.Event()

    def actor() -> None:
        assert go.wait(10)
        for k in range(1, 4):
            with otel_tunix.step(k, scope="rl/actor"), otel_tunix.component("rollout"):
                time.sleep(0.002)
        with tracer.start_as_current_span("actor_report"):  # other code's span, between
            pass
        done.set()

    with capture() as cap:
        tracer = cap.tracer_provider.get_tracer("test")
        with otel_tunix.step(0, scope="rl/learner"):
            thread = threading.Thread(target=actor, name="actor")
            thread.start()
        for n in range(1, 4):
            with otel_tunix.step(n, scope="rl/learner"), otel_tunix.component("train"):
                go.set()
                time.sleep(0.01)
        assert done.wait(10)
        thread.join()
        spans = cap.spans()
    learner0 = next(
        s for s in spans if s.name == "rl/learner_step" and s.attributes[attr.STEP] == 0
    )
    actor_steps = [s for s in spans if s.name == "rl/actor_step"]
    assert len(actor_steps) == 3
    traces = {s.context.trace_id for s in actor_steps}
    assert len(traces) == 3 and learner0.context.trace_id not in traces
    for s in actor_steps:
        assert s.parent is None
        (link,) = s.links
        assert link.context.span_id == learner0.context.span_id
        assert link.context.trace_id == learner0.context.trace_id
    for r in (s for s in spans if s.name == "rollout"):
        assert r.context.trace_id in traces
    report = next(s for s in spans if s.name == "actor_report")
    assert report.context.trace_id != learner0.context.trace_id and report.parent is None


def test_work_on_another_thread_after_the_last_step_is_a_span_of_its_own() -> None:
    """A final checkpoint written on a thread after the loop's last step: no step counts
    it, and its span (an outside component: a trace of its own) goes out when it ends."""

    def final_save() -> None:
        with otel_tunix.component("ckpt_write"):
            time.sleep(0.01)

    with capture() as cap:
        for n in range(3):
            with otel_tunix.step(n), otel_tunix.component("compute"):
                pass
        t = threading.Thread(target=final_save)
        t.start()
        t.join()
        cap.flush()
        spans = cap.spans()
    (save,) = [s for s in spans if s.name == "ckpt_write"]
    steps = [s for s in spans if s.name == "train_step"]
    assert save.parent is None and save.attributes[attr.OUTSIDE] is True
    assert save.context.trace_id not in {s.context.trace_id for s in steps}
    assert (save.end_time or 0) - (save.start_time or 0) >= 10_000_000
    assert all("ckpt_write" not in s.component_times for s in cap.summaries)


def test_a_users_sink_gets_the_background_spans_that_outlive_their_step() -> None:
    """A user's step sink runs on a thread of its own; the background spans handed on after
    their step (an asynchronous writer's) reach it too, with their step and real length."""
    from otel_tunix.consumers.step_accounting import StepSink

    class Sink(StepSink):
        def __init__(self) -> None:
            self.background: list[Any] = []

        def on_background_spans(self, spans: Any) -> None:
            self.background.extend(spans)

    sink = Sink()
    started = threading.Event()

    def writer() -> None:
        with otel_tunix.component("ckpt_write"):
            started.set()
            time.sleep(0.05)

    with capture(step_sinks=[sink]):
        with otel_tunix.step(0):
            t = threading.Thread(target=writer)
            t.start()
            started.wait()
        for n in range(1, 4):
            with otel_tunix.step(n), otel_tunix.component("compute"):
                time.sleep(0.02)
        t.join()
    (span,) = [s for s in sink.background if s.span().name == "ckpt_write"]
    assert (span.scope, span.number) == ("train", 0)
    assert span.span().end_time - span.span().start_time >= 50_000_000
