"""From a finished step record to the worker's consumers.

Runs on the pipeline's worker thread. Each batch of steps goes, as :class:`FinishedStep`
objects (numbers now, spans on demand), to the run's consumers
(:class:`~otel_tunix.pipeline.step_sinks.Consumers`). The SDK ``ReadableSpan`` objects are
built here when asked for, with the ids that were handed out on the hot path (so foreign
spans parented to them line up), the run's shared ``Resource`` and otel-tunix's
instrumentation scope. Component spans come first, in start order, then the step span:
processors and exporters can rely on that order.
"""

from __future__ import annotations

import logging
import operator
import threading
import time
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status

from otel_tunix.accounting.step_time import account_components
from otel_tunix.model import record as rs
from otel_tunix.model.steps import Interval, SpanInfo, link_json
from otel_tunix.pipeline.background import BackgroundLedger, BackgroundSpan, Carried
from otel_tunix.pipeline.cleaning import NameCleaner
from otel_tunix.pipeline.outside import outside_spans
from otel_tunix.pipeline.span_errors import span_error as _error
from otel_tunix.pipeline.step_sinks import Consumers
from otel_tunix.pipeline.step_sinks import StepSpanProcessor as StepSpanProcessor  # its old home
from otel_tunix.recording.hot_path import StepRecord, now_ns
from otel_tunix.recording.records import ComponentExtras, ComponentStart, step_extras
from otel_tunix.settings import attributes as attr
from otel_tunix.support.errors import report_internal_error
from otel_tunix.support.shortcuts import new_span_context, sdk_span, span_maker

_logger = logging.getLogger(__name__)


def epoch_offset_ns() -> int:
    """Add this to a ``perf_counter_ns()`` reading to get Unix epoch nanoseconds."""
    return time.time_ns() - time.perf_counter_ns()


def _step_events(rec: StepRecord, step_end: int, off: int) -> tuple[Event, ...]:
    """Events added to the step (alerts). One raised before the step started (queued while
    no sampled step was open) is placed at the step's start and keeps its real time in
    ``tunix.event.time_unix_nano``."""
    out = []
    for name, attrs, t in rec.events or ():
        at = min(max(t, rec.start_ns), step_end)
        if at != t:
            attrs = {**attrs, "tunix.event.time_unix_nano": t + off}
        out.append(Event(name, attrs, timestamp=at + off))
    return tuple(out)


