"""Trace and span ids: random, untouched by random.seed(), fresh in a forked child."""

from __future__ import annotations

import os
import random
import sys

import pytest

import otel_tunix
from otel_tunix.support import ids as _ids
from otel_tunix.testing import capture


def _draw(n: int) -> list[int]:
    out = []
    for _ in range(n):
        try:
            out.append(_ids.take_span_id())
        except IndexError:
            out.append(_ids.refill_span_ids())
    return out


def _run_ids() -> set[int]:
    with capture() as cap:
        for n in range(3):
            with otel_tunix.step(n), otel_tunix.component("c"):
                pass
        spans = cap.spans()
    return {s.context.trace_id for s in spans} | {s.context.span_id for s in spans}


def test_a_training_script_seeding_random_does_not_repeat_ids_across_runs():
    random.seed(1234)
    first = _run_ids()
    random.seed(1234)  # a second run of the same seeded script
    second = _run_ids()
    assert len(first) == 3 + 6 and len(second) == 3 + 6  # 3 traces, 6 spans
    assert not first & second


def test_span_ids_are_distinct_64_bit_and_never_zero_across_refills():
    ids = _draw(3 * 256 + 7)  # crosses several refills
    assert len(set(ids)) == len(ids)
    assert all(0 < i < 2**64 for i in ids)
    assert max(ids) > 2**60  # full-width, not small counters


def test_a_draw_holding_a_zero_id_never_hands_it_out(monkeypatch):
    monkeypatch.setattr(_ids, "_pool", [])
    monkeypatch.setattr(_ids, "take_span_id", _ids._pool.pop)
    words = [0, 5, 0, 7] + [9] * (_ids._POOL - 4)
    raw = b"".join(w.to_bytes(8, sys.byteorder) for w in words)
    monkeypatch.setattr(_ids, "_draw", lambda n: raw)
    got = [_ids.refill_span_ids(), *_ids._pool]
    assert 0 not in got and len(got) == _ids._POOL - 2 and {5, 7, 9} == set(got)


def test_seed_makes_the_ids_repeatable_and_none_restores_os_entropy():
    try:
        _ids.seed(7)
        a = _draw(300), _ids.random_bits(128)
        _ids.seed(7)
        b = _draw(300), _ids.random_bits(128)
        assert a == b
        _ids.seed(None)
        assert _ids._draw is os.urandom
        assert _draw(300) != a[0]
    finally:
        _ids.seed(None)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_repeats_its_parents_ids():
    _draw(1)  # the pool is full in the parent when it forks
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids and a trace id, then out at once
        try:
            ids = [*_draw(600), _ids.random_bits(128)]
            os.write(wr, ",".join(map(str, ids)).encode())
        finally:
            os._exit(0)
    os.close(wr)
    with os.fdopen(rd) as f:
        child = [int(x) for x in f.read().split(",")]
    os.waitpid(pid, 0)
    parent = [*_draw(600), _ids.random_bits(128)]
    assert len(child) == 601
    assert not set(child) & set(parent)
