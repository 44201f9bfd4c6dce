"""step() / component(): spans, parentage, sampling, filters, threads, asyncio, errors."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from opentelemetry.trace import StatusCode

import otel_tunix
from otel_tunix.settings import attributes as attr
from otel_tunix.testing import capture


def _by_name(spans):
    out = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


def test_step_and_component_spans_have_names_attributes_and_parents():
    with capture(service_name="svc") as cap:
        for n in range(2):
            with otel_tunix.step(n, scope="train"):
                with otel_tunix.component("train_data_load"):
                    pass
                with otel_tunix.component("train_queue_wait", blocked=True):
                    pass
        spans = cap.spans()
    names = [s.name for s in spans]
    assert names == ["train_data_load", "train_queue_wait", "train_step"] * 2
    by = _by_name(spans)
    for i in range(2):
        step_span = by["train_step"][i]
        load, wait = by["train_data_load"][i], by["train_queue_wait"][i]
        assert step_span.parent is None
        assert load.parent.span_id == step_span.context.span_id
        assert wait.parent.span_id == step_span.context.span_id
        assert load.context.trace_id == step_span.context.trace_id
        assert step_span.attributes[attr.STEP] == i
        assert step_span.attributes[attr.SCOPE] == "train"
        assert step_span.attributes[attr.SPAN_TYPE] == "step"
        assert load.attributes[attr.COMPONENT] == "train_data_load"
        assert load.attributes[attr.TIME_KIND] == "busy"
        assert wait.attributes[attr.TIME_KIND] == "blocked"
        assert load.attributes[attr.THREAD_NAME] == threading.current_thread().name
        assert step_span.resource.attributes["service.name"] == "svc"
        assert step_span.start_time <= load.start_time <= load.end_time <= step_span.end_time
    # one trace per step
    assert by["train_step"][0].context.trace_id != by["train_step"][1].context.trace_id


def test_scopes_name_the_step_span():
    with capture() as cap:
        for scope in ("train", "eval", "rl/actor", "rl/learner", "my-scope"):
            with otel_tunix.step(0, scope=scope):
                pass
        names = [s.name for s in cap.spans()]
    assert names == ["train_step", "eval_step", "rl/actor_step", "rl/learner_step", "my-scope_step"]


def test_sampling_rate_keeps_only_multiples_and_components_follow():
    perf = otel_tunix.PerformanceMetricsConfig(sampling_rate=4)
    with capture(perf=perf) as cap:
        for n in range(10):
            with otel_tunix.step(n), otel_tunix.component("train_step_compute"):
                pass
        spans = cap.spans()
        steps = sorted(s.attributes[attr.STEP] for s in spans if s.name == "train_step")
        comps = sorted(s.attributes[attr.STEP] for s in spans if s.name == "train_step_compute")
        counts = cap.metrics()["tunix.steps"]
    assert steps == [0, 4, 8]
    assert comps == [0, 4, 8]
    assert counts[0].value == 10  # every step is counted, sampled or not


def test_component_filter_records_only_listed_names():
    perf = otel_tunix.PerformanceMetricsConfig(components=("train_step_compute",))
    with capture(perf=perf) as cap:
        with otel_tunix.step(0):
            with otel_tunix.component("train_data_load") as c:
                assert not c.recording
            with otel_tunix.component("train_step_compute") as c:
                assert c.recording
        names = [s.name for s in cap.spans()]
    assert names == ["train_step_compute", "train_step"]


def test_nested_components_parent_each_other():
    with capture() as cap:
        with otel_tunix.step(0):
            with otel_tunix.component("outer"):
                with otel_tunix.component("inner"):
                    pass
        by = _by_name(cap.spans())
    assert by["inner"][0].parent.span_id == by["outer"][0].context.span_id
    assert by["outer"][0].parent.span_id == by["train_step"][0].context.span_id


def test_foreign_otel_spans_nest_under_components_and_ours_under_theirs():
    with capture() as cap:
        tracer = cap.tracer_provider.get_tracer("user-code")
        with otel_tunix.step(0):
            with otel_tunix.component("rollout"):
                with tracer.start_as_current_span("http.request"):
                    with otel_tunix.component("decode"):
                        with tracer.start_as_current_span("db.query"):
                            pass
            with tracer.start_as_current_span("after"):
                pass
        by = _by_name(cap.spans())
    step_id = by["train_step"][0].context.span_id
    trace_id = by["train_step"][0].context.trace_id
    assert by["http.request"][0].parent.span_id == by["rollout"][0].context.span_id
    assert by["decode"][0].parent.span_id == by["http.request"][0].context.span_id
    assert by["db.query"][0].parent.span_id == by["decode"][0].context.span_id
    assert by["after"][0].parent.span_id == step_id
    assert {s.context.trace_id for ss in by.values() for s in ss} == {trace_id}


def test_step_joins_the_applications_current_trace():
    with capture() as cap:
        tracer = cap.tracer_provider.get_tracer("app")
        with tracer.start_as_current_span("training_run") as run:
            with otel_tunix.step(0):
                pass
        by = _by_name(cap.spans())
    assert by["train_step"][0].parent.span_id == run.get_span_context().span_id
    assert by["train_step"][0].context.trace_id == run.get_span_context().trace_id


def test_exception_propagates_unchanged_and_marks_the_span():
    class Boom(RuntimeError):
        pass

    err = Boom("bad batch")
    with capture() as cap:
        with pytest.raises(Boom) as info:
            with otel_tunix.step(0), otel_tunix.component("train_step_compute"):
                raise err
        assert info.value is err
        by = _by_name(cap.spans())
        summary = cap.summaries[0]
    comp = by["train_step_compute"][0]
    assert comp.status.status_code is StatusCode.ERROR
    assert "bad batch" in comp.status.description
    event = comp.events[0]
    assert event.name == "exception"
    assert event.attributes["exception.type"].endswith("<locals>.Boom")
    assert "raise err" in event.attributes["exception.stacktrace"]
    assert by["train_step"][0].status.status_code is StatusCode.ERROR
    assert summary.spans[0].error and "bad batch" in summary.spans[0].error


def test_threads_with_copied_context_pool_and_raw_threads():
    seen: dict[str, tuple[bool, object, bool, object]] = {}

    def work(name: str) -> None:
        before = (otel_tunix.in_step(), otel_tunix.current_step())
        with otel_tunix.component(name):
            seen[name] = (*before, otel_tunix.in_step(), otel_tunix.current_step())
            time.sleep(0.005)

    with capture() as cap:
        with otel_tunix.step(0):
            view = otel_tunix.current_step()
            with otel_tunix.component("rollout"):
                ctx = contextvars.copy_context()
                t = threading.Thread(target=ctx.run, args=(work, "copied"), name="copier")
                t.start()
                t.join()
                with ThreadPoolExecutor(2, thread_name_prefix="pool") as pool:
                    futs = [pool.submit(contextvars.copy_context().run, work, "pooled")]
                    futs += [pool.submit(contextvars.copy_context().run, work, "pooled")]
                    [f.result() for f in futs]
            raw = threading.Thread(target=work, args=("raw",), name="raw-thread")
            raw.start()
            raw.join()
        by = _by_name(cap.spans())
    rollout = by["rollout"][0].context.span_id
    step_id = by["train_step"][0].context.span_id
    assert by["copied"][0].parent.span_id == rollout
    assert by["copied"][0].attributes[attr.THREAD_NAME] == "copier"
    assert [s.parent.span_id for s in by["pooled"]] == [rollout, rollout]
    assert all(s.attributes[attr.THREAD_NAME].startswith("pool") for s in by["pooled"])
    # a raw thread has no context: it records into the open step, under the step span
    assert by["raw"][0].parent.span_id == step_id
    assert by["raw"][0].attributes[attr.THREAD_NAME] == "raw-thread"
    # ... and inside that component it is in the step; before it, it was not
    assert seen["raw"] == (False, None, True, view)
    assert seen["copied"] == (True, view, True, view) and view is not None


def test_asyncio_tasks_and_async_decorator():
    @otel_tunix.component("generate")
    async def generate(i: int) -> int:
        await asyncio.sleep(0.002)
        return i * 2

    async def main() -> list[int]:
        with otel_tunix.step(0, scope="rl/actor"):
            with otel_tunix.component("rollout"):
                return list(await asyncio.gather(*(generate(i) for i in range(3))))

    with capture() as cap:
        assert asyncio.run(main()) == [0, 2, 4]
        by = _by_name(cap.spans())
    rollout = by["rollout"][0].context.span_id
    assert len(by["generate"]) == 3
    assert {s.parent.span_id for s in by["generate"]} == {rollout}
    assert by["rl/actor_step"][0].attributes[attr.SCOPE] == "rl/actor"


def test_sync_decorator_keeps_function_and_records_each_call():
    @otel_tunix.component("checkpoint_save")
    def save(x: int) -> int:
        """Docstring kept."""
        return x + 1

    with capture() as cap:
        assert save(1) == 2  # outside a step: an outside component of its own
        with otel_tunix.step(0):
            assert save(2) == 3
            assert save(3) == 4
        spans = cap.spans()
    assert save.__doc__ == "Docstring kept."
    assert [s.name for s in spans] == ["checkpoint_save"] * 3 + ["train_step"]
    assert [bool(s.attributes.get(attr.OUTSIDE)) for s in spans] == [True, False, False, False]


def test_step_attributes_and_sampled_flag():
    perf = otel_tunix.PerformanceMetricsConfig(sampling_rate=2)
    with capture(perf=perf) as cap:
        with otel_tunix.step(0) as s:
            assert s.sampled
            s.set_attribute("tunix.tokens", 4096)
        with otel_tunix.step(1) as s:
            assert not s.sampled
            s.set_attribute("ignored", 1)
        spans = cap.spans()
    assert len(spans) == 1
    assert spans[0].attributes["tunix.tokens"] == 4096


def test_step_before_configure_is_a_noop_with_one_warning(caplog):
    from otel_tunix.recording import step as _step

    _step._quiet = False
    from otel_tunix.support import errors as _errors

    _errors._warned.discard("not-configured")
    with caplog.at_level(logging.WARNING, logger="otel_tunix"):
        for n in range(3):
            with otel_tunix.step(n), otel_tunix.component("x") as c:
                assert not c.recording
    warnings = [r for r in caplog.records if "before otel_tunix.configure" in r.message]
    assert len(warnings) == 1


def test_enabled_false_records_nothing_but_loop_runs():
    with capture(perf=otel_tunix.PerformanceMetricsConfig(enabled=False)) as cap:
        for n in range(3):
            with otel_tunix.step(n), otel_tunix.component("x"):
                pass
        assert cap.spans() == []


def test_device_end_ends_the_span_at_device_completion():
    # The "device" finishes 30 ms after the test lets it go, which it does once the host has
    # left the step: the orderings below hold by construction, whatever the machine's load,
    # and the bounds are the test's own clock readings (span times are perf_counter ns).
    released = threading.Event()
    released_at: list[int] = []

    def device_done() -> int:
        assert released.wait(10)
        time.sleep(0.03)
        return time.perf_counter_ns()

    with capture(clock=time.perf_counter_ns) as cap:
        with otel_tunix.step(0):
            with otel_tunix.component("train_step_compute") as c:
                time.sleep(0.01)
                c.end_on_device(device_done)
            with otel_tunix.component("given_upfront", device_end=lambda: None):
                pass
        released_at.append(time.perf_counter_ns())
        released.set()
        by = _by_name(cap.spans())
        summary = cap.summaries[0]
        metrics = cap.metrics()
    comp = by["train_step_compute"][0]
    host = comp.attributes[attr.HOST_DURATION]
    device = (comp.end_time - comp.start_time) / 1e9
    assert comp.attributes[attr.DEVICE_END] is True
    assert host >= 0.01
    # The device ended >= 30 ms after the release, which came after the host's end.
    assert comp.end_time >= released_at[0] + 30_000_000
    assert comp.start_time + host * 1e9 <= released_at[0]
    assert device >= host + 0.03
    step_span = by["train_step"][0]
    assert step_span.end_time < comp.end_time  # the device outlives the step's host window
    assert attr.DEVICE_END not in by["given_upfront"][0].attributes  # None keeps host time
    # Host timeline: the component counts inside the step's window only; the device time
    # and the lag after the window are reported apart.
    in_window = (step_span.end_time - comp.start_time) / 1e9
    busy = summary.components["train_step_compute"].busy_time_sec
    assert busy == pytest.approx(in_window, abs=1e-6)
    # busy is the host window (equality above), never the device's span: the device ended
    # >= 30 ms after the step's end (by construction), so counting it would break this.
    assert host <= busy <= (released_at[0] - comp.start_time) / 1e9 < device - 0.03
    assert summary.device_times == {"train_step_compute": pytest.approx(device, abs=1e-6)}
    assert summary.device_lag_sec == pytest.approx((comp.end_time - step_span.end_time) / 1e9)
    assert summary.device_lag_sec >= 0.03  # released after the step, then 30 ms
    lag = metrics["tunix.step.device_lag"][0]
    assert lag.count == 1 and lag.sum == pytest.approx(summary.device_lag_sec)
    (device_time,) = metrics["tunix.component.device_time"]
    assert dict(device_time.attributes)["component"] == "train_step_compute"
    assert device_time.sum == pytest.approx(device, abs=1e-6)


def test_device_end_accepts_a_future_and_a_failing_resolver_keeps_host_time(caplog):
    from concurrent.futures import Future

    fut: Future[int] = Future()
    with capture() as cap:
        with otel_tunix.step(0):
            with otel_tunix.component("a") as c:
                c.end_on_device(fut)
            with otel_tunix.component("b") as c:
                c.end_on_device(lambda: 1 / 0)
        time.sleep(0.01)
        fut.set_result(time.perf_counter_ns())
        by = _by_name(cap.spans())
    assert by["a"][0].attributes[attr.DEVICE_END] is True
    assert attr.DEVICE_END not in by["b"][0].attributes
    assert any("device-end resolver" in r.message for r in caplog.records)


def test_a_component_left_in_another_context_still_ends_its_span(caplog):
    from otel_tunix.support import errors as _errors

    _errors._warned.discard("component-context")
    """On the step's thread the innermost component is kept on the step, so leaving it in
    another context restores it like any exit. In a thread given a copy of the context it is
    in the context variable, which cannot be restored from another context (reported); the
    span ends and the step is processed at once either way."""

    def cross(name: str) -> None:
        c = otel_tunix.component(name)
        c.__enter__()
        contextvars.copy_context().run(c.__exit__, None, None, None)

    with capture() as cap:
        with otel_tunix.step(0):
            cross("crossed")
            with otel_tunix.component("after"):
                pass
        with caplog.at_level(logging.ERROR, logger="otel_tunix"):
            assert not any("closing a component" in r.message for r in caplog.records)
        with otel_tunix.step(1):
            t = threading.Thread(target=contextvars.copy_context().run, args=(cross, "thread"))
            t.start()
            t.join()
        t0 = time.perf_counter()
        by = _by_name(cap.spans())
        assert time.perf_counter() - t0 < 5  # not held back as still open
    assert by["after"][0].parent.span_id == by["train_step"][0].context.span_id
    for name in ("crossed", "thread"):
        assert attr.INCOMPLETE not in by[name][0].attributes
        assert by[name][0].end_time >= by[name][0].start_time
    assert any("closing a component failed" in r.message for r in caplog.records)
    _errors._warned.discard("component-context")


def test_an_event_loop_run_inside_a_component_nests_its_tasks_under_it():
    """Tasks interleave on the step's thread: their components use the context variable, and
    take the component the loop was run from as their parent."""

    async def work(i: int) -> None:
        with otel_tunix.component(f"task{i}"):
            await asyncio.sleep(0.001)
            with otel_tunix.component(f"inner{i}"):
                await asyncio.sleep(0.001)

    async def both() -> None:
        await asyncio.gather(work(0), work(1))

    with capture() as cap:
        with otel_tunix.step(0):
            with otel_tunix.component("rollout"):
                asyncio.run(both())
            with otel_tunix.component("after"):
                pass
        by = _by_name(cap.spans())
    rollout = by["rollout"][0].context.span_id
    assert by["task0"][0].parent.span_id == by["task1"][0].parent.span_id == rollout
    for i in (0, 1):
        assert by[f"inner{i}"][0].parent.span_id == by[f"task{i}"][0].context.span_id
    assert by["after"][0].parent.span_id == by["train_step"][0].context.span_id


def test_components_interleaving_in_contexts_of_one_thread_nest_right_while_trio_is_loaded(
    monkeypatch,
):
    """Trio runs its tasks on one thread, each in its own context, with no asyncio loop:
    while it is loaded, components keep the innermost one in the context variable. Trio is
    not installed here: a module of that name stands in for it, and two generators, each
    resumed in its own context, interleave as two trio tasks would."""
    import sys
    import types

    def task(name: str):
        with otel_tunix.component(name):
            yield
            with otel_tunix.component(f"{name}.inner"):
                yield

    monkeypatch.setitem(sys.modules, "trio", types.ModuleType("trio"))
    with capture() as cap:
        with otel_tunix.step(0):
            tasks = [(contextvars.copy_context(), task(n)) for n in ("a", "b")]
            for _ in range(3):  # a enters, b enters, a's inner, b's inner, both leave
                for ctx, gen in tasks:
                    ctx.run(next, gen, None)
        by = _by_name(cap.spans())
    step_id = by["train_step"][0].context.span_id
    assert by["a"][0].parent.span_id == by["b"][0].parent.span_id == step_id
    assert by["a.inner"][0].parent.span_id == by["a"][0].context.span_id
    assert by["b.inner"][0].parent.span_id == by["b"][0].context.span_id


def test_a_reused_component_object_does_not_carry_a_device_end_into_its_next_use():
    with capture() as cap:
        c = otel_tunix.component("reused")
        with otel_tunix.step(0):
            with c:
                c.end_on_device(lambda: time.perf_counter_ns() + 50_000_000)
            with c:
                pass
        first, second = sorted(_by_name(cap.spans())["reused"], key=lambda s: s.start_time)
    assert first.attributes[attr.DEVICE_END] is True
    assert first.end_time - first.start_time >= 40_000_000
    assert attr.DEVICE_END not in second.attributes
    assert second.end_time - second.start_time < 40_000_000
    assert first.context.span_id != second.context.span_id


def test_a_component_still_open_at_shutdown_is_closed_then_and_marked_incomplete(tmp_path):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    otel_tunix.configure(output_dir=tmp_path / "run", span_exporters=[exporter])
    started, release = threading.Event(), threading.Event()

    def straggle() -> None:
        with otel_tunix.component("straggler"):
            started.set()
            release.wait(10)

    with otel_tunix.step(0):
        with otel_tunix.component("done") as c:
            c.set_attribute("rows", 3)
        t = threading.Thread(target=contextvars.copy_context().run, args=(straggle,))
        t.start()
        assert started.wait(5)
    before_shutdown = time.time_ns()
    otel_tunix.shutdown()  # the step is processed without its straggler, closed here
    release.set()
    t.join(5)
    by = _by_name(exporter.get_finished_spans())
    straggler, done = by["straggler"][0], by["done"][0]
    assert straggler.attributes[attr.INCOMPLETE] is True
    assert before_shutdown <= straggler.end_time <= time.time_ns()
    assert attr.INCOMPLETE not in done.attributes and done.attributes["rows"] == 3
    assert straggler.attributes[attr.THREAD_NAME] == t.name != done.attributes[attr.THREAD_NAME]
    import json

    lines = [json.loads(x) for x in (tmp_path / "run" / "spans.jsonl").read_text().splitlines()]
    (step,) = [x for x in lines if x["type"] == "step"]
    spans = {sp["name"]: sp for sp in step["spans"]}
    assert "straggler" not in spans  # still running on its thread when the step was written
    assert "attributes" not in spans["done"]  # the JSONL keeps otel-tunix's own extras only
    (line,) = [x for x in lines if x["type"] == "span"]  # its own line, once closed
    assert (line["name"], line["step"]) == ("straggler", 0)
    assert line["attributes"] == {attr.INCOMPLETE: True, attr.BACKGROUND: True}
    assert line["end_ns"] == straggler.end_time and line["trace_id"] == step["trace_id"]


def test_otel_sdk_disabled_keeps_api_working_and_exports_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    info = otel_tunix.configure(output_dir=tmp_path / "run")
    assert not info.enabled
    for n in range(3):
        with otel_tunix.step(n), otel_tunix.component("x") as c:
            assert not c.recording
    otel_tunix.get_metrics_logger().log("loss", 1.0, step=0)
    assert otel_tunix.shutdown() == []
    assert not (tmp_path / "run").exists()


def test_integration_api_record_component_start_ns_attributes_and_current_step():
    with capture() as cap:
        assert otel_tunix.current_step() is None and not otel_tunix.in_step()
        t0 = time.perf_counter_ns()
        time.sleep(0.002)
        with otel_tunix.step(0, start_ns=t0) as s:
            assert s.sampled and otel_tunix.in_step()
            view = otel_tunix.current_step()
            assert view is not None and (view.scope, view.number) == ("train", 0)
            view.set_attribute("tunix.tokens", 128)
            with otel_tunix.component("outer") as c:
                c.set_attribute("tunix.micro_batch", 3)
                a = time.perf_counter_ns()
                otel_tunix.record_component("compile", a - 1_000_000, a, attributes={"fn": "f"})
        with otel_tunix.step(1, start_ns=t0):
            pass
        by = _by_name(cap.spans())
        meter = otel_tunix.get_meter()
        assert meter is not None
    step0 = by["train_step"][0]
    assert step0.start_time <= by["compile"][0].start_time
    assert (step0.end_time - step0.start_time) / 1e9 >= 0.002  # started at t0
    assert step0.attributes["tunix.tokens"] == 128
    assert by["outer"][0].attributes["tunix.micro_batch"] == 3
    comp = by["compile"][0]
    assert comp.parent.span_id == by["outer"][0].context.span_id
    assert comp.attributes["fn"] == "f"
    assert comp.end_time - comp.start_time == 1_000_000


def test_in_step_true_for_unsampled_steps():
    with capture(perf=otel_tunix.PerformanceMetricsConfig(sampling_rate=2)):
        with otel_tunix.step(1):
            assert otel_tunix.in_step() and otel_tunix.current_step() is None
        assert not otel_tunix.in_step()


def test_components_made_in_an_unsampled_step_are_shared_stand_ins_that_record_nothing():
    import contextlib

    perf = otel_tunix.PerformanceMetricsConfig(sampling_rate=2)
    with capture(perf=perf) as cap:
        with otel_tunix.step(1):  # not sampled
            a, b = otel_tunix.component("load"), otel_tunix.component("load")
            assert a is b  # one stand-in per name: no object per use
            assert isinstance(a, otel_tunix.Unrecorded)
            wait = otel_tunix.component("load", blocked=True)
            assert wait is not a and wait._blocked is True
            with a as c:
                assert c.recording is False and c.span_attributes is None
                c.set_attribute("k", 1)  # ignored, no error
                c.end_on_device(lambda: 0)
            err = KeyError("boom")
            with pytest.raises(KeyError) as info, otel_tunix.component("compute"):
                raise err
            assert info.value is err  # unchanged
            with contextlib.ExitStack() as stack:  # calls __enter__ with the manager
                assert stack.enter_context(otel_tunix.component("x")).recording is False
            otel_tunix.record_component("late", 1, 2)  # records nothing, never raises
            assert not a.recording
        with otel_tunix.step(2):  # sampled: the stand-in made above still records nothing
            with a:
                pass
            with otel_tunix.component("load") as real:
                assert real.recording and isinstance(real, otel_tunix.Component)
        names = [s.name for s in cap.spans()]
    assert names == ["load", "train_step"]


def test_a_decorator_made_in_an_unsampled_step_records_calls_in_sampled_steps():
    perf = otel_tunix.PerformanceMetricsConfig(sampling_rate=2)
    with capture(perf=perf) as cap:
        with otel_tunix.step(1):

            @otel_tunix.component("queue_get", blocked=True)
            def get(x):
                return x + 1

            assert get(1) == 2  # not sampled: not recorded
        with otel_tunix.step(2):
            assert get(2) == 3
        spans = _by_name(cap.spans())
    assert len(spans["queue_get"]) == 1
    assert spans["queue_get"][0].attributes[attr.TIME_KIND] == "blocked"
    assert spans["queue_get"][0].attributes[attr.STEP] == 2


def test_a_component_made_outside_steps_is_reused_and_follows_each_steps_sampling():
    perf = otel_tunix.PerformanceMetricsConfig(sampling_rate=2)
    with capture(perf=perf) as cap:
        load = otel_tunix.component("load")
        assert isinstance(load, otel_tunix.Component)
        for n in range(5):
            with otel_tunix.step(n), load as c:
                assert c is load and c.recording == (n % 2 == 0)
        steps = [s.attributes[attr.STEP] for s in cap.spans() if s.name == "load"]
    assert steps == [0, 2, 4]


def test_stand_ins_are_kept_for_a_bounded_number_of_names(monkeypatch):
    from otel_tunix.recording import component as _component

    monkeypatch.setattr(_component, "_unrecorded", {})
    monkeypatch.setattr(_component, "_MAX_UNRECORDED", 3)
    perf = otel_tunix.PerformanceMetricsConfig(sampling_rate=2)
    with capture(perf=perf), otel_tunix.step(1):
        made = [otel_tunix.component(f"layer_{i}") for i in range(5)]
        assert sorted(_component._unrecorded) == ["layer_0", "layer_1", "layer_2"]
        assert otel_tunix.component("layer_4") is not made[4]  # past the bound: made anew
        assert otel_tunix.component("layer_0") is made[0]
        assert all(not m.recording for m in made)


def test_component_span_attributes_follow_each_step_scope_thread_and_kind():
    """The span builder reuses a component's attributes from step to step (a copy with the
    step's number): each span still gets its own step, scope, thread and kind, and a later
    step never changes the attributes of an earlier step's spans."""

    def in_thread(n: int) -> None:
        with otel_tunix.component("work"):
            pass

    with capture(perf=otel_tunix.PerformanceMetricsConfig(sampling_rate=1)) as cap:
        for n in range(3):
            with otel_tunix.step(n):
                with otel_tunix.component("work"):
                    pass
                with otel_tunix.component("work"):  # twice in one step
                    pass
        cap.flush()
        early = {id(s): dict(s.attributes) for s in cap.spans()}
        with otel_tunix.step(3, scope="eval"):
            with otel_tunix.component("work"):
                pass
        with otel_tunix.step(4):
            with otel_tunix.component("work"):
                pass
        with otel_tunix.step(5):
            t = threading.Thread(target=contextvars.copy_context().run, args=(in_thread, 5))
            t.start()
            t.join()
        for n, blocked in ((6, False), (7, True)):  # each step differs from the last
            with otel_tunix.step(n):  # in one thing only (scope, thread, then kind)
                with otel_tunix.component("work", blocked=blocked):
                    pass
        cap.flush()
        spans = [s for s in cap.spans() if s.name == "work"]
    got = [
        (s.attributes[attr.STEP], s.attributes[attr.SCOPE], s.attributes[attr.TIME_KIND],
         s.attributes[attr.THREAD_NAME])
        for s in spans
    ]  # fmt: skip
    main = threading.current_thread().name
    assert got == [
        (0, "train", "busy", main), (0, "train", "busy", main),
        (1, "train", "busy", main), (1, "train", "busy", main),
        (2, "train", "busy", main), (2, "train", "busy", main),
        (3, "eval", "busy", main), (4, "train", "busy", main),
        (5, "train", "busy", t.name), (6, "train", "busy", main),
        (7, "train", "blocked", main),
    ]  # fmt: skip
    for s in cap.spans():  # the first steps' spans as they were when first read
        if id(s) in early:
            assert dict(s.attributes) == early[id(s)]


