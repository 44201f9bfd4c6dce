"""Tunix's experimental control plane (``tunix.experimental.orchestrator``, upstream HEAD):
policy version and staleness per RL step, and time per worker state. Patched by
:class:`otel_tunix.instrumentation.tunix.TunixInstrumentor` where that package exists.

* ``StandardRLProgram``: its public ``on_step_begin`` / ``on_step_end`` callbacks (the
  user's, if any, still called) open and close one ``rl/learner`` step per train-stage step,
  numbered by the program's step (its policy version as the step begins). The step span
  carries ``tunix.rl.policy_version`` (the learner's version) and ``tunix.rl.policy_lag``
  (the learner's version minus the oldest policy version among the rollouts the step trained
  on; the rollouts' versions are read as the critique stage takes their groups from the
  program's raw queue), and both are logged to otel-tunix's MetricsLogger (``policy_version``,
  ``policy_lag``: the catalog's ``tunix.rl.policy_version`` / ``tunix.rl.policy_lag``).
* ``HealthMonitor.poll``: each worker's time in a state, from the poll that first saw it
  there to the poll that saw it leave (or ``close()``), is a component
  ``worker_<state>`` (``worker_compiling``, ``worker_syncing``, ``worker_draining``, ...)
  with ``tunix.worker.id`` and ``tunix.worker.state``: in the step open where the monitor
  is polled, else an outside component, counted in every step it overlaps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import otel_tunix
from otel_tunix.instrumentation import _base
from otel_tunix.instrumentation._base import step_is_open
from otel_tunix.instrumentation._tunix_perf import LEARNER_SCOPE
from otel_tunix.support.errors import report_internal_error, warn_once

_logger = logging.getLogger("otel_tunix.instrumentation.tunix")  # the public module's logger

_clock = time.perf_counter_ns

POLICY_VERSION = "tunix.rl.policy_version"
"""Step attribute (and catalog metric): the learner's policy version the step trains."""
POLICY_LAG = "tunix.rl.policy_lag"
"""Step attribute (and catalog metric): learner version minus the oldest rollout's."""
WORKER_ID = "tunix.worker.id"
WORKER_STATE = "tunix.worker.state"


def _version(item: Any) -> int | None:
    version = getattr(item, "policy_version", None)
    return int(version) if isinstance(version, int) and not isinstance(version, bool) else None


class ProgramSteps:
    """The otel-tunix steps of one ``StandardRLProgram``'s train stage."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rollout_version: dict[Any, int] = {}
        """Oldest policy version of each group the critique stage took, by group id."""
        self._trained: list[int] = []
        self._step: Any = None
        self._version: int | None = None

    def note_group(self, group: Sequence[Any]) -> None:
        """A group leaves the raw queue: remember its oldest rollout version."""
        versions = [v for v in map(_version, group) if v is not None]
        if group and versions:
            with self._lock:
                self._rollout_version[getattr(group[0], "group_id", None)] = min(versions)

    def note_trained(self, items: Sequence[Any]) -> None:
        """Scored items the train stage takes: their groups' rollout versions count."""
        with self._lock:
            for item in items:
                version = self._rollout_version.pop(getattr(item, "group_id", None), None)
                if version is not None:
                    self._trained.append(version)

    def begin(self, step: int) -> None:
        """``on_step_begin(step)``: open the ``rl/learner`` step ``step``."""
        self.end(None)
        if step_is_open():  # the user's own step: ours would nest a second one
            return
        _base.ensure_configured()
        self._version = int(step)
        with self._lock:
            self._trained = []
        s = otel_tunix.step(self._version, scope=LEARNER_SCOPE)
        s.__enter__()
        self._step = s
        s.set_attribute(POLICY_VERSION, self._version)

    def end(self, step: int | None) -> None:
        """``on_step_end``: the step's policy lag, on its span and as a metric; close it."""
        s, self._step = self._step, None
        if s is None:
            return
        version = self._version if self._version is not None else 0
        with self._lock:
            trained, self._trained = self._trained, []
        metrics: dict[str, float] = {"policy_version": version}
        if trained:
            lag = version - min(trained)
            s.set_attribute(POLICY_LAG, lag)
            metrics["policy_lag"] = lag
        s.__exit__(None, None, None)
        otel_tunix.get_metrics_logger().log_dict(metrics, step=version)


