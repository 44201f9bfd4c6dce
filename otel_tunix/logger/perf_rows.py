"""The ``perf/<scope>/...`` scalars of sampled steps, as the MetricsLogger gets them.

:func:`perf_metrics` flattens one :class:`~otel_tunix.model.steps.StepSummary` into Tunix's
names (``perf/<scope>/<component>/busy_time_sec``, ``perf/<scope>/idle_time_sec``, ...),
with the device figures of a step that has device work (``perf/<scope>/device_lag_sec``,
``perf/<scope>/<component>/device_time_sec``) and the background time of a step that other
threads' work overlapped (``perf/<scope>/background_time_sec``).
The worker hands the MetricsLogger a batch of steps as :class:`PerfRows`: a sequence of
``(step, {name: value})`` rows like any other, whose dicts are made on first read (once,
for every backend that reads them). The built-in backends that only count names (the run
summary), watch a few of them (alerts) or keep the last values (the logger itself) read
the summaries through :meth:`PerfRows.runs` and :func:`perf_value` instead, and no dict is
made for them: those dicts were a tenth of a sampled component's cost.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator, Sequence
from typing import overload

from otel_tunix.model.steps import StepSummary

_STEP_LEAVES = ("step_time_sec", "busy_time_sec", "blocked_time_sec", "idle_time_sec")
_DEVICE_LAG_LEAF = "device_lag_sec"
_BACKGROUND_LEAF = "background_time_sec"
_COMPONENT_LEAVES = ("busy_time_sec", "blocked_time_sec", "device_time_sec")
_MAX_NAMES = 4096
"""Names (and layouts) kept per scope: names made up per step would otherwise pile up."""


class _ScopeNames(dict[str, tuple[str, ...]]):
    """The ``perf/<scope>/...`` metric names of one scope, made once each (a handful per
    run) instead of formatted per step: ``step`` holds the step's four names and
    ``device_lag`` its device lag's; the dict maps a component to its busy, blocked and
    device time names (one lookup per component and step); ``fields`` maps each name back
    to where its value is (``(None, i)``: the step's i-th value, ``(component, i)``: the
    component's, 2 being its device time)."""

    def __init__(self, scope: str) -> None:
        super().__init__()
        self.prefix = f"perf/{scope}/"
        self.step = tuple(self.prefix + leaf for leaf in _STEP_LEAVES)
        self.device_lag = self.prefix + _DEVICE_LAG_LEAF
        self.background = self.prefix + _BACKGROUND_LEAF
        self.fields: dict[str, tuple[str | None, int]] = {}
        self._index_step()

    def _index_step(self) -> None:
        self.fields.update((name, (None, i)) for i, name in enumerate(self.step))
        self.fields[self.device_lag] = (None, len(self.step))
        self.fields[self.background] = (None, len(self.step) + 1)

    def __missing__(self, component: str) -> tuple[str, ...]:
        if len(self) >= _MAX_NAMES:
            self.clear()
            self.fields.clear()
            self._index_step()
        names = self[component] = tuple(
            f"{self.prefix}{component}/{leaf}" for leaf in _COMPONENT_LEAVES
        )
        self.fields.update((name, (component, i)) for i, name in enumerate(names))
        return names


_NAMES: dict[str, _ScopeNames] = {}


def _scope_names(scope: str) -> _ScopeNames:
    names = _NAMES.get(scope)
    if names is None:
        if len(_NAMES) >= _MAX_NAMES:
            _NAMES.clear()
        names = _NAMES[scope] = _ScopeNames(scope)
    return names


def _step_values(summary: StepSummary) -> tuple[float, float, float, float, float, float]:
    """The step's own values, in the order of ``_STEP_LEAVES``, then its device lag and its
    background time."""
    return (
        summary.step_time_sec,
        summary.busy_time_sec,
        summary.blocked_time_sec,
        summary.idle_time_sec,
        summary.device_lag_sec,
        summary.background_time_sec,
    )


def perf_metrics(summary: StepSummary) -> dict[str, float]:
    """The Tunix-style ``perf/<scope>/...`` scalars of one step.

    A component logs its busy time, and its blocked time when it has some; one that only
    waited logs its blocked time alone. A step with device work also logs its device lag,
    and each component that ended on the device its device time (start to device end).
    """
    names = _scope_names(summary.scope)
    out = dict(zip(names.step, _step_values(summary), strict=False))
    if summary.background_times:  # other threads' work ran in the step
        out[names.background] = summary.background_time_sec
    for name, (c_busy_sec, c_blocked_sec, _) in summary.component_times.items():
        c_busy, c_blocked, _ = names[name]
        if c_busy_sec or not c_blocked_sec:
            out[c_busy] = c_busy_sec
        if c_blocked_sec:
            out[c_blocked] = c_blocked_sec
    device_times = summary.device_times
    if device_times:
        out[names.device_lag] = summary.device_lag_sec
        for name, seconds in device_times.items():
            out[names[name][2]] = seconds
    return out


_BUSY, _BLOCKED = operator.itemgetter(0), operator.itemgetter(1)
_LAYOUTS: dict[tuple[object, ...], tuple[str, ...]] = {}
"""The names of :func:`perf_metrics`, by what they depend on (see :func:`perf_names`)."""


def perf_names(summary: StepSummary) -> tuple[str, ...]:
    """The names of ``perf_metrics(summary)``, in order, without making the dict.

    They depend on the scope, the component names in order, for a component that waited
    on which of its busy and blocked times is nonzero, and on the components that ended
    on the device: that is the key they are kept under (a loop makes the same few layouts
    step after step).
    """
    times = summary.component_times
    values = times.values()
    device = summary.device_times
    if summary.background_times:  # rare: keyed by what it depends on, made each time
        return tuple(perf_metrics(summary))
    if any(map(_BLOCKED, values)):  # a component waited: its names depend on its values
        key: tuple[object, ...] = (
            summary.scope,
            tuple(times),
            tuple(map(bool, map(_BUSY, values))),
            tuple(map(bool, map(_BLOCKED, values))),
            tuple(device) if device else None,
        )
    elif device:
        key = (summary.scope, tuple(times), tuple(device))
    else:  # every component logs its busy time alone
        key = (summary.scope, tuple(times))
    names = _LAYOUTS.get(key)
    if names is None:
        if len(_LAYOUTS) >= _MAX_NAMES:  # names made up per step
            _LAYOUTS.clear()
        names = _LAYOUTS[key] = tuple(perf_metrics(summary))
    return names


def perf_value(summary: StepSummary, name: str) -> float:
    """The value ``perf_metrics(summary)[name]`` without making the dict, for a name of
    ``perf_names(summary)`` (a leaf the step does not log reads as its value all the same).

    Raises:
        KeyError: ``name`` is no perf name of the step's scope and components.
    """
    found = _scope_names(summary.scope).fields.get(name)
    if found is None:  # forgotten since (names made up per step, past the bound), or none
        return perf_metrics(summary)[name]
    component, i = found
    if component is None:
        return _step_values(summary)[i]
    if i == 2:  # a device time
        return (summary.device_times or {})[component]
    times = summary.component_times.get(component)
    if times is None:
        raise KeyError(name)
    return times[i]


class PerfRows(Sequence[tuple[int, dict[str, float]]]):
    """The ``perf/<scope>/...`` rows of a batch of step summaries, in order: ``(step,
    perf_metrics(summary))``, each dict made on first read and kept for the next reader.

    What :meth:`MetricsLogger.log_rows <otel_tunix.MetricsLogger.log_rows>` gets from the
    worker. Any backend may read it as rows; one that knows this type can read
    :attr:`summaries` through :meth:`runs` and :func:`perf_value` instead.
    """

    __slots__ = ("_rows", "_runs", "summaries")

    def __init__(self, summaries: Sequence[StepSummary]) -> None:
        self.summaries = summaries
        self._rows: list[tuple[int, dict[str, float]]] | None = None
        self._runs: list[tuple[tuple[str, ...], list[StepSummary]]] | None = None

    def _made(self) -> list[tuple[int, dict[str, float]]]:
        rows = self._rows
        if rows is None:
            rows = self._rows = [(s.step, perf_metrics(s)) for s in self.summaries]
        return rows

    def __len__(self) -> int:
        return len(self.summaries)

    @overload
    def __getitem__(self, index: int) -> tuple[int, dict[str, float]]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[int, dict[str, float]]]: ...

    def __getitem__(
        self, index: int | slice
    ) -> tuple[int, dict[str, float]] | list[tuple[int, dict[str, float]]]:
        return self._made()[index]

    def __iter__(self) -> Iterator[tuple[int, dict[str, float]]]:
        return iter(self._made())

    def runs(self) -> list[tuple[tuple[str, ...], list[StepSummary]]]:
        """Runs of consecutive summaries whose rows have the same names, with those names:
        what ``itertools.groupby(rows, row_names)`` gives, without making the rows (found
        on first call and kept for the next reader)."""
        runs = self._runs
        if runs is None:
            groups = itertools.groupby(self.summaries, perf_names)
            runs = self._runs = [(names, list(run)) for names, run in groups]
        return runs
