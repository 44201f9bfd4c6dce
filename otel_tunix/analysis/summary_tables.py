"""``otel-tunix summary``'s terminal tables.

:func:`render_summary` prints a :class:`~otel_tunix.analysis.breakdown.RunSummary` as
``rich`` tables (the ``cli`` extra; imported only when called).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_tunix.accounting.categories import BADPUT
from otel_tunix.analysis.breakdown import MAD_FACTOR, RLStats, RunSummary
from otel_tunix.analysis.readers import AnalysisError, listed
from otel_tunix.analysis.timeline import Goodput

__all__ = ["dominant_notes", "goodput_table", "render_summary", "rich_table", "table_console"]


# --- terminal rendering ------------------------------------------------------------------------


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f}"


def _pc(x: float) -> str:
    return f"{x * 100:.1f}"


_LEFT = frozenset({"kind", "scope", "grew most (ms)", "folder", "run id"})


def rich_table(title: str, *cols: str) -> Any:
    """A ``rich`` table in the style of the summary's (the ``cli`` extra): the first column
    and the text columns left-aligned, the numbers right-aligned."""
    try:
        from rich import box
        from rich.table import Table
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise AnalysisError("the tables need rich: pip install 'otel-tunix[cli]'") from exc
    t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", title_style="bold")
    for i, col in enumerate(cols):
        t.add_column(col, justify="left" if i == 0 or col in _LEFT else "right", no_wrap=i == 0)
    return t


def rl_parts_table(x: RLStats) -> Any:
    """The table of one RL scope's learner step, added up: each part's mean per step, its
    share, and their sum against the mean step time."""
    t = rich_table(
        f"RL step added up: {x.scope}",
        "part",
        "ms/step",
        "% of step",
    )
    step = x.mean_step_sec
    for part, sec in x.parts_sec.items():
        share = sec / step * 100 if step > 0 else 0.0
        t.add_row(part, _ms(sec), f"{share:.1f}")
    total = sum(x.parts_sec.values())
    t.add_row("sum of parts", _ms(total), f"{total / step * 100:.1f}" if step > 0 else "-")
    t.add_row(f"step time ({x.breakdown_steps} steps)", _ms(step), "100.0", style="bold")
    return t


def table_console() -> Any:
    """A ``rich`` console for the tables: a terminal's own width, and when the output is a
    pipe or a file (``| less``, ``> out.txt``) as wide as the tables are, never cut at 80
    columns."""
    import sys

    from rich.console import Console

    piped = not (hasattr(sys.stdout, "isatty") and sys.stdout.isatty())
    return Console(width=PIPED_WIDTH if piped else None)


PIPED_WIDTH = 1000
"""Columns of a console whose output is not a terminal: wider than any of the tables."""


def goodput_table(g: Goodput, title: str) -> Any:
    """Productive time and each badput category: seconds and % of the wall time."""
    gt = rich_table(title, "where the time went", "seconds", "% of wall")
    gt.add_row("productive", f"{g.productive_sec:.3f}", _pc(g.goodput), style="green")
    for k in BADPUT:
        gt.add_row(k.replace("_", " "), f"{g.badput_sec.get(k, 0.0):.3f}", _pc(g.share(k)))
    return gt


DOMINANT = 0.5
"""A category holding more than this share of the wall time gets a note on what it holds."""

_HOLDS = {
    "initialization": "everything before the first step: imports (torch, transformers, jax), "
    "model building, data set loading; a short run is mostly this, and it does not grow "
    "with the run",
    "data_stall": "waits for the next batch that no busy work overlapped; more DataLoader "
    "workers or prefetching shrink it",
    "other": "time between steps that no component covers, and blocked waits of no "
    "category; component(name, category=...) names it",
    "compilation": "the compilations the integrations recorded (every recompilation too)",
    "evaluation": "evaluation steps and the components of the evaluation category",
    "checkpoint_save": "checkpoint writes on the training thread's time",
    "checkpoint_restore": "checkpoint loading, before the loop or in it",
    "rollout_wait": "the learner's waits for rollouts that no busy work overlapped",
    "weight_sync": "publishing weights to the rollout workers",
    "wasted_progress": "steps a later attempt redid",
    "restart_gap": "the time between an attempt's end and the next attempt's start",
}


def dominant_notes(g: Goodput, blocked: Mapping[str, float] | None = None) -> list[str]:
    """What the category that holds most of the wall time holds, in words, when it holds
    more than :data:`DOMINANT` of it; and, where productive time dominates while a
    training scope waits most of its step (``blocked``: scope -> blocked share of its step
    time), why those waits are not badput (docs/goodput.md)."""
    if g.wall_time_sec <= 0:
        return []
    out = []
    for k in BADPUT:
        share = g.share(k)
        if share > DOMINANT and k in _HOLDS:
            out.append(f"{k.replace('_', ' ')} is {share * 100:.0f}% of the wall time: {_HOLDS[k]}")
    if g.goodput > DOMINANT:
        for scope, share in sorted((blocked or {}).items()):
            if share > DOMINANT:
                out.append(
                    f"{scope} is blocked {share * 100:.0f}% of its step time, yet productive: "
                    "a wait counts as badput only where no busy work runs meanwhile (the "
                    "other threads' steps and components were busy while it waited)"
                )
    return out


def render_summary(summary: RunSummary, console: Any = None, *, max_anomalies: int = 10) -> None:
    """Print the summary as ``rich`` tables (the ``cli`` extra); fits 80 columns."""
    try:
        import rich  # noqa: F401
        from rich.markup import escape
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise AnalysisError("the summary tables need rich: pip install 'otel-tunix[cli]'") from exc
    con = console or table_console()
    table = rich_table

    ids = f" (run id {', '.join(summary.run_ids)})" if summary.run_ids else ""
    con.print(f"[bold]run[/]: {summary.source}{ids}")
    if summary.runs:
        con.print(
            f"  [yellow]{len(summary.runs)} runs here[/] (oldest first): "
            + listed(summary.runs)
            + "; this summary reads only the newest:"
        )
    if len(summary.files) > 1 or summary.files[0] != summary.source:
        for f in summary.files:
            con.print(f"  {f}")

    for s in summary.scopes:
        # One population per row: mean, p50 and p95 over the steps the row's component
        # ran in ("ran in"); "% step" is its total time's share of all the step time.
        t = table(
            f"{s.scope}: {s.steps} steps, {s.steps_per_sec:.2f} steps/s, "
            f"{s.sampled_steps} sampled; ms over the steps each ran in",
            "component",
            "kind",
            "mean",
            "p50",
            "p95",
            "% step",
            "ran in",
        )
        for c in s.components:
            t.add_row(
                c.name,
                c.kind,
                _ms(c.mean_sec),
                _ms(c.p50_sec),
                _ms(c.p95_sec),
                _pc(c.share),
                str(c.steps),
            )
        t.add_section()
        for kind, d, style in (
            ("busy", s.busy, None),
            ("blocked", s.blocked, "magenta"),
            ("idle", s.idle, "yellow"),
        ):
            t.add_row(
                f"total {kind}",
                kind,
                _ms(d.mean),
                _ms(d.p50),
                _ms(d.p95),
                _pc(d.share),
                "",
                style=style,
            )
        t.add_row(
            "step",
            "",
            _ms(s.step.mean),
            _ms(s.step.p50),
            _ms(s.step.p95),
            "100.0",
            str(s.sampled_steps),
            style="bold",
        )
        con.print(t)
        if s.failed_steps:
            latest = escape(s.last_error or "")
            con.print(f"  [red]{s.failed_steps} sampled steps raised[/] (the latest: {latest})\n")

    lagged = [x for x in summary.rl if x.lag_steps or x.sync_steps]
    if lagged:
        lt = table(
            "RL: each learner step's largest policy lag (in learner steps), weight syncs",
            "scope",
            "steps",
            "lag mean",
            "p95",
            "max",
            "syncs/step",
            ">1 sync",
            "MB/step",
        )
        for x in lagged:
            lt.add_row(
                x.scope,
                str(max(x.lag_steps, x.sync_steps)),
                f"{x.mean_max_lag:.2f}",
                f"{x.p95_max_lag:.1f}",
                f"{x.max_lag:g}",
                f"{x.mean_syncs:.2f}",
                str(x.repeated_sync_steps),
                f"{x.mean_sync_bytes / 1e6:.2f}",
                style="yellow" if x.repeated_sync_steps else None,
            )
        con.print(lt)
    for x in summary.rl:
        if x.breakdown_steps:
            con.print(rl_parts_table(x))

    g = summary.goodput
    run_on = f" ({g.device_run_on_sec:.2f} s of it device run-on)" if g.device_run_on_sec else ""
    con.print(
        goodput_table(
            g, f"Goodput {g.goodput * 100:.1f}% of {g.wall_time_sec:.2f} s wall time{run_on}"
        )
    )
    for note in dominant_notes(g, {s.scope: s.blocked.share for s in summary.scopes}):
        con.print(f"[yellow]note:[/] {note}", highlight=False)

    if summary.anomaly_count and max_anomalies:
        shown = min(max_anomalies, len(summary.anomalies))
        ranked = any(a.rank is not None for a in summary.anomalies)
        at = table(
            f"Anomalous steps: {summary.anomaly_count} slower than median + {MAD_FACTOR:g}·MAD "
            f"(slowest {shown})",
            "scope",
            *(("rank",) if ranked else ()),
            "step",
            "ms",
            "limit ms",
            "grew most (ms)",
        )
        for a in summary.anomalies[:shown]:
            grew = ""
            if a.component:
                grew = f"{a.component.removesuffix(' (busy)')} +{a.component_excess_sec * 1e3:.1f}"
            if a.first_step:
                grew += " (first step)"
            rank = (str(a.rank) if a.rank is not None else "",) if ranked else ()
            at.add_row(
                a.scope,
                *rank,
                str(a.step),
                f"{a.step_time_sec * 1e3:.1f}",
                f"{a.threshold_sec * 1e3:.1f}",
                grew.strip(),
            )
        con.print(at)
    elif not summary.anomaly_count:
        con.print(f"No anomalous steps (none slower than median + {MAD_FACTOR:g}·MAD).\n")

    if summary.ranks:
        rt = table(
            "Ranks, slowest first by own time (step time minus blocked; main scope, ms): "
            "slowest " + ", ".join(map(str, summary.slowest_ranks)),
            "rank",
            "scope",
            "steps",
            "own",
            "step mean",
            "p50",
            "p95",
            "own vs median",
            "goodput %",
        )
        for r in summary.ranks:
            rt.add_row(
                "" if r.rank is None else str(r.rank),
                r.scope,
                str(r.sampled_steps),
                _ms(r.mean_own_sec),
                _ms(r.mean_step_sec),
                _ms(r.p50_step_sec),
                _ms(r.p95_step_sec),
                f"{r.slowdown * 100:+.1f}%",
                _pc(r.goodput),
                style="bold red" if r.straggler else None,
            )
        con.print(rt)
    if summary.profiles:  # a line each: the paths are too long for a table in 80 columns
        con.print(
            f"[bold]Profile captures[/]: {len(summary.profiles)} (paths relative to the run folder)"
        )
        for p in summary.profiles:
            why = p.get("reason") or {}
            asked = f"{why.get('rule')} at step {why.get('step')}" if "rule" in why else "code"
            steps = p.get("steps") or []
            covers = f"{p.get('scope')} steps {steps[0]}-{steps[-1]}" if steps else "no step"
            on_rank = f"rank {p['rank']}: " if p.get("rank") is not None else ""
            status = p.get("status", "")
            con.print(
                f"  {on_rank}{p.get('path', '')}: {covers}, asked by {asked} ({status})",
                soft_wrap=True,
            )
    if summary.memory_snapshots:
        con.print(f"[bold]Out-of-memory snapshots[/]: {len(summary.memory_snapshots)}")
        for m in summary.memory_snapshots:
            on_rank = f"rank {m['rank']}: " if m.get("rank") is not None else ""
            con.print(
                f"  {on_rank}{m.get('path', '')}: {m.get('scope')} step {m.get('step')}",
                soft_wrap=True,
            )
    for n in [*summary.notes, *g.notes]:
        con.print(f"[dim]note: {n}[/]")
