"""BatchExportProcessor (the batch processor in front of otel-tunix's exporters) and the
span builder's dispatch to span processors."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, StatusCode, TraceFlags

import otel_tunix
from otel_tunix.pipeline import span_builder
from otel_tunix.pipeline.export_processor import BatchExportProcessor, ExportStats
from otel_tunix.pipeline.span_builder import StepSpanProcessor
from otel_tunix.pipeline.worker import resolve_device_ends
from otel_tunix.settings import attributes as attr
from otel_tunix.support import shortcuts as _shortcuts
from otel_tunix.testing import capture, steps_set_aside


def _span(i: int, sampled: bool = True) -> ReadableSpan:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return ReadableSpan(name=f"s{i}", context=SpanContext(1, i + 1, False, flags))


def _finished(*names: str, step: int = 0):
    """A real FinishedStep: one step recorded by otel-tunix with these components."""
    otel_tunix.configure(output_dir="none")
    with steps_set_aside() as kept:
        with otel_tunix.step(step):
            for name in names:
                with otel_tunix.component(name):
                    pass
    otel_tunix.shutdown()
    return kept.finished()[0]


def _names(exp) -> list[str]:
    return [n for b in exp.batches for n in b]


class Hanging(SpanExporter):
    """A collector that does not answer: export() blocks until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def export(self, spans):
        self.release.wait(30)
        return SpanExportResult.SUCCESS


class _Recorder(SpanExporter):
    def __init__(self, result: SpanExportResult = SpanExportResult.SUCCESS) -> None:
        self.batches: list[list[str]] = []
        self.result = result
        self.shut = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.batches.append([s.name for s in spans])
        return self.result

    def shutdown(self) -> None:
        self.shut = True


def test_exports_in_order_in_batches_of_the_configured_size_and_counts():
    exp = _Recorder()
    p = BatchExportProcessor(exp, max_queue_size=100, schedule_delay_millis=60_000,
                             max_export_batch_size=4)  # fmt: skip
    p.on_finished_steps([_finished("c0", "c1", "c2", "c3", "c4", "c5")])
    p.on_end(_span(7))
    p.on_end(_span(8, sampled=False))  # not sampled: ignored, as by the SDK's processor
    assert p.force_flush()
    assert _names(exp) == ["c0", "c1", "c2", "c3", "c4", "c5", "train_step", "s7"]
    assert all(len(b) <= 4 for b in exp.batches)
    assert p.stats.to_json() == {
        "spans_offered": 8, "spans_exported": 8, "spans_failed": 0, "spans_dropped": 0,
    }  # fmt: skip
    p.shutdown()
    assert exp.shut


def test_a_span_batch_is_a_sequence_whose_step_spans_are_built_as_they_are_read():
    from otel_tunix.pipeline.export_processor import SpanBatch

    first, second = _finished("a", "b", "c", step=1), _finished("d", "e", step=2)
    foreign = _span(9)
    eager = [s.name for s in [*first.spans(), foreign, *second.spans()]]
    first._spans = second._spans = None  # as queued: nothing built yet
    for step in (first, second):
        step.queued_for_export()
    items = [first, foreign, second]

    batch = SpanBatch(items, 8)
    assert len(batch) == 8 and [s.name for s in batch] == eager
    assert first._spans is None and second._spans is None  # read, not kept
    assert [s.name for s in batch] == eager  # read twice: built again, same spans
    assert batch[0].name == "a" and batch[-1].name == "train_step" and batch[4] is foreign
    assert [s.name for s in batch[3:6]] == eager[3:6]
    with pytest.raises(IndexError):
        batch[8]
    with pytest.raises(IndexError):
        batch[-9]
    assert batch[5].context.span_id == second.spans()[0].context.span_id


