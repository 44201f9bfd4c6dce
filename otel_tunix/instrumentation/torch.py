"""PyTorch integration: data wait, forward / backward / optimizer spans, CUDA device time,
device memory per step, and zero-code instrumentation of plain training loops.

Three lines in a loop that already calls :func:`otel_tunix.step`::

    from otel_tunix.instrumentation import torch as ott

    loader = ott.instrument_dataloader(loader)   # each next() is train_data_load
    ott.instrument_model(model)                  # forward and backward spans
    ott.instrument_optimizer(optimizer)          # optimizer_step span + memory stats

**Device time.** When CUDA is initialised, every span opened here (and every
:class:`device_component`) records a ``torch.cuda.Event`` on the current stream at its start
and end and hands otel-tunix a device-end resolver: the span then ends when the GPU finished
the component's work, ``tunix.host_duration_s`` keeps the host time, and
``tunix.device_duration_s`` gets the time between the two events (when the core stores
component attributes). Events come from a pool and are shared between adjacent boundaries: a
component starting right where the previous one ended, or right after its parent started,
with no program code in between that could queue GPU work, reuses that event, so N
back-to-back components record N + 1 events. Nothing synchronises the training thread: the
resolvers run on otel-tunix's device-waiter thread, which waits (blocking-sync, GIL released)
on the newest boundary of the stream when it must wait at all, and places every boundary on
the host clock from ``Event.elapsed_time`` against an anchor event.

No CUDA: the same spans, host time only. Needs the ``torch`` extra.
"""

from __future__ import annotations

import collections
import functools
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import otel_tunix
from otel_tunix import attributes as attr
from otel_tunix._errors import warn_once
from otel_tunix.instrumentation import _base
from otel_tunix.settings import load_settings

__all__ = [
    "DEVICE_DURATION",
    "InstrumentedLoader",
    "TorchInstrumentor",
    "device_component",
    "distributed_rank_attributes",
    "instrument_dataloader",
    "instrument_model",
    "instrument_optimizer",
    "memory_stats",
    "quiet_forward",
    "record_memory_stats",
    "uninstrument_model",
    "uninstrument_optimizer",
]

_logger = logging.getLogger(__name__)
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


def _torch() -> Any:
    mod = sys.modules.get("torch")
    if mod is None:
        mod = _base.require("torch", "torch", "otel_tunix.instrumentation.torch")
    return mod


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


# --- forward / backward -----------------------------------------------------------------
class _PerThread(threading.local):
    def __init__(self) -> None:
        self.open: dict[int, tuple[int, device_component | None]] = {}


class _Quiet(threading.local):
    depth = 0


_quiet = _Quiet()


class quiet_forward:
    """Inside this block (in this thread) forward hooks record nothing: generation loops
    call ``forward`` once per token, and the enclosing span (``rollout``) says enough."""

    def __enter__(self) -> None:
        _quiet.depth += 1

    def __exit__(self, *exc: object) -> None:
        _quiet.depth -= 1


class _ModelHooks:
    """Forward pre/post hooks on one module: the outermost call is one ``forward`` span."""

    def __init__(self, torch: Any, model: Any, name: str) -> None:
        self.name = name
        self.local = _PerThread()
        disable = getattr(getattr(torch, "compiler", None), "disable", None)
        pre, post = self._pre, self._post
        if disable is not None:  # run the hooks eagerly inside torch.compile'd modules
            pre, post = disable(pre), disable(post)
        self.handles = [
            model.register_forward_pre_hook(pre),
            model.register_forward_hook(post, always_call=True),
        ]

    def _pre(self, module: Any, args: Any) -> None:
        if _quiet.depth:
            return
        key = id(module)
        depth, comp = self.local.open.get(key, (0, None))
        if depth == 0:
            comp = device_component(self.name)
            comp.__enter__()
        self.local.open[key] = (depth + 1, comp)

    def _post(self, module: Any, args: Any, output: Any) -> None:
        key = id(module)
        depth, comp = self.local.open.get(key, (0, None))
        if depth == 0:
            return
        if depth == 1:
            self.local.open.pop(key, None)
            if comp is not None:
                comp.__exit__(None, None, None)
        else:
            self.local.open[key] = (depth - 1, comp)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


