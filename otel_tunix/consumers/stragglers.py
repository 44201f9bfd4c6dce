"""Stragglers named during the run: the ranks of a job compare their recent step times.

Every ``window`` sampled steps of one scope (``OTEL_TUNIX_STRAGGLER_WINDOW``, default 50;
``OTEL_TUNIX_STRAGGLER_SCOPE``, default ``train``) each rank puts its window (its mean step
time, its mean *own* time and mean time per component, and its slowest steps' trace ids) in
the job's ``torch.distributed`` store. A rank's own time is its step time minus the time it
was blocked (components marked ``blocked``: a collective waiting for the other ranks; for a
step whose components ended on the GPU, the device time of its blocked ones when that is
more, since the GPU does a NCCL collective's waiting while the host runs ahead): in a
synchronised job, where a collective in every step makes every rank's step as long as the
slowest one's, the step times are all alike and only the own time tells the ranks apart.
Rank 0 reads the ranks' windows, compares each rank's mean own time with the ranks' median
and publishes the ranks' relative speeds (median / own: 1 is typical, 0.5 twice as slow),
which every rank reads back as ``tunix.rank.relative_speed``. A rank slower than the median
by more than the margin (``OTEL_TUNIX_STRAGGLER_MARGIN``, 20 %) for
``OTEL_TUNIX_STRAGGLER_WINDOWS`` windows in a row (3) is a straggler: rank 0 raises the
``straggler`` alert (alerts.jsonl, span event, OTel log record, Datadog event) naming the
rank, the component that grew most against the ranks' median and the trace ids of the
rank's slowest steps of the window; it resolves when the rank is back within half the margin.

All of it off the training thread: the worker adds each sampled step to the window, the
exchange runs on a thread of its own. Over the store rather than a collective on a process
group: a collective needs every rank to enter it in the same order as the program's own
collectives (a process group made in ``configure()`` would hang a job whose ranks do not all
call it), while a store read waits with a timeout on our thread and never blocks the
program. A rank that does not answer within the timeout is reported once and the detector
stops. Needs ``torch.distributed`` or ``jax.distributed`` initialised (checked when the first
window is full); JAX jobs exchange through its coordination service's key-value store.
"""

from __future__ import annotations

import heapq
import json
import logging
import queue
import statistics
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from otel_tunix.consumers.step_accounting import StepSink
from otel_tunix.model.alert_rules import Severity
from otel_tunix.model.steps import StepSummary
from otel_tunix.recording.current_run import meter
from otel_tunix.support.errors import warn_once

_logger = logging.getLogger(__name__)

RULE = "straggler"
EXCHANGE_TIMEOUT_SEC = 300.0
"""How long the exchange waits for the other ranks' window before giving up."""
CLOSE_WAIT_SEC = 1.0
"""How long ``close()`` lets the windows still queued be compared."""
SLOWEST_STEPS = 3
"""How many of a rank's slowest steps (by own time) a window names, with their trace ids."""
TRACE_IDS = "tunix.straggler.trace_ids"
"""Alert attribute: trace ids of the straggler's slowest steps in the window, slowest first."""
STEPS = "tunix.straggler.steps"
"""Alert attribute: those steps' numbers, in the same order."""


