"""Text as the binary formats take it: names and values made valid UTF-8.

A Python ``str`` may hold lone surrogates (``os.fsdecode`` of an odd file name, JSON's
``"\\ud800"``, a name built from bytes with ``surrogateescape``); protobuf (Perfetto) and
the Prometheus exposition refuse them, and one such name would cost a whole batch or
scrape. Each is replaced by U+FFFD (the replacement character) instead: the span or sample
is kept, under a name that shows where the odd character was.
"""

from __future__ import annotations

import re

__all__ = ["utf8_text"]

_SURROGATE = re.compile(r"[\ud800-\udfff]")


def utf8_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (ASCII text is returned as it
    is, without a scan)."""
    if text.isascii():
        return text
    return _SURROGATE.sub("\ufffd", text)
