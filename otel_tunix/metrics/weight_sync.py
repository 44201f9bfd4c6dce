"""Weight syncs: the learner publishing its weights to the actors, counted, timed and sized
per learner step.

``with otel_tunix.rl.weight_sync(nbytes=...):`` around the publish is a ``weight_sync``
component (its span, and its time in the goodput ledger's ``weight_sync`` category), and
records, for every sync whether its step is sampled or not, ``tunix.rl.weight_sync.count``,
``tunix.rl.weight_sync.duration`` and ``tunix.rl.weight_sync.bytes``. In a sampled step the
step span gets the step's totals (``tunix.rl.weight_sync.count``, ``.bytes``) and the
MetricsLogger gets ``rl/weight_syncs_per_step``, the syncs of the step so far, which the
default ``weight_sync_repeated`` alert watches: one sync per learner step is what an RL loop
means; a second one is a second publish path, or a retry, that costs its time again.
"""

from __future__ import annotations

import time
from typing import Any

from otel_tunix.accounting.categories import WEIGHT_SYNC
from otel_tunix.logger.instruments import CatalogInstruments
from otel_tunix.model.alert_rules import WEIGHT_SYNCS_METRIC
from otel_tunix.recording.current_run import CurrentRun, get_current
from otel_tunix.recording.hot_path import component, context_step
from otel_tunix.settings import attributes as attr
from otel_tunix.support.errors import report_internal_error

__all__ = ["weight_sync"]

COUNT = "tunix.rl.weight_sync.count"
DURATION = "tunix.rl.weight_sync.duration"
BYTES = "tunix.rl.weight_sync.bytes"

_clock = time.perf_counter
_instruments: tuple[CurrentRun | None, CatalogInstruments] | None = None


def _record() -> Any:
    global _instruments
    run = get_current()
    made = _instruments
    if made is None or made[0] is not run:
        made = _instruments = (run, CatalogInstruments())
    return made[1].record


class weight_sync:
    """``with otel_tunix.rl.weight_sync(nbytes=n):`` around one publish of the weights.

    Args:
        nbytes: The bytes the sync moves (the state dict's size, say); may also be given
            inside the block with :meth:`set_bytes`. ``None``: not recorded.
    """

    __slots__ = ("_comp", "_nbytes", "_t0")

    def __init__(self, nbytes: int | None = None) -> None:
        self._nbytes = nbytes
        self._comp: Any = None
        self._t0 = 0.0

    def set_bytes(self, nbytes: int) -> None:
        """The bytes this sync moves, when known only inside the block."""
        self._nbytes = nbytes

    def __enter__(self) -> weight_sync:
        comp = self._comp = component(WEIGHT_SYNC)
        comp.__enter__()
        self._t0 = _clock()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        seconds = _clock() - self._t0
        self._comp.__exit__(exc_type, exc, tb)
        try:
            record = _record()
            record(COUNT, 1)
            record(DURATION, seconds)
            nbytes = self._nbytes
            if nbytes is not None:
                record(BYTES, int(nbytes))
            st = context_step()
            if st is None:
                return
            a = st.attributes
            count = a[attr.RL_WEIGHT_SYNCS] = int(a.get(attr.RL_WEIGHT_SYNCS, 0)) + 1
            if nbytes is not None:
                a[attr.RL_WEIGHT_SYNC_BYTES] = int(a.get(attr.RL_WEIGHT_SYNC_BYTES, 0)) + int(
                    nbytes
                )
            run = get_current()
            if run is not None:
                run.logger.log_dict({WEIGHT_SYNCS_METRIC: float(count)}, step=st.number)
        except Exception:
            report_internal_error("otel_tunix.rl.weight_sync()")
