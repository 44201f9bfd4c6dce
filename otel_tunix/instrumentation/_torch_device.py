"""CUDA device time and device memory of the PyTorch integration.

:class:`device_component` records pooled ``torch.cuda.Event`` boundaries through
:class:`_CudaClock` and ends its span when the GPU finished the work (see
:mod:`otel_tunix.instrumentation.torch`); :func:`memory_stats` / :func:`record_memory_stats`
read and publish the CUDA caching allocator's counters. Re-exported by
:mod:`otel_tunix.instrumentation.torch`.
"""

from __future__ import annotations

import collections
import functools
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import otel_tunix
from otel_tunix.instrumentation import _base
from otel_tunix.settings import attributes as attr
from otel_tunix.support.errors import warn_once

_logger = logging.getLogger("otel_tunix.instrumentation.torch")  # the public module's logger
_clock = time.perf_counter_ns
_F = TypeVar("_F", bound=Callable[..., Any])

DEVICE_DURATION = attr.DEVICE_DURATION
"""Span attribute: seconds between a component's start and end CUDA events."""

SHARE_WINDOW_NS = 10_000
"""Upper bound of the event-sharing window (see :meth:`_CudaClock.mark`); the window itself is
half the quickest op launch measured on this host, so no GPU work can be queued between two
boundaries that share an event."""


ANCHOR_SLACK_NS = 1_000_000
"""See :meth:`_CudaClock.host_time`."""

REANCHOR_NS = 10_000_000_000
"""See :meth:`_CudaClock.host_time`."""


# --- CUDA events --------------------------------------------------------------------------
class _Mark:
    """A recorded boundary: a pooled CUDA event, the host time just before it was recorded,
    its stream, and how many users still hold it."""

    __slots__ = ("event", "host_ns", "refs", "stream")

    def __init__(self, event: Any, host_ns: int, stream: int, refs: int) -> None:
        self.event = event
        self.host_ns = host_ns
        self.stream = stream
        self.refs = refs


