"""OTLP protobuf bytes straight from finished steps, without SDK span objects.

What it replaces: the SDK's OTLP exporters take ``ReadableSpan`` objects and build one
protobuf message object per span, per attribute and per value (``encode_spans``), then
serialize them. A run's spans repeat almost everything: the resource, the instrumentation
scope, each component's name, kind, scope, thread and attribute keys. Here the wire bytes of
what repeats are made once and kept, and a component span costs two ``struct`` packs (ids,
times), its two accounted times and a join: about 1 us instead of ~20 us through the SDK
(``bench/bench_export.py``; the options measured are in docs/benchmarks.md).

The bytes are the SDK encoder's, byte for byte, for the same spans (same field order,
attribute order and presence rules; ``tests/exporters/test_otlp_encoding.py`` compares them).
A step this module does not encode itself (one with an error, events, a component's own
attributes or device end, a job step span) is encoded by the SDK encoder from its SDK spans,
and its bytes spliced in; so are spans from other code (``on_end``), each batch of them as
ResourceSpans of their own. Protobuf allows that: a repeated field is its entries, each a
tag and a length, so serialized requests concatenate.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext

from otel_tunix.accounting.categories import declared
from otel_tunix.pipeline.span_builder import FinishedStep
from otel_tunix.settings import attributes as attr

__all__ = ["StepEncoder", "encode_any", "encode_key_value"]

_pack_ids = struct.Struct(">QBBQ").pack  # span id, parent id (big-endian, as OTLP's bytes)
_pack_times = struct.Struct("<QBQ").pack  # start, end (fixed64, little-endian)
_pack_double = struct.Struct("<d").pack
_pack_trace_id = struct.Struct(">BBQQ").pack

_INTERNAL = b"\x30\x01"  # kind = SPAN_KIND_INTERNAL
# status = Status() (the SDK sets an empty one for UNSET), flags = HAS_IS_REMOTE (fixed32)
_STATUS_AND_FLAGS = b"\x7a\x00" + b"\x85\x01" + struct.pack("<I", 0x100)


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # int64: two's complement, ten bytes
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [_varint(n) for n in range(1 << 14)]
"""Varints of the lengths of most messages here (spans, attributes, names)."""


def _len_field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte, the length, the payload."""
    n = len(payload)
    return b"%c%b%b" % (tag, _SMALL[n] if n < 16384 else _varint(n), payload)


def encode_any(value: Any) -> bytes:
    """An ``AnyValue`` message, as the SDK's ``_encode_value`` makes it."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _len_field(0x0A, value.encode())
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if isinstance(value, bytes):
        return _len_field(0x3A, value)
    if isinstance(value, Sequence):
        return _len_field(0x2A, b"".join(_len_field(0x0A, encode_any(v)) for v in value))
    if isinstance(value, Mapping):
        kvs = b"".join(_len_field(0x0A, encode_key_value(str(k), v)) for k, v in value.items())
        return _len_field(0x32, kvs)
    raise TypeError(f"invalid attribute value type {type(value).__name__}: {value!r}")


def encode_key_value(key: str, value: Any) -> bytes:
    """A ``KeyValue`` message (without its own tag)."""
    return (_len_field(0x0A, key.encode()) if key else b"") + _len_field(0x12, encode_any(value))


def _attribute(key: str, value: Any) -> bytes:
    """A span's attribute: field 9 of ``Span``, tag and length included."""
    return _len_field(0x4A, encode_key_value(key, value))


class _Attributes:
    """Encoded attributes by (key, value), for values that repeat (strings, ints, bools);
    bounded, since some values change every step."""

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[tuple[str, type, Any], bytes] = {}

    def encode(self, attributes: Mapping[str, Any]) -> bytes:
        cache = self._cache
        out = []
        for key, value in attributes.items():
            if isinstance(value, float) or not isinstance(value, (str, int, bool)):
                out.append(_attribute(key, value))
                continue
            ck = (key, type(value), value)  # True and 1 must not share an entry
            found = cache.get(ck)
            if found is None:
                if len(cache) >= _MAX_CACHED:
                    cache.clear()
                found = cache[ck] = _attribute(key, value)
            out.append(found)
        return b"".join(out)


