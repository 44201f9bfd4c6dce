"""How a setting's text becomes its value: the row type of the settings table
(:class:`Setting`), the parsers its rows name, and :class:`ConfigurationError`."""

from __future__ import annotations

import os
import stat
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "BOOL",
    "MAX_INTERVAL_MS",
    "MAX_SHUTDOWN_SEC",
    "PEM",
    "PEM_MAX_BYTES",
    "ConfigurationError",
    "Setting",
    "parse_bool",
    "parse_interval_ms",
]


class ConfigurationError(ValueError):
    """A configuration value is not allowed; the message names the field and what is."""


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_OFF = frozenset({"none", "off", "false", "0"})
MAX_INTERVAL_MS: Final = 60_000.0
"""Largest allowed ``OTEL_TUNIX_PROCESS_INTERVAL_MS``."""
MAX_SHUTDOWN_SEC: Final = 3600.0
"""Largest allowed ``OTEL_TUNIX_SHUTDOWN_TIMEOUT``."""


# --- parsers: text (stripped, non-empty) -> value; ValueError when not allowed ------------


def parse_bool(raw: str) -> bool:
    value = raw.lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError
    return value


def _non_negative_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError
    return value


def _positive_float(raw: str) -> float:
    value = float(raw)
    if not value > 0 or value == float("inf"):
        raise ValueError
    return value


def _port(raw: str) -> int:
    value = int(raw)
    if not 0 <= value <= 65535:
        raise ValueError
    return value


def _text(raw: str) -> str:
    return raw


def _names(raw: str) -> tuple[str, ...]:
    """A comma-separated list of exporter names, lower-cased; ``none`` means none."""
    names = tuple(n.strip().lower() for n in raw.split(",") if n.strip())
    return () if "none" in names else names


def _components(raw: str) -> tuple[str, ...] | None:
    return tuple(c.strip() for c in raw.split(",") if c.strip()) or None


def parse_interval_ms(raw: str) -> float:
    value = float(raw)
    if not 0 < value <= MAX_INTERVAL_MS:
        raise ValueError
    return value


def _seconds(raw: str) -> float:
    value = float(raw)
    if not 0 < value <= MAX_SHUTDOWN_SEC:
        raise ValueError
    return value


def _seconds_or_off(raw: str) -> float | None:
    if raw.lower() in _OFF:
        return None
    value = float(raw)
    if not value > 0:
        raise ValueError
    return value


def _url(raw: str) -> str:
    """A URL with its scheme and host: ``localhost:4317`` alone would be read as the scheme
    ``localhost`` (and gRPC would then go over TLS and fail)."""
    parsed = urllib.parse.urlsplit(raw)
    if parsed.scheme.lower() not in ("http", "https") or not parsed.hostname:
        raise ValueError
    parsed.port  # noqa: B018 - raises ValueError for a port that is not a number 0-65535
    return raw


PEM_MAX_BYTES = 16 << 20
"""The largest certificate or key file ``configure()`` lets the OTel SDK read."""
BOOL = "true or false (also 1/0, yes/no, on/off)"
"""What a boolean setting allows (:func:`parse_bool`), in the README's table."""

PEM = "a regular file (not a FIFO, device or directory) of at most 16 MiB"


def _pem_file(raw: str) -> str:
    """``raw`` if it names no file (the SDK says so) or a regular file of at most
    :data:`PEM_MAX_BYTES`; found with ``stat`` (a FIFO is never opened)."""
    try:
        st = os.stat(raw)
    except (OSError, ValueError):
        return raw
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("not a regular file")
    if st.st_size > PEM_MAX_BYTES:
        raise ValueError("too large")
    return raw


def _profiler(raw: str) -> str:
    value = raw.strip().lower()
    if value not in ("auto", "torch", "jax"):
        raise ValueError
    return value


def _protocol(raw: str) -> str:
    if raw not in ("grpc", "http/protobuf"):
        raise ValueError
    return raw


@dataclass(frozen=True, slots=True)
class Setting:
    """One environment variable: its name, the :class:`Settings` field it fills, how it
    parses, its default, what it means, and what values are allowed (for errors and docs)."""

    name: str
    field: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    allowed: str
    read_by: str = "otel-tunix"
    """Who parses it: ``otel-tunix`` (into :class:`Settings`), else the package named, which
    reads it itself (the row documents it)."""
