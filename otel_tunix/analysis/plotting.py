"""Metric plots from one or several runs' metrics JSONL files (matplotlib).

The CLI (``otel-tunix plot``) and ``notebooks/metrics_viewer.ipynb`` use the same
functions: :func:`~otel_tunix.analysis.readers.read_jsonl` →
:func:`~otel_tunix.analysis.metrics.filter_metrics` →
:func:`~otel_tunix.analysis.metrics.moving_average` → :func:`plot_metrics` →
:func:`save_plot`. :func:`load_runs`, :func:`render` and :func:`watch` string them together
for the CLI, ``--live`` included.

Alerts are marked on the plot: :func:`read_marks` reads the ``alerts*.jsonl`` beside a run's
metrics file (what the alert engine writes, one line per transition) and every alert that
*fired* is drawn on the panel of the metric it names, at its step: a dashed vertical line and
its message. That is also how a program explains a point of its own curve (the demo's loss
spike): it records an alert on that metric and step.

matplotlib is imported inside the functions; figures are plain
:class:`matplotlib.figure.Figure` objects (no pyplot state) unless the caller passes one in.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from otel_tunix.analysis.metrics import (
    _FAMILIES,
    _LEAF,
    default_metrics,
    filter_metrics,
    moving_average,
    resolve_metrics,
)
from otel_tunix.analysis.readers import (
    AnalysisError,
    MetricsTable,
    listed,
    loads_record,
    name_matcher,
    resolve_metrics_file,
)

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from matplotlib.figure import Figure

__all__ = [
    "DEFAULT_MAX_POINTS",
    "Mark",
    "PlotSpec",
    "alerts_file",
    "load_runs",
    "plot_metrics",
    "read_marks",
    "render",
    "save_plot",
    "watch",
]

DEFAULT_MAX_POINTS = 5000
"""Points drawn per line at most; longer series are thinned to every k-th point (the last
point always kept) after smoothing, which keeps plotting fast for multi-GB files."""

_TIME_KEY = "time"


def _labels(frames: Sequence[pd.DataFrame], labels: Sequence[str] | None) -> list[str]:
    if labels is not None:
        if len(labels) != len(frames):
            raise AnalysisError(f"{len(labels)} labels for {len(frames)} runs")
        names = [str(x) for x in labels]
    else:
        runs = [str(df.attrs.get("run") or f"run {i + 1}") for i, df in enumerate(frames)]
        services = [_service(df) for df in frames]
        names = [
            run if not svc else svc if services.count(svc) == 1 else f"{svc} · {run}"
            for run, svc in zip(runs, services, strict=True)
        ]
    seen: dict[str, int] = {}
    out = []
    for name in names:  # two runs of the same name still get two legend entries
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name} ({seen[name]})")
    return out


def _service(df: pd.DataFrame) -> str:
    """The service a run's metrics file names in its header (``OTEL_SERVICE_NAME``), or
    ``""`` for none (an older file, the SDK's ``unknown_service`` default)."""
    meta = df.attrs.get("meta") or {}
    svc = meta.get("service") if isinstance(meta, dict) else None
    return svc if isinstance(svc, str) and not svc.startswith("unknown_service") else ""


_UNITS = (  # (suffix of a metric name, the y axis label); the first that matches
    ("tokens_per_sec", "tokens/s"),
    ("steps_per_sec", "steps/s"),
    ("tflops_per_sec", "TFLOP/s"),
    ("_per_sec", "1/s"),
    ("_sec", "seconds"),
    ("_bytes", "bytes"),
    ("mfu", "fraction of peak"),
    ("goodput", "fraction of wall time"),
    ("perplexity", "perplexity"),
    ("loss", "loss"),
)


def unit_of(metric: str) -> str:
    """The y axis label of a metric, from its name's unit suffix (``""`` when it has none)."""
    for suffix, unit in _UNITS:
        if metric.endswith(suffix):
            return unit
    return ""


SPARSE_POINTS = 50
"""A line of at most this many points is drawn with a marker on each: a single point, or
a metric logged once per evaluation, is then visible."""


def _thin(x: Any, y: Any, max_points: int | None) -> tuple[Any, Any]:
    n = len(x)
    if not max_points or n <= max_points:
        return x, y
    k = math.ceil(n / max_points)
    idx = list(range(0, n, k))
    if idx[-1] != n - 1:
        idx.append(n - 1)
    return x[idx], y[idx]


@dataclass(frozen=True)
class Mark:
    """A point of a run to mark on the panel of ``metric``: an alert that fired."""

    metric: str
    step: int | None
    time: float | None
    """Unix seconds."""
    text: str
    short: str = ""
    """The label where a panel has several marks: the rule and the step."""


_SEVERITY_ORDER = {"ok": 0, "warning": 1, "critical": 2}
_MARK_CHARS = 90
"""Longer messages are cut on the plot (the whole one is in the alerts file)."""


def alerts_file(metrics_path: Path) -> Path:
    """The alerts file beside a metrics file: ``metrics<suffix>.jsonl[.gz]`` →
    ``alerts<suffix>.jsonl`` (the rank suffix kept), any other name → ``alerts.jsonl``."""
    name = metrics_path.name.removesuffix(".gz")
    if name.startswith("metrics") and name.endswith(".jsonl"):
        return metrics_path.with_name("alerts" + name[len("metrics") :])
    return metrics_path.with_name("alerts.jsonl")


def read_marks(metrics_path: str | os.PathLike[str]) -> list[Mark]:
    """The alerts that fired in the run of ``metrics_path`` (see :func:`alerts_file`; none if
    there is no such file: it is made only when an alert fires). Resolutions are not marks;
    lines that are not alert records are skipped."""
    path = alerts_file(Path(metrics_path))
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return []
    marks = []
    for line in lines:
        rec = loads_record(line)  # None: a line cut by a crash, or no JSON a reader takes
        if rec is None or not isinstance(rec.get("tunix.alert.metric"), str):
            continue
        now = _SEVERITY_ORDER.get(str(rec.get("tunix.alert.severity")), 0)
        before = _SEVERITY_ORDER.get(str(rec.get("tunix.alert.previous_severity")), 0)
        if now <= before:
            continue
        step, t = rec.get("tunix.alert.step"), rec.get("time_ns")
        text = str(rec.get("message") or rec.get("tunix.alert.rule") or "alert")
        marks.append(
            Mark(
                metric=rec["tunix.alert.metric"],
                step=step if isinstance(step, int) else None,
                time=t / 1e9 if isinstance(t, int | float) else None,
                text=text if len(text) <= _MARK_CHARS else text[: _MARK_CHARS - 1] + "…",
                short=f"{rec.get('tunix.alert.rule') or 'alert'}"
                + (f" @ {step}" if isinstance(step, int) else ""),
            )
        )
    return marks


MAX_MARK_LABELS = 6
"""Alert labels written on one panel at most (each mark keeps its line; the rest are
counted in the last label)."""


def _draw_marks(ax: Any, marks: Sequence[Mark], x_key: str, t0: float) -> None:
    """Each mark a dashed line; its label one row lower than the previous one's, clipped
    to the panel, short (the rule and step) when the panel has more than one."""
    labelled = 0
    for m in marks:
        x: float | None
        if x_key == _TIME_KEY:
            x = None if m.time is None else m.time - t0
        else:
            x = m.step if x_key == "step" else None
        if x is None:  # no position on this x axis
            continue
        ax.axvline(x, color="tab:red", linestyle="--", linewidth=0.9, alpha=0.8)
        if labelled > MAX_MARK_LABELS:
            continue
        text = m.text if len(marks) == 1 else m.short
        if labelled == MAX_MARK_LABELS:
            text = f"+{len(marks) - MAX_MARK_LABELS} more alerts"
        ax.annotate(
            text,
            xy=(x, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -3 - 9 * labelled),
            textcoords="offset points",
            va="top",
            fontsize=7,
            color="tab:red",
            annotation_clip=True,
            clip_on=True,
        )
        labelled += 1


def plot_metrics(
    frames: pd.DataFrame | Sequence[pd.DataFrame],
    metrics: Sequence[str],
    *,
    x_key: str = "step",
    labels: Sequence[str] | None = None,
    fig: Figure | None = None,
    max_points: int | None = DEFAULT_MAX_POINTS,
    title: str | None = None,
    marks: Sequence[Sequence[Mark]] | None = None,
) -> Figure:
    """One panel per metric, one line per run (legend: the run names), shared x axis.

    Args:
        frames: One frame per run (from :func:`read_jsonl`, usually filtered and smoothed).
        metrics: Column names to draw, one panel each. A run that lacks a metric has no line
            in that panel.
        x_key: The x column; ``time`` (Unix seconds) is drawn as seconds since each run's
            first record, so runs started at different times line up.
        labels: Legend names (default: each frame's ``attrs["run"]``).
        fig: Draw into this figure (cleared first), e.g. a pyplot figure for ``--show``;
            default a new :class:`~matplotlib.figure.Figure`.
        max_points: Thin longer lines to about this many points (``None``: draw all).
        title: Figure title.
        marks: Per run, points to mark (:func:`read_marks`): each on the panel of its
            metric, at its step (``x_key="step"``) or time (``x_key="time"``).

    Returns:
        The figure. ``fig.axes[i].lines[j].get_xydata()`` is exactly what was drawn; a mark
        is a vertical line and a text (``fig.axes[i].texts``).

    Raises:
        AnalysisError: no metrics, or a metric that no frame has.
    """
    from matplotlib.figure import Figure

    runs = [frames] if not isinstance(frames, Sequence) else list(frames)
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    names = _labels(runs, labels)
    if not metrics:
        raise AnalysisError("no metrics to plot")
    missing = [m for m in metrics if not any(m in df.columns for df in runs)]
    if missing:
        have = sorted({c for df in runs for c in df.columns if c != x_key})
        raise AnalysisError(
            f"no run has {', '.join(map(repr, missing))}; columns that exist: "
            f"{listed(have) or 'none'}"
        )
    if fig is None:
        fig = Figure(figsize=(9.0, 0.8 + 2.6 * len(metrics)), layout="constrained")
    else:
        fig.clear()
    if marks is not None and len(marks) != len(runs):
        raise AnalysisError(f"marks for {len(marks)} runs, {len(runs)} runs")
    axes = fig.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
    for ax, metric in zip(axes, metrics, strict=True):
        for i, (df, name) in enumerate(zip(runs, names, strict=True)):
            if metric not in df.columns or x_key not in df.columns:
                continue
            x = df[x_key].to_numpy(dtype=float)
            y = df[metric].to_numpy(dtype=float)
            ok = np.isfinite(x) & np.isfinite(y)  # NaN / Inf are gaps
            if not ok.any():
                continue
            x, y = x[ok], y[ok]
            t0 = float(x[0])
            if x_key == _TIME_KEY:
                x = x - t0
            xs, ys = _thin(x, y, max_points)
            sparse = len(xs) <= SPARSE_POINTS
            ax.plot(xs, ys, label=name, linewidth=1.2, marker="o" if sparse else None, ms=3)
            if marks is not None:
                _draw_marks(ax, [m for m in marks[i] if m.metric == metric], x_key, t0)
        ax.set_title(metric, fontsize=10, loc="left")
        ax.set_ylabel(unit_of(metric), fontsize=8)
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8, loc="best")
    axes[-1].set_xlabel("seconds since the first record" if x_key == _TIME_KEY else x_key)
    if title:
        fig.suptitle(title)
    return fig


