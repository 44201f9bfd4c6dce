"""``otel-tunix goodput``'s terminal tables: per job, its runs and where its time went."""

from __future__ import annotations

import os
from typing import Any

from otel_tunix.analysis.ledger import Ledger, RunLedger
from otel_tunix.analysis.readers import AnalysisError
from otel_tunix.analysis.summary_tables import (
    dominant_notes,
    goodput_table,
    rich_table,
    table_console,
)

__all__ = ["render_ledger"]

_EACH_END = 20
"""The runs of a job shown at each end of its table (a folder of 10k runs: 41 rows)."""


def render_ledger(ledger: Ledger, console: Any = None) -> None:
    """Print the ledger as ``rich`` tables (the ``cli`` extra): for each job a table of its
    runs (attempt, steps, redone steps, restart gap before it, goodput) and one of its
    categories; with several jobs, the total last."""
    try:
        import rich  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise AnalysisError("the goodput tables need rich: pip install 'otel-tunix[cli]'") from exc
    con = console or table_console()
    con.print(f"[bold]goodput[/]: {ledger.source}")
    for job in ledger.jobs:
        g = job.goodput
        name = f"job {job.job_id}" if job.job_id else f"run {job.runs[0].run_id or '?'}"
        rt = rich_table(
            f"{name}: {len(job.runs)} run(s), {job.restarts} restart(s), "
            f"{job.redone_steps} redone step(s), {job.compilations} compilation(s)",
            "folder",
            "attempt",
            "steps",
            "redone",
            "gap before s",
            "wall s",
            "goodput %",
        )
        shown: list[RunLedger | None] = list(job.runs)
        if len(shown) > 2 * _EACH_END:  # the first and the last runs; --json has them all
            shown = [*job.runs[:_EACH_END], None, *job.runs[-_EACH_END:]]
        for r in shown:
            if r is None:
                more = len(job.runs) - 2 * _EACH_END
                rt.add_row(f"... {more:,} more runs (--json lists them all)", *[""] * 6)
                continue
            attempt = "" if r.attempt is None else str(r.attempt)
            rt.add_row(
                _relative(r.folder, ledger.source),
                attempt,
                str(r.steps),
                str(r.redone_steps),
                f"{r.restart_gap_sec:.3f}",
                f"{r.goodput.wall_time_sec:.3f}",
                f"{r.goodput.goodput * 100:.1f}",
            )
        con.print(rt)
        con.print(goodput_table(g, f"Goodput {g.goodput * 100:.1f}% of {g.wall_time_sec:.2f} s"))
        for note in dominant_notes(g):
            con.print(f"[yellow]note:[/] {note}", highlight=False)
    if len(ledger.jobs) > 1:
        g = ledger.goodput
        con.print(
            goodput_table(
                g,
                f"All {len(ledger.jobs)} jobs: goodput {g.goodput * 100:.1f}% of "
                f"{g.wall_time_sec:.2f} s",
            )
        )
    for n in [*ledger.notes, *ledger.goodput.notes]:
        con.print(f"[dim]note: {n}[/]")


def _relative(folder: str, source: str) -> str:
    """A run's folder as given under the path the user named (``.``, ``run-2``)."""
    try:
        rel = os.path.relpath(folder, source if os.path.isdir(source) else os.path.dirname(source))
    except ValueError:  # another drive (Windows)
        return folder
    return folder if rel.startswith("..") else rel
