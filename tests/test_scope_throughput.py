"""A scope's steps per second come from its own time, not from the run's span."""

from __future__ import annotations

import threading

import otel_tunix
from otel_tunix.testing import capture

MS = 1_000_000


class _Clock:
    """A clock the test moves by hand (ns)."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def test_an_eval_scope_between_training_steps_gets_its_own_rate() -> None:
    clock = _Clock()
    truth = {"train": 0, "eval": 0}  # the time each scope's own steps and gaps cover
    last: tuple[str, int] | None = None  # scope and end of the step that ended last

    def run_step(scope: str, n: int, length_ns: int, gap_ns: int) -> None:
        nonlocal last
        start = clock.now
        with otel_tunix.step(n, scope=scope):
            clock.now += length_ns
        truth[scope] += clock.now - (last[1] if last and last[0] == scope else start)
        last = (scope, clock.now)
        clock.now += gap_ns

    perf = otel_tunix.PerformanceMetricsConfig(sampling_rate=2)
    with capture(clock=clock, perf=perf) as cap:
        for r in range(3):
            for i in range(5):
                run_step("train", 5 * r + i, 10 * MS, 1 * MS)
            for j in range(3):
                run_step("eval", 3 * r + j, 2 * MS, MS // 2)
        sessions = {s.scope: s for s in otel_tunix.shutdown()}
        del cap
    assert truth == {"train": 3 * (5 * 10 + 4 * 1) * MS, "eval": 3 * (3 * 2 * MS + 2 * MS // 2)}
    train, ev = sessions["train"], sessions["eval"]
    assert (train.steps, ev.steps) == (15, 9)
    assert ev.active_time_sec == truth["eval"] * 1e-9
    assert ev.steps_per_sec == 9 / (truth["eval"] * 1e-9)  # 428.6 steps/s
    assert train.steps_per_sec == 15 / (truth["train"] * 1e-9)
    # The span of the whole run would have given the eval scope a sixth of its rate.
    assert ev.wall_time_sec > 6 * ev.active_time_sec
    assert ev.to_json()["active_time_sec"] == ev.active_time_sec


def test_scopes_on_two_threads_keep_their_gaps() -> None:
    """An actor and a learner stepping concurrently on their own threads: each scope's
    consecutive steps on its thread count with the gaps between them."""
    clock = _Clock()
    lock = threading.Lock()
    barrier = threading.Barrier(2)

    def loop(scope: str) -> None:
        for n in range(4):
            barrier.wait()
            with lock:
                with otel_tunix.step(n, scope=scope):
                    clock.now += 3 * MS
                clock.now += MS

    with capture(clock=clock):
        threads = [threading.Thread(target=loop, args=(s,)) for s in ("rl/actor", "rl/learner")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sessions = {s.scope: s for s in otel_tunix.shutdown()}
    for scope in ("rl/actor", "rl/learner"):
        s = sessions[scope]
        assert s.steps == 4
        # From its first step's start to its last step's end: the other thread's steps
        # ran in its gaps, on another thread, and do not cut its time.
        assert s.active_time_sec == s.wall_time_sec
