"""Out-of-memory errors: the step they happen in is marked, and a snapshot of the device
memory is kept beside the profile captures.

When a ``torch.cuda.OutOfMemoryError`` leaves a component or a step that is recorded, the
step's span gets ``tunix.memory.oom = true`` and, with CUDA in use and a run folder, the CUDA
caching allocator's state (``torch.cuda.memory._snapshot()``, pickled: what
``python -m torch.cuda._memory_viz`` and https://pytorch.org/memory_viz read) is written to
``<run folder>/profiles/oom-<n>-<scope>-step<k>.pickle``, taken at once, while the tensors
the failed step holds are still alive. The step's span links it with ``tunix.profile.path``
(relative to the run folder), as a profile capture is linked, unless a capture covering the
step holds that attribute already. The snapshot carries the allocation history when the
program turned it on (``torch.cuda.memory._record_memory_history()``), only the segments
otherwise.

Without CUDA nothing is written: counted (``summary.json``'s ``memory_snapshots``) and
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

__all__ = ["MAX_SNAPSHOTS", "OomSnapshots", "is_out_of_memory"]

_logger = logging.getLogger(__name__)

MAX_SNAPSHOTS = 3
"""Snapshots kept per run (each can be tens of megabytes); later OOMs only mark their step."""

SNAPSHOTS_DIR = "profiles"
"""The run folder's subfolder of the snapshots (that of the profile captures)."""


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's CUDA out-of-memory error (torch is not imported here: a
    program that never imported it raised none)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    return isinstance(oom, type) and isinstance(exc, oom)


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
            if not is_out_of_memory(exc) or rec.attributes.get(attr.MEMORY_OOM):
                return
            rec.attributes[attr.MEMORY_OOM] = True
            with self._lock:
                self.marked += 1
            path = self._snapshot(rec, exc)
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

    def _snapshot(self, rec: StepRecord, exc: BaseException) -> str | None:
        """Write the CUDA allocator's snapshot; its path relative to the run folder."""
        torch = sys.modules["torch"]
        if not _cuda_in_use(torch):
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
            rel = f"{SNAPSHOTS_DIR}/oom-{index}-{rec.scope}-step{rec.number}.pickle"
            entry = {"path": rel, "scope": rec.scope, "step": rec.number, "error": str(exc)}
            self.snapshots.append(entry)  # the index is taken: another thread gets the next
        try:
            snapshot = torch.cuda.memory._snapshot()
            path = self.run_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                pickle.dump(snapshot, f)
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