def test_a_step_is_exported_whole_and_built_once(monkeypatch):
    """Batches take whole steps while they fit (a step split between two exports would be
    built twice); a step bigger than a batch is built once and split."""
    exp = _Recorder()
    p = BatchExportProcessor(exp, schedule_delay_millis=60_000, max_export_batch_size=5)
    steps = [_finished("a", "b", step=1), _finished("c", "d", step=2),
             _finished(*"efghijk", step=3)]  # fmt: skip
    built = []
    make = span_builder.SpanBuilder.build_spans

    def counted(builder, step):
        built.append(step)
        return make(builder, step)

    monkeypatch.setattr(span_builder.SpanBuilder, "build_spans", counted)
    p.on_finished_steps(steps)
    p.on_end(_span(7))
    assert p.force_flush()
    assert exp.batches == [
        ["a", "b", "train_step"],  # 3 + the next step's 3 would pass 5
        ["c", "d", "train_step"],
        [*"efghi"], ["j", "k", "train_step"],  # 8 spans: built once, in two exports
        ["s7"],
    ]  # fmt: skip
    assert built == steps  # each step built once
    assert p.stats.exported == 15
    p.shutdown()


def test_one_exporter_does_not_keep_the_spans_two_share_them():
    step = _finished("a", "b")
    one = _Recorder()
    p = BatchExportProcessor(one, schedule_delay_millis=60_000)
    p.on_finished_steps([step])
    assert p.force_flush()
    assert one.batches == [["a", "b", "train_step"]] and step._spans is None
    p.shutdown()

    step = _finished("a", "b")
    seen: list[list[ReadableSpan]] = []

    class Keep(SpanExporter):
        def export(self, spans):
            seen.append(list(spans))
            return SpanExportResult.SUCCESS

    p1, p2 = (BatchExportProcessor(Keep(), schedule_delay_millis=60_000) for _ in range(2))
    p1.on_finished_steps([step])
    p2.on_finished_steps([step])
    assert p1.force_flush() and p2.force_flush()
    assert [[id(s) for s in b] for b in seen[:1]] == [[id(s) for s in seen[1]]]  # built once
    p1.shutdown()
    p2.shutdown()

    full = BatchExportProcessor(_Recorder(), max_queue_size=2, schedule_delay_millis=60_000)
    step = _finished("a", "b")  # three spans: more than the queue holds
    full.on_finished_steps([step])
    assert step._exports == 0  # dropped: no export will read it
    full.shutdown()


def test_a_batch_of_steps_is_queued_while_it_fits_and_the_rest_dropped_and_counted():
    exp = _Recorder()
    p = BatchExportProcessor(exp, max_queue_size=5, schedule_delay_millis=60_000)
    first, second, third = _finished("a"), _finished("b"), _finished("c", "d")
    p.on_finished_steps([first, second, third])  # 2 + 2 spans fit, then 3 do not
    assert (first._exports, second._exports, third._exports) == (1, 1, 0)
    assert (p.stats.offered, p.stats.dropped_full) == (7, 3)
    assert p.force_flush()
    assert _names(exp) == ["a", "train_step", "b", "train_step"]
    p.shutdown()
    p.on_finished_steps([_finished("e")])  # after shutdown: all dropped, no export
    assert (p.stats.offered, p.stats.exported, p.stats.dropped) == (9, 4, 5)


def test_a_full_batch_wakes_the_export_thread_before_the_delay():
    exp = _Recorder()
    p = BatchExportProcessor(exp, schedule_delay_millis=60_000, max_export_batch_size=5)
    p.on_finished_steps([_finished("a", "b", "c", "d")])
    deadline = time.monotonic() + 5
    while not exp.batches and time.monotonic() < deadline:
        time.sleep(0.01)
    assert exp.batches and len(exp.batches[0]) == 5
    p.shutdown()


def test_the_schedule_delay_exports_a_partial_batch(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "30")
    exp = _Recorder()
    p = BatchExportProcessor(exp)
    p.on_end(_span(1))
    deadline = time.monotonic() + 5
    while not exp.batches and time.monotonic() < deadline:
        time.sleep(0.01)
    assert exp.batches == [["s1"]]
    p.shutdown()


def test_a_full_queue_drops_new_spans_counts_them_and_warns_once(caplog):
    exp = _Recorder()
    p = BatchExportProcessor(exp, max_queue_size=5, schedule_delay_millis=60_000,
                             max_export_batch_size=5)  # fmt: skip
    release = threading.Event()
    slow = exp.export

    def blocked(spans):  # the collector hangs: the export thread is stuck in export()
        release.wait(10)
        return slow(spans)

    exp.export = blocked  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="otel_tunix.pipeline.export_processor"):
        p.on_finished_steps([_finished("a", "b", "c", "d")])  # 5 spans: a full batch, taken
        time.sleep(0.2)
        for _ in range(3):  # 3 x 3 spans into a queue of 5: one step fits
            p.on_finished_steps([_finished("x", "y")])
    assert p.stats.offered == 14
    assert p.stats.dropped_full == 6
    assert sum("export queue" in r.getMessage() for r in caplog.records) == 1
    release.set()
    assert p.force_flush()
    assert p.stats.exported == 8 and p.stats.dropped == 6
    p.shutdown()