def test_a_step_inside_a_step_is_said_once_and_recorded_as_documented(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with capture() as cap, caplog.at_level(logging.WARNING):
        for n in range(3):
            with otel_tunix.step(n, scope="train"):
                with otel_tunix.step(n, scope="eval"), otel_tunix.component("eval_batch"):
                    time.sleep(0.005)
        cap.flush()
    said = [r.getMessage() for r in caplog.records if "steps do not nest" in r.getMessage()]
    assert len(said) == 1
    assert said[0].startswith(
        "otel_tunix.step(0, scope='eval') was opened inside step 0 of scope 'train'"
    )
    by_scope: dict[str, list[Any]] = {}
    for s in cap.summaries:
        by_scope.setdefault(s.scope, []).append(s)
    assert [s.step for s in by_scope["eval"]] == [0, 1, 2]
    for outer, inner in zip(by_scope["train"], by_scope["eval"], strict=True):
        # the inner step is a step of its own; the outer one is all idle
        assert inner.busy_time_sec == pytest.approx(inner.components["eval_batch"].busy_time_sec)
        assert inner.busy_time_sec >= 0.005
        assert outer.busy_time_sec == 0.0
        assert outer.idle_time_sec == pytest.approx(outer.step_time_sec)
        assert outer.step_time_sec >= inner.step_time_sec
    spans = {
        (s.name, s.attributes["tunix.step"]): s for s in cap.spans() if s.name.endswith("_step")
    }
    for n in range(3):
        inner_span, outer_span = spans[("eval_step", n)], spans[("train_step", n)]
        assert inner_span.context.trace_id == outer_span.context.trace_id
        assert inner_span.parent is not None
        assert inner_span.parent.span_id == outer_span.context.span_id


def test_a_step_inside_a_component_of_a_step_is_that_phases_loop_and_not_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with capture() as cap, caplog.at_level(logging.WARNING):
        with otel_tunix.step(0), otel_tunix.component("evaluate"):
            for i in range(2):
                with otel_tunix.step(i, scope="eval"), otel_tunix.component("eval_batch"):
                    time.sleep(0.002)
        cap.flush()
    assert not [r for r in caplog.records if "steps do not nest" in r.getMessage()]
    train = next(s for s in cap.summaries if s.scope == "train")
    evals = [s for s in cap.summaries if s.scope == "eval"]
    assert len(evals) == 2
    assert train.components["evaluate"].busy_time_sec >= sum(s.step_time_sec for s in evals)
