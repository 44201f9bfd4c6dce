"""Why JAX compiled: the ``cause`` of ``tunix.compilations`` for each XLA compilation.

JAX's compile events name the function only. An :func:`~otel_tunix.instrumentation.jax.
instrument_jit` call keeps its arguments in a thread-local while it runs (JAX compiles on
the calling thread), so a compilation inside it is compared with the earlier ones of the
same wrapper and function: the shapes and dtypes of the argument leaves
(:mod:`otel_tunix.metrics.compilations` lists the causes). A compilation outside such a call
is ``first_call`` for a function name not compiled before, else ``unknown``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Hashable
from typing import Any

Signature = tuple[tuple[tuple[int, ...], str], ...] | None
"""Shape and dtype of each argument leaf (``None``: the arguments could not be read)."""


class _Calls(threading.local):
    call: tuple[object, tuple[Any, ...], dict[str, Any]] | None = None


class CompileCauses:
    """The causes of the compilations seen so far (one per process)."""

    def __init__(self) -> None:
        self.calls = _Calls()
        """The instrumented call running on this thread: ``(wrapper, args, kwargs)``."""
        self._lock = threading.Lock()
        self._signatures: dict[Hashable, list[Signature]] = {}
        self._names: set[str] = set()

    def cause(self, fun_name: str) -> str:
        """The cause of the compilation of ``fun_name`` now ending on this thread."""
        call = self.calls.call
        if call is None:
            with self._lock:
                first = fun_name not in self._names
                self._names.add(fun_name)
            return "first_call" if first else "unknown"
        owner, args, kwargs = call
        sig = _signature(args, kwargs)
        with self._lock:
            self._names.add(fun_name)
            earlier = self._signatures.setdefault((id(owner), fun_name), [])
            before = earlier[-1] if earlier else None
            seen = sig in earlier
            earlier.append(sig)
        if before is None:
            return "first_call"
        return _difference(before, sig) if not seen else "other"


def _difference(before: Signature, now: Signature) -> str:
    if before is None or now is None or len(before) != len(now):
        return "other"
    if any(b[1] != n[1] for b, n in zip(before, now, strict=True)):
        return "new_dtypes"
    if any(b[0] != n[0] for b, n in zip(before, now, strict=True)):
        return "new_shapes"
    return "other"


def _signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Signature:
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        leaves = jax.tree_util.tree_leaves((args, kwargs))
        return tuple(
            (tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x).__name__)))
            for x in leaves
        )
    except Exception:  # an argument JAX cannot flatten: compared as unknown
        return None