def test_failed_and_raising_exports_count_as_failed_and_never_raise(caplog):
    exp = _Recorder(SpanExportResult.FAILURE)
    p = BatchExportProcessor(exp, schedule_delay_millis=60_000)
    p.on_finished_steps([_finished("a")])
    p.force_flush()
    assert p.stats.failed == 2

    class Raising(SpanExporter):
        def export(self, spans):
            raise ConnectionError("collector down")

    q = BatchExportProcessor(Raising(), schedule_delay_millis=60_000)
    q.on_end(_span(1))
    with caplog.at_level(logging.ERROR):
        q.force_flush()
    assert q.stats.failed == 1 and q.stats.exported == 0
    p.shutdown()
    q.shutdown()


def test_shutdown_exports_what_is_left_then_drops_and_counts_late_spans():
    exp = _Recorder()
    p = BatchExportProcessor(exp, schedule_delay_millis=60_000)
    p.on_finished_steps([_finished("a", "b")])
    p.shutdown()
    assert _names(exp) == ["a", "b", "train_step"]
    p.on_end(_span(3))  # after shutdown: counted as dropped, never exported
    assert p.stats.dropped == 1 and not p.force_flush()


def test_shutdown_gives_up_after_the_export_timeout_when_the_exporter_hangs():
    exp = Hanging()
    p = BatchExportProcessor(exp, schedule_delay_millis=10, export_timeout_millis=300)
    p.on_end(_span(1))
    time.sleep(0.1)  # the export thread is now stuck in export()
    p.on_end(_span(2))
    t = time.perf_counter()
    p.shutdown()
    assert time.perf_counter() - t < 3.0
    exp.release.set()


def test_bad_bsp_environment_is_a_configuration_error_naming_the_variable(monkeypatch):
    from otel_tunix.settings.parsing import ConfigurationError

    for name, bad in (("OTEL_BSP_MAX_QUEUE_SIZE", "lots"), ("OTEL_BSP_SCHEDULE_DELAY", "-5")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ConfigurationError, match=rf"{name}='{bad}' is not allowed; use a"):
            BatchExportProcessor(_Recorder())
        with pytest.raises(ConfigurationError, match=name):
            otel_tunix.configure(output_dir="none")
        monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "64")
    p = BatchExportProcessor(_Recorder())
    assert p._max_queue == 64
    p.shutdown()


def test_export_stats_dropped_is_what_was_neither_exported_nor_failed():
    s = ExportStats()
    s.add(offered=10, exported=6, failed=1)
    assert s.dropped == 3


