"""Components outside any step: a checkpoint restore before the first step, an eval loop
between steps, a writer after the last step, each with components nested in it.

One real run sends its spans to a real collector (rotel), streams a Perfetto trace and
writes the spans JSONL; each component is bracketed by the test's own clock (a reading just
outside the ``with`` and one just inside), so what every destination got is checked against
what the test measured. ``sampling_rate=2`` (the eval loop runs after a step that is not
sampled) and a component filter (a filtered outside component records nothing) are on.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from collector import DebugSpan, RotelCollector
from exporters.test_perfetto import TraceView, load, read_files

import otel_tunix
from otel_tunix.accounting import categories
from otel_tunix.consumers.step_accounting import StepSink
from otel_tunix.exporters.perfetto.converter import convert_jsonl_to_perfetto
from otel_tunix.pipeline.outside import OutsideSpan
from otel_tunix.settings import attributes as attr
from otel_tunix.testing import capture

clock = time.perf_counter_ns
OUTSIDE_NAMES = ("checkpoint_restore", "read_shard", "evaluate", "eval_batch", "final_save",
                 "chunk", "jax_compile")  # fmt: skip
ALLOWED = (*OUTSIDE_NAMES, "compute", "save_probe")
TOLERANCE_NS = 2_000_000
"""Between the test's Unix-time conversion and otel-tunix's (two clocks read apart, a
clock slewed by NTP): 2 ms, far below every sleep measured here."""
PRINTED_NS = 1024
"""The collector prints times through a double: 256 ns apart at today's dates."""


@dataclass
class Truth:
    """What the test's own clock read around each block (perf_counter ns)."""

    offset: int = 0  # time.time_ns() - perf_counter_ns(), read by the test
    outer: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    inner: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    compile_ns: tuple[int, int] = (0, 0)

    def brackets(self, name: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """(outer, inner) windows of each use of ``name``, in Unix ns."""
        o = self.offset
        return [
            ((a + o, b + o), (c + o, d + o))
            for (a, b), (c, d) in zip(self.outer[name], self.inner[name], strict=True)
        ]


class Timed:
    """``with Timed(truth, name): ...``: ``otel_tunix.component(name)`` bracketed by the
    test's clock."""

    def __init__(self, truth: Truth, name: str, **kwargs: Any) -> None:
        self.truth, self.name, self.kwargs = truth, name, kwargs

    def __enter__(self) -> None:
        self.before = clock()
        self.comp = otel_tunix.component(self.name, **self.kwargs)
        self.comp.__enter__()
        self.inside = clock()

    def __exit__(self, *exc: object) -> None:
        leaving = clock()
        self.comp.__exit__(None, None, None)
        after = clock()
        self.truth.outer.setdefault(self.name, []).append((self.before, after))
        self.truth.inner.setdefault(self.name, []).append((self.inside, leaving))


class OutsideSink(StepSink):
    """A user's sink (run on a thread of its own): what ``on_outside_spans`` hands on."""

    def __init__(self) -> None:
        self.spans: list[OutsideSpan] = []

    def on_outside_spans(self, spans: Any) -> None:
        self.spans.extend(spans)


@dataclass
class Run:
    truth: Truth
    received: list[DebugSpan]
    jsonl: list[dict[str, Any]]
    perfetto: TraceView
    converted: TraceView
    sink: OutsideSink


def _workload(truth: Truth) -> None:
    t = truth
    start = clock()  # a compilation an integration learns of after the fact
    time.sleep(0.005)
    t.compile_ns = (start, clock())
    otel_tunix.record_component("jax_compile", *t.compile_ns)
    with Timed(t, "checkpoint_restore"), Timed(t, "read_shard"):  # before the first step
        time.sleep(0.02)
    with Timed(t, "ignored_phase"):  # filtered out: records nothing
        time.sleep(0.002)
    for n in range(4):
        with otel_tunix.step(n), Timed(t, "compute"):
            time.sleep(0.002)
            with otel_tunix.component("save_probe", category="checkpoint_save"):
                pass  # in a step: its span and JSONL entry carry the category too
        if n == 1:  # between steps, after one that is not sampled
            with Timed(t, "evaluate", category="evaluation"):
                for _ in range(2):
                    with Timed(t, "eval_batch"):
                        time.sleep(0.005)

    def writer() -> None:  # after the last step, on a thread of its own
        with Timed(t, "final_save", category="checkpoint_save"), Timed(t, "chunk"):
            time.sleep(0.01)

    thread = threading.Thread(target=writer, name="ckpt-writer")
    thread.start()
    thread.join()


@pytest.fixture
def run(
    rotel_collector: RotelCollector, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Run]:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rotel_collector.grpc_endpoint)
    truth = Truth(offset=time.time_ns() - clock())
    sink = OutsideSink()
    # Declarations are the process's: start from none (an integration's test may have made
    # some: "checkpoint_restore"), put them back after.
    before = dict(categories._declared)
    categories._declared.clear()
    categories.classify.cache_clear()
    otel_tunix.configure(
        service_name="outside-steps",
        output_dir=tmp_path / "runs",
        run_id="outside",
        perf=otel_tunix.PerformanceMetricsConfig(
            sampling_rate=2, components=ALLOWED, perfetto_trace_dir=tmp_path / "pf"
        ),
        step_sinks=[sink],
    )
    try:
        _workload(truth)
    finally:
        otel_tunix.shutdown()
    out = rotel_collector.wait_for_spans(*OUTSIDE_NAMES, "train_step")
    (spans_path,) = (tmp_path / "runs").rglob("spans*.jsonl")
    lines = [json.loads(line) for line in spans_path.read_text().splitlines()]
    (_, live), *_ = read_files(tmp_path / "pf")
    convert_jsonl_to_perfetto(spans_path, tmp_path / "converted.pftrace")
    converted = load((tmp_path / "converted.pftrace").read_bytes())
    yield Run(truth, out.spans, lines, live, converted, sink)
    categories._declared.clear()
    categories._declared.update(before)
    categories.classify.cache_clear()


