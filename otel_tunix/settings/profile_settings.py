"""The profile captures' rows of the settings table (:data:`otel_tunix.settings.table.SETTINGS`
takes them in place, in the README's order): the one table, kept in two modules so that
neither is over the project's module size.
"""

from __future__ import annotations

from typing import Final

from otel_tunix.settings import variables as env
from otel_tunix.settings.parsing import (
    BOOL,
    Setting,
    _non_negative_int,
    _positive_int,
    _profiler,
    parse_bool,
)

__all__ = ["PROFILE_SETTINGS"]

PROFILE_SETTINGS: Final[tuple[Setting, ...]] = (
    Setting(
        env.OTEL_TUNIX_PROFILE_ON_ALERT,
        "profile_on_alert",
        parse_bool,
        True,
        "when an alert fires, profile the rank's next steps with the framework's profiler "
        "(files in `<run folder>/profiles/`)",
        BOOL,
    ),
    Setting(
        env.OTEL_TUNIX_PROFILER,
        "profiler",
        _profiler,
        "auto",
        "the profiler of the captures; `auto`: JAX's when jax is imported and torch is not, "
        "or both are and Tunix or Flax is too; else torch's when torch is imported",
        "auto, torch or jax",
    ),
    Setting(
        env.OTEL_TUNIX_PROFILE_STEPS,
        "profile_steps",
        _positive_int,
        3,
        "steps one profile capture covers",
        "a positive integer",
    ),
    Setting(
        env.OTEL_TUNIX_PROFILE_MAX_CAPTURES,
        "profile_max_captures",
        _non_negative_int,
        3,
        "profile captures an alert may start per run (`capture_profile()` is not capped)",
        "a non-negative integer",
    ),
    Setting(
        env.OTEL_TUNIX_PROFILE_COOLDOWN_STEPS,
        "profile_cooldown_steps",
        _non_negative_int,
        50,
        "steps after a capture ends before an alert may start another",
        "a non-negative integer",
    ),
)
"""``OTEL_TUNIX_PROFILE_ON_ALERT``, ``OTEL_TUNIX_PROFILER`` and the captures' limits
(:mod:`otel_tunix.metrics.profiling`)."""
