"""How a run ends: at exit, whatever came before."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from processes import child_env


def test_a_second_run_ended_by_atexit_keeps_its_steps(tmp_path):
    # atexit runs the last registered first; the SDK registers each new provider's shutdown
    # as it is made, so otel-tunix's own must be registered again after them.
    program = textwrap.dedent(
        """
        import sys
        import otel_tunix
        otel_tunix.configure(output_dir=sys.argv[1] + "/a", system_metrics=False)
        otel_tunix.configure(output_dir=sys.argv[1] + "/b", system_metrics=False)
        for n in range(3):
            with otel_tunix.step(n):
                with otel_tunix.component("work"):
                    pass
        """
    )
    subprocess.run([sys.executable, "-c", program, str(tmp_path)], check=True, timeout=120)
    lines = [json.loads(x) for x in (tmp_path / "b" / "spans.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x["type"] == "step"] == [0, 1, 2]
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["scopes"][0]["steps"] == 3


# --- a collector that is down or hung: shutdown takes OTEL_TUNIX_SHUTDOWN_TIMEOUT --------

RUN = textwrap.dedent(
    """
    import os, signal, sys, time
    import otel_tunix
    otel_tunix.configure(output_dir=sys.argv[1], system_metrics=False)
    for n in range(50):
        with otel_tunix.step(n):
            with otel_tunix.component("work"):
                pass
        otel_tunix.get_metrics_logger().log("loss", 1.0, step=n)
    started = time.monotonic()
    if sys.argv[2] == "sigterm":
        print("ready", flush=True)
        time.sleep(600)  # ended by the test's SIGTERM
    otel_tunix.shutdown()
    print(f"shutdown took {time.monotonic() - started:.2f} s", flush=True)
    """
)


@pytest.fixture
def closed_port() -> int:
    """A loopback port with nothing listening (taken, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(port: int, protocol: str) -> dict[str, str]:
    env = child_env()
    # Every timeout of the exporters set to ten minutes: only otel-tunix's budget can end
    # the shutdown in time for the test's limit.
    return env | {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_TIMEOUT": "600",
        "OTEL_BSP_EXPORT_TIMEOUT": "600000",
        "OTEL_METRIC_EXPORT_TIMEOUT": "600000",
        "OTEL_TUNIX_SHUTDOWN_TIMEOUT": "1",
    }


def _check_summary(out: Path) -> None:
    spans = [json.loads(x) for x in (out / "spans.jsonl").read_text().splitlines()]
    assert [x["step"] for x in spans if x["type"] == "step"] == list(range(50))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["shutdown"]["timeout_sec"] == 1.0
    assert "spans (TracerProvider)" in summary["shutdown"]["unfinished"]
    otlp = summary["export"]["otlp"]
    assert otlp["spans_offered"] == 100 and otlp["spans_exported"] == 0
    assert otlp["spans_dropped"] + otlp["spans_failed"] == 100  # said, not sent
    # "complete" means nothing was lost (issue #36): here 100 spans were not sent
    assert summary["complete"] is False
    assert summary["lost"]["spans_not_exported"] == 100
    assert summary["lost"]["parts_unfinished"] == len(summary["shutdown"]["unfinished"])


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("collector", ["hung_collector", "closed_port"])
def test_shutdown_ends_within_its_budget_whatever_the_collector_does(
    tmp_path, request, collector, protocol
):
    port = request.getfixturevalue(collector)
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", RUN, str(out), "shutdown"],
        env=_env(port, protocol),
        capture_output=True,
        text=True,
        timeout=120,  # the exporters alone would wait ten minutes
    )
    assert proc.returncode == 0, proc.stderr
    print(collector, protocol, proc.stdout.strip())  # the figure docs/guarantees.md quotes
    _check_summary(out)
    assert "had not finished after 1 s (OTEL_TUNIX_SHUTDOWN_TIMEOUT)" in proc.stderr


def test_sigterm_with_a_hung_collector_ends_the_process_within_the_budget(tmp_path, hung_collector):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN, str(out), "sigterm"],
        env=_env(hung_collector, "grpc"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == -signal.SIGTERM  # not SIGKILLed by a grace period
    print(f"SIGTERM to exit: {time.monotonic() - sent:.2f} s")  # docs/guarantees.md
    _check_summary(out)


# --- a large run folder: the Perfetto translation stays inside the budget -----------------


def test_a_large_run_ends_within_its_budget_and_leaves_the_trace_to_convert(
    tmp_path, monkeypatch, capfd
):
    pytest.importorskip("perfetto")
    import otel_tunix
    from otel_tunix.exporters.perfetto import ConversionTimeout, convert_jsonl_to_perfetto

    budget = 1.0
    monkeypatch.setenv("OTEL_TUNIX_SHUTDOWN_TIMEOUT", str(budget))
    monkeypatch.setenv("OTEL_TUNIX_QUIET", "false")
    otel_tunix.configure(output_dir=tmp_path, system_metrics=False, alerts=False)
    for n in range(100):
        with otel_tunix.step(n):
            with otel_tunix.component("work"):
                pass
    otel_tunix.force_flush()
    # A long run's spans.jsonl, made cheaply: its step lines again and again (20,000 steps).
    spans = tmp_path / "spans.jsonl"
    steps = [x for x in spans.read_text().splitlines(keepends=True) if '"type":"step"' in x]
    with spans.open("a") as f:
        f.write("".join(steps) * 200)

    started = time.monotonic()
    otel_tunix.shutdown()
    took = time.monotonic() - started
    err = capfd.readouterr().err
    print(f"shutdown of a {spans.stat().st_size >> 20} MB run folder: {took:.2f} s")
    assert took < budget + 0.5
    assert f"otel-tunix convert {spans} --to perfetto {tmp_path / 'trace.pftrace'}" in err
    assert not (tmp_path / "trace.pftrace").exists()  # no trace cut short
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["complete"] is True
    assert summary["shutdown"]["unfinished"] == ["perfetto translation"]
    # The truth: translating this file takes longer than the shutdown took.
    check = tmp_path / "check.pftrace"
    with pytest.raises(ConversionTimeout):
        convert_jsonl_to_perfetto(spans, check, deadline=time.monotonic() + took)
    # The translation left behind at the deadline stopped there and removed its file.
    assert [p.name for p in tmp_path.glob("*.pftrace*")] == [check.name]