class FinishedStep:
    """One processed step, as the span builder hands it to the run's consumers
    (:class:`~otel_tunix.pipeline.step_sinks.StepSink`).

    The numbers are ready; the SDK spans and the :class:`~otel_tunix.model.steps.SpanInfo`
    list are built on first use (:meth:`spans`, :meth:`span_infos`), so a run that exports
    no spans builds none, and an exporter builds them as it reads them.

    Attributes:
        record: The step as recorded on the hot path.
        components: Its components as recorded, in start order:
            :data:`otel_tunix.model.record.ComponentStart` tuples ``(name, blocked,
            span_id, parent_id, start, thread, category)`` (start in ``perf_counter_ns``;
            ``thread`` is ``None`` for the step's own thread).
        ends: Each component's end, in the same order (``perf_counter_ns``: the device end
            if it has one, else the host end; never before its start).
        summary: What the accounting derived (busy / blocked / idle, per component).
        start_ns: Start of the step (Unix epoch ns).
        end_ns: The end of the step's host window (its own end).
        attributes: The step span's attributes besides type, scope and step number.
        scope: The step's scope.
        number: The step number.
        trace_id: The step's trace id.
        span_count: Components plus the step span.
    """

    __slots__ = (
        "_builder",
        "_entries",
        "_exports",
        "_spans",
        "attributes",
        "background",
        "background_ids",
        "components",
        "end_ns",
        "ends",
        "number",
        "record",
        "scope",
        "span_count",
        "start_ns",
        "summary",
        "trace_id",
    )

    def __init__(self, builder: SpanBuilder, rec: StepRecord) -> None:
        builder.cleaner.step(rec)  # names and values every exporter takes (cleaning.py)
        off = builder.offset
        self._builder = builder
        self._spans: list[ReadableSpan] | None = None
        self._exports = 0  # exporters that queued this step and have not read its spans
        self.record = rec
        self.scope = rec.scope
        self.number = rec.number
        self.trace_id = rec.trace_id
        ledger = builder.background
        # Asked only when another thread recorded into the step or background work is
        # carried or loose (rare): a step of the training thread alone costs three reads.
        rt = ledger.runtime = rec.runtime  # (whose loose components a close takes)
        bg = ledger.step(rec) if rec.foreign or ledger.carried or rt.loose else None
        comps = rec.spans
        # In place: usually in order already, and one list less to collect. The sort holds
        # the GIL throughout (a C key function), so a late append cannot interleave.
        comps.sort(key=_start_ns)
        if bg is not None and bg.open_ids:  # still running elsewhere: their spans go later
            comps = [c for c in comps if c[2] not in bg.open_ids]
        self.components: list[ComponentStart] = comps
        self.background_ids = bg.keys if bg is not None and bg.keys else None
        """Span ids of the components that are background work (``None``: none)."""
        self.background = bg.intervals if bg is not None else None
        """Every background interval overlapping the step (other threads' work open at an
        edge of its window, still running ones up to its end), ``(name, blocked, start,
        end, count)`` in ``perf_counter_ns`` (``None``: none, the usual case)."""
        if self.background_ids is not None:  # their spans say so, as their other extras
            step_extras(rec).background = self.background_ids
        ex = rec.extras
        tid, tname = builder.thread(rec.thread)
        self.attributes = {**rec.attributes, _THREAD_ID: tid, _THREAD_NAME: tname}
        # The accounting reads the components once, in order, and leaves each one's end
        # (device end, else host end; never before its start) in self.ends for the spans.
        self.ends: list[int] = []
        entries = self._entries = _SpanEntries(builder, rec, comps, self.ends)
        self.summary = account_components(
            rec.scope,
            rec.number,
            rec.start_ns,
            rec.end_ns,
            comps,
            rec.ends,
            device_ends=ex.device_ends if ex is not None and ex.device_ends else None,
            offset=off,
            ends_out=self.ends,
            spans=entries,  # not this step's methods: the summary would refer back to the
            # step, a cycle only the collector frees (and two objects less a step to walk)
            trace_id=rec.trace_id,
            attributes=self.attributes,
            span_id=rec.span_id,
            background=bg.intervals if bg is not None else None,
            background_keys=self.background_ids,
        )
        if ex is not None and ex.device_ends and ex.attributes:
            self.summary.device_blocked_time_sec = _device_blocked_sec(comps, ex)
        self.summary.unsampled_sec = rec.unsampled
        if rec.error is not None:  # the step line says so too (summary, Perfetto, goodput)
            self.summary.error = rs.exception_text(rec.error)
        if rec.links:
            self.summary.links = [link_json(link) for link in rec.links]
        self.start_ns = rec.start_ns + off
        self.end_ns = self.summary.end_ns
        self.span_count = len(comps) + 1

    @property
    def intervals(self) -> list[Interval]:
        """``(name, blocked, start, end)`` per component, in start order, Unix epoch ns."""
        off = self._builder.offset
        return [
            (name, blocked, start + off, end + off)
            for (name, blocked, _, _, start, _, _), end in zip(
                self.components, self.ends, strict=True
            )
        ]

    @property
    def offset(self) -> int:
        """Add this to the recorded clock readings (``components``, ``ends``) to get Unix
        epoch nanoseconds."""
        return self._builder.offset

    @property
    def resource(self) -> Resource:
        """The run's resource (every span of the step has it)."""
        return self._builder._resource

    @property
    def instrumentation_scope(self) -> InstrumentationScope:
        """otel-tunix's instrumentation scope (every span of the step has it)."""
        return self._builder._scope

    def thread_info(self, thread: Any) -> tuple[int, str]:
        """(native id, name) of a thread recorded with the step or one of its components."""
        return self._builder.thread(thread)

    def spans(self) -> list[ReadableSpan]:
        """The SDK spans: the components in start order, then the step span (built on
        first use and kept)."""
        spans = self._spans
        if spans is None:
            spans = self._spans = self._builder.build_spans(self)
        return spans

    def queued_for_export(self, queued: bool = True) -> None:
        """An export processor queued this step (it will read :meth:`export_spans` once), or,
        with ``queued=False``, took that back (its queue was full)."""
        with _exports_lock:
            self._exports += 1 if queued else -1

    def export_spans(self) -> list[ReadableSpan]:
        """The SDK spans for one export processor that queued the step: made now and, unless
        another exporter still has to read them, not kept (spans that live only while the
        exporter reads them never reach the garbage collector's older generations; a batch
        of hundreds held at once did, a third of the export path's cost)."""
        with _exports_lock:
            self._exports -= 1
            keep = self._exports > 0
        spans = self._spans
        if spans is None:
            spans = self._builder.build_spans(self)
            if keep:
                self._spans = spans
        return spans

    def span_infos(self) -> list[SpanInfo]:
        """The components as :class:`~otel_tunix.model.steps.SpanInfo` (export functions)."""
        return self._entries()

    def span_json(self) -> list[dict[str, object]]:
        """The components as the ``spans`` entries of the spans JSONL file (what
        ``SpanInfo.to_json()`` gives), made straight from the records."""
        return self._entries.span_json()


