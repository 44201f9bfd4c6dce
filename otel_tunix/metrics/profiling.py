"""Profile captures: the framework's profiler (torch or JAX) over the next steps of the
rank, when an alert fires or when the program asks (``otel_tunix.capture_profile()``).

A capture is asked for from any thread (an alert on a ``perf/...`` metric fires on
otel-tunix's worker); it starts at the next step that opens, on that step's thread, and
covers that step and the next ones of the same scope on the same thread (``steps`` in all),
then the profiler stops and writes its file under ``<run folder>/profiles/``. The step
boundaries drive it through :attr:`otel_tunix.recording.step_record.Runtime.step_watch`,
which is set only while a capture is pending or running: with none, a step costs one
attribute read more at each edge.

Both ways linked: each profiled step opens a profiler annotation named after the step that
carries its OTel trace id (torch: a ``record_function`` named ``<scope>_step <n>
trace_id=<hex>``, the capture's ``custom_trace_id_callback`` answering the first step's trace
id and an ``otel_tunix`` metadata entry listing every step's; JAX: a
``StepTraceAnnotation`` with ``trace_id=<hex>`` in its kwargs), and each profiled sampled
step's span gets ``tunix.profile.path``, the capture's path relative to the run folder.

Never two profilers at once: a capture whose start finds a profiler running (the user's,
Tunix's) is skipped and counted; nothing here raises into the training loop.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from otel_tunix.accounting.categories import PROFILING
from otel_tunix.pipeline.step_sinks import StepSink
from otel_tunix.recording.current_run import get_current
from otel_tunix.recording.hot_path import now_ns, record_component
from otel_tunix.recording.step_record import Runtime, StepRecord, StepWatch
from otel_tunix.settings import attributes as attr
from otel_tunix.support.errors import warn_once

__all__ = [
    "PROFILE_PATH",
    "TRIGGER_FILE",
    "Capture",
    "ProfileCaptures",
    "ProfileFileTrigger",
    "capture_profile",
    "profiler_running",
]

if TYPE_CHECKING:
    from otel_tunix.pipeline.span_builder import FinishedStep

_logger = logging.getLogger(__name__)

TRIGGER_FILE = "capture_profile"
"""A file of this name made (or touched) in the run folder asks every rank of the run for a
capture; ``capture_profile-rank<N>`` asks rank N only. Its text, when a number, is the
steps to capture."""

PROFILE_PATH = attr.PROFILE_PATH
"""The attribute, on a profiled step's span and on the alert that asked for the capture:
the capture's path relative to the run folder."""

PROFILER_START = "profiler_start"
PROFILER_STOP = "profiler_stop"
"""The components of a profiled step that start and stop the profiler (the stop writes the
file): goodput category ``profiling``."""

PROFILES_DIR = "profiles"
"""The run folder's subfolder of the captures."""


