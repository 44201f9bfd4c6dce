"""RL lineage and policy lag (``otel_tunix.rl``): each learner step span links the rollout
spans it trained on, with their versions and lags; ``tunix.rl.policy_lag`` counts every lag.

Checked against the test's own bookkeeping (which actor step made each batch, with which
policy version, and which learner step consumed it at which version) at a real collector
(rotel) and in the run's files, across a thread and across a process.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from collector import DebugOutput, DebugSpan, RotelCollector
from run_files import RunFolder, read_jsonl

import otel_tunix
from otel_tunix import rl
from otel_tunix.model.metric_spec import POLICY_LAG_BUCKETS

ACTOR, LEARNER = "rl/actor", "rl/learner"


def _actor_version(n: int) -> int:
    """The policy version actor step ``n`` generates with (the test's rule)."""
    return max(0, n - 3) // 2


def _learner_version(m: int) -> int:
    return m + 1


def _batches_of(m: int) -> list[int]:
    """The actor steps whose batches learner step ``m`` trains on: two a step."""
    return [2 * m, 2 * m + 1]


def _actor_loop(out: Any, steps: int) -> None:
    """Actor steps: each generates its batch in a ``generate`` component and sends it with
    its rollout context."""
    for n in range(steps):
        with otel_tunix.step(n, scope=ACTOR):
            with otel_tunix.component("generate"):
                ctx = rl.rollout_context(_actor_version(n))
            out.put((n, ctx))


def _learner_loop(source: Any, steps: int) -> dict[int, dict[int, int]]:
    """Learner steps, each consuming its two batches; returns, per learner step, the lag of
    each actor step it consumed, as the test computes it."""
    truth: dict[int, dict[int, int]] = {}
    pending: dict[int, dict[str, Any]] = {}
    for m in range(steps):
        with otel_tunix.step(m, scope=LEARNER):
            with otel_tunix.component("rollout_queue_wait", blocked=True):
                while not all(n in pending for n in _batches_of(m)):
                    n, ctx = source.get(timeout=60)
                    pending[n] = ctx
            ctxs = [pending.pop(n) for n in _batches_of(m)]
            lags = rl.consume(ctxs, policy_version=_learner_version(m))
        truth[m] = {n: _learner_version(m) - _actor_version(n) for n in _batches_of(m)}
        assert lags == list(truth[m].values())
    return truth


def _check_files(run: RunFolder, truth: dict[int, dict[int, int]], actor: RunFolder) -> None:
    """spans.jsonl: each learner step line links the ``generate`` span of each actor step
    it consumed, with the version and lag; its attributes carry the max; metrics.jsonl has
    ``policy_lag`` per learner step."""
    actor_steps = {r["step"]: r for r in actor.steps() if r["scope"] == ACTOR}
    learner = {r["step"]: r for r in run.steps() if r["scope"] == LEARNER}
    assert sorted(learner) == sorted(truth)
    for m, lags in truth.items():
        line = learner[m]
        want = []
        for n, lag in lags.items():
            (gen,) = [s for s in actor_steps[n]["spans"] if s["name"] == "generate"]
            want.append(
                {
                    "trace_id": actor_steps[n]["trace_id"],
                    "span_id": gen["span_id"],
                    "attributes": {
                        "tunix.link.type": "rollout",
                        "tunix.rl.policy_version": _actor_version(n),
                        "tunix.rl.policy_lag": lag,
                    },
                }
            )
        assert line["links"] == want
        a = line["attributes"]
        assert a["tunix.rl.policy_lag"] == max(lags.values())
        assert a["tunix.rl.policy_version"] == _learner_version(m)
        assert a["tunix.rl.rollouts"] == len(lags)
        assert "tunix.rl.links_dropped" not in a
    logged = {
        r["step"]: r["metrics"]["policy_lag"]
        for r in run.metrics()
        if "policy_lag" in r.get("metrics", {})
    }
    assert logged == {m: float(max(lags.values())) for m, lags in truth.items()}


def _check_collector(out: DebugOutput, truth: dict[int, dict[int, int]]) -> None:
    """At the collector: the learner step spans' links point at the actor's ``generate``
    spans it received, and the histogram counts every lag in its bucket."""
    gens: dict[int, DebugSpan] = {}
    for s in out.spans_named("generate"):
        gens[int(s.attributes["tunix.step"])] = s
    learner = {int(s.attributes["tunix.step"]): s for s in out.spans_named(f"{LEARNER}_step")}
    assert sorted(learner) == sorted(truth)
    for m, lags in truth.items():
        span = learner[m]
        got = [(ln.trace_id, ln.span_id, ln.attributes) for ln in span.links]
        assert got == [
            (
                gens[n].trace_id,
                gens[n].span_id,
                {
                    "tunix.link.type": "rollout",
                    "tunix.rl.policy_version": _actor_version(n),
                    "tunix.rl.policy_lag": lag,
                },
            )
            for n, lag in lags.items()
        ]
        assert span.attributes["tunix.rl.policy_lag"] == max(lags.values())
    all_lags = [lag for lags in truth.values() for lag in lags.values()]
    (point,) = out.metric("tunix.rl.policy_lag").points
    assert point.count == len(all_lags) and point.sum == sum(all_lags)
    assert point.min == min(all_lags) and point.max == max(all_lags)
    assert point.explicit_bounds == list(POLICY_LAG_BUCKETS)
    want = Counter(_bucket(lag) for lag in all_lags)
    assert point.bucket_counts == [want[i] for i in range(len(POLICY_LAG_BUCKETS) + 1)]
    last = max(truth)
    assert out.metric("tunix.rl.policy_lag.max").points[-1].value == max(truth[last].values())


def _bucket(value: float) -> int:
    """The index of the explicit bucket ``value`` falls in (upper bounds inclusive)."""
    return next(
        (i for i, b in enumerate(POLICY_LAG_BUCKETS) if value <= b), len(POLICY_LAG_BUCKETS)
    )


def _otlp(monkeypatch: pytest.MonkeyPatch, collector: RotelCollector) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.grpc_endpoint)
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "none")


