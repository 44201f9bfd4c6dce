"""The step-time breakdown as a terminal table (``rich``), from session totals.

Used by ``otel-tunix demo`` at the end of a run. ``rich`` is an optional dependency (extra
``cli``); :func:`breakdown_rows` needs nothing and gives the same numbers as plain data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from otel_tunix.model.steps import ScopeSession
from otel_tunix.run.notices import cli_command


@dataclass(frozen=True, slots=True)
class BreakdownRow:
    """One line of the breakdown: a component, or a scope's busy / blocked / idle total."""

    scope: str
    name: str
    kind: str  # busy | blocked | idle | background | step
    mean_sec: float
    share: float  # of the mean step time


def breakdown_rows(sessions: list[ScopeSession]) -> list[BreakdownRow]:
    """Mean seconds per sampled step and share of the step, per scope and component."""
    rows: list[BreakdownRow] = []
    for s in sessions:
        if not s.sampled_steps:
            continue
        step = s.mean(s.step_time_sec)

        def share(x: float, step: float = step) -> float:
            return x / step if step > 0 else 0.0

        for name, ct in sorted(s.components.items(), key=lambda kv: -kv[1].busy_time_sec):
            if ct.busy_time_sec:
                m = s.mean(ct.busy_time_sec)
                rows.append(BreakdownRow(s.scope, name, "busy", m, share(m)))
            if ct.blocked_time_sec:
                m = s.mean(ct.blocked_time_sec)
                rows.append(BreakdownRow(s.scope, name, "blocked", m, share(m)))
        for kind, total in (
            ("busy", s.busy_time_sec),
            ("blocked", s.blocked_time_sec),
            ("idle", s.idle_time_sec),
        ):
            m = s.mean(total)
            rows.append(BreakdownRow(s.scope, f"total {kind}", kind, m, share(m)))
        if s.background_time_sec:  # other threads' work beside the breakdown, not in it
            m = s.mean(s.background_time_sec)
            rows.append(BreakdownRow(s.scope, "background", "background", m, share(m)))
        rows.append(BreakdownRow(s.scope, "step", "step", step, 1.0))
    return rows


def breakdown_table(sessions: list[ScopeSession], title: str = "Step-time breakdown") -> Any:
    """A ``rich.table.Table`` of :func:`breakdown_rows` plus steps/s per scope."""
    try:
        from rich.table import Table
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("the breakdown table needs rich: pip install 'otel-tunix[cli]'") from exc
    table = Table(title=title)
    table.add_column("scope")
    table.add_column("component")
    table.add_column("kind")
    table.add_column("mean ms/step", justify="right")
    table.add_column("% of step", justify="right")
    style = {"idle": "yellow", "blocked": "magenta", "step": "bold"}
    for r in breakdown_rows(sessions):
        table.add_row(
            r.scope,
            r.name,
            r.kind,
            f"{r.mean_sec * 1e3:.3f}",
            f"{r.share * 100:.1f}",
            style=style.get(r.kind) if r.name.startswith(("total", "step")) else None,
        )
    for s in sessions:
        table.add_row(
            s.scope, "throughput", "", f"{s.steps_per_sec:.1f} steps/s", f"{s.steps} steps"
        )
    return table


@contextmanager
def progress_bar(
    console: Any, description: str, total: int, field: str, *, enabled: bool = True
) -> Iterator[Callable[[int, float], None] | None]:
    """A transient ``rich`` progress bar; yields ``update(done, value)`` (``None`` if off).

    ``value`` is shown after the count as ``<field> <value>`` (the loss, a reward).
    """
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn(f"{field} {{task.fields[value]:.4f}}"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as prog:
        task = prog.add_task(description, total=total, value=float("nan"))

        def update(done: int, value: float) -> None:
            prog.update(task, completed=done, value=value)

        yield update


def print_run_files(console: Any, info: Any) -> None:
    """Print the run folder and the files a finished run wrote (``RunInfo``)."""
    if info.output_dir is None:
        return
    console.print(f"run folder: [cyan]{info.output_dir.resolve()}[/]")
    for kind, path in info.files.items():
        if path.exists():  # alerts.jsonl is made only when an alert fires
            console.print(f"  {kind:<8} {path}")
    cli = cli_command()
    console.print(
        f"next: {cli} summary {info.output_dir}   ·   {cli} goodput {info.output_dir}",
        highlight=False,
        soft_wrap=True,  # one line, however narrow the terminal: a command to copy whole
    )


def demo_service_name(default: str) -> str | None:
    """``default``, unless the environment names the service (``OTEL_SERVICE_NAME``, or
    ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``): then ``None``, so the SDK's own
    rules pick the name the user set."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    named = str(Resource.create().attributes.get(SERVICE_NAME, ""))
    return None if named and not named.startswith("unknown_service") else default
