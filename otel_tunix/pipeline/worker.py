"""Off the hot path: the worker that hands finished step records to the span processors,
and the device-end waiter.

The training thread hands each finished sampled step to :meth:`Pipeline.submit` (an append
to the pipeline's :class:`~otel_tunix.pipeline.batch_queue.BatchQueue`; the worker is woken
at most every ``interval_sec``). The worker thread waits until every component of the step
has ended (components in other threads, device ends still resolving) and then calls the
``process`` callback (the span builder, ``span_builder.py``) with the steps that are ready,
in order, as one batch (so the processors pay their per-call costs once per batch, not per
step). The queue is bounded: when the worker falls behind, new steps are dropped and
counted, never blocking the training loop.

Device ends are resolved on a second daemon thread, one resolver at a time in FIFO order, so
a blocking ``block_until_ready`` reads the clock as soon as the device finishes instead of
whenever the worker gets to it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from otel_tunix.pipeline.batch_queue import BatchQueue
from otel_tunix.recording.hot_path import StepRecord, now_ns
from otel_tunix.recording.records import step_extras
from otel_tunix.support.errors import report_internal_error, warn_once

_logger = logging.getLogger(__name__)

_KICK_SEC = 0.25
"""Default of ``interval_sec``: the worker is woken at most this often by new steps (and
polls at this interval). Fast loops hand over steps in batches, which keeps wake-ups and
GIL hand-offs rare: each wake-up starts with caches the training loop has cooled (on a
2-core VM with torch busy on the other core, the demo's worker cost 120-160 us of CPU per
step woken every 100 ms, 55-85 us every 250 ms, 77 us every 2 s); a loop slower than this
gets each step processed as soon as it ends."""

_MAX_BATCH = 256
"""Steps handed to ``process`` in one call at most."""

_STALL_SEC = 60.0
"""A step whose components are still open this long after the step ended is processed with
those components closed at that moment and marked ``tunix.incomplete``."""


class Pipeline:
    """Bounded hand-off from the training loop to the span-building worker: a
    :class:`~otel_tunix.pipeline.batch_queue.BatchQueue` of finished steps, and the
    device-end waiter.

    ``process`` gets the ready steps, oldest first, a batch at a time, and returns how many
    of them failed (it isolates failures itself: one bad step does not lose the others).
    """

    def __init__(
        self,
        process: Callable[[list[StepRecord]], int],
        *,
        after_batch: Callable[[], None] | None = None,
        finish: Callable[[bool], None] | None = None,
        max_queued_steps: int = 4096,
        stall_sec: float = _STALL_SEC,
        interval_sec: float = _KICK_SEC,
    ) -> None:
        self._process = process
        self._finish = finish
        """Called after a flush (``False``) and the close (``True``): the span builder hands
        on the spans of background work that ended after its step."""
        self._stall = stall_sec
        self._interval = interval_sec
        self.failed_steps = 0
        self.processed_steps = 0
        self.unprocessed_steps = 0
        """Steps still queued (or being processed) when :meth:`close` gave up waiting."""
        self._in_flight = 0
        self._device_queue: queue.SimpleQueue[tuple[StepRecord, list[int]] | None] | None = None
        self._device_thread: threading.Thread | None = None
        self._device_lock = threading.Lock()
        self._queue: BatchQueue[StepRecord] = BatchQueue(
            self._process_batch,
            name="otel-tunix-worker",
            capacity=max_queued_steps,
            max_batch=_MAX_BATCH,
            interval_sec=interval_sec,
            ready=self._ready,
            after_batch=after_batch,
            wake_when_full=False,  # woken every interval_sec: fewer, cheaper wake-ups
        )

    @property
    def dropped_steps(self) -> int:
        """Steps dropped because the queue was full (or closed)."""
        return self._queue.dropped

    # --- called from the training loop ----------------------------------------------------
    def submit(self, record: StepRecord) -> None:
        """Queue a finished step (drops and counts it when the queue is full or closed)."""
        now = record.submitted_at = time.monotonic()
        # A step that ends after the run has (a loop that goes on a moment while SIGTERM
        # finishes the run) is not one lost for want of room.
        self._queue.put(record, now, count_late=False)

    def wait_for_device(self, step: StepRecord, span_ids: list[int]) -> None:
        """Resolve the device ends of these components of ``step``, in order, on the
        device-waiter thread (one hand-off for all the device components of a step)."""
        if self._device_queue is None:
            with self._device_lock:
                if self._device_queue is None:
                    self._device_queue = queue.SimpleQueue()
                    self._device_thread = threading.Thread(
                        target=self._resolve_devices, name="otel-tunix-device-waiter", daemon=True
                    )
                    self._device_thread.start()
        self._device_queue.put((step, span_ids))

    # --- threads --------------------------------------------------------------------------
    def _resolve_devices(self) -> None:
        q = self._device_queue
        assert q is not None
        while True:
            item = q.get()
            if item is None:
                return
            resolve_device_ends(*item)
            self._queue.wake()

    def _ready(self, rec: StepRecord, force: bool) -> bool:
        """Whether the oldest step can be processed: every component ended (device ends
        included), else closing or stalled: its open components are then closed now."""
        if _ready(rec):
            return True
        if force or time.monotonic() - rec.submitted_at > self._stall:
            _close_open_spans(rec)
            return True
        return False

    def _process_batch(self, batch: list[StepRecord]) -> None:
        self._in_flight = len(batch)
        try:
            failed = self._process(batch)
        except Exception:  # ``process`` reports what fails inside it; this is a last guard
            self.failed_steps += len(batch)
            report_internal_error("processing a batch of steps")
            return
        finally:
            self._in_flight = 0
        self.failed_steps += failed
        self.processed_steps += len(batch) - failed

    # --- lifecycle ------------------------------------------------------------------------
    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued step whose components have ended on the host (device ends
        still resolving included) is processed."""
        done = self._queue.flush(timeout, pending=_host_done)
        if self._finish is not None:
            self._finish(False)
        return done

    def close(self, timeout: float = 10.0) -> None:
        """Process everything still queued (closing open components) and stop the threads."""
        if self._queue.closed:
            return
        if self._device_queue is not None:
            self._device_queue.put(None)
            if self._device_thread is not None:
                self._device_thread.join(timeout)
        if not self._queue.close(timeout):
            self.unprocessed_steps = len(self._queue) + self._in_flight
            _logger.warning(
                "otel-tunix: the worker did not finish within %.1f s; %d steps not processed "
                "(counted in summary.json: unprocessed_steps)",
                timeout,
                self.unprocessed_steps,
            )
        elif self._finish is not None:
            self._finish(True)