def _within(
    span: tuple[int, int], outer: tuple[int, int], inner: tuple[int, int], slack: int = 0
) -> None:
    """A recorded span against the test's readings: it lies inside the outer window and
    covers the inner one (up to the clocks' conversion), and its length lies between the
    inner and outer lengths (exactly, but for ``slack``: the collector prints times as
    doubles, a quarter of a microsecond apart at today's dates)."""
    start, end = span
    assert outer[0] - TOLERANCE_NS <= start <= inner[0] + TOLERANCE_NS
    assert inner[1] - TOLERANCE_NS <= end <= outer[1] + TOLERANCE_NS
    assert inner[1] - inner[0] - slack <= end - start <= outer[1] - outer[0] + slack


def test_the_collector_gets_roots_of_their_own_traces(run: Run) -> None:
    got = {name: [s for s in run.received if s.name == name] for name in OUTSIDE_NAMES}
    assert {n: len(v) for n, v in got.items()} == {
        "checkpoint_restore": 1, "read_shard": 1, "evaluate": 1, "eval_batch": 2,
        "final_save": 1, "chunk": 1, "jax_compile": 1,
    }  # fmt: skip
    assert not [s for s in run.received if s.name == "ignored_phase"]
    steps = [s for s in run.received if s.name == "train_step"]
    assert sorted(s.attributes[attr.STEP] for s in steps) == [0, 2]  # sampling_rate=2
    for s in run.received:  # in steps, through the OTLP fast path's own encoding
        if s.name in ("compute", "save_probe"):
            assert s.attributes.get(attr.GOODPUT_CATEGORY) == (
                "checkpoint_save" if s.name == "save_probe" else None
            )
    roots = {n: got[n][0] for n in ("checkpoint_restore", "evaluate", "final_save", "jax_compile")}
    traces = {s.trace_id for s in roots.values()}
    assert len(traces) == 4 and not traces & {s.trace_id for s in steps}
    for root, children in (("checkpoint_restore", ["read_shard"]),
                           ("evaluate", ["eval_batch", "eval_batch"]),
                           ("final_save", ["chunk"])):  # fmt: skip
        r = roots[root]
        assert r.parent_span_id is None
        assert sorted(c.name for c in run.received if c.parent_span_id == r.span_id) == children
        for c in got[children[0]]:
            assert c.trace_id == r.trace_id and c.parent_span_id == r.span_id
    for s in (span for spans in got.values() for span in spans):
        assert s.attributes[attr.OUTSIDE] is True
        assert attr.STEP not in s.attributes and attr.SCOPE not in s.attributes
        assert s.attributes[attr.COMPONENT] == s.name
        assert s.attributes[attr.TIME_KIND] == "busy"
    assert roots["evaluate"].attributes[attr.GOODPUT_CATEGORY] == "evaluation"
    assert roots["final_save"].attributes[attr.GOODPUT_CATEGORY] == "checkpoint_save"
    assert attr.GOODPUT_CATEGORY not in roots["checkpoint_restore"].attributes  # by name only
    assert got["chunk"][0].attributes[attr.THREAD_NAME] == "ckpt-writer"
    assert roots["checkpoint_restore"].attributes[attr.THREAD_NAME] == "MainThread"
    for name, spans in got.items():
        if name == "jax_compile":  # recorded after the fact: exactly the times given
            s0, s1 = run.truth.compile_ns
            assert (spans[0].start_ns, spans[0].end_ns) == (
                pytest.approx(s0 + run.truth.offset, abs=TOLERANCE_NS),
                pytest.approx(s1 + run.truth.offset, abs=TOLERANCE_NS),
            )
            assert spans[0].end_ns - spans[0].start_ns == pytest.approx(s1 - s0, abs=PRINTED_NS)
            continue
        for s, (outer, inner) in zip(spans, run.truth.brackets(name), strict=True):
            _within((s.start_ns, s.end_ns), outer, inner, PRINTED_NS)


