"""``otel-tunix summary``: the step-time breakdown, goodput, anomalous steps and ranks of a run.

:func:`summarize` streams a run's spans JSONL files (``spans.jsonl`` or one
``spans-rank<N>.jsonl`` per rank, plain or gzip) once. Per sampled step it keeps a handful of
floats (step, busy, blocked, idle and each component's time: 8 bytes each), never the
lines or the spans, so memory grows with the number of steps, not with the file's size.

The counters are those the SDK wrote (computed by
:func:`otel_tunix.accounting.step_time.account_step`); the goodput is the run's ledger
(:class:`otel_tunix.analysis.timeline.RunTimeline`, the categories of
:mod:`otel_tunix.accounting.categories`), as ``otel-tunix goodput`` gives it for a run on its own.
The rules are in ``docs/local-analysis.md`` and ``docs/goodput.md``.

The streaming readers are in :mod:`otel_tunix.analysis.accumulate`; the terminal tables
(:func:`~otel_tunix.analysis.summary_tables.render_summary`) in
:mod:`otel_tunix.analysis.summary_tables`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from otel_tunix.accounting.categories import is_eval_scope
from otel_tunix.accounting.rl_steps import PARTS
from otel_tunix.analysis.accumulate import _FileAcc, _i, _ScopeAcc
from otel_tunix.analysis.ledger import run_goodput
from otel_tunix.analysis.readers import (
    SKIPPED_WHY,
    AnalysisError,
    resolve_spans_files,
    run_folders,
    runs_note,
    spans_rank,
)
from otel_tunix.analysis.timeline import Goodput

__all__ = [
    "Anomaly",
    "ComponentStats",
    "Dist",
    "Goodput",
    "RLStats",
    "RankStats",
    "RunSummary",
    "ScopeStats",
    "summarize",
]

MAD_FACTOR = 3.0
"""A step is anomalous when slower than ``median + MAD_FACTOR * MAD`` of its scope."""
MAD_FLOOR = 1e-3
"""MAD is taken as at least this fraction of the median, so that identical step times do
not flag nanosecond jitter."""
STRAGGLER_MIN = 0.05
"""A rank is a straggler when its mean own time (step time minus blocked) is above the ranks'
median + 3·MAD and at least this fraction above the median (a few ranks rarely give a
meaningful MAD)."""
MAX_LISTED_ANOMALIES = 100
"""Anomalous steps kept in the summary (the slowest first); ``count`` has them all."""


@dataclass(frozen=True, slots=True)
class Dist:
    """Mean, median and 95th percentile in seconds, and the mean's share of the mean step."""

    mean: float
    p50: float
    p95: float
    share: float


@dataclass(frozen=True, slots=True)
class ComponentStats:
    """One component's time of one kind (busy or blocked) in a scope.

    ``mean_sec``, ``p50_sec`` and ``p95_sec`` are over one population: the ``steps`` in which
    the component ran (a checkpoint every hundred steps: its time when it runs).
    ``per_step_sec`` spreads its total over every sampled step of the scope, and ``share``
    is that total's share of the scope's step time.
    """

    name: str
    kind: str
    mean_sec: float
    p50_sec: float
    p95_sec: float
    share: float
    steps: int
    per_step_sec: float


@dataclass(frozen=True, slots=True)
class ScopeStats:
    """The breakdown of one scope (pooled over ranks)."""

    scope: str
    steps: int
    sampled_steps: int
    wall_time_sec: float
    steps_per_sec: float
    step: Dist
    busy: Dist
    blocked: Dist
    idle: Dist
    components: list[ComponentStats]
    failed_steps: int = 0
    """Sampled steps whose body raised (their line's ``error``)."""
    last_error: str | None = None
    """The latest of those errors (``"Type: message"``)."""


@dataclass(frozen=True, slots=True)
class Anomaly:
    """A step slower than its scope's median + 3·MAD, and the component that grew most."""

    scope: str
    step: int
    rank: int | None
    step_time_sec: float
    threshold_sec: float
    excess_sec: float
    component: str | None
    component_excess_sec: float
    first_step: bool


