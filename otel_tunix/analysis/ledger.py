"""The job goodput ledger: ``otel-tunix goodput PATH`` over a run folder or a folder of runs.

A run is one process's life (one run folder: ``spans.jsonl``, or a ``spans-rank<N>.jsonl``
per rank); a job is the runs whose spans file headers carry the same ``tunix.job.id``
resource attribute (a run without one is a job of its own), ordered by
``tunix.job.attempt``, then by start. Each run's time is read by
:class:`~otel_tunix.analysis.timeline.RunTimeline`; across the runs of a job:

* a step of a training scope that a later attempt ran again (its number lies in the range of
  steps a later attempt recorded for that scope) was thrown away by the restart: its whole
  window is ``wasted_progress`` and it is a redone step;
* from one attempt's last record to the next one's start is ``restart_gap`` (the killed
  attempt's last moments after its last record included: nothing of them was written).

A run killed with SIGKILL (no ``summary.json``, a spans file cut mid-line) is read to its
last whole line. docs/goodput.md gives each rule and compares them with Google's
ml-goodput-measurement.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_tunix.accounting import categories as cat
from otel_tunix.analysis.readers import (
    SKIPPED_WHY,
    AnalysisError,
    folder_spans_files,
    run_folders,
    spans_rank,
)
from otel_tunix.analysis.timeline import Goodput, RunTimeline, read_timeline

__all__ = ["JobLedger", "Ledger", "RunLedger", "job_ledger", "run_goodput"]

_NS = 1e-9


@dataclass
class RunLedger:
    """One run (attempt) of a job: its figures, its restart gap included."""

    folder: str
    run_id: str | None
    attempt: int | None
    files: list[str]
    start_ns: int
    end_ns: int
    steps: int
    redone_steps: int
    compilations: int
    restart_gap_sec: float
    """From the previous attempt's last record to this run's start (0 for the first)."""
    goodput: Goodput

    def to_json(self) -> dict[str, Any]:
        return {
            "folder": self.folder,
            "run_id": self.run_id,
            "attempt": self.attempt,
            "files": self.files,
            "steps": self.steps,
            "redone_steps": self.redone_steps,
            "compilations": self.compilations,
            "restart_gap_sec": self.restart_gap_sec,
            **self.goodput.to_json(),
        }


@dataclass
class JobLedger:
    """The runs of one job, oldest attempt first, and their figures pooled."""

    job_id: str | None
    runs: list[RunLedger]
    goodput: Goodput = field(default_factory=Goodput)

    @property
    def restarts(self) -> int:
        return max(0, len(self.runs) - 1)

    @property
    def redone_steps(self) -> int:
        return sum(r.redone_steps for r in self.runs)

    @property
    def compilations(self) -> int:
        return sum(r.compilations for r in self.runs)


@dataclass
class Ledger:
    """Every job under a path; :meth:`to_json` is ``otel-tunix goodput --json``."""

    source: str
    jobs: list[JobLedger]
    notes: list[str] = field(default_factory=list)
    bad_lines: int = 0

    @property
    def goodput(self) -> Goodput:
        """Every job's figures pooled."""
        g = Goodput()
        for j in self.jobs:
            g.add(j.goodput)
        return g

    def to_json(self) -> dict[str, Any]:
        """Exactly the keys ``runs``, ``restarts``, ``redone_steps``, ``compilations``,
        ``wall_time_sec``, ``productive_time_sec``, ``goodput`` and ``badput_sec`` (every
        category of :data:`otel_tunix.accounting.categories.BADPUT`)."""
        g = self.goodput
        return {
            "runs": sum(len(j.runs) for j in self.jobs),
            "restarts": sum(j.restarts for j in self.jobs),
            "redone_steps": sum(j.redone_steps for j in self.jobs),
            "compilations": sum(j.compilations for j in self.jobs),
            "wall_time_sec": g.wall_time_sec,
            "productive_time_sec": g.productive_sec,
            "goodput": g.goodput,
            "badput_sec": {k: g.badput_sec.get(k, 0.0) for k in cat.BADPUT},
        }


