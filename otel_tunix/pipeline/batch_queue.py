"""The one queue engine of the pipeline: a bounded FIFO drained in batches by a daemon thread.

The step worker (:class:`~otel_tunix.pipeline.worker.Pipeline`: finished steps to the span
processors) and each batch export processor
(:class:`~otel_tunix.pipeline.export_processor.BatchExportProcessor`: spans to an exporter)
are this engine with their own ``handle`` callback:

* Producers never block. :meth:`BatchQueue.put` and :meth:`BatchQueue.offer` append while the
  queue holds less than ``capacity`` (items weigh ``weight(item)``: 1 per step, a step's span
  count for the exporter) and drop (and count) the rest.
* The thread wakes every ``interval_sec``, when a full batch is queued, when a producer's
  ``put`` comes ``interval_sec`` after the last wake-up, or when :meth:`wake` is called. It
  takes the oldest items that are ``ready`` (a step whose components have all ended), up to
  ``max_batch`` of weight (an item heavier than a batch comes alone), and calls ``handle``
  with them, until none is ready; then ``after_batch``.
* :meth:`flush` waits until the thread has handled what is queued; :meth:`close` lets it
  handle everything (``ready`` is then asked with ``force=True``) and stops it;
  :meth:`restart` gives a forked child a fresh, empty queue and thread.

Written here rather than taken from the OTel SDK: its batch processor's queue engine
(``opentelemetry.sdk._shared_internal.BatchProcessor``) is private, takes one item at a time
with a count per item, and has no notion of an item that is not ready yet.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from otel_tunix.support.errors import report_internal_error

__all__ = ["BatchQueue"]

T = TypeVar("T")


def _one(_: object) -> int:
    return 1


class BatchQueue(Generic[T]):
    """A bounded FIFO of ``T`` drained in batches by one daemon thread.

    Args:
        handle: Called on the thread with each batch, in order. What fails inside it is its
            own to report; an exception that escapes is an internal error.
        name: The thread's name.
        capacity: Weight held at most; past it new items are dropped and counted.
        max_batch: Weight handed to ``handle`` in one call at most.
        interval_sec: Longest sleep of the thread between two looks at the queue, and the
            least time between two wake-ups by :meth:`put`.
        weight: The weight of an item (default 1).
        ready: ``ready(item, force)``: whether the oldest item may be handled now (``force``
            while closing: it must then say yes). Default: always.
        after_batch: Called on the thread after the batches of one wake-up.
        wake_when_full: Wake the thread as soon as a full batch is queued (else only every
            ``interval_sec``: fewer, larger batches, and fewer hand-offs of the GIL).
    """

    def __init__(
        self,
        handle: Callable[[list[T]], None],
        *,
        name: str,
        capacity: int,
        max_batch: int,
        interval_sec: float,
        weight: Callable[[T], int] = _one,
        ready: Callable[[T, bool], bool] | None = None,
        after_batch: Callable[[], None] | None = None,
        wake_when_full: bool = True,
    ) -> None:
        self._handle = handle
        self._name = name
        self._capacity = capacity
        self._max_batch = max_batch
        self._interval = interval_sec
        self._weight = weight
        self._ready = ready
        self._after_batch = after_batch
        self._wake_at = max_batch if wake_when_full else capacity + 1
        self.dropped = 0
        """Weight dropped because the queue was full or closed."""
        self._start()

    def _start(self) -> None:
        self._queue: collections.deque[T] = collections.deque()
        self._queued = 0  # weight in the queue
        self._lock = threading.Lock()
        self._idle = threading.Condition()
        self._wake_event = threading.Event()
        self._last_wake = 0.0
        # One drainer at a time (the thread or drain_here); held while taken items are
        # handled, which flush waits for.
        self._handling = threading.Lock()
        self._stopping = False
        self.closed = False
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    # --- producers ---------------------------------------------------------------------------
    def put(self, item: T, now: float | None = None, *, count_late: bool = True) -> bool:
        """Queue one item (False: dropped). Wakes the thread at most every ``interval_sec``
        (a fast loop hands over its steps in batches), or when a batch is full. ``now``:
        ``time.monotonic()``, when the caller has it. ``count_late``: count an item put
        after :meth:`close` as dropped."""
        n = self._weight(item)
        with self._lock:
            if self.closed or self._queued + n > self._capacity:
                if count_late or not self.closed:
                    self.dropped += n
                return False
            self._queue.append(item)
            self._queued += n
            full = self._queued >= self._wake_at
        if now is None:
            now = time.monotonic()
        if full or now - self._last_wake >= self._interval:
            self._last_wake = now
            self._wake_event.set()
        return True

    def offer(self, items: Sequence[T]) -> list[T]:
        """Queue these items, in order, while they fit; returns those dropped."""
        dropped: list[T] = []
        with self._lock:
            queued, cap, append, closed = (
                self._queued,
                self._capacity,
                self._queue.append,
                self.closed,
            )
            for item in items:
                n = self._weight(item)
                if not closed and queued + n <= cap:
                    queued += n
                    append(item)
                else:
                    self.dropped += n
                    dropped.append(item)
            self._queued = queued
            full = queued >= self._wake_at
        if full and not self._wake_event.is_set():
            self._wake_event.set()
        return dropped

    def wake(self) -> None:
        """Have the thread look at the queue now."""
        self._wake_event.set()

    @property
    def handling_lock(self) -> threading.Lock:
        """Held while a batch is handled (an exporter's call): a fork waits for it."""
        return self._handling

    def __len__(self) -> int:
        return len(self._queue)

    def head(self) -> T | None:
        """The oldest queued item, or ``None``."""
        q = self._queue
        return q[0] if q else None

    # --- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        wake = self._wake_event
        while True:
            wake.wait(self._interval)
            wake.clear()
            stopping = self._stopping
            self._drain(force=stopping)
            if not self._queue:
                with self._idle:
                    self._idle.notify_all()
                if stopping:
                    return

    def _drain(self, force: bool, deadline: float | None = None) -> bool:
        """Handle the ready items, a batch at a time; False if ``deadline`` passed first
        (including while another drainer held the queue)."""
        wait = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._handling.acquire(timeout=wait):
            return False
        handled = 0
        try:
            while True:
                if deadline is not None and time.monotonic() > deadline:
                    return False
                batch = self._take(force)
                if not batch:
                    break
                handled += len(batch)
                try:
                    self._handle(batch)
                except Exception:  # handle reports its own failures: this is a last guard
                    report_internal_error(f"{self._name}: handling a batch")
        finally:
            if handled and self._after_batch is not None:
                try:
                    self._after_batch()
                except Exception:  # after_batch reports its own failures
                    report_internal_error(f"{self._name}: after a batch")
            self._handling.release()
        return True

    def _take(self, force: bool) -> list[T]:
        """The oldest ready items that fit in one batch, whole (one heavier than a batch
        comes alone)."""
        out: list[T] = []
        taken = 0
        with self._lock:
            q, ready, weight, cap = self._queue, self._ready, self._weight, self._max_batch
            while q:
                head = q[0]
                if ready is not None and not ready(head, force):
                    break
                n = weight(head)
                if out and taken + n > cap:
                    break
                out.append(q.popleft())
                taken += n
            self._queued -= taken
        return out

    # --- lifecycle -----------------------------------------------------------------------------
    def drain_here(self, timeout: float) -> bool:
        """Handle what is queued and ready now on the calling thread (after the batch the
        thread may be handling). False if ``timeout`` passed first."""
        return self._drain(False, time.monotonic() + timeout)

    def flush(self, timeout: float, pending: Callable[[T], bool] | None = None) -> bool:
        """Wait until the thread has handled every queued item (with ``pending``, every
        queued item up to the first for which it is false). False on timeout."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._handling.locked() or (
                self._queue and (pending is None or pending(self._queue[0]))
            ):
                self._wake_event.set()
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    return False
                self._idle.wait(min(remaining, 0.05))
        return True

    def close(self, timeout: float) -> bool:
        """Stop taking items, let the thread handle everything queued (``ready`` asked with
        ``force=True``), and stop it. False if it had not finished within ``timeout``."""
        with self._lock:
            if self.closed:
                return not self._thread.is_alive()
            self.closed = True
        self._stopping = True
        self._wake_event.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def restart(self) -> None:
        """An empty queue and a new thread (in a forked child, where threads do not
        survive)."""
        self._start()