# --- the span builder's dispatch -----------------------------------------------------------
class _OneAtATime(SpanProcessor):
    """A processor without the bulk method: it must see every span through on_end."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.names.append(span.name)


class _Broken(SpanProcessor):
    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("broken processor")


def test_processors_without_the_bulk_method_get_every_span_in_order_and_a_broken_one_is_isolated(
    caplog,
):
    with capture() as cap:
        broken, plain = _Broken(), _OneAtATime()
        cap.tracer_provider.add_span_processor(broken)
        with caplog.at_level(logging.ERROR):
            for n in range(2):
                with otel_tunix.step(n):
                    with otel_tunix.component("load"):
                        pass
                    with otel_tunix.component("compute"):
                        pass
            cap.flush()
        cap.tracer_provider.add_span_processor(plain)  # added mid-run: picked up
        with otel_tunix.step(2):
            with otel_tunix.component("load"):
                pass
        cap.flush()
        spans = cap.spans()
    assert plain.names == ["load", "train_step"]
    assert [s.name for s in spans] == ["load", "compute", "train_step"] * 2 + ["load", "train_step"]
    assert len(cap.summaries) == 3  # the accounting processor went on despite the broken one
    assert sum("_Broken" in r.getMessage() for r in caplog.records) == 1


def _scope_and_resource():
    tp = TracerProvider()
    return tp.get_tracer("t")._instrumentation_scope, tp.resource  # type: ignore[attr-defined]


def test_fast_span_and_context_factories_match_the_sdk_constructors():
    ctx = _shortcuts.new_span_context(7, 9)
    assert ctx == SpanContext(7, 9, False, TraceFlags(TraceFlags.SAMPLED))
    assert ctx.is_valid and not ctx.is_remote and ctx.trace_flags.sampled
    scope, resource = _scope_and_resource()
    make = _shortcuts.span_maker(resource, scope)
    parent = _shortcuts.new_span_context(7, 3)
    s = make("n", ctx, parent, {"a": 1}, 5, 8)
    # this SDK: the run's own subclass, sharing what every span of the run has
    assert isinstance(s, ReadableSpan) and type(s) is not ReadableSpan
    assert type(make("m", ctx, None, {}, 1, 2)) is type(s)
    sdk = ReadableSpan(
        "n", ctx, parent, resource, {"a": 1}, start_time=5, end_time=8,
        instrumentation_scope=scope,
    )  # fmt: skip
    assert s.to_json() == sdk.to_json()
    assert (s.name, s.context, s.parent, s.attributes, s.start_time, s.end_time) == (
        "n", ctx, parent, {"a": 1}, 5, 8,
    )  # fmt: skip
    assert (s.resource, s.instrumentation_scope, s.kind) == (resource, scope, sdk.kind)
    assert (s.events, s.links, s.status.status_code) == ((), (), StatusCode.UNSET)


def test_component_spans_built_in_the_loop_answer_as_sdk_spans_do():
    """The span builder writes the fast maker's assignments out for components: each span,
    and the step span its maker makes, must read as the SDK's constructor would have made it
    (all public properties)."""
    otel_tunix.configure(output_dir="none")
    with steps_set_aside() as kept:
        for n in (2, 3):  # the second step copies the first one's attributes
            with otel_tunix.step(n):
                with otel_tunix.component("load", blocked=True):
                    pass
                with otel_tunix.component("compute"):
                    pass
    steps = kept.finished()
    otel_tunix.shutdown()
    scope, resource = steps[0]._builder._scope, steps[0]._builder._resource
    for step in steps:
        spans = step.spans()
        for s in spans:  # the components, then the step span
            assert type(s).__name__ == "RunSpan"  # the shortcut's class, checked below
            sdk = _shortcuts.sdk_span(
                resource, scope, s.name, s.context, s.parent, dict(s.attributes),
                s.start_time, s.end_time,
            )  # fmt: skip
            assert _shortcuts._same_span(s, sdk)
            assert s.attributes[attr.STEP] == step.number
        assert [s.name for s in spans] == ["load", "compute", "train_step"]
        assert spans[-1].start_time == step.start_ns and spans[-1].end_time == step.end_ns


def test_span_maker_falls_back_to_the_constructor_when_the_sdk_changes(monkeypatch):
    class Other(ReadableSpan):  # a future SDK that keeps the name under another field
        def __init__(self, name, *args, **kw):
            super().__init__(name, *args, **kw)
            self._renamed = name

        @property
        def name(self):
            return self._renamed

    monkeypatch.setattr(_shortcuts, "ReadableSpan", Other)
    scope, resource = _scope_and_resource()
    make = _shortcuts.span_maker(resource, scope)
    ctx = _shortcuts.new_span_context(7, 9)
    s = make("n", ctx, None, {"a": 1}, 5, 8)
    assert type(s) is Other
    assert (s.name, s.context, s.parent, s.attributes["a"]) == ("n", ctx, None, 1)
    assert (s.start_time, s.end_time, s.instrumentation_scope) == (5, 8, scope)
    assert s.resource is resource and s.to_json()


@pytest.fixture(autouse=True)
def _quiet_shutdown():
    yield
    otel_tunix.shutdown()


def test_in_memory_exporter_behind_our_processor_sees_whole_steps():
    exp = InMemorySpanExporter()
    tp = TracerProvider()
    p = BatchExportProcessor(exp, schedule_delay_millis=60_000)
    tp.add_span_processor(p)
    otel_tunix.configure(output_dir="none", tracer_provider=tp)
    for n in range(3):
        with otel_tunix.step(n):
            with otel_tunix.component("a"):
                pass
    otel_tunix.force_flush()
    tp.force_flush()
    assert [s.name for s in exp.get_finished_spans()] == ["a", "train_step"] * 3
    assert p.stats.exported == 6


def test_configure_span_exporters_in_an_own_provider_counts_in_the_summary(tmp_path):
    import json

    exp = InMemorySpanExporter()
    otel_tunix.configure(output_dir=tmp_path, span_exporters=[exp])
    for n in range(2):
        with otel_tunix.step(n):
            with otel_tunix.component("a"):
                pass
    otel_tunix.shutdown()
    assert [s.name for s in exp.get_finished_spans()] == ["a", "train_step"] * 2
    export = json.loads((tmp_path / "summary.json").read_text())["export"]
    assert export["InMemorySpanExporter"] == {
        "spans_offered": 4, "spans_exported": 4, "spans_failed": 0, "spans_dropped": 0,
    }  # fmt: skip


def test_configure_span_exporters_in_an_application_provider_are_shut_down_with_the_run():
    exp = _Recorder()
    tp = TracerProvider()
    otel_tunix.configure(output_dir="none", tracer_provider=tp, span_exporters=[exp])
    with otel_tunix.step(0):
        pass
    otel_tunix.shutdown()
    assert exp.shut and [n for b in exp.batches for n in b] == ["train_step"]


def test_configure_rejects_what_is_not_a_span_exporter():
    with pytest.raises(otel_tunix.ConfigurationError, match=r"span_exporters.*not a SpanExporter"):
        otel_tunix.configure(output_dir="none", span_exporters=["otlp"])  # type: ignore[list-item]


def test_spans_are_built_only_for_exporters_and_then_once_per_step(monkeypatch, tmp_path):
    calls = []
    real = span_builder.SpanBuilder.build_spans

    def counting(self, step):
        calls.append(step.number)
        return real(self, step)

    monkeypatch.setattr(span_builder.SpanBuilder, "build_spans", counting)
    otel_tunix.configure(output_dir=tmp_path / "local")  # the local run folder only
    for n in range(3):
        with otel_tunix.step(n):
            with otel_tunix.component("a"):
                pass
    otel_tunix.shutdown()
    assert calls == []  # nothing needed SDK span objects
    lines = (tmp_path / "local" / "spans.jsonl").read_text().splitlines()
    assert sum(json.loads(x)["type"] == "step" for x in lines) == 3

    a, b = InMemorySpanExporter(), InMemorySpanExporter()
    otel_tunix.configure(output_dir="none", span_exporters=[a, b])
    for n in range(3):
        with otel_tunix.step(n):
            with otel_tunix.component("a"):
                pass
    otel_tunix.shutdown()
    assert sorted(calls) == [0, 1, 2]  # two exporters, built once per step
    assert len(a.get_finished_spans()) == len(b.get_finished_spans()) == 6


def test_span_infos_from_records_match_those_read_from_the_sdk_spans():
    from otel_tunix.consumers.step_accounting import span_info

    otel_tunix.configure(output_dir="none")
    with steps_set_aside() as kept, otel_tunix.step(3, scope="eval"):
        with otel_tunix.component("outer"):
            with otel_tunix.component("wait", blocked=True):
                pass
        try:
            with otel_tunix.component("bad"):
                raise ValueError("boom")
        except ValueError:
            pass
        with otel_tunix.component("dev", device_end=lambda: time.perf_counter_ns() + 10**6):
            pass
    rec = kept[0]  # what the device waiter does before the step is processed:
    resolve_device_ends(rec, list(rec.extras.device))
    (step,) = kept.finished()
    otel_tunix.shutdown()
    json_first = step.span_json()
    from_records = step.span_infos()
    from_spans = [span_info(s) for s in step.spans()[:-1]]
    assert from_records == from_spans
    assert json_first == [i.to_json() for i in from_spans]  # the JSONL file's entries
    assert [i.name for i in from_records] == ["outer", "wait", "bad", "dev"]
    assert from_records[1].kind == "blocked" and from_records[2].error == "ValueError: boom"
    assert from_records[3].attributes[attr.DEVICE_END] is True
    assert from_records[1].parent == from_records[0].span_id


def test_repeated_components_share_attributes_but_one_with_its_own_keeps_them():
    exp = InMemorySpanExporter()
    otel_tunix.configure(output_dir="none", span_exporters=[exp])
    with otel_tunix.step(4):
        for i in range(3):
            with otel_tunix.component("micro_batch") as c:
                if i == 1:
                    c.set_attribute("micro", i)
    otel_tunix.shutdown()
    spans = [s for s in exp.get_finished_spans() if s.name == "micro_batch"]
    assert [s.attributes.get("micro") for s in spans] == [None, 1, None]
    assert all(s.attributes[attr.STEP] == 4 and s.attributes[attr.TIME_KIND] == "busy"
               for s in spans)  # fmt: skip
    assert len({s.context.span_id for s in spans}) == 3
    with pytest.raises(TypeError):  # what a span hands out cannot change the shared dict
        spans[0].attributes["x"] = 1  # type: ignore[index]


def test_a_user_step_span_processor_gets_whole_steps():
    got: list[otel_tunix.FinishedStep] = []

    class Whole(StepSpanProcessor):
        def on_finished_steps(self, steps):
            got.extend(steps)

        def on_end(self, span):  # pragma: no cover - not called for otel-tunix's steps
            raise AssertionError("on_end called for a step otel-tunix built")

    with capture() as cap:
        cap.tracer_provider.add_span_processor(Whole())
        with otel_tunix.step(6, scope="eval"):
            with otel_tunix.component("load", blocked=True):
                time.sleep(0.002)
            with otel_tunix.component("compute"):
                pass
        cap.flush()
    (step,) = got
    assert (step.scope, step.number, step.span_count) == ("eval", 6, 3)
    names = [(n, b) for n, b, _, _ in step.intervals]
    assert names == [("load", True), ("compute", False)]
    load = step.intervals[0]
    assert load[3] - load[2] >= 2_000_000  # ns, the sleep
    assert [s.name for s in step.spans()] == ["load", "compute", "eval_step"]
    assert step.spans() is step.spans()  # built once


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # JAX, if imported earlier
def test_a_forked_child_gets_its_own_export_thread_and_empty_queue():
    import os

    exp = _Recorder()
    p = BatchExportProcessor(exp, schedule_delay_millis=60_000)
    p.on_end(_span(1))  # queued in the parent: must not be exported twice
    pid = os.fork()
    if pid == 0:  # the child: a fresh queue and a live export thread
        code = 1
        try:
            p.on_end(_span(2))
            p.force_flush()
            alive = p._queue._thread.is_alive()
            code = 0 if _names(exp) == ["s2"] and alive else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    p.force_flush()
    assert _names(exp) == ["s1"]
    p.shutdown()


def test_summary_is_written_before_a_hanging_exporter_finishes_shutting_down(tmp_path):
    exp = Hanging()
    otel_tunix.configure(output_dir=tmp_path, span_exporters=[exp])
    with otel_tunix.step(0):
        pass
    done = threading.Event()
    t = threading.Thread(target=lambda: (otel_tunix.shutdown(), done.set()))
    t.start()
    summary = tmp_path / "summary.json"
    deadline = time.monotonic() + 10
    while not summary.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    first = json.loads(summary.read_text())
    assert first["complete"] is False and not done.is_set()  # the exporter still hangs
    assert first["scopes"][0]["steps"] == 1
    exp.release.set()
    t.join(30)
    final = json.loads(summary.read_text())
    assert final["complete"] is True
    assert final["export"]["Hanging"]["spans_exported"] == 1


def test_steps_set_aside_needs_a_configured_run_and_restores_the_worker():
    otel_tunix.shutdown()
    with pytest.raises(RuntimeError, match="configure"):
        with steps_set_aside():
            pass
    exp = InMemorySpanExporter()
    otel_tunix.configure(output_dir="none", span_exporters=[exp])
    with steps_set_aside() as kept, otel_tunix.step(0):
        pass
    with otel_tunix.step(1):  # after the block: processed and exported again
        pass
    otel_tunix.shutdown()
    assert [r.number for r in kept] == [0]
    assert [s.attributes["tunix.step"] for s in exp.get_finished_spans()] == [1]
