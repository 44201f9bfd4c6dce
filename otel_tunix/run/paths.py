"""The run's local paths, checked at ``configure()``: a folder that cannot be one, or a file
that cannot be written, is a :class:`ConfigurationError` naming the setting, not an
``OSError`` from deep inside a writer.

``configure()`` never blocks on a file: what it reads (an earlier attempt's spans file, a
folder's claim) is opened with :func:`open_regular`, which never waits on a FIFO and refuses
what is not a regular file (a FIFO, ``/dev/zero``, a directory), and read up to a bound.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from pathlib import Path
from typing import BinaryIO

from otel_tunix.settings.parsing import ConfigurationError

__all__ = [
    "NotRegularFile",
    "checked_dir",
    "checked_file",
    "open_regular",
    "os_reason",
    "path_component",
]


class NotRegularFile(OSError):
    """A path that :func:`open_regular` refused: a FIFO, a device, a directory, ..."""


_UNSAFE = re.compile(r"[^\w.\-]")
_MAX_COMPONENT = 200  # bytes: a file system's names hold 255, and "-2" or "-rank7" is added


def path_component(text: str) -> str:
    """``text`` made safe as one path component: every character but letters, digits,
    ``_``, ``.`` and ``-`` becomes ``_`` (no ``/``, ``\\``, NUL or lone surrogate survives),
    leading dots are dropped (no ``..``, no hidden folder), at most 200 bytes in UTF-8 (a
    longer one is cut at a whole character and ends in ``-`` and 16 hex digits of its hash,
    so two long ids that start alike still differ); ``run`` when nothing is left."""
    safe = _UNSAFE.sub("_", text).lstrip(".")
    data = safe.encode("utf-8", "surrogatepass")
    if len(data) > _MAX_COMPONENT:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        head = data[: _MAX_COMPONENT - 17].decode("utf-8", "ignore")
        safe = f"{head}-{digest}"
    return safe or "run"


def checked_dir(path: str | os.PathLike[str], setting: str) -> Path:
    """``path`` made (with its parents) and writable, as a directory.

    Raises:
        ConfigurationError: it is a file, or cannot be made or written; the message names
            ``setting`` (e.g. ``"output_dir / OTEL_TUNIX_OUTPUT_DIR"``) and the reason.
    """
    p = Path(path)
    _refuse_nul(p, setting)
    if p.exists() and not p.is_dir():
        raise ConfigurationError(f"{setting}={os.fspath(path)!r} is a file, not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"{setting}={os.fspath(path)!r}: cannot make the directory ({os_reason(exc)})"
        ) from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise ConfigurationError(
            f"{setting}={os.fspath(path)!r}: the directory is not writable by this process"
        )
    return p


def checked_file(path: str | os.PathLike[str], setting: str) -> Path:
    """``path`` as a file that can be appended to: not a directory, its folder made.

    Raises:
        ConfigurationError: it is a directory, its folder cannot be made, or the file
            cannot be opened for appending; the message names ``setting`` and the reason.
    """
    p = Path(path)
    _refuse_nul(p, setting)
    if p.is_dir():
        raise ConfigurationError(f"{setting}={os.fspath(path)!r} is a directory, not a file")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        # never blocks: a FIFO with no reader fails (ENXIO)
        os.close(os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666))
    except OSError as exc:
        raise ConfigurationError(
            f"{setting}={os.fspath(path)!r}: cannot write the file ({os_reason(exc)})"
        ) from None
    return p


def open_regular(path: str | os.PathLike[str], *, follow: bool = True) -> BinaryIO:
    """``path`` opened for reading, if it is a regular file (a link to one when ``follow``).

    The open never waits (``O_NONBLOCK``: a FIFO with no writer would block it for ever).

    Raises:
        NotRegularFile: it is a FIFO, a device, a directory or a socket.
        OSError: it cannot be opened (missing, a link when not ``follow``, ...).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(mode)
                else "a directory"
                if stat.S_ISDIR(mode)
                else "not a regular file"
            )
            raise NotRegularFile(errno.EINVAL, kind, os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _refuse_nul(path: Path, setting: str) -> None:
    if "\0" in os.fspath(path):  # no system call takes one (a raw ValueError otherwise)
        raise ConfigurationError(f"{setting}={os.fspath(path)!r}: a path holds no NUL character")


def os_reason(exc: OSError) -> str:
    """The error in words, without the traceback (``Permission denied``, ...)."""
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        return "a part of the path is a file"
    return exc.strerror or type(exc).__name__
