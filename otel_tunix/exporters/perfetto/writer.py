"""Translation of :class:`TraceSpan` records into Perfetto packets.

:class:`PerfettoTraceWriter` groups spans per step, lays each group out on lanes (child
tracks) so that the slices of every track nest strictly, and appends the packets to a binary
stream.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Final

from otel_tunix.accounting.step_time import account_step
from otel_tunix.exporters.perfetto.model import ProcessInfo, TraceSpan
from otel_tunix.model.steps import SpanInfo
from otel_tunix.settings.attributes import (
    BACKGROUND,
    COMPONENT,
    KIND_BLOCKED,
    KIND_BUSY,
    SCOPE,
    SPAN_TYPE,
    SPAN_TYPE_COMPONENT,
    SPAN_TYPE_STEP,
    STEP,
    STEP_BLOCKED_TIME,
    STEP_BUSY_TIME,
    STEP_DURATION,
    STEP_IDLE_TIME,
    THREAD_ID,
    THREAD_NAME,
)
from otel_tunix.support.text import utf8_text

try:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "otel_tunix.exporters.perfetto needs the 'perfetto' package: "
        "pip install 'otel-tunix[perfetto]'"
    ) from exc

__all__ = ["DEFAULT_MAX_PENDING_SPANS", "PerfettoTraceWriter"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_PENDING_SPANS: Final = 65_536
"""Spans held while waiting for their step (or root) span; the oldest trace is written
without it beyond this."""
_MAX_RECENT_SPANS: Final = 4_096  # written spans remembered, so late children find their lane
_MAX_INTERNED_NAMES: Final = 8_192  # further distinct names are written inline
_MAX_LANES: Final = 1_024  # per track group; a span that fits none is dropped (logged)

_REALTIME: Final = pb.BUILTIN_CLOCK_REALTIME
_BEGIN: Final = pb.TrackEvent.TYPE_SLICE_BEGIN
_END: Final = pb.TrackEvent.TYPE_SLICE_END
_INSTANT: Final = pb.TrackEvent.TYPE_INSTANT
_COUNTER: Final = pb.TrackEvent.TYPE_COUNTER
_NEEDS_STATE: Final = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
_STATE_CLEARED: Final = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_COUNTER_FIELDS: Final = ("busy_time_sec", "blocked_time_sec", "idle_time_sec")
_ACCOUNTING_FIELDS: Final = ("step_time_sec", *_COUNTER_FIELDS)
_ACCOUNTING_KEYS: Final = (STEP_DURATION, STEP_BUSY_TIME, STEP_BLOCKED_TIME, STEP_IDLE_TIME)
_BACKGROUND: Final = {BACKGROUND: True}


# --- the translation ---------------------------------------------------------------------


class _Lane:
    """One track on which slices strictly nest.

    Slices are placed in non-decreasing start order; ``open_ends`` holds the end times of
    the slices still open at ``last_start`` (outermost first, so it never increases).
    """

    __slots__ = ("last_start", "open_ends", "uuid")

    def __init__(self, uuid: int) -> None:
        self.uuid = uuid
        self.last_start = _INT64_MIN
        self.open_ends: list[int] = []

    def fit(self, start: int, end: int) -> int | None:
        """Depth at which ``[start, end]`` nests here, or ``None`` if it does not fit."""
        if start < self.last_start:
            return None
        ends = self.open_ends
        depth = len(ends)
        while depth and ends[depth - 1] <= start:
            depth -= 1
        if depth and ends[depth - 1] < end:
            return None
        return depth

    def place(self, start: int, end: int, depth: int) -> None:
        del self.open_ends[depth:]
        self.open_ends.append(end)
        self.last_start = start


class _TrackGroup:
    """A thread (or a named track) and its lanes: lane 0 is the track itself."""

    __slots__ = ("lanes", "name", "parent_uuid", "thread")

    def __init__(self, name: str, parent_uuid: int, thread: tuple[int, int] | None) -> None:
        self.name = utf8_text(name)
        self.parent_uuid = parent_uuid
        self.thread = thread  # (pid, tid) for thread tracks
        self.lanes: list[_Lane] = []


_Placement = tuple[_TrackGroup, int]


class _HeldTrace:
    """Spans of one trace held until their step (or root) span arrives."""

    __slots__ = ("children", "spans")

    def __init__(self) -> None:
        self.spans: dict[str, TraceSpan] = {}
        self.children: dict[str, list[str]] = {}  # parent span id -> held child span ids


_Event = tuple[tuple[int, ...], pb.TracePacket, str | None, str | None]
"""Sort key, packet, event name, category: names are interned when the packet is written."""


class PerfettoTraceWriter:
    """Translates :class:`TraceSpan` records into Perfetto packets on a binary stream.

    Spans are grouped per step: a span with a parent is held until its step span (or its
    local root) arrives, then the whole group is laid out on lanes and written. Only those
    pending spans, a bounded set of recently written span ids, and the per-track lane state
    are kept, so memory stays constant over a run.

    The writer is not thread-safe; :class:`PerfettoSpanExporter` holds a lock around it.

    Args:
        file: Binary stream the packets are appended to.
        sequence_id: ``trusted_packet_sequence_id`` of every packet (random if ``None``).
        max_pending_spans: Spans held while waiting for their step or root span.
    """

    def __init__(
        self,
        file: IO[bytes],
        *,
        sequence_id: int | None = None,
        max_pending_spans: int = DEFAULT_MAX_PENDING_SPANS,
    ) -> None:
        rng = random.Random()
        self._builder = StreamingTraceProtoBuilder(file)
        self._seq = sequence_id if sequence_id is not None else rng.randrange(1, 2**31)
        self._uuids = itertools.count(rng.getrandbits(62) | 1)
        self._max_pending = max(1, max_pending_spans)
        self._processes: dict[ProcessInfo, int] = {}
        self._groups: dict[tuple[object, ...], _TrackGroup] = {}
        self._counters: dict[tuple[int, str, str], int] = {}
        self._names: dict[str, int] = {}
        self._categories: dict[str, int] = {}
        self._pending: OrderedDict[str, _HeldTrace] = OrderedDict()
        self._pending_count = 0
        self._recent: OrderedDict[str, _Placement] = OrderedDict()
        self._serial = itertools.count()
        self._dropped_logged = False
        self.slice_count = 0
        """Slices written so far."""
        self._write_header()

    # -- public --

    def add(self, span: TraceSpan) -> None:
        """Take one finished span; write it (with its held descendants) once its group is
        complete.

        A group is complete when a step span or a local root span arrives, or when a span
        whose parent was already written arrives. Other spans are held.

        Args:
            span: The finished span.
        """
        closes_group = (
            span.span_type == SPAN_TYPE_STEP
            or span.parent_id is None
            or span.parent_id in self._recent
            or not span.span_id
        )
        if not closes_group:
            held = self._pending.get(span.trace_id)
            if held is None:
                held = self._pending[span.trace_id] = _HeldTrace()
            if span.span_id not in held.spans:
                self._pending_count += 1
                held.children.setdefault(span.parent_id or "", []).append(span.span_id)
            held.spans[span.span_id] = span
            if self._pending_count > self._max_pending:
                _, orphans = self._pending.popitem(last=False)
                self._pending_count -= len(orphans.spans)
                self.write_group(list(orphans.spans.values()))
            return
        self.write_group([span, *self._take_descendants(span)])

    def flush_pending(self) -> None:
        """Write every held span now, without waiting for its step (used at shutdown)."""
        while self._pending:
            _, held = self._pending.popitem(last=False)
            self._pending_count -= len(held.spans)
            self.write_group(list(held.spans.values()))

    def write_group(self, spans: Sequence[TraceSpan]) -> None:
        """Write a complete group of spans now (typically one step and its descendants).

        Args:
            spans: The spans; a ``step`` span among them gets the busy / blocked / idle
                counters of its ``component`` spans.
        """
        if not spans:
            return
        index = {s.span_id: i for i, s in enumerate(spans) if s.span_id}
        parents = [index.get(s.parent_id) if s.parent_id else None for s in spans]
        root = next(
            (i for i, s in enumerate(spans) if s.span_type == SPAN_TYPE_STEP),
            next((i for i, p in enumerate(parents) if p is None), 0),
        )
        depths = [_depth(i, parents) for i in range(len(spans))]
        groups: dict[int, _TrackGroup] = {}
        for i in range(len(spans)):
            self._resolve_group(i, spans, parents, root, groups)

        events: list[_Event] = []
        summary_args: dict[str, object] = {}
        step_span = spans[root] if spans[root].span_type == SPAN_TYPE_STEP else None
        if step_span is not None:
            summary_args = self._step_counters(step_span, spans, events)

        lanes: dict[int, int] = {}
        order = sorted(
            range(len(spans)),
            key=lambda i: (spans[i].start_ns, -spans[i].end_ns, depths[i]),
        )
        for i in order:
            s = spans[i]
            group = groups[i]
            parent = parents[i]
            preferred = (
                lanes.get(parent) if parent is not None and groups[parent] is group else None
            )
            if preferred is None and s.parent_id is not None and s.parent_id in self._recent:
                recent_group, recent_lane = self._recent[s.parent_id]
                preferred = recent_lane if recent_group is group else None
            start, end = _times(s)
            placed = self._place(group, start, end, preferred)
            if placed is None:
                self._log_dropped(s)
                continue
            lane, depth = placed
            lanes[i] = lane
            extra = summary_args if i == root else None
            self._slice_events(s, group.lanes[lane].uuid, depth, extra, events)
            if s.span_id:
                self._recent[s.span_id] = (group, lane)
                self._recent.move_to_end(s.span_id)
        while len(self._recent) > _MAX_RECENT_SPANS:
            self._recent.popitem(last=False)

        events.sort(key=lambda e: e[0])
        for event in events:
            self._write_event(event)

    # -- grouping --

    def _take_descendants(self, span: TraceSpan) -> list[TraceSpan]:
        held = self._pending.get(span.trace_id)
        if held is None or not span.span_id:
            return []
        taken: list[TraceSpan] = []
        stack = [span.span_id]
        while stack:
            for sid in held.children.pop(stack.pop(), ()):
                child = held.spans.pop(sid, None)
                if child is not None:
                    taken.append(child)
                    stack.append(sid)
        self._pending_count -= len(taken)
        if not held.spans:
            del self._pending[span.trace_id]
        return taken

    def _resolve_group(
        self,
        i: int,
        spans: Sequence[TraceSpan],
        parents: list[int | None],
        root: int,
        groups: dict[int, _TrackGroup],
    ) -> _TrackGroup:
        """Track group of span ``i``: its thread, else its parent's, else the step's.

        A step span without thread info goes on its scope's ``<scope> steps`` track.
        """
        chain: list[int] = []
        group: _TrackGroup | None = None
        j: int | None = i
        while j is not None and group is None:
            if j in groups:
                group = groups[j]
                break
            s = spans[j]
            chain.append(j)
            if s.thread_id is not None:
                group = self._thread_group(s.process, s.thread_id, s.thread_name)
                break
            if s.span_type == SPAN_TYPE_STEP:  # steps of a scope share a track of their own
                group = self._named_group(s)
                break
            nxt = parents[j]
            if nxt is None and s.parent_id is not None and s.parent_id in self._recent:
                group = self._recent[s.parent_id][0]
                break
            if nxt is None and j != root:
                nxt = root
            if nxt in chain:  # a cycle in bad data
                nxt = None
            if nxt is None:
                group = self._named_group(s)
            j = nxt
        assert group is not None
        for k in chain:
            groups[k] = group
        return group

    # -- tracks --

    def _uuid(self) -> int:
        return next(self._uuids) & _INT64_MAX

    def _process_uuid(self, process: ProcessInfo) -> int:
        uuid = self._processes.get(process)
        if uuid is None:
            uuid = self._uuid()
            self._processes[process] = uuid
            desc = pb.TrackDescriptor(uuid=uuid)
            desc.process.pid = _pid_of(process)
            desc.process.process_name = utf8_text(process.label)
            if process.run_id:
                desc.process.process_labels.append(utf8_text(f"run {process.run_id}"))
            self._write_descriptor(desc)
        return uuid

    def _thread_group(
        self, process: ProcessInfo, thread_id: int, thread_name: str | None
    ) -> _TrackGroup:
        key: tuple[object, ...] = ("thread", process, thread_id)
        group = self._groups.get(key)
        if group is None:
            proc_uuid = self._process_uuid(process)
            pid, tid = _pid_of(process), _tid32(thread_id)
            group = _TrackGroup(thread_name or f"thread {tid}", proc_uuid, (pid, tid))
            self._groups[key] = group
        return group

    def _named_group(self, span: TraceSpan) -> _TrackGroup:
        if span.span_type == SPAN_TYPE_STEP:
            name = f"{span.scope or 'default'} steps"
        elif span.span_type == SPAN_TYPE_COMPONENT:
            name = f"{span.scope or 'default'} components"
        else:
            name = "other spans"
        key: tuple[object, ...] = ("named", span.process, name)
        group = self._groups.get(key)
        if group is None:
            group = _TrackGroup(name, self._process_uuid(span.process), None)
            self._groups[key] = group
        return group

    def _place(
        self, group: _TrackGroup, start: int, end: int, preferred: int | None
    ) -> tuple[int, int] | None:
        lanes = group.lanes
        candidates: Iterable[int] = range(len(lanes))
        if preferred is not None:
            candidates = itertools.chain((preferred,), candidates)
        for k in candidates:
            depth = lanes[k].fit(start, end)
            if depth is not None:
                lanes[k].place(start, end, depth)
                return k, depth
        if len(lanes) >= _MAX_LANES:
            return None
        lane = _Lane(self._uuid())
        lanes.append(lane)
        desc = pb.TrackDescriptor(uuid=lane.uuid)
        k = len(lanes) - 1
        if k == 0:
            desc.parent_uuid = group.parent_uuid
            if group.thread is not None:
                desc.thread.pid, desc.thread.tid = group.thread
                desc.thread.thread_name = group.name
            else:
                desc.name = group.name
        else:
            desc.parent_uuid = lanes[0].uuid
            desc.name = f"{group.name} #{k}"
        self._write_descriptor(desc)
        lane.place(start, end, 0)
        return k, 0

    def _counter_uuid(self, process: ProcessInfo, scope: str, field_name: str) -> int:
        proc_uuid = self._process_uuid(process)
        key = (proc_uuid, scope, field_name)
        uuid = self._counters.get(key)
        if uuid is None:
            uuid = self._uuid()
            self._counters[key] = uuid
            desc = pb.TrackDescriptor(uuid=uuid, parent_uuid=proc_uuid)
            desc.name = utf8_text(f"perf/{scope}/{field_name}")
            desc.counter.unit_name = "s"
            self._write_descriptor(desc)
        return uuid

    # -- packets --

    def _write_header(self) -> None:
        packet = pb.TracePacket()
        packet.trusted_packet_sequence_id = self._seq
        packet.first_packet_on_sequence = True
        packet.sequence_flags = _STATE_CLEARED
        snapshot = packet.clock_snapshot
        snapshot.primary_trace_clock = _REALTIME
        snapshot.clocks.add(clock_id=_REALTIME, timestamp=time.time_ns())
        boot_clock = getattr(time, "CLOCK_BOOTTIME", None)
        if boot_clock is not None:
            snapshot.clocks.add(
                clock_id=pb.BUILTIN_CLOCK_BOOTTIME, timestamp=time.clock_gettime_ns(boot_clock)
            )
        else:
            snapshot.clocks.add(clock_id=pb.BUILTIN_CLOCK_MONOTONIC, timestamp=time.monotonic_ns())
        self._builder.write_packet(packet)

    def _write_descriptor(self, desc: pb.TrackDescriptor) -> None:
        packet = pb.TracePacket(trusted_packet_sequence_id=self._seq)
        packet.track_descriptor.CopyFrom(desc)
        self._builder.write_packet(packet)

    def _event_packet(self, ts: int, track_uuid: int, kind: int) -> pb.TracePacket:
        packet = pb.TracePacket(
            timestamp=ts,
            timestamp_clock_id=_REALTIME,
            trusted_packet_sequence_id=self._seq,
            sequence_flags=_NEEDS_STATE,
        )
        packet.track_event.type = kind
        packet.track_event.track_uuid = track_uuid
        return packet

    def _write_event(self, event: _Event) -> None:
        """Name the event (interning in file order, as readers expect) and write it."""
        _, packet, name, category = event
        ev = packet.track_event
        if name is not None:
            name = utf8_text(name)
        if category is not None:
            category = utf8_text(category)
        if name is not None:
            iid = self._intern(self._names, name, packet.interned_data.event_names)
            if iid is None:
                ev.name = name
            else:
                ev.name_iid = iid
        if category is not None:
            iid = self._intern(self._categories, category, packet.interned_data.event_categories)
            if iid is None:
                ev.categories.append(category)
            else:
                ev.category_iids.append(iid)
        self._builder.write_packet(packet)

    @staticmethod
    def _intern(table: dict[str, int], name: str, out: object) -> int | None:
        iid = table.get(name)
        if iid is None:
            if len(table) >= _MAX_INTERNED_NAMES:
                return None
            iid = len(table) + 1
            table[name] = iid
            out.add(iid=iid, name=name)  # type: ignore[attr-defined]  # untyped proto field
        return iid

    def _slice_events(
        self,
        span: TraceSpan,
        track_uuid: int,
        depth: int,
        extra_args: Mapping[str, object] | None,
        out: list[_Event],
    ) -> None:
        start, end = _times(span)
        serial = next(self._serial)
        category = span.span_type or "span"
        begin = self._event_packet(start, track_uuid, _BEGIN)
        args = begin.track_event.debug_annotations
        shown = _SHOWN_BY_LAYOUT.get(span.span_type, frozenset())
        for key, value in span.attributes.items():
            if key not in shown:
                _annotate(args.add(), key, value)
        for key, value in (extra_args or {}).items():
            _annotate(args.add(), key, value)
        for key, value in (
            ("trace_id", span.trace_id),
            ("span_id", span.span_id),
            ("error", span.error),
        ):
            if value:
                _annotate(args.add(), key, value)
        finish = self._event_packet(end, track_uuid, _END)
        # Order of events with equal timestamps on one track (the trace processor sorts by
        # timestamp, then file order): ends (innermost first), begins (outermost first),
        # zero-length slices, instants.
        if end > start:
            out.append(((start, 1, depth, serial, 0), begin, span.name, category))
            out.append(((end, 0, -depth, serial, 0), finish, None, None))
        else:
            out.append(((start, 2, depth, serial, 0), begin, span.name, category))
            out.append(((start, 2, depth, serial, 1), finish, None, None))
        self.slice_count += 1
        for event in span.events:
            ts = max(0, min(event.timestamp_ns, _INT64_MAX))
            packet = self._event_packet(ts, track_uuid, _INSTANT)
            ev_args = packet.track_event.debug_annotations
            for key, value in event.attributes.items():
                _annotate(ev_args.add(), key, value)
            out.append(((ts, 3, depth, serial, 0), packet, event.name, "event"))

    def _step_counters(
        self,
        step: TraceSpan,
        spans: Sequence[TraceSpan],
        out: list[_Event],
    ) -> dict[str, object]:
        """Busy / blocked / idle of the step: counter events, and the step's extra args.
        Read from the step's own accounting (an otel-tunix step span, or a spans JSONL step
        line, carries it in ``tunix.step.*``); only a step span made by other code, with
        none, gets it from its components here."""
        start, end = _times(step)
        values = _stored_accounting(step.attributes)
        if values is None:
            values = _accounted(step, spans, start, end)
        for field_name in _COUNTER_FIELDS:
            uuid = self._counter_uuid(step.process, step.scope or "default", field_name)
            packet = self._event_packet(start, uuid, _COUNTER)
            packet.track_event.double_counter_value = values[field_name]
            out.append(((start, 4, 0, next(self._serial), 0), packet, None, None))
        return dict(values)

    def _log_dropped(self, span: TraceSpan) -> None:
        if not self._dropped_logged:
            self._dropped_logged = True
            logger.warning(
                "Perfetto: span %r dropped: more than %d overlapping lanes on one track",
                span.name,
                _MAX_LANES,
            )


# --- small helpers -----------------------------------------------------------------------


def _times(span: TraceSpan) -> tuple[int, int]:
    start = max(0, min(span.start_ns, _INT64_MAX))
    return start, max(start, min(span.end_ns, _INT64_MAX))


def _stored_accounting(attrs: Mapping[str, object]) -> dict[str, float] | None:
    """A step span's own accounting (``tunix.step.*``) by the counters' fields; ``None``
    when it carries none."""
    out: dict[str, float] = {}
    for field_name, key in zip(_ACCOUNTING_FIELDS, _ACCOUNTING_KEYS, strict=True):
        value = attrs.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool):
            return None
        out[field_name] = float(value)
    return out


def _accounted(
    step: TraceSpan, spans: Sequence[TraceSpan], start: int, end: int
) -> dict[str, float]:
    """The accounting of a step span that carries none (made by other code), from its
    component spans."""
    infos = [
        SpanInfo(
            name=s.name,
            kind=KIND_BLOCKED if s.time_kind == KIND_BLOCKED else KIND_BUSY,
            start_ns=s.start_ns,
            end_ns=s.end_ns,
            span_id=s.span_id,
            parent=s.parent_id,
            # another thread's work past the step's edge: beside the breakdown
            attributes=_BACKGROUND if s.attributes.get(BACKGROUND) is True else {},
        )
        for s in spans
        if s.span_type == SPAN_TYPE_COMPONENT
    ]
    summary = account_step(step.scope or "default", step.step or 0, start, end, infos)
    return {f: float(getattr(summary, f)) for f in _ACCOUNTING_FIELDS}


def _depth(i: int, parents: list[int | None]) -> int:
    depth = 0
    j = parents[i]
    while j is not None and depth < len(parents):
        depth += 1
        j = parents[j]
    return depth


def _pid_of(process: ProcessInfo) -> int:
    if process.pid is not None and 0 < process.pid < 2**31:
        return process.pid
    key = f"{process.service_name}\0{process.host_name}\0{process.rank}\0{process.pid}"
    return (zlib.crc32(key.encode()) & 0x3FFFFF) + 1


def _tid32(thread_id: int) -> int:
    """A positive 32-bit tid for ``thread.id`` (Python thread idents are 64-bit)."""
    if 0 < thread_id < 2**31:
        return thread_id
    return (zlib.crc32((thread_id & (2**64 - 1)).to_bytes(8, "little")) & 0x7FFFFFFF) or 1


_SHOWN_BY_LAYOUT: dict[str | None, frozenset[str]] = {
    # Attributes the layout already shows (slice name, track, step slice above): repeating
    # them as arguments on every component slice doubled the exporter's cost.
    SPAN_TYPE_COMPONENT: frozenset({SPAN_TYPE, COMPONENT, SCOPE, STEP, THREAD_ID, THREAD_NAME}),
    SPAN_TYPE_STEP: frozenset({SPAN_TYPE, THREAD_ID, THREAD_NAME}),
}


def _annotate(ann: pb.DebugAnnotation, name: str | None, value: object) -> None:
    if name is not None:
        ann.name = utf8_text(name)
    if isinstance(value, bool):
        ann.bool_value = value
    elif isinstance(value, int) and _INT64_MIN <= value <= _INT64_MAX:
        ann.int_value = value
    elif isinstance(value, float):
        ann.double_value = value
    elif isinstance(value, str):
        ann.string_value = utf8_text(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _annotate(ann.array_values.add(), None, item)
    else:
        ann.string_value = utf8_text(str(value))