def save_plot(fig: Figure, path: str | os.PathLike[str], *, dpi: int = 110) -> Path:
    """Write the figure (format from the suffix, PNG by default) and return the path.

    The file is replaced atomically, so a viewer of a ``--live`` plot never reads half a PNG.
    Parent folders are created.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fmt = p.suffix.lstrip(".").lower() or "png"
    tmp = p.with_name(f".{p.name}.tmp")
    fig.savefig(tmp, format=fmt, dpi=dpi)
    os.replace(tmp, p)
    return p


_DEFAULT_LEAVES = frozenset().union(*(leaves for _, _, leaves in _FAMILIES))


def _default_candidate(name: str) -> bool:
    return _LEAF.split(name)[-1] in _DEFAULT_LEAVES


@dataclass
class PlotSpec:
    """What ``otel-tunix plot`` draws (see :func:`render`)."""

    metrics: Sequence[str] | None = None
    x_key: str = "step"
    smooth: int = 0
    max_points: int | None = DEFAULT_MAX_POINTS
    title: str | None = None


def load_runs(
    inputs: Sequence[str | os.PathLike[str]], spec: PlotSpec | None = None
) -> list[MetricsTable]:
    """Open one :class:`MetricsTable` per input (file, run folder or folder of runs).

    Only the columns the plot needs are kept in memory: ``spec.metrics`` (or, without them,
    the candidates of :func:`default_metrics`) and ``spec.x_key``. Nothing is read yet:
    call ``poll()`` on each table.
    """
    spec = spec or PlotSpec()
    if not inputs:
        raise AnalysisError("no input: give one or more metrics files or run folders")
    wanted = name_matcher(spec.metrics) if spec.metrics else _default_candidate
    x_key = spec.x_key

    def keep(name: str) -> bool:
        return name == x_key or wanted(name)

    return [MetricsTable(resolve_metrics_file(p), keep=keep) for p in inputs]


def _chosen_metrics(tables: Sequence[MetricsTable], spec: PlotSpec) -> list[str]:
    for t in tables:
        if not t.names:
            st = t.stats
            bad = f", {st.bad_lines} not JSON" if st.bad_lines else ""
            others = sorted({n for o in tables for n in o.names})
            also = f"; the other inputs hold: {listed(others)}" if others else ""
            raise AnalysisError(
                f"{t.path}: no metric records ({st.lines} lines read{bad}): the file is empty "
                f"or holds only headers{also}"
            )
    union = list(dict.fromkeys(n for t in tables for n in t.names))
    where = ", ".join(str(t.path) for t in tables)
    if spec.metrics:
        return resolve_metrics(spec.metrics, union, where=where)
    chosen = default_metrics(union)
    if not chosen:
        raise AnalysisError(
            f"none of the common metrics (loss, learning rate, step time, reward) is in "
            f"{where}; pick some with --metrics: {listed(sorted(union))}"
        )
    return chosen


@dataclass
class Rendered:
    """A drawn figure and the data behind it."""

    figure: Figure
    metrics: list[str]
    frames: list[pd.DataFrame]
    """Per run: the x column and the plotted metrics, after smoothing (before thinning)."""


def render(
    tables: Sequence[MetricsTable],
    spec: PlotSpec,
    fig: Figure | None = None,
    *,
    release: bool = False,
) -> Rendered:
    """Filter, smooth and plot what the tables have read so far.

    ``release=True`` hands the tables' columns to the frames instead of copying them (a
    one-shot plot of a large file; see :meth:`MetricsTable.frame`).
    """
    metrics = _chosen_metrics(tables, spec)
    frames = []
    for t in tables:
        if spec.x_key not in t.all_names:
            raise AnalysisError(
                f"{t.path}: no {spec.x_key!r} field for the x axis (--x-key); numeric fields "
                f"that exist: {listed(sorted(t.all_names)) or 'none'}"
            )
    for t in tables:
        df = t.frame(release=release)
        df = filter_metrics(df, metrics, x_key=spec.x_key, missing="ignore")
        frames.append(moving_average(df, spec.smooth))
    figure = plot_metrics(
        frames,
        metrics,
        x_key=spec.x_key,
        fig=fig,
        max_points=spec.max_points,
        title=spec.title or (f"moving average over {spec.smooth}" if spec.smooth > 1 else None),
        marks=[read_marks(t.path) for t in tables],
    )
    return Rendered(figure, metrics, frames)


def watch(
    tables: Sequence[MetricsTable],
    spec: PlotSpec,
    *,
    out: str | os.PathLike[str] | None = None,
    interval: float = 2.0,
    fig: Figure | None = None,
    stop: Callable[[], bool] | None = None,
    on_update: Callable[[Rendered], None] | None = None,
    on_error: Callable[[AnalysisError], None] | None = None,
    pause: Callable[[float], None] = time.sleep,
) -> Rendered | None:
    """Re-render whenever a file grows, until ``stop()`` is true (or Ctrl-C).

    Each round polls every table (only the new bytes of a plain file are read), and when
    one of them has new records redraws into ``fig`` and writes ``out`` (if given). Files
    with no metric records yet are waited for.

    Args:
        on_error: Called with the error when the data read so far cannot be plotted yet (a
            metric not logged yet); the watch goes on. Default: the error is raised.
        pause: How to wait between rounds: ``time.sleep`` for a file, ``plt.pause`` to keep
            a pyplot window responsive.

    Returns:
        The last rendering (``None`` if there never was anything to plot).
    """
    last: Rendered | None = None
    try:
        while True:
            new = sum(t.poll(final=False) for t in tables)
            if new and all(t.names for t in tables):
                try:
                    last = render(tables, spec, fig=fig)
                except AnalysisError as exc:
                    if on_error is None:
                        raise
                    on_error(exc)
                else:
                    if out is not None:
                        save_plot(last.figure, out)
                    if on_update is not None:
                        on_update(last)
            if stop is not None and stop():
                break
            pause(interval)
    except KeyboardInterrupt:
        pass
    return last