_models: weakref.WeakKeyDictionary[Any, _ModelHooks] = weakref.WeakKeyDictionary()


class _BackwardPatch:
    """Wraps ``torch.autograd.backward`` (which ``Tensor.backward`` calls) in a span."""

    def __init__(self) -> None:
        self.users = 0
        self.name = "backward"
        self.original: Any = None
        self.lock = threading.Lock()

    def acquire(self, torch: Any) -> None:
        with self.lock:
            self.users += 1
            if self.original is not None:
                return
            original = self.original = torch.autograd.backward

            @functools.wraps(original)
            def backward(*args: Any, **kwargs: Any) -> Any:
                if self.users <= 0:
                    return original(*args, **kwargs)
                _auto.activity()
                with device_component(self.name):
                    return original(*args, **kwargs)

            backward.__otel_tunix_original__ = original  # type: ignore[attr-defined]
            torch.autograd.backward = backward

    def release(self, torch: Any) -> None:
        with self.lock:
            self.users = max(0, self.users - 1)
            if self.users == 0 and self.original is not None:
                if getattr(torch.autograd.backward, "__otel_tunix_original__", None) is not None:
                    torch.autograd.backward = self.original
                self.original = None


_backward = _BackwardPatch()


def instrument_model(model: Any, *, forward: str = "forward", backward: str = "backward") -> Any:
    """Record the model's forward pass and every backward pass as spans.

    ``forward``: a forward pre-hook and an ``always_call`` forward hook on ``model`` open and
    close one span for the outermost call (nested or recursive calls of the same module are
    inside it). Works on ``torch.compile``'d modules (the hooks run eagerly).
    ``backward``: ``torch.autograd.backward`` (what ``loss.backward()`` calls) runs inside a
    span while any model is instrumented. Both get CUDA device time when CUDA is in use.
    Idempotent; returns ``model``. Undo with :func:`uninstrument_model`.
    """
    torch = _torch()
    if model in _models:
        return model
    _models[model] = _ModelHooks(torch, model, forward)
    _backward.name = backward
    _backward.acquire(torch)
    return model


def uninstrument_model(model: Any) -> None:
    """Remove what :func:`instrument_model` added."""
    hooks = _models.pop(model, None)
    if hooks is not None:
        hooks.remove()
        _backward.release(_torch())


# --- optimizer --------------------------------------------------------------------------
class _OptimizerHooks:
    def __init__(self, optimizer: Any, name: str, memory: bool, auto: bool = False) -> None:
        self.name = name
        self.memory = memory
        self.auto = auto
        self.local = _PerThread()
        if auto:
            mod = sys.modules["torch.optim.optimizer"]
            self.handles = [
                mod.register_optimizer_step_pre_hook(self._pre),
                mod.register_optimizer_step_post_hook(self._post),
            ]
        else:
            self.handles = [
                optimizer.register_step_pre_hook(self._pre),
                optimizer.register_step_post_hook(self._post),
            ]

    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.auto and not _auto.activity():
            return
        key = id(optimizer)
        stale = self.local.open.pop(key, None)
        if stale is not None and stale[1] is not None:  # the last step() raised
            stale[1].__exit__(None, None, None)
        comp = device_component(self.name)
        comp.__enter__()
        self.local.open[key] = (1, comp)

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        entry = self.local.open.pop(id(optimizer), None)
        if entry is None:
            return
        if entry[1] is not None:
            entry[1].__exit__(None, None, None)
        if self.memory:
            record_memory_stats()
        if self.auto:
            _auto.step_done()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


_optimizers: weakref.WeakKeyDictionary[Any, _OptimizerHooks] = weakref.WeakKeyDictionary()


def instrument_optimizer(
    optimizer: Any, *, name: str = "optimizer_step", memory_stats: bool = True
) -> Any:
    """Record each ``optimizer.step()`` as a span (with CUDA device time).

    With ``memory_stats`` (default), device memory is published after each step (see
    :func:`record_memory_stats`; nothing without CUDA). Idempotent; returns ``optimizer``.
    """
    _torch()
    if optimizer not in _optimizers:
        _optimizers[optimizer] = _OptimizerHooks(optimizer, name, memory_stats)
    return optimizer


