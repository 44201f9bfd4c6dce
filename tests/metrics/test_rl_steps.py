"""The RL learner step added up (``otel_tunix.accounting.rl_steps``): its parts, by name and
by category, sum to the step's wall time, and each lies within the test's own clock."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import pytest

import otel_tunix
from otel_tunix.accounting import rl_steps
from otel_tunix.analysis.breakdown import summarize
from otel_tunix.model.steps import SpanInfo

LEARNER = "rl/learner"
ACTOR = "rl/actor"
MS = 1_000_000


@pytest.mark.parametrize(
    ("name", "blocked", "category", "part"),
    [
        ("rollout", False, None, rl_steps.ROLLOUT),
        ("generate", False, None, rl_steps.ROLLOUT),
        ("rollout_queue_wait", True, None, rl_steps.ROLLOUT_WAIT),
        ("train_queue_wait", True, None, rl_steps.ROLLOUT_WAIT),
        ("rollout_wait", True, None, rl_steps.ROLLOUT_WAIT),
        ("next_batch", True, "data_stall", rl_steps.ROLLOUT_WAIT),
        ("reference_inference", False, None, rl_steps.REFERENCE_INFERENCE),
        ("refer_inference", False, None, rl_steps.REFERENCE_INFERENCE),
        ("old_actor_inference", False, None, rl_steps.OLD_ACTOR_INFERENCE),
        ("actor_train_step", False, None, rl_steps.TRAINING),
        ("backward", False, None, rl_steps.TRAINING),
        ("weight_sync", False, None, rl_steps.WEIGHT_SYNC),
        ("publish", False, "weight_sync", rl_steps.WEIGHT_SYNC),
        ("checkpoint_save", False, None, rl_steps.OTHER),
        ("barrier", True, None, rl_steps.OTHER),
    ],
)
def test_components_fall_into_parts_by_name_then_category(
    name: str, blocked: bool, category: str | None, part: str
) -> None:
    assert rl_steps.rl_part(name, blocked, category) == part


def _span(name: str, start_ms: int, end_ms: int, *, blocked: bool = False) -> SpanInfo:
    return SpanInfo(name, "blocked" if blocked else "busy", start_ms * MS, end_ms * MS)


def test_nested_and_overlapping_components_count_once_by_precedence() -> None:
    spans = [
        _span("rollout_queue_wait", 0, 30, blocked=True),
        _span("rollout", 20, 40),  # the wait overlapping generation is generation
        _span("actor_train_step", 50, 90),
        _span("forward", 55, 70),  # nested: training, once
        _span("weight_sync", 80, 95),  # inside the train step's end: weight_sync wins
    ]
    parts = rl_steps.step_parts(0, 100 * MS, spans)
    assert parts == pytest.approx(
        {
            "rollout": 0.020,
            "rollout_wait": 0.020,
            "reference_inference": 0.0,
            "old_actor_inference": 0.0,
            "training": 0.030,
            "weight_sync": 0.015,
            "other": 0.0,
            "idle": 0.015,  # 40-50 and 95-100
        }
    )
    assert sum(parts.values()) == pytest.approx(0.100)


def test_learner_steps_are_found_by_scope_or_rl_attributes() -> None:
    assert rl_steps.is_learner_step("rl/learner", None)
    assert rl_steps.is_learner_step("grpo/learner", {})
    assert rl_steps.is_learner_step("train", {"tunix.rl.policy_version": 3})
    assert not rl_steps.is_learner_step("rl/actor", {})
    assert not rl_steps.is_learner_step("train", None)


class _Clock:
    """The test's own bookkeeping: each section's time inside and around its block."""

    def __init__(self) -> None:
        self.inner: dict[str, float] = {}
        self.outer: dict[str, float] = {}

    def add(self, part: str, inner: float, outer: float) -> None:
        self.inner[part] = self.inner.get(part, 0.0) + inner
        self.outer[part] = self.outer.get(part, 0.0) + outer


def test_async_actor_learner_loop_adds_up_to_each_learner_step(local_run: Any) -> None:
    torch = pytest.importorskip("torch")
    steps, gen_sec, sleep = 6, 0.03, 0.004
    run = local_run()
    policy = torch.nn.Linear(8, 8)
    actor_weights = {k: v.clone() for k, v in policy.state_dict().items()}
    lock = threading.Lock()
    version = [0]
    q: queue.Queue[tuple[Any, dict[str, Any]]] = queue.Queue(maxsize=1)

    def actor() -> None:  # the actor thread, as docs/rl.md writes it
        for n in range(steps):
            with otel_tunix.step(n, scope=ACTOR):
                with otel_tunix.component("rollout"):
                    with lock:
                        v = version[0]
                        w = actor_weights["weight"].clone()
                    time.sleep(gen_sec)
                    batch = torch.randn(4, 8) @ w
                    lineage = otel_tunix.rl.rollout_context(v)
            q.put((batch, lineage))

    def timed(part: str, clock: _Clock, name: str, fn: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        with otel_tunix.component(name, **kw):
            t1 = time.perf_counter()
            out = fn()
            t2 = time.perf_counter()
        clock.add(part, t2 - t1, time.perf_counter() - t0)
        return out

    opt = torch.optim.SGD(policy.parameters(), lr=0.01)
    clocks: list[_Clock] = []
    walls: list[tuple[float, float]] = []
    thread = threading.Thread(target=actor, name="rl-actor", daemon=True)
    thread.start()
    for m in range(steps):
        clock = _Clock()
        t0 = time.perf_counter()
        with otel_tunix.step(m, scope=LEARNER):
            batch, lineage = timed("rollout_wait", clock, "rollout_queue_wait", q.get, blocked=True)
            otel_tunix.rl.consume(lineage, policy_version=version[0])
            timed("reference_inference", clock, "reference_inference", lambda: time.sleep(sleep))
            timed("old_actor_inference", clock, "old_actor_inference", lambda: time.sleep(sleep))

            def train(b: Any = batch) -> None:
                loss = policy(b).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                time.sleep(sleep)

            timed("training", clock, "actor_train_step", train)
            t1 = time.perf_counter()
            time.sleep(sleep)  # between components: idle
            clock.add("idle", time.perf_counter() - t1, 0.0)

            def sync() -> None:
                with lock:
                    actor_weights.update({k: v.clone() for k, v in policy.state_dict().items()})
                    version[0] += 1
                time.sleep(sleep)

            t2 = time.perf_counter()
            with otel_tunix.rl.weight_sync(nbytes=8 * 9 * 4):
                t3 = time.perf_counter()
                sync()
                t4 = time.perf_counter()
            clock.add("weight_sync", t4 - t3, time.perf_counter() - t2)
            t5 = time.perf_counter()
        walls.append((t5 - t0, time.perf_counter() - t0))
        clocks.append(clock)
    thread.join(timeout=30)
    otel_tunix.shutdown()

    tol = 0.0005  # the two clocks' reading granularity
    logged = {
        r["step"]: r["metrics"]
        for r in run.metrics()
        if "perf/global_step_time" in r.get("metrics", {})
    }
    assert sorted(logged) == list(range(steps))
    names = rl_steps.SCALAR_NAMES
    for m, clock in enumerate(clocks):
        got = logged[m]
        step_time = got["perf/global_step_time"]
        parts = {p: got[names[p]] for p in rl_steps.PARTS}
        assert sum(parts.values()) == pytest.approx(step_time, rel=0.01)
        inner_wall, outer_wall = walls[m]
        assert inner_wall - tol <= step_time <= outer_wall + tol
        for part in ("rollout_wait", "reference_inference", "old_actor_inference", "training"):
            assert clock.inner[part] - tol <= parts[part] <= clock.outer[part] + tol, (m, part)
        assert clock.inner["weight_sync"] - tol <= parts["weight_sync"]
        assert parts["weight_sync"] <= clock.outer["weight_sync"] + tol
        assert parts["weight_sync"] >= sleep and parts["reference_inference"] >= sleep
        # idle: at least the test's sleep between components, at most what is left
        assert parts["idle"] >= clock.inner["idle"] - tol
        assert parts["idle"] <= step_time - sum(clock.inner[p] for p in clock.inner if p != "idle")
        assert parts["rollout"] == 0.0 and parts["other"] == 0.0
    # the first learner step waited for the actor's first generation
    assert logged[0][names["rollout_wait"]] >= gen_sec - tol

    # otel-tunix summary: the parts' means add up to the mean step time
    (rl,) = [x for x in summarize(run.path).rl if x.scope == LEARNER]
    assert rl.breakdown_steps == steps
    mean = {p: sum(logged[m][names[p]] for m in logged) / steps for p in rl_steps.PARTS}
    assert rl.parts_sec == pytest.approx(mean, abs=1e-9)
    assert sum(rl.parts_sec.values()) == pytest.approx(rl.mean_step_sec, rel=0.01)


def test_a_scope_whose_framework_logs_tunix_perf_gets_names_of_its_own(local_run: Any) -> None:
    run = local_run()  # a new run forgets what an earlier one declared
    assert rl_steps.scalar_names(LEARNER) == (rl_steps.STEP_TIME_SCALAR, rl_steps.SCALAR_NAMES)
    rl_steps.declare_framework_perf(LEARNER)  # as the Tunix perf tracer does
    with otel_tunix.step(0, scope=LEARNER):
        with otel_tunix.rl.weight_sync():
            time.sleep(0.002)
    otel_tunix.shutdown()
    (logged,) = [r["metrics"] for r in run.metrics() if "rl/step/step_time" in r.get("metrics", {})]
    assert not any(name.startswith("perf/sum/") for name in logged)
    assert "perf/global_step_time" not in logged and "perf/weight_sync_time" not in logged
    (step,) = run.steps()
    assert logged["rl/step/step_time"] == pytest.approx(step["step_time_sec"])
    assert logged["rl/step/weight_sync_time"] == pytest.approx(
        step["components"]["weight_sync"]["busy_time_sec"]
    )
    parts = sum(logged[f"rl/step/{p}_time"] for p in rl_steps.PARTS)
    assert parts == pytest.approx(step["step_time_sec"], rel=0.01)
    rl_steps.forget_framework_perf()
