"""The Perfetto exporter, with real OTel spans and real trace files.

Every written file is read back packet by packet and replayed the way Perfetto's trace
processor does (events sorted by timestamp, ties in file order; one stack of open slices per
track; interned names resolved per sequence), then checked against the spans.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExportResult,
)
from opentelemetry.util._importlib_metadata import entry_points
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from otel_tunix.accounting.step_time import account_step
from otel_tunix.exporters.perfetto import (
    PerfettoSpanExporter,
    PerfettoTraceWriter,
    TraceSpan,
    convert_jsonl_to_perfetto,
)
from otel_tunix.model.steps import SpanInfo
from otel_tunix.settings import attributes as attr

T0 = 1_700_000_000_000_000_000  # Unix epoch ns
MS = 1_000_000
MAIN, WORKER, LEARNER = 101, 202, 303  # thread ids


# --- reading a trace back ----------------------------------------------------------------


def _varint(data: bytes, pos: int) -> tuple[int, int] | None:
    value = shift = 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    return None


def iter_packets(data: bytes) -> Iterator[pb.TracePacket]:
    """Packets of a ``Trace`` (repeated field 1), stopping at the first incomplete one."""
    pos = 0
    while pos < len(data):
        key = _varint(data, pos)
        if key is None:
            return
        assert key[0] == (1 << 3) | 2, f"unexpected field key {key[0]} at byte {pos}"
        size = _varint(data, key[1])
        if size is None or size[1] + size[0] > len(data):
            return
        packet = pb.TracePacket()
        packet.ParseFromString(data[size[1] : size[1] + size[0]])
        yield packet
        pos = size[1] + size[0]


@dataclass
class Slice:
    name: str
    start: int
    end: int
    track: int
    depth: int
    args: dict[str, object]
    category: str


@dataclass
class TraceView:
    packets: list[pb.TracePacket]
    tracks: dict[int, pb.TrackDescriptor] = field(default_factory=dict)
    slices: list[Slice] = field(default_factory=list)
    instants: list[Slice] = field(default_factory=list)
    counters: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    def track_name(self, uuid: int) -> str:
        desc = self.tracks[uuid]
        return desc.thread.thread_name if desc.HasField("thread") else desc.name

    def thread_lanes(self, thread_name: str) -> set[int]:
        """The thread track of that name and its child lanes."""
        (base,) = [
            u
            for u, d in self.tracks.items()
            if d.HasField("thread") and d.thread.thread_name == thread_name
        ]
        return {base} | {u for u, d in self.tracks.items() if d.parent_uuid == base}

    def named(self, name: str) -> list[Slice]:
        return [s for s in self.slices if s.name == name]


def _args(annotations: Sequence[pb.DebugAnnotation]) -> dict[str, object]:
    out: dict[str, object] = {}
    for a in annotations:
        kind = a.WhichOneof("value")
        out[a.name] = getattr(a, kind) if kind else [_args([v])[""] for v in a.array_values]
    return out


def load(data: bytes) -> TraceView:
    """Replay a trace like the trace processor and check it is well formed."""
    packets = list(iter_packets(data))
    view = TraceView(packets)
    names: dict[int, dict[int, str]] = {}
    categories: dict[int, dict[int, str]] = {}
    events: list[tuple[int, int, pb.TracePacket, str, str]] = []
    for index, p in enumerate(packets):
        seq = p.trusted_packet_sequence_id
        assert seq != 0, "every packet is on a sequence"
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            names[seq], categories[seq] = {}, {}
        for n in p.interned_data.event_names:
            names[seq][n.iid] = n.name
        for c in p.interned_data.event_categories:
            categories[seq][c.iid] = c.name
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            assert d.uuid not in view.tracks or view.tracks[d.uuid] == d
            assert not d.parent_uuid or d.parent_uuid in view.tracks, "parent described first"
            view.tracks[d.uuid] = d
        if p.HasField("track_event"):
            ev = p.track_event
            assert p.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
            assert seq in names, "incremental state was cleared before use"
            assert p.timestamp_clock_id == pb.BUILTIN_CLOCK_REALTIME
            assert ev.track_uuid in view.tracks, "track described before its events"
            name = names[seq][ev.name_iid] if ev.name_iid else ev.name
            cat = ",".join([categories[seq][i] for i in ev.category_iids] + list(ev.categories))
            events.append((p.timestamp, index, p, name, cat))
    events.sort(key=lambda e: (e[0], e[1]))  # the trace processor's order
    stacks: dict[int, list[Slice]] = {}
    for ts, _, p, name, cat in events:
        ev = p.track_event
        stack = stacks.setdefault(ev.track_uuid, [])
        if ev.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            s = Slice(name, ts, -1, ev.track_uuid, len(stack), _args(ev.debug_annotations), cat)
            stack.append(s)
        elif ev.type == pb.TrackEvent.TYPE_SLICE_END:
            assert stack, f"SLICE_END without SLICE_BEGIN on track {ev.track_uuid} at {ts}"
            s = stack.pop()
            s.end = ts
            view.slices.append(s)
        elif ev.type == pb.TrackEvent.TYPE_INSTANT:
            view.instants.append(
                Slice(name, ts, ts, ev.track_uuid, len(stack), _args(ev.debug_annotations), cat)
            )
        elif ev.type == pb.TrackEvent.TYPE_COUNTER:
            assert view.tracks[ev.track_uuid].HasField("counter")
            key = view.tracks[ev.track_uuid].name
            view.counters.setdefault(key, []).append((ts, ev.double_counter_value))
    assert all(not s for s in stacks.values()), "every SLICE_BEGIN has its SLICE_END"
    _assert_nested(view.slices)
    return view


def _assert_nested(slices: list[Slice]) -> None:
    """On every track, two slices are disjoint or one contains the other."""
    by_track: dict[int, list[Slice]] = {}
    for s in slices:
        by_track.setdefault(s.track, []).append(s)
    for track, items in by_track.items():
        items.sort(key=lambda s: (s.start, -s.end))
        open_ends: list[int] = []
        for s in items:
            while open_ends and open_ends[-1] <= s.start:
                open_ends.pop()
            assert not open_ends or s.end <= open_ends[-1], f"overlap on track {track}: {s}"
            open_ends.append(s.end)


def read_files(directory: Path) -> list[tuple[Path, TraceView]]:
    out = []
    for path in sorted(directory.glob("*.pftrace")):
        data = path.read_bytes()
        whole = pb.Trace()
        whole.ParseFromString(data)  # the concatenation is one valid Trace message
        view = load(data)
        assert len(whole.packet) == len(view.packets)
        out.append((path, view))
    return out


# --- producing spans ---------------------------------------------------------------------


@dataclass
class Recorded:
    name: str
    start: int
    end: int


class Run:
    """Spans made with a real TracerProvider, the tunix attributes set by hand."""

    def __init__(
        self,
        exporter: PerfettoSpanExporter,
        resource: dict[str, object] | None = None,
        *,
        batch: bool = False,
    ) -> None:
        if resource is None:
            resource = {"service.name": "trainer", "host.name": "node-1", attr.RANK: 3}
        self.provider = TracerProvider(resource=Resource.create(resource))  # type: ignore[arg-type]
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("test")
        self.recorded: list[Recorded] = []
        self.components: dict[tuple[str, int], list[SpanInfo]] = {}

    def start(
        self,
        name: str,
        start_ms: float,
        parent: trace.Span | None = None,
        **attributes: object,
    ) -> trace.Span:
        ctx = trace.set_span_in_context(parent) if parent is not None else None
        return self.tracer.start_span(
            name, context=ctx, start_time=T0 + int(start_ms * MS), attributes=attributes
        )

    def end(self, span: trace.Span, end_ms: float) -> None:
        end = T0 + int(end_ms * MS)
        span.end(end_time=end)
        readable = span  # the SDK span is a ReadableSpan
        self.recorded.append(Recorded(readable.name, readable.start_time, end))  # type: ignore[attr-defined]
        a = readable.attributes  # type: ignore[attr-defined]
        if a.get(attr.SPAN_TYPE) == attr.SPAN_TYPE_COMPONENT:
            self.components.setdefault((a[attr.SCOPE], a[attr.STEP]), []).append(
                SpanInfo(
                    name=readable.name,  # type: ignore[attr-defined]
                    kind=a[attr.TIME_KIND],
                    start_ns=readable.start_time,  # type: ignore[attr-defined]
                    end_ns=end,
                )
            )

    def step(
        self, scope: str, n: int, start_ms: float, parent: trace.Span | None = None
    ) -> trace.Span:
        return self.start(
            f"{scope}_step",
            start_ms,
            parent,
            **{attr.SPAN_TYPE: attr.SPAN_TYPE_STEP, attr.STEP: n, attr.SCOPE: scope},
        )

    def component(
        self,
        step: trace.Span,
        name: str,
        start_ms: float,
        *,
        kind: str = attr.KIND_BUSY,
        thread: tuple[int, str] | None = None,
        parent: trace.Span | None = None,
    ) -> trace.Span:
        a = step.attributes  # type: ignore[attr-defined]
        attributes: dict[str, object] = {
            attr.SPAN_TYPE: attr.SPAN_TYPE_COMPONENT,
            attr.STEP: a[attr.STEP],
            attr.SCOPE: a[attr.SCOPE],
            attr.COMPONENT: name,
            attr.TIME_KIND: kind,
        }
        if thread is not None:
            attributes[attr.THREAD_ID], attributes[attr.THREAD_NAME] = thread
        return self.start(name, start_ms, parent or step, **attributes)


def async_rl_run(exporter: PerfettoSpanExporter, *, batch: bool = False) -> Run:
    """Two train steps on the main thread, overlapping rollouts on one worker thread, a
    learner step on its own thread, a foreign HTTP span with an exception event nested in a
    component, a zero-length component, a component that outlives its step, a foreign span
    that ends after its step, a foreign span around a component (exported before it, as the
    core exports components at the end of the step) and a foreign span around all steps."""
    run = Run(exporter, batch=batch)
    main, worker, learner = (MAIN, "MainThread"), (WORKER, "rollout-0"), (LEARNER, "learner")

    outer = run.start("training", 0)
    s1 = run.step("train", 1, 0, outer)
    load_ = run.component(s1, "train_data_load", 0, thread=main)
    run.end(load_, 20)
    rollout_a = run.component(s1, "rollout", 25, thread=worker)
    rollout_b = run.component(s1, "rollout", 50, thread=worker)  # overlaps a, not nested
    wait = run.component(s1, "train_queue_wait", 20, kind=attr.KIND_BLOCKED, thread=main)
    run.end(wait, 30)
    compute = run.component(s1, "train_step_compute", 30, thread=main)
    http = run.start("http_get", 40, compute)  # foreign: no tunix keys, no thread info
    http.add_event("exception", {"exception.type": "TimeoutError"}, timestamp=T0 + 45 * MS)
    run.end(http, 50)
    run.end(rollout_a, 60)
    run.end(rollout_b, 80)
    run.end(compute, 90)
    save = run.component(s1, "checkpoint_save", 90)  # no thread info: goes with its step
    run.end(save, 95)
    device = run.component(s1, "train_step_compute", 85, thread=main)  # ends after the step
    late = run.start("async_upload", 96, s1)  # foreign, outlives the step
    run.end(device, 105)
    run.end(s1, 100)
    run.end(late, 130)

    s2 = run.step("train", 2, 105, outer)
    learn = run.step("rl/learner", 7, 50)
    train = run.component(learn, "actor_train_step", 60, thread=learner)
    run.end(train, 140)
    run.end(learn, 150)
    block = run.start("user_block", 108, s2)
    c2 = run.component(s2, "train_step_compute", 110, thread=main, parent=block)
    run.end(block, 182)
    run.end(c2, 180)
    empty = run.component(s2, "train_data_load", 180, thread=main)  # zero length
    run.end(empty, 180)
    run.end(s2, 200)
    run.end(outer, 201)
    return run


# --- tests -------------------------------------------------------------------------------


def test_async_rl_spans_make_a_valid_readable_trace(tmp_path: Path) -> None:
    exporter = PerfettoSpanExporter(directory=tmp_path)
    run = async_rl_run(exporter)
    run.provider.shutdown()
    ((path, view),) = read_files(tmp_path)
    assert path == exporter.path

    # One slice per span, same names and times.
    got = sorted((s.name, s.start, s.end) for s in view.slices)
    assert got == sorted((r.name, r.start, r.end) for r in run.recorded)

    # Process and thread descriptors.
    (process,) = [d for d in view.tracks.values() if d.HasField("process")]
    assert process.process.pid == os.getpid()
    assert process.process.process_name == "trainer (node-1, rank 3)"
    threads = {d.thread.thread_name: d for d in view.tracks.values() if d.HasField("thread")}
    assert set(threads) == {"MainThread", "rollout-0", "learner"}
    assert {d.thread.tid for d in threads.values()} == {MAIN, WORKER, LEARNER}
    assert all(d.parent_uuid == process.uuid for d in threads.values())
    assert all(d.thread.pid == os.getpid() for d in threads.values())

    # Components on their threads; the overlapping rollouts on two lanes of one thread.
    worker = view.thread_lanes("rollout-0")
    rollouts = view.named("rollout")
    assert {s.track for s in rollouts} <= worker
    assert len({s.track for s in rollouts}) == 2
    main = view.thread_lanes("MainThread")
    assert {s.track for s in view.named("train_step_compute")} <= main
    assert len(main) >= 2, "the component that outlives its step needs a lane of its own"
    # The foreign span nests in its component, on the same track.
    (http,) = view.named("http_get")
    (compute,) = [s for s in view.named("train_step_compute") if s.start == T0 + 30 * MS]
    assert http.track == compute.track and http.depth == compute.depth + 1

    # Steps of a scope share a track; spans without thread info go with their step.
    steps = view.named("train_step")
    assert len({s.track for s in steps}) == 1
    assert view.track_name(steps[0].track) == "train steps"
    (save,) = view.named("checkpoint_save")
    assert save.track == steps[0].track and save.depth == 1
    (late,) = view.named("async_upload")
    assert view.track_name(late.track).startswith("train steps")
    (block,) = view.named("user_block")
    assert block.track == steps[0].track and block.depth == 1
    (outer,) = view.named("training")
    assert view.track_name(outer.track) == "other spans"
    (learner_step,) = view.named("rl/learner_step")
    assert view.track_name(learner_step.track) == "rl/learner steps"

    # Step arguments and the span event as an instant.
    step1 = next(s for s in steps if s.args[attr.STEP] == 1)
    assert step1.args[attr.SCOPE] == "train" and step1.category == "step"
    assert {"busy_time_sec", "blocked_time_sec", "idle_time_sec", "step_time_sec"} <= set(
        step1.args
    )
    (exc,) = view.instants
    assert (exc.name, exc.start, exc.track) == ("exception", T0 + 45 * MS, http.track)
    assert exc.args == {"exception.type": "TimeoutError"}

    # Counters: one value per step at its start, equal to account_step's.
    for (scope, n), infos in run.components.items():
        step = next(s for s in view.slices if s.args.get(attr.STEP) == n and s.category == "step")
        summary = account_step(scope, n, step.start, step.end, infos)
        for field_name in ("busy_time_sec", "blocked_time_sec", "idle_time_sec"):
            values = dict(view.counters[f"perf/{scope}/{field_name}"])
            assert values[step.start] == pytest.approx(getattr(summary, field_name), abs=1e-12)
            assert step.args[field_name] == pytest.approx(getattr(summary, field_name))
    assert dict(view.counters["perf/train/blocked_time_sec"])[T0] == pytest.approx(0.005)


def test_batch_span_processor_gives_the_same_slices(tmp_path: Path) -> None:
    simple = PerfettoSpanExporter(directory=tmp_path / "simple")
    async_rl_run(simple).provider.shutdown()
    batched = PerfettoSpanExporter(directory=tmp_path / "batch")
    async_rl_run(batched, batch=True).provider.shutdown()
    ((_, a),) = read_files(tmp_path / "simple")
    ((_, b),) = read_files(tmp_path / "batch")

    def layout(view: TraceView) -> list[tuple[str, int, int, str, int]]:
        return sorted(
            (s.name, s.start, s.end, view.track_name(s.track), s.depth) for s in view.slices
        )

    assert layout(a) == layout(b)
    assert a.counters == b.counters


def test_header_clock_and_sequence(tmp_path: Path) -> None:
    exporter = PerfettoSpanExporter(directory=tmp_path)
    async_rl_run(exporter).provider.shutdown()
    ((_, view),) = read_files(tmp_path)
    first = view.packets[0]
    assert first.first_packet_on_sequence
    assert first.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    assert first.clock_snapshot.primary_trace_clock == pb.BUILTIN_CLOCK_REALTIME
    assert len({p.trusted_packet_sequence_id for p in view.packets}) == 1
    timed = [p.timestamp for p in view.packets if p.HasField("track_event")]
    assert min(timed) == T0 and max(timed) == T0 + 201 * MS


def test_spans_are_streamed_as_exported(tmp_path: Path) -> None:
    exporter = PerfettoSpanExporter(directory=tmp_path)
    run = Run(exporter)
    assert exporter.path is None  # created lazily
    sizes = []
    for n in range(3):
        step = run.step("train", n, n * 10)
        comp = run.component(step, "train_step_compute", n * 10, thread=(MAIN, "MainThread"))
        run.end(comp, n * 10 + 5)
        run.end(step, n * 10 + 9)
        assert exporter.path is not None
        sizes.append(exporter.path.stat().st_size)
        assert len(load(exporter.path.read_bytes()).slices) == 2 * (n + 1)
    assert sizes == sorted(sizes) and len(set(sizes)) == 3
    run.provider.shutdown()


def test_file_names_do_not_collide(tmp_path: Path) -> None:
    first = PerfettoSpanExporter(directory=tmp_path)
    second = PerfettoSpanExporter(directory=tmp_path)
    second._start_ms = first._start_ms  # same process, same millisecond: the worst case
    for exporter in (first, second):
        run = Run(exporter)
        run.end(run.step("train", 0, 0), 1)
        run.provider.shutdown()
    assert first.path is not None and second.path is not None
    assert first.path != second.path
    host = re.sub(r"[^A-Za-z0-9._-]+", "_", socket.gethostname())
    pattern = rf"trace-{re.escape(host)}-r3-{os.getpid()}-\d+(-\d+)?\.pftrace"
    assert re.fullmatch(pattern, first.path.name)
    assert re.fullmatch(pattern, second.path.name)
    assert len(read_files(tmp_path)) == 2

    third = PerfettoSpanExporter(directory=tmp_path / "no-rank")
    run = Run(third, {"service.name": "x"})
    run.end(run.step("train", 0, 0), 1)
    run.provider.shutdown()
    assert third.path is not None and "-r" not in third.path.name.removeprefix(f"trace-{host}")


def test_directory_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TUNIX_OUTPUT_DIR", str(tmp_path / "out"))
    assert PerfettoSpanExporter().directory == tmp_path / "out" / "perfetto"
    monkeypatch.setenv("OTEL_TUNIX_PERFETTO_DIR", str(tmp_path / "pf"))
    assert PerfettoSpanExporter().directory == tmp_path / "pf"
    assert PerfettoSpanExporter(directory=tmp_path / "arg").directory == tmp_path / "arg"
    monkeypatch.delenv("OTEL_TUNIX_PERFETTO_DIR")
    monkeypatch.delenv("OTEL_TUNIX_OUTPUT_DIR")
    assert PerfettoSpanExporter().directory == Path("otel-tunix-runs") / "perfetto"


def test_truncated_file_reads_up_to_the_last_whole_packet(tmp_path: Path) -> None:
    exporter = PerfettoSpanExporter(directory=tmp_path)
    async_rl_run(exporter).provider.shutdown()
    assert exporter.path is not None
    data = exporter.path.read_bytes()
    packets = list(iter_packets(data))
    ends = []  # byte offset where each packet ends
    pos = 0
    for p in packets:
        size = len(p.SerializeToString())
        pos += 1 + len(_encode_varint(size)) + size
        ends.append(pos)
    assert ends[-1] == len(data)
    for cut in (len(data) - 1, ends[-2] + 1, ends[len(ends) // 2] + 3, ends[0], 5):
        whole = sum(1 for e in ends if e <= cut)
        kept = list(iter_packets(data[:cut]))
        assert len(kept) == whole
        assert kept == packets[:whole]


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def test_export_never_raises_and_lifecycle_is_idempotent(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    broken = PerfettoSpanExporter(directory=blocker / "sub")
    run = Run(broken)
    step = run.step("train", 0, 0)
    step.end(end_time=T0 + MS)  # exported through SimpleSpanProcessor: must not raise
    result = broken.export([step])  # type: ignore[list-item]
    assert result is SpanExportResult.FAILURE
    assert broken.force_flush() is True
    broken.shutdown()
    broken.shutdown()

    exporter = PerfettoSpanExporter(directory=tmp_path / "ok")
    assert exporter.export([]) is SpanExportResult.SUCCESS
    assert exporter.force_flush() and exporter.force_flush()
    exporter.shutdown()
    exporter.shutdown()
    assert exporter.force_flush()
    assert exporter.export([step]) is SpanExportResult.FAILURE  # type: ignore[list-item]


def test_concurrent_exports_are_serialised(tmp_path: Path) -> None:
    exporter = PerfettoSpanExporter(directory=tmp_path)
    run = Run(exporter)

    def worker(k: int) -> None:
        for n in range(20):
            step = run.step(f"s{k}", n, n * 10)
            comp = run.component(step, "work", n * 10, thread=(1000 + k, f"w{k}"))
            comp.end(end_time=T0 + (n * 10 + 5) * MS)
            step.end(end_time=T0 + (n * 10 + 8) * MS)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run.provider.shutdown()
    ((_, view),) = read_files(tmp_path)
    assert len(view.slices) == 4 * 20 * 2


def test_pending_spans_stay_bounded(tmp_path: Path) -> None:
    out = tmp_path / "t.pftrace"
    with out.open("wb") as f:
        writer = PerfettoTraceWriter(f, max_pending_spans=10)
        for n in range(25):  # components whose step never arrives
            writer.add(
                TraceSpan(
                    name="orphan",
                    start_ns=T0 + n * MS,
                    end_ns=T0 + n * MS + 10,
                    trace_id=f"{n:032x}",
                    span_id=f"{n + 1:016x}",
                    parent_id="00000000000000ff",
                    span_type=attr.SPAN_TYPE_COMPONENT,
                    thread_id=MAIN,
                )
            )
            assert writer._pending_count <= 10
        assert writer.slice_count == 15
        writer.flush_pending()
        assert writer.slice_count == 25 and writer._pending_count == 0
    assert len(load(out.read_bytes()).slices) == 25


def _step_line(scope: str, n: int, start_ms: int, spans: list[SpanInfo]) -> str:
    start = T0 + start_ms * MS
    summary = account_step(scope, n, start, start + 50 * MS, spans, trace_id=f"{n:032x}")
    return json.dumps(summary.to_json())


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_convert_jsonl(tmp_path: Path, suffix: str) -> None:
    lines = []
    expected: list[tuple[str, int, int]] = []
    infos_by_step = {}
    for n in range(3):
        base = T0 + n * 100 * MS
        infos = [
            SpanInfo("train_data_load", "busy", base, base + 10 * MS, "MainThread", MAIN, "a" * 16),
            SpanInfo(
                "train_queue_wait", "blocked", base + 5 * MS, base + 20 * MS, "MainThread", MAIN
            ),
            SpanInfo("rollout", "busy", base + 2 * MS, base + 30 * MS, "rollout-0", WORKER),
            SpanInfo("rollout", "busy", base + 25 * MS, base + 40 * MS, "rollout-0", WORKER),
            SpanInfo("checkpoint_save", "busy", base + 40 * MS, base + 45 * MS),
        ]
        infos_by_step[n] = infos
        lines.append(_step_line("train", n, n * 100, infos))
        expected.append(("train_step", base, base + 50 * MS))
        expected.extend((i.name, i.start_ns, i.end_ns) for i in infos)
    lines.append(json.dumps({"type": "session", "scope": "train", "steps": 3}))
    lines.append('{"type": "step", "scope": "tr')  # cut short by a crash
    src = tmp_path / f"spans{suffix}"
    text = "\n".join(lines) + "\n"
    if suffix.endswith(".gz"):
        src.write_bytes(gzip.compress(text.encode()))
    else:
        src.write_text(text)
    out = tmp_path / "run.pftrace"

    assert convert_jsonl_to_perfetto(src, out) == len(expected)

    view = load(out.read_bytes())
    assert sorted((s.name, s.start, s.end) for s in view.slices) == sorted(expected)
    (process,) = [d for d in view.tracks.values() if d.HasField("process")]
    assert process.process.process_name == "spans"
    rollouts = view.named("rollout")
    assert {s.track for s in rollouts} <= view.thread_lanes("rollout-0")
    assert len({s.track for s in rollouts}) == 2
    for save in view.named("checkpoint_save"):
        assert view.track_name(save.track) == "train steps"
    for n, infos in infos_by_step.items():
        start = T0 + n * 100 * MS
        summary = account_step("train", n, start, start + 50 * MS, infos)
        for field_name in ("busy_time_sec", "blocked_time_sec", "idle_time_sec"):
            assert dict(view.counters[f"perf/train/{field_name}"])[start] == pytest.approx(
                getattr(summary, field_name)
            )


def test_traces_exporter_entry_point() -> None:
    (ep,) = entry_points(group="opentelemetry_traces_exporter", name="perfetto")
    cls = ep.load()
    assert cls is PerfettoSpanExporter
    exporter = cls()  # what OTEL_TRACES_EXPORTER=perfetto does
    exporter.shutdown()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_writes_a_file_of_its_own(tmp_path: Path) -> None:
    exporter = PerfettoSpanExporter(directory=tmp_path)
    run = Run(exporter)
    run.end(run.step("parent", 0, 0), 1)
    parent_path = exporter.path
    pid = os.fork()
    if pid == 0:  # the child: export, close, and leave without running pytest's teardown
        code = 1
        try:
            run.end(run.step("child", 0, 2), 3)
            run.provider.shutdown()
            code = 0 if exporter.path not in (None, parent_path) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    run.end(run.step("parent", 1, 4), 5)
    run.provider.shutdown()
    files = {path: sorted(s.name for s in view.slices) for path, view in read_files(tmp_path)}
    assert files.pop(parent_path) == ["parent_step", "parent_step"]
    ((child_path, child_slices),) = files.items()
    assert child_slices == ["child_step"]
    assert f"-{pid}-" in child_path.name
