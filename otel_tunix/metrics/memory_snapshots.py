"""Out-of-memory errors: the step they happen in is marked, and a snapshot of the device
memory is kept beside the profile captures.

When an out-of-memory error (``torch.cuda.OutOfMemoryError``; JAX's ``JaxRuntimeError``
with status ``RESOURCE_EXHAUSTED``) leaves a component or a step that is recorded, the
step's span gets ``tunix.memory.oom = true`` and, with a run folder, a snapshot is taken at
once, while the tensors the failed step holds are still alive: torch (with CUDA in use) the
CUDA caching allocator's state (``torch.cuda.memory._snapshot()``, pickled: what
``python -m torch.cuda._memory_viz`` and https://pytorch.org/memory_viz read) in
``<run folder>/profiles/oom-<n>-<scope>-step<k>.pickle``; JAX
``jax.profiler.device_memory_profile()`` (a gzipped pprof profile: ``pprof``) in
``...step<k>.prof``. The step's span links it with ``tunix.profile.path``
(relative to the run folder), as a profile capture is linked, unless a capture covering the
step holds that attribute already. torch's snapshot carries the allocation history when the
program turned it on (``torch.cuda.memory._record_memory_history()``), only the segments
otherwise.

torch without CUDA writes nothing: counted (``summary.json``'s ``memory_snapshots``) and
said once. Nothing here raises into the training loop.
"""

from __future__ import annotations

import logging
import pickle
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from otel_tunix.recording.step_record import StepRecord
from otel_tunix.settings import attributes as attr
from otel_tunix.support.errors import warn_once

__all__ = ["MAX_SNAPSHOTS", "OomSnapshots", "is_out_of_memory", "out_of_memory_framework"]

_logger = logging.getLogger(__name__)

MAX_SNAPSHOTS = 3
"""Snapshots kept per run (each can be tens of megabytes); later OOMs only mark their step."""

SNAPSHOTS_DIR = "profiles"
"""The run folder's subfolder of the snapshots (that of the profile captures)."""


def out_of_memory_framework(exc: BaseException) -> str | None:
    """``"torch"`` when ``exc`` is torch's CUDA out-of-memory error, ``"jax"`` when it is
    JAX's (a ``JaxRuntimeError`` whose status is ``RESOURCE_EXHAUSTED``), else ``None``.
    Neither framework is imported here: a program that never imported one raised none of
    its errors."""
    torch = sys.modules.get("torch")
    if torch is not None:
        oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
        if isinstance(oom, type) and isinstance(exc, oom):
            return "torch"
    jax = sys.modules.get("jax")
    if jax is not None:
        error = getattr(getattr(jax, "errors", None), "JaxRuntimeError", None)
        if isinstance(error, type) and isinstance(exc, error) and "RESOURCE_EXHAUSTED" in str(exc):
            return "jax"
    return None


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error of torch or JAX
    (:func:`out_of_memory_framework`)."""
    return out_of_memory_framework(exc) is not None


def _cuda_in_use(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:
        return False


class OomSnapshots:
    """The run's out-of-memory marks and snapshots (:attr:`Runtime.error_watch
    <otel_tunix.recording.step_record.Runtime.error_watch>`: called on the thread that raised,
    with the step whose component or step the error left).

    Args:
        run_dir: The run folder (``None``: steps are marked, no snapshot is written).
        max_snapshots: Snapshots kept in the run.
    """

    def __init__(self, run_dir: Path | None, max_snapshots: int = MAX_SNAPSHOTS) -> None:
        self.run_dir = run_dir
        self.max_snapshots = max_snapshots
        self.snapshots: list[dict[str, Any]] = []
        """The snapshots written: ``{"path", "scope", "step", "error"}`` each."""
        self.skipped: Counter[str] = Counter()
        """Snapshots not written, by why: ``no_cuda``, ``no_run_folder``,
        ``max_snapshots``, ``failed``."""
        self.marked = 0
        """Steps marked ``tunix.memory.oom``."""
        self._taken = 0
        self._lock = threading.Lock()

    def __call__(self, rec: StepRecord, exc: BaseException) -> None:
        """An error left a component or step of ``rec``: mark the step and keep a snapshot
        when it is an out-of-memory error (once per step). Never raises."""
        try:
            framework = out_of_memory_framework(exc)
            if framework is None or rec.attributes.get(attr.MEMORY_OOM):
                return
            rec.attributes[attr.MEMORY_OOM] = True
            with self._lock:
                self.marked += 1
            path = self._snapshot(rec, exc, framework)
            if path is not None:
                rec.attributes.setdefault(attr.PROFILE_PATH, path)
        except Exception:
            warn_once(
                "oom-snapshot",
                "otel-tunix: marking an out-of-memory step failed; the training loop goes on",
                logger=_logger,
                exc_info=True,
            )

    def _skip(self, why: str) -> None:
        with self._lock:
            self.skipped[why] += 1

    def _snapshot(self, rec: StepRecord, exc: BaseException, framework: str) -> str | None:
        """Write the framework's memory snapshot; its path relative to the run folder."""
        if framework == "torch" and not _cuda_in_use(sys.modules["torch"]):
            self._skip("no_cuda")
            warn_once(
                "oom-snapshot-no-cuda",
                "otel-tunix: an out-of-memory error without CUDA in use: no memory snapshot "
                "(counted in summary.json's memory_snapshots)",
                logger=_logger,
            )
            return None
        if self.run_dir is None:
            self._skip("no_run_folder")
            return None
        with self._lock:
            if self._taken >= self.max_snapshots:
                self.skipped["max_snapshots"] += 1
                return None
            self._taken += 1
            index = self._taken
            suffix = "pickle" if framework == "torch" else "prof"
            rel = f"{SNAPSHOTS_DIR}/oom-{index}-{rec.scope}-step{rec.number}.{suffix}"
            entry = {
                "path": rel,
                "framework": framework,
                "scope": rec.scope,
                "step": rec.number,
                "error": str(exc)[:500],
            }
            self.snapshots.append(entry)  # the index is taken: another thread gets the next
        try:
            path = self.run_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if framework == "torch":
                snapshot = sys.modules["torch"].cuda.memory._snapshot()
                with open(path, "wb") as f:
                    pickle.dump(snapshot, f)
            else:
                path.write_bytes(sys.modules["jax"].profiler.device_memory_profile())
        except Exception as failure:
            with self._lock:
                self.snapshots.remove(entry)
                self.skipped["failed"] += 1
            warn_once(
                "oom-snapshot-failed",
                "otel-tunix: writing a memory snapshot failed (%s: %s)",
                type(failure).__name__,
                failure,
                logger=_logger,
            )
            return None
        return rel

    def to_json(self) -> dict[str, Any]:
        """``summary.json``'s ``memory_snapshots``."""
        with self._lock:
            return {
                "oom_steps": self.marked,
                "snapshots": [dict(s) for s in self.snapshots],
                "skipped": dict(sorted(self.skipped.items())),
            }