def _chain(ours: Callable[..., None], theirs: Callable[..., Any] | None) -> Callable[..., Any]:
    def callback(*args: Any) -> Any:
        try:
            ours(*args)
        except Exception:  # only our own code: a bug of ours
            report_internal_error("a Tunix orchestrator step callback")
        return theirs(*args) if theirs is not None else None

    callback.__wrapped__ = theirs  # type: ignore[attr-defined]
    return callback


def _wrap_queue(queue: Any, method: str, note: Callable[[Sequence[Any]], None]) -> None:
    inner = getattr(queue, method)

    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        items = await inner(*args, **kwargs)
        try:
            note(items or [])
        except Exception:  # only our own code: a bug of ours
            report_internal_error("noting a Tunix orchestrator queue item")
        return items

    setattr(queue, method, wrapped)


def instrument_program(program: Any) -> None:
    """Chain our step callbacks to ``program``'s and watch its queues (idempotent)."""
    if getattr(program, "_otel_tunix_steps", None) is not None:
        return
    try:
        steps = ProgramSteps()
        program.on_step_begin = _chain(steps.begin, program.on_step_begin)
        program.on_step_end = _chain(lambda step, _result: steps.end(step), program.on_step_end)
        _wrap_queue(program.raw_q, "get_group", steps.note_group)
        _wrap_queue(program.scored_q, "get_batch", steps.note_trained)
        program._otel_tunix_steps = steps
    except Exception:  # Tunix's orchestrator changed (callbacks or queues renamed)
        warn_once(
            ("tunix", "orchestrator"),
            "otel-tunix: instrumenting Tunix's StandardRLProgram failed; its steps, policy "
            "version and policy lag are not recorded",
            logger=_logger,
            exc_info=True,
        )


class WorkerStates:
    """Each worker's current state and since when (our clock), per health monitor."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: dict[str, tuple[str, int]] = {}

    def polled(self, reports: dict[str, Any]) -> None:
        """A poll's reports: a worker seen in a new state (or gone) ends its previous one."""
        now = _clock()
        ended: list[tuple[str, str, int]] = []
        with self._lock:
            for wid, report in reports.items():
                state = str(getattr(getattr(report, "state", None), "value", report.state))
                previous = self._since.get(wid)
                if previous is None or previous[0] != state:
                    if previous is not None:
                        ended.append((wid, previous[0], previous[1]))
                    self._since[wid] = (state, now)
            for wid in [w for w in self._since if w not in reports]:
                state, since = self._since.pop(wid)
                ended.append((wid, state, since))
        _record(ended, now)

    def close(self) -> None:
        """The monitor closes: every worker's current state ends now."""
        now = _clock()
        with self._lock:
            ended = [(wid, state, since) for wid, (state, since) in self._since.items()]
            self._since.clear()
        _record(ended, now)


def _record(ended: list[tuple[str, str, int]], end_ns: int) -> None:
    for wid, state, since in ended:
        otel_tunix.record_component(
            f"worker_{state.lower()}",
            since,
            end_ns,
            attributes={WORKER_ID: wid, WORKER_STATE: state},
        )


def _states(monitor: Any) -> WorkerStates:
    states = getattr(monitor, "_otel_tunix_states", None)
    if states is None:
        states = monitor._otel_tunix_states = WorkerStates()
    return states


def wrap_program_init(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    """``StandardRLProgram.__init__``: then :func:`instrument_program`."""
    result = wrapped(*args, **kwargs)
    instrument_program(instance)
    return result


def wrap_poll(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    """``HealthMonitor.poll``: the reports' state changes as components."""
    reports = wrapped(*args, **kwargs)
    try:
        _states(instance).polled(dict(reports))
    except Exception:  # a report without a state: Tunix's health reports changed
        warn_once(
            ("tunix", "worker-states"),
            "otel-tunix: reading Tunix's worker health reports failed; worker states not recorded",
            logger=_logger,
            exc_info=True,
        )
    return reports


def wrap_monitor_close(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    """``HealthMonitor.close``: every worker's current state ends."""
    try:
        _states(instance).close()
    except Exception:  # only our own code: a bug of ours
        report_internal_error("closing Tunix worker states")
    return wrapped(*args, **kwargs)
