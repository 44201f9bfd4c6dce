"""One otel-tunix step per iteration of a Tunix trainer loop (used by
:class:`otel_tunix.instrumentation.tunix.TunixInstrumentor`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import otel_tunix
from otel_tunix.instrumentation.jax import record_interval
from otel_tunix.support.errors import report_internal_error, warn_once

_logger = logging.getLogger("otel_tunix.instrumentation.tunix")  # the public module's logger

_clock = time.perf_counter_ns


# --- trainer loops (used by the instrumentor) ----------------------------------------------


def _open_step_at(n: int, scope: str, start_ns: int) -> Any:
    """Enter ``otel_tunix.step(n, scope)`` as if it had been entered at ``start_ns``."""
    s = otel_tunix.step(n, scope=scope, start_ns=start_ns)
    s.__enter__()
    return s


class _LoopSteps:
    """One otel-tunix step per iteration of a trainer loop over an iterator.

    A step starts when the iteration's batch fetch starts (the fetch is its
    ``<prefix>_data_load`` component) and ends when the next fetch starts, or when the loop
    ends. A fetch that finds the data exhausted, or that the trainer will not train on
    (``max_steps`` reached), opens no step.
    """

    def __init__(
        self,
        scope: str,
        data_component: str,
        number: Callable[[], int],
        stop: Callable[[], bool] | None = None,
        attributes: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self.scope = scope
        self.data_component = data_component
        self._number = number
        self._stop = stop
        self._attributes = attributes
        self._open: Any = None

    def close(self) -> None:
        s, self._open = self._open, None
        if s is not None:
            try:
                s.__exit__(None, None, None)
            except Exception:  # a step closes itself without raising: a bug of ours
                report_internal_error("closing a Tunix step")

    def wrap(self, iterable: Iterable[Any]) -> Iterator[Any]:
        return _StepIterator(iter(iterable), self)

    def fetched(self, start_ns: int, end_ns: int) -> None:
        try:
            if self._stop is not None and self._stop():
                return
            n = self._number()
            attributes = self._attributes() if self._attributes is not None else {}
        except Exception:  # the trainer's private attributes (_iter_steps, max_steps) changed
            warn_once(
                ("tunix", "step-number"),
                "otel-tunix: reading the Tunix trainer's step failed; steps not recorded",
                logger=_logger,
                level=logging.DEBUG,
                exc_info=True,
            )
            return
        try:
            self._open = _open_step_at(n, self.scope, start_ns)
            for key, value in attributes.items():
                self._open.set_attribute(key, value)
            record_interval(self.data_component, start_ns, end_ns)
        except Exception:  # only our own code: a bug of ours
            report_internal_error("opening a Tunix step")


class _StepIterator:
    __slots__ = ("_inner", "_steps")

    def __init__(self, inner: Iterator[Any], steps: _LoopSteps) -> None:
        self._inner = inner
        self._steps = steps

    def __iter__(self) -> _StepIterator:
        return self

    def __next__(self) -> Any:
        self._steps.close()
        start = _clock()
        item = next(self._inner)
        self._steps.fetched(start, _clock())
        return item

    def __getattr__(self, name: str) -> Any:  # get_state / set_state of grain iterators
        return getattr(self._inner, name)