@dataclass(frozen=True, slots=True)
class RankStats:
    """One rank's main training scope (the non-evaluation scope with the most step time)."""

    rank: int | None
    path: str
    scope: str
    sampled_steps: int
    mean_step_sec: float
    p50_step_sec: float
    p95_step_sec: float
    steps_per_sec: float
    goodput: float
    mean_own_sec: float
    """Mean own time: step time minus the time the step waited (blocked components, e.g. a
    collective waiting for the other ranks). What the ranks are compared by: in a
    synchronised job every rank's step lasts as long as the slowest one's."""
    slowdown: float
    """Mean own time over the median of the ranks' mean own times, minus 1."""
    straggler: bool
    """Mean own time above the ranks' median + 3·MAD and 5% above the median (3+ ranks)."""


@dataclass(frozen=True, slots=True)
class RLStats:
    """An RL scope's policy lag and weight syncs, from its step spans' ``tunix.rl.*``
    attributes (``otel_tunix.rl``; ``docs/rl.md``)."""

    scope: str
    lag_steps: int
    """Sampled steps that consumed rollouts (the rest of the fields on lag are over them)."""
    mean_max_lag: float
    """Mean over those steps of each one's largest policy lag (learner steps)."""
    p95_max_lag: float
    max_lag: float
    sync_steps: int
    """Sampled steps that synced weights."""
    mean_syncs: float
    """Weight syncs per such step, on average."""
    repeated_sync_steps: int
    """Steps that synced more than once (the ``weight_sync_repeated`` alert)."""
    mean_sync_bytes: float
    """Bytes synced per such step, on average (as given to ``weight_sync``; 0: not given)."""
    breakdown_steps: int = 0
    """Sampled learner steps broken into parts (:mod:`otel_tunix.accounting.rl_steps`)."""
    mean_step_sec: float = 0.0
    """Their mean wall time."""
    parts_sec: dict[str, float] = field(default_factory=dict)
    """Per part (``rollout``, ``rollout_wait``, ..., ``idle``), its mean seconds per such
    step; they add up to ``mean_step_sec``."""


def _rl_stats(accs: Sequence[_ScopeAcc]) -> RLStats | None:
    lags = _concat([np.frombuffer(a.max_lag, dtype=np.float64) for a in accs])
    syncs = _concat([np.frombuffer(a.syncs, dtype=np.float64) for a in accs])
    times = _concat([np.frombuffer(a.rl_step, dtype=np.float64) for a in accs])
    if not lags.size and not syncs.size and not times.size:
        return None
    parts = {
        p: float(_concat([np.frombuffer(a.rl_parts[p], dtype=np.float64) for a in accs]).mean())
        for p in PARTS
        if times.size
    }
    nbytes = _concat([np.frombuffer(a.sync_bytes, dtype=np.float64) for a in accs])
    return RLStats(
        scope=accs[0].scope,
        lag_steps=int(lags.size),
        mean_max_lag=float(lags.mean()) if lags.size else 0.0,
        p95_max_lag=_pct(lags, 95) if lags.size else 0.0,
        max_lag=float(lags.max()) if lags.size else 0.0,
        sync_steps=int(syncs.size),
        mean_syncs=float(syncs.mean()) if syncs.size else 0.0,
        repeated_sync_steps=int((syncs > 1).sum()),
        mean_sync_bytes=float(nbytes.mean()) if nbytes.size else 0.0,
        breakdown_steps=int(times.size),
        mean_step_sec=float(times.mean()) if times.size else 0.0,
        parts_sec=parts,
    )


