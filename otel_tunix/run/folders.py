"""The default run folder: one per run, and none for a run that recorded nothing.

The default folder is ``./otel-tunix-runs/<run id>``, and the run id of a launched job is
the launcher's job id (``slurm-<id>``, ``torchelastic-<id>``), shared by all its ranks. A
second run with the same job id (a script that trains twice, a requeued job) gets
``<run id>-2`` (then ``-3``, ...) instead of appending to the first one's files: a folder is
taken for a rank when it already holds that rank's spans or summary file, so the ranks of
one run still share a folder (each has its own files), and the ranks of the second run all
move on to the same ``-2``.

A folder given by the user (``output_dir=`` or ``OTEL_TUNIX_OUTPUT_DIR``) is used as it is by
the first run; a later run given the same folder (a resumed job) gets ``<folder>/run-2``
(then ``run-3``, ...) by the same rule, so two runs never append to one ``spans.jsonl`` or
overwrite one ``summary.json``, and ``otel-tunix summary <folder>`` reads the newest run and
names the others.

A run that recorded no step and logged no metric leaves no folder behind (``otel-tunix
summary`` would otherwise pick that empty run as the newest): at shutdown the files it
wrote are removed, and the folder too when otel-tunix made it and nothing else is in it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from otel_tunix.model.steps import ScopeSession
from otel_tunix.recording.current_run import RunInfo
from otel_tunix.run.paths import path_component

__all__ = [
    "default_base",
    "drop_if_empty",
    "earlier_runs",
    "fresh_folder",
    "given_folder",
    "note_made",
]

_lock = threading.Lock()
_made: set[Path] = set()  # folders otel-tunix made (absolute): the only ones it removes


def _taken(folder: Path, rank_suffix: str) -> bool:
    return any(
        (folder / f"{stem}{rank_suffix}{ext}").exists()
        for stem, ext in (("spans", ".jsonl"), ("summary", ".json"))
    )


def _candidates(base: Path, given: bool) -> Iterator[Path]:
    """The folders a run may take, in order: ``base``, then ``base-2``, ``base-3``... (a
    default folder) or ``base/run-2``, ``base/run-3``... (a folder given)."""
    yield base
    n = 2
    while True:
        yield base / f"run-{n}" if given else base.with_name(f"{base.name}-{n}")
        n += 1


def _next_folder(base: Path, rank_suffix: str, given: bool) -> Path:
    return next(f for f in _candidates(base, given) if not _taken(f, rank_suffix))


def fresh_folder(base: Path, rank_suffix: str = "") -> Path:
    """``base``, else ``base-2``, ``base-3``...: the first that holds no spans or summary
    file of this rank (``rank_suffix``: ``-rank<r>`` in a distributed job, else empty)."""
    return _next_folder(base, rank_suffix, given=False)


def given_folder(given: Path, rank_suffix: str = "") -> Path:
    """The folder of a run given ``given``: ``given`` itself, else ``given/run-2``,
    ``given/run-3``...: the first that holds no spans or summary file of this rank."""
    return _next_folder(given, rank_suffix, given=True)


def default_base(key: str) -> Path:
    """The first folder of a run with no folder given: ``./otel-tunix-runs/<key>`` (the
    job id: the later attempts of a job go to ``<key>-2``, ...)."""
    return Path("otel-tunix-runs") / path_component(key)


def earlier_runs(base: Path, rank_suffix: str, *, given: bool) -> list[Path]:
    """The spans files of this rank's earlier runs in the folders of ``base``, in the order
    the runs took them (those before the first folder free for this rank)."""
    out: list[Path] = []
    for folder in _candidates(base, given):
        if not _taken(folder, rank_suffix):
            return out
        out.append(folder / f"spans{rank_suffix}.jsonl")
    return out  # pragma: no cover - the candidates never end


def note_made(folder: Path) -> None:
    """Remember that otel-tunix made ``folder`` (call before making it, if it is new)."""
    if not folder.exists():
        with _lock:
            _made.add(folder.resolve())


def _logged(metrics: Path) -> bool:
    """Whether the metrics JSONL holds a line besides its ``meta`` header."""
    try:
        with metrics.open("rb") as f:
            lines = [line for line in (f.readline(), f.readline()) if line.strip()]
    except OSError:  # not there (no backend wrote it): nothing logged
        return False
    return len(lines) > 1 or (len(lines) == 1 and b'"meta"' not in lines[0])


def drop_if_empty(info: RunInfo, sessions: Sequence[ScopeSession]) -> bool:
    """Remove the files of a run that recorded no step and logged no metric, and its folder
    when otel-tunix made it and it is then empty. Returns whether the files were removed."""
    folder = info.output_dir
    if folder is None or any(s.steps for s in sessions):
        return False
    metrics = info.files.get("metrics")
    if metrics is not None and _logged(metrics):
        return False
    for path in info.files.values():
        with contextlib.suppress(OSError):  # gone already, or not ours to remove: keep going
            path.unlink(missing_ok=True)
    resolved = folder.resolve()
    with _lock:
        made = resolved in _made
        _made.discard(resolved)
    if made:
        with contextlib.suppress(OSError):  # something else is in it: it stays
            folder.rmdir()
    return True