def test_learner_steps_link_the_rollouts_of_an_actor_thread(
    local_run: Any, rotel_collector: RotelCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    _otlp(monkeypatch, rotel_collector)
    run = local_run(service_name="rl-lineage")
    learner_steps = 6
    q: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue(maxsize=3)
    actor = threading.Thread(target=_actor_loop, args=(q, 2 * learner_steps), name="rl-actor")
    actor.start()
    truth = _learner_loop(q, learner_steps)
    actor.join(timeout=60)
    otel_tunix.shutdown()
    _check_files(run, truth, run)
    out = rotel_collector.wait_for_span_counts(
        {f"{LEARNER}_step": learner_steps, "generate": 2 * learner_steps}
    )
    out = rotel_collector.wait_for_metrics("tunix.rl.policy_lag", "tunix.rl.policy_lag.max")
    _check_collector(out, truth)


def _actor_process(out: Any, steps: int, endpoint: str, folder: str) -> None:
    """A spawned actor process: a run of its own, exporting to the same collector."""
    import os

    for name in [k for k in os.environ if k.startswith("OTEL_")]:
        del os.environ[name]
    os.environ.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_TUNIX_QUIET="true",
    )
    otel_tunix.configure(service_name="rl-actor", output_dir=folder, system_metrics=False)
    try:
        _actor_loop(out, steps)
    finally:
        otel_tunix.shutdown()