@dataclass(frozen=True, slots=True)
class RankWindow:
    """One rank's window: its mean step time, mean own time (step time minus blocked time),
    mean time per component (busy + blocked) and slowest steps."""

    rank: int
    first_step: int
    last_step: int
    step_time_sec: float
    components: Mapping[str, float]
    own_time_sec: float | None = None
    """Mean step time minus blocked time (``None``: the step time)."""
    slowest: Sequence[tuple[int, str]] = ()
    """``(step, trace id)`` of the rank's slowest steps by own time, slowest first."""

    @property
    def own_sec(self) -> float:
        """What the ranks compare: the own time, else the step time."""
        return self.step_time_sec if self.own_time_sec is None else self.own_time_sec

    def to_json(self) -> str:
        return json.dumps(
            {
                "rank": self.rank,
                "first": self.first_step,
                "last": self.last_step,
                "step_time": self.step_time_sec,
                "own_time": self.own_time_sec,
                "components": dict(self.components),
                "slowest": [list(x) for x in self.slowest],
            }
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> RankWindow:
        d = json.loads(raw)
        slowest = tuple((int(n), str(t)) for n, t in d.get("slowest", ()))
        return cls(
            d["rank"],
            d["first"],
            d["last"],
            d["step_time"],
            d["components"],
            d.get("own_time"),
            slowest,
        )


@dataclass(frozen=True, slots=True)
class RankVerdict:
    """How one rank compares with the others in a window."""

    rank: int
    relative_speed: float
    """The ranks' median own time / this rank's (1: typical, 0.5: twice as slow)."""
    slow: bool
    """Slower than the median by more than the margin."""
    recovered: bool
    """Within half the margin of the median."""
    grew: str | None
    """The component whose time is furthest above the ranks' median for it."""
    grew_by_sec: float


def compare(windows: Sequence[RankWindow], margin: float) -> list[RankVerdict]:
    """Each rank of ``windows`` (one per rank, same steps) against the ranks' median: its
    own time (step time minus blocked), and each component's time (a rank without a
    component counts 0 for it)."""
    median = statistics.median(w.own_sec for w in windows)
    names = {name for w in windows for name in w.components}
    typical = {
        name: statistics.median(w.components.get(name, 0.0) for w in windows) for name in names
    }
    out = []
    for w in windows:
        ratio = w.own_sec / median if median > 0 else 1.0
        grew, grew_by = None, 0.0
        for name, own in w.components.items():
            if own - typical[name] > grew_by:
                grew, grew_by = name, own - typical[name]
        out.append(
            RankVerdict(
                rank=w.rank,
                relative_speed=1.0 / ratio if ratio > 0 else 1.0,
                slow=ratio > 1.0 + margin,
                recovered=ratio <= 1.0 + margin / 2,
                grew=grew,
                grew_by_sec=grew_by,
            )
        )
    return out


class StragglerDetector(StepSink):
    """Compares this rank's recent steps with the other ranks' (see the module docstring).

    Args:
        rank: This process's rank.
        world_size: Ranks in the job.
        run_id: The run (every rank's must be the same: a launcher's job id).
        scope: Scope whose steps are compared.
        window: Sampled steps per window.
        margin: Slower than the median by more than this (a fraction) is slow.
        windows: Slow windows in a row before the alert fires.
        engine: The alert engine that acts (rank 0's; ``None``: no alert).
        logger: Rank 0 logs ``ranks/slowest_relative_speed`` and
            ``ranks/exchange_cpu_sec`` to it at each window's last step.
        store: The store to exchange through (default: ``torch.distributed``'s, once it is
            initialised).
        timeout_sec: Longest wait for the other ranks' windows.
        meter_provider: Where ``tunix.rank.relative_speed`` lives (default: the run's).
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        run_id: str,
        scope: str = "train",
        window: int = 50,
        margin: float = 0.2,
        windows: int = 3,
        engine: Any = None,
        logger: Any = None,
        store: Any = None,
        timeout_sec: float = EXCHANGE_TIMEOUT_SEC,
        meter_provider: Any = None,
    ) -> None:
        if window < 1 or windows < 1 or not margin > 0:
            raise ValueError(f"straggler window={window}, windows={windows}, margin={margin}")
        self.rank, self.world_size, self.scope = rank, world_size, scope
        self.window, self.margin, self.windows = window, margin, windows
        self._prefix = f"otel-tunix/{run_id}/stragglers/{scope}/"
        self._engine, self._logger = engine, logger
        self._store = store
        self._timeout = timedelta(seconds=timeout_sec)
        self._steps: list[StepSummary] = []
        self._index = 0
        self._queue: queue.SimpleQueue[RankWindow | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._streak = [0] * world_size
        self._firing = [False] * world_size
        self.relative_speed: float | None = None
        """This rank's relative speed in the latest window compared."""
        self.exchange_cpu_sec: list[float] = []
        """CPU time of each window's exchange on the exchange thread (its cost; the wall
        time also waits for the slowest rank)."""
        scope_name = "otel_tunix.consumers.stragglers"
        m = meter_provider.get_meter(scope_name) if meter_provider else meter(scope_name)
        self._gauge = m.create_gauge(
            "tunix.rank.relative_speed",
            unit="1",
            description="The ranks' median step time / this rank's, per window of steps",
        )

    # --- on the worker thread -----------------------------------------------------------
    def on_step(self, summary: StepSummary) -> None:
        if self._stopped or summary.scope != self.scope:
            return
        steps = self._steps
        steps.append(summary)
        if len(steps) < self.window:
            return
        self._steps = []
        components: dict[str, float] = {}
        for s in steps:
            for name, (busy, blocked, _) in s.component_times.items():
                components[name] = components.get(name, 0.0) + busy + blocked
        n = len(steps)
        own = [s.step_time_sec - _blocked_sec(s) for s in steps]
        slowest = heapq.nlargest(SLOWEST_STEPS, range(n), key=own.__getitem__)
        mine = RankWindow(
            self.rank,
            steps[0].step,
            steps[-1].step,
            sum(s.step_time_sec for s in steps) / n,
            {name: t / n for name, t in components.items()},
            sum(own) / n,
            tuple((steps[i].step, steps[i].trace_id) for i in slowest),
        )
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._exchange_loop, name="otel-tunix-stragglers", daemon=True
            )
            self._thread.start()
        self._queue.put(mine)

    def close(self) -> None:
        """Compare the windows still queued (a second at most), then stop."""
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(CLOSE_WAIT_SEC)
        self._stopped = True

    # --- on the exchange thread -----------------------------------------------------------
    def _exchange_loop(self) -> None:
        while True:
            mine = self._queue.get()
            if mine is None or self._stopped:
                return
            try:
                store = self._store if self._store is not None else _job_store()
                if store is None:
                    warn_once(
                        ("stragglers", "store"),
                        "otel-tunix: straggler detection needs torch.distributed initialised "
                        "(init_process_group); not comparing ranks",
                        logger=_logger,
                    )
                    self._stopped = True
                    return
                self._store = store
                start = time.thread_time()
                self._exchange(store, mine)
                self.exchange_cpu_sec.append(time.thread_time() - start)
            except Exception as exc:  # a rank gone or too slow to answer, the store down
                warn_once(
                    ("stragglers", "exchange"),
                    "otel-tunix: comparing step times with the other ranks failed (%s: %s); "
                    "straggler detection stops",
                    type(exc).__name__,
                    exc,
                    logger=_logger,
                )
                self._stopped = True
                return
            finally:
                self._index += 1

    def _key(self, index: int, who: str) -> str:
        return f"{self._prefix}w{index}/{who}"

    def _exchange(self, store: Any, mine: RankWindow) -> None:
        w = self._index
        store.set(self._key(w, f"r{self.rank}"), mine.to_json())
        if self.rank == 0:
            keys = [self._key(w, f"r{r}") for r in range(self.world_size)]
            store.wait(keys, self._timeout)
            windows = [RankWindow.from_json(store.get(k)) for k in keys]
            verdicts = compare(windows, self.margin)
            speeds = [v.relative_speed for v in verdicts]
            store.set(self._key(w, "speeds"), json.dumps(speeds))
            self._judge(verdicts, windows, mine)
            if w >= 2:  # every rank has read window w - 2's speeds by now
                for r in range(self.world_size):
                    store.delete_key(self._key(w - 2, f"r{r}"))
                store.delete_key(self._key(w - 2, "speeds"))
        else:
            store.wait([self._key(w, "speeds")], self._timeout)
            speeds = json.loads(store.get(self._key(w, "speeds")))
        speed = self.relative_speed = float(speeds[self.rank])
        self._gauge.set(speed, {"scope": self.scope})

    def _judge(
        self, verdicts: Sequence[RankVerdict], windows: Sequence[RankWindow], mine: RankWindow
    ) -> None:
        """Rank 0: streaks per rank, the alert's transitions, the window's scalars."""
        for v, theirs in zip(verdicts, windows, strict=True):
            r = v.rank
            if v.slow:
                self._streak[r] += 1
                if self._streak[r] >= self.windows and not self._firing[r]:
                    self._firing[r] = True
                    self._alert(v, theirs, Severity.WARNING)
            else:
                self._streak[r] = 0
                if v.recovered and self._firing[r]:
                    self._firing[r] = False
                    self._alert(v, theirs, Severity.OK)
        if self._logger is not None:
            values = {"ranks/slowest_relative_speed": min(v.relative_speed for v in verdicts)}
            if self.exchange_cpu_sec:  # the previous window's: this one is not done yet
                values["ranks/exchange_cpu_sec"] = self.exchange_cpu_sec[-1]
            self._logger.log_dict(values, step=mine.last_step)

    def _alert(self, v: RankVerdict, theirs: RankWindow, severity: Severity) -> None:
        """The transition of rank ``v.rank``, whose window is ``theirs``."""
        if self._engine is None:
            return
        slower = 1.0 / v.relative_speed if v.relative_speed > 0 else float("inf")
        steps = f"steps {theirs.first_step}-{theirs.last_step}"
        attributes: dict[str, Any] = {}
        if severity is Severity.OK:
            message = (
                f"otel-tunix alert resolved: {RULE}: rank {v.rank} is back at "
                f"{slower:.2f}x the ranks' median own time ({self.scope}, {steps})"
            )
        else:
            grew = (
                f"; {v.grew} grew most (+{v.grew_by_sec * 1e3:.1f} ms a step over the ranks' "
                f"median)"
                if v.grew
                else ""
            )
            traces = ""
            if theirs.slowest:
                attributes[STEPS] = [n for n, _ in theirs.slowest]
                attributes[TRACE_IDS] = [t for _, t in theirs.slowest]
                n, trace = theirs.slowest[0]
                traces = f"; slowest: step {n}, trace {trace}"
            message = (
                f"otel-tunix alert [WARNING] {RULE}: rank {v.rank} took {slower:.2f}x the "
                f"ranks' median own time (step time minus blocked) in {self.windows} windows "
                f"of {self.window} {self.scope} steps in a row, up to {steps}{grew}{traces}"
            )
        self._engine.report(
            RULE,
            f"rank {v.rank}",
            severity,
            slower,
            theirs.last_step,
            f"> median own time x {1 + self.margin:g} for {self.windows} windows"
            + (f" ({v.grew})" if v.grew else ""),
            message,
            attributes,
        )