@dataclass
class RunSummary:
    """Everything ``otel-tunix summary`` shows; :meth:`to_json` is ``--json``."""

    source: str
    files: list[str]
    scopes: list[ScopeStats]
    goodput: Goodput
    anomalies: list[Anomaly]
    anomaly_count: int
    ranks: list[RankStats]
    slowest_ranks: list[int | None]
    notes: list[str]
    bad_lines: int = 0
    run_ids: list[str] = field(default_factory=list)
    """The ``tunix.run.id`` of the files read (one run: one id, shared by its ranks)."""
    runs: list[str] = field(default_factory=list)
    """Every run folder under ``source``, oldest first, when it is a folder holding more than
    one run (the one read is the folder of ``files``); else empty."""
    rl: list[RLStats] = field(default_factory=list)
    """The RL scopes' policy lag and weight syncs (scopes whose steps had them)."""
    profiles: list[dict[str, Any]] = field(default_factory=list)
    """The profile captures of the run (``summary.json``'s ``profiles``, each with its
    ``rank``): path, steps, trace ids, status and why (the alert, or ``capture_profile()``)."""
    memory_snapshots: list[dict[str, Any]] = field(default_factory=list)
    """The out-of-memory snapshots of the run (``summary.json``'s ``memory_snapshots``, each
    with its ``rank``): path, framework, scope, step, error."""

    def to_json(self) -> dict[str, Any]:
        """The summary as ``otel-tunix summary --json`` prints it (``memory_snapshots`` only
        when the run kept some)."""
        snapshots = {"memory_snapshots": self.memory_snapshots} if self.memory_snapshots else {}
        return {
            "source": self.source,
            "files": self.files,
            "run_ids": self.run_ids,
            "runs": self.runs,
            "scopes": [asdict(s) for s in self.scopes],
            "goodput": self.goodput.to_json(),
            "anomalies": {
                "rule": f"step_time > median + {MAD_FACTOR:g} * MAD (per scope and rank)",
                "count": self.anomaly_count,
                "steps": [asdict(a) for a in self.anomalies],
            },
            "ranks": [asdict(r) for r in self.ranks],
            "ranks_rule": (
                f"by mean_own_sec (step time - blocked): straggler when > median + "
                f"{MAD_FACTOR:g} * MAD and > median * {1 + STRAGGLER_MIN:g} (3+ ranks)"
            ),
            "slowest_ranks": self.slowest_ranks,
            "notes": self.notes,
            "bad_lines": self.bad_lines,
            "rl": [asdict(r) for r in self.rl],
            "profiles": self.profiles,
            **snapshots,
        }


# --- statistics -------------------------------------------------------------------------------


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else 0.0


def _dist(x: np.ndarray, mean_step: float) -> Dist:
    if not len(x):
        return Dist(0.0, 0.0, 0.0, 0.0)
    m = float(x.mean())
    return Dist(m, _pct(x, 50), _pct(x, 95), m / mean_step if mean_step > 0 else 0.0)


def _threshold(x: np.ndarray) -> float:
    med = float(np.median(x))
    mad = float(np.median(np.abs(x - med)))
    return med + MAD_FACTOR * max(mad, MAD_FLOOR * med)


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    """One array from per-rank parts (no copy for a single rank)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _scope_stats(accs: Sequence[_ScopeAcc]) -> ScopeStats:
    scope = accs[0].scope

    def cat(get: Any) -> np.ndarray:
        return _concat([np.frombuffer(get(a), dtype=np.float64) for a in accs])

    t = cat(lambda a: a.t)
    mean_step = float(t.mean()) if len(t) else 0.0
    keys: dict[tuple[str, str], None] = {}
    for a in accs:
        keys.update(dict.fromkeys(a.comp))
    comps = []
    n = len(t)
    for key in keys:
        col = _concat(
            [
                np.frombuffer(a.comp[key], dtype=np.float64)
                if key in a.comp
                else np.full(a.n, math.nan)
                for a in accs
            ]
        )
        ran = col[~np.isnan(col)]
        per_step = float(ran.sum()) / n if n else 0.0
        comps.append(
            ComponentStats(
                name=key[0],
                kind=key[1],
                mean_sec=float(ran.mean()) if len(ran) else 0.0,
                p50_sec=_pct(ran, 50),
                p95_sec=_pct(ran, 95),
                share=per_step / mean_step if mean_step > 0 else 0.0,
                steps=len(ran),
                per_step_sec=per_step,
            )
        )
    comps.sort(key=lambda c: -c.per_step_sec)
    return ScopeStats(
        scope=scope,
        steps=sum(a.steps for a in accs),
        sampled_steps=n,
        wall_time_sec=max(a.wall_sec for a in accs),
        steps_per_sec=float(np.mean([a.steps_per_sec for a in accs])),
        step=_dist(t, mean_step),
        busy=_dist(cat(lambda a: a.busy), mean_step),
        blocked=_dist(cat(lambda a: a.blocked), mean_step),
        idle=_dist(cat(lambda a: a.idle), mean_step),
        components=comps,
        failed_steps=sum(a.errors for a in accs),
        last_error=next((a.last_error for a in reversed(accs) if a.last_error), None),
    )


def _is_first_step(acc: _ScopeAcc) -> bool:
    """Whether the earliest recorded step is the scope's first step (it was sampled)."""
    if acc.first is None:
        return False
    s = acc.session
    if not s or not _i(s.get("first_start_ns")):
        return True
    first_start, idx = acc.first
    return first_start - _i(s["first_start_ns"]) <= acc.t[idx] * 1e9