def _plain(step: FinishedStep) -> bool:
    """Whether this module encodes the step itself: no error, no events, no links, no
    component with its own attributes, an error or a device end, and no job step span."""
    rec = step.record
    if rec.extras is not None or rec.error is not None or rec.events or rec.link is not None:
        return False
    if rec.links:
        return False
    rt = rec.runtime
    return not (rt.job_root and rec.parent_id and rt.job_ids is not None)


_TYPE_COMPONENT = _attribute(attr.SPAN_TYPE, attr.SPAN_TYPE_COMPONENT)
_BUSY_PREFIX = _len_field(0x0A, attr.COMPONENT_BUSY_TIME.encode())
_BLOCKED_PREFIX = _len_field(0x0A, attr.COMPONENT_BLOCKED_TIME.encode())
# A KeyValue of a double: key, then value = AnyValue{double_value} (9 bytes)


def _double_key(key: str) -> bytes:
    """A span attribute of a double up to its value: tag, length, key, the value's tags."""
    k = _len_field(0x0A, key.encode())
    return b"\x4a%c%b\x12\x09\x21" % (len(k) + 11, k)


_BUSY_KV = _double_key(attr.COMPONENT_BUSY_TIME)
_BLOCKED_KV = _double_key(attr.COMPONENT_BLOCKED_TIME)
_pack_accounted = struct.Struct(f"<d{len(_BLOCKED_KV)}sd").pack  # busy, blocked's key, blocked
_ACCOUNTED_SIZE = 8 + len(_BLOCKED_KV) + 8
_STEP_TIME_KEYS = tuple(
    map(
        _double_key,
        (attr.STEP_DURATION, attr.STEP_BUSY_TIME, attr.STEP_BLOCKED_TIME, attr.STEP_IDLE_TIME),
    )
)
_DURATION_KV, _BUSY_STEP_KV, _BLOCKED_STEP_KV, _IDLE_KV = _STEP_TIME_KEYS
_pack_step_times = struct.Struct("<" + "".join(f"{len(k)}sd" for k in _STEP_TIME_KEYS)).pack
_SPAN_PREFIX = [b"\x12" + v for v in _SMALL]
"""A ``Span`` field's tag and length, by length."""