def _blocked_sec(summary: StepSummary) -> float:
    """The time a step waited: its blocked time on the host, or for a step whose components
    ended on the device, the device time of its blocked components when that is more.

    A NCCL collective returns to the host at once and the GPU does the waiting: the host
    runs ahead, the collective's span (ended on the device) lies under the next busy
    components' and the step's blocked time stays near 0 on every rank. The time between
    the collective's two CUDA events (``StepSummary.device_blocked_time_sec``) is the GPU's
    wait, the same figure in device time.
    """
    blocked = summary.blocked_time_sec
    on_device = min(summary.device_blocked_time_sec, summary.step_time_sec)
    return on_device if on_device > blocked else blocked


def _job_store() -> Any:
    """The job's key-value store: ``torch.distributed``'s default group's, else JAX's
    multi-host coordination service's; ``None`` when neither is initialised."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        # The default group's store (the job's rendezvous store): a private accessor,
        # stable since torch 1.x; without it there is nothing to exchange through.
        get_store = getattr(dist.distributed_c10d, "_get_default_store", None)
        return get_store() if get_store is not None else None
    jax_distributed = sys.modules.get("jax._src.distributed")
    state = getattr(jax_distributed, "global_state", None)
    client = getattr(state, "client", None)  # set by jax.distributed.initialize()
    return _JaxStore(client) if client is not None else None


class _JaxStore:
    """JAX's coordination service key-value store (``jax.distributed``'s client, private
    but the only handle JAX gives to it), under the calls the exchange makes of a
    ``torch.distributed`` store."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def set(self, key: str, value: str) -> None:
        self._client.key_value_set(key, value)

    def wait(self, keys: Sequence[str], timeout: timedelta) -> None:
        ms = max(1, int(timeout.total_seconds() * 1000))
        for key in keys:
            self._client.blocking_key_value_get(key, ms)

    def get(self, key: str) -> str:
        return str(self._client.blocking_key_value_get(key, 1000))

    def delete_key(self, key: str) -> None:
        self._client.key_value_delete(key)
