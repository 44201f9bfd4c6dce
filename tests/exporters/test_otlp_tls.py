"""OTLP over TLS, configured the way OTel users do it: ``https://`` endpoints and the
``OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]CERTIFICATE`` / ``..._CLIENT_CERTIFICATE`` /
``..._CLIENT_KEY`` variables, for gRPC and HTTP/protobuf, the fast path and the SDK's own
exporters.

Each test makes a CA at test time (``openssl``), starts a TLS receiver on loopback
(tests/otlp_receiver.py; rotel's receivers take no TLS) and runs a training loop in a child
process configured from the environment only. With the CA every span and the metrics
arrive, decoded and checked; without it (or with another CA, or without the client
certificate a receiver asks for) nothing arrives, the loop runs to its end, and the failure
is counted in ``summary.json`` and said at shutdown with the endpoint, its credentials
redacted. And the gRPC fast path's new channel after a failed export is a TLS one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")  # the otlp extra (and grpcio)

from certificates import Pki, make_pki, openssl_missing
from collector import free_port
from otlp_receiver import OtlpReceiver, ServerTls, attributes, grpc_receiver, http_receiver
from processes import child_env

import otel_tunix

pytestmark = pytest.mark.skipif(openssl_missing() is not None, reason=str(openssl_missing()))

STEPS = 12
COMPONENTS = ("train_data_load", "train_step_compute")
SECRET = "SECRET-tls-token"

_CHILD = r"""
import json, sys, time
import otel_tunix
from otel_tunix.run import setup

def step(n):
    with otel_tunix.step(n, scope="train"):
        for name in ("train_data_load", "train_step_compute"):
            with otel_tunix.component(name):
                time.sleep(0.001)

otel_tunix.configure(output_dir=sys.argv[1], service_name="otlp-tls")
steps, until_failed = int(sys.argv[2]), sys.argv[3] == "until-failed"
for n in range(steps):
    step(n)
# A failing collector: go on stepping until an export has failed (the loop must not wait
# for it, nor see it), then a few more steps.
stats = setup._state.export_stats["otlp"]
deadline = time.monotonic() + 20
while until_failed and stats.failed == 0 and time.monotonic() < deadline:
    step(steps)
    steps += 1
failed_in_loop = stats.failed > 0
for _ in range(3):
    step(steps)
    steps += 1
otel_tunix.log({"loss": float("nan")}, step=steps)  # an alert: a log record over OTLP
otel_tunix.shutdown()
print(json.dumps({"steps": steps, "failed_in_loop": failed_in_loop}))
"""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA that signed nothing the receivers present."""
    return make_pki(tmp_path_factory.mktemp("other-pki"), "another CA")


def _receiver(protocol: str, pki: Pki, client_auth: bool) -> OtlpReceiver:
    tls = ServerTls(pki.server_cert, pki.server_key, pki.ca if client_auth else None)
    return (grpc_receiver if protocol == "grpc" else http_receiver)(tls)


def _env(protocol: str, fast: str, endpoint: str, **more: str) -> dict[str, str]:
    return child_env(
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_TUNIX_OTLP_FAST_PATH=fast,
        OTEL_EXPORTER_OTLP_HEADERS=f"authorization=Bearer {SECRET},x-team=ml",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        OTEL_BSP_SCHEDULE_DELAY="50",
        OTEL_TUNIX_SYSTEM_METRICS_INTERVAL="0",
        **{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, **more},
    )


