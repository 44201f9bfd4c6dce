"""The goodput ledger engine (``otel_tunix.accounting.ledger``) on hand-made inputs, in whole
seconds:
each figure is the arithmetic of docs/goodput.md done by hand."""

from __future__ import annotations

import pytest

from otel_tunix.accounting import categories as cat
from otel_tunix.accounting.ledger import Compilations, Ledger
from otel_tunix.settings.attributes import COMPILE_TRIGGER, LAZY_BACKWARD

S = 1_000_000_000


def _bad(engine: Ledger) -> dict[str, float]:
    f = engine.figures()
    assert f.productive_sec + sum(f.badput_sec.values()) == pytest.approx(f.wall_time_sec)
    return {k: v for k, v in f.badput_sec.items() if v} | {"productive": f.productive_sec}


def test_steps_gaps_and_the_stretch_before_the_first_step() -> None:
    engine = Ledger(0)
    engine.add_step("train", 0, 2 * S, 4 * S, [(cat.DATA_STALL, 2 * S, 3 * S)])
    engine.add_step("train", 1, 5 * S, 6 * S, [(cat.PRODUCTIVE, 5 * S, 6 * S)])
    engine.finish()
    assert engine.figures().wall_time_sec == pytest.approx(6.0)
    assert _bad(engine) == {
        cat.INITIALIZATION: 2.0,
        cat.DATA_STALL: 1.0,
        cat.OTHER: 1.0,
        "productive": 2.0,
    }


def test_a_component_beside_the_steps_handed_on_late_weighs_the_stretches_again() -> None:
    """A writer from 3 s to 9 s, beside steps [2, 4], [5, 7], [8, 10], handed on after the
    time was settled: its time outside the steps (4-5, 7-8) is checkpoint_save."""
    engine = Ledger(2 * S)
    for n, a in enumerate((2, 5, 8)):
        engine.add_step("train", n, a * S, (a + 2) * S, [])
    engine.settle(10 * S)
    assert _bad(engine) == {cat.OTHER: 2.0, "productive": 6.0}
    engine.add_beside(cat.CHECKPOINT_SAVE, 3 * S, 9 * S)
    engine.finish()
    assert _bad(engine) == {cat.CHECKPOINT_SAVE: 2.0, "productive": 6.0}


def test_work_past_the_window_and_the_writer_after_the_last_step() -> None:
    """A step's own work running on the device 1 s past its window is productive there;
    a checkpoint written once the device is done is checkpoint_save, and the wall reaches
    its end (where both run, the precedence gives the checkpoint the instant)."""
    engine = Ledger(0)
    engine.add_step("train", 0, 0, 2 * S, [(cat.PRODUCTIVE, 0, 3 * S)])
    engine.add_beside(cat.CHECKPOINT_SAVE, 3 * S, S // 2 * 9)
    engine.finish()
    assert engine.figures().wall_time_sec == pytest.approx(4.5)
    assert _bad(engine) == {cat.CHECKPOINT_SAVE: 1.5, "productive": 3.0}


def test_sampling_steps_between_recorded_ones_and_their_timed_badput() -> None:
    """Steps 0 and 10 recorded, 1-9 not: the time between is step time, less the 1.5 s
    their checkpoint took; the steps after step 10 run to the scope's last end."""
    engine = Ledger(0, sampled=True)
    engine.scope_first("train", 0)
    engine.add_step("train", 0, 0, S, [])
    engine.add_step("train", 10, 10 * S, 11 * S, [])
    engine.add_unsampled("train", {cat.CHECKPOINT_SAVE: 1.5})
    engine.scope_last("train", 14 * S)
    engine.finish()
    assert _bad(engine) == {cat.CHECKPOINT_SAVE: 1.5, "productive": 12.5}
    assert engine.figures().scopes["train"] == {cat.PRODUCTIVE: 0.5, cat.CHECKPOINT_SAVE: 1.5}


def test_overlapping_steps_a_wait_beside_productive_work_costs_nothing() -> None:
    """An RL learner waits for rollouts 0-4 s while the actor computes 0-2 s: the wait is
    rollout_wait only where the actor is idle; each scope keeps its own figures."""
    engine = Ledger(0)
    engine.add_step("rl/actor", 0, 0, 2 * S, [(cat.PRODUCTIVE, 0, 2 * S)])
    engine.add_step("rl/learner", 0, 0, 5 * S, [(cat.ROLLOUT_WAIT, 0, 4 * S)])
    engine.finish()
    assert _bad(engine) == {cat.ROLLOUT_WAIT: 2.0, "productive": 3.0}
    assert engine.figures().scopes["rl/learner"] == {cat.ROLLOUT_WAIT: 4.0, cat.PRODUCTIVE: 1.0}


def test_evaluation_steps_and_wasted_steps_are_whole() -> None:
    engine = Ledger(0)
    engine.add_step("train", 0, 0, S, [], wasted=True)
    engine.add_step("eval", 0, S, 3 * S, [(cat.PRODUCTIVE, S, 3 * S)])
    engine.add_step("train", 1, 3 * S, 4 * S, [(cat.CHECKPOINT_SAVE, 3 * S, 4 * S)])
    engine.finish()
    assert _bad(engine) == {
        cat.WASTED_PROGRESS: 1.0,
        cat.EVALUATION: 2.0,
        cat.CHECKPOINT_SAVE: 1.0,
        "productive": 0.0,
    }


def test_compilations_the_outermost_and_not_a_lazy_backward() -> None:
    count = Compilations()
    count.add(
        [
            ("torch_compile", cat.COMPILATION, 1, 0, None),
            ("inductor_compile", cat.COMPILATION, 2, 1, None),  # inside the first: the same
            ("jax_trace", cat.COMPILATION, 3, 0, None),  # a phase, not a compilation
            ("torch_compile", cat.COMPILATION, 4, 0, {COMPILE_TRIGGER: LAZY_BACKWARD}),
            ("torch_compile", cat.COMPILATION, 5, 0, {COMPILE_TRIGGER: "dynamo"}),
        ],
        siblings=True,
    )
    assert count.count == 2
