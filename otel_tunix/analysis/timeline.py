"""One run's time, as a spans JSONL file tells it: what the goodput ledger reads.

:class:`RunTimeline` takes a spans file's records one at a time (:meth:`RunTimeline.add`) and
keeps what the ledger needs: the run's start (the ``type: "run"`` header's
``process_start_ns``, else its ``start_ns``), every step's window and its own components,
the components beside the steps (other threads' background work, ``type: "span"`` lines;
components outside any step, ``outside: true``), each with its category
(:func:`otel_tunix.accounting.categories.classify`, in arrays), the badput time of the steps that
were
not sampled (``unsampled_sec`` of step and session lines), the compilations and the last
record's end. A line cut short by a kill is skipped and counted.

:meth:`RunTimeline.goodput` then feeds them, in start order, to the one ledger engine
(:class:`otel_tunix.accounting.ledger.Ledger`), which the live ledger feeds too; docs/goodput.md
gives
each rule.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from otel_tunix.accounting import categories as cat
from otel_tunix.accounting.ledger import Compilations, Ledger
from otel_tunix.analysis.readers import AnalysisError, ReadStats, iter_records
from otel_tunix.model import record as rs
from otel_tunix.settings.attributes import BACKGROUND, KIND_BLOCKED

__all__ = [
    "Goodput",
    "RunTimeline",
    "metrics_start_ns",
    "read_timeline",
]

_NS = 1e-9

_CODE: Final = {c: i for i, c in enumerate(cat.PRECEDENCE)}
_BESIDE: Final = -1
"""The owner of a component beside the steps (not a step's own)."""
_SETTLE_EVERY: Final = 4096
"""Step windows fed to the engine between two settlements (memory stays with the open
ones)."""


@dataclass(slots=True)
class Goodput:
    """Productive time over wall time, and the badput by category (seconds).

    ``wall_time_sec`` runs from the run's start (its process start where the spans file's
    header has it, else ``configure()``) to its last record: the end of its last step, of a
    component still running then (an asynchronous checkpoint writer) or of the device work
    its steps dispatched (``device_run_on_sec`` past the last host step: an asynchronous
    loop); for a job, the restart gaps between its runs too. Productive time and the badput
    add up to it. Several ranks: their figures are summed (rank-seconds).
    """

    wall_time_sec: float = 0.0
    device_run_on_sec: float = 0.0
    productive_sec: float = 0.0
    badput_sec: dict[str, float] = field(default_factory=lambda: dict.fromkeys(cat.BADPUT, 0.0))
    notes: list[str] = field(default_factory=list)

    @property
    def goodput(self) -> float:
        """``productive_sec`` over the wall time (0 for an empty run)."""
        return self.productive_sec / self.wall_time_sec if self.wall_time_sec > 0 else 0.0

    def share(self, category: str) -> float:
        """A badput category's fraction of the wall time."""
        w = self.wall_time_sec
        return self.badput_sec.get(category, 0.0) / w if w > 0 else 0.0

    def add(self, other: Goodput) -> None:
        """Pool another rank's (or run's) figures into these."""
        self.wall_time_sec += other.wall_time_sec
        self.device_run_on_sec += other.device_run_on_sec
        self.productive_sec += other.productive_sec
        for k, v in other.badput_sec.items():
            self.badput_sec[k] = self.badput_sec.get(k, 0.0) + v
        self.notes.extend(n for n in other.notes if n not in self.notes)

    def to_json(self) -> dict[str, Any]:
        return {
            "wall_time_sec": self.wall_time_sec,
            "device_run_on_sec": self.device_run_on_sec,
            "productive_time_sec": self.productive_sec,
            "goodput": self.goodput,
            "badput_sec": dict(self.badput_sec),
            "badput_share": {k: self.share(k) for k in self.badput_sec},
            "notes": list(self.notes),
        }


_int = rs.as_int64
"""A whole number of a line, clamped to int64 (a step number past it never raises; NaN or
infinity: 0, no time)."""


class RunTimeline:
    """What one spans file (one rank of one run) says about the run's time; feed it the
    file's records with :meth:`add` (or use :func:`read_timeline`)."""

    def __init__(self, path: Path | None = None, rank: int | None = None) -> None:
        self.path = path
        self.rank = rank
        self.run_id: str | None = None
        self.job_id: str | None = None
        self.attempt: int | None = None
        self.start_ns: int | None = None
        self.start_source = ""
        self.sampling_rate = 1
        self.scopes: list[str] = []
        self._scope_index: dict[str, int] = {}
        # the step windows: scope index, step number, start, end
        self.w_scope: array[int] = array("i")
        self.w_step: array[int] = array("q")
        self.w_start: array[int] = array("q")
        self.w_end: array[int] = array("q")
        # the components: category code (index in PRECEDENCE), start, end, and their step
        # window's index (_BESIDE: a component beside the steps)
        self.i_code: array[int] = array("b")
        self.i_start: array[int] = array("q")
        self.i_end: array[int] = array("q")
        self.i_owner: array[int] = array("q")
        self._unsampled: dict[int, Mapping[str, float]] = {}
        """Per step window, the badput time of the scope's unsampled steps before it."""
        self._compiles = Compilations()
        self.outside_spans = 0
        self.host_end_ns = 0
        self.device_end_ns = 0
        self.last_ns = 0
        self.sessions: dict[str, tuple[int, int]] = {}
        """Per scope, the session line's ``(first_start_ns, last_end_ns)``."""
        self.session_unsampled: dict[str, Mapping[str, float]] = {}
        """Per scope, the badput time of its unsampled steps after its last sampled one."""
        self.stats = ReadStats()

    @property
    def steps(self) -> int:
        """Step records read."""
        return len(self.w_step)

    @property
    def compilations(self) -> int:
        """Compilations recorded (docs/goodput.md)."""
        return self._compiles.count

    @property
    def empty(self) -> bool:
        """Whether no step and no component was read."""
        return not self.w_step and not self.i_start

    # --- reading -----------------------------------------------------------------------

    def add(self, obj: Mapping[str, Any]) -> None:
        """Take one record of the spans file."""
        kind = obj.get(rs.TYPE)
        if kind == rs.TYPE_STEP:
            self._step(obj)
        elif kind == rs.TYPE_SPAN:
            self._loose_span(obj)
        elif kind == rs.TYPE_SESSION:
            first, last = _int(obj.get("first_start_ns")), _int(obj.get("last_end_ns"))
            scope = str(obj.get(rs.SCOPE) or "default")
            if first and last:
                self.sessions[scope] = (first, last)
            unsampled = _seconds(obj.get(rs.UNSAMPLED))
            if unsampled:
                self.session_unsampled[scope] = unsampled
            self.last_ns = max(self.last_ns, last)
        elif kind in (rs.TYPE_RUN, "meta"):
            self._header(obj)

    def _header(self, obj: Mapping[str, Any]) -> None:
        if _int(obj.get("process_start_ns")) > 0:
            self.start_ns, self.start_source = int(obj["process_start_ns"]), "process start"
        elif _int(obj.get(rs.START_NS)) > 0:
            self.start_ns, self.start_source = int(obj[rs.START_NS]), "configure()"
        elif isinstance(obj.get("time"), int | float):
            self.start_ns, self.start_source = int(obj["time"] * 1e9), "configure()"
        rate = obj.get("sampling_rate")
        if isinstance(rate, int) and rate > 1:
            self.sampling_rate = rate
        run_id = obj.get("run_id")
        if isinstance(run_id, str) and run_id:
            self.run_id = run_id
        resource = obj.get("resource")
        if isinstance(resource, Mapping):
            rid = resource.get("tunix.run.id")
            if isinstance(rid, str) and rid:
                self.run_id = self.run_id or rid
            job = resource.get("tunix.job.id")
            if isinstance(job, str | int) and not isinstance(job, bool) and str(job):
                self.job_id = str(job)
            attempt = resource.get("tunix.job.attempt")
            if isinstance(attempt, str) and attempt.isdigit():
                attempt = int(attempt)
            if isinstance(attempt, int) and not isinstance(attempt, bool):
                self.attempt = attempt
            if self.rank is None and isinstance(resource.get("tunix.rank"), int):
                self.rank = resource["tunix.rank"]
        if isinstance(obj.get("job_id"), str) and obj["job_id"]:
            self.job_id = obj["job_id"]
        if isinstance(obj.get("attempt"), int) and not isinstance(obj["attempt"], bool):
            self.attempt = obj["attempt"]

    def _step(self, obj: Mapping[str, Any]) -> None:
        start, end = _int(obj.get(rs.START_NS)), _int(obj.get(rs.END_NS))
        if end < start or not start:
            return
        scope = str(obj.get(rs.SCOPE) or "default")
        idx = self._scope_index.get(scope)
        if idx is None:
            idx = self._scope_index[scope] = len(self.scopes)
            self.scopes.append(scope)
        window = len(self.w_step)
        self.w_scope.append(idx)
        self.w_step.append(_int(obj.get(rs.STEP)))
        self.w_start.append(start)
        self.w_end.append(end)
        unsampled = _seconds(obj.get(rs.UNSAMPLED))
        if unsampled:
            self._unsampled[window] = unsampled
        self.host_end_ns = max(self.host_end_ns, end)
        device_end = _int(obj.get(rs.DEVICE_END_NS))
        self.device_end_ns = max(self.device_end_ns, device_end)
        self.last_ns = max(self.last_ns, end, device_end)
        spans = obj.get(rs.SPANS)
        if not isinstance(spans, list):
            return
        found = []
        for s in spans:
            if isinstance(s, Mapping):
                category = self._component(s, window)
                if category is not None:
                    found.append(
                        (
                            str(s.get(rs.NAME)),
                            category,
                            s.get(rs.SPAN_ID),
                            s.get(rs.PARENT),
                            s.get(rs.ATTRIBUTES),
                        )
                    )
        self._compiles.add(found, siblings=True)

    def _loose_span(self, obj: Mapping[str, Any]) -> None:
        self.outside_spans += obj.get(rs.OUTSIDE) is True
        category = self._component(obj, _BESIDE)
        if category is not None:
            found = (
                str(obj.get(rs.NAME)),
                category,
                obj.get(rs.SPAN_ID),
                obj.get(rs.PARENT),
                obj.get(rs.ATTRIBUTES),
            )
            self._compiles.add((found,), siblings=False)

    def _component(self, s: Mapping[str, Any], owner: int) -> str | None:
        """Keep one component's interval (a step's own, or beside the steps); its category
        (``None``: not a component)."""
        s0, s1 = s.get(rs.START_NS), s.get(rs.END_NS)
        if type(s0) is not int or type(s1) is not int:  # (what the SDK writes: fast path)
            s0, s1 = _int(s0), _int(s1)
        if s1 < s0 or not s0:
            return None
        if s1 > self.last_ns:
            self.last_ns = s1
        name, given = s.get(rs.NAME, ""), s.get(rs.CATEGORY)
        category = cat.classify(
            name if type(name) is str else str(name),
            s.get(rs.KIND) == KIND_BLOCKED,
            given if type(given) is str else None,
        )
        if s1 > s0:
            attrs = s.get(rs.ATTRIBUTES)
            if isinstance(attrs, Mapping) and attrs.get(BACKGROUND) is True:
                owner = _BESIDE  # background work: beside the steps
            self.i_code.append(_CODE[category])
            self.i_start.append(s0)
            self.i_end.append(s1)
            self.i_owner.append(owner)
        return category

    # --- the ledger --------------------------------------------------------------------

    def goodput(
        self, redo: Mapping[str, Sequence[tuple[int, int]]] | None = None
    ) -> tuple[Goodput, int]:
        """This file's figures, and how many of its steps were redone.

        Args:
            redo: Per scope, the step ranges (``(first, last)``) later attempts of the job
                ran: this file's steps in them are ``wasted_progress``.
        """
        g = Goodput()
        first_step = min(self.w_start) if self.w_start else None
        firsts = [x for x in (first_step, min(self.i_start, default=None)) if x is not None]
        if not firsts:
            return g, 0
        start = self.start_ns
        if start is None or start > min(firsts):
            g.notes.append(
                "initialization unknown (no run header with a start, or one later than the "
                "first record): wall time starts at the first record"
            )
            start = min(firsts)
        end = max(self.last_ns, start)
        engine = Ledger(start, sampled=self.sampling_rate > 1)
        if engine.sampled:
            g.notes.append(
                "sampling_rate > 1: the time between two sampled steps of a scope counts as "
                "step time (the unsampled steps ran there), less the badput time their "
                "components measured"
            )
            for scope, (first, _) in self.sessions.items():
                engine.scope_first(scope, first)
        redone = self._feed(engine, redo or {})
        for scope, (_, last) in self.sessions.items():
            engine.scope_last(scope, last)
        for scope, seconds in self.session_unsampled.items():
            engine.add_unsampled(scope, seconds)
        engine.finish(end)
        f = engine.figures()
        g.wall_time_sec = f.wall_time_sec
        if self.device_end_ns > self.host_end_ns:
            g.device_run_on_sec = (min(self.device_end_ns, end) - self.host_end_ns) * _NS
        g.productive_sec = f.productive_sec
        for k, v in f.badput_sec.items():
            g.badput_sec[k] = g.badput_sec.get(k, 0.0) + v
        return g, redone

    def _feed(self, engine: Ledger, redo: Mapping[str, Sequence[tuple[int, int]]]) -> int:
        """Every step window (with its own components) and every component beside the
        steps, in start order, to ``engine``, settled as it goes; the steps redone."""
        evals = [cat.is_eval_scope(s) for s in self.scopes]
        redone = 0
        names = cat.PRECEDENCE
        w_start = np.frombuffer(self.w_start, dtype=np.int64)
        owners = np.frombuffer(self.i_owner, dtype=np.int64)
        i_start = np.frombuffer(self.i_start, dtype=np.int64)
        by_owner = np.lexsort((i_start, owners))  # each window's components together
        sorted_owners = owners[by_owner]
        bounds = np.searchsorted(sorted_owners, np.arange(-1, len(self.w_step) + 1))
        beside = by_owner[bounds[0] : bounds[1]]  # (owner -1 first, by start)
        codes, starts, ends = self.i_code, self.i_start, self.i_end
        j = 0
        for k, w in enumerate(np.argsort(w_start, kind="stable").tolist()):
            w_s = self.w_start[w]
            while j < len(beside) and starts[int(beside[j])] < w_s:
                b = int(beside[j])
                engine.add_beside(names[codes[b]], starts[b], ends[b])
                j += 1
            sc, number = self.w_scope[w], self.w_step[w]
            wasted = not evals[sc] and any(
                lo <= number <= hi for lo, hi in redo.get(self.scopes[sc], ())
            )
            redone += wasted
            own = [
                (names[codes[i]], starts[i], ends[i])
                for i in by_owner[bounds[w + 1] : bounds[w + 2]].tolist()
            ]
            scope = self.scopes[sc]
            prev_last = engine.last_number(scope)
            engine.add_step(scope, number, w_s, self.w_end[w], own, wasted=wasted)
            if wasted and prev_last is not None and engine.sampled:
                redone += max(0, number - prev_last - 1)
            unsampled = self._unsampled.get(w)
            if unsampled:
                engine.add_unsampled(scope, unsampled)
            if k and k % _SETTLE_EVERY == 0:
                engine.settle(w_s)
        for b in beside[j:].tolist():
            engine.add_beside(names[codes[b]], starts[b], ends[b])
        return redone


def _seconds(v: object) -> dict[str, float]:
    """A ``{category: seconds}`` object of a line (anything else: empty)."""
    if not isinstance(v, Mapping):
        return {}
    return {
        str(k): float(x)
        for k, x in v.items()
        if isinstance(x, int | float) and not isinstance(x, bool) and x > 0
    }


def read_timeline(path: Path, rank: int | None = None) -> RunTimeline:
    """Read one spans file (plain or gzip) into a :class:`RunTimeline`; a run without a
    start in its header starts at its ``metrics.jsonl`` header, if that is this rank's."""
    t = RunTimeline(path, rank)
    for obj in iter_records(path, t.stats):
        t.add(obj)
    if t.start_ns is None:
        start = metrics_start_ns(path.parent, t.rank)
        if start is not None:
            t.start_ns, t.start_source = start, "metrics.jsonl header"
    return t


def metrics_start_ns(folder: Path, rank: int | None) -> int | None:
    """The ``time`` of the ``metrics.jsonl`` header in the folder (the run's configure
    time), if that header is this rank's."""
    for name in ("metrics.jsonl", "metrics.jsonl.gz"):
        p = folder / name
        if not p.is_file():
            continue
        try:
            for obj in iter_records(p):
                if obj.get(rs.TYPE) != "meta" or not isinstance(obj.get("time"), int | float):
                    return None
                meta_rank = obj.get("rank")
                if rank is not None and isinstance(meta_rank, int) and meta_rank != rank:
                    return None
                return int(obj["time"] * 1e9)
        except AnalysisError:
            return None
    return None
