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

A folder is claimed atomically, so runs that start at once (eight processes of one job id,
no rank) never share one: the run makes ``.claim`` (``.claim-rank<r>``) in it, holding its
job id, attempt and run id, with ``link()``, which fails when the name is there already
(:func:`claim`); a run that loses the race moves on to the next folder and reads the
winner's attempt from its claim (its spans file may not have its header yet). A candidate
folder (``run-2``, ``<id>-2``, ...) that is a symbolic link is never used.

A run that recorded no step and logged no metric leaves no folder behind (``otel-tunix
summary`` would otherwise pick that empty run as the newest): at shutdown the files it
wrote are removed, and the folder too when otel-tunix made it and nothing else is in it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from otel_tunix.model.steps import ScopeSession
from otel_tunix.recording.current_run import RunInfo
from otel_tunix.run.paths import open_regular, path_component
from otel_tunix.support.linefile import NOFOLLOW

__all__ = [
    "claim",
    "claim_name",
    "default_base",
    "drop_if_empty",
    "fresh_folder",
    "note_made",
    "planted_links",
    "read_claim",
    "release",
]

_lock = threading.Lock()
_made: set[Path] = set()  # folders otel-tunix made (absolute): the only ones it removes


_CLAIM_MAX = 1 << 16  # a claim longer than this is not ours


def claim_name(rank_suffix: str) -> str:
    """The name of the file that claims a folder for one rank of a run."""
    return f".claim{rank_suffix}"


def _taken(folder: Path, rank_suffix: str) -> bool:
    if folder.is_symlink():  # never used as a run folder (see the module docstring)
        return True
    return any(
        os.path.lexists(folder / name)
        for name in (
            f"spans{rank_suffix}.jsonl",
            f"summary{rank_suffix}.json",
            claim_name(rank_suffix),
        )
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


def default_base(key: str) -> Path:
    """The first folder of a run with no folder given: ``./otel-tunix-runs/<key>`` (the
    job id: the later attempts of a job go to ``<key>-2``, ...)."""
    return Path("otel-tunix-runs") / path_component(key)


def claim(
    base: Path,
    rank_suffix: str,
    *,
    given: bool,
    content: Callable[[list[Path]], dict[str, Any]],
) -> Path:
    """Claim the first free folder of ``base`` for this rank (see the module docstring):
    ``content(taken)`` gives what the claim holds, ``taken`` being the folders before it
    that earlier (or concurrent) runs took, in order. Makes the folder (and its parents).

    Raises:
        OSError: a folder or the claim cannot be made (no space or inodes left, ...).
    """
    taken: list[Path] = []
    for folder in _candidates(base, given):
        if _taken(folder, rank_suffix):
            taken.append(folder)
            continue
        note_made(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if folder.is_symlink():  # planted between the check and the mkdir
            taken.append(folder)
            continue
        data = json.dumps(content(list(taken))).encode()
        if _link_claim(folder / claim_name(rank_suffix), data):
            return folder
        taken.append(folder)
    raise AssertionError("unreachable")  # pragma: no cover - the candidates never end


def _link_claim(path: Path, data: bytes) -> bool:
    """Make ``path`` holding ``data``, whole, unless something is there: False then."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | NOFOLLOW, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            os.link(tmp, path)  # atomic, whole, and fails if the name is taken
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: made new, then written
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o666)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        return True
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def release(folder: Path, rank_suffix: str) -> None:
    """Remove this rank's claim of ``folder`` (a run refused before it wrote anything)."""
    with contextlib.suppress(OSError):
        (folder / claim_name(rank_suffix)).unlink()


def read_claim(folder: Path, rank_suffix: str) -> dict[str, Any] | None:
    """What a folder's claim for this rank holds, or ``None`` (none, or not readable)."""
    try:
        with open_regular(folder / claim_name(rank_suffix), follow=False) as f:
            data = json.loads(f.read(_CLAIM_MAX))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


_RUN_FILES = re.compile(
    r"(spans|metrics|alerts)(-rank\d+)?\.jsonl(\.gz)?|summary(-rank\d+)?\.json|config\.json"
    r"|trace.*\.pftrace|\.claim.*|profiles"
)
"""The names of the files a run writes in its folder (``profiles``: the folder of the profile
captures)."""


def planted_links(folder: Path) -> list[str]:
    """The names in ``folder`` that are symbolic links where a run writes its files
    (``spans.jsonl``, ``metrics-rank1.jsonl``, ``summary.json``, ``config.json``,
    ``trace*.pftrace``, ...), sorted; not the temporary ``*.tmp`` ones, which are removed,
    never followed, nor other links (a ``config.yaml`` of the user's)."""
    try:
        with os.scandir(folder) as entries:
            return sorted(
                e.name for e in entries if _RUN_FILES.fullmatch(e.name) and e.is_symlink()
            )
    except OSError:
        return []


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
    for path in (*info.files.values(), folder / claim_name(info.rank.file_suffix)):
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