class StepEncoder:
    """Encodes batches of finished steps (and other code's spans) into the bytes of one
    ``ExportTraceServiceRequest``.

    One per exporter; used from its export thread only (its caches are not locked).
    """

    def __init__(self) -> None:
        self._frame_of: tuple[Resource, InstrumentationScope] | None = None
        self._frame_bytes = (b"", b"", b"", b"")
        self._components: dict[
            tuple[str, bool, Any, str, str | None], tuple[bytes, bytes, int]
        ] = {}
        self._steps: dict[tuple[str, Any], tuple[bytes, tuple[bytes, bytes]]] = {}
        self._attributes = _Attributes()

    def encode(
        self,
        items: Iterable[ReadableSpan | FinishedStep],
        sdk_spans: Callable[[FinishedStep], Sequence[ReadableSpan]],
    ) -> bytes:
        """The request for these items, in order: otel-tunix's steps under their resource
        and scope, other spans after them, grouped as the SDK groups them.

        ``sdk_spans`` gives the SDK spans of a step this module does not encode itself.
        """
        groups: dict[tuple[int, int], list[bytes]] = {}
        frames: dict[tuple[int, int], tuple[Resource, InstrumentationScope]] = {}
        others: list[ReadableSpan] = []
        for i, item in enumerate(items, 1):
            if not i % _STEPS_PER_HOLD:
                # Let a thread waiting for the GIL (the training loop) have it: the export
                # thread then holds it for tens of microseconds at a stretch, not a batch's
                # milliseconds (up to the interpreter's 5 ms switch interval).
                time.sleep(0)
            if isinstance(item, ReadableSpan):
                others.append(item)
                continue
            res, scope = item.resource, item.instrumentation_scope
            key = (id(res), id(scope))
            chunks = groups.get(key)
            if chunks is None:
                chunks = groups[key] = []
                frames[key] = (res, scope)
            if _plain(item):
                self._step(item, chunks)
            else:
                chunks.extend(_sdk_span_bytes(sdk_spans(item)))
        out = []
        for key, chunks in groups.items():
            res_head, scope_head, scope_tail, res_tail = self._frame(*frames[key])
            scope_spans = _len_field(0x12, b"".join((scope_head, *chunks, scope_tail)))
            out.append(_len_field(0x0A, b"".join((res_head, scope_spans, res_tail))))
        if others:
            out.append(encode_spans(others).SerializeToString())
        return b"".join(out)

    def _frame(
        self, res: Resource, scope: InstrumentationScope
    ) -> tuple[bytes, bytes, bytes, bytes]:
        """The bytes around a run's spans: ResourceSpans' resource, ScopeSpans' scope, their
        schema URLs; made with the SDK encoder, once per resource and scope (a run has one
        of each: only the last is kept)."""
        held = self._frame_of
        if held is None or held[0] is not res or held[1] is not scope:
            request = encode_spans([_frame_span(res, scope)])
            rs = request.resource_spans[0]
            ss = rs.scope_spans[0]
            self._frame_of = (res, scope)
            self._frame_bytes = (
                _len_field(0x0A, rs.resource.SerializeToString()),
                _len_field(0x0A, ss.scope.SerializeToString()),
                _len_field(0x1A, ss.schema_url.encode()) if ss.schema_url else b"",
                _len_field(0x1A, rs.schema_url.encode()) if rs.schema_url else b"",
            )
        return self._frame_bytes

    def _step(self, step: FinishedStep, out: list[bytes]) -> None:
        """Appends the spans of a step (``Span`` fields of ``ScopeSpans``, tags and lengths
        included, as several chunks each): its components in start order, then the step
        span.

        A component span is nine chunks, four of them packed (ids, times, the two accounted
        times) and the others made once per step or per component name; the span's length
        is the name's fixed length plus the step number's."""
        rec = step.record
        trace_id = rec.trace_id
        tidf = _pack_trace_id(0x0A, 16, trace_id >> 64, trace_id & _LOW64) + b"\x12\x08"
        number, scope = step.number, step.scope
        step_attr = _attribute(attr.STEP, number)
        type_step = _TYPE_COMPONENT + step_attr
        steplen = len(step_attr)
        off = step.offset
        times = step.summary.component_times
        step_thread = rec.thread
        cache = self._components
        lp = _SPAN_PREFIX
        add = out.extend
        for (name, blocked, sid, parent_id, start, thread), end in zip(
            step.components, step.ends, strict=True
        ):
            ck = (name, blocked, thread or step_thread, scope, declared(name))
            head = cache.get(ck)
            if head is None:
                head = self._component(ck, step.thread_info)
            t = times.get(name)
            if t is None or t[2] > 1:  # the uncommon shapes: one body, then its length
                out.append(
                    self._component_span(
                        tidf, sid, parent_id, head, start + off, end + off, type_step, t
                    )
                )
                continue
            add(
                (
                    lp[head[2] + steplen],
                    tidf,
                    _pack_ids(sid, 0x22, 8, parent_id),
                    head[0],
                    _pack_times(start + off, 0x41, end + off),
                    type_step,
                    head[1],
                    _pack_accounted(t[0], _BLOCKED_KV, t[1]),
                    _STATUS_AND_FLAGS,
                )
            )
        ids = _pack_ids(rec.span_id, 0x22, 8, rec.parent_id)
        if not rec.parent_id:
            ids = ids[:8]  # a root: no parent id
        s = step.summary
        if rec.attributes:  # the application's attributes come first: encoded one by one
            step_attrs = {
                **step.attributes,
                attr.SPAN_TYPE: attr.SPAN_TYPE_STEP,
                attr.STEP: number,
                attr.SCOPE: scope,
                attr.STEP_DURATION: s.step_time_sec,
                attr.STEP_BUSY_TIME: s.busy_time_sec,
                attr.STEP_BLOCKED_TIME: s.blocked_time_sec,
                attr.STEP_IDLE_TIME: s.idle_time_sec,
            }
            attrs = self._attributes.encode(step_attrs)
            name_kind = _len_field(0x2A, f"{scope}_step".encode()) + _INTERNAL + b"\x39"
        else:  # thread id and name, type, step, scope, four times
            name_kind, step_head = self._step_head(scope, step_thread, step.thread_info)
            attrs = b"%b%b%b%b" % (
                step_head[0],
                step_attr,
                step_head[1],
                _pack_step_times(
                    _DURATION_KV,
                    s.step_time_sec,
                    _BUSY_STEP_KV,
                    s.busy_time_sec,
                    _BLOCKED_STEP_KV,
                    s.blocked_time_sec,
                    _IDLE_KV,
                    s.idle_time_sec,
                ),
            )
        body = b"".join(
            (
                tidf,
                ids,
                name_kind,
                _pack_times(step.start_ns, 0x41, step.end_ns),
                attrs,
                _STATUS_AND_FLAGS,
            )
        )
        out.append(_len_field(0x12, body))

    @staticmethod
    def _component_span(
        tidf: bytes,
        sid: int,
        parent_id: int,
        head: tuple[bytes, bytes, int],
        start: int,
        end: int,
        type_step: bytes,
        t: tuple[float, float, int] | None,
    ) -> bytes:
        """A component span whose name has no accounted times, or several components."""
        if t is None:
            accounted = head[1][: -len(_BUSY_KV)]  # the tail without the busy time's key
        else:
            busy, blocked_s, count = t
            accounted = b"%b%b%b" % (
                head[1],
                _pack_accounted(busy, _BLOCKED_KV, blocked_s),
                _attribute(attr.COMPONENT_COUNT, count),
            )
        body = b"".join(
            (
                tidf,
                _pack_ids(sid, 0x22, 8, parent_id),
                head[0],
                _pack_times(start, 0x41, end),
                type_step,
                accounted,
                _STATUS_AND_FLAGS,
            )
        )
        return _len_field(0x12, body)

    def _component(
        self,
        key: tuple[str, bool, Any, str, str | None],
        thread_of: Callable[[Any], tuple[int, str]],
    ) -> tuple[bytes, bytes, int]:
        """The repeated parts of a component span: its name and kind (and the start time's
        tag); its attributes after the step number, up to the busy time's value (its
        declared goodput category among them); and the length of the span without the step
        number's attribute."""
        name, blocked, thread, scope, category = key
        tid, tname = thread_of(thread)
        tail = b"".join(
            _attribute(k, v)
            for k, v in (
                (attr.SCOPE, scope),
                (attr.COMPONENT, name),
                (attr.TIME_KIND, attr.KIND_BLOCKED if blocked else attr.KIND_BUSY),
                (attr.THREAD_ID, tid),
                (attr.THREAD_NAME, tname),
                *(((attr.GOODPUT_CATEGORY, category),) if category is not None else ()),
            )
        )
        name_kind = _len_field(0x2A, name.encode()) + _INTERNAL + b"\x39"
        tail += _BUSY_KV
        fixed = (
            18
            + 2
            + 8
            + 2
            + 8
            + len(name_kind)
            + 8
            + 1
            + 8
            + len(_TYPE_COMPONENT)
            + len(tail)
            + _ACCOUNTED_SIZE
            + len(_STATUS_AND_FLAGS)
        )
        head = (name_kind, tail, fixed)
        if len(self._components) >= _MAX_CACHED:  # names made up per step
            self._components.clear()
        self._components[key] = head
        return head

    def _step_head(
        self, scope: str, thread: Any, thread_of: Callable[[Any], tuple[int, str]]
    ) -> tuple[bytes, tuple[bytes, bytes]]:
        """A step span's name and kind, and its attributes before and after the step
        number, for a step without the application's attributes."""
        key = (scope, thread)
        found = self._steps.get(key)
        if found is None:
            tid, tname = thread_of(thread)
            found = (
                _len_field(0x2A, f"{scope}_step".encode()) + _INTERNAL + b"\x39",
                (
                    _attribute(attr.THREAD_ID, tid)
                    + _attribute(attr.THREAD_NAME, tname)
                    + _attribute(attr.SPAN_TYPE, attr.SPAN_TYPE_STEP),
                    _attribute(attr.SCOPE, scope),
                ),
            )
            if len(self._steps) >= _MAX_CACHED:
                self._steps.clear()
            self._steps[key] = found
        return found


def _sdk_span_bytes(spans: Sequence[ReadableSpan]) -> list[bytes]:
    """These spans (one run's resource and scope) as ``Span`` fields of ``ScopeSpans``, by
    the SDK encoder."""
    return [
        _len_field(0x12, span.SerializeToString())
        for rs in encode_spans(spans).resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]


def _frame_span(res: Resource, scope: InstrumentationScope) -> ReadableSpan:
    return ReadableSpan(
        "frame", SpanContext(1, 1, False), resource=res, instrumentation_scope=scope
    )


_LOW64 = (1 << 64) - 1
_STEPS_PER_HOLD = 16
_MAX_CACHED = 4096
