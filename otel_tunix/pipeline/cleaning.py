"""Names and attribute values made safe for every exporter, once per name.

A lone surrogate (``"\\ud800"``) in one component name made the OTLP encoder raise on the
whole export batch (30 of 200 step spans reached the collector); NUL, newlines and names of
10,000 characters broke collectors and their logs. The worker cleans what the hot path
recorded before any processor sees it (:func:`otel_tunix.support.text.clean_name`,
:func:`~otel_tunix.support.text.clean_value`): the span is kept under the cleaned name, and each
span or value changed is counted (``names_cleaned``, ``values_cleaned`` in
``summary.json``). The training thread pays nothing: a name is checked the first time the
worker sees it; later steps cost a set lookup per component, in C.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

from otel_tunix.recording.hot_path import StepRecord
from otel_tunix.recording.records import ComponentStart
from otel_tunix.settings import tally as _tally
from otel_tunix.support.text import clean_name, clean_value

__all__ = ["NameCleaner", "clean_attributes"]

_name_of = operator.itemgetter(0)
_MAX_KNOWN = 4096


class NameCleaner:
    """The worker's cleaner: remembers the names that needed nothing (bounded)."""

    __slots__ = ("_clean",)

    def __init__(self) -> None:
        self._clean: set[str] = set()

    def step(self, rec: StepRecord) -> None:
        """Clean ``rec``'s component names, scope and attributes in place."""
        ok = self._clean
        comps = rec.spans
        if not all(map(ok.__contains__, map(_name_of, comps))):
            self._components(comps)
        scope = rec.scope
        if scope not in ok:
            rec.scope = self.name(scope)
        if rec.attributes:
            rec.attributes = clean_attributes(rec.attributes)
        ex = rec.extras
        if ex is not None and ex.attributes:
            for sid, attrs in ex.attributes.items():
                ex.attributes[sid] = clean_attributes(attrs)

    def name(self, name: str) -> str:
        """``name`` cleaned (counted when changed; remembered when it needed nothing)."""
        if not isinstance(name, str):
            _tally.add("names_cleaned")
            return clean_name(str(name))
        fixed = clean_name(name)
        if fixed == name:
            if len(self._clean) >= _MAX_KNOWN:  # names made up per step: stay bounded
                self._clean.clear()
            self._clean.add(name)
        else:
            _tally.add("names_cleaned")
        return fixed

    def _components(self, comps: list[ComponentStart]) -> None:
        ok = self._clean
        for i, c in enumerate(comps):
            if c[0] not in ok:
                fixed = self.name(c[0])
                if fixed != c[0]:
                    comps[i] = (fixed, *c[1:])


def clean_attributes(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """``attrs`` with keys cleaned as names and text values (and text in sequences) as
    values; each change counted."""
    out: dict[str, Any] = {}
    changed = 0
    for key, value in attrs.items():
        k = clean_name(key) if isinstance(key, str) else clean_name(str(key))
        if k != key:
            changed += 1
        if isinstance(value, str):
            v: Any = clean_value(value)
            changed += v != value
        elif isinstance(value, list | tuple) and any(isinstance(x, str) for x in value):
            v = [clean_value(x) if isinstance(x, str) else x for x in value]
            changed += any(a != b for a, b in zip(v, value, strict=True))
        else:
            v = value
        out[k] = v
    _tally.add("values_cleaned", changed)
    return out
