"""The pipeline's one queue engine: bounded, weighted, batched, ready-or-forced, drained."""

from __future__ import annotations

import threading
import time

from otel_tunix.pipeline.batch_queue import BatchQueue


def _queue(**kwargs: object) -> tuple[BatchQueue[int], list[list[int]], list[str]]:
    batches: list[list[int]] = []
    threads: list[str] = []

    def handle(batch: list[int]) -> None:
        threads.append(threading.current_thread().name)
        batches.append(list(batch))

    options: dict[str, object] = {
        "name": "test-queue", "capacity": 100, "max_batch": 4, "interval_sec": 60.0,
    }  # fmt: skip
    options.update(kwargs)
    return BatchQueue(handle, **options), batches, threads  # type: ignore[arg-type]


def test_a_full_queue_drops_and_counts_by_weight_and_never_blocks() -> None:
    q, batches, _ = _queue(capacity=10, weight=lambda n: n, max_batch=100)
    assert q.offer([4, 4, 3, 2]) == [3]  # 4 + 4 fit, 3 does not, 2 still does
    assert q.dropped == 3
    assert q.put(5) is False and q.dropped == 8
    assert q.close(5.0)
    assert batches == [[4, 4, 2]]
    assert q.put(1) is False  # closed: dropped too
    assert q.dropped == 9


def test_batches_hold_at_most_max_batch_and_a_heavy_item_comes_alone() -> None:
    q, batches, threads = _queue(weight=lambda n: n, max_batch=5)
    q.offer([2, 2, 2, 9, 1, 1])
    assert q.close(5.0)
    assert batches == [[2, 2], [2], [9], [1, 1]]
    assert set(threads) == {"test-queue"}


def test_the_head_waits_until_ready_and_closing_forces_it() -> None:
    ready = {1: False, 2: True}
    forced: list[int] = []

    def is_ready(item: int, force: bool) -> bool:
        if force and not ready[item]:
            forced.append(item)
        return ready[item] or force

    q, batches, _ = _queue(ready=is_ready, interval_sec=0.01)
    q.put(1)
    q.put(2)
    assert not q.flush(0.2)  # the head is not ready: nothing is handled
    assert batches == []
    assert q.flush(0.2, pending=lambda item: ready[item])  # nothing flushable is queued
    ready[1] = True
    q.wake()
    assert q.flush(5.0)
    assert batches == [[1, 2]]
    ready[3] = False
    q.put(3)
    assert q.close(5.0)
    assert batches[-1] == [3] and forced == [3]


def test_drain_here_handles_on_the_calling_thread_and_after_batch_follows() -> None:
    after: list[int] = []
    q, batches, threads = _queue(after_batch=lambda: after.append(len(batches)))
    q.offer([1, 2, 3, 4, 5])  # a full batch wakes the thread: let it finish first
    assert q.flush(5.0)
    q.offer([6, 7])
    assert q.drain_here(5.0)
    assert [n for b in batches for n in b] == [1, 2, 3, 4, 5, 6, 7]
    assert threads[-1] == threading.current_thread().name
    assert after and after[-1] == len(batches)
    assert q.close(5.0)


def test_a_handler_that_hangs_does_not_hold_close_past_its_timeout() -> None:
    release = threading.Event()
    q = BatchQueue(
        lambda batch: release.wait(5.0),
        name="hangs", capacity=10, max_batch=1, interval_sec=0.01,
    )  # fmt: skip
    q.put(1)
    time.sleep(0.05)
    t0 = time.monotonic()
    assert q.close(0.1) is False
    assert time.monotonic() - t0 < 1.0
    release.set()


def test_restart_gives_an_empty_queue_and_a_new_thread() -> None:
    q, batches, _ = _queue()
    q.put(1)
    q.restart()  # what a forked child does: the parent's items are not its own
    assert len(q) == 0 and not q.closed
    q.put(2)
    assert q.close(5.0)
    assert batches == [[2]]
