"""Choosing and smoothing metric columns of the frames that :func:`read_jsonl` returns."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal

from otel_tunix.analysis.readers import X_KEYS, AnalysisError, listed, name_matcher

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "default_metrics",
    "filter_metrics",
    "metric_names",
    "moving_average",
    "resolve_metrics",
]

_LEAF = re.compile(r"[./]")


def metric_names(df: pd.DataFrame) -> list[str]:
    """The metric columns of a frame (the position keys ``step``/``time``/``epoch`` left
    out); for a frame read with a selection, every name the file holds (``attrs["names"]``)."""
    names = df.attrs.get("names")
    if isinstance(names, list) and names:
        return list(names)
    return [c for c in df.columns if c not in X_KEYS]


def _listing(available: Iterable[str]) -> str:
    names = sorted(set(available))
    if not names:
        return "none"
    return listed(names)


def resolve_metrics(
    requested: Sequence[str],
    available: Iterable[str],
    *,
    where: str = "the input",
    known: Iterable[str] | None = None,
) -> list[str]:
    """Expand requested names into existing column names.

    A name matches a column exactly, or as a prefix before ``.`` or ``/``
    (``perf/train`` gives every ``perf/train/...`` column). ``known`` (default:
    ``available``) is what the error message lists.

    Raises:
        AnalysisError: a requested name matches nothing; the message lists what exists.
    """
    avail = list(dict.fromkeys(available))
    out: list[str] = []
    unknown: list[str] = []
    for name in requested:
        match = name_matcher([name])
        hits = [a for a in avail if match(a)]
        if not hits:
            unknown.append(name)
        out.extend(h for h in hits if h not in out)
    if unknown:
        raise AnalysisError(
            f"unknown metric{'s' if len(unknown) > 1 else ''} {listed([repr(u) for u in unknown])} "
            f"in {where}; metrics that exist: {_listing(avail if known is None else known)}"
        )
    return out


def filter_metrics(
    df: pd.DataFrame,
    metrics: Sequence[str],
    *,
    x_key: str = "step",
    missing: Literal["raise", "ignore"] = "raise",
) -> pd.DataFrame:
    """The ``x_key`` column and the columns of ``metrics`` (exact names or prefixes), keeping
    only rows where at least one of them has a value.

    Args:
        df: A frame from :func:`read_jsonl`.
        metrics: Names as written in the file (``loss``, ``train.loss``, ``rewards/mean``) or
            prefixes (``perf/train``).
        x_key: The position column to keep (``step``, ``time``, ``epoch``, or any column).
        missing: ``"raise"``: a name that matches no column is an error; ``"ignore"``: it is
            left out (comparing runs that do not all log the same metrics).

    Raises:
        AnalysisError: unknown metric (listing those that exist) or unknown ``x_key``.
    """
    if isinstance(metrics, str):
        metrics = [metrics]
    where = df.attrs.get("path", "the frame")
    present = [c for c in df.columns if c not in X_KEYS]
    if missing == "raise":
        if not present:
            raise AnalysisError(f"{where}: no metric records (the file is empty or holds none)")
        cols = resolve_metrics(metrics, present, where=where, known=metric_names(df))
    else:
        match = name_matcher(metrics)
        cols = [c for c in present if match(c)]
    if x_key not in df.columns:
        raise AnalysisError(
            f"{where}: no column {x_key!r} for the x axis; columns that exist: "
            f"{_listing(df.columns)}"
        )
    out = df[[x_key, *[c for c in cols if c != x_key]]]
    if cols:
        rows = out[cols].notna().any(axis=1)
        if not rows.all():
            out = out[rows].reset_index(drop=True)
    out.attrs = dict(df.attrs)
    return out


def moving_average(
    df: pd.DataFrame, window: int, columns: Sequence[str] | None = None
) -> pd.DataFrame:
    """Trailing moving average over ``window`` points, per metric column.

    Each column is smoothed over its own values (a column logged every 10th record is not
    diluted by the gaps between); the first points average what there is so far
    (``min_periods=1``). Position columns are left as they are. ``window`` of 0 or 1 returns
    an unchanged copy.

    Raises:
        AnalysisError: ``window`` is negative.
    """
    if window < 0:
        raise AnalysisError(f"the smoothing window must be 0 or more, got {window}")
    out = df.copy(deep=False)  # new columns replace the old ones; df is left as it was
    if window <= 1:
        return out
    cols = [c for c in (columns if columns is not None else df.columns) if c not in X_KEYS]
    for c in cols:
        s = df[c]
        valid = s.notna()
        if valid.all():
            out[c] = s.rolling(window, min_periods=1).mean()
        elif valid.any():  # smooth the values only; the gaps stay gaps
            values = s.to_numpy(dtype=float, copy=True)
            mask = valid.to_numpy()
            values[mask] = s[mask].rolling(window, min_periods=1).mean().to_numpy()
            out[c] = values
    return out


_FAMILIES: tuple[tuple[str, int, frozenset[str]], ...] = (
    ("loss", 2, frozenset({"loss"})),
    ("learning rate", 1, frozenset({"learning_rate", "lr"})),
    ("step time", 1, frozenset({"step_time_sec", "step_time", "step_time_s", "step_time_ms"})),
    ("reward", 1, frozenset({"mean", "reward", "rewards", "reward_mean", "mean_reward"})),
)


def default_metrics(names: Iterable[str]) -> list[str]:
    """The common metrics that exist among ``names``, for a first plot without ``--metrics``.

    Loss (up to two: training and evaluation, leaf name ``loss``), learning rate (``lr``,
    ``learning_rate``), step time (``step_time_sec``, the ``train`` scope first) and reward
    (``reward``, ``rewards/mean``, ...), in that order. Empty when none of them exists.
    """
    avail = list(dict.fromkeys(names))
    out: list[str] = []
    for family, cap, leaves in _FAMILIES:
        hits = [n for n in avail if _LEAF.split(n)[-1] in leaves]
        if family == "reward":
            hits = [n for n in hits if "reward" in n]
        # the training series first: names that say train, or that have no prefix at all
        hits.sort(key=lambda n: 0 if "train" in n or not _LEAF.search(n) else 1)
        out.extend(hits[:cap])
    return out
