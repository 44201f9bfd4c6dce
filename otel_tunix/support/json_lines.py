"""One JSON line per record, for the local JSONL files (spans, metrics).

Encoding is most of what writing a step to the local run folder costs: ~15 us for a step
line with the standard library against ~1.5 us with ``orjson``. So ``orjson`` is used when
it is installed (the ``fast`` and ``demo`` extras bring it), the standard library otherwise;
both write the same JSON. Values ``orjson`` cannot write the way the files promise (NaN and
infinities, which it would turn into ``null``; integers beyond 64 bits; other key types)
go through the standard library.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable, Collection
from pathlib import Path
from typing import IO, Any


def _default(obj: Any) -> Any:
    """What is not JSON: numpy / torch / jax values as Python numbers or lists, anything
    else as its ``str()``."""
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        try:
            return tolist()
        except Exception:  # a best-effort probe of a foreign value: its str() below will do
            pass
    return str(obj)


# The records are fresh trees of dicts and lists: no cycle check needed.
_std_encode = json.JSONEncoder(check_circular=False, default=_default).encode


def _fast_line_factory() -> Callable[[Any], str] | None:
    try:
        import orjson
    except ImportError:
        return None
    dumps, option = orjson.dumps, orjson.OPT_SERIALIZE_NUMPY
    error = (TypeError, orjson.JSONEncodeError)

    def fast(obj: Any) -> str:
        try:
            return dumps(obj, default=_default, option=option).decode()
        except error:  # a key that is not a string, an int beyond 64 bits, ...
            return _std_encode(obj)

    return fast


_fast_line = _fast_line_factory()


def dumps_line(obj: Any, *, finite: bool = True) -> str:
    """``obj`` as one line of JSON (no newline). ``finite=False`` when a float in it may be
    NaN or infinite: those are written as ``NaN`` / ``Infinity``, as Python's ``json``
    (and pandas) read them."""
    if finite and _fast_line is not None:
        return _fast_line(obj)
    return _std_encode(obj)


def floats_finite(values: Collection[float]) -> bool:
    """True when every float of this collection is finite: one C-level sum (a NaN or an
    infinity makes it non-finite) and an exact check only when the sum is not finite."""
    try:
        if math.isfinite(sum(values)):
            return True
    except (TypeError, OverflowError):
        pass
    return all_finite(values)


def all_finite(values: Any) -> bool:
    """True when no value of this iterable is a NaN or infinite float (other types pass)."""
    isfinite = math.isfinite
    return all(isfinite(v) for v in values if isinstance(v, float))


__all__ = ["all_finite", "dumps_line", "floats_finite"]


def open_text(path: Path, mode: str = "a") -> IO[str]:
    """Open a text file for writing; a ``.gz`` suffix writes gzip."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return open(path, mode, encoding="utf-8")
