"""RL workers in other processes: a rollout worker behind HTTP joins the learner's trace.

The learner calls the worker inside its ``rollout`` component with ``requests``, under
OpenTelemetry's own requests instrumentation (the ``http`` extra), which puts a W3C
``traceparent`` on the call; the worker, a separate process, extracts it with OTel's
``propagate`` API and opens its own otel-tunix step. Both export over OTLP to a real
collector (rotel), where the worker's step is a child of the learner's HTTP call, itself a
child of ``rollout``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from processes import child_env

import otel_tunix

requests = pytest.importorskip("requests")
requests_instrumentation = pytest.importorskip("opentelemetry.instrumentation.requests")

WORKER = """
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from opentelemetry import context, propagate
import otel_tunix

otel_tunix.configure(service_name="rollout-worker")
served = 0

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        global served
        self.rfile.read(int(self.headers["Content-Length"]))
        token = context.attach(propagate.extract(dict(self.headers)))
        try:
            with otel_tunix.step(served, scope="rl/rollout_worker"):
                with otel_tunix.component("generate"):
                    time.sleep(0.01)
        finally:
            context.detach(token)
        served += 1
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass

server = HTTPServer(("127.0.0.1", 0), Handler)
print(server.server_port, flush=True)
for _ in range(2):
    server.handle_request()
otel_tunix.shutdown()
"""


@pytest.mark.slow
def test_a_worker_behind_http_joins_the_learners_trace(
    rotel_collector: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    env = child_env(
        OTEL_EXPORTER_OTLP_ENDPOINT=rotel_collector.grpc_endpoint,
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_TUNIX_OUTPUT_DIR="none",
        OTEL_TUNIX_SYSTEM_METRICS_INTERVAL="0",
        OTEL_TUNIX_QUIET="true",
    )
    worker = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        assert worker.stdout is not None
        port = int(worker.stdout.readline())
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rotel_collector.grpc_endpoint)
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
        otel_tunix.configure(service_name="learner", output_dir="none", system_metrics=False)
        instrumentor = requests_instrumentation.RequestsInstrumentor()
        instrumentor.instrument()
        try:
            for n in range(2):
                with otel_tunix.step(n, scope="rl/learner"):
                    with otel_tunix.component("rollout"):
                        reply = requests.post(f"http://127.0.0.1:{port}/generate", data=b"{}")
                        assert reply.status_code == 200
        finally:
            instrumentor.uninstrument()
            otel_tunix.shutdown()
        assert worker.wait(timeout=30) == 0
    finally:
        worker.kill()
    out = rotel_collector.wait_for_span_counts(
        {"rl/rollout_worker_step": 2, "rl/learner_step": 2, "POST": 2}
    )
    by_id = {s.span_id: s for s in out.spans}
    workers = out.spans_named("rl/rollout_worker_step")
    assert len(workers) == 2
    for w in workers:
        assert w.resource["service.name"] == "rollout-worker"
        call = by_id[w.parent_span_id]  # the learner's HTTP call
        assert call.name == "POST" and call.resource["service.name"] == "learner"
        rollout = by_id[call.parent_span_id]
        assert rollout.name == "rollout"
        learner_step = by_id[rollout.parent_span_id]
        assert learner_step.name == "rl/learner_step"
        assert w.trace_id == call.trace_id == rollout.trace_id == learner_step.trace_id
        assert learner_step.attributes["tunix.step"] == w.attributes["tunix.step"]
        generate = [c for c in out.spans_named("generate") if c.parent_span_id == w.span_id]
        assert len(generate) == 1