def test_the_spans_jsonl_has_an_outside_line_each(run: Run) -> None:
    header, *rest = run.jsonl
    assert header["type"] == "run"
    outside = [line for line in rest if line.get("outside")]
    received = {s.span_id: s for s in run.received if s.name in OUTSIDE_NAMES}
    assert sorted(line["span_id"] for line in outside) == sorted(received)
    for line in outside:
        s = received[line["span_id"]]
        category = {"evaluate": "evaluation", "final_save": "checkpoint_save"}.get(line["name"])
        expected_keys = {"type", "outside", "scope", "step", "trace_id", "span_id", "parent",
                         "name", "kind", "start_ns", "end_ns", "thread", "thread_id",
                         "attributes"} | ({"category"} if category else set())  # fmt: skip
        assert set(line) == expected_keys
        assert (line["type"], line["scope"], line["step"]) == ("span", None, None)
        assert line.get("category") == category
        assert (line["name"], line["trace_id"], line["parent"]) == (
            s.name,
            s.trace_id,
            s.parent_span_id,
        )
        assert line["start_ns"] == pytest.approx(s.start_ns, abs=PRINTED_NS)
        assert line["end_ns"] == pytest.approx(s.end_ns, abs=PRINTED_NS)
        assert line["attributes"] == {attr.OUTSIDE: True}
        assert line["thread"] == s.attributes[attr.THREAD_NAME]
    for name in ("checkpoint_restore", "evaluate", "eval_batch", "final_save"):
        lines = sorted((ln for ln in outside if ln["name"] == name), key=lambda ln: ln["start_ns"])
        for ln, (outer, inner) in zip(lines, run.truth.brackets(name), strict=True):
            _within((ln["start_ns"], ln["end_ns"]), outer, inner)
    steps = [line for line in rest if line.get("type") == "step"]
    assert [line["step"] for line in steps] == [0, 2]
    # components inside steps carry a declared category too ("compute" has none)
    for line in steps:
        cats = {sp["name"]: sp.get("category") for sp in line["spans"]}
        assert cats == {"compute": None, "save_probe": "checkpoint_save"}


def _slices(view: TraceView, name: str) -> list[Any]:
    return sorted(view.named(name), key=lambda s: s.start)


@pytest.mark.parametrize("which", ["streamed", "converted"])
def test_perfetto_nests_them_on_their_threads(run: Run, which: str) -> None:
    view = run.perfetto if which == "streamed" else run.converted
    for root, child in (("checkpoint_restore", "read_shard"), ("evaluate", "eval_batch"),
                        ("final_save", "chunk")):  # fmt: skip
        (r,) = _slices(view, root)
        kids = _slices(view, child)
        assert kids and all(k.track == r.track and k.depth == r.depth + 1 for k in kids)
        assert all(r.start <= k.start and k.end <= r.end for k in kids)
        assert r.args[attr.OUTSIDE] is True
        for (outer, inner), s in zip(run.truth.brackets(root), [r], strict=True):
            _within((s.start, s.end), outer, inner)
    assert _slices(view, "evaluate")[0].args[attr.GOODPUT_CATEGORY] == "evaluation"
    (save,) = _slices(view, "final_save")
    assert save.track in view.thread_lanes("ckpt-writer")
    assert not view.named("ignored_phase")