class _CudaClock:
    """Pooled timing events of one CUDA device, and their conversion to host time.

    The training thread only records events (through the C-level calls, skipping the Python
    wrappers). The device-waiter thread converts them: when the event it needs has not
    completed yet it waits (a blocking-sync wait: the thread sleeps, the GIL is released) on
    the *newest* event recorded on that stream instead, so one wait covers every boundary
    queued so far, and stamps the clock when it wakes; every other boundary is placed from
    ``elapsed_time`` against that anchor.
    """

    def __init__(self, torch: Any, device: int) -> None:
        self._torch = torch
        self._c = torch._C
        self.device = device
        self._pool: collections.deque[Any] = collections.deque()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._streams: dict[Any, Any] = {}
        self._newest: dict[Any, _Mark] = {}
        self._anchor: _Mark | None = None
        self._anchor_since = 0
        self._lo = 0
        self._hi = 0
        self.events_created = 0
        self.events_recorded = 0
        self.waits = 0
        self.window_ns = self._calibrate()

    def _calibrate(self) -> int:
        """Half the quickest host time of launching a tiny op, capped by SHARE_WINDOW_NS."""
        try:
            if self._c._cuda_isCurrentStreamCapturing():
                return 0
            x = self._torch.zeros(1, device=f"cuda:{self.device}")
            best = SHARE_WINDOW_NS * 2
            for _ in range(20):
                t0 = _clock()
                x.add_(1)
                best = min(best, _clock() - t0)
            return min(SHARE_WINDOW_NS, best // 2)
        except Exception:  # CUDA would not run the probe: 0 only means no event is shared
            return 0

    # training thread ---------------------------------------------------------------------
    def mark(self, entry_ns: int) -> _Mark | None:
        """A boundary on the current stream; ``entry_ns`` is when the program handed control
        to otel-tunix. The previous boundary's event is reused when the program ran for less
        than :attr:`window_ns` since otel-tunix last returned (same thread and stream): too
        short to launch anything on the GPU."""
        c = self._c
        try:
            if c._cuda_isCurrentStreamCapturing():
                return None
            sid = c._cuda_getCurrentStream(self.device)  # (stream id, device, device type)
            local = self._local
            last: _Mark | None = getattr(local, "last", None)
            if (
                last is not None
                and last.stream == sid
                and entry_ns - getattr(local, "returned_ns", 0) <= self.window_ns
            ):
                with self._lock:
                    last.refs += 1
                return last
            stream = self._streams.get(sid)
            if stream is None:
                stream = self._streams[sid] = self._torch.cuda.Stream(
                    stream_id=sid[0], device_index=sid[1], device_type=sid[2]
                )
            with self._lock:
                event = self._pool.pop() if self._pool else None
            if event is None:
                event = self._torch.cuda.Event(enable_timing=True, blocking=True)
                self.events_created += 1
            recorded_at = _clock()  # the device cannot reach the event before this
            c._CudaEventBase.record(event, stream)
            self.events_recorded += 1
            mark = _Mark(event, recorded_at, sid, refs=3)  # the caller's, "last", "newest"
            local.last = mark
            with self._lock:
                old_newest = self._newest.get(sid)
                self._newest[sid] = mark
            if old_newest is not None:
                self.release(old_newest)
            if last is not None:
                self.release(last)
            return mark
        except Exception:
            warn_once(
                ("torch", "mark"),
                "otel-tunix: recording a CUDA event failed; host time only",
                logger=_logger,
                exc_info=True,
            )
            return None

    def returned(self) -> None:
        """otel-tunix hands control back to the program (see :meth:`mark`)."""
        self._local.returned_ns = _clock()

    def release(self, mark: _Mark) -> None:
        with self._lock:
            mark.refs -= 1
            if mark.refs == 0:
                self._pool.append(mark.event)

    # device-waiter thread ----------------------------------------------------------------
    def host_time(self, mark: _Mark) -> int:
        """``perf_counter_ns()`` at which the device reached ``mark`` (waits until it has).

        Device times are placed on the host clock through an anchor event A whose host time
        x is bracketed by what every resolved boundary m says: x >= rec(m) - d(A, m), since
        the device cannot pass an event before it was recorded (exact whenever the GPU was
        idle at a boundary), and x <= seen(m) - d(A, m), since m had completed when this thread
        looked (exact when it looked at once). The lower bound is used while the two are
        within :data:`ANCHOR_SLACK_NS`, else the upper one (a GPU that never ran dry). A new
        anchor is taken every :data:`REANCHOR_NS`, so clock drift stays negligible.
        """
        event = mark.event
        if event.query():
            target, seen = mark, _clock()
        else:
            with self._lock:  # wait for the newest boundary of the stream: one wait for all
                target = self._newest.get(mark.stream, mark)
                target.refs += 1
            try:
                target.event.synchronize()  # blocking-sync event: sleeps, GIL released
                seen = _clock()
                self.waits += 1
            finally:
                self.release(target)
        anchor = self._anchor
        if anchor is None or seen - self._anchor_since > REANCHOR_NS:
            self._set_anchor(mark, seen)
            anchor = mark
        d_mark = int(anchor.event.elapsed_time(event) * 1e6)
        d_target = d_mark if target is mark else int(anchor.event.elapsed_time(target.event) * 1e6)
        self._lo = max(self._lo, mark.host_ns - d_mark, target.host_ns - d_target)
        self._hi = min(self._hi, seen - d_target)
        x = self._lo if self._hi - self._lo <= ANCHOR_SLACK_NS else self._hi
        return max(x + d_mark, mark.host_ns)

    def _set_anchor(self, mark: _Mark, seen: int) -> None:
        with self._lock:
            mark.refs += 1
        old, self._anchor = self._anchor, mark
        self._anchor_since = seen
        self._lo, self._hi = mark.host_ns, seen
        if old is not None:
            self.release(old)


_clocks: dict[int, _CudaClock] = {}


def _cuda_clock() -> _CudaClock | None:
    """The clock of the current CUDA device, or None when CUDA is not in use."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    device = torch._C._cuda_getDevice()
    clock = _clocks.get(device)
    if clock is None:
        clock = _clocks.setdefault(device, _CudaClock(torch, device))
    return clock


def _record_attribute(comp: Any) -> dict[str, Any] | None:
    """The span-attribute dict of an open component (``None`` when it is not recorded)."""
    attrs: dict[str, Any] | None = comp.span_attributes
    return attrs


def _resolver(
    clock: _CudaClock, start: _Mark, end: _Mark, host_end: int, attrs: dict[str, Any] | None
) -> Callable[[], int]:
    def resolve() -> int:
        try:
            device_end = clock.host_time(end)
            if start is not end and not start.event.query():
                start.event.synchronize()
            seconds = start.event.elapsed_time(end.event) * 1e-3 if start is not end else 0.0
        finally:
            clock.release(start)
            clock.release(end)
        if attrs is not None:
            attrs[DEVICE_DURATION] = seconds
        return max(device_end, host_end)

    return resolve


class device_component:
    """:func:`otel_tunix.component` plus CUDA device time (a context manager and a decorator).

    With CUDA initialised the span ends when the GPU finished the work queued inside the
    block; without CUDA it is exactly :func:`otel_tunix.component`.

    Args:
        name: The component (and span) name.
        blocked: True for time spent waiting.
    """

    __slots__ = ("_blocked", "_clock", "_comp", "_name", "_start")

    def __init__(self, name: str, blocked: bool = False) -> None:
        self._name = name
        self._blocked = blocked
        self._comp: Any = None
        self._clock: _CudaClock | None = None
        self._start: _Mark | None = None

    @property
    def recording(self) -> bool:
        """True when the span is being recorded."""
        return self._comp is not None and self._comp.recording

    def __enter__(self) -> device_component:
        entry = _clock()
        comp = self._comp = otel_tunix.component(self._name, self._blocked)
        comp.__enter__()
        if comp.recording:
            clock = self._clock = _cuda_clock()
            if clock is not None:
                self._start = clock.mark(entry)
                clock.returned()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        entry = _clock()
        comp, start, clock = self._comp, self._start, self._clock
        self._comp = self._start = self._clock = None
        if comp is None:
            return
        if start is None or clock is None:
            comp.__exit__(exc_type, exc, tb)
            return
        end = clock.mark(entry)
        if end is None:
            clock.release(start)
        else:
            comp.end_on_device(_resolver(clock, start, end, _clock(), _record_attribute(comp)))
        comp.__exit__(exc_type, exc, tb)
        clock.returned()

    def __call__(self, fn: _F) -> _F:
        name, blocked = self._name, self._blocked

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with device_component(name, blocked):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


# --- memory -----------------------------------------------------------------------------
def memory_stats(device: Any = None, *, reset_peak: bool = True) -> dict[str, float]:
    """The CUDA caching allocator's ``allocated``, ``reserved`` and ``peak_allocated`` bytes.

    ``peak_allocated`` is the peak since the last reset; with ``reset_peak`` the peak is
    reset so the next call reports the next step's peak. Empty when CUDA is not in use.
    Reading these counters does not synchronise the device.
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return {}
    cuda = torch.cuda
    out = {
        "allocated": float(cuda.memory_allocated(device)),
        "reserved": float(cuda.memory_reserved(device)),
        "peak_allocated": float(cuda.max_memory_allocated(device)),
    }
    if reset_peak:
        cuda.reset_peak_memory_stats(device)
    return out


@dataclass(frozen=True, slots=True)
class AllocatorStep:
    """The CUDA caching allocator's retry and OOM counts of one step (see
    :func:`allocator_step`)."""

    alloc_retries: int
    """Allocation retries during the step (a ``cudaMalloc`` that failed, freed the cache and
    was tried again)."""
    ooms: int
    """Out-of-memory errors during the step."""
    total_alloc_retries: int
    """``num_alloc_retries`` as read (since the process started or the counters' reset)."""
    total_ooms: int
    """``num_ooms`` as read."""

    @property
    def retries_growing(self) -> bool:
        """The retry count grew during the step: the allocator is short of memory."""
        return self.alloc_retries > 0


def allocator_step(stats: Mapping[str, Any], previous: AllocatorStep | None) -> AllocatorStep:
    """The retries and OOMs of one step from ``torch.cuda.memory_stats()`` (``stats``) and
    the previous step's reading.

    The counts of a step are the growth of ``num_alloc_retries`` / ``num_ooms`` since the
    previous reading; the first reading counts everything since the process started; a count
    that went down (``torch.cuda.reset_accumulated_memory_stats()``) counts from zero. A key
    missing from ``stats`` reads 0. Pure: no torch, no CUDA.
    """
    retries = int(stats.get("num_alloc_retries", 0) or 0)
    ooms = int(stats.get("num_ooms", 0) or 0)
    last_retries = previous.total_alloc_retries if previous is not None else 0
    last_ooms = previous.total_ooms if previous is not None else 0
    return AllocatorStep(
        alloc_retries=retries - last_retries if retries >= last_retries else retries,
        ooms=ooms - last_ooms if ooms >= last_ooms else ooms,
        total_alloc_retries=retries,
        total_ooms=ooms,
    )


_allocator_last: dict[str, AllocatorStep] = {}
"""The last :class:`AllocatorStep` read per device label."""


def publish_step_memory(
    stats: Mapping[str, float],
    allocator_stats: Mapping[str, Any],
    *,
    device: str,
    step: int | None = None,
    scope: str | None = None,
) -> dict[str, float]:
    """Publish one step's memory readings of ``device``: ``stats`` as :func:`memory_stats`
    gives them, ``allocator_stats`` as ``torch.cuda.memory_stats()`` does (its
    ``num_alloc_retries`` / ``num_ooms``, turned into the step's counts by
    :func:`allocator_step` against this device's previous reading). What is published:
    see :func:`record_memory_stats`, which reads both on CUDA and calls this."""
    view = otel_tunix.current_step()
    if step is None:
        step = view.number if view is not None else None
    scope = scope or (view.scope if view is not None else None) or "train"
    span = view.attributes if view is not None else None
    _base.record_device_memory(stats, device=device, step=step, scope=scope, span_attributes=span)
    counts = allocator_step(allocator_stats, _allocator_last.get(device))
    _allocator_last[device] = counts
    _base.record_allocator_counts(
        {"alloc_retries": counts.alloc_retries, "ooms": counts.ooms},
        device=device,
        step=step,
        scope=scope,
    )
    if span is not None:
        span[attr.MEMORY_ALLOC_RETRIES] = counts.alloc_retries
        span[attr.MEMORY_OOMS] = counts.ooms
    return {**stats, "alloc_retries": float(counts.alloc_retries), "ooms": float(counts.ooms)}


def record_memory_stats(
    step: int | None = None, *, scope: str | None = None, reset_peak: bool = True
) -> dict[str, float]:
    """Publish :func:`memory_stats` of the current CUDA device for one step, and the
    allocator's retries and OOMs during the step (:func:`allocator_step`).

    OTel gauges ``tunix.memory.allocated`` / ``.reserved`` / ``.peak_allocated`` (By,
    attributes ``device``, ``scope``), counters ``tunix.memory.alloc_retries`` /
    ``tunix.memory.ooms``, MetricsLogger scalars ``memory/<key>_bytes``,
    ``memory/alloc_retries`` and ``memory/ooms`` (the step's counts: the
    ``alloc_retries_growing`` alert rule watches the first), and the step span's
    ``tunix.memory.*`` attributes. ``step`` and ``scope`` default to the step open in the
    calling context. Returns the bytes and the step's ``alloc_retries`` / ``ooms``; empty
    without CUDA. Never raises.
    """
    try:
        stats = memory_stats(reset_peak=reset_peak)
        if not stats:
            return stats
        cuda = sys.modules["torch"].cuda
        device = f"cuda:{cuda.current_device()}"
        return publish_step_memory(
            stats, cuda.memory_stats(), device=device, step=step, scope=scope
        )
    except Exception:
        warn_once(
            ("torch", "memory"),
            "otel-tunix: reading CUDA memory stats failed",
            logger=_logger,
            exc_info=True,
        )
        return {}