def _anomalies(f: _FileAcc) -> tuple[list[Anomaly], int]:
    out: list[Anomaly] = []
    count = 0
    for a in f.scopes.values():
        if a.n < 3:
            continue
        t = a.times()
        thr = _threshold(t)
        slow = np.nonzero(t > thr)[0]
        count += len(slow)
        if not len(slow):
            continue
        order = slow[np.argsort(-(t[slow]))][:MAX_LISTED_ANOMALIES]
        cols = {
            k: np.nan_to_num(np.frombuffer(v, dtype=np.float64), nan=0.0) for k, v in a.comp.items()
        }
        medians = {k: float(np.median(v)) for k, v in cols.items()}
        first_idx = a.first[1] if a.first is not None and _is_first_step(a) else -1
        for i in order:
            best, best_excess = None, 0.0
            for k, v in cols.items():
                d = float(v[i]) - medians[k]
                if d > best_excess:
                    best, best_excess = k, d
            out.append(
                Anomaly(
                    scope=a.scope,
                    step=int(a.step_no[i]),
                    rank=f.rank,
                    step_time_sec=float(t[i]),
                    threshold_sec=thr,
                    excess_sec=float(t[i]) - thr,
                    component=f"{best[0]} ({best[1]})" if best else None,
                    component_excess_sec=best_excess,
                    first_step=int(i) == first_idx,
                )
            )
    return out, count


def _main_scope(f: _FileAcc) -> _ScopeAcc | None:
    cands = [a for a in f.scopes.values() if a.n and not is_eval_scope(a.scope)]
    cands = cands or [a for a in f.scopes.values() if a.n]
    return max(cands, key=lambda a: float(a.times().sum()), default=None)


def _rank_table(files: Sequence[_FileAcc], goodputs: Sequence[Goodput]) -> list[RankStats]:
    # Ranks are compared by own time (step minus blocked), as the live straggler detector
    # does: a collective in every step makes every rank's step as long as the slowest one's.
    rows = []
    for f, g in zip(files, goodputs, strict=True):
        a = _main_scope(f)
        if a is None:
            continue
        t = a.times()
        own = float(a.own_times().mean())
        rows.append((f, a, float(t.mean()), _pct(t, 50), _pct(t, 95), g.goodput, own))
    if not rows:
        return []
    owns = np.array([r[6] for r in rows])
    med = float(np.median(owns))
    thr = _threshold(owns)
    out = [
        RankStats(
            rank=f.rank,
            path=str(f.path),
            scope=a.scope,
            sampled_steps=a.n,
            mean_step_sec=mean,
            p50_step_sec=p50,
            p95_step_sec=p95,
            steps_per_sec=a.steps_per_sec,
            goodput=good,
            mean_own_sec=own,
            slowdown=own / med - 1 if med > 0 else 0.0,
            straggler=len(rows) >= 3 and own > thr and own > med * (1 + STRAGGLER_MIN),
        )
        for f, a, mean, p50, p95, good, own in rows
    ]
    out.sort(key=lambda r: -r.mean_own_sec)
    return out