def uninstrument_optimizer(optimizer: Any) -> None:
    """Remove what :func:`instrument_optimizer` added."""
    hooks = _optimizers.pop(optimizer, None)
    if hooks is not None:
        hooks.remove()


# --- data loading -----------------------------------------------------------------------
def _prefetches(loader: Any) -> bool:
    try:
        return int(getattr(loader, "num_workers", 0) or 0) > 0
    except (TypeError, ValueError):
        return False


class InstrumentedLoader:
    """An iterable whose iterators record each ``next()`` as a component span.

    Everything else (``len()``, ``.dataset``, ``set_epoch`` ...) is delegated to the wrapped
    loader. Made by :func:`instrument_dataloader`.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        name: str = "train_data_load",
        blocked: bool | None = None,
        *,
        before_fetch: Callable[[], bool | None] | None = None,
        after_fetch: Callable[[], None] | None = None,
    ) -> None:
        self.loader = loader
        self.name = name
        self.blocked = _prefetches(loader) if blocked is None else blocked
        self.before_fetch = before_fetch
        self.after_fetch = after_fetch

    def __iter__(self) -> Iterator[Any]:
        try:
            length: int | None = len(self.loader)  # type: ignore[arg-type]
        except TypeError:
            length = None
        return _InstrumentedIterator(iter(self.loader), self, length)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.loader, name)


class _InstrumentedIterator:
    __slots__ = ("_it", "_length", "_owner", "_yielded")

    def __init__(self, it: Iterator[Any], owner: InstrumentedLoader, length: int | None) -> None:
        self._it = it
        self._owner = owner
        self._length = length
        self._yielded = 0

    def __iter__(self) -> _InstrumentedIterator:
        return self

    def __next__(self) -> Any:
        owner = self._owner
        if (self._length is not None and self._yielded >= self._length) or (
            owner.before_fetch is not None and owner.before_fetch() is False
        ):
            item = next(self._it)  # the end of the epoch, or not ours to record
        else:
            with otel_tunix.component(owner.name, owner.blocked):
                item = next(self._it)
            if owner.after_fetch is not None:
                owner.after_fetch()
        self._yielded += 1
        return item

    def __len__(self) -> int:
        return len(self._it)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "_it":  # not set yet
            raise AttributeError(name)
        return getattr(self._it, name)  # the DataLoader iterator's own attributes


def instrument_dataloader(
    loader: Iterable[Any], name: str = "train_data_load", blocked: bool | None = None
) -> InstrumentedLoader:
    """Wrap a DataLoader (or any iterable) so the wait for each batch is a component.

    ``blocked`` defaults to True for a loader with ``num_workers > 0`` (the loop waits on
    prefetching workers) and False otherwise (the loop does the loading work itself).
    """
    return InstrumentedLoader(loader, name, blocked)


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


def record_memory_stats(
    step: int | None = None, *, scope: str | None = None, reset_peak: bool = True
) -> dict[str, float]:
    """Publish :func:`memory_stats` of the current CUDA device for one step.

    OTel gauges ``tunix.memory.allocated`` / ``.reserved`` / ``.peak_allocated`` (By,
    attributes ``device``, ``scope``) and MetricsLogger scalars ``memory/<key>_bytes``.
    ``step`` and ``scope`` default to the step open in the calling context. Never raises.
    """
    try:
        stats = memory_stats(reset_peak=reset_peak)
        if not stats:
            return stats
        view = otel_tunix.current_step()
        if step is None:
            step = view.number if view is not None else None
        scope = scope or (view.scope if view is not None else None) or "train"
        device = f"cuda:{sys.modules['torch'].cuda.current_device()}"
        _base.record_device_memory(stats, device=device, step=step, scope=scope)
        return stats
    except Exception:
        warn_once(
            ("torch", "memory"),
            "otel-tunix: reading CUDA memory stats failed",
            logger=_logger,
            exc_info=True,
        )
        return {}


# --- distributed ------------------------------------------------------------------------
def distributed_rank_attributes() -> dict[str, int]:
    """``tunix.rank`` / ``tunix.world_size`` (and ``tunix.local_rank``) from
    ``torch.distributed`` when a process group is initialised, else ``{}``."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    try:
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return {}
        out = {attr.RANK: int(dist.get_rank()), attr.WORLD_SIZE: int(dist.get_world_size())}
        local = load_settings().local_rank
        if local is not None:
            out[attr.LOCAL_RANK] = local
        return out
    except Exception:  # torch present but no usable process group: treat the process as alone
        return {}


