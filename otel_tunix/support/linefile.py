"""Append-only files of whole lines that survive a full disk.

:class:`LineFile` holds the lines written since its last flush and appends them with one
``os.write`` per flush. When the write fails (``ENOSPC``, ``EFBIG`` past ``RLIMIT_FSIZE``,
``EIO``), the part that did get written is cut off again (``ftruncate`` to the last whole
line), the lines of that flush are counted as lost, the error is reported once naming the
file and the error in words (no traceback), and nothing is raised: the training loop goes on
and writing resumes at the next flush if space comes back. A reader therefore only ever sees
whole lines, a hard kill included (the file ends where the last flush ended).

:func:`write_errors` gives, per file, the first error and the records lost since the file
was last opened (run setup writes those of the run's files into ``summary.json`` as
``write_errors``). A ``.gz`` path is written through :mod:`gzip` (errors
counted the same way; whole lines are not guaranteed there).

Run files never follow a symbolic link: a :class:`LineFile` is opened with ``O_NOFOLLOW``
(a link planted in the run folder in place of ``metrics.jsonl`` is an ``OSError``, ``ELOOP``,
not an append to the file it points to), and :func:`replace_file` (``summary.json``,
``config.json``) writes a new temporary file (``O_EXCL``: never through a link left at its
name) that it renames over the old one (a rename replaces a link; it does not follow it).
"""

from __future__ import annotations

import errno
import gzip
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from otel_tunix.support.errors import warn_once

__all__ = [
    "MAX_LINE_BYTES",
    "NOFOLLOW",
    "TOO_LONG",
    "LineFile",
    "capped_lines",
    "record_write_error",
    "replace_file",
    "write_errors",
]

MAX_LINE_BYTES = 16 << 20
"""The longest line a reader of the run files takes (a step line is a few KB): a longer
one is skipped, in bounded memory, as :data:`TOO_LONG`."""

TOO_LONG = b"\x00 line longer than MAX_LINE_BYTES\n"
"""What :func:`capped_lines` gives in place of a line too long to read: no JSON, so every
reader skips and counts it as a bad line."""

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
"""``os.O_NOFOLLOW`` where there is one: the open fails on a symbolic link."""

FLUSH_BYTES = 1 << 20
"""Lines held before a flush happens on its own (a writer that seldom flushes)."""

_lock = threading.Lock()
_errors: dict[str, dict[str, object]] = {}


def record_write_error(
    path: Path | str,
    exc: OSError,
    records: int,
    *,
    said: str = "the records that did not fit are counted in summary.json (write_errors) "
    "and the end notice, and writing resumes when it can",
) -> None:
    """Count ``records`` lost writing ``path`` (the first error is kept) and report the
    error once per file, in words, then ``said``: where the count goes (for
    ``summary.json`` itself, not there)."""
    key = os.fspath(path)
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    with _lock:
        entry = _errors.setdefault(key, {"error": reason, "records_lost": 0})
        entry["records_lost"] = int(str(entry["records_lost"])) + records
    warn_once(
        ("write-error", key),
        "otel-tunix: cannot write %s: %s; %s",
        key,
        reason,
        said,
    )


def write_errors() -> dict[str, dict[str, object]]:
    """Per file: ``{"error": "No space left on device", "records_lost": n}``."""
    with _lock:
        return {path: dict(entry) for path, entry in _errors.items()}


class LineFile:
    """An append-only text file of whole lines (see the module docstring).

    Not thread-safe: its owner serialises the calls (the writers of otel-tunix hold a lock
    around them). Opening it may raise ``OSError`` (``configure()`` checks the paths first).
    """

    __slots__ = ("_fd", "_gz", "_pending", "_pending_bytes", "_records", "path")

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        with _lock:  # a new run writing this file counts afresh
            _errors.pop(os.fspath(self.path), None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._gz: IO[str] | None = None
        self._fd = -1
        if self.path.suffix == ".gz":
            # made (or found) without following a link first: gzip opens by name
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | NOFOLLOW | os.O_NONBLOCK, 0o666))
            self._gz = gzip.open(self.path, "at", encoding="utf-8")
        else:
            # O_NONBLOCK: a FIFO with no reader fails (ENXIO) instead of blocking the open
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW | os.O_NONBLOCK
            self._fd = os.open(self.path, flags, 0o666)
            os.set_blocking(self._fd, True)
        self._pending: list[str] = []
        self._pending_bytes = 0
        self._records = 0

    @property
    def closed(self) -> bool:
        return self._fd < 0 and self._gz is None

    def fileno(self) -> int:
        """The descriptor (of the compressed file for ``.gz``)."""
        if self._gz is not None:
            return self._gz.fileno()
        if self._fd < 0:
            raise ValueError("closed file")
        return self._fd

    def write(self, text: str, records: int = 1) -> None:
        """Hold ``text`` (whole lines, each ending in ``\\n``) of ``records`` records until
        the next :meth:`flush` (one on its own past :data:`FLUSH_BYTES`)."""
        if self.closed:
            return
        self._pending.append(text)
        self._pending_bytes += len(text)
        self._records += records
        if self._pending_bytes >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> bool:
        """Append the held lines; False (and the lines counted as lost) when that failed."""
        if not self._pending or self.closed:
            return True
        text = "".join(self._pending)
        records = self._records
        self._pending.clear()
        self._pending_bytes = self._records = 0
        try:
            if self._gz is not None:
                self._gz.write(text)
                self._gz.flush()
            else:
                self._append(text.encode("utf-8", "replace"))
        except OSError as exc:
            record_write_error(self.path, exc, records)
            return False
        return True

    def _append(self, data: bytes) -> None:
        view = memoryview(data)
        done = 0
        whole = os.fstat(self._fd).st_size  # the file ends with a whole line here
        try:
            while done < len(data):
                n = os.write(self._fd, view[done:])
                if n <= 0:  # pragma: no cover - a regular file writes or raises
                    raise OSError(errno.EIO, os.strerror(errno.EIO))
                done += n
        except OSError:
            if done:  # a torn line: cut back to the last whole one
                try:
                    os.ftruncate(self._fd, whole)
                except OSError:  # pragma: no cover - shrinking a file we write
                    pass
            raise

    def close(self) -> None:
        """Flush and close (idempotent)."""
        if self.closed:
            return
        self.flush()
        if self._gz is not None:
            gz, self._gz = self._gz, None
            try:
                gz.close()
            except OSError as exc:
                record_write_error(self.path, exc, 0)
        else:
            fd, self._fd = self._fd, -1
            os.close(fd)


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole: to ``<path>.tmp``, made new (a link or file left at
    that name is removed first, never followed), then renamed over ``path``. Raises
    ``OSError`` (nothing is left at the temporary name then)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def capped_lines(f: IO[bytes], max_bytes: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """The lines of a binary stream, each at most ``max_bytes`` long: a longer one is read
    through in blocks and given as :data:`TOO_LONG` (a 200 MB single line costs 16 MB of
    memory, not 6 GB)."""
    while True:
        line = f.readline(max_bytes + 1)
        if not line:
            return
        if len(line) > max_bytes and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):  # the rest of it, dropped
                line = f.readline(1 << 20)
            yield TOO_LONG
            continue
        yield line
