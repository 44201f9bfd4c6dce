"""The package version (one place)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("otel-tunix")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"