def _run(env: dict[str, str], run: Path, until_failed: bool = False) -> tuple[dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(run), str(STEPS),
         "until-failed" if until_failed else "steps"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # nothing raised into the loop
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.parametrize(
    ("protocol", "fast", "variables"),
    [
        ("grpc", "true", "shared"),
        ("grpc", "true", "per-signal"),
        ("grpc", "true", "client-certificate"),
        ("grpc", "false", "shared"),
        ("http/protobuf", "true", "shared"),
        ("http/protobuf", "true", "per-signal"),
        ("http/protobuf", "true", "client-certificate"),
        ("http/protobuf", "false", "per-signal"),
    ],
)
def test_every_span_and_metric_arrives_over_tls_with_the_ca_certificate(
    pki: Pki, other_ca: Pki, tmp_path: Path, protocol: str, fast: str, variables: str
) -> None:
    """``shared``: ``OTEL_EXPORTER_OTLP_ENDPOINT`` and ``..._CERTIFICATE``; ``per-signal``:
    the ``_TRACES_`` / ``_METRICS_`` endpoints and certificates only; ``client-certificate``:
    a receiver that asks for one (mutual TLS), given by ``..._CLIENT_CERTIFICATE`` /
    ``..._CLIENT_KEY``. ``REQUESTS_CA_BUNDLE`` and ``CURL_CA_BUNDLE`` name another CA, as a
    conda or corporate image sets them: the certificate variable must win over them."""
    receiver = _receiver(protocol, pki, client_auth=variables == "client-certificate")
    try:
        env = _env(protocol, fast, receiver.endpoint, REQUESTS_CA_BUNDLE=str(other_ca.ca),
                   CURL_CA_BUNDLE=str(other_ca.ca))  # fmt: skip
        if variables == "per-signal":
            del env["OTEL_EXPORTER_OTLP_ENDPOINT"]
            http = protocol != "grpc"
            for signal in ("TRACES", "METRICS"):
                path = f"/v1/{signal.lower()}" if http else ""
                env[f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"] = receiver.endpoint + path
                env[f"OTEL_EXPORTER_OTLP_{signal}_CERTIFICATE"] = str(pki.ca)
        else:
            env["OTEL_EXPORTER_OTLP_CERTIFICATE"] = str(pki.ca)
        if variables == "client-certificate":
            env["OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"] = str(pki.client_cert)
            env["OTEL_EXPORTER_OTLP_CLIENT_KEY"] = str(pki.client_key)
        out, stderr = _run(env, tmp_path / "run")
    finally:
        receiver.close()  # the child's shutdown has waited for its exports

    assert out["steps"] == STEPS + 3
    steps = out["steps"]
    spans = receiver.spans()
    assert len(spans) == steps * (1 + len(COMPONENTS))
    by_id = {s.span_id: s for s in spans}
    step_spans = [s for s in spans if s.name == "train_step"]
    assert sorted(attributes(s.attributes)["tunix.step"] for s in step_spans) == list(range(steps))
    for span in spans:
        if span.name == "train_step":
            continue
        assert span.name in COMPONENTS
        parent = by_id[span.parent_span_id]
        assert parent.name == "train_step" and parent.trace_id == span.trace_id
        mine, its = attributes(span.attributes), attributes(parent.attributes)
        assert mine["tunix.step"] == its["tunix.step"]
        assert mine["tunix.component"] == span.name
        assert span.end_time_unix_nano - span.start_time_unix_nano >= 1_000_000  # the sleep
    for request in receiver.requests:  # the headers went through the encrypted channel
        assert request.headers["authorization"] == f"Bearer {SECRET}"
    busy = receiver.metrics("tunix.step.busy_time")
    assert busy, [r.signal for r in receiver.requests]
    (point,) = busy[-1].histogram.data_points  # cumulative: the whole run
    assert point.count == steps
    assert attributes(point.attributes) == {"scope": "train"}
    if variables != "per-signal":  # (alerts go to OTLP with the shared endpoint only)
        (alert,) = receiver.logs()
        assert "loss" in alert.body.string_value
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["export"]["otlp"]["spans_exported"] == len(spans)
    assert summary["export"]["otlp"]["spans_failed"] == 0
    assert summary["export_by_signal"]["metrics"]["otlp"] == {"exports": 1, "exports_failed": 0}
    assert "nothing dropped or failed" in stderr
    metric_requests, logs = len(receiver.of("metrics")), len(receiver.logs())
    print(f"TLS {protocol} fast={fast} {variables}: {len(spans)} spans, "
          f"{metric_requests} metric requests, {logs} log records")  # fmt: skip


@pytest.mark.parametrize(
    ("protocol", "fast", "trust"),
    [
        ("grpc", "true", "no certificate"),
        ("grpc", "true", "another CA"),
        ("grpc", "false", "another CA"),
        ("grpc", "true", "no client certificate"),
        ("http/protobuf", "true", "no certificate"),
        ("http/protobuf", "true", "another CA"),
        ("http/protobuf", "false", "another CA"),
        ("http/protobuf", "true", "no client certificate"),
    ],
)
def test_an_untrusted_collector_gets_nothing_and_the_loop_goes_on(
    pki: Pki, other_ca: Pki, tmp_path: Path, protocol: str, fast: str, trust: str
) -> None:
    """``no certificate``: the default trust store only (the system's CAs, or certifi's);
    ``another CA``: ``OTEL_EXPORTER_OTLP_CERTIFICATE`` names a CA
    that did not sign the receiver's certificate; ``no client certificate``: the receiver
    asks for one and the exporter has none."""
    receiver = _receiver(protocol, pki, client_auth=trust == "no client certificate")
    endpoint = receiver.endpoint
    try:
        env = _env(protocol, fast, endpoint)
        if trust == "another CA":
            env["OTEL_EXPORTER_OTLP_CERTIFICATE"] = str(other_ca.ca)
        elif trust == "no client certificate":
            env["OTEL_EXPORTER_OTLP_CERTIFICATE"] = str(pki.ca)
        if protocol != "grpc":  # a credential in the endpoint, too
            for signal in ("traces", "metrics"):
                env[f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"] = (
                    f"{endpoint}/v1/{signal}?token={SECRET}"
                )
        out, stderr = _run(env, tmp_path / "run", until_failed=True)
    finally:
        receiver.close()

    assert receiver.requests == []
    if protocol != "grpc":  # (grpcio does not say)
        assert receiver.handshake_failures > 0  # the exporter did try
    # The loop went on through a failed export, to its end, every step recorded locally.
    assert out["failed_in_loop"]
    steps = out["steps"]
    lines = (tmp_path / "run" / "spans.jsonl").read_text().splitlines()
    assert sum(json.loads(line)["type"] == "step" for line in lines) == steps
    # Counted: every span offered failed or was dropped, and the metric export failed.
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    spans = summary["export"]["otlp"]
    assert spans["spans_offered"] == steps * (1 + len(COMPONENTS))
    assert spans["spans_exported"] == 0
    assert spans["spans_failed"] > 0
    assert spans["spans_failed"] + spans["spans_dropped"] == spans["spans_offered"]
    assert summary["export_by_signal"]["metrics"]["otlp"] == {"exports": 1, "exports_failed": 1}
    print(f"TLS {protocol} fast={fast} {trust}: {steps} steps, {spans['spans_failed']} spans "
          f"failed, {spans['spans_dropped']} dropped")  # fmt: skip
    # Said: the end notice counts it, the shutdown warning names the endpoint, neither
    # holds the credentials (the SDK's own log lines are its own).
    ours = [line for line in stderr.splitlines() if "otel-tunix" in line or line[:2] == "  "]
    notice = "\n".join(ours)
    assert f"otlp: {spans['spans_failed']} spans failed, {spans['spans_dropped']} dropped" in (
        notice
    )
    assert "metrics otlp: 1 of 1 exports failed" in notice
    (warning,) = [line for line in ours if "spans failed and" in line]
    assert f"exporter otlp to {endpoint}" in warning
    if protocol != "grpc":
        assert f"{endpoint}/v1/traces?[REDACTED] (http/protobuf)" in warning
    assert "TLS certificate" in warning
    assert SECRET not in notice


def test_the_fast_path_reconnects_over_tls_when_the_collector_comes_up(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gRPC fast path swaps the SDK's stub for its own, and the SDK makes a new channel
    (and stub) after an export fails as unavailable: the new one must be a TLS channel with
    the same credentials. In process: the run starts before its collector does."""
    port = free_port()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"https://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(pki.ca))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "none")
    otel_tunix.configure(output_dir=tmp_path / "run")
    for n in range(3):
        with otel_tunix.step(n), otel_tunix.component("forward"):
            pass
    otel_tunix.force_flush(timeout=5)  # nothing listens: this export fails
    receiver = grpc_receiver(ServerTls(pki.server_cert, pki.server_key), port=port)
    try:
        # The first export after that may still fail on the old channel (gRPC waits out
        # its reconnect back-off there; the SDK's retry on the new one may not fit in the
        # 1 s deadline); a step at a time until one arrives.
        n, deadline = 100, time.monotonic() + 20
        while not receiver.spans() and time.monotonic() < deadline:
            with otel_tunix.step(n), otel_tunix.component("forward"):
                pass
            otel_tunix.force_flush(timeout=5)
            n += 1
        otel_tunix.shutdown()
    finally:
        receiver.close()
    arrived = [attributes(s.attributes)["tunix.step"] for s in receiver.spans()]
    assert arrived, "nothing arrived once the TLS collector was up"
    assert min(arrived) >= 100  # those sent while it was down are counted failed, not resent
    export = json.loads((tmp_path / "run" / "summary.json").read_text())["export"]["otlp"]
    assert export["spans_exported"] == len(arrived)
    assert export["spans_failed"] >= 6
    print(f"TLS reconnect: {len(arrived)} spans arrived of {2 * (n - 100)} sent after the "
          f"collector came up; {export['spans_failed']} failed before")  # fmt: skip
