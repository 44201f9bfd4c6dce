"""Trace and span ids of otel-tunix's spans: random, from the OS's entropy.

Not from the ``random`` module's shared generator (which the OTel SDK's
``RandomIdGenerator`` draws from): a training script that calls ``random.seed(...)`` for
reproducibility (most do, e.g. ``transformers.set_seed``) would otherwise make every run
draw the same ids, and a tracing backend would merge the traces of different runs.

Span ids are drawn ahead, 256 at a time from one ``os.urandom`` call, into a pool that the
hot path pops from: a list pop per component instead of a ``getrandbits`` call, about a
third of its instructions. Trace ids (one per step) come from a ``random.Random`` of
otel-tunix's own, seeded from the OS. A forked child (a DataLoader worker) empties its copy of
the pool and reseeds that generator, so it never repeats its parent's ids.
"""

from __future__ import annotations

import hashlib
import os
import random
from array import array
from collections.abc import Callable

_POOL = 256
_pool: list[int] = []
_ZERO_ID = bytes(8)
_draw: Callable[[int], bytes] = os.urandom
"""``n -> n random bytes``: the OS's entropy, or a seeded generator's (see :func:`seed`)."""
_rng = random.Random()

take_span_id = _pool.pop
"""The next span id from the pool; raises ``IndexError`` when it is empty (then call
:func:`refill_span_ids`)::

    try:
        span_id = take_span_id()
    except IndexError:
        span_id = refill_span_ids()
"""


def refill_span_ids() -> int:
    """Refill the pool (from any thread) and return one more id, never 0."""
    raw = _draw(8 * _POOL)
    ids = array("Q", raw).tolist()  # "Q": 8 bytes on every platform CPython supports
    if raw.find(_ZERO_ID) >= 0:  # maybe an id 0 (invalid): about one refill in 2**53
        ids = [i for i in ids if i] or [1]
    mine = ids.pop()
    _pool.extend(ids)
    return mine


random_bits = _rng.getrandbits
"""``k -> a random int of k bits``, for trace ids: ``random_bits(128) or 1``."""


def seed(value: int | None = None) -> None:
    """Draw ids from ``random.Random(value)`` from now on (a benchmark that needs the same
    ids on every run), or, with ``None``, from the OS's entropy again. Empties the pool."""
    global _draw
    _draw = os.urandom if value is None else random.Random(value).randbytes
    _rng.seed(value)
    _pool.clear()


_MASK64 = (1 << 64) - 1
_MASK128 = (1 << 128) - 1
_TRACE_STRIDE = 0x9E3779B97F4A7C15F39CC0605CEDC835  # odd: n -> base + n * stride is 1:1
_SPAN_STRIDE = 0x9E3779B97F4A7C15


class JobStepIds:
    """Ids shared by the ranks of one job: step ``n`` of a scope is one trace on every rank,
    under one root span id. Derived from the run id (a launcher's job id, the same on every
    rank), so different runs get unrelated ids, as random ones would be; within a run each
    (scope, step) gets its own (an odd stride makes the step number to id map one to one)."""

    __slots__ = ("_bases", "_key")

    def __init__(self, run_id: str, attempt: int = 1) -> None:
        """``attempt``: the run's attempt of its job, mixed into the ids after the first, so
        two attempts never share a trace even where they share a run id (one given)."""
        key = run_id if attempt == 1 else f"{run_id}\0attempt{attempt}"
        self._key = hashlib.blake2b(key.encode(), digest_size=32).digest()
        self._bases: dict[str, tuple[int, int]] = {}

    def ids(self, scope: str, number: int) -> tuple[int, int]:
        """``(trace id, root span id)`` of step ``number`` of ``scope``."""
        base = self._bases.get(scope)
        if base is None:
            digest = hashlib.blake2b(
                scope.encode("utf-8", "surrogatepass"), key=self._key, digest_size=24
            ).digest()
            base = self._bases[scope] = (int.from_bytes(digest[:16]), int.from_bytes(digest[16:]))
        trace = (base[0] + number * _TRACE_STRIDE) & _MASK128
        root = (base[1] + number * _SPAN_STRIDE) & _MASK64
        return trace or 1, root or 1


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=seed)  # back to fresh entropy, the pool emptied
