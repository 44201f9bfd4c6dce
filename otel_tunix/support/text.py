"""Text as the binary formats take it: names and values made valid UTF-8.

A Python ``str`` may hold lone surrogates (``os.fsdecode`` of an odd file name, JSON's
``"\\ud800"``, a name built from bytes with ``surrogateescape``); protobuf (Perfetto) and
the Prometheus exposition refuse them, and one such name would cost a whole batch or
scrape. Each is replaced by U+FFFD (the replacement character) instead: the span or sample
is kept, under a name that shows where the odd character was.
"""

from __future__ import annotations

import re

__all__ = ["MAX_NAME_LENGTH", "MAX_VALUE_LENGTH", "clean_name", "clean_value", "utf8_text"]

_SURROGATE = re.compile(r"[\ud800-\udfff]")


def utf8_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (ASCII text is returned as it
    is, without a scan)."""
    if text.isascii():
        return text
    return _SURROGATE.sub("\ufffd", text)


MAX_NAME_LENGTH = 255
"""Longest span, component, scope, attribute key or metric name kept (OTel's limit for
instrument names); a longer one is cut, with ``…`` as its last character."""
MAX_VALUE_LENGTH = 4096
"""Longest text attribute value kept: a value of megabytes would make its export batch
too large for the collector, losing every span in it."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_NUL_OR_SURROGATE = re.compile(r"[\x00\ud800-\udfff]")


def clean_name(name: str) -> str:
    """``name`` as a span, attribute or metric name may be: control characters (NUL,
    newlines, ...) and lone surrogates replaced by U+FFFD, at most :data:`MAX_NAME_LENGTH`
    characters. A name that is fine is returned as it is."""
    if len(name) <= MAX_NAME_LENGTH and name.isprintable():
        return name
    name = _CONTROL.sub("\ufffd", name)
    if len(name) > MAX_NAME_LENGTH:
        name = name[: MAX_NAME_LENGTH - 1] + "\u2026"
    return name


def clean_value(text: str, limit: int = MAX_VALUE_LENGTH) -> str:
    """A text attribute value as the exporters take it: NUL and lone surrogates replaced by
    U+FFFD (newlines and tabs are kept), at most ``limit`` characters."""
    if len(text) > limit:
        text = text[: limit - 1] + "\u2026"
    if text.isascii() and "\x00" not in text:
        return text
    return _NUL_OR_SURROGATE.sub("\ufffd", text)