class _SpanEntries:
    """A step's components as span entries (JSON dicts, then ``SpanInfo``), made on first
    use and kept: shared by a :class:`FinishedStep` and its ``StepSummary`` (whose span
    factory it is: called for the ``SpanInfo`` list, ``span_json()`` for the JSON dicts). Apart
    from the step so that the summary does not refer back to it: the step, its summary and
    everything they hold are then freed as soon as the export is done, by reference counts,
    not left to the garbage collector as a reference cycle."""

    __slots__ = ("_builder", "_infos", "_json", "components", "ends", "record")

    def __init__(
        self, builder: SpanBuilder, rec: StepRecord, comps: list[ComponentStart], ends: list[int]
    ) -> None:
        self._builder = builder
        self.record = rec
        self.components = comps
        self.ends = ends
        self._infos: list[SpanInfo] | None = None
        self._json: list[dict[str, object]] | None = None

    def __call__(self) -> list[SpanInfo]:
        """The components as :class:`~otel_tunix.model.steps.SpanInfo` (the summary's span
        factory)."""
        infos = self._infos
        if infos is None:
            infos = self._infos = [SpanInfo(**d) for d in self.span_json()]  # type: ignore[arg-type]
        return infos

    def span_json(self) -> list[dict[str, object]]:
        dicts = self._json
        if dicts is None:
            dicts = self._json = self._builder.span_json(self)
        return dicts


