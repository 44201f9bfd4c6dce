"""A Ray task joins the learner's trace: a real local Ray cluster, its tracing turned on with
otel-tunix's startup hook, the driver and the worker exporting over OTLP to a real
collector (rotel)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

import otel_tunix

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # a Ray cluster takes seconds to start


def test_a_ray_task_joins_the_learners_trace(
    rotel_collector: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in {
        "OTEL_EXPORTER_OTLP_ENDPOINT": rotel_collector.grpc_endpoint,
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_TUNIX_OUTPUT_DIR": "none",
        "OTEL_TUNIX_SYSTEM_METRICS_INTERVAL": "0",
        "OTEL_TUNIX_QUIET": "true",
        "OTEL_TUNIX_RAISE_INTERNAL_ERRORS": "false",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # the worker's exporter sends within 0.1 s
    }.items():
        monkeypatch.setenv(key, value)
    otel_tunix.configure(service_name="learner")
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
        _tracing_startup_hook="otel_tunix.instrumentation.ray:tracing_startup_hook",
        runtime_env={"env_vars": {"OTEL_SERVICE_NAME": "rollout-worker"}},
    )

    def rollout_worker(n: int) -> int:  # defined here: Ray ships it by value
        """A Ray task: one step of a rollout worker, flushed before it returns."""

        import otel_tunix as ot

        with ot.step(n, scope="rl/rollout_worker"), ot.component("generate"):
            time.sleep(0.01)
        ot.force_flush(timeout=5)
        return n

    try:
        task = ray.remote(rollout_worker)
        for n in range(2):
            with otel_tunix.step(n, scope="rl/learner"), otel_tunix.component("rollout"):
                assert ray.get(task.remote(n)) == n
        # Ray's own span around the last task ends after the task returns: let the worker's
        # exporter send it before Ray stops the worker
        rotel_collector.wait_for(lambda text: text.count("ray.remote_worker") >= 2, timeout=30)
    finally:
        ray.shutdown()
        for sig, handler in handlers.items():  # ray.init installs its own; not put back
            signal.signal(sig, handler)
        otel_tunix.shutdown()
    out = rotel_collector.wait_for_span_counts(
        {"rl/rollout_worker_step": 2, "rl/learner_step": 2}, timeout=30
    )
    by_id = {s.span_id: s for s in out.spans}
    workers = out.spans_named("rl/rollout_worker_step")
    assert len(workers) == 2
    for w in workers:
        assert w.resource["service.name"] == "rollout-worker"
        chain = []  # from the worker's step up to the learner's step, through Ray's spans
        span = w
        while span.parent_span_id is not None and span.parent_span_id in by_id:
            span = by_id[span.parent_span_id]
            chain.append(span.name)
        # Ray's span in the worker, Ray's span of the call in the driver, our component
        assert [c.rsplit(" ", 1)[-1] for c in chain] == [
            "ray.remote_worker",
            "ray.remote",
            "rollout",
            "rl/learner_step",
        ], chain
        assert span.attributes["tunix.step"] == w.attributes["tunix.step"]
        assert w.trace_id == span.trace_id