def resolve_device_ends(step: StepRecord, span_ids: list[int]) -> None:
    """Run the device-end resolvers of these components of ``step``, in order, and store
    their device end times (a failing resolver keeps the host end)."""
    ex = step_extras(step)
    for sid in span_ids:
        resolver = ex.device.get(sid)
        if resolver is None:  # already given up on (the step was processed without it)
            continue
        try:
            value = resolver.result() if hasattr(resolver, "result") else resolver()
            if value is not None:
                ex.device_ends[sid] = int(value)
        except Exception:  # a resolver is the caller's (or a framework's) code
            name = next((name for name, _, s, *_ in step.spans if s == sid), "?")
            warn_once(
                ("device-end resolver", name),
                "otel-tunix: the device-end resolver of %r failed; using the host end time "
                "(reported once per component name)",
                name,
                logger=_logger,
                exc_info=True,
            )
        ex.device.pop(sid, None)


def _ready(rec: StepRecord) -> bool:
    """Every component of the step's own thread has ended, device ends included (one
    still open on another thread never holds the step back: the span builder counts it as
    background work in this step and the later ones it overlaps)."""
    ex = rec.extras
    return _host_done(rec) and (ex is None or not ex.device)


def _host_done(rec: StepRecord) -> bool:
    ends = rec.ends
    if len(ends) >= len(rec.spans):  # the usual case: every component has ended
        return True
    return all(thread is not None or sid in ends for _, _, sid, _, _, thread, _ in list(rec.spans))


def _close_open_spans(rec: StepRecord) -> None:
    """Process a step anyway: components of its own thread still open end now, device ends
    still resolving keep the host end; both are marked incomplete. (Components still open
    on other threads are the span builder's: background work.)"""
    now = now_ns()
    ends = rec.ends
    ex = step_extras(rec)
    for _, _, sid, _, _, thread, _ in list(rec.spans):
        if sid in ex.device or (sid not in ends and thread is None):
            ends.setdefault(sid, now)
            ex.device.pop(sid, None)
            ex.incomplete.add(sid)
