"""The worker hands steps on in batches: processors, sinks and the MetricsLogger each get a
batch in one call where they can take one, the rest step by step, with failures isolated."""

from __future__ import annotations

import logging
import time
from typing import Any

from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_tunix
from otel_tunix import MetricsLogger, MetricsLoggerOptions
from otel_tunix.consumers.step_accounting import StepAccountingProcessor, StepSink
from otel_tunix.logger.backend import LoggingBackend
from otel_tunix.pipeline import span_builder
from otel_tunix.pipeline.span_builder import StepSpanProcessor
from otel_tunix.recording import hot_path as _recording
from otel_tunix.testing import capture, steps_set_aside

STEPS = 40


def _loop(steps: int = STEPS) -> None:
    for n in range(steps):
        with otel_tunix.step(n):
            with otel_tunix.component("load", blocked=True):
                pass
            with otel_tunix.component("compute"):
                pass


class _Many(StepSpanProcessor):
    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def on_finished_steps(self, steps: Any) -> None:
        assert all(isinstance(s, otel_tunix.FinishedStep) for s in steps)
        self.calls.append([s.number for s in steps])


class _One(SpanProcessor):
    """A plain SDK span processor: gets each span of each step through on_end."""

    def __init__(self) -> None:
        self.numbers: list[int] = []

    def on_end(self, span: Any) -> None:
        if span.name == "train_step":
            self.numbers.append(span.attributes["tunix.step"])


def test_processors_get_batches_in_order_and_the_others_step_by_step() -> None:
    many, one, spans = _Many(), _One(), InMemorySpanExporter()
    with capture() as cap:  # the default interval: 250 ms between batches
        for p in (many, one, SimpleSpanProcessor(spans)):
            cap.tracer_provider.add_span_processor(p)
        _loop()
        cap.flush()
    assert [n for call in many.calls for n in call] == list(range(STEPS))
    assert len(many.calls) < STEPS  # batched: the loop outruns the worker's wake-ups
    assert max(len(call) for call in many.calls) > 1
    assert one.numbers == list(range(STEPS))
    names = [s.name for s in spans.get_finished_spans()]
    assert names == ["load", "compute", "train_step"] * STEPS
    assert [s.step for s in cap.summaries] == list(range(STEPS))


def test_a_step_that_cannot_be_read_is_counted_and_the_rest_of_its_batch_goes_on(
    monkeypatch: Any, caplog: Any
) -> None:
    monkeypatch.setenv("OTEL_TUNIX_RAISE_INTERNAL_ERRORS", "false")  # reported, not raised
    real = span_builder.FinishedStep.__init__

    def broken_at_3(self: Any, builder: Any, rec: Any) -> None:
        if rec.number == 3:
            raise RuntimeError("unreadable step")
        real(self, builder, rec)

    monkeypatch.setattr(span_builder.FinishedStep, "__init__", broken_at_3)
    many = _Many()
    with caplog.at_level(logging.ERROR, logger="otel_tunix"), capture() as cap:
        cap.tracer_provider.add_span_processor(many)
        pipeline = _recording.get_runtime().pipeline  # type: ignore[union-attr]
        _loop(8)
        cap.flush()
        assert (pipeline.failed_steps, pipeline.processed_steps) == (1, 7)
    assert [n for call in many.calls for n in call] == [0, 1, 2, 4, 5, 6, 7]
    assert [s.step for s in cap.summaries] == [0, 1, 2, 4, 5, 6, 7]
    assert (
        sum("internal error in reading a recorded step" in r.getMessage() for r in caplog.records)
        == 1
    )


def test_a_processor_that_raises_on_a_batch_is_reported_once_and_the_others_go_on(
    caplog: Any,
) -> None:
    class Raising(StepSpanProcessor):
        def on_finished_steps(self, steps: Any) -> None:
            raise ValueError("boom")

    with caplog.at_level(logging.ERROR, logger="otel_tunix"), capture() as cap:
        cap.tracer_provider.add_span_processor(Raising())
        for _ in range(3):
            _loop(5)
            cap.flush()
    assert len(cap.summaries) == 15
    assert sum("Raising raised" in r.getMessage() for r in caplog.records) == 1


class _BatchSink(StepSink):
    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def on_steps(self, summaries: Any) -> None:
        self.calls.append([s.step for s in summaries])

    def on_step(self, summary: Any) -> None:  # pragma: no cover - on_steps is preferred
        raise AssertionError("on_step called on a sink that takes batches")

    def on_session(self, sessions: Any) -> None:
        return None

    def close(self) -> None:
        return None