class SpanBuilder:
    """Callable given to the pipeline: a batch of step records in, :class:`FinishedStep`
    objects (and background and outside spans) out to the run's consumers, in order, each
    hook once per batch (:class:`~otel_tunix.pipeline.step_sinks.Consumers`: a consumer that
    raises is reported once and does not stop the others).
    """

    def __init__(
        self,
        consumers: Consumers,
        resource: Resource,
        scope: InstrumentationScope,
        *,
        offset: int | None = None,
    ) -> None:
        """``offset``: added to the recorded clock readings to make span times (default:
        :func:`epoch_offset_ns`, from ``perf_counter_ns`` to Unix epoch ns)."""
        self.consumers = consumers
        """The run's consumers, in order (the worker's list)."""
        self._resource = resource
        self._scope = scope
        self._make = span_maker(resource, scope)
        self.offset = epoch_offset_ns() if offset is None else offset
        self._threads: dict[Any, tuple[int, str]] = {}
        self._attributes: dict[
            str,
            tuple[bool, Any, str, int, dict[str, Any], tuple[float, float, int] | None, str | None],
        ] = {}
        """Per component name: (blocked, thread, scope, step, the attributes of its spans,
        the name's times in that step, its recorded category) as last made (never changed
        once made: spans and other threads may hold them)."""
        self.cleaner = NameCleaner()
        self.background = BackgroundLedger()
        """Other threads' work that outlived its step (see
        :mod:`otel_tunix.pipeline.background`)."""
        self.first_link: Link | None = None
        """A link for the first step span built (run setup's: a later attempt of a job
        links the previous one, :mod:`otel_tunix.run.job`)."""

    def __call__(self, records: list[StepRecord]) -> int:
        """Hand these steps (and outside components' records, in their order) to the
        consumers; returns how many could not be read."""
        steps: list[FinishedStep] = []
        read = 0
        if self.first_link is not None:  # the first step span's (one linked keeps its own)
            first = next((r for r in records if type(r) is StepRecord), None)
            if first is not None and first.link is None:
                first.link, self.first_link = self.first_link, None
        for rec in records:
            try:
                if type(rec) is StepRecord:
                    steps.append(FinishedStep(self, rec))
                else:  # an outside component's record: the steps before it go first
                    self.cleaner.step(rec)
                    spans = outside_spans(self, rec)
                    if steps:
                        self.consumers.steps(steps)
                        steps = []
                    self.consumers.outside(spans)
                read += 1
            except Exception:
                report_internal_error("reading a recorded step")
        if steps:
            self.consumers.steps(steps)
        if self.background:
            self._hand_on(self.background.take_due())
        return len(records) - read

    def finish(self, force: bool) -> None:
        """Hand on the spans of background work that no later step can overlap any more
        (a flush), or of all of it (``force``: the run closes; what still runs ends now,
        marked incomplete)."""
        try:
            self._hand_on(self.background.take_finished(now_ns(), force))
        except Exception:
            report_internal_error("handing on background spans")

    def _hand_on(self, due: list[tuple[Carried, int, bool]]) -> None:
        """Background spans to every consumer."""
        if due:
            self.consumers.background(
                [BackgroundSpan(self, c, end, incomplete) for c, end, incomplete in due]
            )

    def background_span(self, c: Carried, end: int, attrs: dict[str, object]) -> ReadableSpan:
        """The SDK span of a background component handed on after its step."""
        home = c.home
        off = self.offset
        parent = new_span_context(c.trace, c.parent) if c.parent else None
        standard = self._component_attributes(
            c.name, c.blocked, c.thread or home.thread, home.scope, home.number, c.category, None
        )
        attributes = {**attrs, **standard}
        ex = home.extras
        error = ex.errors.get(c.sid) if ex is not None else None
        status, events = _error(error, end + off)
        return self.full_span(
            c.name,
            new_span_context(c.trace, c.sid),
            parent,
            attributes,
            events,
            status,
            c.start + off,
            end + off,
        )

    def thread(self, thread: Any) -> tuple[int, str]:
        """(native id, name) of a recorded thread, cached: the lookups cost per span."""
        found = self._threads.get(thread)
        if found is None:
            if len(self._threads) > _MAX_CACHED:  # threads come and go: keep it bounded
                self._threads.clear()
            found = self._threads[thread] = (thread.native_id or thread.ident or 0, thread.name)
        return found

    def span_json(self, step: FinishedStep | _SpanEntries) -> list[dict[str, object]]:
        """The components of a step as the ``spans`` entries of the spans JSONL file (the
        fields of :class:`SpanInfo`, which is made from them when asked for)."""
        out: list[dict[str, object]] = []
        rec = step.record
        ex = rec.extras
        off = self.offset
        comps = zip(step.components, step.ends, strict=True)
        for (name, blocked, sid, parent_id, start_pc, thread, category), end_pc in comps:
            tid, tname = self.thread(thread or rec.thread)
            error = extra = None
            if ex is not None:
                error = ex.errors.get(sid)
                extra = _extra_attributes(ex, rec, sid, start_pc, own=False)
            out.append(
                rs.component_json(
                    name,
                    blocked,
                    start_pc + off,
                    end_pc + off,
                    tname,
                    tid,
                    sid,
                    parent_id,
                    error,
                    extra,
                    category,
                )
            )
        return out

    def build_spans(self, step: FinishedStep) -> list[ReadableSpan]:
        """The SDK spans of a step: its components in start order, then the step span."""
        rec = step.record
        off = self.offset
        trace_id = rec.trace_id
        step_ctx = rec.span_context()
        step_sid, step_thread = rec.span_id, rec.thread
        # A parent starts before its children, so in start order its span is made first. The
        # contexts by span id are kept only from the first component whose parent is not the
        # step (a step of top-level components, the usual one, needs none).
        contexts: dict[int, SpanContext] | None = None
        number, scope = rec.number, rec.scope
        out: list[ReadableSpan] = []
        make, new_ctx = self._make, new_span_context
        ex = rec.extras
        comps = zip(step.components, step.ends, strict=True)
        times = step.summary.component_times
        for (name, blocked, sid, parent_id, start_pc, thread, category), end in comps:
            ctx = new_ctx(trace_id, sid)
            if parent_id == step_sid:
                parent_ctx = step_ctx
            else:  # a component, else a foreign span (or a parent recorded after the fact)
                if contexts is None:
                    contexts = {s.context.span_id: s.context for s in out}
                parent_ctx = contexts.get(parent_id) or new_ctx(trace_id, parent_id)
            if contexts is not None:
                contexts[sid] = ctx
            if thread is None:
                thread = step_thread
            extra = _extra_attributes(ex, rec, sid, start_pc) if ex is not None else None
            attrs = self._component_attributes(
                name, blocked, thread, scope, number, category, extra, times.get(name)
            )
            if ex is not None and sid in ex.errors:
                status, events = _error(ex.errors[sid], rec.ends.get(sid, start_pc) + off)
                out.append(
                    self.full_span(
                        name, ctx, parent_ctx, attrs, events, status, start_pc + off, end + off
                    )
                )
                continue
            out.append(make(name, ctx, parent_ctx, attrs, start_pc + off, end + off))
        parent = new_ctx(trace_id, rec.parent_id) if rec.parent_id else None
        step_attrs = rs.step_attributes(step.attributes, scope, number, step.summary)
        name = f"{scope}_step"
        if rs.needs_full_step_span(rec):
            status, events = _error(rec.error, rec.end_ns + off)
            if rec.events:
                events += _step_events(rec, step.end_ns - off, off)
            links: tuple[Link, ...] = (rec.link,) if rec.link is not None else ()
            if rec.links:
                links += tuple(rec.links)
            step_span = self.full_span(
                name,
                step_ctx,
                parent,
                step_attrs,
                events,
                status,
                step.start_ns,
                step.end_ns,
                links,
            )
        else:
            step_span = make(name, step_ctx, parent, step_attrs, step.start_ns, step.end_ns)
        out.append(step_span)
        job_ids = rec.runtime.job_ids
        if parent is not None and job_ids is not None and rs.has_job_step(rec):
            root_id = job_ids.ids(scope, number)[1]
            if rec.parent_id == root_id:  # the job's step, not an application's span
                out.append(
                    make(
                        f"{scope}_job_step",
                        parent,
                        None,
                        {_STEP: number, attr.SCOPE: scope},
                        step.start_ns,
                        step.end_ns,
                    )
                )
        return out

    def _component_attributes(
        self,
        name: str,
        blocked: bool,
        thread: Any,
        scope: str,
        number: int,
        category: str | None,
        extra: dict[str, object] | None,
        times: tuple[float, float, int] | None = None,
    ) -> dict[str, Any]:
        """A component span's attributes (:func:`otel_tunix.model.record.component_attributes`).
        Components with the same name, kind, thread, scope and category share one dict
        (spans hand out read-only views of it), copied with the step number and the name's
        times in a later step: the run's steps repeat the same components, and a copy of a
        dict costs a third of building one (about 0.3 us a span in bench_overhead).
        ``times``: the name's ``(busy, blocked, count)`` in the step."""
        if extra is None:
            found = self._attributes.get(name)
            if (
                found is not None
                and found[0] is blocked
                and found[1] is thread
                and (found[2] == scope)
                and found[6] == category
            ):
                attrs = found[4]
                if found[3] != number or found[5] != times:  # made in another step
                    attrs = attrs.copy()
                    attrs[_STEP] = number
                    rs.set_component_times(attrs, times)
                    self._attributes[name] = (
                        blocked,
                        thread,
                        scope,
                        number,
                        attrs,
                        times,
                        category,
                    )
                return attrs
        tid, tname = self.thread(thread)
        attrs = rs.component_attributes(name, blocked, tid, tname, category, scope, number)
        rs.set_component_times(attrs, times)
        if extra is not None:
            return {**extra, **attrs}
        if len(self._attributes) >= _MAX_CACHED:  # names made up per step
            self._attributes.clear()
        self._attributes[name] = (blocked, thread, scope, number, attrs, times, category)
        return attrs

    def full_span(
        self,
        name: str,
        ctx: SpanContext,
        parent: SpanContext | None,
        attrs: dict[str, Any],
        events: tuple[Event, ...],
        status: Status,
        start: int,
        end: int,
        links: tuple[Link, ...] = (),
    ) -> ReadableSpan:
        """A span with an error status, events or links (the few that :data:`SpanMaker`
        does not make)."""
        return sdk_span(
            self._resource,
            self._scope,
            name,
            ctx,
            parent,
            attrs,
            start,
            end,
            events,
            status,
            links,
        )