def ensure_configured() -> bool:
    """:func:`otel_tunix.instrumentation._base.ensure_configured` with the torch rank."""
    if otel_tunix.current_run() is not None:
        return True
    extra = {} if load_settings().rank is not None else distributed_rank_attributes()
    return _base.ensure_configured(extra)


# --- zero-code: steps from a plain loop --------------------------------------------------
class _AutoSteps:
    """Steps for loops that never call :func:`otel_tunix.step` (zero-code mode).

    A step opens at the loop's first activity (a batch fetch, a backward, an optimizer step)
    and closes when ``optimizer.step()`` returns, so it covers data wait, forward, backward
    and the optimizer. Nothing happens while a step of the program's own (or of the
    Transformers integration) is open.
    """

    def __init__(self) -> None:
        self.enabled = False
        self.number = 0
        self.current: Any = None
        self.thread: int | None = None

    def activity(self) -> bool:
        """Called before a recorded activity. True when auto steps own the current loop."""
        if not self.enabled:
            return True
        if self.current is not None:
            return self.thread == threading.get_ident()
        if _base.step_is_open():
            return False
        if not ensure_configured():
            return False
        st = otel_tunix.step(self.number, scope="train")
        st.__enter__()
        self.current, self.thread = st, threading.get_ident()
        return True

    def step_done(self) -> None:
        st = self.current
        if st is None or self.thread != threading.get_ident():
            return
        self.current = None
        self.number += 1
        st.__exit__(None, None, None)


_auto = _AutoSteps()


class TorchInstrumentor(_base.BaseInstrumentor):  # type: ignore[misc]
    """Zero-code PyTorch instrumentation (entry point ``otel_tunix_torch``).

    When ``torch`` gets imported: every ``optimizer.step()`` is an ``optimizer_step`` span
    and ends a step, every ``backward`` is a ``backward`` span, every DataLoader batch is a
    ``train_data_load`` span (blocked with worker processes), and a loop that opens no
    otel-tunix step of its own gets one per optimizer step (scope ``train``). Inside steps
    opened by the program or the Transformers integration, only ``backward`` is added (the
    others are theirs). Forward spans need the model: :func:`instrument_model`.
    """

    # Class-level state: BaseInstrumentor is a singleton whose __init__ runs on every call.
    _active = False
    _optimizer_hooks: _OptimizerHooks | None = None
    _original_iter: Any = None

    def instrumentation_dependencies(self) -> tuple[str, ...]:
        return ("torch >= 2.1",)

    def _instrument(self, **kwargs: Any) -> None:
        _base.enable_auto_configure()
        self._active = True
        _base.when_imported("torch", self._patch)

    def _patch(self, torch: Any) -> None:
        if not self._active or self._optimizer_hooks is not None:
            return
        import torch.optim.optimizer  # the global hook registry
        import torch.utils.data as data

        _auto.enabled = True
        _backward.acquire(torch)
        self._optimizer_hooks = _OptimizerHooks(None, "optimizer_step", memory=True, auto=True)
        original = self._original_iter = data.DataLoader.__iter__

        @functools.wraps(original)
        def __iter__(loader: Any) -> Any:
            it = original(loader)
            if getattr(loader, "_otel_tunix_skip", False):
                return it
            owner = InstrumentedLoader(loader, before_fetch=_fetch_starts)
            try:
                length: int | None = len(loader)
            except TypeError:
                length = None
            return _InstrumentedIterator(it, owner, length)

        data.DataLoader.__iter__ = __iter__  # type: ignore[method-assign]

    def _uninstrument(self, **kwargs: Any) -> None:
        self._active = False
        _auto.enabled = False
        if self._optimizer_hooks is None:
            return
        torch = sys.modules["torch"]
        self._optimizer_hooks.remove()
        self._optimizer_hooks = None
        _backward.release(torch)
        torch.utils.data.DataLoader.__iter__ = self._original_iter
        if _auto.current is not None and _auto.thread == threading.get_ident():
            _auto.step_done()


def _fetch_starts() -> bool:
    # Record the fetch only in auto steps; a program's own step decides for itself.
    return _auto.activity()
