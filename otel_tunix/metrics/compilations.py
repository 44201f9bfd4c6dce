"""Compilations counted: ``tunix.compilations`` (attributes ``framework`` and ``cause``).

The JAX integration counts each XLA compilation (a jit cache miss; attribute ``function``,
``jit(train_step)``, and the process attributes), the torch integration each frame
torch.compile (dynamo) compiles; both say why where they can tell:

* ``first_call``: the function (JAX) or code (dynamo) had not been compiled before;
* ``new_shapes``: an argument's shape differs from every earlier compilation's (JAX: the
  arguments of an :func:`~otel_tunix.instrumentation.jax.instrument_jit` call; dynamo: a
  guard on a size failed);
* ``new_dtypes``: an argument's dtype differs (a dtype guard failed);
* ``other``: compiled again for another reason (static arguments, shardings, a dynamo guard
  on a global or an attribute);
* ``unknown``: a recompilation whose arguments were not seen (a jitted function JAX
  compiled outside an instrumented call).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from otel_tunix.logger.instruments import CatalogInstruments
from otel_tunix.recording.current_run import get_current

__all__ = [
    "CAUSES",
    "COMPILATIONS",
    "cause_of_guard_failure",
    "count_compilation",
]

COMPILATIONS = "tunix.compilations"
"""The counter's name (catalogued in :mod:`otel_tunix.model.catalog`)."""

CAUSES = ("first_call", "new_shapes", "new_dtypes", "other", "unknown")
"""Every value of the ``cause`` attribute."""


def cause_of_guard_failure(reason: str | None) -> str:
    """The ``cause`` of a torch.compile (dynamo) compilation from its recompile reason (the
    first failed guard, ``None`` for a first compilation)."""
    if not reason:
        return "first_call"
    text = reason.lower()
    if "dtype" in text:
        return "new_dtypes"
    if "size mismatch" in text or "stride mismatch" in text or "shape" in text:
        return "new_shapes"
    return "other"


class _Counter:
    """``tunix.compilations`` of the current run (made again when the run changes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._run: Any = None
        self._instruments: CatalogInstruments | None = None

    def add(self, framework: str, cause: str, attributes: Mapping[str, Any] | None) -> None:
        run = get_current()
        inst = self._instruments
        if inst is None or run is not self._run:
            with self._lock:
                self._run, inst = run, CatalogInstruments()
                self._instruments = inst
        attrs = {"framework": framework, "cause": cause}
        if attributes:
            attrs.update(attributes)
        inst.record(COMPILATIONS, 1, attrs)


_counter = _Counter()


def count_compilation(
    framework: str, cause: str, attributes: Mapping[str, Any] | None = None
) -> None:
    """Count one compilation of ``framework`` (``jax``, ``torch``) for ``cause`` (one of
    :data:`CAUSES`), with extra ``attributes`` (bounded ones only: JAX's jitted ``function``
    name is, as the program's jitted functions are; no per-call values)."""
    _counter.add(framework, cause, attributes)
