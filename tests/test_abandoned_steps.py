"""A step left open does not swallow the run: a step opened in a generator that is
abandoned, thrown into, or finished on another thread is closed (marked
``tunix.step.abandoned``) when the next step of its scope begins, and every later step
starts a trace of its own."""

from __future__ import annotations

import contextvars
import gc
import threading
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import otel_tunix


def _steps_in_a_generator(scope: str = "train") -> Iterator[int]:
    for n in range(3):
        with otel_tunix.step(n, scope=scope):
            with otel_tunix.component("generated"):
                yield n


def _run(how: str) -> list:
    exporter = InMemorySpanExporter()
    otel_tunix.configure(output_dir="none", span_exporters=[exporter], system_metrics=False)
    gen = _steps_in_a_generator()
    next(gen)  # step 0 open, its component too, the generator suspended inside them
    if how == "thread":  # the generator goes on, and leaves step 0, on another thread
        t = threading.Thread(target=next, args=(gen,))
        t.start()
        t.join()
    for n in range(10, 30):
        with otel_tunix.step(n), otel_tunix.component("work"):
            pass
        if n == 15 and how == "thrown into":
            with pytest.raises(RuntimeError):
                gen.throw(RuntimeError("stop"))
        if n == 15 and how == "dropped":
            del gen
            gc.collect()
    otel_tunix.shutdown()
    return [s for s in exporter.get_finished_spans() if s.name == "train_step"]


@pytest.mark.parametrize("how", ["abandoned", "dropped", "thrown into", "thread"])
def test_later_steps_start_their_own_traces(how: str) -> None:
    # in a context of its own: a step left open stays in the context it was left in
    steps = {s.attributes["tunix.step"]: s for s in contextvars.copy_context().run(_run, how)}
    later = [steps[n] for n in range(10, 30)]
    assert len({s.context.trace_id for s in later}) == 20  # was 1 (or 15) trace for 20 steps
    assert all(s.parent is None for s in later)
    first = steps[0]
    assert first.context.trace_id not in {s.context.trace_id for s in later}
    if how == "thread":  # it ended, on the other thread: an ordinary step
        assert "tunix.step.abandoned" not in first.attributes
        return
    # closed when step 10 began, marked as such
    assert first.attributes["tunix.step.abandoned"] is True
    assert first.status.status_code is StatusCode.ERROR
    assert "left open" in (first.status.description or "")
    assert first.end_time <= steps[10].start_time


def test_what_runs_where_an_ended_step_was_left_is_outside_any_step() -> None:
    def left_on_another_thread() -> None:
        exporter = InMemorySpanExporter()
        otel_tunix.configure(output_dir="none", span_exporters=[exporter], system_metrics=False)
        gen = _steps_in_a_generator()
        next(gen)
        t = threading.Thread(target=next, args=(gen,))  # step 0 ends there
        t.start()
        t.join()
        assert otel_tunix.current_step() is None  # (step 1 is open, in the thread's context)
        tracer = trace.get_tracer("app")
        with tracer.start_as_current_span("app work") as span:  # not under the ended step
            assert not span.parent
        otel_tunix.shutdown()

    contextvars.copy_context().run(left_on_another_thread)


def test_the_open_component_of_an_abandoned_step_ends_with_it_marked_incomplete() -> None:
    contextvars.copy_context().run(_open_component_of_an_abandoned_step)


def _open_component_of_an_abandoned_step() -> None:
    exporter = InMemorySpanExporter()
    otel_tunix.configure(output_dir="none", span_exporters=[exporter], system_metrics=False)
    gen = _steps_in_a_generator()
    next(gen)
    with otel_tunix.step(1):
        pass
    otel_tunix.shutdown()
    spans = exporter.get_finished_spans()
    (generated,) = [s for s in spans if s.name == "generated"]
    (first,) = [s for s in spans if s.name == "train_step" and s.attributes["tunix.step"] == 0]
    assert generated.attributes["tunix.incomplete"] is True
    assert generated.end_time <= first.end_time
    del gen


def test_a_step_of_another_scope_inside_a_step_still_nests_under_it() -> None:
    exporter = InMemorySpanExporter()
    otel_tunix.configure(output_dir="none", span_exporters=[exporter], system_metrics=False)
    with otel_tunix.step(0, scope="train"):
        for n in range(2):  # an evaluation round inside a training step
            with otel_tunix.step(n, scope="eval"), otel_tunix.component("eval_work"):
                pass
    otel_tunix.shutdown()
    spans = exporter.get_finished_spans()
    (train,) = [s for s in spans if s.name == "train_step"]
    evals = [s for s in spans if s.name == "eval_step"]
    assert len(evals) == 2
    assert all(s.parent is not None and s.parent.span_id == train.context.span_id for s in evals)
    assert "tunix.step.abandoned" not in train.attributes