@dataclass
class _Run:
    """A run folder's timelines (one per rank) before the job is put together."""

    folder: Path
    files: list[RunTimeline]

    @property
    def first(self) -> RunTimeline:
        return self.files[0]

    @property
    def job_id(self) -> str | None:
        return next((f.job_id for f in self.files if f.job_id), None)

    @property
    def attempt(self) -> int | None:
        return next((f.attempt for f in self.files if f.attempt is not None), None)

    @property
    def run_id(self) -> str | None:
        return next((f.run_id for f in self.files if f.run_id), None)

    @property
    def start_ns(self) -> int:
        starts = [s for f in self.files for s in (f.start_ns, *f.w_start[:1]) if s]
        return min(starts, default=0)

    @property
    def end_ns(self) -> int:
        return max((f.last_ns for f in self.files), default=0)

    def step_ranges(self) -> dict[str, tuple[int, int]]:
        """Per training scope, the first and last step number recorded (any rank)."""
        out: dict[str, tuple[int, int]] = {}
        for f in self.files:
            for i, n in enumerate(f.w_step):
                scope = f.scopes[f.w_scope[i]]
                if cat.is_eval_scope(scope):
                    continue
                lo, hi = out.get(scope, (n, n))
                out[scope] = (min(lo, n), max(hi, n))
        return out


def _read_runs(path: Path) -> tuple[list[_Run], int, list[str]]:
    if not path.exists():
        raise AnalysisError(f"{path}: no such file or directory")
    if path.is_file():
        groups = [(path.parent, [path])]
    else:
        groups = [(d, folder_spans_files(d)) for d in run_folders(path)]
    runs: list[_Run] = []
    bad = 0
    empty: list[str] = []
    for folder, paths in groups:
        timelines = [read_timeline(p, spans_rank(p)) for p in paths]
        bad += sum(t.stats.bad_lines for t in timelines)
        timelines = [t for t in timelines if not t.empty]
        if timelines:
            runs.append(_Run(folder, timelines))
        else:
            empty.append(str(folder))
    if not runs:
        raise AnalysisError(
            f"{path}: no run with a recorded step or component here (looked for spans.jsonl "
            "and spans-rank<N>.jsonl, plain or .gz, up to 2 levels down)"
        )
    return runs, bad, empty


def _job(job_id: str | None, runs: Sequence[_Run]) -> JobLedger:
    ordered = sorted(runs, key=lambda r: (r.attempt or 0, r.start_ns, str(r.folder)))
    ranges = [r.step_ranges() for r in ordered]
    job = JobLedger(job_id, [])
    prev_end: int | None = None
    for i, run in enumerate(ordered):
        redo: dict[str, list[tuple[int, int]]] = {}
        for later in ranges[i + 1 :]:
            for scope, rng in later.items():
                redo.setdefault(scope, []).append(rng)
        pooled = Goodput()
        redone = 0
        gap_total = 0.0
        for f in run.files:
            g, n = f.goodput(redo)
            redone = max(redone, n)  # the ranks ran the same steps
            if prev_end is not None:
                start = f.start_ns if f.start_ns is not None else run.start_ns
                gap = max(0, start - prev_end) * _NS
                g.badput_sec[cat.RESTART_GAP] += gap
                g.wall_time_sec += gap
                gap_total = max(gap_total, gap)
            pooled.add(g)
        job.runs.append(
            RunLedger(
                folder=str(run.folder),
                run_id=run.run_id,
                attempt=run.attempt,
                files=[str(f.path) for f in run.files],
                start_ns=run.start_ns,
                end_ns=run.end_ns,
                steps=max(f.steps for f in run.files),
                redone_steps=redone,
                compilations=sum(f.compilations for f in run.files),
                restart_gap_sec=gap_total,
                goodput=pooled,
            )
        )
        job.goodput.add(pooled)
        prev_end = run.end_ns if prev_end is None else max(prev_end, run.end_ns)
    return job


def job_ledger(path: str | os.PathLike[str]) -> Ledger:
    """The ledger of every job under ``path``: a run folder, a folder of run folders (a
    folder given to a resumed job holds its first run's files and ``run-2``, ...; the
    default ``otel-tunix-runs`` holds one folder per run) or one spans file.

    Raises:
        AnalysisError: nothing to read there.
    """
    runs, bad, empty = _read_runs(Path(path))
    by_job: dict[str, list[_Run]] = {}
    for r in runs:
        key = f"job:{r.job_id}" if r.job_id else f"run:{r.run_id or r.folder}:{r.folder}"
        by_job.setdefault(key, []).append(r)
    jobs = [_job(rs[0].job_id, rs) for rs in by_job.values()]
    jobs.sort(key=lambda j: j.runs[0].start_ns)
    notes = []
    if empty:
        notes.append(
            f"not counted (no recorded step or component in a spans file): {', '.join(empty)}"
        )
    if bad:
        notes.append(
            f"{bad} line(s) were not JSON records a reader can use, skipped ({SKIPPED_WHY})"
        )
    return Ledger(source=str(path), jobs=jobs, notes=notes, bad_lines=bad)


def run_goodput(files: Sequence[RunTimeline]) -> list[Goodput]:
    """Each rank's figures of one run on its own (no job: nothing wasted, no gap), as
    ``otel-tunix summary`` shows them."""
    return [f.goodput()[0] for f in files]