@dataclass(slots=True)
class Capture:
    """One capture: asked for, then running, then written (or failed)."""

    index: int
    path: str
    """Relative to the run folder (a file for torch, a folder for JAX)."""
    framework: str
    steps: int
    reason: dict[str, Any]
    """Why: the alert's rule, metric, severity and step, or ``{"requested": "code"}``."""
    status: str = "pending"
    """``pending``, ``running``, ``written``, ``failed`` or ``skipped``."""
    scope: str | None = None
    step_numbers: list[int] = field(default_factory=list)
    trace_ids: list[str] = field(default_factory=list)
    """The OTel trace ids (32 hex digits) of the profiled steps that were sampled."""
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The capture as ``summary.json`` lists it."""
        out: dict[str, Any] = {
            "path": self.path,
            "framework": self.framework,
            "status": self.status,
            "scope": self.scope,
            "steps": list(self.step_numbers),
            "trace_ids": list(self.trace_ids),
            "reason": dict(self.reason),
        }
        if self.error is not None:
            out["error"] = self.error
        return out


def profiler_running(framework: str) -> bool:
    """Whether a profiler of ``framework`` is already running in this process (torch: the
    autograd profiler's flag; JAX tells only when a start fails)."""
    if framework == "torch":
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        try:
            return bool(torch.autograd.profiler._is_profiler_enabled) or bool(
                torch._C._autograd._profiler_enabled()
            )
        except Exception:
            return False
    return False


class _ProfilerBusy(Exception):
    """Another profiler is running."""


class _TorchSession:
    """``torch.profiler.profile`` with CPU activities, and CUDA where it is available."""

    def __init__(self, path: Path, first_trace_id: str) -> None:
        if profiler_running("torch"):
            raise _ProfilerBusy("a torch profiler is already running")
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.path = path
        self._trace_id = first_trace_id
        self._prof = profile(activities=activities, custom_trace_id_callback=self._trace)
        self._record_function = torch.profiler.record_function
        self._open: Any = None
        self._prof.start()

    def _trace(self) -> str:
        """The capture's trace id (torch asks when it starts): the first profiled step's
        OTel trace id, a random one when that step is not sampled."""
        return self._trace_id or f"{uuid.uuid4().int:032x}"

    def step_begin(self, scope: str, number: int, trace_id: str | None) -> None:
        name = f"{scope}_step {number}" + (f" trace_id={trace_id}" if trace_id else "")
        self._open = self._record_function(name)
        self._open.__enter__()

    def step_end(self) -> None:
        rf, self._open = self._open, None
        if rf is not None:
            rf.__exit__(None, None, None)

    def abort(self) -> None:
        """Stop without writing (a failed capture leaves no profiler running)."""
        for stop in (self.step_end, self._prof.stop):
            try:
                stop()
            except Exception:
                pass

    def stop(self, metadata: Mapping[str, Any]) -> None:
        self.step_end()
        self._prof.add_metadata_json("otel_tunix", json.dumps(metadata))
        self._prof.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._prof.export_chrome_trace(str(self.path))


class _JaxSession:
    """``jax.profiler`` trace with a Perfetto trace, into the capture's folder.

    When Tunix's trainer profiler is loaded (``tunix.sft.profiler.Profiler``), its own
    ``_is_active`` flag says whether it runs (a capture is then skipped), and is held set
    while the capture runs, so that Tunix's window, should it open meanwhile, skips with its
    own warning instead of raising on a second ``start_trace``."""

    def __init__(self, path: Path) -> None:
        import jax

        self.path = path
        self._jax: Any = jax
        self._open: Any = None
        self._tunix: Any = _tunix_profiler()
        if self._tunix is not None:
            with self._tunix._lock:
                if self._tunix._is_active:
                    raise _ProfilerBusy("Tunix's profiler is running")
                self._tunix._is_active = True
        try:
            jax.profiler.start_trace(str(path), create_perfetto_trace=True)
        except RuntimeError as exc:  # "Profile has already been started"
            self._release_tunix()
            raise _ProfilerBusy(str(exc)) from exc
        except BaseException:
            self._release_tunix()
            raise
        path.mkdir(parents=True, exist_ok=True)

    def _release_tunix(self) -> None:
        tunix, self._tunix = self._tunix, None
        if tunix is not None:
            with tunix._lock:
                tunix._is_active = False

    def step_begin(self, scope: str, number: int, trace_id: str | None) -> None:
        kwargs = {"trace_id": trace_id} if trace_id else {}
        self._open = self._jax.profiler.StepTraceAnnotation(
            f"{scope}_step", step_num=number, **kwargs
        )
        self._open.__enter__()

    def step_end(self) -> None:
        ann, self._open = self._open, None
        if ann is not None:
            ann.__exit__(None, None, None)

    def abort(self) -> None:
        """Stop without the metadata (a failed capture leaves no trace running)."""
        for stop in (self.step_end, self._jax.profiler.stop_trace, self._release_tunix):
            try:
                stop()
            except Exception:
                pass

    def stop(self, metadata: Mapping[str, Any]) -> None:
        self.step_end()
        try:
            self._jax.profiler.stop_trace()
        finally:
            self._release_tunix()
        (self.path / "otel_tunix.json").write_text(json.dumps(metadata))


def _tunix_profiler() -> Any:
    """Tunix's trainer profiler class when it is loaded (it keeps whether a JAX profiler of
    Tunix's runs in ``_is_active``, under ``_lock``), else ``None``."""
    module = sys.modules.get("tunix.sft.profiler")
    cls = getattr(module, "Profiler", None)
    if cls is None or not hasattr(cls, "_is_active") or not hasattr(cls, "_lock"):
        return None
    return cls


def _framework() -> str | None:
    """The profiler to use (``OTEL_TUNIX_PROFILER=auto``): JAX's when jax is imported and
    torch is not, or both are and Tunix or Flax is too (a JAX loop that imported torch
    through transformers); else torch's when torch is imported; ``None`` with neither."""
    mods = sys.modules
    if "jax" in mods and ("torch" not in mods or "tunix" in mods or "flax" in mods):
        return "jax"
    if "torch" in mods:
        return "torch"
    return None


class ProfileCaptures(StepWatch):
    """The run's profile captures (one per run, made by ``configure()``).

    Args:
        runtime: The run's hot-path runtime (its :attr:`~Runtime.step_watch` is set while a
            capture is pending or running).
        run_dir: The run folder (``None``: no captures, each asked for is skipped).
        on_alert: Whether alerts start captures (``OTEL_TUNIX_PROFILE_ON_ALERT``).
        steps: Steps a capture covers by default.
        max_captures: Captures alerts may start in the run.
        cooldown_steps: Steps of the scope after a capture ends before an alert may start
            another.
        framework: ``"torch"`` or ``"jax"``; default (``None``): chosen at each capture
            (``OTEL_TUNIX_PROFILER=auto``, see :func:`_framework`).
    """

    def __init__(
        self,
        runtime: Runtime,
        run_dir: Path | None,
        *,
        on_alert: bool = True,
        steps: int = 3,
        max_captures: int = 3,
        cooldown_steps: int = 50,
        framework: str | None = None,
    ) -> None:
        self.runtime = runtime
        self.run_dir = run_dir
        self.on_alert = on_alert
        self.steps = max(1, steps)
        self.max_captures = max_captures
        self.cooldown_steps = cooldown_steps
        self.framework = framework
        self.captures: list[Capture] = []
        self.skipped: Counter[str] = Counter()
        """Captures not made, by why: ``profiler_busy``, ``max_captures``, ``cooldown``,
        ``capture_running``, ``no_profiler``, ``no_run_folder``, ``closed``, ``failed``,
        ``unfinished``."""
        self._alert_captures = 0
        self._lock = threading.Lock()
        self._pending: Capture | None = None
        self._active: Capture | None = None
        self._session: Any = None
        self._thread = 0
        self._done = 0
        self._ended_at: tuple[str, int] | None = None
        """The scope and its step count when the last capture ended (the cooldown)."""
        self._closed = False
        self.profiled: dict[str, frozenset[int]] = {}
        """Per scope, the numbers of its steps that were profiled (a new frozenset each
        time one is added: read without the lock by the alert engine)."""

    def profiled_value(self, metric: str, step: int | None) -> bool:
        """Whether ``metric`` at ``step`` is one of otel-tunix's timings (``perf/<scope>/...``)
        of a profiled step of that scope: slowed by the profiler, so no rule sees it."""
        if step is None or not metric.startswith("perf/"):
            return False
        for scope, steps in self.profiled.items():
            if step in steps and metric.startswith(f"{scope}/", 5):
                return True
        return False

    # --- asking ---------------------------------------------------------------------------
    def request(
        self,
        steps: int | None = None,
        *,
        reason: Mapping[str, Any] | None = None,
        from_alert: bool = False,
        framework: str | None = None,
    ) -> str | None:
        """Ask for a capture of the next ``steps`` steps (default: the run's) with
        ``framework``'s profiler (default: the run's, else the one imported, torch first).
        Returns its path relative to the run folder, or ``None`` when it is skipped (counted
        in :attr:`skipped`; an alert's while ``on_alert`` is off is not counted). Any
        thread."""
        if from_alert and not self.on_alert:
            return None
        with self._lock:
            why = self._refusal(from_alert)
            if why is not None:
                self.skipped[why] += 1
                return None
            framework = framework or self.framework or _framework()
            if framework is None:
                self.skipped["no_profiler"] += 1
                return None
            index = len(self.captures) + 1
            label = _label(reason)
            suffix = ".pt.trace.json" if framework == "torch" else ""
            path = f"{PROFILES_DIR}/capture-{index}{label}{suffix}"
            cap = Capture(
                index,
                path,
                framework,
                max(1, steps if steps is not None else self.steps),
                dict(reason or {"requested": "code"}),
            )
            self.captures.append(cap)
            if from_alert:
                self._alert_captures += 1
            self._pending = cap
            self.runtime.step_watch = self
        return path

    def _refusal(self, from_alert: bool) -> str | None:
        if self._closed:
            return "closed"
        if self.run_dir is None:
            return "no_run_folder"
        if self._pending is not None or self._active is not None:
            return "capture_running"
        if not from_alert:
            return None
        if self._alert_captures >= self.max_captures:
            return "max_captures"
        if self._ended_at is not None and self.cooldown_steps:
            scope, count = self._ended_at
            counts = self.runtime.scopes.get(scope)
            if counts is not None and counts.count - count < self.cooldown_steps:
                return "cooldown"
        return None

    # --- the step edges (StepWatch) -------------------------------------------------------
    def step_started(self, scope: str, number: int, rec: StepRecord | None) -> None:
        trace_id = f"{rec.trace_id:032x}" if rec is not None else None
        cap = self._active
        if cap is None:
            cap = self._start(scope, trace_id or "")
            if cap is None:
                return
        if cap.scope != scope or self._thread != threading.get_ident():
            return
        cap.step_numbers.append(number)
        self.profiled = {**self.profiled, scope: self.profiled.get(scope, frozenset()) | {number}}
        if trace_id is not None and rec is not None:
            cap.trace_ids.append(trace_id)
            rec.attributes[PROFILE_PATH] = cap.path
        try:
            self._session.step_begin(scope, number, trace_id)
        except Exception as exc:
            self._fail(cap, exc)

    def _start(self, scope: str, trace_id: str) -> Capture | None:
        """Start the pending capture at this step (``None``: none pending, or it failed)."""
        with self._lock:
            cap, self._pending = self._pending, None
            if cap is None or self.run_dir is None:
                if self._active is None:
                    self.runtime.step_watch = None
                return None
            self._active = cap
        cap.scope = scope
        self._thread = threading.get_ident()
        self._done = 0
        path = self.run_dir / cap.path
        t0 = now_ns()
        try:
            try:
                if cap.framework == "torch":
                    self._session = _TorchSession(path, trace_id)
                else:
                    self._session = _JaxSession(path)
            finally:
                record_component(PROFILER_START, t0, now_ns(), category=PROFILING)
        except _ProfilerBusy as exc:
            cap.status, cap.error = "skipped", str(exc)
            self._finish(cap, "profiler_busy")
            return None
        except Exception as exc:
            self._fail(cap, exc)
            return None
        cap.status = "running"
        return cap

    def step_ended(self, scope: str, number: int, rec: StepRecord | None) -> None:
        cap = self._active
        if cap is None or cap.scope != scope or self._thread != threading.get_ident():
            return
        try:
            self._session.step_end()
        except Exception as exc:
            self._fail(cap, exc)
            return
        self._done += 1
        if self._done >= cap.steps:
            t0 = now_ns()
            try:
                self._stop(cap)
            finally:  # in the step: the file written is the profiled step's cost too
                record_component(PROFILER_STOP, t0, now_ns(), category=PROFILING)

    def _stop(self, cap: Capture) -> None:
        meta = {
            "capture": cap.index,
            "scope": cap.scope,
            "steps": cap.step_numbers,
            "trace_ids": cap.trace_ids,
            "reason": cap.reason,
        }
        try:
            self._session.stop(meta)
        except Exception as exc:
            self._fail(cap, exc)
            return
        cap.status = "written"
        self._finish(cap, None)

    def _fail(self, cap: Capture, exc: BaseException) -> None:
        """A profiler that raised (someone else's code: never raised on, whatever
        ``OTEL_TUNIX_RAISE_INTERNAL_ERRORS`` says): the capture is dropped, counted and said
        once."""
        warn_once(
            ("profile-failed", cap.framework),
            "otel-tunix: a profile capture failed (%s: %s); the training loop goes on",
            type(exc).__name__,
            exc,
            logger=_logger,
        )
        cap.status, cap.error = "failed", f"{type(exc).__name__}: {exc}"
        session, self._session = self._session, None
        if session is not None:
            session.abort()
        self._finish(cap, "failed")

    def _finish(self, cap: Capture, skipped: str | None) -> None:
        with self._lock:
            if skipped is not None:
                self.skipped[skipped] += 1
            self._active = None
            self._session = None
            if cap.scope is not None:
                counts = self.runtime.scopes.get(cap.scope)
                self._ended_at = (cap.scope, counts.count if counts is not None else 0)
            if self._pending is None:
                self.runtime.step_watch = None

    # --- the run's end --------------------------------------------------------------------
    def close(self) -> None:
        """Stop a capture still running, when called on its thread (its file is written
        with the steps it has), and take no more. From another thread (the SIGTERM
        handler's) the profiler is left as it is and the capture counted ``unfinished``:
        torch's profiler stopped from another thread than the one it started on crashes
        the process."""
        with self._lock:
            self._closed = True
            self._pending = None
        cap = self._active
        if cap is not None and self._session is not None:
            if self._thread == threading.get_ident():
                self._stop(cap)
            else:
                cap.status, cap.error = "failed", "the run ended on another thread"
                self._session = None
                self._finish(cap, "unfinished")
        self.runtime.step_watch = None

    def to_json(self) -> dict[str, Any]:
        """``summary.json``'s ``profiles``: the captures, and what was skipped, by why."""
        with self._lock:
            return {
                "captures": [c.to_json() for c in self.captures if c.status != "pending"],
                "skipped": dict(sorted(self.skipped.items())),
            }


class ProfileFileTrigger(StepSink):
    """Asks for a capture when :data:`TRIGGER_FILE` (or this rank's ``-rank<N>`` one) in the
    run folder is newer than the last one acted on: a running job profiled without touching
    its code (``touch <run folder>/capture_profile``). Looked at on otel-tunix's worker
    each time it processes a batch of sampled steps (a ``stat`` per file, about every
    ``OTEL_TUNIX_PROCESS_INTERVAL_MS`` while steps come); the file is left in place, so
    that every rank sees it.

    Args:
        profiles: The run's captures.
        run_dir: The run folder.
        rank_suffix: This rank's file-name suffix (``-rank<N>`` in a job of several ranks,
            else empty: the one file).
    """

    def __init__(self, profiles: ProfileCaptures, run_dir: Path, rank_suffix: str = "") -> None:
        self.profiles = profiles
        self.paths = [run_dir / TRIGGER_FILE]
        if rank_suffix:
            self.paths.append(run_dir / f"{TRIGGER_FILE}{rank_suffix}")
        self._seen = {p: _mtime(p) for p in self.paths}
        """The modification time of each file acted on (files there before the run are
        not requests)."""

    def on_finished_steps(self, steps: Sequence[FinishedStep]) -> None:
        for path in self.paths:
            mtime = _mtime(path)
            if mtime <= self._seen[path]:
                continue
            self._seen[path] = mtime
            try:
                text = path.read_text(errors="replace").strip()[:20]
            except OSError:
                text = ""
            n = int(text) if text.isdigit() and int(text) > 0 else None
            self.profiles.request(
                n, reason={"requested": "file", "file": path.name, "time_ns": time.time_ns()}
            )


def _mtime(path: Path) -> int:
    """The file's modification time (ns); 0 when there is none."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _label(reason: Mapping[str, Any] | None) -> str:
    """A file-name part naming why (the alert's rule and step)."""
    if not reason or "rule" not in reason:
        return ""
    text = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in str(reason["rule"]))[:40]
    step = reason.get("step")
    return f"-{text}" + (f"-step{step}" if isinstance(step, int) else "")


def capture_profile(steps: int | None = None, *, framework: str | None = None) -> str | None:
    """Profile the next ``steps`` steps of this rank (default ``OTEL_TUNIX_PROFILE_STEPS``)
    with the framework's profiler, from the next step that starts.

    ``framework``: ``"torch"`` or ``"jax"``; default: torch's profiler when torch is
    imported, else JAX's.

    Returns the capture's path relative to the run folder, or ``None`` when none will be
    made (no run, no run folder, a capture already pending or running, no torch or JAX
    imported): counted in ``summary.json``'s ``profiles``. Raises only for a
    ``framework`` that is neither.
    """
    run = get_current()
    profiles = getattr(run, "profiles", None) if run is not None else None
    if not isinstance(profiles, ProfileCaptures):
        warn_once(
            "capture-no-run",
            "otel_tunix.capture_profile(): no configured run with a run folder; no capture",
            logger=_logger,
        )
        return None
    if framework not in (None, "torch", "jax"):
        raise ValueError(f"capture_profile(framework=): 'torch' or 'jax', not {framework!r}")
    return profiles.request(
        steps, reason={"requested": "code", "time_ns": time.time_ns()}, framework=framework
    )
