"""Carrying the open step into threads and pool tasks started inside it (what the framework
integrations turn on), with real threads and a real ``ThreadPoolExecutor``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import otel_tunix
from otel_tunix.instrumentation._threads import carry_into_threads, stop_carrying_into_threads
from otel_tunix.settings import attributes as attr
from otel_tunix.testing import capture


@pytest.fixture
def carrying() -> Iterator[None]:
    carry_into_threads()
    yield
    stop_carrying_into_threads()


def _work(seen: list[Any]) -> None:
    seen.append((otel_tunix.in_step(), threading.get_ident()))
    with otel_tunix.component("rollout"):
        pass


def _parents(spans: list[Any]) -> dict[str, str | None]:
    names = {s.context.span_id: s.name for s in spans}
    return {s.name: names.get(s.parent.span_id) if s.parent else None for s in spans}


@pytest.mark.usefixtures("carrying")
def test_pool_task_and_thread_started_in_a_step_are_its_components() -> None:
    seen: list[Any] = []
    with capture() as cap, ThreadPoolExecutor(1) as pool:
        with otel_tunix.step(0, scope="rl/learner"), otel_tunix.component("micro_batch_steps"):
            pool.submit(_work, seen).result()
            t = threading.Thread(target=_work, args=(seen,))
            t.start()
            t.join()
        spans = cap.spans()
    assert [s[0] for s in seen] == [True, True]  # a step is open where the work runs
    assert all(ident != threading.get_ident() for _, ident in seen)
    rollouts = [s for s in spans if s.name == "rollout"]
    assert len(rollouts) == 2
    assert all(s.attributes[attr.SCOPE] == "rl/learner" for s in rollouts)
    step = next(s for s in spans if s.name == "rl/learner_step")
    outer = next(s for s in spans if s.name == "micro_batch_steps")
    assert all(s.context.trace_id == step.context.trace_id for s in rollouts)
    assert all(s.parent.span_id == outer.context.span_id for s in rollouts)  # type: ignore[union-attr]


@pytest.mark.usefixtures("carrying")
def test_a_thread_that_outlives_its_step_records_into_the_open_one() -> None:
    go = threading.Event()
    done = threading.Event()

    def loader() -> None:
        go.wait(5)
        with otel_tunix.component("train_data_load"):
            pass
        done.set()

    with capture() as cap:
        with otel_tunix.step(0):
            t = threading.Thread(target=loader)
            t.start()
        with otel_tunix.step(1):
            go.set()
            assert done.wait(5)
        t.join()
        spans = cap.spans()
    load = next(s for s in spans if s.name == "train_data_load")
    assert load.attributes[attr.STEP] == 1  # not into step 0, which had ended


@pytest.mark.usefixtures("carrying")
def test_nothing_is_carried_outside_a_sampled_step() -> None:
    seen: list[Any] = []
    perf = otel_tunix.PerformanceMetricsConfig(sampling_rate=2)
    with capture(perf=perf) as cap, ThreadPoolExecutor(1) as pool:
        pool.submit(_work, seen).result()  # no step: an outside component of its own
        with otel_tunix.step(1):  # not sampled: the task belongs to it, records nothing
            pool.submit(_work, seen).result()
        spans = cap.spans()
    assert [s[0] for s in seen] == [False, False]
    (rollout,) = [s for s in spans if s.name == "rollout"]
    assert rollout.attributes[attr.OUTSIDE] is True and rollout.parent is None


def test_without_an_integration_a_pool_task_sees_no_step() -> None:
    seen: list[Any] = []
    with capture(), ThreadPoolExecutor(1) as pool:
        with otel_tunix.step(0):
            pool.submit(_work, seen).result()
    assert seen[0][0] is False
    assert not hasattr(ThreadPoolExecutor.submit, "__wrapped__")
