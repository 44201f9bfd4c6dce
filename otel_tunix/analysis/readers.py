"""Streaming readers for the JSONL files of a run folder (plain or gzip).

Every reader goes through the file line by line (or in 1 MiB blocks), so a file of any size
is read in memory bounded by what is *kept*: the selected metric columns (8 bytes per value)
for :func:`read_jsonl`, one small record at a time for :func:`iter_records`. gzip is detected
from the file's first bytes, not its name. A line cut short by a crash or by a writer that
is still running is skipped (and counted), never an error.

pandas is imported only by :func:`read_jsonl` / :meth:`MetricsTable.frame`.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from otel_tunix.support.linefile import MAX_LINE_BYTES, TOO_LONG, capped_lines

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "SKIPPED_WHY",
    "X_KEYS",
    "AnalysisError",
    "MetricsTable",
    "flatten_record",
    "folder_spans_files",
    "iter_records",
    "listed",
    "loads_record",
    "open_text",
    "read_jsonl",
    "resolve_metrics_file",
    "resolve_spans_files",
    "run_folders",
    "run_label",
    "runs_note",
]

X_KEYS: tuple[str, ...] = ("step", "time", "epoch")
"""Top-level numeric keys that are positions (x-axis candidates), not metrics."""

_X_KEYS = frozenset(X_KEYS)
_SKIPPED_TYPES = frozenset({"meta", "session", "run", "span"})
_GZIP_MAGIC = b"\x1f\x8b"
_BLOCK = 1 << 20
_SEARCH_DEPTH = 2


class AnalysisError(Exception):
    """A problem with the input that the user can fix (missing file, unknown metric, ...).

    The CLI prints the message and exits with status 2.
    """


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == _GZIP_MAGIC


def open_text(path: str | os.PathLike[str]) -> IO[str]:
    """Open a JSONL file for reading as text; gzip is detected from the magic bytes."""
    p = Path(path)
    if _is_gzip(p):
        return gzip.open(p, "rt", encoding="utf-8")
    return open(p, encoding="utf-8")


def _open_binary(path: Path) -> IO[bytes]:
    if _is_gzip(path):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


@dataclass
class ReadStats:
    """What a read went through: lines seen, lines that were not a JSON object."""

    lines: int = 0
    bad_lines: int = 0
    first_bad_line: int | None = None

    def bad(self, line_no: int) -> None:
        self.bad_lines += 1
        if self.first_bad_line is None:
            self.first_bad_line = line_no


def _iter_lines(f: IO[bytes]) -> Iterator[bytes]:
    """Complete and last lines of a binary stream, each at most
    :data:`~otel_tunix.support.linefile.MAX_LINE_BYTES` (a longer one comes as a line that is no
    JSON: skipped and counted); a gzip stream cut short just ends."""
    try:
        yield from capped_lines(f)
    except (EOFError, zlib.error):  # a .gz still being written, or cut by a crash
        return
    except gzip.BadGzipFile as exc:
        raise AnalysisError(f"{getattr(f, 'name', 'file')}: not a valid gzip file ({exc})") from exc


def iter_records(
    path: str | os.PathLike[str], stats: ReadStats | None = None
) -> Iterator[dict[str, Any]]:
    """Yield every JSON object line of a JSONL file (plain or gzip), streaming.

    Blank lines are skipped; a line that is not a JSON object (for example the last line of a
    file that a crash cut short) is skipped and counted in ``stats``.

    Raises:
        AnalysisError: the file does not exist or is not readable.
    """
    p = _existing_file(path)
    st = stats if stats is not None else ReadStats()
    with _open_binary(p) as f:
        for line in _iter_lines(f):
            st.lines += 1
            if not line.strip():
                continue
            obj = loads_record(line)
            if obj is not None:
                yield obj
            else:
                st.bad(st.lines)


_POSITIONS = ("step", "start_ns", "end_ns")

SKIPPED_WHY = (
    "cut short by a crash or a kill, not UTF-8, nested too deep, longer than "
    f"{MAX_LINE_BYTES >> 20} MB, or a NaN step or time"
)
"""Why a line is skipped, in words (the notes of ``summary`` and ``goodput``)."""


def loads_record(line: bytes | str) -> dict[str, Any] | None:
    """One JSON object line as a dict, or ``None`` when it is not one a reader can use:
    no JSON (cut short, not UTF-8, binary), nested too deep for the parser (a
    ``RecursionError``), not an object, or a position (``step``, ``start_ns``,
    ``end_ns``, its own or a component's) that is NaN or infinite."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if not isinstance(obj, dict) or not _finite_positions(obj):
        return None
    return obj


def _finite_positions(obj: Mapping[str, Any]) -> bool:
    for key in _POSITIONS:
        v = obj.get(key)
        if type(v) is float and not math.isfinite(v):
            return False
    for key in ("components", "spans"):
        items = obj.get(key)
        if type(items) is list:
            for item in items:
                if type(item) is dict and not _finite_positions(item):
                    return False
    return True


def _existing_file(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if not p.exists():
        raise AnalysisError(f"{p}: no such file or directory")
    if not p.is_file():
        raise AnalysisError(f"{p}: not a file")
    return p


def _flatten_into(obj: Mapping[str, Any], prefix: str, out: dict[str, float]) -> None:
    for k, v in obj.items():  # exact type checks: bool is no number, and they are fast
        t = type(v)
        if t is float or t is int:
            out[prefix + k] = float(v)
        elif t is dict:
            _flatten_into(v, f"{prefix}{k}.", out)


def flatten_record(obj: Mapping[str, Any]) -> dict[str, float]:
    """The numeric values of one JSONL record, as flat ``{name: value}``.

    * ``{"step": 3, "metrics": {"loss": 1.2, "rewards/mean": 0.4}}`` (otel-tunix's
      ``metrics.jsonl``) gives ``step``, ``loss`` and ``rewards/mean``: names are kept as
      written, slashes included;
    * nested dicts are joined with dots: ``{"metrics": {"train": {"loss": 1}}}`` and
      ``{"train": {"loss": 1}}`` both give ``train.loss``;
    * a string ``prefix`` field (``{"prefix": "val", "metrics": {"loss": 1}}``) prefixes the
      names of its ``metrics`` (``val.loss``);
    * strings, booleans, lists and ``null`` are not metrics and are left out.
    """
    out: dict[str, float] = {}
    prefix = obj.get("prefix")
    for k, v in obj.items():
        t = type(v)
        if t is float or t is int:
            out[k] = float(v)
        elif t is dict:
            if k == "metrics":
                _flatten_into(v, f"{prefix}." if isinstance(prefix, str) and prefix else "", out)
            elif k != "attributes":
                _flatten_into(v, f"{k}.", out)
    return out


class _Columns:
    """Column store: one ``array('d')`` per kept name, NaN where a record lacks it.

    A record none of whose kept names is a metric (only position keys) is not stored.
    """

    def __init__(self, keep: Callable[[str], bool] | None) -> None:
        self.keep = keep
        self.rows = 0
        self.cols: dict[str, array[float]] = {}
        self.seen: dict[str, bool] = {}  # every name met -> kept (insertion ordered)

    def add(self, flat: Mapping[str, float]) -> None:
        seen, keep = self.seen, self.keep
        row: list[tuple[str, float]] = []
        useful = False
        for name, value in flat.items():
            kept = seen.get(name)
            if kept is None:
                kept = seen[name] = keep is None or keep(name)
            if kept:
                row.append((name, value))
                useful = useful or name not in _X_KEYS
        if not useful:
            return
        n, cols = self.rows, self.cols
        for name, value in row:
            col = cols.get(name)
            if col is None:
                col = cols[name] = array("d", [math.nan]) * n
            col.append(value)
        self.rows = n = n + 1
        if len(row) != len(cols):
            for col in cols.values():
                if len(col) < n:
                    col.append(math.nan)


@dataclass
class MetricsTable:
    """A metrics JSONL file read into columns, incrementally (for ``--live``).

    :meth:`poll` reads what was appended since the last call (a plain file resumes at the
    byte where it stopped; a gzip file is read again from the start when it grew) and
    :meth:`frame` gives a pandas DataFrame of the columns read so far.

    Args:
        path: The JSONL file.
        keep: Which names to keep in memory (``None``: all), position keys (``step``, ...)
            included: a predicate that drops ``step`` has no ``step`` column. The names of
            every metric met are in :attr:`names` either way.
    """

    path: Path
    keep: Callable[[str], bool] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    stats: ReadStats = field(default_factory=ReadStats)
    _columns: _Columns = field(init=False)
    _offset: int = 0
    _size: int = -1
    _pending: bytes = b""
    _skipping: bool = False

    def __post_init__(self) -> None:
        self.path = _existing_file(self.path)
        self._reset()

    def _reset(self) -> None:
        self._columns = _Columns(self.keep)
        self._offset, self._size, self._pending, self.stats = 0, -1, b"", ReadStats()
        self._skipping = False

    @property
    def rows(self) -> int:
        """Records read so far."""
        return self._columns.rows

    @property
    def names(self) -> list[str]:
        """Every metric name met so far (the position keys of :data:`X_KEYS` left out)."""
        return [n for n in self._columns.seen if n not in _X_KEYS]

    @property
    def all_names(self) -> list[str]:
        """Every numeric field met so far, position keys included."""
        return list(self._columns.seen)

    def poll(self, *, final: bool = True) -> int:
        """Read what is new in the file; return the number of new records (all of them when
        the file had to be read again: a gzip file, or one that was truncated).

        Args:
            final: Accept a last line without a newline if it parses (a finished file). With
                ``final=False`` (a file still being written) it waits for the newline.
        """
        try:
            size = self.path.stat().st_size
        except OSError as exc:
            raise AnalysisError(f"{self.path}: cannot read ({exc})") from exc
        if size == self._size and not (final and self._pending):
            return 0
        gz = _is_gzip(self.path) if size else False
        if gz or size < self._offset:  # gzip: no resuming mid-stream; plain: truncated
            self._reset()
        before = self.rows
        self._size = size
        if gz:
            with gzip.open(self.path, "rb") as f:
                self._consume_stream(_iter_blocks(f), final=final)
        else:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                self._consume_stream(_iter_blocks(f), final=final, advance=True)
        return self.rows - before

    def _consume_stream(
        self, blocks: Iterable[bytes], *, final: bool, advance: bool = False
    ) -> None:
        pending = self._pending
        for block in blocks:
            if advance:
                self._offset += len(block)
            data = pending + block
            lines = data.split(b"\n")
            pending = lines.pop()
            if self._skipping:  # the rest of a line too long to read
                if not lines:
                    pending = b""
                    continue
                lines.pop(0)
                self._skipping = False
            for line in lines:
                self._line(line)
            if len(pending) > MAX_LINE_BYTES:  # counted once, the rest dropped as it comes
                self._line(TOO_LONG)
                pending, self._skipping = b"", True
        if self._skipping:
            pending = b""
        if final and pending.strip():
            self._line(pending)
            pending = b""
        self._pending = pending

    def _line(self, line: bytes) -> None:
        st = self.stats
        st.lines += 1
        if not line.strip():
            return
        obj = loads_record(line)
        if obj is None:
            st.bad(st.lines)
            return
        kind = obj.get("type")
        if kind in _SKIPPED_TYPES:
            if kind == "meta" and not self.meta:
                self.meta = obj
            return
        flat = flatten_record(obj)
        if flat:
            self._columns.add(flat)

    def frame(self, *, release: bool = False) -> pd.DataFrame:
        """The columns read so far as a DataFrame.

        ``df.attrs`` holds ``path``, ``run`` (the run's name), ``meta`` (the header) and
        ``names`` (every metric name met).

        Args:
            release: Hand the columns over to the frame instead of copying them (half the
                peak memory for a one-shot read); the table then starts over, as if new.
        """
        import pandas as pd

        cols = self._columns.cols
        if release:
            data = {k: np.frombuffer(v, dtype=np.float64) for k, v in cols.items()}
        else:  # the arrays keep growing: the frame gets its own copy
            data = {k: np.array(v, dtype=np.float64) for k, v in cols.items()}
        df = pd.DataFrame(data, copy=False)
        if "step" in df.columns and len(df) and not df["step"].isna().any():
            df["step"] = df["step"].astype("int64")
        df.attrs["path"] = str(self.path)
        df.attrs["run"] = run_label(self.path, self.meta)
        df.attrs["meta"] = dict(self.meta)
        df.attrs["names"] = self.names
        if release:
            self._reset()
        return df


def _iter_blocks(f: IO[bytes] | gzip.GzipFile) -> Iterator[bytes]:
    try:
        while block := f.read(_BLOCK):
            yield block
    except (EOFError, zlib.error):  # a .gz still being written, or cut by a crash
        return
    except gzip.BadGzipFile as exc:
        raise AnalysisError(f"{getattr(f, 'name', 'file')}: not a valid gzip file ({exc})") from exc


def read_jsonl(path: str | os.PathLike[str], metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Read a metrics JSONL file (plain or gzip; a run folder or directory picks the file).

    Each record becomes one row; nested ``metrics`` dicts are flattened (see
    :func:`flatten_record`), ``type: meta`` / ``session`` lines are skipped (the meta header
    names the run). Memory holds only the kept columns: with ``metrics`` given, only those
    names (exact, or as a prefix: ``"perf/train/"``) and the position keys
    (``step``, ``time``, ``epoch``).

    Returns:
        A DataFrame with one column per metric; ``df.attrs`` holds ``path``, ``run`` (the
        run's name, for legends), ``meta`` and ``names`` (every metric name in the file).
    """
    file = resolve_metrics_file(path)
    keep = None
    if metrics is not None:
        wanted = name_matcher(metrics)

        def keep(name: str) -> bool:
            return name in _X_KEYS or wanted(name)

    table = MetricsTable(file, keep=keep)
    table.poll(final=True)
    return table.frame(release=True)


def name_matcher(metrics: Sequence[str]) -> Callable[[str], bool]:
    """A predicate: the name is one of ``metrics`` or starts with one followed by ``.``/``/``."""
    exact = set(metrics)
    prefixes = tuple(
        m if m.endswith((".", "/")) else s for m in metrics for s in (m + ".", m + "/")
    )

    def keep(name: str) -> bool:
        return name in exact or name.startswith(prefixes)

    return keep


def run_label(path: str | os.PathLike[str], meta: Mapping[str, Any] | None = None) -> str:
    """A run's display name: the ``run`` of the file's meta header, else the run folder's
    name for a generically named file (``metrics.jsonl``), else the file name without
    ``.jsonl`` / ``.gz``."""
    if meta:
        name = meta.get("run") or meta.get("run_id")
        if isinstance(name, str) and name:
            return name
    p = Path(path)
    stem = p.name.removesuffix(".gz").removesuffix(".jsonl")
    if stem.startswith(("metrics", "spans")) and p.parent.name:
        return p.parent.name
    return stem


def _jsonl_files(directory: Path, depth: int) -> Iterator[Path]:
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for e in entries:
        if e.is_file() and (e.name.endswith(".jsonl") or e.name.endswith(".jsonl.gz")):
            yield Path(e.path)
        elif e.is_dir() and depth > 0 and not e.name.startswith("."):
            yield from _jsonl_files(Path(e.path), depth - 1)


def _newest(paths: Iterable[Path]) -> Path | None:
    best: tuple[float, str] | None = None
    out = None
    for p in paths:
        try:
            key = (p.stat().st_mtime, str(p))
        except OSError:
            continue
        if best is None or key > best:
            best, out = key, p
    return out


def resolve_metrics_file(path: str | os.PathLike[str]) -> Path:
    """The metrics file that ``path`` names.

    A file is itself. A directory (a run folder, or a folder of runs) gives the newest
    ``metrics*.jsonl[.gz]`` in it or up to two levels below; if there is none, the newest
    other ``*.jsonl[.gz]`` that is not a spans file.

    Raises:
        AnalysisError: nothing suitable exists.
    """
    p = Path(path)
    if not p.exists():
        raise AnalysisError(f"{p}: no such file or directory")
    if p.is_file():
        return p
    files = [f for f in _jsonl_files(p, _SEARCH_DEPTH) if not f.name.startswith("spans")]
    named = [f for f in files if f.name.startswith("metrics")]
    found = _newest(named) or _newest(files)
    if found is None:
        raise AnalysisError(
            f"{p}: no metrics JSONL file here (looked for metrics*.jsonl[.gz] and other "
            f"*.jsonl[.gz] up to {_SEARCH_DEPTH} levels down)"
        )
    return found


_SPANS_RE = re.compile(r"^spans(?:-rank(\d+))?\.jsonl(?:\.gz)?$")


def spans_rank(path: Path) -> int | None:
    """The rank in a ``spans-rank<N>.jsonl`` file name, else ``None``."""
    m = _SPANS_RE.match(path.name)
    return int(m.group(1)) if m and m.group(1) is not None else None


def resolve_spans_files(path: str | os.PathLike[str]) -> list[Path]:
    """The spans files that ``path`` names, one per rank.

    A file is itself. A run folder gives its ``spans.jsonl`` / ``spans-rank<N>.jsonl``
    (plain or ``.gz``), sorted by rank. A folder of runs gives those of the run folder whose
    spans file is newest (up to two levels below).

    Raises:
        AnalysisError: nothing suitable exists.
    """
    p = Path(path)
    if not p.exists():
        raise AnalysisError(f"{p}: no such file or directory")
    if p.is_file():
        return [p]
    files = [f for f in _jsonl_files(p, _SEARCH_DEPTH) if _SPANS_RE.match(f.name)]
    newest = _newest(files)
    if newest is None:
        raise AnalysisError(
            f"{p}: no spans file here (looked for spans.jsonl and spans-rank<N>.jsonl, "
            f"plain or .gz, up to {_SEARCH_DEPTH} levels down)"
        )
    run_dir = newest.parent
    return _one_per_rank([f for f in files if f.parent == run_dir])


def _one_per_rank(files: Iterable[Path]) -> list[Path]:
    """One spans file per rank, sorted by rank: the plain file when both forms exist."""
    by_rank: dict[int | None, Path] = {}
    for f in sorted(files, key=lambda f: f.name.endswith(".gz")):
        by_rank.setdefault(spans_rank(f), f)
    return sorted(by_rank.values(), key=lambda f: (spans_rank(f) or -1, f.name))


def folder_spans_files(folder: Path) -> list[Path]:
    """The spans files directly in ``folder`` (one run's), one per rank; ``[]`` if none."""
    try:
        names = [e.name for e in os.scandir(folder) if e.is_file()]
    except OSError:
        return []
    return _one_per_rank(folder / n for n in names if _SPANS_RE.match(n))


_RUN_FILE_RE = re.compile(r"^(?:spans|metrics)(?:-rank\d+)?\.jsonl(?:\.gz)?$")


def run_folders(path: str | os.PathLike[str]) -> list[Path]:
    """The run folders that ``path`` holds: itself and its folders up to two levels below
    that hold a spans or metrics file, oldest first (by their newest such file); ``[]`` for
    a file. A folder given to several runs (``output_dir=`` reused) holds the first run's
    files and ``run-2``, ``run-3``... for the later ones."""
    p = Path(path)
    if not p.is_dir():
        return []
    newest: dict[Path, float] = {}
    for f in _jsonl_files(p, _SEARCH_DEPTH):
        if not _RUN_FILE_RE.match(f.name):
            continue
        try:
            t = f.stat().st_mtime
        except OSError:
            continue
        newest[f.parent] = max(t, newest.get(f.parent, t))
    return sorted(newest, key=lambda d: (newest[d], str(d)))


LISTED_MOST = 10
"""The most names a message lists: the rest are counted (``... and 9,990 more``)."""


def listed(names: Sequence[str], most: int = LISTED_MOST) -> str:
    """``names`` joined with commas for a message; past ``most`` the first ones and a count
    of the others (a folder of 10k runs, a file of 100k metric names: one short line)."""
    if len(names) <= most:
        return ", ".join(names)
    return f"{', '.join(names[:most])} ... and {len(names) - most:,} more"


def runs_note(path: str | os.PathLike[str], chosen: Path) -> str | None:
    """What to tell the user when ``path`` holds several runs and ``chosen`` (a file of one
    of them) is read: which one, and the others; ``None`` when it holds one run."""
    runs = run_folders(path)
    if len(runs) < 2:
        return None
    others = listed([str(r) for r in runs if r != chosen.parent])
    return (
        f"{path} holds {len(runs)} runs; reading the newest, {chosen.parent} (give a run's "
        f"folder to read another: {others})"
    )
