"""Child processes that tests start: their environment."""

from __future__ import annotations

import os


def child_env(**settings: str) -> dict[str, str]:
    """The test process's environment without any ``OTEL_*`` variable (the developer's, or
    the fixtures'), with ``settings`` added: a child configures otel-tunix from these only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(settings)
    return env


MAKE_VARIABLES = ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")
"""What a running ``make`` (``make test``, as CI runs the suite) hands its children: a
``make`` a test starts would then print ``make[1]: Entering directory`` lines and take the
outer one's flags, where a user's shell has none."""


def shell_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) as a user's shell has it: without the
    variables of a ``make`` the suite may run under."""
    source = dict(os.environ) if env is None else env
    return {k: v for k, v in source.items() if k not in MAKE_VARIABLES}
