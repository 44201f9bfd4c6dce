"""The goodput categories of components: declared, by name, by kind."""

from __future__ import annotations

import pytest

from otel_tunix.accounting import categories as cat


@pytest.mark.parametrize(
    ("name", "blocked", "expected"),
    [
        ("checkpoint_restore", False, cat.CHECKPOINT_RESTORE),
        ("load_checkpoint", True, cat.CHECKPOINT_RESTORE),
        ("checkpoint_save", False, cat.CHECKPOINT_SAVE),
        ("save_pretrained", False, cat.CHECKPOINT_SAVE),
        ("eval_step_compute", False, cat.EVALUATION),
        ("jax_compile", False, cat.COMPILATION),
        ("jax_trace", False, cat.COMPILATION),
        ("torch_compile", False, cat.COMPILATION),
        ("weight_sync", False, cat.WEIGHT_SYNC),
        ("rollout_wait", True, cat.ROLLOUT_WAIT),
        ("train_data_load", True, cat.DATA_STALL),
        ("forward", False, cat.PRODUCTIVE),
        ("rollout", False, cat.PRODUCTIVE),
        ("all_reduce", True, cat.OTHER),
    ],
)
def test_components_are_classified_by_name_then_kind(
    name: str, blocked: bool, expected: str
) -> None:
    assert cat.classify(name, blocked) == expected


def test_a_declared_or_recorded_category_wins_over_the_name() -> None:
    assert cat.classify("my_writer", False) == cat.PRODUCTIVE
    cat.declare("my_writer", cat.CHECKPOINT_SAVE)
    try:
        assert cat.declared("my_writer") == cat.CHECKPOINT_SAVE
        assert cat.classify("my_writer", False) == cat.CHECKPOINT_SAVE  # cache cleared
        assert cat.classify("my_writer", False, cat.EVALUATION) == cat.EVALUATION
    finally:
        cat._declared.pop("my_writer", None)
        cat.classify.cache_clear()


def test_an_unknown_category_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"'chekpoint'.*checkpoint_save"):
        cat.declare("x", "chekpoint")
    with pytest.raises(ValueError, match="wasted_progress"):  # a job-level category
        cat.check_category(cat.WASTED_PROGRESS)
    assert cat.declared("x") is None


def test_precedence_puts_waits_after_productive_work() -> None:
    p = cat.PRECEDENCE
    assert p.index(cat.CHECKPOINT_SAVE) < p.index(cat.PRODUCTIVE) < p.index(cat.DATA_STALL)
    assert p.index(cat.PRODUCTIVE) < p.index(cat.ROLLOUT_WAIT)
    assert set(cat.BADPUT) == (set(p) - {cat.PRODUCTIVE}) | {cat.WASTED_PROGRESS, cat.RESTART_GAP}


def test_intervals_take_the_first_category_in_precedence_and_the_rest_is_given() -> None:
    ms = 1_000_000
    got = cat.categorize_intervals(
        0,
        100 * ms,
        [
            (cat.DATA_STALL, 0, 30 * ms),  # 0-10 alone, 10-30 under productive work
            (cat.PRODUCTIVE, 10 * ms, 50 * ms),
            (cat.CHECKPOINT_SAVE, 40 * ms, 60 * ms),  # wins 40-60
            (cat.OTHER, 90 * ms, 120 * ms),  # clipped at the window's end
        ],
    )
    assert got == pytest.approx(
        {
            cat.DATA_STALL: 0.010,
            cat.PRODUCTIVE: 0.030 + 0.030,
            cat.CHECKPOINT_SAVE: 0.020,
            cat.OTHER: 0.010,
        }
    )
    between = cat.categorize_intervals(0, 10 * ms, [], rest=cat.OTHER)
    assert between == pytest.approx({cat.OTHER: 0.010})
