"""The perf rows the worker hands the MetricsLogger: made lazily, read without dicts by the
built-in backends, and seen by every backend exactly as plain rows would be."""

from __future__ import annotations

import random
from typing import Any

import pytest

from otel_tunix import MetricsLogger, MetricsLoggerOptions
from otel_tunix.accounting.step_time import account_intervals
from otel_tunix.logger.backend import LoggingBackend
from otel_tunix.logger.perf_rows import PerfRows, perf_metrics, perf_names, perf_value
from otel_tunix.logger.status import MetricsSummary
from otel_tunix.metrics.alerts import AlertEngine, SpikeRule, ThresholdRule, above
from otel_tunix.model.steps import StepSummary


def _random_steps(n: int, seed: int) -> list[StepSummary]:
    """Steps over a few layouts that repeat (as a loop's do) and change: names in another
    order, a new name, a name seen twice in a step with either kind, a waiting component
    with and without a wait, zero-length components, no component, two scopes."""
    rng = random.Random(seed)
    out = []
    for step in range(n):
        scope = rng.choice(("train", "train", "train", "rl/learner"))
        layout = rng.choice(
            (
                [("load", False), ("wait", True), ("compute", False)],
                [("load", False), ("wait", True), ("compute", False)],
                [("compute", False), ("load", False)],
                [("mixed", False), ("mixed", True)],
                [("mixed", True)],
                [],
                [(f"batch_{rng.randrange(3)}", False), ("wait", True)],
            )
        )
        t, intervals = 0, []
        for name, blocked in layout:
            length = rng.choice((0, 0, 5, 10, 20))  # zero: a wait that did not wait
            intervals.append((name, blocked, t, t + length))
            t += length + rng.choice((0, 3))
        device_ends = {  # some components end on the device, some after the step
            i: e + rng.choice((0, 4, 30))
            for i, (_, _, _, e) in enumerate(intervals)
            if rng.random() < 0.3
        }
        out.append(account_intervals(scope, step, 0, t + 7, intervals, device_ends=device_ends))
    return out


def test_perf_names_and_values_are_those_of_the_dict():
    steps = _random_steps(400, seed=1)
    with_device = [s for s in steps if s.device_times]
    assert with_device and len(with_device) < len(steps)
    for s in with_device:  # the device figures, for the steps that have device work
        values = perf_metrics(s)
        assert values[f"perf/{s.scope}/device_lag_sec"] == s.device_lag_sec
        for name, seconds in s.device_times.items():
            assert values[f"perf/{s.scope}/{name}/device_time_sec"] == seconds
    for s in steps:
        values = perf_metrics(s)
        assert perf_names(s) == tuple(values)
        for name, value in values.items():
            assert perf_value(s, name) == value
        with pytest.raises(KeyError):
            perf_value(s, f"perf/{s.scope}/never_logged/busy_time_sec")


class _Rows(LoggingBackend):
    """A generic backend: keeps the rows it is given (batch entry point)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int | None, dict[str, float]]] = []

    def log_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        raise AssertionError("log_rows is there")

    def log_rows(self, rows: Any, **kwargs: Any) -> None:
        self.rows.extend((step, dict(values)) for step, values in rows)

    def close(self) -> None:
        pass


class _Scalars:
    """A backend with the protocol's one required method only."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float, int | None]] = []

    def log_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        self.seen.append((event, value, kwargs.get("step")))

    def close(self) -> None:
        pass


def _logger() -> tuple[MetricsLogger, dict[str, Any]]:
    parts: dict[str, Any] = {
        "summary": MetricsSummary(),
        "alerts": AlertEngine(
            [
                SpikeRule(
                    "slow", ("perf/*/step_time_sec",), window=5, min_history=3, min_relative=0.2
                ),
                ThresholdRule("waits", ("perf/*/wait/blocked_time_sec",), warning=above(15e-9)),
                ThresholdRule("mixed", ("perf/train/mixed/busy_time_sec",), warning=above(8e-9)),
            ],
            datadog=False,
            console=False,
            span_events=False,
        ),
        "rows": _Rows(),
        "scalars": _Scalars(),
    }
    logger = MetricsLogger(
        MetricsLoggerOptions(
            default_backends=False, backend_factories=[lambda p=p: p for p in parts.values()]
        ),
        rank=0,
    )
    return logger, parts


def test_every_backend_sees_perf_rows_as_the_plain_rows_they_stand_for():
    steps = _random_steps(600, seed=2)
    lazy, lazy_parts = _logger()
    plain, plain_parts = _logger()
    for i in range(0, len(steps), 37):  # the worker's batches
        batch = steps[i : i + 37]
        lazy.log_rows(PerfRows(batch), source="perf")
        plain.log_rows([(s.step, perf_metrics(s)) for s in batch], source="perf")
        assert lazy.last_values == plain.last_values and lazy.last_step == plain.last_step
    assert lazy.last_step == 599
    assert lazy.flush() and plain.flush()  # the test's own backends run on threads of their own
    assert lazy_parts["summary"].counts == plain_parts["summary"].counts
    alerts = [(a.rule, a.metric, a.severity, a.step, a.value) for a in lazy_parts["alerts"].history]
    assert alerts == [
        (a.rule, a.metric, a.severity, a.step, a.value) for a in plain_parts["alerts"].history
    ]
    assert {a[0] for a in alerts} == {"slow", "waits", "mixed"}  # every rule had its say
    assert lazy_parts["rows"].rows == plain_parts["rows"].rows
    assert len(lazy_parts["rows"].rows) == 600
    assert lazy_parts["scalars"].seen == plain_parts["scalars"].seen


def test_names_made_up_per_step_stay_bounded_and_readable(monkeypatch):
    """Components named after their step: the names and layouts kept are bounded, and a
    name forgotten meanwhile still reads right."""
    from otel_tunix.logger import perf_rows

    monkeypatch.setattr(perf_rows, "_MAX_NAMES", 8)
    monkeypatch.setattr(perf_rows, "_NAMES", {})
    monkeypatch.setattr(perf_rows, "_LAYOUTS", {})
    steps = [
        account_intervals("train", i, 0, 50, [(f"batch_{i}", False, 0, 9 + i), ("w", True, 30, 40)])
        for i in range(40)
    ]
    expected = [perf_metrics(s) for s in steps]
    for s, values in zip(steps, expected, strict=True):
        assert perf_names(s) == tuple(values)
        assert len(perf_rows._LAYOUTS) <= 8 and len(perf_rows._NAMES["train"]) <= 8
    for s, values in zip(steps, expected, strict=True):  # most names forgotten since
        assert {name: perf_value(s, name) for name in values} == values


def test_rows_are_made_once_for_all_their_readers():
    steps = _random_steps(5, seed=3)
    rows = PerfRows(steps)
    assert rows._rows is None  # nothing made until read
    first = list(rows)
    assert rows[0] is first[0] and rows[-2:] == first[-2:]
    assert len(rows) == 5 and first == [(s.step, perf_metrics(s)) for s in steps]