class _FlakySink(StepSink):
    """Takes one step at a time; fails on step 2."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_step(self, summary: Any) -> None:
        if summary.step == 2:
            raise RuntimeError("flaky")
        self.steps.append(summary.step)

    def on_session(self, sessions: Any) -> None:
        return None

    def close(self) -> None:
        return None


def test_sinks_get_the_summaries_of_a_batch_together_or_one_by_one(caplog: Any) -> None:
    with capture():
        with steps_set_aside() as kept:
            _loop(6)
        steps = kept.finished()
    batch, flaky = _BatchSink(), _FlakySink()
    proc = StepAccountingProcessor([batch, flaky])
    with caplog.at_level(logging.ERROR, logger="otel_tunix"):
        proc.on_finished_steps(steps[:4])
        proc.on_finished_steps(steps[4:])
        assert proc.flush_hooks(10)  # the test's own sinks run on threads of their own
    assert batch.calls == [[0, 1, 2, 3], [4, 5]]
    assert flaky.steps == [0, 1, 3, 4, 5]  # one failing summary does not lose the others
    assert sum("_FlakySink.on_finished_steps failed" in r.getMessage() for r in caplog.records) == 1
    (session,) = proc.sessions()
    assert session.sampled_steps == 6
    assert proc.last_summary is not None and proc.last_summary.step == 5


def test_metrics_logger_log_rows_reaches_every_kind_of_backend() -> None:
    class Rows(LoggingBackend):
        def __init__(self) -> None:
            self.got: list[tuple[int | None, dict[str, float]]] = []

        def log_scalars(self, values: dict[str, float], **kw: Any) -> None:
            self.got.append((kw["step"], dict(values)))

        def log_scalar(self, event: str, value: float, **kw: Any) -> None:  # pragma: no cover
            raise AssertionError("log_scalars is preferred")

        def close(self) -> None:
            return None

    class Scalars:
        def __init__(self) -> None:
            self.got: list[tuple[str, float, int | None, bool]] = []

        def log_scalar(self, event: str, value: float, **kw: Any) -> None:
            self.got.append((event, value, kw["step"], kw.get("nonfinite", False)))

        def close(self) -> None:
            return None

    class SkipsPerf(LoggingBackend):  # a base-class backend that does not want perf/...
        skip_sources = ("perf",)

        def __init__(self) -> None:
            self.got: list[tuple[str, float, int | None, bool]] = []

        def log_scalar(self, event: str, value: float, **kw: Any) -> None:
            self.got.append((event, value, kw["step"], kw.get("nonfinite", False)))

    rows, scalars, skips = Rows(), Scalars(), SkipsPerf()
    ml = MetricsLogger(
        MetricsLoggerOptions(
            default_backends=False,
            backend_factories=[lambda: rows, lambda: scalars, lambda: skips],
        ),
        rank=0,
    )
    batch = [(4, {"a": 1.0, "b": 2.0}), (8, {"a": float("inf")}), (None, {"c": 3.0})]
    ml.log_rows(batch, source="perf")
    assert ml.flush()  # backends of the user's own run on threads of their own
    assert rows.got == batch
    assert scalars.got == [
        ("a", 1.0, 4, False), ("b", 2.0, 4, False), ("a", float("inf"), 8, True),
        ("c", 3.0, None, False),
    ]  # fmt: skip
    assert skips.got == []
    assert ml.last_values == {"a": float("inf"), "b": 2.0, "c": 3.0}
    assert ml.last_step == 8  # the last row with a step
    ml.log_rows([(9, {"d": 1.0})])  # no source: every backend
    assert ml.flush()
    assert skips.got == [("d", 1.0, 9, False)]
    ml.close()
    ml.log_rows([(10, {"e": 1.0})])  # closed: ignored, no error
    assert rows.got[-1][0] == 9


def test_the_pipeline_hands_each_call_at_most_a_bounded_batch() -> None:
    from otel_tunix.pipeline import worker

    sizes: list[int] = []

    def record(batch: list[Any]) -> int:
        sizes.append(len(batch))
        return 0

    p = worker.Pipeline(record, interval_sec=5.0)
    rt = _recording.Runtime(1, None, p)
    for n in range(worker._MAX_BATCH + 10):
        rec = _recording.StepRecord(rt, "train", n, time.perf_counter_ns())
        rec.end_ns = time.perf_counter_ns()
        p.submit(rec)  # wakes the worker on the first step and on each full batch
    p.close()
    assert sum(sizes) == worker._MAX_BATCH + 10
    assert max(sizes) == worker._MAX_BATCH
    assert p.processed_steps == worker._MAX_BATCH + 10


def test_spans_jsonl_writes_a_batch_and_skips_only_a_step_it_cannot_encode(
    tmp_path: Any, caplog: Any
) -> None:
    import json

    from otel_tunix.accounting.step_time import account_intervals
    from otel_tunix.consumers.jsonl import StepJsonlWriter

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no text")

    def summary(step: int, **attributes: Any) -> Any:
        ivs = [("compute", False, 0, 1_000_000)]
        return account_intervals("train", step, 0, 2_000_000, ivs, attributes=attributes)

    writer = StepJsonlWriter(tmp_path / "spans.jsonl")
    batch = [summary(0), summary(1, bad=Unprintable()), summary(2, lr=1e-3)]
    with caplog.at_level(logging.ERROR, logger="otel_tunix"):
        writer.on_steps(batch)
        writer.on_steps([summary(3, bad=Unprintable())])
    writer.close()
    lines = [json.loads(x) for x in (tmp_path / "spans.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 2]
    assert lines[1]["attributes"] == {"lr": 1e-3}
    assert lines[0]["busy_time_sec"] == 0.001 and lines[0]["idle_time_sec"] == 0.001
    assert sum("could not be written" in r.getMessage() for r in caplog.records) == 1


def test_a_backend_failing_on_one_row_still_gets_the_others(caplog: Any) -> None:
    class FailsAtStep2(LoggingBackend):
        def __init__(self) -> None:
            self.steps: list[int] = []

        def log_scalars(self, values: dict[str, float], **kw: Any) -> None:
            if kw["step"] == 2:
                raise RuntimeError("backend down for a moment")
            self.steps.append(kw["step"])

        def log_scalar(self, event: str, value: float, **kw: Any) -> None:  # pragma: no cover
            raise AssertionError("log_scalars is preferred")

        def close(self) -> None:
            return None

    backend = FailsAtStep2()
    ml = MetricsLogger(
        MetricsLoggerOptions(default_backends=False, backend_factories=[lambda: backend]),
        rank=0,
    )
    with caplog.at_level(logging.ERROR, logger="otel_tunix"):
        ml.log_rows([(s, {"loss": 1.0}) for s in range(5)])
        ml.log_rows([(2, {"loss": 1.0}), (5, {"loss": 1.0})])
        assert ml.flush()
    assert backend.steps == [0, 1, 3, 4, 5]
    assert sum("FailsAtStep2 failed" in r.getMessage() for r in caplog.records) == 1


def test_a_backend_with_log_rows_gets_each_batch_in_one_call(caplog: Any) -> None:
    class Batches(LoggingBackend):
        def __init__(self, fail_on: int | None = None) -> None:
            self.calls: list[list[tuple[int | None, dict[str, float]]]] = []
            self.fail_on = fail_on

        def log_rows(self, rows: Any, **kw: Any) -> None:
            if any(step == self.fail_on for step, _ in rows):
                raise RuntimeError("backend down for a moment")
            assert kw == {"source": "perf"}
            self.calls.append(list(rows))

        def log_scalar(self, event: str, value: float, **kw: Any) -> None:  # pragma: no cover
            raise AssertionError("log_rows is preferred")

        def close(self) -> None:
            return None

    good, flaky = Batches(), Batches(fail_on=3)
    ml = MetricsLogger(
        MetricsLoggerOptions(
            default_backends=False, backend_factories=[lambda: flaky, lambda: good]
        ),
        rank=0,
    )
    with caplog.at_level(logging.ERROR, logger="otel_tunix"):
        ml.log_rows([(s, {"loss": float(s)}) for s in range(3)], source="perf")
        ml.log_rows([(3, {"loss": 3.0}), (4, {"loss": 4.0})], source="perf")  # flaky loses it
        ml.log_rows([(5, {"loss": 5.0})], source="perf")
        assert ml.flush()
    assert [[s for s, _ in call] for call in good.calls] == [[0, 1, 2], [3, 4], [5]]
    assert [[s for s, _ in call] for call in flaky.calls] == [[0, 1, 2], [5]]
    assert good.calls[1][1] == (4, {"loss": 4.0})
    assert sum("Batches failed" in r.getMessage() for r in caplog.records) == 1


def test_the_metrics_summary_counts_rows_of_changing_names(monkeypatch: Any) -> None:
    from otel_tunix.logger import status

    s = status.MetricsSummary()
    s.log_rows([(0, {"a": 1.0, "b": 2.0}), (1, {"a": 1.0, "b": float("nan")})])
    s.log_scalars({"b": 1.0})
    s.log_scalar("c", float("inf"))
    assert s.counts == {"a": 2, "b": 3, "c": 1}
    assert s.nonfinite == {"b": 1, "c": 1}
    monkeypatch.setattr(status, "_MAX_NAME_SETS", 3)  # names made up per row get folded
    s.log_rows([(n, {f"x{n}": 1.0, "a": 1.0}) for n in range(5)])
    s.log_scalars({"a": 1.0})
    assert s.counts == {"a": 8, "b": 3, "c": 1, **{f"x{n}": 1 for n in range(5)}}
    assert s.first_time is not None and s.last_time is not None
    assert s.first_time <= s.last_time


def test_processed_and_exported_steps_are_freed_by_reference_counts() -> None:
    """A processed step, its summary and its spans form no reference cycle: once exported,
    they are freed at once, not left for the garbage collector (which in a process with a
    large heap walks everything it holds at each full collection)."""
    import gc
    import threading

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    # A hook an earlier test's shutdown left behind (a slow backend) that ends during this
    # test leaves its run's objects to the collector: wait for such hooks first.
    for thread in threading.enumerate():
        if thread.name.startswith("otel-tunix-close-"):
            thread.join(60)
    exp = InMemorySpanExporter()
    otel_tunix.configure(output_dir="none", span_exporters=[exp])
    with otel_tunix.step(0):  # warm-up: caches made once
        with otel_tunix.component("warm"):
            pass
    otel_tunix.force_flush()
    exp.clear()
    gc.collect()
    gc.disable()
    try:
        for n in range(1, 21):
            with otel_tunix.step(n):
                with otel_tunix.component("load", blocked=True):
                    pass
                with otel_tunix.component("compute"):
                    pass
        otel_tunix.force_flush()
        assert len(exp.get_finished_spans()) == 20 * 3
        exp.clear()
        assert gc.collect() == 0
    finally:
        gc.enable()
        otel_tunix.shutdown()


def test_runs_of_rows_with_the_same_names_count_and_keep_every_last_value() -> None:
    """Backends take a run of rows with the same names at once (the summary counts the run,
    the logger copies only its last row): the counts and last values must be those of
    taking every row, whatever the runs."""
    from otel_tunix.logger import status

    rows = [
        (1, {"a": 1.0, "b": 2.0}), (2, {"a": 3.0, "b": 4.0}), (3, {"c": 5.0}),
        (4, {"a": 6.0}), (5, {"a": 7.0, "b": float("nan")}), (6, {"a": 8.0, "b": 9.0}),
        (7, {"b": 10.0, "a": 11.0}),  # the same names in another order: another run
    ]  # fmt: skip
    s = status.MetricsSummary()
    s.log_rows(rows)
    s.log_rows(rows[:2])
    assert s.counts == {"a": 8, "b": 7, "c": 1}
    assert s.nonfinite == {"b": 1}
    ml = MetricsLogger(MetricsLoggerOptions(default_backends=False, backend_factories=[]), rank=0)
    ml.log_rows(rows)
    assert ml.last_values == {"a": 11.0, "b": 10.0, "c": 5.0}
    assert ml.last_step == 7
    ml.log_rows(rows[:4])
    assert ml.last_values == {"a": 6.0, "b": 4.0, "c": 5.0}
    ml.close()


def test_steps_set_aside_can_be_processed_on_the_calling_thread() -> None:
    import threading

    class _Where(_Many):
        def __init__(self) -> None:
            super().__init__()
            self.threads: set[str] = set()

        def on_finished_steps(self, steps: Any) -> None:
            super().on_finished_steps(steps)
            self.threads.add(threading.current_thread().name)

    where = _Where()
    with capture() as cap:
        cap.tracer_provider.add_span_processor(where)
        with steps_set_aside() as kept:
            _loop(300)
        assert len(kept) == 300
        assert kept.process() == 0
        assert kept == []  # handed on, not kept
        # otel-tunix's own consumers ran on this thread: done when process() returned
        assert [s.step for s in cap.summaries] == list(range(300))
        cap.flush()  # a user's processor runs on a thread of its own: waited for here
        assert where.threads == {"otel-tunix-hook-span processor _Where"}
        assert threading.current_thread().name not in where.threads
        assert [len(c) for c in where.calls] == [256, 44]  # the worker's batches
        assert [n for c in where.calls for n in c] == list(range(300))


def test_a_step_the_accounting_cannot_read_is_reported_once_and_the_others_counted(
    caplog: Any, monkeypatch: Any
) -> None:
    monkeypatch.setenv("OTEL_TUNIX_RAISE_INTERNAL_ERRORS", "false")  # reported, not raised
    proc = StepAccountingProcessor()
    with capture():
        with steps_set_aside() as kept:
            _loop(3)
        good = kept.finished()
    broken = object()  # no fields at all: accounting it raises
    with caplog.at_level(logging.ERROR, logger="otel_tunix"):
        proc.on_finished_steps([broken, good[0], broken])  # type: ignore[list-item]
        proc.on_finished_steps([broken, *good[1:]])  # type: ignore[list-item]
    assert (
        sum("internal error in the accounting of a step" in r.getMessage() for r in caplog.records)
        == 1
    )
    (session,) = proc.sessions()
    assert session.sampled_steps == 3