def test_learner_steps_link_the_rollouts_of_an_actor_process(
    local_run: Any, rotel_collector: RotelCollector, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _otlp(monkeypatch, rotel_collector)
    run = local_run(service_name="rl-learner")
    learner_steps = 4
    mp = multiprocessing.get_context("spawn")
    q = mp.Queue()
    child = mp.Process(
        target=_actor_process,
        args=(q, 2 * learner_steps, rotel_collector.grpc_endpoint, str(tmp_path / "actor")),
    )
    child.start()
    try:
        truth = _learner_loop(q, learner_steps)
    finally:
        child.join(timeout=60)
    assert child.exitcode == 0
    otel_tunix.shutdown()
    _check_files(run, truth, RunFolder(tmp_path / "actor"))
    out = rotel_collector.wait_for_span_counts(
        {f"{LEARNER}_step": learner_steps, "generate": 2 * learner_steps}, timeout=20
    )
    out = rotel_collector.wait_for_metrics("tunix.rl.policy_lag", "tunix.rl.policy_lag.max")
    _check_collector(out, truth)
    services = {
        s.resource["service.name"]: s.resource["process.pid"]
        for s in out.spans_named("generate") + out.spans_named(f"{LEARNER}_step")
    }
    assert services["rl-actor"] == child.pid and services["rl-learner"] != child.pid


def test_links_are_bounded_and_the_rest_counted(local_run: Any) -> None:
    run = local_run()
    extra = 5
    n_ctx = rl.MAX_ROLLOUT_LINKS + extra
    with otel_tunix.step(0, scope=ACTOR):
        ctxs = []
        for i in range(n_ctx):
            with otel_tunix.component("generate"):
                ctxs.append(rl.rollout_context(i % 3))
    with otel_tunix.step(0, scope=LEARNER):
        lags = rl.consume(ctxs, policy_version=4)
    otel_tunix.shutdown()
    assert lags == [4 - i % 3 for i in range(n_ctx)]
    (actor,) = [r for r in run.steps() if r["scope"] == ACTOR]
    (learner,) = [r for r in run.steps() if r["scope"] == LEARNER]
    gen_ids = [s["span_id"] for s in actor["spans"]]
    assert [ln["span_id"] for ln in learner["links"]] == gen_ids[: rl.MAX_ROLLOUT_LINKS]
    a = learner["attributes"]
    assert a["tunix.rl.links_dropped"] == extra
    assert a["tunix.rl.rollouts"] == n_ctx
    assert a["tunix.rl.policy_lag"] == 4


def test_unsampled_steps_count_their_lag_without_links() -> None:
    from otel_tunix.testing import capture

    with capture(perf=otel_tunix.PerformanceMetricsConfig(sampling_rate=2)) as cap:
        sent: list[dict[str, Any]] = []
        for n in range(4):
            with otel_tunix.step(n, scope=ACTOR):
                sent.append(rl.rollout_context(n))
        # actor steps 1 and 3 were not sampled: nothing to link, the version travels
        assert ["traceparent" in c for c in sent] == [True, False, True, False]
        got = {}
        for m in range(4):
            with otel_tunix.step(m, scope=LEARNER):
                got[m] = rl.consume(sent[m], policy_version=m + 2)
        otel_tunix.force_flush()
        metrics = cap.metrics()
        spans = [s for s in cap.spans() if s.name == f"{LEARNER}_step"]
    assert got == {m: [2] for m in range(4)}
    (hist,) = metrics["tunix.rl.policy_lag"]
    assert hist.count == 4 and hist.sum == 8  # every step's lag, sampled or not
    by_step = {s.attributes["tunix.step"]: s for s in spans}
    assert sorted(by_step) == [0, 2]
    assert [len(by_step[m].links) for m in (0, 2)] == [1, 1]  # sampled actor steps 0 and 2
    assert all(by_step[m].attributes["tunix.rl.policy_lag"] == 2 for m in (0, 2))


def test_the_policy_lag_alert_fires_past_the_bound(
    local_run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TUNIX_MAX_POLICY_LAG", "2")
    run = local_run()
    lags = [0, 1, 2, 3, 4, 2, 1]
    for m, lag in enumerate(lags):
        with otel_tunix.step(m, scope=LEARNER):
            rl.consume({"policy_version": m - lag}, policy_version=m)
    otel_tunix.shutdown()
    alerts = [
        a for a in read_jsonl(run.path / "alerts.jsonl") if a["tunix.alert.rule"] == "policy_lag"
    ]
    events = [(a["tunix.alert.severity"], a["tunix.alert.step"]) for a in alerts]
    assert events == [("warning", 3), ("ok", 5)]
    by_step: dict[int, Any] = defaultdict(list)
    for r in run.steps():
        by_step[r["step"]] = r["attributes"]["tunix.rl.policy_lag"]
    assert by_step == dict(enumerate(lags))


def test_no_rule_without_a_bound_and_consume_outside_a_run() -> None:
    from otel_tunix.metrics.alerts import default_rules

    assert "policy_lag" not in {r.name for r in default_rules()}
    assert "policy_lag" in {r.name for r in default_rules(max_policy_lag=3)}
    # before configure(): nothing recorded, nothing raised, the lag still answered
    ctx = rl.rollout_context(1)
    assert ctx == {"policy_version": 1}
    assert rl.consume([ctx, {"no": "version"}, "not a context"], policy_version=3) == [2]


def test_a_context_sent_as_json_links_the_same(local_run: Any) -> None:
    import json

    run = local_run()
    with otel_tunix.step(0, scope=ACTOR):
        body = json.dumps(rl.rollout_context(5))  # an HTTP body, a Ray object, a file
    with otel_tunix.step(0, scope=LEARNER):
        assert rl.consume(json.loads(body), policy_version=7) == [2]
    otel_tunix.shutdown()
    (actor,) = [r for r in run.steps() if r["scope"] == ACTOR]
    (learner,) = [r for r in run.steps() if r["scope"] == LEARNER]
    (link,) = learner["links"]
    assert (link["trace_id"], link["span_id"]) == (actor["trace_id"], actor["span_id"])
    assert link["attributes"]["tunix.rl.policy_lag"] == 2


def test_the_summary_shows_each_rl_scopes_lag_and_syncs(local_run: Any) -> None:
    import io

    pytest.importorskip("rich")
    from rich.console import Console

    from otel_tunix.analysis.breakdown import RLStats, summarize
    from otel_tunix.analysis.summary_tables import render_summary

    run = local_run()
    lags = [0, 2, 1, 3, 1]  # each learner step's largest
    syncs = [[10**6], [10**6], [10**6, 3 * 10**6], [10**6], []]
    for m, (lag, sizes) in enumerate(zip(lags, syncs, strict=True)):
        with otel_tunix.step(m, scope=LEARNER):
            rl.consume([{"policy_version": m}, {"policy_version": m - lag}], policy_version=m)
            for nbytes in sizes:
                with rl.weight_sync(nbytes=nbytes):
                    pass
    with otel_tunix.step(0, scope=ACTOR):
        pass  # a scope with neither: no row
    otel_tunix.shutdown()
    summary = summarize(run.path)
    synced = [len(s) for s in syncs if s]
    (got,) = summary.rl
    # the learner step added up (tests/metrics/test_rl_steps.py checks its parts)
    assert got.breakdown_steps == len(lags)
    assert sum(got.parts_sec.values()) == pytest.approx(got.mean_step_sec, rel=0.01)
    assert summary.rl == [
        RLStats(
            scope=LEARNER,
            lag_steps=len(lags),
            mean_max_lag=sum(lags) / len(lags),
            p95_max_lag=pytest.approx(2.8),  # numpy's linear percentile of [0, 1, 1, 2, 3]
            max_lag=max(lags),
            sync_steps=len(synced),
            mean_syncs=sum(synced) / len(synced),
            repeated_sync_steps=1,
            mean_sync_bytes=sum(map(sum, syncs)) / len(synced),
            breakdown_steps=got.breakdown_steps,
            mean_step_sec=got.mean_step_sec,
            parts_sec=got.parts_sec,
        )
    ]
    assert summary.to_json()["rl"][0]["repeated_sync_steps"] == 1
    out = io.StringIO()
    render_summary(summary, Console(file=out, width=80))
    lines = out.getvalue().splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("RL: "))
    row = next(line for line in lines[title:] if line.strip().startswith(LEARNER))
    assert row.split()[1:] == ["5", "1.40", "2.8", "3", "1.25", "1", "1.75"]
    # and the learner step added up: its parts, their sum, the step time
    added = next(i for i, line in enumerate(lines) if line.startswith("RL step added up: "))
    end = next(i for i in range(added, len(lines)) if lines[i].strip().startswith("step time"))
    rows = {line.split()[0]: line.split() for line in lines[added + 1 : end + 1] if line.strip()}
    ms = {p: float(rows[p][1]) for p in got.parts_sec}
    assert ms == pytest.approx({p: v * 1e3 for p, v in got.parts_sec.items()}, abs=1e-3)
    assert float(rows["sum"][3]) == pytest.approx(got.mean_step_sec * 1e3, abs=2e-3)
    assert rows["step"][:4] == ["step", "time", "(5", "steps)"]
