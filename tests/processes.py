"""Child processes that tests start: their environment."""

from __future__ import annotations

import os


def child_env(**settings: str) -> dict[str, str]:
    """The test process's environment without any ``OTEL_*`` variable (the developer's, or
    the fixtures'), with ``settings`` added: a child configures otel-tunix from these only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(settings)
    return env
