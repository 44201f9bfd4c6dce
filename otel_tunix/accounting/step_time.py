"""Busy / blocked / idle accounting of one step, and the per-session totals.

This is the one definition of the counters; the span processor, the Perfetto exporter and
the offline tools all call it, so every backend shows the same numbers.

How time is counted (all intervals are clipped to the step window):

* The step window is the step's **host** window: from its start to its own end (the exit of
  its ``with`` block), so the consecutive steps of a loop tile its wall time. A component
  that outlives it (one that ends at device completion, one in another thread) counts only
  inside it; the span keeps its real end. A step with no end of its own (a window of zero
  length) runs to the end of its last component. A component whose end is before its start
  (a start given after the fact) is empty: it ends at its start.
* **Device** completion is reported apart and never stretches the window: the latest device
  end of the step's components (``device_end_ns``), its lag after the host window
  (``device_lag_sec``), and per component the time from its start to its device end
  (``device_times``).
* At every instant of the window the step is in exactly one state: **busy** if at least one
  busy component is open (on any thread), else **blocked** if at least one blocked component
  is open, else **idle**. ``busy_time_sec``, ``blocked_time_sec`` and ``idle_time_sec`` are
  the lengths of those three sets, so they never overlap and add up to ``step_time_sec``.
  Nested or concurrent busy spans are therefore counted once (the union of their intervals).
* A component's own ``busy_time_sec`` (or ``blocked_time_sec``) is the union of that
  component's intervals of that kind: two overlapping instances of the same component on two
  threads count once, but two different components overlapping each count their full time,
  so component times can add up to more than the step's busy time.
* **Background** work (a component on another thread than the step's that was open at an
  edge of the window: it started before the step, or was still running at its end) is not
  the step's own: it stays out of busy / blocked / idle. Its overlap with the window counts
  in the component's own time in that step (and in every other step it overlaps, the
  caller handing those their part), and the union of the background overlaps is the step's
  ``background_time_sec``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from typing import Any

from otel_tunix.model.steps import (
    BackgroundInterval,
    ComponentRecord,
    Interval,
    SpanInfo,
    StepSummary,
)
from otel_tunix.settings.attributes import BACKGROUND, DEVICE_END, KIND_BLOCKED

_NS = 1e-9


def union_ns(intervals: Iterable[tuple[int, int]]) -> int:
    """Total length of the union of half-open ``(start, end)`` intervals."""
    ordered = sorted(intervals)
    if not ordered:
        return 0
    return _union_clipped([("", False, s, e) for s, e in ordered], ordered[0][0], None)


_by_start = operator.itemgetter(2)


def account_step(
    scope: str,
    step: int,
    start_ns: int,
    end_ns: int,
    spans: Sequence[SpanInfo],
    *,
    trace_id: str = "",
    attributes: Mapping[str, object] | None = None,
) -> StepSummary:
    """Derive the busy / blocked / idle counters of one step from its component spans.

    See the module docstring for the exact rules.
    """
    ordered = sorted(spans, key=lambda s: s.start_ns)
    device_ends = {
        i: s.end_ns for i, s in enumerate(ordered) if s.attributes.get(DEVICE_END) is True
    }
    background = [
        (s.name, s.kind == KIND_BLOCKED, s.start_ns, s.end_ns, 1, s.category)
        for s in ordered
        if s.attributes.get(BACKGROUND) is True
    ]
    return account_intervals(
        scope,
        step,
        start_ns,
        end_ns,
        [
            (s.name, s.kind == KIND_BLOCKED, s.start_ns, s.end_ns)
            for s in ordered
            if not (background and s.attributes.get(BACKGROUND) is True)
        ],
        presorted=True,
        device_ends=device_ends or None,
        spans=spans,
        trace_id=trace_id,
        attributes=attributes,
        background=background or None,
    )


def account_intervals(
    scope: str,
    step: int,
    start_ns: int,
    end_ns: int,
    intervals: Sequence[Interval],
    *,
    presorted: bool = False,
    device_ends: Mapping[int, int] | None = None,
    spans: Sequence[SpanInfo] | Callable[[], Sequence[SpanInfo]] = (),
    trace_id: str | int = "",
    attributes: Mapping[str, object] | None = None,
    background: Sequence[BackgroundInterval] | None = None,
    span_id: int = 0,
) -> StepSummary:
    """:func:`account_step` on plain intervals (``presorted``: they are in start order
    already); ``spans`` may be a factory, called when the spans are first read (one with a
    ``span_json()`` method also gives :meth:`StepSummary.to_json` their JSON dicts);
    ``background``: the background work that overlaps the step (see
    :func:`account_components`)."""
    if not presorted:
        intervals = sorted(intervals, key=_by_start)
    return account_components(
        scope,
        step,
        start_ns,
        end_ns,
        [
            (name, blocked, i, None, s, None, None)
            for i, (name, blocked, s, _) in enumerate(intervals)
        ],
        {i: e for i, (_, _, _, e) in enumerate(intervals)},
        device_ends=device_ends,
        spans=spans,
        trace_id=trace_id,
        attributes=attributes,
        background=background,
        span_id=span_id,
    )


def account_components(
    scope: str,
    step: int,
    start_ns: int,
    end_ns: int,
    components: Sequence[ComponentRecord],
    ends: Mapping[Any, int],
    *,
    device_ends: Mapping[Any, int] | None = None,
    offset: int = 0,
    ends_out: list[int] | None = None,
    spans: Sequence[SpanInfo] | Callable[[], Sequence[SpanInfo]] = (),
    trace_id: str | int = "",
    attributes: Mapping[str, object] | None = None,
    span_id: int = 0,
    background: Sequence[BackgroundInterval] | None = None,
    background_keys: Container[Any] | None = None,
) -> StepSummary:
    """The accounting itself, on components in start order (the worker's path: what the hot
    path recorded, read in one pass).

    A component ends at ``device_ends[key]``, else ``ends[key]``, else at its start; one that
    would end before it starts ends at its start (empty). Those ends, in order, are appended
    to ``ends_out`` when given. ``offset`` is added to the summary's ``start_ns`` / ``end_ns`` (from
    ``perf_counter_ns`` readings to Unix epoch ns); durations do not depend on it.

    ``background``: ``(name, blocked, start, end, count)`` of the background work that
    overlaps the step (clipped here to its window; ``count`` is 1 in the step the component
    belongs to, 0 in the others); the components whose keys are in ``background_keys`` are
    among it, and left out of the step's own accounting (their ends still go to
    ``ends_out``).
    """
    # One pass, in start order: each component's end, the window end, each component's time
    # (taken whole for a component seen once in the step, the usual case; the union of its
    # intervals for one seen more than once, after the loop), and the union of the open
    # intervals as runs (starts clipped to the step's keep the order). Until the first
    # blocked interval, the busy union is that union; from there it is kept apart.
    window_end = end_ns
    if window_end <= start_ns:  # no end of its own: to the end of its last component
        for _, _, key, _, s, _, _ in components:
            e = ends.get(key, s)
            if device_ends is not None:
                e = device_ends.get(key, e)
            if e > window_end:
                window_end = e
    device_end = 0
    device_times: dict[str, float] | None = None
    found: dict[str, tuple[float, float, int]] = {}
    repeated: set[str] | None = None
    ends_list = ends_out if ends_out is not None else []
    first = len(ends_list)
    add_end = ends_list.append
    total = 0
    run_start = run_end = start_ns  # the union of every interval: done runs, open run
    busy_total: int | None = None  # the busy union, once a blocked interval split it off
    busy_start = busy_end = start_ns
    for name, is_blocked, key, _, s, _, _ in components:
        e = ends.get(key, s)
        if device_ends is not None and key in device_ends:
            e = device_ends[key]
            if e > device_end:
                device_end = e
            if device_times is None:
                device_times = {}
            device_times[name] = device_times.get(name, 0.0) + max(0, e - s) * _NS
        if e < s:
            e = s
        add_end(e)  # the span's own end
        if background_keys is not None and key in background_keys:
            continue
        if e > window_end:  # on the host timeline: clipped to the step's window
            e = window_end
        if s < start_ns:
            s = start_ns
        elif s > window_end:
            s = window_end
        if name in found:
            if repeated is None:
                repeated = set()
            repeated.add(name)
        else:
            length = (e - s) * _NS if e > s else 0.0
            found[name] = (0.0, length, 1) if is_blocked else (length, 0.0, 1)
        if e <= s:
            continue
        if is_blocked:
            if busy_total is None:  # the first blocked interval: busy so far = all so far
                busy_total, busy_start, busy_end = total, run_start, run_end
        elif busy_total is not None:
            if s > busy_end:
                busy_total += busy_end - busy_start
                busy_start, busy_end = s, e
            elif e > busy_end:
                busy_end = e
        if s > run_end:
            total += run_end - run_start
            run_start, run_end = s, e
        elif e > run_end:
            run_end = e
    open_ns = total + run_end - run_start
    if busy_total is None:  # nothing blocked
        busy_ns, blocked_ns = open_ns, 0
    else:
        busy_ns = busy_total + busy_end - busy_start
        blocked_ns = open_ns - busy_ns
    wall_ns = window_end - start_ns
    idle_ns = wall_ns - open_ns
    if repeated is not None:
        if len(found) == 1 and busy_total is None and not background_keys:  # one component,
            (name,) = found  # all busy: busy_ns
            found[name] = (busy_ns * _NS, 0.0, len(components))
        else:
            intervals = [
                (n, b, s, min(e, window_end))
                for (n, b, k, _, s, _, _), e in zip(components, ends_list[first:], strict=True)
                if background_keys is None or k not in background_keys
            ]
            for name in repeated:
                group = [iv for iv in intervals if iv[0] == name]
                found[name] = (
                    _union_clipped(group, start_ns, False) * _NS,
                    _union_clipped(group, start_ns, True) * _NS,
                    len(group),
                )
    background_ns = 0
    background_times: dict[str, float] | None = None
    if background:
        background_ns, background_times = _add_background(
            background, start_ns, window_end, found, components, ends_list[first:]
        )
    return StepSummary(  # positionally: ~0.4 us less per step than by keyword
        scope,
        step,
        start_ns + offset,
        window_end + offset,
        wall_ns * _NS,
        busy_ns * _NS,
        blocked_ns * _NS,
        (idle_ns if idle_ns > 0 else 0) * _NS,
        found,
        spans,
        trace_id,
        attributes,
        device_end + offset if device_end else 0,
        device_times,
        span_id,
        background_ns * _NS,
        background_times,
    )


def _add_background(
    background: Sequence[BackgroundInterval],
    start_ns: int,
    window_end: int,
    found: dict[str, tuple[float, float, int]],
    components: Sequence[ComponentRecord],
    ends: Sequence[int],
) -> tuple[int, dict[str, float]]:
    """Background work into the step's figures: each name's overlap with the window into
    its own time in ``found`` (the union with the step's own intervals of that name, if
    any), and the union of every background overlap; returns it and the overlap per name."""
    clipped = sorted(
        ((n, b, max(s, start_ns), min(e, window_end), c) for n, b, s, e, c, _ in background),
        key=_by_start,
    )
    intervals: list[Interval] = [(n, b, s, e) for n, b, s, e, _ in clipped]
    total = _union_clipped(intervals, start_ns, None)
    times: dict[str, float] = {}
    for name in dict.fromkeys(n for n, *_ in clipped):
        mine = [iv for iv in intervals if iv[0] == name]
        count = sum(c for n, _, _, _, c in clipped if n == name)
        times[name] = _union_clipped(mine, start_ns, None) * _NS
        own = found.get(name)
        if own is not None:  # the step's own work of that name too: their union
            count += own[2]
            mine = sorted(
                mine
                + [
                    (n, b, s, min(e, window_end))
                    for (n, b, _, _, s, _, _), e in zip(components, ends, strict=True)
                    if n == name
                ],
                key=_by_start,
            )
        found[name] = (
            _union_clipped(mine, start_ns, False) * _NS,
            _union_clipped(mine, start_ns, True) * _NS,
            count,
        )
    return total, times


def _union_clipped(intervals: Sequence[Interval], start_ns: int, blocked: bool | None) -> int:
    """Length of the union of ``intervals`` (in start order) of one kind (``blocked``; any
    kind when ``None``), starts clipped to ``start_ns``."""
    total = 0
    run_start = run_end = start_ns
    for _, is_blocked, s, e in intervals:
        if blocked is not None and (not is_blocked) is blocked:  # the other kind
            continue
        if s < start_ns:
            s = start_ns
        if e <= s:
            continue
        if s > run_end:
            total += run_end - run_start
            run_start, run_end = s, e
        elif e > run_end:
            run_end = e
    return total + run_end - run_start