def summarize(path: str | os.PathLike[str]) -> RunSummary:
    """Summarise a run folder, a folder of runs (the newest run, the others named in
    :attr:`RunSummary.runs` and a note) or one spans JSONL file.

    With several ``spans-rank<N>.jsonl`` files, the breakdown and the goodput pool every
    rank, anomalies are found per rank, and :attr:`RunSummary.ranks` compares the ranks.

    Raises:
        AnalysisError: no spans file, or no step in it.
    """
    paths = resolve_spans_files(path)
    files: list[_FileAcc] = []
    runs = run_folders(path)
    several = runs_note(path, paths[0])
    notes: list[str] = [several] if several else []
    for p in paths:
        f = _FileAcc(p, spans_rank(p))
        f.read()
        files.append(f)
    bad = sum(f.stats.bad_lines for f in files)
    if bad:
        notes.append(
            f"{bad} line(s) were not JSON records a reader can use, skipped ({SKIPPED_WHY})"
        )
    if not any(f.n for f in files):
        lines = sum(f.stats.lines for f in files)
        raise AnalysisError(
            f"{', '.join(map(str, paths))}: no step records ({lines} lines read): was the run "
            "sampled (OTEL_TUNIX_SAMPLING_RATE) and did it reach its first step?"
        )
    for f in files:
        if any(a.n and a.session is None for a in f.scopes.values()):
            notes.append(
                f"{f.path.name}: no session line (the run did not shut down cleanly?): step "
                "counts and steps/s come from the recorded steps only"
            )
    by_scope: dict[str, list[_ScopeAcc]] = {}
    for f in files:
        for a in f.scopes.values():
            if a.n:
                by_scope.setdefault(a.scope, []).append(a)
    scopes = [_scope_stats(accs) for accs in by_scope.values()]
    rl = [r for r in map(_rl_stats, by_scope.values()) if r is not None]
    goodputs = run_goodput([f.timeline for f in files])
    pooled = Goodput()
    for g in goodputs:
        pooled.add(g)
    anomalies: list[Anomaly] = []
    count = 0
    for f in files:
        found, n = _anomalies(f)
        anomalies.extend(found)
        count += n
    anomalies.sort(key=lambda a: -a.excess_sec)
    ranks = _rank_table(files, goodputs) if len(files) > 1 else []
    slowest = [r.rank for r in ranks[: min(3, len(ranks))]] if ranks else []
    return RunSummary(
        source=str(path),
        files=[str(p) for p in paths],
        scopes=scopes,
        goodput=pooled,
        anomalies=anomalies[:MAX_LISTED_ANOMALIES],
        anomaly_count=count,
        ranks=ranks,
        slowest_ranks=slowest,
        notes=notes,
        bad_lines=bad,
        run_ids=sorted({f.run_id for f in files if f.run_id}),
        runs=[str(r) for r in runs] if len(runs) > 1 else [],
        rl=rl,
        profiles=profile_captures(paths),
        memory_snapshots=profile_captures(paths, "memory_snapshots", "snapshots"),
    )


def profile_captures(
    spans_files: Sequence[Path], section: str = "profiles", key: str = "captures"
) -> list[dict[str, Any]]:
    """The profile captures (``section`` / ``key``: another list of the same files, the
    out-of-memory snapshots) listed by the ``summary[-rank<N>].json`` beside each spans
    file, each with its ``rank`` (a missing or unreadable summary lists none)."""
    out: list[dict[str, Any]] = []
    for path in spans_files:
        rank = spans_rank(path)
        name = "summary.json" if rank is None else f"summary-rank{rank}.json"
        try:
            data = json.loads((path.parent / name).read_text())
            captures = data.get(section, {}).get(key, [])
        except (OSError, ValueError, AttributeError):
            continue
        out.extend({"rank": rank, **c} for c in captures if isinstance(c, dict))
    return out
