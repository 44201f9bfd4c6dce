"""Data loading in the PyTorch integration: each ``next()`` of a DataLoader (or any
iterable) as a component span. Re-exported by :mod:`otel_tunix.instrumentation.torch`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import otel_tunix
from otel_tunix.recording.hot_path import before_a_step, may_record, now_ns, precede_next_step


# --- data loading -----------------------------------------------------------------------
def _prefetches(loader: Any) -> bool:
    try:
        return int(getattr(loader, "num_workers", 0) or 0) > 0
    except (TypeError, ValueError):
        return False


class InstrumentedLoader:
    """An iterable whose iterators record each ``next()`` as a component span.

    A ``next()`` made while no step is open (``for batch in loader: with step(n): ...``)
    is taken over by the next step opened on that thread: the step starts when the fetch
    started, with the fetch as its first component.

    Everything else (``len()``, ``.dataset``, ``set_epoch`` ...) is delegated to the wrapped
    loader. Made by :func:`instrument_dataloader`.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        name: str = "train_data_load",
        blocked: bool | None = None,
        *,
        before_fetch: Callable[[], bool | None] | None = None,
        after_fetch: Callable[[], None] | None = None,
    ) -> None:
        self.loader = loader
        self.name = name
        self.blocked = _prefetches(loader) if blocked is None else blocked
        self.before_fetch = before_fetch
        self.after_fetch = after_fetch

    def __iter__(self) -> Iterator[Any]:
        try:
            length: int | None = len(self.loader)  # type: ignore[arg-type]
        except TypeError:
            length = None
        return _InstrumentedIterator(iter(self.loader), self, length)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.loader, name)


class _InstrumentedIterator:
    __slots__ = ("_it", "_length", "_owner", "_yielded")

    def __init__(self, it: Iterator[Any], owner: InstrumentedLoader, length: int | None) -> None:
        self._it = it
        self._owner = owner
        self._length = length
        self._yielded = 0

    def __iter__(self) -> _InstrumentedIterator:
        return self

    def __next__(self) -> Any:
        owner = self._owner
        if (self._length is not None and self._yielded >= self._length) or (
            owner.before_fetch is not None and owner.before_fetch() is False
        ):
            item = next(self._it)  # the end of the epoch, or not ours to record
        elif not may_record():  # outside the steps: only inside a component that is
            if not before_a_step():
                item = next(self._it)
            else:  # `for batch in loader: with step(n):` the next step takes the fetch
                start = now_ns()
                item = next(self._it)
                precede_next_step(owner.name, owner.blocked, start, now_ns())
                if owner.after_fetch is not None:
                    owner.after_fetch()
        else:
            with otel_tunix.component(owner.name, owner.blocked):
                item = next(self._it)
            if owner.after_fetch is not None:
                owner.after_fetch()
        self._yielded += 1
        return item

    def __len__(self) -> int:
        return len(self._it)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "_it":  # not set yet
            raise AttributeError(name)
        return getattr(self._it, name)  # the DataLoader iterator's own attributes


def instrument_dataloader(
    loader: Iterable[Any], name: str = "train_data_load", blocked: bool | None = None
) -> InstrumentedLoader:
    """Wrap a DataLoader (or any iterable) so the wait for each batch is a component.

    ``blocked`` defaults to True for a loader with ``num_workers > 0`` (the loop waits on
    prefetching workers) and False otherwise (the loop does the loading work itself).
    """
    return InstrumentedLoader(loader, name, blocked)
