"""The run and the steps of plain PyTorch loops: rank attributes from ``torch.distributed``,
configuring otel-tunix on first use, and zero-code steps (one per optimizer step) for loops
that open none. Re-exported by :mod:`otel_tunix.instrumentation.torch`.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import otel_tunix
from otel_tunix.instrumentation import _base
from otel_tunix.recording.hot_path import now_ns
from otel_tunix.settings import attributes as attr
from otel_tunix.settings.values import load_settings


# --- distributed ------------------------------------------------------------------------
def distributed_rank_attributes() -> dict[str, int]:
    """``tunix.rank`` / ``tunix.world_size`` (and ``tunix.local_rank``) from
    ``torch.distributed`` when a process group is initialised, else ``{}``."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    try:
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return {}
        out = {attr.RANK: int(dist.get_rank()), attr.WORLD_SIZE: int(dist.get_world_size())}
        local = load_settings().local_rank
        if local is not None:
            out[attr.LOCAL_RANK] = local
        return out
    except Exception:  # torch present but no usable process group: treat the process as alone
        return {}


def ensure_configured(*, asked: bool = False) -> bool:
    """:func:`otel_tunix.instrumentation._base.ensure_configured` with the torch rank."""
    if otel_tunix.current_run() is not None:
        return True
    extra = {} if load_settings().rank is not None else distributed_rank_attributes()
    return _base.ensure_configured(extra, asked=asked)


# --- zero-code: steps from a plain loop --------------------------------------------------
class _AutoSteps:
    """Steps for loops that never call :func:`otel_tunix.step` (zero-code mode).

    A step opens at the loop's first activity (a batch fetch, the model's forward, a
    backward, an optimizer step), from a ``zero_grad()`` just before it when there was one,
    and closes when ``optimizer.step()`` returns, so it covers data wait, forward, backward
    and the optimizer. Nothing happens while a step of the program's own (or of the
    Transformers integration) is open.
    """

    def __init__(self) -> None:
        self.enabled = False
        self.number = 0
        self.current: Any = None
        self.thread: int | None = None
        self.pending: tuple[int, int] | None = None
        """When and on which thread the next step may have started (``may_start``)."""
        self.on_step_done: Callable[[], None] | None = None
        """Called after each automatic step closes (the forward hooks narrow themselves)."""

    def may_start(self) -> None:
        """``zero_grad()``: the iteration may start here. The step is not opened yet (the
        program may open its own next, around the rest of the iteration); the next activity
        that opens one backdates it to this moment. Only once configured: a step never
        starts before its run."""
        if (
            self.enabled
            and self.current is None
            and self.pending is None
            and otel_tunix.current_run() is not None
        ):
            self.pending = (now_ns(), threading.get_ident())

    def activity(self) -> bool:
        """Called before a recorded activity. True when auto steps own the current loop."""
        if not self.enabled:
            return True
        if self.current is not None:
            return self.thread == threading.get_ident()
        pending, self.pending = self.pending, None
        if _base.step_is_open():
            return False
        if not ensure_configured():
            return False
        me = threading.get_ident()
        start = pending[0] if pending is not None and pending[1] == me else None
        st = otel_tunix.step(self.number, scope="train", start_ns=start)
        st.__enter__()
        self.current, self.thread = st, me
        return True

    def step_done(self) -> None:
        st = self.current
        if st is None or self.thread != threading.get_ident():
            return
        self.current = None
        self.number += 1
        st.__exit__(None, None, None)
        if self.on_step_done is not None:
            self.on_step_done()


_auto = _AutoSteps()
