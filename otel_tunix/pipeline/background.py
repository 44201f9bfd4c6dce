"""Work on other threads that outlives a step: counted where it ran, never waited for.

A component recorded on another thread than its step's (an async checkpoint writer, a
thread started in an earlier step, a pool task the step did not wait for) is the step's own
work when it ran inside the step's window: its time is part of the step's busy / blocked /
idle. One that was open at an edge of the window (it started before the step, or
was still running when the step ended) is *background* work: the step is processed without
waiting for it, and its time is counted in every step of its step's thread whose window it
overlaps, for the overlap, beside the breakdown (``background_time_sec``). Outside
components that other threads started while no step was open, after a first step (*loose*:
``Runtime.loose``), are background work too, from the first step they overlap; their spans
go out with their own records (:mod:`otel_tunix.pipeline.outside`), not from here.

:class:`BackgroundLedger` keeps, per thread that runs steps, the background components that
may still overlap its later steps, on the worker thread. A component that ended before its
step was processed is one of that step's spans; one still running is *carried*: its span is
handed on, with its real length, once a later step of that thread is processed after it
ended (or when the run flushes or closes).
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from opentelemetry.sdk.trace import ReadableSpan

from otel_tunix.model import record as rs
from otel_tunix.model.steps import BackgroundInterval
from otel_tunix.recording.hot_path import StepRecord
from otel_tunix.recording.records import ComponentStart
from otel_tunix.settings.attributes import BACKGROUND, INCOMPLETE

__all__ = ["BackgroundLedger", "BackgroundSpan", "Carried", "StepBackground"]


class Carried:
    """A background component whose span is not handed on yet (its end is read from its
    step's record, where the hot path stores it)."""

    __slots__ = (
        "blocked",
        "category",
        "counted",
        "home",
        "name",
        "parent",
        "sid",
        "spanned",
        "start",
        "thread",
        "trace",
    )

    def __init__(
        self, comp: ComponentStart, home: StepRecord, loose: bool, spanned: bool = False
    ) -> None:
        self.name, self.blocked, self.sid, self.parent, self.start, self.thread = comp[:6]
        self.category = comp[6]
        self.home = home
        """The record that holds its end: the step it started in, or (loose) its own
        outside record."""
        self.counted = not loose  # its use counted once, in the first step it appears in
        self.spanned = spanned
        """Its span went out with its step (it had ended by then): carried for its time in
        the later steps it overlaps only."""
        self.trace = home.trace_id

    @property
    def end(self) -> int | None:
        """Its host end (``perf_counter_ns``), or ``None`` while it runs."""
        return self.home.ends.get(self.sid)


class StepBackground:
    """What a step's processing takes from the ledger.

    Attributes:
        keys: Span ids of the step's own components that are background work (ended:
            among its spans, marked so).
        intervals: Every background interval overlapping the step, for the accounting.
        open_ids: Span ids of the step's components still running: not among its spans
            (carried; handed on once ended).
    """

    __slots__ = ("intervals", "keys", "open_ids")

    def __init__(self) -> None:
        self.keys: set[int] = set()
        self.intervals: list[BackgroundInterval] = []
        self.open_ids: set[int] = set()


class BackgroundLedger:
    """The background components that may still overlap later steps, per step thread.

    Used on the worker thread, and by a flush or the close (:meth:`take_finished`); a lock
    keeps the two apart.
    """

    def __init__(self) -> None:
        self.carried: dict[int, list[Carried]] = {}
        """Per step thread (ident), the background components that may overlap its later
        steps."""
        self._done: list[tuple[Carried, int, bool]] = []
        self.runtime: Any = None
        """The run's runtime, as its steps name it (where loose components wait)."""
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.carried or self._done)

    def step(self, rec: StepRecord) -> StepBackground | None:
        """The background work of a step about to be processed (``None``: none, the usual
        case). Its own background components still running are carried from now on."""
        loose = rec.runtime.loose
        carried = self.carried.get(rec.ident) if self.carried else None
        with self._lock:
            if loose:
                self._take_loose(loose)
                carried = self.carried.get(rec.ident)
            return self._step(rec, carried)

    def _step(self, rec: StepRecord, carried: list[Carried] | None) -> StepBackground | None:
        out: StepBackground | None = None
        start, end, ends = rec.start_ns, rec.end_ns, rec.ends
        if end <= start:  # no end of its own: nothing to tell background work apart by
            end = start
        for comp in list(rec.spans):
            thread = comp[5]
            if thread is None:
                continue
            sid, c_start = comp[2], comp[4]
            c_end = ends.get(sid)
            if c_end is not None and c_start >= start and c_end <= end:
                continue  # ran inside the step: its own work
            if out is None:
                out = StepBackground()
            name, blocked, category = comp[0], comp[1], comp[6]
            if c_end is None:  # still running: carried, its span handed on once it ends
                out.open_ids.add(sid)
                self.carried.setdefault(rec.ident, []).append(Carried(comp, rec, False))
                out.intervals.append((name, blocked, c_start, end, 1, category))
            else:
                out.keys.add(sid)
                out.intervals.append((name, blocked, c_start, c_end, 1, category))
                if c_end > end:  # ran on past the step: its time in the next ones too
                    self.carried.setdefault(rec.ident, []).append(Carried(comp, rec, False, True))
        if carried:
            keep = []
            for c in carried:
                if c.home is rec:  # carried just now, counted above
                    keep.append(c)
                    continue
                c_end = c.end
                if c.start < end and (c_end is None or c_end > start):
                    if out is None:
                        out = StepBackground()
                    out.intervals.append(
                        (
                            c.name,
                            c.blocked,
                            c.start,
                            end if c_end is None else c_end,
                            0 if c.counted else 1,
                            c.category,
                        )
                    )
                    c.counted = True
                if c_end is not None and c_end <= end:  # no later step of this thread
                    if not c.spanned:  # can overlap it: its span is handed on
                        self._done.append((c, c_end, False))
                else:
                    keep.append(c)
            if keep:
                self.carried[rec.ident] = keep
            else:
                del self.carried[rec.ident]
        return out

    def _take_loose(self, loose: Any) -> None:
        """Loose components (outside components of other threads), each carried for the
        steps of the loop's thread (``ident``) that it overlaps: for its time only, its span
        going out with its outside record."""
        while loose:
            try:
                comp, home, ident = loose.popleft()
            except IndexError:  # emptied meanwhile
                break
            self.carried.setdefault(ident, []).append(Carried(comp, home, True, spanned=True))

    def take_due(self) -> list[tuple[Carried, int, bool]]:
        """The carried components that processed steps found ended, and no later step of
        their thread can overlap: ``(component, end, incomplete)``."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def take_finished(self, now_ns: int, force: bool) -> list[tuple[Carried, int, bool]]:
        """Carried components due at a flush (``force=False``: those ended, with no step
        open on their thread that could still overlap them) or at the close (``force``:
        every one; those still running end at ``now_ns``, marked incomplete)."""
        with self._lock:
            rt = self.runtime
            if rt is not None and rt.loose:
                self._take_loose(rt.loose)
            out, self._done = self._done, []
            for ident, carried in list(self.carried.items()):
                keep = []
                for c in carried:
                    c_end = c.end
                    if force or (c_end is not None and not _open_on(c.home, ident, c_end)):
                        if not c.spanned:  # else its span went out with its step
                            out.append((c, now_ns if c_end is None else c_end, c_end is None))
                    else:
                        keep.append(c)
                if keep:
                    self.carried[ident] = keep
                else:
                    del self.carried[ident]
        return out


class _Builder(Protocol):
    """What a :class:`BackgroundSpan` needs of the span builder."""

    offset: int

    def thread(self, thread: Any) -> tuple[int, str]: ...

    def background_span(self, c: Carried, end: int, attrs: dict[str, object]) -> ReadableSpan: ...


class BackgroundSpan:
    """A background component's span handed on after its step (see
    :mod:`otel_tunix.pipeline.background`): in its step's trace, with its real start and
    end.

    Attributes:
        scope: Its step's scope.
        number: Its step's number.
        trace_id: Its trace id.
    """

    __slots__ = (
        "_builder",
        "_carried",
        "_end",
        "_incomplete",
        "_span",
        "number",
        "scope",
        "trace_id",
    )

    def __init__(self, builder: _Builder, carried: Carried, end: int, incomplete: bool) -> None:
        self._builder = builder
        self._carried = carried
        self._end = max(end, carried.start)
        self._incomplete = incomplete
        self._span: ReadableSpan | None = None
        self.scope = carried.home.scope
        self.number = carried.home.number
        self.trace_id = carried.trace

    def _attributes(self) -> dict[str, object]:
        out: dict[str, object] = {BACKGROUND: True}
        if self._incomplete:
            out[INCOMPLETE] = True
        return out

    def span(self) -> ReadableSpan:
        """The SDK span (built on first use and kept)."""
        span = self._span
        if span is None:
            span = self._span = self._builder.background_span(
                self._carried, self._end, self._attributes()
            )
        return span

    def interval(self) -> tuple[str, bool, int, int, str | None]:
        """``(name, blocked, start, end, category)``, Unix epoch ns; the category the
        component was recorded with (``None``: none)."""
        c, off = self._carried, self._builder.offset
        return c.name, c.blocked, c.start + off, self._end + off, c.category

    def to_json(self) -> dict[str, object]:
        """Its line of the spans JSONL file: ``type: "span"``, its step's scope, number and
        trace id, and the fields of a step line's ``spans`` entries."""
        c = self._carried
        b = self._builder
        tid, tname = b.thread(c.thread or c.home.thread)
        ex = c.home.extras
        entry = rs.component_json(
            c.name,
            c.blocked,
            c.start + b.offset,
            self._end + b.offset,
            tname,
            tid,
            c.sid,
            c.parent,
            ex.errors.get(c.sid) if ex is not None else None,
            self._attributes(),
            c.category,
        )
        return rs.span_line(entry, self.scope, self.number, self.trace_id)


def _open_on(home: StepRecord, ident: int, end: int) -> bool:
    """Whether a step that started before ``end`` is open on thread ``ident``."""
    return any(st.ident == ident and st.start_ns < end for st in list(home.runtime.open_steps))