def _device_blocked_sec(comps: list[ComponentStart], ex: ComponentExtras) -> float:
    """The device time (``tunix.device_duration_s``) of the blocked components."""
    total = 0.0
    for _, blocked, sid, _, _, _, _ in comps:
        if blocked:
            seconds = ex.attributes.get(sid, {}).get(attr.DEVICE_DURATION)
            if isinstance(seconds, float | int):
                total += seconds
    return total


def _extra_attributes(
    ex: ComponentExtras, rec: StepRecord, sid: int, start_pc: int, *, own: bool = True
) -> dict[str, object] | None:
    """A component's attributes beyond the standard ones, or ``None``: its own (``own=False``:
    what the spans JSONL keeps, ``attr.for_ledger``), device end, incompleteness, background."""
    background = sid in ex.background
    mine = attr.for_ledger(ex.attributes.get(sid), own)
    device_end = ex.device_ends.get(sid)
    host_end = rec.ends.get(sid, start_pc)
    device = device_end is not None and device_end != host_end
    incomplete = sid in ex.incomplete
    if not (mine or device or incomplete or background):
        return None
    out: dict[str, object] = dict(mine) if mine else {}
    if device:
        out[attr.DEVICE_END] = True
        out[attr.HOST_DURATION] = (host_end - start_pc) * 1e-9
    if incomplete:
        out[attr.INCOMPLETE] = True
    if background:
        out[attr.BACKGROUND] = True
    return out


_start_ns = operator.itemgetter(4)
_exports_lock = threading.Lock()
_MAX_CACHED = 4096
_INTERNAL = SpanKind.INTERNAL
_STEP = attr.STEP
_THREAD_ID, _THREAD_NAME = attr.THREAD_ID, attr.THREAD_NAME