def test_a_sink_gets_them_through_on_outside_spans(run: Run) -> None:
    """The hook the live ledger uses: every outside span once, nested ones before their
    root, with the category the ledger counts."""
    by_name: dict[str, list[OutsideSpan]] = {}
    for s in run.sink.spans:
        by_name.setdefault(s.name, []).append(s)
    assert sorted(by_name) == sorted(OUTSIDE_NAMES)
    ids = [s.span_id for s in run.sink.spans]
    assert len(ids) == len(set(ids)) == 8
    counted = {
        name: categories.classify(s[0].name, s[0].blocked, s[0].category)
        for name, s in by_name.items()
    }
    assert counted["evaluate"] == "evaluation"
    assert counted["final_save"] == "checkpoint_save"
    assert counted["checkpoint_restore"] == "checkpoint_restore"  # its name says so
    assert counted["jax_compile"] == "compilation"
    (restore,) = by_name["checkpoint_restore"]
    (shard,) = by_name["read_shard"]
    assert restore.root and not shard.root and shard.parent_id == restore.span_id
    assert run.sink.spans.index(shard) < run.sink.spans.index(restore)
    info = by_name["evaluate"][0].info()
    assert (info.category, info.to_json()["category"]) == ("evaluation", "evaluation")
    for name in ("checkpoint_restore", "evaluate", "final_save"):
        for s, (outer, inner) in zip(by_name[name], run.truth.brackets(name), strict=True):
            _within((s.start_ns, s.end_ns), outer, inner)


def test_a_bad_category_is_a_value_error_naming_it() -> None:
    # (an integration's test may have declared "evaluate" already: nothing may change it)
    before = categories.declared("evaluate"), categories.declared("save")
    with pytest.raises(ValueError, match=r"unknown goodput category 'evaluating'.*evaluation"):
        otel_tunix.component("evaluate", category="evaluating")
    with pytest.raises(ValueError, match="'ckpt'"):
        otel_tunix.record_component("save", 0, 1, category="ckpt")
    assert (categories.declared("evaluate"), categories.declared("save")) == before


def test_sampling_picks_steps_and_outside_components_are_all_recorded() -> None:
    """With ``sampling_rate=3``: every outside component is recorded (between sampled and
    unsampled steps alike, on the loop's thread or another); one of a thread without a step
    in its context while a step that is not sampled runs belongs to that step (nothing)."""

    def record(name: str) -> None:
        with otel_tunix.component(name):
            pass

    def on_a_thread(name: str) -> None:
        t = threading.Thread(target=record, args=(name,))
        t.start()
        t.join()

    perf = otel_tunix.PerformanceMetricsConfig(sampling_rate=3)
    with capture(perf=perf) as cap:
        for n in range(6):
            with otel_tunix.step(n):
                on_a_thread(f"beside_{n}")  # in step n: recorded iff n is sampled
            with otel_tunix.component(f"after_{n}"):
                on_a_thread(f"thread_after_{n}")  # no step open anywhere: outside
        spans = cap.spans()
    names = sorted(s.name for s in spans)
    assert names == sorted(
        [f"after_{n}" for n in range(6)] + [f"thread_after_{n}" for n in range(6)]
        + ["beside_0", "beside_3", "train_step", "train_step"]
    )  # fmt: skip
    by_name = {s.name: s for s in spans}
    for n in range(6):
        after, thread = by_name[f"after_{n}"], by_name[f"thread_after_{n}"]
        assert after.attributes[attr.OUTSIDE] is True and after.parent is None
        # a thread started without the context: a trace of its own, not a child
        assert thread.parent is None and thread.context.trace_id != after.context.trace_id
    for n in (0, 3):  # a sampled step's: into that step
        beside = by_name[f"beside_{n}"]
        assert beside.attributes[attr.STEP] == n and attr.OUTSIDE not in beside.attributes


def test_a_filtered_outside_component_records_nothing() -> None:
    perf = otel_tunix.PerformanceMetricsConfig(components=("kept",))
    with capture(perf=perf) as cap:
        with otel_tunix.component("dropped"), otel_tunix.component("kept"):
            pass  # the filtered one's child is an outside component of its own
        with otel_tunix.component("dropped"):
            pass
        spans = cap.spans()
    (kept,) = spans
    assert kept.name == "kept" and kept.parent is None and kept.attributes[attr.OUTSIDE]
